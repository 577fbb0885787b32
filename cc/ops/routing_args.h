// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks of route_keys and check_batch, shared by their CPU, CUDA and
// Meta kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

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

/// The tensor arguments of check_batch, for check_devices (CPU, CUDA, Meta):
/// the optional ones that are given on the values' device.
inline void check_batch_devices(const at::Tensor& values, const at::Tensor& lengths,
                                const c10::optional<at::Tensor>& weights,
                                const c10::optional<at::Tensor>& offsets,
                                const c10::optional<at::Tensor>& feature_mask,
                                const c10::optional<at::Tensor>& feature_rows) {
  check_devices("check_batch", {{"values", &values}, {"lengths", &lengths}});
  for (const auto& [name, t] :
       {std::pair{"weights", &weights}, std::pair{"offsets", &offsets},
        std::pair{"feature_mask", &feature_mask}, std::pair{"feature_rows", &feature_rows}}) {
    if (t->has_value()) check_devices("check_batch", {{"values", &values}, {name, &t->value()}});
  }
}

/// Checks the arguments of check_batch: what the batch check in Python
/// settled before (dtypes, shapes, one device), so a call that passes is one
/// the kernels can read.
inline void check_batch_args(const at::Tensor& values, const at::Tensor& lengths,
                             const c10::optional<at::Tensor>& weights,
                             const c10::optional<at::Tensor>& offsets,
                             const c10::optional<at::Tensor>& feature_mask, int64_t num_features,
                             int64_t stride, int64_t weight_rule,
                             const c10::optional<at::Tensor>& feature_rows) {
  check_batch_devices(values, lengths, weights, offsets, feature_mask, feature_rows);
  auto check_int = [](const at::Tensor& t, const char* name) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
                     "dynamicemb: ", name, " must be int32 or int64, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), "dynamicemb: ", name,
                " must be 1-D and contiguous, got shape ", t.sizes());
  };
  check_int(values, "values");
  check_int(lengths, "lengths");
  TORCH_CHECK_VALUE(num_features >= 0 && stride >= 0 && lengths.numel() == num_features * stride,
                    "dynamicemb: check_batch got ", lengths.numel(), " lengths for ", num_features,
                    " features of stride ", stride);
  if (weights.has_value()) {
    const at::Tensor& w = weights.value();
    const at::ScalarType t = w.scalar_type();
    TORCH_CHECK_TYPE(t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble,
                     "dynamicemb: check_batch reads weights of float16, bfloat16, float32 or "
                     "float64, got ",
                     t);
    TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.numel() == values.numel(),
                "dynamicemb: check_batch got weights of shape ", w.sizes(), " for ", values.numel(),
                " values");
  }
  if (offsets.has_value()) {
    check_int(offsets.value(), "offsets");
    TORCH_CHECK_VALUE(offsets->numel() >= 1, "dynamicemb: check_batch offsets are empty");
  }
  if (feature_mask.has_value()) {
    check_1d(feature_mask.value(), at::kBool, "feature_mask");
    TORCH_CHECK_VALUE(feature_mask->numel() == num_features, "dynamicemb: feature_mask has ",
                      feature_mask->numel(), " entries for ", num_features, " features");
  }
  TORCH_CHECK_VALUE(weight_rule >= 0 && weight_rule <= 2, "dynamicemb: check_batch weight_rule ",
                    weight_rule, " is not 0 (none), 1 (finite) or 2 (counters)");
  if (feature_rows.has_value()) {
    check_1d(feature_rows.value(), at::kLong, "feature_rows");
    TORCH_CHECK_VALUE(feature_rows->numel() == num_features, "dynamicemb: feature_rows has ",
                      feature_rows->numel(), " entries for ", num_features, " features");
  }
}

}  // namespace ops
}  // namespace dyn_emb
