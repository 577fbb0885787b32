// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): find for one key, and
// insert, insert_and_evict, erase and place for a run of keys sharing a bucket.
//
// # Bulk operations are sequential per bucket
//
// insert, insert_and_evict, erase and place sort the batch by (global bucket,
// index) and process each run of keys sharing a bucket, one run at a time per
// thread. Buckets are independent, so the result is that of processing the
// whole batch one key after another in this order, whatever the thread count
// or device: the CPU and CUDA backends give identical slots, statuses,
// evictions and rows. The order (insert, insert_and_evict): first every
// occurrence of a key that is in the table when the call starts, then the
// other keys, each group in batch order; erase and place: batch order. Within
// one batch:
//   - a key of the batch that is in the table is found: it keeps its slot, and
//     with it its trained row, and is never evicted by a new key of the batch
//     (it may leave by release, below);
//   - a repeated new key finds the slot its first occurrence took (kFound);
//   - a slot the batch has found or filled is never a victim, so every slot
//     handed back stays valid for the rest of the step; a key whose bucket
//     holds only such slots is reported kFailed and counted, never dropped.
//
// # Release
//
// insert and insert_and_evict may be given `release_at` (RunArgs): a key of an
// evicting table whose score word 0, once the policies are applied, reaches
// it leaves the table instead of staying. A stored key is erased (its slot is
// free for the keys after it in the run); a new key is not stored and evicts
// nothing. Either is reported kReleased with slot -1; `scores_out` receives
// the word each key reached. A later occurrence of a released key in the
// batch is a new key (taken with the new keys, from its initial score). This
// is the admission counter's rule (cc/admission/counter.h): counts accumulate
// (kAccumulate) and a key leaves the moment its count reaches the admission
// threshold.
//
// # Refusal
//
// insert_and_evict may be given `refuse_cold` (RunArgs): a new key that would
// evict, in a full bucket of an evicting table, a victim whose score words
// are above its own (the words it would enter with, compared as the victim
// order compares them, before any victim score) is not stored and evicts
// nothing: kRefused, slot -1. A key that would be the bucket's coldest does
// not displace a warmer one (an LFU newcomer seen once, a CUSTOMIZED score
// below the bucket's). The victim stays for the run's next new key.
//
// # Held slots
//
// insert and insert_and_evict may be given `held_slots` (RunArgs): a slot
// marked there is held by the call from its start, as the slot of a key the
// batch found is: never a victim. A bucket whose untouched slots are all
// held fails its new keys (kFailed). Nothing else changes: the held slots'
// keys and score words stay as they are, and an empty held slot is filled
// as any empty slot. The other keys' results are those of a call whose
// batch starts with the held slots' keys, their score words assigned as they
// are, without the runs of those keys (the cache's prefetch holds the slots
// of the batch in flight and of the coming batch's cached keys so).
//
// # Place (replay)
//
// place writes each key at a slot the caller names (where the key sits in
// another table of the same layout): the slot must lie in the key's home
// bucket, else the entry is kInvalid and changes nothing. A copy of the key
// elsewhere in the bucket is removed; a different key in the slot is
// displaced and reported like an evicted one (kEvicted); an empty slot gives
// kInserted, the key already there kFound. The score words are set by the
// policies as for a new key (kAssign: the given values); under NO_EVICTION
// place needs assign_rows, and the row allocator is not consulted.
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
DEMB_HD bool assigned_row_valid(const ScoreArgs& a, int64_t index, const int64_t* inf) {
  const int64_t row = score_input(a, index, 0);
  return row >= 0 && row < inf[kInfoRowCapacity];
}

/// First slot of the home bucket of a batch entry, or -1 for invalid input:
/// what the layer above evaluates victim scores over.
DEMB_HD int64_t home_start_of(const TableRef& t, int64_t key, int64_t table) {
  if (!valid_input(t, key, table)) return -1;
  return home_of(t, table, key).start;
}

