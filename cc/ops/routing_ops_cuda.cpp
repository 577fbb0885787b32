// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernel of route_keys (cc/routing/routing_cuda.h; schema in schemas.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cc/ops/routing_args.h"
#include "cc/routing/routing_cuda.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor route_keys_cuda(const at::Tensor& keys, const at::Tensor& feature_ids,
                           const at::Tensor& dist_types, const at::Tensor& blocks,
                           int64_t world_size) {
  check_route_args(keys, feature_ids, dist_types, blocks, world_size);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor ranks = at::empty({keys.numel()}, keys.options());
  routing::cuda::route_keys(keys.data_ptr<int64_t>(), feature_ids.data_ptr<int64_t>(), keys.numel(),
                            dist_types.data_ptr<int64_t>(), blocks.data_ptr<int64_t>(),
                            dist_types.numel(), world_size, ranks.data_ptr<int64_t>(),
                            c10::cuda::getCurrentCUDAStream().stream());
  return ranks;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) { m.impl("route_keys", &route_keys_cuda); }

}  // namespace ops
}  // namespace dyn_emb
