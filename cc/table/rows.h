// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): NO_EVICTION rows.
//
// # Rows (NO_EVICTION)
//
// A new key needs a row of the value buffer. Rows are handed out after the runs,
// in batch order per table: first from the table's free stack (top first),
// then fresh rows from counters[kCounterNextRow]. erase pushes the freed rows
// onto the stack in batch order. So a batch leaves rows exactly as its keys
// applied one at a time would. `row_work[i]` carries, by index, 1 for a key
// that needs a row (insert) or the freed row (erase), -1 otherwise.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// Row for the `rank`-th new key (batch order) of a NO_EVICTION table, or -1
/// when the value buffer has no row left. Reads the counters as they were
/// before the batch.
DEMB_HD int64_t row_for_rank(const TableRef& t, int64_t table, int64_t rank) {
  const int64_t* inf = t.info + table * kInfoCols;
  const int64_t* cnt = t.counters + table * kCounterCols;
  const int64_t top = cnt[kCounterFreeTop];
  if (rank < top) return t.free_rows[inf[kInfoRowOffset] + top - 1 - rank];
  const int64_t row = cnt[kCounterNextRow] + (rank - top);
  return row < inf[kInfoRowCapacity] ? row : -1;
}

/// Gives back the slot of a key that got no row: the key is not stored.
DEMB_HD void undo_rowless_insert(const TableRef& t, int64_t table, int64_t slot) {
  t.keys[slot] = kEmptyKey;
  t.digests[slot] = empty_digest();
  t.scores[slot * t.num_scores] = 0;
  int64_t* cnt = t.counters + table * kCounterCols;
  atomic_add_i64(cnt + kCounterSize, -1);
  atomic_add_i64(cnt + kCounterInserts, -1);
  atomic_add_i64(cnt + kCounterInsertFailures, 1);
}

/// After the row pass: a repeat of a key whose insert got no row found a slot
/// that was given back; it fails too, as it would one key at a time.
DEMB_HD void fail_rowless_repeat(const TableRef& t, const RunArgs& r, int64_t i) {
  const int64_t slot = r.slots[i];
  if (slot < 0 || r.status[i] != static_cast<int8_t>(InsertStatus::kFound) ||
      t.keys[slot] == r.keys[i]) {
    return;
  }
  r.slots[i] = -1;
  r.status[i] = static_cast<int8_t>(InsertStatus::kFailed);
  atomic_add_i64(t.counters + r.table_ids[i] * kCounterCols + kCounterInsertFailures, 1);
}

/// Counter update once `n` rows were asked for (insert) by a table's batch.
DEMB_HD void finish_row_allocation(const TableRef& t, int64_t table, int64_t n) {
  int64_t* cnt = t.counters + table * kCounterCols;
  const int64_t* inf = t.info + table * kInfoCols;
  const int64_t top = cnt[kCounterFreeTop];
  const int64_t fresh_left = inf[kInfoRowCapacity] - cnt[kCounterNextRow];
  const int64_t from_stack = n < top ? n : top;
  int64_t fresh = n - from_stack;
  if (fresh > fresh_left) fresh = fresh_left;
  cnt[kCounterFreeTop] = top - from_stack;
  cnt[kCounterNextRow] += fresh;
}

/// erase: the `rank`-th freed row (batch order) of a table goes on the stack.
DEMB_HD void push_free_row(const TableRef& t, int64_t table, int64_t rank, int64_t row) {
  const int64_t* inf = t.info + table * kInfoCols;
  const int64_t top = t.counters[table * kCounterCols + kCounterFreeTop];
  t.free_rows[inf[kInfoRowOffset] + top + rank] = row;
}

DEMB_HD void finish_row_release(const TableRef& t, int64_t table, int64_t n) {
  t.counters[table * kCounterCols + kCounterFreeTop] += n;
}

}  // namespace table
}  // namespace dyn_emb
