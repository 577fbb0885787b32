// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Initial values of embedding rows from a counter-based random generator, so a
// key gets the same row on the CPU and the GPU, in any batch, in any order.
//
// Element e of the row of `key` in table `table` draws from Philox4x32-10
// with key (seed, table) and counter (block, attempt, key), block = e / 2 for
// the normal modes (Box-Muller makes two values from one draw) and e / 4
// otherwise; truncated normal redraws with the next `attempt`. Host-device
// inline code, shared by both backends.
#pragma once

#include <cmath>
#include <cstdint>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace embedding {

/// Initializer modes; DynamicEmbInitializerMode maps onto these by name.
enum class InitMode : int32_t {
  kNormal = 0,
  kTruncatedNormal = 1,
  kUniform = 2,
  kConstant = 3,
  kDebug = 4,  ///< every element is float(key mod kDebugModulus)
};
constexpr int32_t kNumInitModes = 5;
constexpr int64_t kDebugModulus = 100000;
constexpr int32_t kTruncatedAttempts = 64;

/// Parameters of one initializer (DynamicEmbInitializerArgs).
struct InitArgs {
  int32_t mode = static_cast<int32_t>(InitMode::kUniform);
  double mean = 0.0, std_dev = 1.0, lower = 0.0, upper = 1.0, value = 0.0;
  uint64_t seed = 0;
};

struct Philox4 {
  uint32_t v[4];
};

/// Philox4x32-10 (Salmon et al., SC'11): 10 rounds of the multiply-xor round
/// function with a Weyl-sequence key schedule.
DEMB_HD Philox4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                       uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

DEMB_HD Philox4 draw(const InitArgs& a, int64_t key, int64_t table, uint32_t block,
                     uint32_t attempt) {
  const uint64_t k = static_cast<uint64_t>(key);
  return philox(block, attempt, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32),
                static_cast<uint32_t>(a.seed),
                static_cast<uint32_t>(a.seed >> 32) ^ static_cast<uint32_t>(table));
}

/// A double in (0, 1) from two 32-bit words (53 random bits, never 0 or 1).
DEMB_HD double unit_open(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi >> 5) << 26) | (lo >> 6);
  return (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
}

/// Standard normal number `which` (0 or 1) of a Box-Muller pair.
DEMB_HD double normal_of(const Philox4& r, int which) {
  const double u1 = unit_open(r.v[0], r.v[1]);
  const double u2 = unit_open(r.v[2], r.v[3]);
  const double radius = sqrt(-2.0 * log(u1));
  const double angle = 6.283185307179586 * u2;
  return radius * (which ? sin(angle) : cos(angle));
}

/// Element `e` of the initial row of `key` in `table`.
DEMB_HD float init_value(const InitArgs& a, int64_t key, int64_t table, int64_t e) {
  switch (static_cast<InitMode>(a.mode)) {
    case InitMode::kNormal:
      return static_cast<float>(
          a.mean + a.std_dev * normal_of(draw(a, key, table, static_cast<uint32_t>(e / 2), 0),
                                         static_cast<int>(e % 2)));
    case InitMode::kTruncatedNormal: {
      double x = a.mean;
      for (uint32_t attempt = 0; attempt < kTruncatedAttempts; ++attempt) {
        x = a.mean +
            a.std_dev * normal_of(draw(a, key, table, static_cast<uint32_t>(e / 2), attempt),
                                  static_cast<int>(e % 2));
        if (x >= a.lower && x <= a.upper) break;
      }
      x = x < a.lower ? a.lower : (x > a.upper ? a.upper : x);
      return static_cast<float>(x);
    }
    case InitMode::kUniform: {
      const Philox4 r = draw(a, key, table, static_cast<uint32_t>(e / 4), 0);
      const uint32_t w = r.v[e % 4];
      const double u = (static_cast<double>(w) + 0.5) * (1.0 / 4294967296.0);
      return static_cast<float>(a.lower + (a.upper - a.lower) * u);
    }
    case InitMode::kConstant:
      return static_cast<float>(a.value);
    case InitMode::kDebug: {
      int64_t m = key % kDebugModulus;
      if (m < 0) m += kDebugModulus;
      return static_cast<float>(m);
    }
  }
  return 0.0f;
}

}  // namespace embedding
}  // namespace dyn_emb
