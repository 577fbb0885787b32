// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table: one semantic definition for the CPU and CUDA backends.
//
// IMPLEMENTATION DETAILS
// ======================
//
// # Layout
//
// Many logical tables share one allocation. For table t (a row of `info`):
//
//   struct FusedTable {
//     int64_t keys[num_slots];              // kEmptyKey where free
//     uint8_t digests[num_slots];           // digest(hash(key)); empty_digest() where free
//     int64_t scores[num_slots][num_scores];
//   };
//   table t owns slots [info[t].slot_offset, info[t].slot_offset + info[t].capacity)
//   bucket b of table t is slots slot_offset + b * W .. + W - 1, W = info[t].bucket_capacity
//
// Every capacity, bucket width and slot offset is a multiple of kBucketAlignment
// (16), so a bucket's digests can be read 8 bytes at a time from aligned memory.
//
// # Hashing
//
//   h = mix64(key)                          (murmur3's 64-bit finalizer)
//   home bucket = (h % capacity) / W        a key lives only in its home bucket
//   digest      = (h >> 32) & 0xff          compared before the key itself
//
// # Scores
//
// Each slot has num_scores int64 words compared lexicographically, word 0
// first, then the position in the bucket. The victim of a full bucket is the
// smallest (scores..., position). The compound TIMESTAMP+LFU strategy stores
// (frequency, timestamp), so it evicts the least frequent key, the older one on
// a tie, whatever order the user wrote the tuple in. Under NO_EVICTION word 0
// is the key's row in the value buffer, not a score.
//
// insert_and_evict may be given a float64 victim score per slot (a user's
// score_function evaluated by the layer above over the buckets the batch
// touches). The victim is then the smallest (victim score, scores...,
// position), NaN below every number (evicted first), -0.0 equal to 0.0. Only
// untouched slots of a full bucket are ever compared, and the batch changes
// none of them before it compares them, so scores evaluated before the call
// are those of eviction time.
//
// # Bulk operations are sequential per bucket
//
// insert, insert_and_evict, erase and place sort the batch by (global bucket, index)
// and process each run of keys sharing a bucket in batch order, one run at a
// time per thread. Buckets are independent, so the result is exactly that of
// processing the whole batch one key after another, whatever the thread count
// or device: the CPU and CUDA backends give identical slots, statuses,
// evictions and rows. Within one batch:
//   - a repeated key finds the slot its first occurrence took (kFound);
//   - a slot the batch has already found or filled is never a victim, so every
//     slot handed back stays valid for the rest of the step; a key whose bucket
//     holds only such slots is reported kFailed and counted, never dropped.
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

#include "cc/table/table_ref.h"
#include "cc/table/types.h"

#if defined(__CUDACC__)
#define DEMB_HD __host__ __device__ __forceinline__
#else
#define DEMB_HD inline
#endif

