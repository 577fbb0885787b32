// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernel of segmented_unique (schema in schemas.cpp): a hash set of the
// pairs, one short radix sort and the passes around one scan of
// cc/embedding/unique_cuda.h, in one scratch tensor.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "cc/embedding/unique_cuda.h"
#include "cc/ops/unique_args.h"

namespace dyn_emb {
namespace ops {
namespace {

UniqueResult segmented_unique_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, int64_t pad_key) {
  const auto l = check_unique_args(keys, table_ids, num_tables);
  const c10::cuda::CUDAGuard guard(keys.device());
  const int64_t n = keys.numel();
  TORCH_CHECK_VALUE(n < std::numeric_limits<int32_t>::max(),
                    "dynamicemb: segmented_unique takes fewer than 2^31 - 1 keys, got ", n);
  at::Tensor uniq_keys = at::empty({n}, l), uniq_tables = at::empty({n}, l);
  at::Tensor inverse = at::empty({n}, l), counts = at::empty({n}, l);
  at::Tensor offsets = at::empty({num_tables + 1}, l), order = at::empty({n}, l);
  at::Tensor starts = at::empty({n + 1}, l), num_unique = at::empty({1}, l);
  if (n == 0) {
    return {uniq_keys, uniq_tables,        inverse,       counts, offsets.zero_(),
            order,     num_unique.zero_(), starts.zero_()};
  }
  at::Tensor scratch =
      at::empty({static_cast<int64_t>(embedding::cuda::unique_scratch(n, num_tables))},
                keys.options().dtype(at::kByte));
  embedding::cuda::UniqueOutputs out;
  out.keys = uniq_keys.data_ptr<int64_t>();
  out.table_ids = uniq_tables.data_ptr<int64_t>();
  out.inverse = inverse.data_ptr<int64_t>();
  out.counts = counts.data_ptr<int64_t>();
  out.table_offsets = offsets.data_ptr<int64_t>();
  out.order = order.data_ptr<int64_t>();
  out.num_unique = num_unique.data_ptr<int64_t>();
  out.occ_offsets = starts.data_ptr<int64_t>();
  embedding::cuda::segmented_unique(keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n,
                                    num_tables, pad_key, scratch.data_ptr(), out,
                                    c10::cuda::getCurrentCUDAStream().stream());
  return {uniq_keys, uniq_tables, inverse, counts, offsets, order, num_unique, starts};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) { m.impl("segmented_unique", &segmented_unique_cuda); }

}  // namespace ops
}  // namespace dyn_emb