/// Frees a slot: no key, the empty digest, zero score words.
DEMB_HD void clear_slot(const TableRef& t, int64_t slot) {
  t.keys[slot] = kEmptyKey;
  t.digests[slot] = empty_digest();
  for (int32_t c = 0; c < t.num_scores; ++c) t.scores[slot * t.num_scores + c] = 0;
}

/// Whether score word 0 `word` makes a key leave the table ("Release").
DEMB_HD bool released(const RunArgs& r, int64_t word) {
  return r.release_at != kNoRelease && word >= r.release_at;
}

/// A resident key of an evicting table, entry `i` of a run: applies the
/// policies to its score words and records word 0 in scores_out; frees the
/// slot instead when word 0 reaches release_at. Only the leader writes.
/// Returns whether the key was released.
DEMB_HD bool update_or_release(const TableRef& t, const RunArgs& r, int32_t i, int64_t slot,
                               bool lead) {
  const int32_t ns = t.num_scores;
  int64_t* s = t.scores + slot * ns;
  int64_t next[kMaxScores] = {};
  for (int32_t c = 0; c < kMaxScores; ++c) next[c] = c < ns ? s[c] : 0;
  update_score(r.score, i, ns, next, /*atomic=*/false);
  const bool release = released(r, next[0]);
  if (lead) {
    if (r.scores_out) r.scores_out[i] = next[0];
    if (release) {
      clear_slot(t, slot);
    } else {
      for (int32_t c = 0; c < kMaxScores; ++c) {
        if (c < ns) s[c] = next[c];
      }
    }
  }
  return release;
}

/// Whether new key `i` would enter with score words below those of `slot`
/// ("Refusal"; compared as score_less compares, word by word, without an
/// array that would take local memory in the tile kernels).
DEMB_HD bool colder_than(const TableRef& t, const ScoreArgs& a, int32_t i, int64_t slot) {
  const int64_t* s = t.scores + slot * t.num_scores;
  for (int32_t c = 0; c < t.num_scores; ++c) {
    const int64_t w = initial_score(a, i, c);
    if (w != s[c]) return w < s[c];
  }
  return false;
}

/// Counter changes of one run, added to the table's counters by the caller.
struct RunDeltas {
  int64_t size = 0, failures = 0, evictions = 0, inserts = 0;
};

// ------------------------------------------------------- in-place sorting --

/// Restores the max-heap a[0, n) below position i (less: strict order).
template <class Less>
DEMB_HD void sift_down(int64_t* a, int64_t n, int64_t i, const Less& less) {
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && less(a[c], a[c + 1])) ++c;
    if (!less(a[i], a[c])) return;
    const int64_t x = a[i];
    a[i] = a[c];
    a[c] = x;
    i = c;
  }
}

/// Sorts the max-heap a[0, n) ascending.
template <class Less>
DEMB_HD void sort_heap(int64_t* a, int64_t n, const Less& less) {
  for (int64_t e = n - 1; e > 0; --e) {
    const int64_t x = a[0];
    a[0] = a[e];
    a[e] = x;
    sift_down(a, e, 0, less);
  }
}

/// Sorts a[0, n) ascending in place (heapsort: O(n log n), no allocation).
template <class Less>
DEMB_HD void heap_sort(int64_t* a, int64_t n, const Less& less) {
  for (int64_t i = n / 2 - 1; i >= 0; --i) sift_down(a, n, i, less);
  sort_heap(a, n, less);
}

// --------------------------------------------------------------- victims --

/// The victim order of the untouched slots of a full bucket: smallest (victim
/// score, score words, position) first (scores.h).
struct VictimLess {
  const TableRef* t;
  const RunArgs* r;
  DEMB_HD bool operator()(int64_t a, int64_t b) const {
    int64_t wa[kVictimWords], wb[kVictimWords];
    victim_words(*t, *r, a, wa);
    victim_words(*t, *r, b, wb);
    return victim_before(wa, a, wb, b);
  }
};