namespace dyn_emb {
namespace table {

// ---------------------------------------------------------------- hashing --

/// murmur3's 64-bit finalizer: a bijection that spreads every input bit.
DEMB_HD uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

DEMB_HD uint8_t digest_of_hash(uint64_t h) { return static_cast<uint8_t>(h >> 32); }

/// Digest stored in a free slot.
DEMB_HD uint8_t empty_digest() { return digest_of_hash(mix64(static_cast<uint64_t>(kEmptyKey))); }

DEMB_HD bool is_reserved_key(int64_t key) { return key < kFirstValidKey; }

DEMB_HD int ctz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

/// One bit (0x80) set in each byte of `word` that may equal `d`. A byte above
/// a true match can be flagged too; callers confirm with the key.
DEMB_HD uint64_t match_bytes(uint64_t word, uint8_t d) {
  const uint64_t x = word ^ (0x0101010101010101ULL * d);
  return (x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL;
}

DEMB_HD int64_t atomic_add_i64(int64_t* p, int64_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(
      atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v)));
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

/// The kTimer score of a call: one clock reading shared by every key, so a
/// batch's keys tie and evict in the same order on both backends.
DEMB_HD int64_t timer_now(const ScoreArgs& a) {
#if defined(__CUDA_ARCH__)
  return *a.device_now;
#else
  return a.host_now;
#endif
}

// ---------------------------------------------------------------- layout --

/// What is wrong with an `info` tensor, if anything.
enum LayoutError : int32_t {
  kLayoutOk = 0,
  kLayoutBucketWidth = 1,   ///< bucket capacity not a positive multiple of 16
  kLayoutCapacity = 2,      ///< capacity not a positive multiple of the bucket capacity
  kLayoutSlotOffset = 3,    ///< slot offset is not the sum of the capacities before it
  kLayoutBucketOffset = 4,  ///< bucket offset is not the sum of the buckets before it
  kLayoutRows = 5,          ///< row offset/capacity inconsistent, or free_rows too short
  kLayoutMode = 6,          ///< mode is not a TableMode
  kLayoutSlotCount = 7,     ///< capacities do not add up to the slot count
};

/// Checks that `info` lays the tables out back to back over exactly
/// t.num_slots slots and `free_rows_len` free-row entries. On success fills
/// the total bucket count and whether any table is NO_EVICTION; otherwise
/// returns the error and the offending table in `*bad_table`.
DEMB_HD int32_t check_layout(const TableRef& t, int64_t free_rows_len, int64_t* total_buckets,
                             bool* has_rows, int64_t* bad_table) {
  int64_t slots = 0, buckets = 0, rows = 0;
  bool any_rows = false;
  for (int64_t table = 0; table < t.num_tables; ++table) {
    const int64_t* inf = t.info + table * kInfoCols;
    *bad_table = table;
    const int64_t w = inf[kInfoBucketCapacity], cap = inf[kInfoCapacity];
    if (w <= 0 || w % kBucketAlignment) return kLayoutBucketWidth;
    if (cap <= 0 || cap % w) return kLayoutCapacity;
    if (inf[kInfoSlotOffset] != slots) return kLayoutSlotOffset;
    if (inf[kInfoBucketOffset] != buckets) return kLayoutBucketOffset;
    const int64_t mode = inf[kInfoMode];
    if (mode != static_cast<int64_t>(TableMode::kEvicting) &&
        mode != static_cast<int64_t>(TableMode::kNoEviction)) {
      return kLayoutMode;
    }
    if (inf[kInfoRowOffset] != rows || inf[kInfoRowCapacity] < 0) return kLayoutRows;
    any_rows = any_rows || mode == static_cast<int64_t>(TableMode::kNoEviction);
    slots += cap;
    buckets += cap / w;
    rows += inf[kInfoRowCapacity];
  }
  *bad_table = -1;
  if (slots != t.num_slots) return kLayoutSlotCount;
  if (rows > free_rows_len) return kLayoutRows;
  *total_buckets = buckets;
  *has_rows = any_rows;
  return kLayoutOk;
}

// ------------------------------------------------------------ addressing --

/// Where a key lives: its home bucket's first slot and width, the bucket's
/// global index (the sort key of the run-wise operations), and the key's digest
/// (keys sharing a bucket have different digests).
struct Home {
  int64_t start;
  int64_t width;
  int64_t global_bucket;
  uint8_t digest;
};

DEMB_HD Home home_of(const TableRef& t, int64_t table, int64_t key) {
  const int64_t* inf = t.info + table * kInfoCols;
  const uint64_t h = mix64(static_cast<uint64_t>(key));
  const int64_t cap = inf[kInfoCapacity];
  const int64_t width = inf[kInfoBucketCapacity];
  const int64_t local = static_cast<int64_t>(h % static_cast<uint64_t>(cap)) / width;
  return Home{inf[kInfoSlotOffset] + local * width, width, inf[kInfoBucketOffset] + local,
              digest_of_hash(h)};
}

DEMB_HD bool valid_input(const TableRef& t, int64_t key, int64_t table) {
  return !is_reserved_key(key) && table >= 0 && table < t.num_tables;
}

/// Position of `key` in the bucket, or -1. Reads the digests 8 at a time.
DEMB_HD int64_t probe(const TableRef& t, const Home& h, int64_t key, uint8_t digest) {
  const uint64_t* d = reinterpret_cast<const uint64_t*>(t.digests + h.start);
  for (int64_t w = 0; w < h.width / 8; ++w) {
    uint64_t m = match_bytes(d[w], digest);
    while (m) {
      const int64_t pos = w * 8 + (ctz64(m) >> 3);
      if (t.keys[h.start + pos] == key) return pos;
      m &= m - 1;
    }
  }
  return -1;
}

DEMB_HD int64_t find_slot(const TableRef& t, int64_t table, int64_t key) {
  const Home h = home_of(t, table, key);
  const int64_t pos = probe(t, h, key, h.digest);
  return pos < 0 ? -1 : h.start + pos;
}

// ---------------------------------------------------------------- scores --

/// Lexicographic a < b over n words.
DEMB_HD bool score_less(const int64_t* a, const int64_t* b, int32_t n) {
  for (int32_t c = 0; c < n; ++c) {
    if (a[c] != b[c]) return a[c] < b[c];
  }
  return false;
}

DEMB_HD int64_t score_input(const ScoreArgs& a, int64_t index, int32_t num_scores, int32_t c) {
  return a.values ? a.values[index * a.value_row_stride + c] : 0;
}

/// Score word c of a key entering the table.
DEMB_HD int64_t initial_score(const ScoreArgs& a, int64_t index, int32_t num_scores, int32_t c) {
  switch (static_cast<ScorePolicy>(a.policy[c])) {
    case ScorePolicy::kAssign:
    case ScorePolicy::kAccumulate:
      return score_input(a, index, num_scores, c);
    case ScorePolicy::kTimer:
      return timer_now(a);
    default:
      return 0;
  }
}

/// Applies the policies to a resident key's score words. `atomic` is set where
/// several threads may update one slot (find); run-wise operations own theirs.
DEMB_HD void update_score(const ScoreArgs& a, int64_t index, int32_t num_scores, int64_t* s,
                          bool atomic) {
  for (int32_t c = 0; c < num_scores; ++c) {
    switch (static_cast<ScorePolicy>(a.policy[c])) {
      case ScorePolicy::kAssign:
        s[c] = score_input(a, index, num_scores, c);
        break;
      case ScorePolicy::kAccumulate:
        if (atomic) {
          atomic_add_i64(&s[c], score_input(a, index, num_scores, c));
        } else {
          s[c] += score_input(a, index, num_scores, c);
        }
        break;
      case ScorePolicy::kTimer:
        s[c] = timer_now(a);
        break;
      default:
        break;
    }
  }
}

// --------------------------------------------------------------- lookups --

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

/// Order key of a victim score: ascending with the number, NaN first (it
/// maps to INT64_MIN, below -inf), -0.0 and 0.0 equal.
DEMB_HD int64_t victim_rank_key(double v) {
  if (v != v) return INT64_MIN;
  v += 0.0;  // -0.0 -> 0.0
#if defined(__CUDA_ARCH__)
  const int64_t b = __double_as_longlong(v);
#else
  int64_t b;
  __builtin_memcpy(&b, &v, sizeof(b));
#endif
  // Negative doubles order backwards as integers: flip their magnitude bits.
  return b >= 0 ? b : (b ^ INT64_MAX);
}

/// The victim order's first component of `slot`: its victim score's order
/// key, or 0 (all equal) when the call has none.
DEMB_HD int64_t victim_key(const RunArgs& r, int64_t slot) {
  return r.victim_scores ? victim_rank_key(r.victim_scores[slot]) : 0;
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
      (no_evict && (!r.assign_rows || !assigned_row_valid(r.score, i, ns, inf)))) {
    r.slots[i] = -1;
    r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
    return d;
  }
  if (pos >= 0 && h.start + pos != slot) {  // the key moves within its bucket
    const int64_t old = h.start + pos;
    t.keys[old] = kEmptyKey;
    t.digests[old] = empty_digest();
    for (int32_t c = 0; c < ns; ++c) t.scores[old * ns + c] = 0;
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
        no_evict ? (c == 0 ? score_input(r.score, i, ns, 0) : 0) : initial_score(r.score, i, ns, c);
  }
  r.slots[i] = slot;
  r.status[i] = static_cast<int8_t>(st);
  return d;
}

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
    const uint8_t digest = digest_of_hash(mix64(static_cast<uint64_t>(key)));
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

    if (r.op == RunOp::kPlace) {
      if (lead) d = place_key(t, r, h, i, p, key, digest, pos, no_evict, d);
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

// ------------------------------------------------------------------ rows --

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

// ---------------------------------------------------------------- export --

/// Table owning `slot`; tables are laid out in ascending slot order.
DEMB_HD int64_t table_of_slot(const TableRef& t, int64_t slot) {
  int64_t lo = 0, hi = t.num_tables - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (t.info[mid * kInfoCols + kInfoSlotOffset] <= slot) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// export_batch's predicate: the slot holds a key whose score word `column`
/// is at least `threshold`.
DEMB_HD bool export_selects(const TableRef& t, int64_t slot, int32_t column, int64_t threshold) {
  return t.keys[slot] != kEmptyKey && t.scores[slot * t.num_scores + column] >= threshold;
}

}  // namespace table
}  // namespace dyn_emb
