// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): find for one key, and
// insert, insert_and_evict and erase for a run of keys sharing a bucket.
//
// # Bulk operations are sequential per bucket
//
// insert, insert_and_evict and erase sort the batch by (global bucket, index)
// and process each run of keys sharing a bucket in batch order, one run at a
// time per thread. Buckets are independent, so the result is exactly that of
// processing the whole batch one key after another, whatever the thread count
// or device: the CPU and CUDA backends give identical slots, statuses,
// evictions and rows. Within one batch:
//   - a repeated key finds the slot its first occurrence took (kFound);
//   - a slot the batch has already found or filled is never a victim, so every
//     slot handed back stays valid for the rest of the step; a key whose bucket
//     holds only such slots is reported kFailed and counted, never dropped.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/scores.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// find for one key: its slot or -1 (-1 also for invalid input), updating the
/// score words of a resident key of an evicting table by the policies.
DEMB_HD int64_t find_one(const TableRef& t, const ScoreArgs& a, int64_t index, int64_t key,
                         int64_t table, bool update) {
  if (!valid_input(t, key, table)) return -1;
  const int64_t slot = find_slot(t, table, key);
  if (slot >= 0 && update &&
      t.info[table * kInfoCols + kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) {
    update_score(a, index, t.num_scores, t.scores + slot * t.num_scores, /*atomic=*/true);
  }
  return slot;
}

// ------------------------------------------------------------ run-wise ops --

/// Sort key of a batch entry: its home bucket's global index; invalid input
/// sorts last and forms no run.
DEMB_HD int64_t sort_key_of(const TableRef& t, int64_t key, int64_t table) {
  if (!valid_input(t, key, table)) return INT64_MAX;
  return home_of(t, table, key).global_bucket;
}

/// NO_EVICTION with assign_rows: the row given for entry `index` lies in the
/// table's value buffer (else the entry is invalid and nothing is stored).
DEMB_HD bool assigned_row_valid(const ScoreArgs& a, int64_t index, int32_t num_scores,
                                const int64_t* inf) {
  const int64_t row = score_input(a, index, num_scores, 0);
  return row >= 0 && row < inf[kInfoRowCapacity];
}

/// True if an earlier key of this run holds `slot` (found or placed it).
DEMB_HD bool touched_by_run(const RunArgs& r, int64_t begin, int64_t cur, int64_t slot) {
  for (int64_t q = begin; q < cur; ++q) {
    const int32_t i = r.order[q];
    if (r.slots[i] == slot) return true;
  }
  return false;
}

/// Position of the smallest (victim score, scores, position) not touched by
/// this run, or -1.
/// (The best candidate's order key and score words stay in registers: each
/// slot's are read once. Score words are at most two.)
DEMB_HD int64_t pick_victim(const TableRef& t, const Home& h, const RunArgs& r, int64_t begin,
                            int64_t cur) {
  const int32_t ns = t.num_scores;
  int64_t best = -1, bk = 0, b0 = 0, b1 = 0;
  for (int64_t pos = 0; pos < h.width; ++pos) {
    const int64_t slot = h.start + pos;
    const int64_t* sc = t.scores + slot * ns;
    const int64_t k = victim_key(r, slot), s0 = sc[0], s1 = ns > 1 ? sc[1] : 0;
    if (best >= 0 && !(k != bk ? k < bk : (s0 != b0 ? s0 < b0 : s1 < b1))) continue;
    if (!touched_by_run(r, begin, cur, slot)) {
      best = pos;
      bk = k;
      b0 = s0;
      b1 = s1;
    }
  }
  return best;
}

/// First slot of the home bucket of a batch entry, or -1 for invalid input:
/// what the layer above evaluates victim scores over.
DEMB_HD int64_t home_start_of(const TableRef& t, int64_t key, int64_t table) {
  if (!valid_input(t, key, table)) return -1;
  return home_of(t, table, key).start;
}

/// Counter changes of one run, added to the table's counters by the caller.
struct RunDeltas {
  int64_t size = 0, failures = 0, evictions = 0, inserts = 0;
};

/// The sequential way of probing a bucket, used by the CPU backend. The CUDA
/// backend passes a tile-parallel one with the same answers (table_cuda.cu);
/// both run the one definition of a run below.
struct SequentialProbe {
  DEMB_HD int64_t find(const TableRef& t, const Home& h, int64_t key, uint8_t digest) const {
    return probe(t, h, key, digest);
  }
  DEMB_HD int64_t victim(const TableRef& t, const Home& h, const RunArgs& r, int64_t begin,
                         int64_t cur) const {
    return pick_victim(t, h, r, begin, cur);
  }
  DEMB_HD bool leader() const { return true; }  ///< whether this thread writes
  DEMB_HD void sync() const {}                  ///< orders writes before the next key
};

/// Processes the keys at sorted positions [begin, end), which share one
/// bucket, in order, updating the table and the per-key outputs; returns the
/// run's counter changes. `P` probes (see SequentialProbe); only its leader
/// writes.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class P>
DEMB_HD RunDeltas run_keys(const TableRef& t, const RunArgs& r, int64_t begin, int64_t end,
                           const P& pr) {
  const int32_t first = r.order[begin];
  const int64_t table = r.table_ids[first];
  const Home h = home_of(t, table, r.keys[first]);
  const int64_t* inf = t.info + table * kInfoCols;
  const bool no_evict = inf[kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction);
  const int32_t ns = t.num_scores;
  const uint8_t empty_dg = empty_digest();
  const bool lead = pr.leader();
  RunDeltas d;
  const auto result = [&](int32_t i, int64_t slot, InsertStatus st) {
    if (!lead) return;
    r.slots[i] = slot;
    r.status[i] = static_cast<int8_t>(st);
  };

  for (int64_t p = begin; p < end; ++p) {
    const int32_t i = r.order[p];
    const int64_t key = r.keys[i];
    const uint8_t digest = digest_of_hash(bucket_hash(static_cast<uint64_t>(key)));
    const int64_t pos = pr.find(t, h, key, digest);
    if (lead && r.row_work) r.row_work[i] = -1;

    if (r.op == RunOp::kErase) {
      if (pos < 0) {
        result(i, -1, InsertStatus::kFailed);
      } else {
        const int64_t slot = h.start + pos;
        if (lead) {
          if (no_evict && r.row_work) r.row_work[i] = t.scores[slot * ns];
          t.keys[slot] = kEmptyKey;
          t.digests[slot] = empty_dg;
          for (int32_t c = 0; c < ns; ++c) t.scores[slot * ns + c] = 0;
        }
        result(i, slot, InsertStatus::kFound);
        --d.size;
      }
      pr.sync();
      continue;
    }

    if (pos >= 0) {  // resident: update the score
      const int64_t slot = h.start + pos;
      if (lead && !no_evict) update_score(r.score, i, ns, t.scores + slot * ns, /*atomic=*/false);
      result(i, slot, InsertStatus::kFound);
      pr.sync();
      continue;
    }

    if (no_evict && r.assign_rows && !assigned_row_valid(r.score, i, ns, inf)) {
      result(i, -1, InsertStatus::kInvalid);
      pr.sync();
      continue;
    }
    int64_t target = pr.find(t, h, kEmptyKey, empty_dg);
    InsertStatus st = InsertStatus::kInserted;
    if (target < 0) {
      if (r.op == RunOp::kInsertEvict && !no_evict) {
        target = pr.victim(t, h, r, begin, p);
        st = InsertStatus::kEvicted;
      }
      if (target < 0) {
        result(i, -1, InsertStatus::kFailed);
        ++d.failures;
        pr.sync();
        continue;
      }
      const int64_t vslot = h.start + target;
      if (lead) {
        r.ev_keys[p] = t.keys[vslot];
        for (int32_t c = 0; c < ns; ++c) r.ev_scores[p * ns + c] = t.scores[vslot * ns + c];
        r.ev_slots[p] = vslot;
        r.ev_tables[p] = table;
        r.ev_flags[p] = 1;
      }
      ++d.evictions;
    } else {
      ++d.size;
    }
    const int64_t slot = h.start + target;
    if (lead) {
      t.keys[slot] = key;
      t.digests[slot] = digest;
      if (no_evict) {
        if (r.assign_rows) {
          t.scores[slot * ns] = score_input(r.score, i, ns, 0);
        } else {
          t.scores[slot * ns] = -1;  // handed out by the row pass
          if (r.row_work) r.row_work[i] = 1;
        }
        for (int32_t c = 1; c < ns; ++c) t.scores[slot * ns + c] = 0;
      } else {
        for (int32_t c = 0; c < ns; ++c) t.scores[slot * ns + c] = initial_score(r.score, i, ns, c);
      }
    }
    result(i, slot, st);
    ++d.inserts;
    pr.sync();
  }
  return d;
}

/// Adds a run's counter changes to its table's counters.
DEMB_HD void add_deltas(const TableRef& t, int64_t table, const RunDeltas& d) {
  int64_t* cnt = t.counters + table * kCounterCols;
  if (d.size) atomic_add_i64(cnt + kCounterSize, d.size);
  if (d.failures) atomic_add_i64(cnt + kCounterInsertFailures, d.failures);
  if (d.evictions) atomic_add_i64(cnt + kCounterEvictions, d.evictions);
  if (d.inserts) atomic_add_i64(cnt + kCounterInserts, d.inserts);
}

/// A run processed by one thread: the CPU backend's unit of work.
DEMB_HD void process_run(const TableRef& t, const RunArgs& r, int64_t begin, int64_t end) {
  add_deltas(t, r.table_ids[r.order[begin]], run_keys(t, r, begin, end, SequentialProbe{}));
}

}  // namespace table
}  // namespace dyn_emb
