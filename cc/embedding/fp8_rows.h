// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Writing an FP8 row (cc/storage/row_space.h, "FP8 rows"): the scale of its
// values' largest magnitude, then each code rounded stochastically with the
// bits of (key, step, element) (philox.h: a draw serves four elements). The
// initializers (step 0) and the optimizers (their step) write rows this way,
// on both backends: the CUDA kernels a code per lane, the CPU a row at a time
// (fp8_rows_cpu.h).
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

}  // namespace embedding
}  // namespace dyn_emb
