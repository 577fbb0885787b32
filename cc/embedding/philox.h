// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The counter-based random generator of the embedding kernels: Philox4x32-10,
// the same numbers on the CPU and the GPU for the same counter and key, in
// any batch and order. The initializers draw a row's values from it
// (initializer.h); a write of an FP8 row draws its stochastic rounding's bits
// (stochastic_bits).
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace embedding {

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

/// The key of the stochastic rounding's draws, apart from the initializers'
/// ("SRND").
constexpr uint32_t kStochasticKey = 0x53524E44u;

/// 32 random bits for the stochastic rounding of element `e` of the row of
/// `key` (or, where the writer has no key, the row's place) written at
/// optimizer step `step` (0: the row's initial write).
DEMB_HD uint32_t stochastic_bits(uint64_t key, int64_t step, int64_t e) {
  const uint64_t s = static_cast<uint64_t>(step);
  return philox(static_cast<uint32_t>(e), static_cast<uint32_t>(s), static_cast<uint32_t>(key),
                static_cast<uint32_t>(key >> 32), kStochasticKey, static_cast<uint32_t>(s >> 32))
      .v[0];
}

}  // namespace embedding
}  // namespace dyn_emb