/// The `limit` first victims of a full bucket, in victim order: its slots not
/// in `touched` (ascending slots the run holds, `num_touched` of them) nor
/// held (r.held_slots), selected with a max-heap of `limit` entries. Writes
/// them to out[0, count) and returns count. O(width log limit), whatever the
/// run's length.
DEMB_HD int64_t select_victims(const TableRef& t, const RunArgs& r, const Home& h,
                               const int64_t* touched, int64_t num_touched, int64_t limit,
                               int64_t* out) {
  const VictimLess less{&t, &r};
  int64_t size = 0, next_touched = 0;
  for (int64_t slot = h.start; slot < h.start + h.width; ++slot) {
    if (next_touched < num_touched && touched[next_touched] == slot) {
      ++next_touched;
      continue;
    }
    if (r.held_slots && r.held_slots[slot]) continue;  // "Held slots"
    if (size < limit) {
      // push: sift the new entry up
      int64_t i = size++;
      out[i] = slot;
      while (i > 0 && less(out[(i - 1) / 2], out[i])) {
        const int64_t p = (i - 1) / 2, x = out[p];
        out[p] = out[i];
        out[i] = x;
        i = p;
      }
    } else if (size > 0 && less(slot, out[0])) {  // replace the largest
      out[0] = slot;
      sift_down(out, size, 0, less);
    }
  }
  sort_heap(out, size, less);
  return size;
}

// ----------------------------------------------------------------- probes --

/// The sequential way of probing a bucket, used by the CPU backend. The CUDA
/// backend passes a tile-parallel one with the same answers (tile_probe.cuh);
/// both run the one definition of a run below.
struct SequentialProbe {
  /// Position of `key` at or after position `from` (a multiple of 8), or -1.
  DEMB_HD int64_t find(const TableRef& t, const Home& h, int64_t key, uint8_t digest,
                       int64_t from) const {
    return probe(t, h, key, digest, from);
  }
  DEMB_HD bool leader() const { return true; }  ///< whether this thread writes
  DEMB_HD void sync() const {}                  ///< orders writes before the next read
};

/// Prefind: the slot of each valid batch entry whose key is in the table when
/// the call starts, -1 otherwise. Read-only, so every key can be looked up in
/// parallel before the runs (r.slots[i], the input of run_keys).
DEMB_HD int64_t resident_slot(const TableRef& t, int64_t key, int64_t table) {
  return valid_input(t, key, table) ? find_slot(t, table, key) : -1;
}

/// place for the key at batch index i (sorted position p), whose home bucket
/// is h and which sits at position `pos` of it (-1: absent): see "Place"
/// above. Returns `d` with the key's counter changes added. Run by the
/// writing thread only.
DEMB_HD RunDeltas place_key(const TableRef& t, const RunArgs& r, const Home& h, int32_t i,
                            int64_t p, int64_t key, uint8_t digest, int64_t pos, bool no_evict,
                            RunDeltas d) {
  const int32_t ns = t.num_scores;
  const int64_t slot = r.targets[i];
  const int64_t table = r.table_ids[i];
  const int64_t* inf = t.info + table * kInfoCols;
  if (slot < h.start || slot >= h.start + h.width ||
      (no_evict && (!r.assign_rows || !assigned_row_valid(r.score, i, inf)))) {
    r.slots[i] = -1;
    r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
    return d;
  }
  if (pos >= 0 && h.start + pos != slot) {  // the key moves within its bucket
    clear_slot(t, h.start + pos);
    --d.size;
  }
  const int64_t occupant = t.keys[slot];
  InsertStatus st = InsertStatus::kFound;
  if (occupant == kEmptyKey) {
    st = InsertStatus::kInserted;
    ++d.size;
    ++d.inserts;
  } else if (occupant != key) {
    st = InsertStatus::kEvicted;
    r.ev_keys[p] = occupant;
    for (int32_t c = 0; c < ns; ++c) r.ev_scores[p * ns + c] = t.scores[slot * ns + c];
    r.ev_slots[p] = slot;
    r.ev_tables[p] = table;
    r.ev_flags[p] = 1;
    ++d.evictions;
    ++d.inserts;
  }
  t.keys[slot] = key;
  t.digests[slot] = digest;
  for (int32_t c = 0; c < ns; ++c) {
    t.scores[slot * ns + c] =
        no_evict ? (c == 0 ? score_input(r.score, i, 0) : 0) : initial_score(r.score, i, c);
  }
  r.slots[i] = slot;
  r.status[i] = static_cast<int8_t>(st);
  return d;
}

