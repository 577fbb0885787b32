// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernel of segmented_unique (schema in schemas.cpp): the two stable
// sorts (ATen: by key, then the table ids by table), then the passes of
// cc/embedding/unique_cuda.h around one scan: a handful of launches where a
// composition of ATen operations took some twenty.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

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
  at::Tensor uniq_keys = at::empty({n}, l), uniq_tables = at::empty({n}, l);
  at::Tensor inverse = at::empty({n}, l), counts = at::empty({n}, l);
  at::Tensor offsets = at::empty({num_tables + 1}, l), order = at::empty({n}, l);
  at::Tensor starts = at::empty({n + 1}, l);
  if (n == 0) {
    return {uniq_keys,       uniq_tables, inverse,           counts,
            offsets.zero_(), order,       at::zeros({1}, l), starts.zero_()};
  }
  auto [k1, p1] = at::sort(keys, /*stable=*/true, 0, false);
  const at::ScalarType narrow = num_tables <= (1 << 15) ? at::kShort : at::kInt;
  auto [t_sorted, p2] = at::sort(table_ids.index_select(0, p1).to(narrow), true, 0, false);
  embedding::cuda::SortedPairs s;
  s.key_sorted = k1.data_ptr<int64_t>();
  s.by_key = p1.data_ptr<int64_t>();
  s.table_sorted = t_sorted.data_ptr();
  s.table_bytes = narrow == at::kShort ? 2 : 4;
  s.by_table = p2.data_ptr<int64_t>();
  s.n = n;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  at::Tensor new_pair = at::empty({n}, l);
  embedding::cuda::unique_flags(s, order.data_ptr<int64_t>(), new_pair.data_ptr<int64_t>(), stream);
  const at::Tensor pairs_through = at::cumsum(new_pair, 0);
  at::Tensor num_unique = at::empty({1}, l);
  embedding::cuda::UniqueOutputs out;
  out.keys = uniq_keys.data_ptr<int64_t>();
  out.table_ids = uniq_tables.data_ptr<int64_t>();
  out.inverse = inverse.data_ptr<int64_t>();
  out.counts = counts.data_ptr<int64_t>();
  out.table_offsets = offsets.data_ptr<int64_t>();
  out.num_unique = num_unique.data_ptr<int64_t>();
  out.occ_offsets = starts.data_ptr<int64_t>();
  embedding::cuda::unique_pairs(s, order.data_ptr<int64_t>(), new_pair.data_ptr<int64_t>(),
                                pairs_through.data_ptr<int64_t>(), num_tables, pad_key, out,
                                stream);
  return {uniq_keys, uniq_tables, inverse, counts, offsets, order, num_unique, starts};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) { m.impl("segmented_unique", &segmented_unique_cuda); }

}  // namespace ops
}  // namespace dyn_emb
