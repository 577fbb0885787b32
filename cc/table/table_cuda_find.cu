// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CUDA backend's read paths: find, find fused with the row copy,
// gather_rows and home_starts.
#include <cooperative_groups.h>

#include "cc/common/cuda_launch.cuh"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/scores.h"
#include "cc/table/table_cuda.h"
#include "cc/table/table_cuda_shared.cuh"
#include "cc/table/tile_probe.cuh"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

template <int L, bool Wide>
__global__ void find_kernel(TableRef t, ScoreArgs a, const int64_t* keys, const int64_t* table_ids,
                            int64_t n, bool update, int64_t* slots, const int32_t* ok) {
  const auto g = cg::tiled_partition<L>(cg::this_thread_block());
  const int64_t i = tile_index<L>();
  if (i >= n) return;
  const int64_t key = keys[i], table = table_ids[i];
  if (!*ok || !valid_input(t, key, table)) {
    if (g.thread_rank() == 0) slots[i] = -1;
    return;
  }
  const Home h = home_of(t, table, key);
  const int64_t pos = tile_find<L, Wide>(g, t, h, key, h.digest);
  if (g.thread_rank() != 0) return;
  const int64_t slot = pos < 0 ? -1 : h.start + pos;
  slots[i] = slot;
  if (slot >= 0 && update &&
      t.info[table * kInfoCols + kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) {
    update_score(a, i, t.num_scores, t.scores + slot * t.num_scores, /*atomic=*/true);
  }
}

// Probes with a tile of L lanes per key, then copies the rows of the warp's
// 32 / L keys with the whole warp: lane e of a round copies vector e % vecs
// of key e / vecs, so small rows fill the warp and large rows coalesce
// (narrow tiles keep more probes in flight, and the copy does not depend on
// the tile's width). Every lane of a warp reaches the copy's shuffles.
template <typename V, int L, bool Wide>
__global__ void find_gather_kernel(TableRef t, ScoreArgs a, const int64_t* keys,
                                   const int64_t* table_ids, int64_t n, bool update, int64_t* slots,
                                   const V* values, int64_t num_rows, int64_t vecs, V* out,
                                   const int32_t* ok) {
  constexpr int kKeys = 32 / L;  // keys per warp
  const auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const auto g = cg::tiled_partition<L>(cg::this_thread_block());
  const int64_t first = (global_thread() / 32) * kKeys;  // the warp's first key
  if (first >= n) return;                                // the whole warp
  const int64_t i = tile_index<L>();
  int64_t slot = -1, row = -1;
  if (i < n && *ok && valid_input(t, keys[i], table_ids[i])) {
    const int64_t key = keys[i], table = table_ids[i];
    const Home h = home_of(t, table, key);
    const int64_t pos = tile_find<L, Wide>(g, t, h, key, h.digest);
    if (pos >= 0) {
      slot = h.start + pos;
      const int64_t* inf = t.info + table * kInfoCols;
      const bool no_evict = inf[kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction);
      row = slot;
      if (no_evict) {  // the table's block of rows, then its row (the CPU kernel refuses others)
        const int64_t r = t.scores[slot * t.num_scores];
        row = r >= 0 && r < inf[kInfoRowCapacity] ? inf[kInfoRowOffset] + r : -1;
      }
      if (row >= num_rows) row = -1;
      if (g.thread_rank() == 0 && update && !no_evict) {
        update_score(a, i, t.num_scores, t.scores + slot * t.num_scores, /*atomic=*/true);
      }
    }
  }
  if (i < n && g.thread_rank() == 0) slots[i] = slot;
  // 32-bit indices within the warp's rows (vecs is a row's vectors, small).
  const unsigned keys_here = static_cast<unsigned>(n - first < kKeys ? n - first : kKeys);
  const auto row_vecs = static_cast<unsigned>(vecs);
  const unsigned total = keys_here * row_vecs;
  V zero;
  memset(&zero, 0, sizeof(V));
#pragma unroll 4
  for (unsigned base = 0; base < total; base += 32) {
    const unsigned e = base + warp.thread_rank();
    const unsigned k = e < total ? e / row_vecs : 0;
    const int64_t r = warp.shfl(row, k * L);
    if (e < total) {
      const unsigned v = e - k * row_vecs;
      out[(first + k) * vecs + v] = r >= 0 ? values[r * vecs + v] : zero;
    }
  }
}

__global__ void home_start_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids,
                                  int64_t n, int64_t* starts, const int32_t* ok) {
  const int64_t i = global_thread();
  if (i >= n) return;
  starts[i] = *ok ? home_start_of(t, keys[i], table_ids[i]) : -1;
}

// One thread per (row, vector) element: consecutive threads copy consecutive
// vectors of a row, then of the next row, so loads and stores coalesce.
template <typename V>
__global__ void gather_rows_kernel(const V* values, int64_t num_rows, int64_t vecs,
                                   const int64_t* rows, int64_t n, V* out) {
  const int64_t e = global_thread();
  if (e >= n * vecs) return;
  const int64_t i = e / vecs, v = e - i * vecs;
  const int64_t row = rows[i];
  V x;
  if (row >= 0 && row < num_rows) {
    x = values[row * vecs + v];
  } else {
    memset(&x, 0, sizeof(V));
  }
  out[e] = x;
}

}  // namespace

void find(const TableRef& t, const ScoreArgs& a, const int64_t* keys, const int64_t* table_ids,
          int64_t n, bool update, int64_t* slots, ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  const ScoreArgs at = update ? with_timer(a, t.num_scores, scratch, stream) : a;
  with_find_lanes(t, [&](auto lanes, auto wide) {
    constexpr int L = decltype(lanes)::value;
    find_kernel<L, decltype(wide)::value>
        <<<tile_grid_for<L>(n), kBlock, 0, stream>>>(t, at, keys, table_ids, n, update, slots, ok);
  });
  check_launch("find");
}

void find_gather(const TableRef& t, const ScoreArgs& a, const int64_t* keys,
                 const int64_t* table_ids, int64_t n, bool update, int64_t* slots,
                 const uint8_t* values, int64_t num_rows, int64_t row_bytes, uint8_t* out,
                 ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  const ScoreArgs at = update ? with_timer(a, t.num_scores, scratch, stream) : a;
  with_vector_type(row_bytes, values, out, [&](auto tag) {
    using V = decltype(tag);
    const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
    const auto* src = reinterpret_cast<const V*>(values);
    auto* dst = reinterpret_cast<V*>(out);
    with_find_lanes(t, [&](auto lanes, auto wide) {
      constexpr int L = decltype(lanes)::value;
      find_gather_kernel<V, L, decltype(wide)::value><<<tile_grid_for<L>(n), kBlock, 0, stream>>>(
          t, at, keys, table_ids, n, update, slots, src, num_rows, vecs, dst, ok);
    });
  });
  check_launch("find_gather");
}

void gather_rows(const uint8_t* values, int64_t num_rows, int64_t row_bytes, const int64_t* rows,
                 int64_t n, uint8_t* out, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return;
  with_vector_type(row_bytes, values, out, [&](auto tag) {
    using V = decltype(tag);
    const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
    gather_rows_kernel<V><<<grid_for(n * vecs), kBlock, 0, stream>>>(
        reinterpret_cast<const V*>(values), num_rows, vecs, rows, n, reinterpret_cast<V*>(out));
  });
  check_launch("gather_rows");
}

void home_starts(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                 int64_t* starts, ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  home_start_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, keys, table_ids, n, starts, ok);
  check_launch("home_starts");
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
