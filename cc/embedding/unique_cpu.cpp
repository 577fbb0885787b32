// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/unique_cpu.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sort.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace dyn_emb {
namespace embedding {
namespace cpu {

void segmented_unique(const int64_t* keys, const int64_t* table_ids, int64_t n, int64_t num_tables,
                      int64_t pad_key, const UniqueOutputs& out) {
  // The stable sort by key (ATen's: a parallel radix sort for long batches).
  at::Tensor k1, p1;
  if (n > 0) {
    const at::Tensor key_view =
        at::from_blob(const_cast<int64_t*>(keys), {n}, at::TensorOptions().dtype(at::kLong));
    std::tie(k1, p1) = at::sort(key_view, /*stable=*/true, 0, false);
  }
  const int64_t* kk = n > 0 ? k1.data_ptr<int64_t>() : nullptr;
  const int64_t* pk = n > 0 ? p1.data_ptr<int64_t>() : nullptr;
  const int64_t* t = table_ids;
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
  int64_t at_entry = 0, table = 0;
  for (int64_t v = 0; v < u; ++v) {
    const int64_t g = pairs[v];
    const int64_t b = t[perm[first[g]]];  // the pair's table
    for (; table <= b; ++table) out.table_offsets[table] = v;
    out.occ_offsets[v] = at_entry;
    out.keys[v] = ks[first[g]];
    out.table_ids[v] = b;
    out.counts[v] = first[g + 1] - first[g];
    for (int64_t i = first[g]; i < first[g + 1]; ++i) {
      out.order[at_entry++] = perm[i];
      out.inverse[perm[i]] = v;
    }
  }
  for (; table <= num_tables; ++table) out.table_offsets[table] = u;
  for (int64_t v = u; v < n; ++v) {
    out.occ_offsets[v] = n;
    out.keys[v] = pad_key;
    out.table_ids[v] = num_tables - 1;
    out.counts[v] = 0;
  }
  out.occ_offsets[n] = n;
  *out.num_unique = u;
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