// ------------------------------------------------------------------- runs --
//
// run_keys processes the keys at sorted positions [begin, end) of a run (one
// bucket), given r.slots[i] = resident_slot(...) of each of them:
//
//  1. Keys already in the table (r.slots[i] >= 0), in batch order: kFound, the
//     policies applied to their scores (erase: removed, each key once).
//  2. The other keys, in batch order: a repeat of a key placed earlier in the
//     run finds it (kFound); a new key takes the bucket's first empty position,
//     or, in a full bucket (insert_and_evict, evicting table), the next victim:
//     the untouched slots (neither found in 1 nor filled in 2) in victim order.
//     Untouched slots do not change during the run, so the victims are selected
//     once, when the first is needed (select_victims), and taken in order.
//
// Victim hints (r.victim_hint): a backend may compute, before the runs, the
// victims of a run whose bucket is full when the call starts, of an evicting
// table in insert_and_evict: with m of the run's keys absent then (by the
// prefind), select_victims(limit m) with touched = the slots the run's other
// keys were found at, at the run's positions [begin, begin + m), -1 after
// the last. When phase 1 releases none of the run's keys, the bucket is
// exactly as the hint saw it when the first new key's turn comes (only this
// run writes to it, and only to touched slots), the run's new keys are those
// m and stay in a full bucket, so the run takes the hints instead of probing
// for an empty slot and selecting its victims. The CUDA backend's earlier
// kernel (DEMB_CUDA_RUN_LANES=1) computes hints with a warp per run, reading
// the bucket coalesced; its tiles (tile_run.h) need none.
//
// Cost: O(run log run) for the repeats, O(width log run) for the victims,
// O(width / 8) for the empty positions: never the run's length times the
// bucket's width, so one bucket spanning a table scales.
//
// Scratch: the run's positions [begin, end) of r.ev_keys, r.ev_slots,
// r.ev_tables and r.ev_scores (by position, n entries each) hold, until the
// records overwrite them, the run's new keys sorted by key (ev_keys), the
// previous occurrence of each new key (ev_tables), the touched slots (ev_keys)
// and the victims (ev_slots). The j-th eviction of a run writes its record at
// position begin + j, never past the key being processed, so no scratch entry
// is overwritten before its last use.

