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
//
// Truncated normal: on an interval as wide as 2 std_dev or wider, a normal draw
// kept when it falls inside; on a narrower one (the default bounds +-1/sqrt(N)
// of a table of N rows against std_dev 1 keep under 2% of normal draws), a
// uniform draw x in [lower, upper] (block e) kept with probability
// f(x) / f(m), f the normal density and m the interval's point nearest the
// mean (at least exp(-2) of the draws are kept when the mean lies within the
// interval). Either way the distribution is exact; after
// kTruncatedAttempts rejections the last draw is clamped into the interval.
#pragma once

#include <cmath>
#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/embedding/philox.h"
#include "cc/storage/row_space.h"

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

/// The Box-Muller pair of standard normal numbers of one draw: n[0], n[1].
DEMB_HD void normal_pair(const Philox4& r, double (&n)[2]) {
  const double u1 = unit_open(r.v[0], r.v[1]);
  const double u2 = unit_open(r.v[2], r.v[3]);
  const double radius = sqrt(-2.0 * log(u1));
  const double angle = 6.283185307179586 * u2;
  n[0] = radius * cos(angle);
  n[1] = radius * sin(angle);
}

/// Standard normal number `which` (0 or 1) of a Box-Muller pair.
DEMB_HD double normal_of(const Philox4& r, int which) {
  double n[2];
  normal_pair(r, n);
  return n[which];
}

/// UNIFORM's element from one 32-bit word of a draw.
DEMB_HD float uniform_of(const InitArgs& a, uint32_t w) {
  const double u = (static_cast<double>(w) + 0.5) * (1.0 / 4294967296.0);
  return static_cast<float>(a.lower + (a.upper - a.lower) * u);
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
      if (a.std_dev > 0.0 && a.upper - a.lower < 2.0 * a.std_dev) {
        const double m = a.mean < a.lower ? a.lower : (a.mean > a.upper ? a.upper : a.mean);
        const double scale = -0.5 / (a.std_dev * a.std_dev);
        for (uint32_t attempt = 0; attempt < kTruncatedAttempts; ++attempt) {
          const Philox4 r = draw(a, key, table, static_cast<uint32_t>(e), attempt);
          x = a.lower + (a.upper - a.lower) * unit_open(r.v[0], r.v[1]);
          const double dx = x - a.mean, dm = m - a.mean;
          if (unit_open(r.v[2], r.v[3]) <= exp(scale * (dx * dx - dm * dm))) break;
        }
        x = x < a.lower ? a.lower : (x > a.upper ? a.upper : x);
        return static_cast<float>(x);
      }
      for (uint32_t attempt = 0; attempt < kTruncatedAttempts; ++attempt) {
        x = a.mean +
            a.std_dev * normal_of(draw(a, key, table, static_cast<uint32_t>(e / 2), attempt),
                                  static_cast<int>(e % 2));
        if (x >= a.lower && x <= a.upper) break;
      }
      x = x < a.lower ? a.lower : (x > a.upper ? a.upper : x);
      return static_cast<float>(x);
    }
    case InitMode::kUniform:
      return uniform_of(a, draw(a, key, table, static_cast<uint32_t>(e / 4), 0).v[e % 4]);
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

/// New rows written in place (the op init_rows_at): for each entry i with
/// offsets[i] >= 0, the row at that byte offset of `space` (cc/storage/row_space.h)
/// gets the embedding init_value gives (keys[i], table_ids[i]) as T, zero
/// padding to the state, and `state_dim` floats of optimizer state: zeros,
/// except entries from `fill_from` on, which are `fill` (FTRL's accumulators).
struct RowInitArgs {
  InitArgs init;
  storage::RowSpace space;
  const int64_t* offsets = nullptr;    ///< (n) byte offsets, -1: skip
  const int64_t* keys = nullptr;       ///< (n)
  const int64_t* table_ids = nullptr;  ///< (n) the generator's table of each key
  int64_t dim = 0;
  int64_t state_dim = 0;
  int64_t fill_from = 0;
  float fill = 0.f;
};

/// Elements 4 * blk .. 4 * blk + 3 of the initial row of `key` in `table`,
/// each exactly as init_value gives it, with the draws init_value would
/// repeat made once: UNIFORM takes four elements from one draw, NORMAL two
/// from one Box-Muller pair.
DEMB_HD void init_values4(const InitArgs& a, int64_t key, int64_t table, int64_t blk,
                          float (&v)[4]) {
  switch (static_cast<InitMode>(a.mode)) {
    case InitMode::kUniform: {
      const Philox4 r = draw(a, key, table, static_cast<uint32_t>(blk), 0);
      for (int k = 0; k < 4; ++k) v[k] = uniform_of(a, r.v[k]);
      return;
    }
    case InitMode::kNormal:
      for (int p = 0; p < 2; ++p) {
        double n[2];
        normal_pair(draw(a, key, table, static_cast<uint32_t>(2 * blk + p), 0), n);
        for (int k = 0; k < 2; ++k) v[2 * p + k] = static_cast<float>(a.mean + a.std_dev * n[k]);
      }
      return;
    default:
      for (int k = 0; k < 4; ++k) v[k] = init_value(a, key, table, 4 * blk + k);
  }
}

/// Elements of T in a new row's embedding part, padding included (a whole
/// number of 4-byte words, zeros past dim).
template <class T>
DEMB_HD int64_t init_row_elements(const RowInitArgs& a) {
  return storage::pad4(a.dim * static_cast<int64_t>(sizeof(T))) / static_cast<int64_t>(sizeof(T));
}

/// The initial values of the row of `key` in `table` into `v` (4 *
/// ceil(dim / 4) floats: init_value's, and the last block's past dim): what
/// an FP8 row's first write rounds (fp8_rows.h, at step 0).
DEMB_HD void init_row_values(const RowInitArgs& a, int64_t key, int64_t table, float* v) {
  for (int64_t blk = 0; 4 * blk < a.dim; ++blk) {
    float b[4];
    init_values4(a.init, key, table, blk, b);
    for (int k = 0; k < 4; ++k) v[4 * blk + k] = b[k];
  }
}

/// Writes elements 4 * blk .. 4 * blk + 3 (those below init_row_elements) of
/// the new row of `key` in `table` at byte `offset` (>= 0) of the space:
/// init_value's, zeros past dim.
template <class T>
DEMB_HD void init_row_block(const RowInitArgs& a, int64_t offset, int64_t key, int64_t table,
                            int64_t blk) {
  T* e = reinterpret_cast<T*>(a.space.at(offset));
  const int64_t elements = init_row_elements<T>(a);
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (4 * blk < a.dim) init_values4(a.init, key, table, blk, v);
  for (int64_t k = 0; k < 4; ++k) {
    const int64_t d = 4 * blk + k;
    if (d < elements) e[d] = storage::from_float<T>(d < a.dim ? v[k] : 0.f);
  }
}

/// Writes optimizer-state float s of the new row at byte `offset`: zeros,
/// except from fill_from on.
template <class T>
DEMB_HD void init_state_word(const RowInitArgs& a, int64_t offset, int64_t s) {
  float* state = reinterpret_cast<float*>(a.space.at(offset) + storage::embedding_bytes<T>(a.dim));
  state[s] = s >= a.fill_from ? a.fill : 0.f;
}

}  // namespace embedding
}  // namespace dyn_emb
