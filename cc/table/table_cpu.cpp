// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/table/table_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/row_check.h"
#include "cc/table/rows.h"

namespace dyn_emb {
namespace table {
namespace cpu {

namespace {

constexpr int64_t kGrain = 2048;

/// The slots of a run's keys that are in the table when the call starts
/// (resident_slot of each: the input of run_keys). A long run in a wide
/// bucket looks its keys up in a hash index of the bucket built for it, in
/// O(width + run) rather than O(run * width / 8) digest reads: one bucket
/// spanning a table then costs each batch a pass over the bucket, not one per
/// key. The answers are resident_slot's.
void prefind_run(const TableRef& t, const RunArgs& r, int64_t begin, int64_t end,
                 std::vector<int32_t>& index) {
  const int32_t first = r.order[begin];
  const Home h = home_of(t, r.table_ids[first], r.keys[first]);
  const int64_t m = end - begin;
  if (m < 32 || h.width < 1024 || h.width >= (int64_t{1} << 30)) {
    for (int64_t p = begin; p < end; ++p) {
      const int32_t i = r.order[p];
      r.slots[i] = resident_slot(t, r.keys[i], r.table_ids[i]);
    }
    return;
  }
  int64_t size = 1;
  while (size < 2 * h.width) size <<= 1;
  const uint64_t mask = static_cast<uint64_t>(size - 1);
  index.assign(static_cast<size_t>(size), -1);
  // Low bits of the key's hash: all keys of the bucket share only its high bits.
  const auto at = [](int64_t key) { return bucket_hash(static_cast<uint64_t>(key)); };
  for (int64_t pos = 0; pos < h.width; ++pos) {
    const int64_t key = t.keys[h.start + pos];
    if (key == kEmptyKey) continue;
    uint64_t j = at(key) & mask;
    while (index[j] >= 0) j = (j + 1) & mask;
    index[j] = static_cast<int32_t>(pos);
  }
  for (int64_t p = begin; p < end; ++p) {
    const int32_t i = r.order[p];
    const int64_t key = r.keys[i];
    int64_t slot = -1;
    for (uint64_t j = at(key) & mask; index[j] >= 0; j = (j + 1) & mask) {
      if (t.keys[h.start + index[j]] == key) {
        slot = h.start + index[j];
        break;
      }
    }
    r.slots[i] = slot;
  }
}

}  // namespace

void rebuild_row_allocators(const TableRef& t) {
  std::vector<uint8_t> held(static_cast<size_t>(t.num_free_rows), 0);
  at::parallel_for(0, t.num_slots, kGrain * 8, [&](int64_t b, int64_t e) {
    for (int64_t slot = b; slot < e; ++slot) {
      const int64_t entry = held_row_entry(t, slot);
      if (entry >= 0 && entry < t.num_free_rows) held[entry] = 1;
    }
  });
  for (int64_t table = 0; table < t.num_tables; ++table) {
    const int64_t* inf = t.info + table * kInfoCols;
    if (inf[kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) continue;
    const int64_t off = inf[kInfoRowOffset];
    int64_t next = 0, num_free = 0;
    for (int64_t row = 0; row < inf[kInfoRowCapacity]; ++row) {
      if (held[off + row]) next = row + 1;
    }
    for (int64_t row = 0; row < next; ++row) num_free += !held[off + row];
    int64_t free_below = 0;
    for (int64_t row = 0; row < next; ++row) {
      if (held[off + row]) continue;
      t.free_rows[off + rebuilt_stack_position(free_below++, num_free)] = row;
    }
    t.counters[table * kCounterCols + kCounterNextRow] = next;
    t.counters[table * kCounterCols + kCounterFreeTop] = num_free;
  }
}

int64_t host_timer_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void find(const TableRef& t, const ScoreArgs& a, const int64_t* keys, const int64_t* table_ids,
          int64_t n, bool update, int64_t* slots) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) slots[i] = find_one(t, a, i, keys[i], table_ids[i], update);
  });
}

void sort_keys(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t total_buckets, int64_t* out) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t k = sort_key_of(t, keys[i], table_ids[i]);
      out[i] = k == INT64_MAX ? total_buckets : k;
    }
  });
}

void home_starts(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                 int64_t* starts) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) starts[i] = home_start_of(t, keys[i], table_ids[i]);
  });
}

