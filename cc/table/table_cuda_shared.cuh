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
