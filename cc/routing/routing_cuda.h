// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dyn_emb {
namespace routing {
namespace cuda {

/// @brief ranks[i] = route_key(keys[i], dist_types[f], blocks[f], world_size)
/// with f = feature_ids[i] (routing.h); every pointer on the device.
/// Feature ids out of [0, num_features) give rank -1 (the wrapper checks).
void route_keys(const int64_t* keys, const int64_t* feature_ids, int64_t n,
                const int64_t* dist_types, const int64_t* blocks, int64_t num_features,
                int64_t world_size, int64_t* ranks, cudaStream_t stream);

}  // namespace cuda
}  // namespace routing
}  // namespace dyn_emb
