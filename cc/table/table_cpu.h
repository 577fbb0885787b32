// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU backend of the scored hash table: the reference semantics, multithreaded
// with at::parallel_for. Every function takes raw pointers (see table_ref.h for
// shapes); the torch ops in cc/ops validate their inputs before calling here.
#pragma once

#include <cstdint>

#include "cc/table/row_check.h"
#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace table {
namespace cpu {

/// Nanoseconds of a monotonic host clock: the kTimer score on the CPU.
int64_t host_timer_ns();

/// @brief Looks up `n` keys.
/// @param update apply `a`'s policies to the score words of keys found
/// @param slots (n) out: slot of each key, -1 if absent or invalid
void find(const TableRef& t, const ScoreArgs& a, const int64_t* keys, const int64_t* table_ids,
          int64_t n, bool update, int64_t* slots);

/// @brief Sort keys of the run-wise operations: the key's global home bucket,
/// `total_buckets` for invalid input (sorts last, forms no run).
/// @param sort_keys (n) out
void sort_keys(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t total_buckets, int64_t* sort_keys);

/// @brief First slot of each entry's home bucket, -1 for invalid input.
/// @param starts (n) out
void home_starts(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                 int64_t* starts);

/// @brief Stable argsort of `sort_keys` (values in [0, total_buckets]).
/// @param order (n) out
void stable_order(const int64_t* sort_keys, int64_t n, int64_t total_buckets, int32_t* order);

/// @brief insert, insert_and_evict or erase (r.op) of `n` keys: sorts, runs
/// every bucket's keys in batch order, hands out or frees NO_EVICTION rows, and
/// compacts the eviction records to the front of r.ev_* (sorted order).
/// @param scratch_keys (n) scratch for the sort keys
/// @return the number of evicted keys
int64_t run_op(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets,
               int64_t* scratch_keys);

/// @brief Rebuilds every NO_EVICTION table's row allocator from the rows its
/// keys hold (rows.h): what an insert with assign_rows ends with.
void rebuild_row_allocators(const TableRef& t);

/// @brief Occupied slots in [slot_begin, slot_end) whose score word
/// `score_column` is >= `threshold`, in slot order.
/// @param out_keys (slot_end - slot_begin) out; likewise out_slots, out_tables,
///        out_scores (.., num_scores); entries past the count are left as they are
/// @return the count
int64_t export_batch(const TableRef& t, int64_t slot_begin, int64_t slot_end, int32_t score_column,
                     int64_t threshold, int64_t* out_keys, int64_t* out_slots, int64_t* out_tables,
                     int64_t* out_scores);

/// @brief out[i] = values[rows[i]] (row_bytes bytes each), zeros where rows[i] < 0.
/// @param values (num_rows, row_bytes) bytes
/// @param rows (n) int64
/// @param out (n, row_bytes) bytes
void gather_rows(const uint8_t* values, int64_t row_bytes, const int64_t* rows, int64_t n,
                 uint8_t* out);

/// @brief Occupied slots of each table, counted from the keys.
/// @param out (num_tables) out
void count(const TableRef& t, int64_t* out);

/// @brief The assign_rows check of n entries (row_check.h): the first rule
/// the batch breaks and the entry that breaks it, kRowsOk if none. Reads only.
/// @param rows the row of entry i at rows[i * row_stride]
RowVerdict check_rows(const TableRef& t, const int64_t* keys, const int64_t* table_ids,
                      const int64_t* rows, int64_t row_stride, int64_t n);

}  // namespace cpu
}  // namespace table
}  // namespace dyn_emb
