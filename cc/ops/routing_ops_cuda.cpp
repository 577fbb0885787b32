// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of route_keys (cc/routing/routing_cuda.h) and check_batch
// (cc/routing/batch_check_cuda.h); schemas in schemas.cpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cc/ops/routing_args.h"
#include "cc/routing/batch_check.h"
#include "cc/routing/batch_check_cuda.h"
#include "cc/routing/routing_cuda.h"
#include "cc/table/types.h"

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

routing::cuda::WeightType weight_type(at::ScalarType t) {
  using routing::cuda::WeightType;
  switch (t) {
    case at::kHalf:
      return WeightType::kHalf;
    case at::kBFloat16:
      return WeightType::kBFloat16;
    case at::kFloat:
      return WeightType::kFloat;
    default:  // at::kDouble: check_batch_args admits no other
      return WeightType::kDouble;
  }
}

at::Tensor check_batch_cuda(const at::Tensor& values, const at::Tensor& lengths,
                            const c10::optional<at::Tensor>& weights,
                            const c10::optional<at::Tensor>& offsets,
                            const c10::optional<at::Tensor>& feature_mask, int64_t num_features,
                            int64_t stride, int64_t weight_rule,
                            const c10::optional<at::Tensor>& feature_rows) {
  check_batch_args(values, lengths, weights, offsets, feature_mask, num_features, stride,
                   weight_rule, feature_rows);
  c10::cuda::CUDAGuard guard(values.device());
  routing::cuda::BatchView b;
  b.values = values.data_ptr();
  b.values_64 = values.scalar_type() == at::kLong;
  b.n = values.numel();
  b.lengths = lengths.data_ptr();
  b.lengths_64 = lengths.scalar_type() == at::kLong;
  b.num_features = num_features;
  b.stride = stride;
  if (weights.has_value() && weight_rule != static_cast<int64_t>(routing::WeightRule::kNone)) {
    b.weights = weights->data_ptr();
    b.weight_type = weight_type(weights->scalar_type());
    b.weight_rule = weight_rule;
  }
  if (offsets.has_value()) {
    b.offsets = offsets->data_ptr();
    b.offsets_64 = offsets->scalar_type() == at::kLong;
  }
  at::Tensor ends;
  if (feature_mask.has_value()) b.feature_mask = feature_mask->data_ptr<bool>();
  if (feature_rows.has_value()) b.feature_rows = feature_rows->data_ptr<int64_t>();
  if (feature_mask.has_value() || feature_rows.has_value()) {
    ends = at::cumsum(lengths.clamp_min(0), 0, at::kLong);
    b.ends = ends.data_ptr<int64_t>();
  }
  const int64_t words = routing::kVerdictWords + num_features;
  const int64_t scratch_words = routing::cuda::kCheckScratchBytes / sizeof(int64_t);
  at::Tensor buffer = at::empty({words + scratch_words}, values.options().dtype(at::kLong));
  routing::cuda::check_batch(b, table::kFirstValidKey, buffer.data_ptr<int64_t>(),
                             buffer.data_ptr<int64_t>() + words,
                             c10::cuda::getCurrentCUDAStream().stream());
  return buffer.narrow(0, 0, words);
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("route_keys", &route_keys_cuda);
  m.impl("check_batch", &check_batch_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
