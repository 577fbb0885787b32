// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Test support: a fused table held in host vectors and the outputs of one
// run-wise operation on it, for the gtests of the shared semantics and of the
// CPU backend, and for tests of code that uses the table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/rows.h"
#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace table {

/// Tables of the given (capacity, bucket width) pairs, fused in one layout.
/// row_capacities[t] > 0 makes table t a NO_EVICTION table with that many rows.
struct HostTable {
  std::vector<int64_t> keys;
  std::vector<uint8_t> digests;
  std::vector<int64_t> scores;
  std::vector<int64_t> info;
  std::vector<int64_t> counters;
  std::vector<int64_t> free_rows;
  int32_t num_scores;

  HostTable(const std::vector<std::pair<int64_t, int64_t>>& tables, int32_t ns,
            const std::vector<int64_t>& row_capacities = {})
      : num_scores(ns) {
    int64_t slot = 0, bucket = 0, row = 0;
    for (size_t t = 0; t < tables.size(); ++t) {
      const int64_t rows = t < row_capacities.size() ? row_capacities[t] : 0;
      std::vector<int64_t> r(kInfoCols, 0);
      r[kInfoSlotOffset] = slot;
      r[kInfoCapacity] = tables[t].first;
      r[kInfoBucketCapacity] = tables[t].second;
      r[kInfoBucketOffset] = bucket;
      r[kInfoRowOffset] = row;
      r[kInfoRowCapacity] = rows;
      r[kInfoMode] = static_cast<int64_t>(rows > 0 ? TableMode::kNoEviction : TableMode::kEvicting);
      info.insert(info.end(), r.begin(), r.end());
      slot += tables[t].first;
      bucket += tables[t].first / tables[t].second;
      row += rows;
    }
    keys.assign(slot, kEmptyKey);
    digests.assign(slot, empty_digest());
    scores.assign(slot * ns, 0);
    counters.assign(tables.size() * kCounterCols, 0);
    free_rows.assign(std::max<int64_t>(row, 1), 0);
  }

  int64_t total_buckets() const {
    int64_t b = 0;
    for (size_t t = 0; t < info.size() / kInfoCols; ++t)
      b += info[t * kInfoCols + kInfoCapacity] / info[t * kInfoCols + kInfoBucketCapacity];
    return b;
  }

  TableRef ref() {
    TableRef t;
    t.keys = keys.data();
    t.digests = digests.data();
    t.scores = scores.data();
    t.info = info.data();
    t.counters = counters.data();
    t.free_rows = free_rows.data();
    t.num_scores = num_scores;
    t.num_tables = static_cast<int64_t>(info.size() / kInfoCols);
    t.num_slots = static_cast<int64_t>(keys.size());
    t.num_free_rows = static_cast<int64_t>(free_rows.size());
    return t;
  }
};

/// The outputs of one run-wise operation (insert, insert_and_evict, erase) on
/// n keys, and the RunArgs that write them.
struct RunOutputs {
  std::vector<int64_t> slots, ev_keys, ev_scores, ev_slots, ev_tables, row_work;
  std::vector<int8_t> status;
  std::vector<uint8_t> ev_flags;
  std::vector<int32_t> order;

  /// Sizes the buffers for n keys of a table with `num_scores` score words;
  /// `unwritten` fills the slots, so a test sees one no operation wrote.
  void reset(int64_t n, int32_t num_scores, int64_t unwritten = -1) {
    slots.assign(n, unwritten);
    status.assign(n, -1);
    ev_keys.assign(n, 0);
    ev_scores.assign(n * num_scores, 0);
    ev_slots.assign(n, 0);
    ev_tables.assign(n, 0);
    ev_flags.assign(n, 0);
    row_work.assign(n, -1);
    order.assign(n, 0);
  }

  /// `op` on the keys and table ids (by index, as many as reset was given)
  /// with `score`, writing into these buffers; `order` is the caller's or the
  /// backend's to fill.
  RunArgs args(RunOp op, const int64_t* keys, const int64_t* table_ids, const ScoreArgs& score) {
    RunArgs r;
    r.keys = keys;
    r.table_ids = table_ids;
    r.order = order.data();
    r.score = score;
    r.op = op;
    r.slots = slots.data();
    r.status = status.data();
    r.ev_keys = ev_keys.data();
    r.ev_scores = ev_scores.data();
    r.ev_slots = ev_slots.data();
    r.ev_tables = ev_tables.data();
    r.ev_flags = ev_flags.data();
    r.row_work = row_work.data();
    return r;
  }
};

}  // namespace table
}  // namespace dyn_emb