void stable_order(const int64_t* sort_keys, int64_t n, int64_t total_buckets, int32_t* order) {
  // LSD radix sort of (sort key, index) on 11-bit digits; each pass is stable,
  // so equal buckets keep batch order.
  constexpr int kBits = 11;
  constexpr int64_t kRadix = int64_t{1} << kBits;
  const int bits = bits_for(total_buckets);
  std::vector<int32_t> tmp(static_cast<size_t>(n));
  int32_t* src = order;
  int32_t* dst = tmp.data();
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  std::vector<int64_t> hist(kRadix);
  for (int shift = 0; shift < bits; shift += kBits) {
    std::fill(hist.begin(), hist.end(), 0);
    for (int64_t i = 0; i < n; ++i) ++hist[(sort_keys[src[i]] >> shift) & (kRadix - 1)];
    int64_t sum = 0;
    for (int64_t d = 0; d < kRadix; ++d) {
      const int64_t c = hist[d];
      hist[d] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; ++i)
      dst[hist[(sort_keys[src[i]] >> shift) & (kRadix - 1)]++] = src[i];
    std::swap(src, dst);
  }
  if (src != order) std::copy(src, src + n, order);
}

int64_t run_op(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets,
               int64_t* scratch_keys) {
  if (n == 0) return 0;
  ScoreArgs score = r.score;
  score.host_now = host_timer_ns();
  RunArgs args = r;
  args.score = score;
  int32_t* order = const_cast<int32_t*>(r.order);

  sort_keys(t, r.keys, r.table_ids, n, total_buckets, scratch_keys);
  stable_order(scratch_keys, n, total_buckets, order);

  // Invalid entries sort last.
  int64_t valid = n;
  while (valid > 0 && scratch_keys[order[valid - 1]] == total_buckets) --valid;
  for (int64_t p = valid; p < n; ++p) {
    r.slots[order[p]] = -1;
    r.status[order[p]] = static_cast<int8_t>(InsertStatus::kInvalid);
    if (r.row_work) r.row_work[order[p]] = -1;
  }
  for (int64_t p = 0; p < n; ++p) r.ev_flags[p] = 0;

  std::vector<int64_t> heads;
  heads.reserve(static_cast<size_t>(valid) + 1);
  for (int64_t p = 0; p < valid; ++p) {
    if (p == 0 || scratch_keys[order[p]] != scratch_keys[order[p - 1]]) heads.push_back(p);
  }
  heads.push_back(valid);
  const int64_t runs = static_cast<int64_t>(heads.size()) - 1;
  at::parallel_for(0, runs, 256, [&](int64_t b, int64_t e) {
    std::vector<int32_t> index;
    for (int64_t k = b; k < e; ++k) {
      prefind_run(t, args, heads[k], heads[k + 1], index);
      process_run(t, args, heads[k], heads[k + 1]);
    }
  });

  // NO_EVICTION rows brought by the keys (assign_rows): rebuild the allocators.
  if (r.assign_rows && r.op != RunOp::kErase && t.num_free_rows > 0) rebuild_row_allocators(t);

  // NO_EVICTION rows, in batch order per table.
  if (r.row_work) {
    std::vector<int64_t> rank(static_cast<size_t>(t.num_tables), 0);
    bool undone = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t w = r.row_work[i];
      if (w < 0) continue;
      const int64_t table = r.table_ids[i];
      if (r.op == RunOp::kErase) {
        push_free_row(t, table, rank[table]++, w);
        continue;
      }
      const int64_t row = row_for_rank(t, table, rank[table]++);
      if (row < 0) {
        undone = true;
        undo_rowless_insert(t, table, r.slots[i]);
        r.slots[i] = -1;
        r.status[i] = static_cast<int8_t>(InsertStatus::kFailed);
      } else {
        t.scores[r.slots[i] * t.num_scores] = row;
      }
    }
    if (undone) {
      for (int64_t i = 0; i < n; ++i) fail_rowless_repeat(t, r, i);
    }
    for (int64_t table = 0; table < t.num_tables; ++table) {
      if (rank[table] == 0) continue;
      if (r.op == RunOp::kErase) {
        finish_row_release(t, table, rank[table]);
      } else {
        finish_row_allocation(t, table, rank[table]);
      }
    }
  }

  // Compact the eviction records, keeping sorted order.
  const int32_t ns = t.num_scores;
  int64_t w = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (!r.ev_flags[p]) continue;
    r.ev_keys[w] = r.ev_keys[p];
    r.ev_slots[w] = r.ev_slots[p];
    r.ev_tables[w] = r.ev_tables[p];
    for (int32_t c = 0; c < ns; ++c) r.ev_scores[w * ns + c] = r.ev_scores[p * ns + c];
    ++w;
  }
  for (int64_t p = w; p < n; ++p) {
    r.ev_keys[p] = kEmptyKey;
    r.ev_slots[p] = -1;
    r.ev_tables[p] = -1;
    for (int32_t c = 0; c < ns; ++c) r.ev_scores[p * ns + c] = 0;
  }
  return w;
}

