// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique: the distinct (table, key) pairs of a batch, per table
// (dynamicemb/embedding/unique.py documents the results). One op composed of
// ATen operations, so it runs on every device alike, and a training step
// pays one call from Python for it instead of some forty.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "cc/ops/tensor_checks.h"
#include "cc/ops/unique_args.h"

namespace dyn_emb {
namespace ops {
namespace {

UniqueResult segmented_unique(const at::Tensor& keys, const at::Tensor& table_ids,
                              int64_t num_tables, int64_t pad_key) {
  check_unique_args(keys, table_ids, num_tables);
  const int64_t n = keys.numel();
  const auto l = keys.options().dtype(at::kLong);
  // Sort by key, then stably by table: (table, key) order. The table ids are
  // sorted at the narrowest width that holds them (fewer radix passes).
  auto [k1, p1] = at::sort(keys, /*stable=*/true, 0, /*descending=*/false);
  const at::ScalarType narrow = num_tables <= (1 << 15) ? at::kShort : at::kInt;
  auto [t_narrow, p2] = at::sort(table_ids.index_select(0, p1).to(narrow), true, 0, false);
  const at::Tensor t_sorted = t_narrow.to(at::kLong);
  const at::Tensor perm = p1.index_select(0, p2);
  const at::Tensor k_sorted = k1.index_select(0, p2);
  // new_pair[i]: sorted entry i starts a distinct pair.
  at::Tensor new_pair = at::ones({n}, l.dtype(at::kBool));
  if (n > 1) {
    at::Tensor tail = new_pair.slice(0, 1);
    at::ne_out(tail, k_sorted.slice(0, 1), k_sorted.slice(0, 0, n - 1));
    tail.logical_or_(at::ne(t_sorted.slice(0, 1), t_sorted.slice(0, 0, n - 1)));
  }
  // distinct[i]: distinct pairs among the first i sorted entries.
  at::Tensor distinct = at::zeros({n + 1}, l);
  at::Tensor tail = distinct.slice(0, 1);
  at::cumsum_out(tail, new_pair, 0);
  const at::Tensor group = tail - 1;
  // starts[u]: the first sorted position of distinct pair u (n past the last):
  // the occurrence offsets of the distinct pairs.
  at::Tensor starts = at::searchsorted(group, at::arange(n + 1, l));
  const at::Tensor head = starts.slice(0, 0, n);
  const at::Tensor first = head.clamp_max(std::max<int64_t>(n - 1, 0));
  const at::Tensor valid = head < n;
  at::Tensor uniq_keys = at::where(valid, k_sorted.index_select(0, first), pad_key);
  at::Tensor uniq_tables = at::where(valid, t_sorted.index_select(0, first), num_tables - 1);
  at::Tensor counts = starts.slice(0, 1) - head;
  at::Tensor inverse = at::empty({n}, l).index_copy_(0, perm, group);
  at::Tensor offsets =
      distinct.index_select(0, at::searchsorted(t_sorted, at::arange(num_tables + 1, l)));
  at::Tensor num_unique = distinct.slice(0, n).clone();
  return {uniq_keys, uniq_tables, inverse, counts, offsets, perm, num_unique, starts};
}

}  // namespace

// Every device: the op is a composition of ATen operations (Meta: ops_meta.cpp).
TORCH_LIBRARY_IMPL(dynamicemb, CompositeExplicitAutograd, m) {
  m.impl("segmented_unique", &segmented_unique);
}

}  // namespace ops
}  // namespace dyn_emb
