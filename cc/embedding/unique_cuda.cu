// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/unique_cuda.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

__device__ __forceinline__ int64_t table_at(const SortedPairs& s, int64_t i) {
  return s.table_bytes == 2 ? static_cast<const int16_t*>(s.table_sorted)[i]
                            : static_cast<const int32_t*>(s.table_sorted)[i];
}

__device__ __forceinline__ int64_t key_at(const SortedPairs& s, int64_t i) {
  return s.key_sorted[s.by_table[i]];
}

// A thread per entry.
__global__ void flags_kernel(SortedPairs s, int64_t* order, int64_t* new_pair) {
  const int64_t i = global_thread();
  if (i >= s.n) return;
  order[i] = s.by_key[s.by_table[i]];
  new_pair[i] =
      i == 0 || key_at(s, i) != key_at(s, i - 1) || table_at(s, i) != table_at(s, i - 1) ? 1 : 0;
}

// A thread per entry: entry i belongs to pair g = pairs_through[i] - 1. The
// first entry of a pair writes the pair; the first entry of a table (and the
// last entry, for the tables after it) the table offsets up to its table.
__global__ void pairs_kernel(SortedPairs s, const int64_t* order, const int64_t* new_pair,
                             const int64_t* pairs_through, int64_t num_tables, UniqueOutputs out) {
  const int64_t i = global_thread();
  if (i >= s.n) return;
  const int64_t g = pairs_through[i] - 1;
  out.inverse[order[i]] = g;
  if (!new_pair[i]) return;
  const int64_t t = table_at(s, i);
  out.keys[g] = key_at(s, i);
  out.table_ids[g] = t;
  out.occ_offsets[g] = i;
  // Clamped: a table id out of range (the op does not read the ids on the
  // host) must not write past the offsets; DYNAMICEMB_DEBUG reports it.
  const int64_t from = i == 0 ? 0 : table_at(s, i - 1) + 1;
  const int64_t to = t < num_tables ? t : num_tables;
  for (int64_t b = from < 0 ? 0 : from; b <= to; ++b) out.table_offsets[b] = g;
}

// The tables after the last entry's, and the number of distinct pairs.
__global__ void tail_kernel(SortedPairs s, const int64_t* pairs_through, int64_t num_tables,
                            UniqueOutputs out) {
  const int64_t u = pairs_through[s.n - 1];
  const int64_t last = table_at(s, s.n - 1);
  for (int64_t b = (last < 0 ? 0 : last + 1) + threadIdx.x; b <= num_tables; b += blockDim.x) {
    out.table_offsets[b] = u;
  }
  if (threadIdx.x == 0) {
    out.num_unique[0] = u;
    out.occ_offsets[s.n] = s.n;
  }
}

// A thread per pair slot v: counts of the distinct pairs, padding after them.
__global__ void pad_kernel(int64_t n, const int64_t* pairs_through, int64_t num_tables,
                           int64_t pad_key, UniqueOutputs out) {
  const int64_t v = global_thread();
  if (v >= n) return;
  const int64_t u = pairs_through[n - 1];
  if (v < u) {
    out.counts[v] = (v + 1 < u ? out.occ_offsets[v + 1] : n) - out.occ_offsets[v];
  } else {
    out.counts[v] = 0;
    out.keys[v] = pad_key;
    out.table_ids[v] = num_tables - 1;
    out.occ_offsets[v] = n;
  }
}

}  // namespace

void unique_flags(const SortedPairs& s, int64_t* order, int64_t* new_pair, cudaStream_t stream) {
  if (s.n == 0) return;
  flags_kernel<<<grid_for(s.n), kBlock, 0, stream>>>(s, order, new_pair);
  check_launch("segmented_unique (flags)");
}

void unique_pairs(const SortedPairs& s, const int64_t* order, const int64_t* new_pair,
                  const int64_t* pairs_through, int64_t num_tables, int64_t pad_key,
                  const UniqueOutputs& out, cudaStream_t stream) {
  if (s.n == 0) return;
  pairs_kernel<<<grid_for(s.n), kBlock, 0, stream>>>(s, order, new_pair, pairs_through, num_tables,
                                                     out);
  check_launch("segmented_unique (pairs)");
  tail_kernel<<<1, kWarp, 0, stream>>>(s, pairs_through, num_tables, out);
  check_launch("segmented_unique (tail)");
  pad_kernel<<<grid_for(s.n), kBlock, 0, stream>>>(s.n, pairs_through, num_tables, pad_key, out);
  check_launch("segmented_unique (padding)");
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
