// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// @brief Device-side cpu::optimizer_step; rows outside [0, num_rows) are skipped.
void optimizer_step(const OptimArgs& a, float* values, int64_t num_rows, int64_t width,
                    const int64_t* rows, const float* grads, int64_t n, int64_t dim,
                    cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
