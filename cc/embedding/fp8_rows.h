// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Writing an FP8 row (cc/storage/row_space.h, "FP8 rows"): the scale of its
// values' largest magnitude, then each code rounded stochastically with the
// bits of (key, step, element) (philox.h: a draw serves four elements). The
// initializers (step 0) and the optimizers (their step) write rows this way,
// on both backends: the CUDA kernels four codes per lane from one draw
// (scaled_codes4), the CPU a row at a time (fp8_rows_cpu.h).
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/embedding/philox.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace embedding {

/// The code of value `v` (element `e`) of a row of scale `scale`.
DEMB_HD storage::Float8E4M3 scaled_code(float v, float scale, uint64_t key, int64_t step,
                                        int64_t e) {
  return storage::fp8_stochastic(v / scale, stochastic_bits(key, step, e));
}

/// The codes of elements 4j..4j+3 (values `x`) of a row of `dim` elements
/// and scale `scale`, byte k of the word element 4j + k's (0 past the row's
/// end): one draw (stochastic_draw) for the four. The CUDA kernels write a
/// row's codes four at a time this way.
DEMB_HD uint32_t scaled_codes4(const float (&x)[4], float scale, uint64_t key, int64_t step,
                               int64_t j, int64_t dim) {
  const Philox4 p = stochastic_draw(key, step, j);
  uint32_t word = 0;
  // Loops of four, which the compilers unroll (p.v stays in registers).
  for (int k = 0; k < 4; ++k) {
    if (4 * j + k < dim) {
      word |= static_cast<uint32_t>(storage::fp8_stochastic(x[k] / scale, p.v[k]).bits) << (8 * k);
    }
  }
  return word;
}

/// The values of codes d0..d0+3 (d0 a multiple of 4) of an FP8 row of `dim`
/// at `w` (0 past its end): one 4-byte load where aligned, else a byte at a
/// time; for d0 < dim the four bytes lie inside the row's codes, padded to 4
/// bytes (storage::embedding_bytes), and from dim on nothing is read.
DEMB_HD void load_codes4(const storage::Float8E4M3* w, int64_t d0, int64_t dim, float (&x)[4]) {
  uint32_t word = 0;
  if (d0 < dim) {  // a lane of a chunk past the row's end reads nothing
    if ((reinterpret_cast<uintptr_t>(w + d0) & 3) == 0) {
      word = *reinterpret_cast<const uint32_t*>(w + d0);
    } else {
      for (int k = 0; k < 4; ++k) word |= static_cast<uint32_t>(w[d0 + k].bits) << (8 * k);
    }
  }
  for (int k = 0; k < 4; ++k) {
    const storage::Float8E4M3 q{static_cast<uint8_t>(word >> (8 * k))};
    x[k] = d0 + k < dim ? storage::to_float(q) : 0.f;
  }
}

/// Writes codes d0..d0+3 (d0 a multiple of 4; `word` as scaled_codes4 gives
/// them, the padding's 0) into an FP8 row: one 4-byte store where aligned,
/// else a byte at a time.
DEMB_HD void store_codes4(storage::Float8E4M3* w, int64_t d0, uint32_t word) {
  if ((reinterpret_cast<uintptr_t>(w + d0) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(w + d0) = word;
    return;
  }
  for (int k = 0; k < 4; ++k) w[d0 + k].bits = static_cast<uint8_t>(word >> (8 * k));
}

}  // namespace embedding
}  // namespace dyn_emb
