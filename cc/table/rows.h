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
//
// The allocator's invariant: every row below counters[kCounterNextRow] is held
// by exactly one key or on the free stack exactly once, and no row above it is
// either; so 0 <= free top <= next row <= row capacity. With assign_rows the
// new keys bring their rows (score column 0; the op refuses a row held by
// another key or given twice), and afterwards every NO_EVICTION table's
// allocator is rebuilt from the rows its keys hold: next row = the highest
// held row + 1, the free stack = the other rows below it, the lowest on top.
// State whose counters break the invariant is refused (check_counters); a
// stack entry outside the table's rows fails its key instead of being stored.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
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
  if (rank < top) {
    const int64_t row = t.free_rows[inf[kInfoRowOffset] + top - 1 - rank];
    return row >= 0 && row < inf[kInfoRowCapacity] ? row : -1;
  }
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

/// erase: the `rank`-th freed row (batch order) of a table goes on the stack
/// (never past the table's part of free_rows, whatever the state says).
DEMB_HD void push_free_row(const TableRef& t, int64_t table, int64_t rank, int64_t row) {
  const int64_t* inf = t.info + table * kInfoCols;
  const int64_t top = t.counters[table * kCounterCols + kCounterFreeTop];
  if (top + rank < inf[kInfoRowCapacity]) t.free_rows[inf[kInfoRowOffset] + top + rank] = row;
}

DEMB_HD void finish_row_release(const TableRef& t, int64_t table, int64_t n) {
  int64_t* top = t.counters + table * kCounterCols + kCounterFreeTop;
  const int64_t cap = t.info[table * kInfoCols + kInfoRowCapacity];
  *top = *top + n < cap ? *top + n : cap;
}

// ----------------------------------------------------- allocator rebuild --

/// The entry of free_rows that stands for the row a slot's key holds (the
/// table's row offset + its row), or -1: an empty slot, an evicting table, or
/// a row outside the table's rows.
DEMB_HD int64_t held_row_entry(const TableRef& t, int64_t slot) {
  if (t.keys[slot] == kEmptyKey) return -1;
  const int64_t* inf = t.info + table_of_slot(t, slot) * kInfoCols;
  if (inf[kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) return -1;
  const int64_t row = t.scores[slot * t.num_scores];
  return row >= 0 && row < inf[kInfoRowCapacity] ? inf[kInfoRowOffset] + row : -1;
}

/// Table owning entry e of free_rows (a table without rows owns none: the
/// last table at an offset is the one whose rows start there).
DEMB_HD int64_t table_of_row_entry(const TableRef& t, int64_t e) {
  return last_table_at(t, kInfoRowOffset, e);
}

/// Stack position (0 = bottom) of a free row of a rebuilt allocator: the
/// free rows lie highest at the bottom, so the lowest is handed out first.
/// `free_below` counts the table's free rows below the row, `num_free` all of
/// them (below the next row).
DEMB_HD int64_t rebuilt_stack_position(int64_t free_below, int64_t num_free) {
  return num_free - 1 - free_below;
}

// ------------------------------------------------------------ counters --

/// What is wrong with a table's counters, if anything.
enum CounterError : int32_t {
  kCountersOk = 0,
  kCounterSizeRange = 1,     ///< size outside [0, capacity]
  kCounterNextRowRange = 2,  ///< next row outside [0, row capacity]
  kCounterFreeTopRange = 3,  ///< free-row top outside [0, next row]
  kCounterNegative = 4,      ///< a cumulative counter below 0
};

/// Checks the allocator invariant and the size of every table; returns the
/// first error and its table in *bad_table.
DEMB_HD int32_t check_counters(const TableRef& t, int64_t* bad_table) {
  for (int64_t table = 0; table < t.num_tables; ++table) {
    const int64_t* inf = t.info + table * kInfoCols;
    const int64_t* cnt = t.counters + table * kCounterCols;
    *bad_table = table;
    if (cnt[kCounterSize] < 0 || cnt[kCounterSize] > inf[kInfoCapacity]) return kCounterSizeRange;
    if (cnt[kCounterNextRow] < 0 || cnt[kCounterNextRow] > inf[kInfoRowCapacity]) {
      return kCounterNextRowRange;
    }
    if (cnt[kCounterFreeTop] < 0 || cnt[kCounterFreeTop] > cnt[kCounterNextRow]) {
      return kCounterFreeTopRange;
    }
    if (cnt[kCounterInsertFailures] < 0 || cnt[kCounterEvictions] < 0 || cnt[kCounterInserts] < 0) {
      return kCounterNegative;
    }
  }
  *bad_table = -1;
  return kCountersOk;
}

}  // namespace table
}  // namespace dyn_emb
