// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// segmented_unique: the distinct (table, key) pairs of a batch, per table
// (dynamicemb/embedding/unique.py documents the results). One op, so that a
// training step pays one call from Python for it instead of some forty, with
// a kernel for each device: here the CPU's (a sort, a counting sort and one
// pass); cc/ops/unique_ops_cuda.cpp the CUDA one (two sorts and five passes).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "cc/ops/tensor_checks.h"
#include "cc/ops/unique_args.h"

namespace dyn_emb {
namespace ops {
namespace {

// The CPU kernel: the stable sort by key (ATen), then a stable counting sort
// by table and one pass over the pairs in (table, key) order that writes
// every output, instead of some twenty passes of ATen operations. Table ids
// are checked (on the CPU their values are on the host).
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

// The CPU kernel (CUDA: unique_ops_cuda.cpp; Meta: ops_meta.cpp).
TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("segmented_unique", &segmented_unique_cpu); }

}  // namespace ops
}  // namespace dyn_emb
