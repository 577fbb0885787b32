// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Non-owning views of a fused scored hash table and of one bulk operation.
// Trivially copyable: kernels take them by value. The layout they describe is
// documented once, in layout.h.
#pragma once

#include <cstdint>

#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// Maximum number of score words per slot (1, or 2 for TIMESTAMP+LFU).
constexpr int32_t kMaxScores = 2;

/// The table's state, as raw pointers into tensors owned by the layer above.
struct TableRef {
  int64_t* keys = nullptr;        ///< (num_slots) key or kEmptyKey
  uint8_t* digests = nullptr;     ///< (num_slots) 1-byte digest of the key's hash
  int64_t* scores = nullptr;      ///< (num_slots, num_scores)
  const int64_t* info = nullptr;  ///< (num_tables, kInfoCols)
  int64_t* counters = nullptr;    ///< (num_tables, kCounterCols)
  int64_t* free_rows = nullptr;   ///< NO_EVICTION free-row stacks, see kInfoRowOffset
  int32_t num_scores = 1;         ///< score words per slot, 1..kMaxScores
  int64_t num_tables = 0;         ///< logical tables fused in this allocation
  int64_t num_slots = 0;          ///< sum of the tables' capacities
  int64_t num_free_rows = 0;      ///< entries of free_rows
};

/// How a bulk operation treats scores: one policy per score column, and the
/// values they use, shape (1 or n, num_scores) with `value_row_stride` 0 when
/// one row is broadcast to every key.
struct ScoreArgs {
  int32_t policy[kMaxScores] = {0, 0};  ///< ScorePolicy per column
  const int64_t* values = nullptr;      ///< (1 or n, num_scores)
  int64_t value_row_stride = 0;         ///< 0 (broadcast) or num_scores
  int64_t host_now = 0;                 ///< kTimer on the CPU backend
  const int64_t* device_now = nullptr;  ///< kTimer on the CUDA backend: one reading per call
};

/// Inputs and outputs of the run-wise operations (insert, insert_and_evict,
/// erase, place). Arrays marked "by index" follow the caller's batch order; arrays
/// marked "by position" follow the sorted order `order`.
struct RunArgs {
  const int64_t* keys = nullptr;       ///< (n) by index
  const int64_t* table_ids = nullptr;  ///< (n) by index
  const int32_t* order = nullptr;      ///< (n) indices sorted by (global bucket, index)
  ScoreArgs score;
  RunOp op = RunOp::kInsert;
  bool assign_rows = false;  ///< NO_EVICTION: score column 0 gives the row, not the allocator
  const int64_t* targets = nullptr;  ///< (n) by index: kPlace's slot of each key

  int64_t* slots = nullptr;      ///< (n) by index: slot or -1
  int8_t* status = nullptr;      ///< (n) by index: InsertStatus
  int64_t* ev_keys = nullptr;    ///< (n) by position: evicted key
  int64_t* ev_scores = nullptr;  ///< (n, num_scores) by position
  int64_t* ev_slots = nullptr;   ///< (n) by position
  int64_t* ev_tables = nullptr;  ///< (n) by position
  uint8_t* ev_flags = nullptr;   ///< (n) by position: 1 where a key was evicted
  int64_t* row_work = nullptr;   ///< (n) by index: see rows.h
  /// (num_slots) by slot, or null: a custom eviction score per slot that ranks
  /// victims before the score words (see scores.h). Read only
  /// for the untouched slots of full buckets.
  const double* victim_scores = nullptr;
  /// insert / insert_and_evict of evicting tables: a key whose score word 0
  /// reaches this leaves the table (see operations.h, "Release").
  int64_t release_at = kNoRelease;
  /// (n) by index, or null: the score word 0 each key of an evicting table
  /// reached (also where it was released or not stored); other entries are
  /// left as they are.
  int64_t* scores_out = nullptr;
  /// (n) by sorted position, or null: from the first position of a run, the
  /// victims of its bucket computed before the runs, or -1 ("Victim hints",
  /// operations.h). Read only where they are exact.
  const int64_t* victim_hint = nullptr;
  /// insert_and_evict of evicting tables: a new key whose score words would
  /// be below those of its full bucket's next victim is not stored (see
  /// operations.h, "Refusal").
  bool refuse_cold = false;
  /// (num_slots) by slot, or null: nonzero where the call holds the slot as
  /// if it had found the slot's key (never a victim; see operations.h,
  /// "Held slots"). Read only for the slots of full buckets.
  const uint8_t* held_slots = nullptr;
};

}  // namespace table
}  // namespace dyn_emb
