// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/routing/routing.h"
#include "cc/routing/routing_cuda.h"

namespace dyn_emb {
namespace routing {
namespace cuda {

namespace {

// One thread per key.
__global__ void route_keys_kernel(const int64_t* keys, const int64_t* feature_ids, int64_t n,
                                  const int64_t* dist_types, const int64_t* blocks,
                                  int64_t num_features, int64_t world_size, int64_t* ranks) {
  const int64_t i = global_thread();
  if (i >= n) return;
  const int64_t f = feature_ids[i];
  ranks[i] =
      (f < 0 || f >= num_features) ? -1 : route_key(keys[i], dist_types[f], blocks[f], world_size);
}

}  // namespace

void route_keys(const int64_t* keys, const int64_t* feature_ids, int64_t n,
                const int64_t* dist_types, const int64_t* blocks, int64_t num_features,
                int64_t world_size, int64_t* ranks, cudaStream_t stream) {
  if (n == 0) return;
  route_keys_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, feature_ids, n, dist_types, blocks,
                                                        num_features, world_size, ranks);
  check_launch("route_keys");
}

}  // namespace cuda
}  // namespace routing
}  // namespace dyn_emb
