// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/embedding/lookup.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// @brief Writes every bag's pooled embedding into a.out (lookup.h); one warp per bag.
void pool_forward(const PoolArgs& a, int64_t num_bags, cudaStream_t stream);

/// @brief Reduces each distinct key's gradient and updates its row in place;
/// one warp per key.
void update_backward(const UpdateArgs& a, int64_t num_keys, cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
