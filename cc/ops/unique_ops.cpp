// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique: the distinct (table, key) pairs of a batch, per table
// (dynamicemb/embedding/unique.py documents the results). One op, so that a
// training step pays one call from Python for it instead of some forty, with
// a kernel for each device: here the CPU's (a sort, a counting sort, the
// pairs ordered by first occurrence, one pass); cc/ops/unique_ops_cuda.cpp
// the CUDA one (a hash set of the pairs, one short radix sort, five passes).
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

// The CPU kernel: the stable sort by key (ATen), then a stable counting sort
// by table, which groups each pair's occurrences in input order; the pairs of
// a table are then put in the order of their first occurrences (the CUDA
// kernel's order) and one pass writes every output. Table ids are checked (on
// the CPU their values are on the host).
UniqueResult segmented_unique_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                                  int64_t num_tables, int64_t pad_key) {
  const auto l = check_unique_args(keys, table_ids, num_tables);
  check_index_range(table_ids, 0, num_tables, "table_ids: table id");
  const int64_t n = keys.numel();
  auto [k1, p1] = at::sort(keys, /*stable=*/true, 0, false);
  const int64_t* kk = k1.data_ptr<int64_t>();
  const int64_t* pk = p1.data_ptr<int64_t>();
  const int64_t* t = table_ids.data_ptr<int64_t>();
  // Stable counting sort of the key-sorted entries by table: (table, key)
  // order, the positions ascending within a pair.
  std::vector<int64_t> tk(static_cast<size_t>(n));
  std::vector<int64_t> bounds(static_cast<size_t>(num_tables) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    tk[i] = t[pk[i]];
    ++bounds[static_cast<size_t>(tk[i]) + 1];
  }
  for (int64_t b = 0; b < num_tables; ++b) bounds[b + 1] += bounds[b];
  std::vector<int64_t> next(bounds.begin(), bounds.end() - 1);
  std::vector<int64_t> perm(static_cast<size_t>(n)), ks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = next[static_cast<size_t>(tk[i])]++;
    perm[d] = pk[i];
    ks[d] = kk[i];
  }
  // The pairs in (table, key) order, each the start of its entries.
  std::vector<int64_t> first;  // entry index of each pair in (table, key) order
  for (int64_t b = 0; b < num_tables; ++b) {
    for (int64_t i = bounds[b]; i < bounds[b + 1]; ++i) {
      if (i == bounds[b] || ks[i] != ks[i - 1]) first.push_back(i);
    }
  }
  const int64_t u = static_cast<int64_t>(first.size());
  first.push_back(n);
  // Pair g's first position is perm[first[g]] (positions ascend within a
  // pair); walking each table's positions in input order meets the pairs in
  // the order of their first occurrences.
  std::vector<int64_t> pair_first_at(static_cast<size_t>(n), -1);
  for (int64_t g = 0; g < u; ++g) pair_first_at[perm[first[g]]] = g;
  std::vector<int64_t> by_table(static_cast<size_t>(n));  // positions, table by table
  std::copy(bounds.begin(), bounds.end() - 1, next.begin());
  for (int64_t i = 0; i < n; ++i) by_table[next[static_cast<size_t>(t[i])]++] = i;
  std::vector<int64_t> pairs;  // pair indices in output order
  pairs.reserve(static_cast<size_t>(u));
  for (int64_t i = 0; i < n; ++i) {
    if (pair_first_at[by_table[i]] >= 0) pairs.push_back(pair_first_at[by_table[i]]);
  }
  at::Tensor uniq_keys = at::empty({n}, l), uniq_tables = at::empty({n}, l);
  at::Tensor inverse = at::empty({n}, l), counts = at::empty({n}, l), order = at::empty({n}, l);
  at::Tensor starts = at::empty({n + 1}, l), offsets = at::empty({num_tables + 1}, l);
  int64_t* uk = uniq_keys.data_ptr<int64_t>();
  int64_t* ut = uniq_tables.data_ptr<int64_t>();
  int64_t* inv = inverse.data_ptr<int64_t>();
  int64_t* c = counts.data_ptr<int64_t>();
  int64_t* ord = order.data_ptr<int64_t>();
  int64_t* st = starts.data_ptr<int64_t>();
  int64_t* off = offsets.data_ptr<int64_t>();
  int64_t at_entry = 0, table = 0;
  for (int64_t v = 0; v < u; ++v) {
    const int64_t g = pairs[v];
    const int64_t b = t[perm[first[g]]];  // the pair's table
    for (; table <= b; ++table) off[table] = v;
    st[v] = at_entry;
    uk[v] = ks[first[g]];
    ut[v] = b;
    c[v] = first[g + 1] - first[g];
    for (int64_t i = first[g]; i < first[g + 1]; ++i) {
      ord[at_entry++] = perm[i];
      inv[perm[i]] = v;
    }
  }
  for (; table <= num_tables; ++table) off[table] = u;
  for (int64_t v = u; v < n; ++v) {
    st[v] = n;
    uk[v] = pad_key;
    ut[v] = num_tables - 1;
    c[v] = 0;
  }
  st[n] = n;
  at::Tensor num_unique = at::full({1}, u, l);
  return {uniq_keys, uniq_tables, inverse, counts, offsets, order, num_unique, starts};
}

}  // namespace

// The CPU kernel (CUDA: unique_ops_cuda.cpp; Meta: ops_meta.cpp).
TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("segmented_unique", &segmented_unique_cpu); }

}  // namespace ops
}  // namespace dyn_emb