int64_t export_batch(const TableRef& t, int64_t slot_begin, int64_t slot_end, int32_t column,
                     int64_t threshold, int64_t* out_keys, int64_t* out_slots, int64_t* out_tables,
                     int64_t* out_scores) {
  const int64_t n = slot_end - slot_begin;
  if (n <= 0) return 0;
  const int64_t chunk = 1 << 16;
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<int64_t> counts(static_cast<size_t>(chunks) + 1, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = slot_begin + c * chunk, hi = std::min(slot_end, lo + chunk);
      int64_t k = 0;
      for (int64_t s = lo; s < hi; ++s) k += export_selects(t, s, column, threshold);
      counts[c + 1] = k;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) counts[c + 1] += counts[c];
  const int32_t ns = t.num_scores;
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = slot_begin + c * chunk, hi = std::min(slot_end, lo + chunk);
      int64_t w = counts[c];
      for (int64_t s = lo; s < hi; ++s) {
        if (!export_selects(t, s, column, threshold)) continue;
        out_keys[w] = t.keys[s];
        out_slots[w] = s;
        out_tables[w] = table_of_slot(t, s);
        for (int32_t j = 0; j < ns; ++j) out_scores[w * ns + j] = t.scores[s * ns + j];
        ++w;
      }
    }
  });
  return counts[chunks];
}

void gather_rows(const uint8_t* values, int64_t row_bytes, const int64_t* rows, int64_t n,
                 uint8_t* out) {
  at::parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint8_t* dst = out + i * row_bytes;
      if (rows[i] < 0) {
        std::memset(dst, 0, static_cast<size_t>(row_bytes));
      } else {
        std::memcpy(dst, values + rows[i] * row_bytes, static_cast<size_t>(row_bytes));
      }
    }
  });
}

void count(const TableRef& t, int64_t* out) {
  for (int64_t table = 0; table < t.num_tables; ++table) {
    const int64_t off = t.info[table * kInfoCols + kInfoSlotOffset];
    const int64_t cap = t.info[table * kInfoCols + kInfoCapacity];
    out[table] = at::parallel_reduce(
        off, off + cap, kGrain * 8, int64_t{0},
        [&](int64_t b, int64_t e, int64_t acc) {
          for (int64_t s = b; s < e; ++s) acc += t.keys[s] != kEmptyKey;
          return acc;
        },
        [](int64_t x, int64_t y) { return x + y; });
  }
}

RowVerdict check_rows(const TableRef& t, const int64_t* keys, const int64_t* table_ids,
                      const int64_t* rows, int64_t row_stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {  // rule 1
    const int64_t e = key_error(t, keys[i], table_ids[i]);
    if (e != kRowsOk) return row_verdict(e, i, keys[i], table_ids[i], 0);
  }
  for (int64_t i = 0; i < n; ++i) {  // rule 2
    const int64_t table = table_ids[i], row = rows[i * row_stride];
    if (assigns_rows(t, table) && (row < 0 || row >= row_capacity(t, table))) {
      RowVerdict v = row_verdict(kRowOutOfRange, i, keys[i], table, row);
      v.row_capacity = row_capacity(t, table);
      return v;
    }
  }
  // Rule 3: the key holding each row entry (the highest slot's), the new
  // entry given each, and the (table, key) pairs of the new entries so far.
  std::vector<int64_t> owner(static_cast<size_t>(t.num_free_rows), kEmptyKey);
  std::vector<int64_t> given(static_cast<size_t>(t.num_free_rows), -1);
  for (int64_t slot = 0; slot < t.num_slots; ++slot) {
    const int64_t e = held_row_entry(t, slot);
    if (e >= 0) owner[e] = t.keys[slot];
  }
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t table = table_ids[i], row = rows[i * row_stride];
    if (!assigns_rows(t, table) || find_slot(t, table, keys[i]) >= 0 ||
        !seen.insert({table, keys[i]}).second) {
      continue;
    }
    const int64_t e = row_entry(t, table, row);
    if (given[e] >= 0) {
      RowVerdict v = row_verdict(kRowGivenTwice, i, keys[i], table, row);
      v.other_index = given[e];
      v.other_key = keys[given[e]];
      return v;
    }
    if (owner[e] != kEmptyKey) {
      RowVerdict v = row_verdict(kRowHeld, i, keys[i], table, row);
      v.other_key = owner[e];
      return v;
    }
    given[e] = i;
  }
  return RowVerdict{};
}

}  // namespace cpu
}  // namespace table
}  // namespace dyn_emb
