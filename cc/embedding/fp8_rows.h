// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Writing an FP8 row (cc/storage/row_space.h, "FP8 rows"): the scale of its
// values' largest magnitude, then each code rounded stochastically with the
// bits of (key, step, element) (philox.h). The initializers (step 0) and the
// optimizers (their step) write rows this way, on both backends.
#pragma once

#include <cmath>
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

/// Writes the float32 values `v` (dim) as an FP8 row at `w`: its scale, its
/// codes, zeros in the padding to 4 bytes.
DEMB_HD void write_scaled_row(storage::Float8E4M3* w, const float* v, int64_t dim, uint64_t key,
                              int64_t step) {
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) amax = fmaxf(amax, fabsf(v[d]));
  const float scale = storage::fp8_scale(amax);
  for (int64_t d = 0; d < dim; ++d) w[d] = scaled_code(v[d], scale, key, step, d);
  for (int64_t d = dim; d < storage::pad4(dim); ++d) w[d] = storage::Float8E4M3{0};
  *storage::scale_at(w, dim) = scale;
}

}  // namespace embedding
}  // namespace dyn_emb
