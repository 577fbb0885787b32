// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique's argument checks and results, shared by its CPU and CUDA
// kernels (unique_ops_cpu.cpp, unique_ops_cuda.cpp) and its Meta kernel
// (ops_meta.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <tuple>

#include "cc/embedding/unique.h"
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

/// The results for `keys` (uninitialized, on the keys' device; any size on
/// Meta).
inline UniqueResult empty_unique(const at::Tensor& keys, int64_t num_tables) {
  const c10::SymInt n = keys.sym_numel();
  const auto l = keys.options().dtype(at::kLong);
  auto per_pair = [&] { return at::empty_symint({n}, l); };
  return {per_pair(),
          per_pair(),
          per_pair(),
          per_pair(),
          at::empty({num_tables + 1}, l),
          per_pair(),
          at::empty({1}, l),
          at::empty_symint({n + 1}, l)};
}

/// The kernels' pointers into results of empty_unique.
inline embedding::UniqueOutputs unique_outputs(const UniqueResult& r) {
  embedding::UniqueOutputs out;
  out.keys = std::get<0>(r).data_ptr<int64_t>();
  out.table_ids = std::get<1>(r).data_ptr<int64_t>();
  out.inverse = std::get<2>(r).data_ptr<int64_t>();
  out.counts = std::get<3>(r).data_ptr<int64_t>();
  out.table_offsets = std::get<4>(r).data_ptr<int64_t>();
  out.order = std::get<5>(r).data_ptr<int64_t>();
  out.num_unique = std::get<6>(r).data_ptr<int64_t>();
  out.occ_offsets = std::get<7>(r).data_ptr<int64_t>();
  return out;
}

}  // namespace ops
}  // namespace dyn_emb
