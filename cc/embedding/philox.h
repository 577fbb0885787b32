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

/// Philox4x32's round multipliers and its key schedule's Weyl increments.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

/// Philox4x32-10 (Salmon et al., SC'11): 10 rounds of the multiply-xor round
/// function with a Weyl-sequence key schedule.
DEMB_HD Philox4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                       uint32_t k1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// The key of the stochastic rounding's draws, apart from the initializers'
/// ("SRND").
constexpr uint32_t kStochasticKey = 0x53524E44u;

/// The draws of the stochastic rounding of one row write: Philox's counter
/// words c1..c3 and key; elements 4j..4j+3 take the four words of the draw
/// whose c0 = j (stochastic_bits).
struct StochasticDraws {
  uint32_t c1, c2, c3, k0, k1;
};

/// Elements whose bits one Philox draw gives (its four output words).
constexpr int kBitsPerDraw = 4;

/// The draws for the row of `key` (or, where the writer has no key, the
/// row's place) written at optimizer step `step` (0: the row's initial write).
DEMB_HD StochasticDraws stochastic_draws(uint64_t key, int64_t step) {
  const uint64_t s = static_cast<uint64_t>(step);
  return StochasticDraws{static_cast<uint32_t>(s), static_cast<uint32_t>(key),
                         static_cast<uint32_t>(key >> 32), kStochasticKey,
                         static_cast<uint32_t>(s >> 32)};
}

/// Draw `j` of the row of `key` written at step `step` (stochastic_draws):
/// the bits of its elements 4j..4j+3, word k for element 4j + k.
DEMB_HD Philox4 stochastic_draw(uint64_t key, int64_t step, int64_t j) {
  const StochasticDraws r = stochastic_draws(key, step);
  return philox(static_cast<uint32_t>(j), r.c1, r.c2, r.c3, r.k0, r.k1);
}

/// 32 random bits for the stochastic rounding of element `e` of the row of
/// `key` written at step `step`: word e % 4 of draw e / 4 (stochastic_draw).
DEMB_HD uint32_t stochastic_bits(uint64_t key, int64_t step, int64_t e) {
  const Philox4 p = stochastic_draw(key, step, e / kBitsPerDraw);
  // A switch rather than p.v[e % 4]: an index known only at run time would
  // keep p in a CUDA thread's local memory instead of its registers.
  switch (e % kBitsPerDraw) {
    case 0:
      return p.v[0];
    case 1:
      return p.v[1];
    case 2:
      return p.v[2];
    default:
      return p.v[3];
  }
}

}  // namespace embedding
}  // namespace dyn_emb
