// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique's argument checks and result, shared by its kernel
// (unique_ops.cpp) and its Meta kernel (ops_meta.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {

/// (keys, table_ids, inverse, counts, table_offsets, order, num_unique,
/// occ_offsets): see the schema (schemas.cpp).
using UniqueResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                at::Tensor, at::Tensor, at::Tensor>;

/// Checks the arguments; returns the options of the int64 results (the
/// keys' device).
inline at::TensorOptions check_unique_args(const at::Tensor& keys, const at::Tensor& table_ids,
                                           int64_t num_tables) {
  check_devices("segmented_unique", {{"keys", &keys}, {"table_ids", &table_ids}});
  check_1d(keys, at::kLong, "keys");
  check_1d(table_ids, at::kLong, "table_ids");
  TORCH_CHECK_VALUE(keys.sym_numel() == table_ids.sym_numel(), "dynamicemb: keys (",
                    keys.sym_numel(), ") and table_ids (", table_ids.sym_numel(),
                    ") must have one length");
  TORCH_CHECK_VALUE(num_tables >= 1 && num_tables < (int64_t{1} << 31),
                    "dynamicemb: num_tables must be in [1, 2^31), got ", num_tables);
  return keys.options().dtype(at::kLong);
}

}  // namespace ops
}  // namespace dyn_emb
