// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique: the distinct (table, key) pairs of a batch, per table
// (dynamicemb/embedding/unique.py documents the results). One op, so that a
// training step pays one call from Python for it instead of some forty: a
// composition of ATen operations on every device but the CPU, which has a
// kernel of its own (a sort, a counting sort and one pass).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

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

// The CPU kernel: the stable sort by key (ATen), then a stable counting sort
// by table and one pass over the pairs in (table, key) order that writes
// every output, instead of some twenty passes of ATen operations. Table ids
// are checked (on the CPU their values are on the host).
UniqueResult segmented_unique_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                                  int64_t num_tables, int64_t pad_key) {
  check_unique_args(keys, table_ids, num_tables);
  check_index_range(table_ids, 0, num_tables, "table_ids: table id");
  const int64_t n = keys.numel();
  const auto l = keys.options().dtype(at::kLong);
  auto [k1, p1] = at::sort(keys, /*stable=*/true, 0, false);
  const int64_t* kk = k1.data_ptr<int64_t>();
  const int64_t* pk = p1.data_ptr<int64_t>();
  const int64_t* t = table_ids.data_ptr<int64_t>();
  // Stable counting sort of the key-sorted entries by table: (table, key)
  // order, the keys carried along (read in order afterwards).
  std::vector<int64_t> tk(static_cast<size_t>(n));
  std::vector<int64_t> bounds(static_cast<size_t>(num_tables) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    tk[i] = t[pk[i]];
    ++bounds[static_cast<size_t>(tk[i]) + 1];
  }
  for (int64_t b = 0; b < num_tables; ++b) bounds[b + 1] += bounds[b];
  std::vector<int64_t> next(bounds.begin(), bounds.end() - 1);
  std::vector<int64_t> ks(static_cast<size_t>(n));
  at::Tensor order = at::empty({n}, l);
  int64_t* perm = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = next[static_cast<size_t>(tk[i])]++;
    perm[d] = pk[i];
    ks[d] = kk[i];
  }
  // One pass over the pairs, table by table: distinct pair g starts at
  // sorted position starts[g]; table b's pairs start at offsets[b].
  at::Tensor uniq_keys = at::empty({n}, l), uniq_tables = at::empty({n}, l);
  at::Tensor inverse = at::empty({n}, l), counts = at::empty({n}, l);
  at::Tensor starts = at::empty({n + 1}, l), offsets = at::empty({num_tables + 1}, l);
  int64_t* uk = uniq_keys.data_ptr<int64_t>();
  int64_t* ut = uniq_tables.data_ptr<int64_t>();
  int64_t* inv = inverse.data_ptr<int64_t>();
  int64_t* st = starts.data_ptr<int64_t>();
  int64_t* off = offsets.data_ptr<int64_t>();
  int64_t g = -1;
  for (int64_t b = 0; b < num_tables; ++b) {
    off[b] = g + 1;
    for (int64_t i = bounds[b]; i < bounds[b + 1]; ++i) {
      if (i == bounds[b] || ks[i] != ks[i - 1]) {
        ++g;
        st[g] = i;
        uk[g] = ks[i];
        ut[g] = b;
      }
      inv[perm[i]] = g;
    }
  }
  const int64_t u = g + 1;
  off[num_tables] = u;
  for (int64_t v = u; v < n; ++v) {
    st[v] = n;
    uk[v] = pad_key;
    ut[v] = num_tables - 1;
  }
  st[n] = n;
  int64_t* c = counts.data_ptr<int64_t>();
  for (int64_t v = 0; v < n; ++v) c[v] = st[v + 1] - st[v];
  at::Tensor num_unique = at::full({1}, u, l);
  return {uniq_keys, uniq_tables, inverse, counts, offsets, order, num_unique, starts};
}

}  // namespace

// The CPU kernel; every other device runs the composition of ATen
// operations (Meta: ops_meta.cpp).
TORCH_LIBRARY_IMPL(dynamicemb, CompositeExplicitAutograd, m) {
  m.impl("segmented_unique", &segmented_unique);
}

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("segmented_unique", &segmented_unique_cpu); }

}  // namespace ops
}  // namespace dyn_emb