/// Processes the run [begin, end); returns its counter changes. `P` probes
/// (see SequentialProbe); only its leader writes.
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

  // Place: each key in batch order, probed when its turn comes.
  if (r.op == RunOp::kPlace) {
    for (int64_t p = begin; p < end; ++p) {
      const int32_t i = r.order[p];
      const int64_t key = r.keys[i];
      const uint8_t digest = digest_of_hash(bucket_hash(static_cast<uint64_t>(key)));
      const int64_t pos = pr.find(t, h, key, digest, 0);
      if (lead) {
        if (r.row_work) r.row_work[i] = -1;
        d = place_key(t, r, h, i, p, key, digest, pos, no_evict, d);
      }
      pr.sync();
    }
    return d;
  }

  // 1. Keys in the table when the call starts (the leader decides and
  // writes; the other lanes learn the outcome from slots and status).
  for (int64_t p = begin; p < end; ++p) {
    const int32_t i = r.order[p];
    const int64_t slot = r.slots[i];
    if (lead) {
      if (r.row_work) r.row_work[i] = -1;
      if (r.op == RunOp::kErase) {
        // A repeat finds the slot emptied by its first occurrence.
        if (slot < 0 || t.keys[slot] != r.keys[i]) {
          result(i, -1, InsertStatus::kFailed);
        } else {
          if (no_evict && r.row_work) r.row_work[i] = t.scores[slot * ns];
          clear_slot(t, slot);
          result(i, slot, InsertStatus::kFound);
          --d.size;
        }
      } else if (slot >= 0 && t.keys[slot] == r.keys[i]) {
        if (!no_evict && update_or_release(t, r, i, slot, lead)) {
          result(i, -1, InsertStatus::kReleased);
          --d.size;
        } else {
          result(i, slot, InsertStatus::kFound);
        }
      } else {  // new, or a repeat of a key released above: taken in 2
        result(i, -1, InsertStatus::kInserted);
      }
    }
    pr.sync();
  }
  if (r.op == RunOp::kErase) return d;
  // An entry is new when 1 left it at slot -1 without releasing it.
  const auto is_new = [&](int32_t i) {
    return r.slots[i] < 0 && r.status[i] != static_cast<int8_t>(InsertStatus::kReleased);
  };
  int64_t num_new = 0;
  bool released_any = false;
  for (int64_t p = begin; p < end; ++p) {
    num_new += is_new(r.order[p]) ? 1 : 0;
    released_any |= r.status[r.order[p]] == static_cast<int8_t>(InsertStatus::kReleased);
  }
  if (num_new == 0) return d;
  // Victims computed before the runs, where they are exact (above).
  const bool hinted = r.victim_hint && !released_any && r.victim_hint[begin] >= 0;

  // Repeats among the new keys: ev_tables[p] = the previous position of p's
  // key, or -1, from the new keys' positions sorted by (key, position).
  int64_t* sorted = r.ev_keys + begin;
  int64_t* prev = r.ev_tables;
  if (num_new > 1) {
    if (lead) {
      int64_t k = 0;
      for (int64_t p = begin; p < end; ++p) {
        if (is_new(r.order[p])) sorted[k++] = p;
      }
      const auto by_key = [&](int64_t a, int64_t b) {
        const int64_t ka = r.keys[r.order[a]], kb = r.keys[r.order[b]];
        return ka != kb ? ka < kb : a < b;
      };
      heap_sort(sorted, num_new, by_key);
      prev[sorted[0]] = -1;
      for (int64_t q = 1; q < num_new; ++q) {
        const bool same = r.keys[r.order[sorted[q]]] == r.keys[r.order[sorted[q - 1]]];
        prev[sorted[q]] = same ? sorted[q - 1] : -1;
      }
    }
    pr.sync();
  }

  // 2. The new keys.
  int64_t cursor = 0;        // no empty position below it
  bool full = false;         // no empty position left
  int64_t num_victims = -1;  // victims selected (-1: not yet)
  int64_t taken = 0;         // victims taken
  for (int64_t p = begin; p < end; ++p) {
    const int32_t i = r.order[p];
    if (!is_new(i)) continue;  // found or released in 1
    if (num_new > 1 && prev[p] >= 0) {
      const int64_t slot = r.slots[r.order[prev[p]]];
      if (slot >= 0) {  // placed by an earlier occurrence
        if (lead) {
          if (!no_evict && update_or_release(t, r, i, slot, lead)) {
            result(i, -1, InsertStatus::kReleased);
            --d.size;
          } else {
            result(i, slot, InsertStatus::kFound);
          }
        }
        pr.sync();
        if (r.status[i] == static_cast<int8_t>(InsertStatus::kReleased)) {
          // The slot is empty again: the next new key may take it.
          const int64_t pos = slot - h.start;
          cursor = pos - pos % 8 < cursor ? pos - pos % 8 : cursor;
          full = false;
        }
        continue;
      }
    }
    if (no_evict && r.assign_rows && !assigned_row_valid(r.score, i, inf)) {
      result(i, -1, InsertStatus::kInvalid);
      pr.sync();
      continue;
    }
    if (!no_evict) {  // a new key whose first score word reaches release_at stays out
      const int64_t word = initial_score(r.score, i, 0);
      if (lead && r.scores_out) r.scores_out[i] = word;
      if (released(r, word)) {
        result(i, -1, InsertStatus::kReleased);
        pr.sync();
        continue;
      }
    }
    const int64_t key = r.keys[i];
    int64_t target = full || hinted ? -1 : pr.find(t, h, kEmptyKey, empty_dg, cursor);
    full = target < 0;
    InsertStatus st = InsertStatus::kInserted;
    if (target >= 0) {
      cursor = target - target % 8;
      ++d.size;
    } else if (r.op == RunOp::kInsertEvict && !no_evict) {
      if (num_victims < 0 && hinted) {
        num_victims = 0;
        while (num_victims < num_new && r.victim_hint[begin + num_victims] >= 0) ++num_victims;
      } else if (num_victims < 0) {
        // The bucket is full. Touched: every slot the run holds (found in 1
        // or filled in 2); at most the run's remaining keys are evicted.
        int64_t* touched = r.ev_keys + begin;
        int64_t* victims = r.ev_slots + begin;
        if (lead) {
          int64_t nt = 0, limit = 0;
          for (int64_t q = begin; q < end; ++q) {
            const int64_t s = r.slots[r.order[q]];
            if (s >= 0) {
              touched[nt++] = s;
            } else if (q >= p) {
              ++limit;
            }
          }
          heap_sort(touched, nt, [](int64_t a, int64_t b) { return a < b; });
          int64_t u = 0;  // a repeat found a slot twice: keep each once
          for (int64_t q = 0; q < nt; ++q) {
            if (q == 0 || touched[q] != touched[q - 1]) touched[u++] = touched[q];
          }
          r.ev_scores[begin * ns] = select_victims(t, r, h, touched, u, limit, victims);
        }
        pr.sync();
        num_victims = r.ev_scores[begin * ns];
        pr.sync();  // every lane has read the count before a record overwrites it
      }
      if (taken < num_victims) {
        const int64_t vslot = hinted ? r.victim_hint[begin + taken] : r.ev_slots[begin + taken];
        if (r.refuse_cold && colder_than(t, r.score, i, vslot)) {  // "Refusal"
          result(i, -1, InsertStatus::kRefused);
          pr.sync();
          continue;
        }
        target = vslot - h.start;
        const int64_t at = begin + taken++;  // the record of the run's taken-th eviction
        if (lead) {
          r.ev_keys[at] = t.keys[vslot];
          for (int32_t c = 0; c < ns; ++c) r.ev_scores[at * ns + c] = t.scores[vslot * ns + c];
          r.ev_slots[at] = vslot;
          r.ev_tables[at] = table;
          r.ev_flags[at] = 1;
        }
        st = InsertStatus::kEvicted;
        ++d.evictions;
      }
    }
    if (target < 0) {
      result(i, -1, InsertStatus::kFailed);
      ++d.failures;
      pr.sync();
      continue;
    }
    const int64_t slot = h.start + target;
    if (lead) {
      t.keys[slot] = key;
      t.digests[slot] = digest_of_hash(bucket_hash(static_cast<uint64_t>(key)));
      if (no_evict) {
        if (r.assign_rows) {
          t.scores[slot * ns] = score_input(r.score, i, 0);
        } else {
          t.scores[slot * ns] = -1;  // handed out by the row pass
          if (r.row_work) r.row_work[i] = 1;
        }
        for (int32_t c = 1; c < ns; ++c) t.scores[slot * ns + c] = 0;
      } else {
        for (int32_t c = 0; c < ns; ++c) t.scores[slot * ns + c] = initial_score(r.score, i, c);
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
