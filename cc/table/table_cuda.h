// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA backend of the scored hash table. The per-key logic is that of
// operations.h, rows.h, row_check.h, layout.h and scores.h, shared with the CPU
// backend; the kernels and their launches are in
// table_cuda_{find,run,export,check,shared}.cu.
// Nothing here synchronizes the host with the device: counts stay on the
// device until someone reads them. Every operation first checks the layout
// `info` describes on the device (check_layout); if it is inconsistent, every
// entry is treated as invalid and nothing is read or written out of bounds.
// Torch-free, so it builds with nvcc alone.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cc/table/row_check.h"
#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace table {
namespace cuda {

/// Device scratch memory, alive until the calling op returns.
class ScratchAllocator {
 public:
  virtual ~ScratchAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;
};

/// @brief Device-side find; see cpu::find.
void find(const TableRef& t, const ScoreArgs& a, const int64_t* keys, const int64_t* table_ids,
          int64_t n, bool update, int64_t* slots, ScratchAllocator& scratch, cudaStream_t stream);

/// @brief find fused with the copy of each found key's value row: out[i] is
/// values[row of key i] (the slot, or under NO_EVICTION score word 0), zeros
/// where the key is absent (or its row lies past num_rows: no synchronizing
/// check here). One tile probes the bucket and copies the row.
/// @param values (num_rows, row_bytes) bytes; @param out (n, row_bytes) bytes
void find_gather(const TableRef& t, const ScoreArgs& a, const int64_t* keys,
                 const int64_t* table_ids, int64_t n, bool update, int64_t* slots,
                 const uint8_t* values, int64_t num_rows, int64_t row_bytes, uint8_t* out,
                 ScratchAllocator& scratch, cudaStream_t stream);

/// @brief Device-side insert / insert_and_evict / erase; see cpu::run_op.
/// The eviction records come out compacted in r.ev_* (sorted order), their
/// number in `*num_evicted` (device memory); with r.ev_keys null they are not
/// wanted and nothing is compacted (`*num_evicted` is 0). `r.order` must be
/// writable device memory of n entries. `has_rows`: some table is NO_EVICTION.
void run_op(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets, bool has_rows,
            int64_t* num_evicted, ScratchAllocator& scratch, cudaStream_t stream);

/// @brief Device-side home_starts (see cpu::home_starts); every entry is -1
/// when the layout is inconsistent.
void home_starts(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                 int64_t* starts, ScratchAllocator& scratch, cudaStream_t stream);

/// @brief One reading of the device nanosecond timer (the kTimer score) into
/// `*now` (device memory), in stream order.
void read_timer(int64_t* now, cudaStream_t stream);

/// @brief Device-side export_batch; the count goes to `*count` (device).
void export_batch(const TableRef& t, int64_t slot_begin, int64_t slot_end, int32_t column,
                  int64_t threshold, int64_t* out_keys, int64_t* out_slots, int64_t* out_tables,
                  int64_t* out_scores, int64_t* count, ScratchAllocator& scratch,
                  cudaStream_t stream);

/// @brief Device-side gather_rows (see cpu::gather_rows); rows >= num_rows
/// read as zeros too (no check that would synchronize).
void gather_rows(const uint8_t* values, int64_t num_rows, int64_t row_bytes, const int64_t* rows,
                 int64_t n, uint8_t* out, cudaStream_t stream);

/// @brief Occupied slots per table, into `out` (num_tables, device).
void count(const TableRef& t, int64_t* out, ScratchAllocator& scratch, cudaStream_t stream);

/// @brief The assign_rows check of n entries (row_check.h; see cpu::check_rows)
/// into `*verdict` (device memory). The caller has checked the layout (the
/// kernels trust info). Writes nothing else.
/// @param rows the row of entry i at rows[i * row_stride]
void check_rows(const TableRef& t, const int64_t* keys, const int64_t* table_ids,
                const int64_t* rows, int64_t row_stride, int64_t n, RowVerdict* verdict,
                ScratchAllocator& scratch, cudaStream_t stream);

/// @brief Number of CUDA devices visible, or a negative cudaError_t.
int device_count();

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
