// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): the check of the rows an insert with
// assign_rows gives the new keys of NO_EVICTION tables (rows.h).
//
// # The rule, and its verdict
//
// Entry i of a batch (key, table id, row = score column 0 of its value) is
// checked in this order, the first entry that breaks a rule named:
//
//   1. every key is valid (not reserved) and every table id in range;
//   2. every entry of a NO_EVICTION table has a row in [0, row capacity);
//   3. a *new* entry (of a NO_EVICTION table, its key not in the table, the
//      first occurrence of its (table, key) pair in the batch) takes a row no
//      key of the table holds and no earlier new entry was given.
//
// So the first failing entry of rule 3 is the smallest new entry whose row an
// earlier new entry took (the earliest of them is named) or a key holds (the
// key of the highest slot holding it is named). Both backends compute the
// same RowVerdict; the op turns it into the same message (cc/ops).
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/layout.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// Which rule a batch breaks first.
enum RowCheckError : int64_t {
  kRowsOk = 0,
  kRowKeyReserved = 1,  ///< rule 1: a reserved key
  kRowTableRange = 2,   ///< rule 1: a table id outside [0, num_tables)
  kRowOutOfRange = 3,   ///< rule 2
  kRowGivenTwice = 4,   ///< rule 3: an earlier new entry took the row
  kRowHeld = 5,         ///< rule 3: a key of the table holds the row
};

/// What the check found: the rule broken, the first entry breaking it, and
/// what its message names. Plain int64 words, so a device writes it whole.
struct RowVerdict {
  int64_t error = kRowsOk;
  int64_t index = -1;        ///< the entry
  int64_t key = 0;           ///< its key
  int64_t table = 0;         ///< its table id
  int64_t row = 0;           ///< its row (rules 2 and 3)
  int64_t row_capacity = 0;  ///< its table's rows (rule 2)
  int64_t other_index = -1;  ///< kRowGivenTwice: the earlier new entry
  int64_t other_key = 0;     ///< kRowGivenTwice: its key; kRowHeld: the holding key
};

/// The words of a RowVerdict.
constexpr int64_t kRowVerdictWords = 8;
static_assert(sizeof(RowVerdict) == kRowVerdictWords * sizeof(int64_t),
              "RowVerdict is int64 words");

/// Whether entry (key, table) is valid input: the rule 1 verdict, kRowsOk if so.
DEMB_HD int64_t key_error(const TableRef& t, int64_t key, int64_t table) {
  if (is_reserved_key(key)) return kRowKeyReserved;
  if (table < 0 || table >= t.num_tables) return kRowTableRange;
  return kRowsOk;
}

/// Whether a (valid) table hands out rows: NO_EVICTION.
DEMB_HD bool assigns_rows(const TableRef& t, int64_t table) {
  return t.info[table * kInfoCols + kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction);
}

/// The rows of a (valid) table: rule 2 takes a row in [0, this).
DEMB_HD int64_t row_capacity(const TableRef& t, int64_t table) {
  return t.info[table * kInfoCols + kInfoRowCapacity];
}

/// The entry of free_rows standing for `row` of a (valid) table.
DEMB_HD int64_t row_entry(const TableRef& t, int64_t table, int64_t row) {
  return t.info[table * kInfoCols + kInfoRowOffset] + row;
}

/// Fills the entry-dependent words of a verdict.
DEMB_HD RowVerdict row_verdict(int64_t error, int64_t index, int64_t key, int64_t table,
                               int64_t row) {
  RowVerdict v;
  v.error = error;
  v.index = index;
  v.key = key;
  v.table = table;
  v.row = row;
  return v;
}

}  // namespace table
}  // namespace dyn_emb
