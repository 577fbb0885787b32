// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// What the CUDA backend's operations share (table_cuda_*.cu): scratch
// arrays, the layout check every operation starts with, the call's clock
// reading, stream compaction and the vector width of row copies. Internal to
// //cc/table:table_cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cc/table/operations.h"
#include "cc/table/table_cuda.h"
#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace table {
namespace cuda {

/// n (at least one) elements of T from the op's scratch memory.
template <typename T>
T* alloc(ScratchAllocator& s, int64_t n) {
  return static_cast<T*>(s.allocate(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T)));
}

/// A device flag, 1 where `info` describes a consistent layout (and, when
/// given, total_buckets >= 0 and has_rows agree with it). Kernels given it
/// treat every entry as invalid otherwise, so nothing is read or written out
/// of bounds and the host never waits for the check.
const int32_t* layout_ok(const TableRef& t, int64_t free_rows_len, int64_t total_buckets,
                         bool has_rows, ScratchAllocator& scratch, cudaStream_t stream);

/// `a` with the call's one reading of the device nanosecond timer, where a
/// policy needs it.
ScoreArgs with_timer(const ScoreArgs& a, int32_t num_scores, ScratchAllocator& scratch,
                     cudaStream_t stream);

/// Compacts the positions base + j whose flags[j] is set (j < n); returns the
/// selected positions, their number in `*count` (device memory).
int64_t* select_flagged(const uint8_t* flags, int64_t n, int64_t base, int64_t* count,
                        ScratchAllocator& scratch, cudaStream_t stream);

/// The sorted bucket keys of a run-wise operation, 32 or 64 bits wide.
struct SortedKeys {
  const void* keys;
  bool narrow;  ///< uint32_t, else unsigned long long
#if defined(__CUDACC__)
  __device__ __forceinline__ int64_t operator[](int64_t q) const {
    return narrow ? static_cast<int64_t>(static_cast<const uint32_t*>(keys)[q])
                  : static_cast<int64_t>(static_cast<const unsigned long long*>(keys)[q]);
  }
#endif
};

#if defined(__CUDACC__)
/// The counter changes of a block's runs. Batches are sorted by table, so a
/// block's runs nearly always share one table: their changes are summed in
/// shared memory and added with one atomic per counter per block (one global
/// atomic per run on a single address would serialize the whole batch); the
/// runs of other tables add theirs directly. A block declares one __shared__,
/// calls start (every thread), add (a run's writer), finish (every thread).
struct BlockCounters {
  static constexpr int kDeltas = 4;
  unsigned long long sum[kDeltas];
  int64_t table;

  static __device__ __forceinline__ int column(int c) {
    return c == 0   ? kCounterSize
           : c == 1 ? kCounterInsertFailures
           : c == 2 ? kCounterEvictions
                    : kCounterInserts;
  }
  /// `first_table()`: the table of the block's first entry, -1 if none
  /// (called by thread 0).
  template <class F>
  __device__ void start(const F& first_table) {
    if (threadIdx.x == 0) {
      table = first_table();
      for (int c = 0; c < kDeltas; ++c) sum[c] = 0;
    }
    __syncthreads();
  }
  __device__ void add(const TableRef& t, int64_t run_table, const RunDeltas& d) {
    const int64_t delta[kDeltas] = {d.size, d.failures, d.evictions, d.inserts};
#pragma unroll
    for (int c = 0; c < kDeltas; ++c) {
      if (!delta[c]) continue;
      if (run_table == table) {
        atomicAdd(&sum[c], static_cast<unsigned long long>(delta[c]));
      } else {
        atomic_add_i64(t.counters + run_table * kCounterCols + column(c), delta[c]);
      }
    }
  }
  __device__ void finish(const TableRef& t) {
    __syncthreads();
    if (threadIdx.x < kDeltas && table >= 0 && sum[threadIdx.x]) {
      atomic_add_i64(t.counters + table * kCounterCols + column(threadIdx.x),
                     static_cast<int64_t>(sum[threadIdx.x]));
    }
  }
};
#endif

/// The tiles of the runs of insert and insert_and_evict (tile_run.h), of
/// `lanes` lanes (4, 8, 16 or 32), over the sorted keys: every run whose bucket
/// is at most kTileMaxWidth wide, and the invalid entries. `records`: the
/// eviction records are wanted (r.ev_* by position, r.ev_flags zeroed).
void tile_runs(int lanes, const TableRef& t, const RunArgs& r, SortedKeys sorted, int64_t n,
               int64_t total_buckets, bool records, cudaStream_t stream);

/// Calls f(V{}) with the widest V of uint4, uint2, uint32_t and uint8_t whose
/// size divides row_bytes and aligns both buffers: the unit rows are copied in.
template <class F>
void with_vector_type(int64_t row_bytes, const void* values, const void* out, const F& f) {
  const auto aligned = [&](size_t a) {
    return row_bytes % static_cast<int64_t>(a) == 0 &&
           reinterpret_cast<uintptr_t>(values) % a == 0 &&
           reinterpret_cast<uintptr_t>(out) % a == 0;
  };
  if (aligned(16)) {
    f(uint4{});
  } else if (aligned(8)) {
    f(uint2{});
  } else if (aligned(4)) {
    f(uint32_t{});
  } else {
    f(uint8_t{});
  }
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
