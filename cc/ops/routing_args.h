// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks of route_keys, shared by its CPU, CUDA and Meta kernels.
#pragma once

#include <ATen/ATen.h>

#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {

/// The tensor arguments of route_keys, for check_devices (CPU, CUDA, Meta).
inline void check_route_devices(const at::Tensor& keys, const at::Tensor& feature_ids,
                                const at::Tensor& dist_types, const at::Tensor& blocks) {
  check_devices("route_keys", {{"keys", &keys},
                               {"feature_ids", &feature_ids},
                               {"dist_types", &dist_types},
                               {"blocks", &blocks}});
}

/// Checks the arguments of route_keys that need no data: dtypes, shapes,
/// devices and the world size. Values (dist types, blocks, feature ids) are
/// checked by the CPU kernel; on CUDA that would synchronize, and the Python
/// wrapper checks the per-feature tables once, when it builds them.
inline void check_route_args(const at::Tensor& keys, const at::Tensor& feature_ids,
                             const at::Tensor& dist_types, const at::Tensor& blocks,
                             int64_t world_size) {
  check_route_devices(keys, feature_ids, dist_types, blocks);
  check_1d(keys, at::kLong, "keys");
  check_1d(feature_ids, at::kLong, "feature_ids");
  check_1d(dist_types, at::kLong, "dist_types");
  check_1d(blocks, at::kLong, "blocks");
  TORCH_CHECK_VALUE(feature_ids.numel() == keys.numel(), "dynamicemb: route_keys got ",
                    keys.numel(), " keys and ", feature_ids.numel(), " feature ids");
  TORCH_CHECK_VALUE(dist_types.numel() == blocks.numel() && dist_types.numel() >= 1,
                    "dynamicemb: route_keys needs one dist type and one block per feature, got ",
                    dist_types.numel(), " and ", blocks.numel());
  TORCH_CHECK_VALUE(world_size > 0, "dynamicemb: route_keys world_size must be positive, got ",
                    world_size);
}

}  // namespace ops
}  // namespace dyn_emb
