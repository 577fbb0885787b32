// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CUDA backend's run-wise operations (insert, insert_and_evict, erase):
// the slots of the keys already in the table (one tile per key), sort by home
// bucket, one tile per run (operations.h), the NO_EVICTION row pass or, with
// assign_rows, the allocators rebuilt (rows.h), then the eviction records
// compacted.
#include <cooperative_groups.h>

#include <cub/cub.cuh>
#include <cuda/std/functional>

#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/rows.h"
#include "cc/table/table_cuda.h"
#include "cc/table/table_cuda_shared.cuh"
#include "cc/table/tile_probe.cuh"
#include "cc/table/tile_run.h"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

// Sort keys of K, an unsigned type wide enough for total_buckets (32 bits
// for most tables: a third less to move in each pass of the sort).
// `wide` (when given) is set where an entry's bucket is wider than
// kTileMaxWidth: its run is not a tile's.
template <class K>
__global__ void sort_key_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids,
                                int64_t n, int64_t total_buckets, K* out, int32_t* iota,
                                const int32_t* ok, int32_t* wide) {
  const int64_t i = global_thread();
  if (i >= n) return;
  const int64_t k = *ok ? sort_key_of(t, keys[i], table_ids[i]) : INT64_MAX;
  out[i] = static_cast<K>(k == INT64_MAX ? total_buckets : k);
  iota[i] = static_cast<int32_t>(i);
  if (wide && k != INT64_MAX &&
      t.info[table_ids[i] * kInfoCols + kInfoBucketCapacity] > kTileMaxWidth) {
    *wide = 1;
  }
}

// The slot of each batch entry whose key is in the table when the call
// starts, -1 otherwise (resident_slot, operations.h): one tile per entry, in
// a grid-stride loop. With `wide`: nothing unless it is set, and only the
// entries whose bucket is wider than kTileMaxWidth (the tiles of tile_run.h
// find the others themselves).
template <int L, bool Wide>
__global__ void prefind_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                               int64_t* slots, const int32_t* ok, const int32_t* wide) {
  if (wide && !*wide) return;
  const auto g = cg::tiled_partition<L>(cg::this_thread_block());
  const int64_t tiles = gridDim.x * static_cast<int64_t>(blockDim.x) / L;
  for (int64_t i = tile_index<L>(); i < n; i += tiles) {
    const int64_t key = keys[i], table = table_ids[i];
    int64_t slot = -1;
    if (*ok && valid_input(t, key, table)) {
      const Home h = home_of(t, table, key);
      if (wide && h.width <= kTileMaxWidth) continue;
      const int64_t pos = tile_find<L, Wide>(g, t, h, key, h.digest);
      if (pos >= 0) slot = h.start + pos;
    }
    if (g.thread_rank() == 0) slots[i] = slot;
  }
}

// Longest run given victim hints (longer runs select their victims), and
// the widest bucket: at most kHintSlots slots per lane of a warp.
constexpr int64_t kHintRun = 8;
constexpr int kHintSlots = 8;

// Whether run slot `a` goes before `b` in the victim order, given the score
// word of each when the call has one word and no victim scores (`fast`),
// else by VictimLess.
__device__ __forceinline__ bool hint_before(const VictimLess& less, bool fast, int64_t a,
                                            int64_t wa, int64_t b, int64_t wb) {
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  return fast ? (wa != wb ? wa < wb : a < b) : less(a, b);
}

// The victim hints of insert_and_evict (operations.h, "Victim hints"). A
// thread per sorted position finds the runs that qualify (a run start of an
// evicting table at least 7/8 full, at most kHintRun keys, some absent): -1
// at the others' first positions. Then the warp takes its qualifying runs one
// after another: it reads the bucket's digests (any empty slot: -1), then its
// score words once, coalesced, and reduces each victim across the warp.
// Runs after the prefind (r.slots).
template <class K>
__global__ void victim_hint_kernel(TableRef t, RunArgs r, const K* sorted_keys, int64_t n,
                                   int64_t total_buckets, int64_t* hint, const int32_t* ok) {
  const auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int64_t p = global_thread();
  bool qualifies = false;
  if (p < n && *ok) {
    const int64_t k = static_cast<int64_t>(sorted_keys[p]);
    if (k != total_buckets && (p == 0 || static_cast<int64_t>(sorted_keys[p - 1]) != k)) {
      const int64_t table = r.table_ids[r.order[p]];
      const int64_t* inf = t.info + table * kInfoCols;
      int64_t end = p + 1;
      while (end < n && end - p <= kHintRun && static_cast<int64_t>(sorted_keys[end]) == k) ++end;
      if (inf[kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction) && end - p <= kHintRun &&
          inf[kInfoBucketCapacity] <= 32 * kHintSlots &&
          t.counters[table * kCounterCols + kCounterSize] * 8 >= inf[kInfoCapacity] * 7) {
        for (int64_t q = p; q < end && !qualifies; ++q) qualifies = r.slots[r.order[q]] < 0;
      }
      if (!qualifies) hint[p] = -1;
    }
  }
  const bool fast = t.num_scores == 1 && !r.victim_scores;
  const VictimLess less{&t, &r};
  const uint8_t empty_dg = empty_digest();
  const int lane = static_cast<int>(warp.thread_rank());
  for (unsigned pending = warp.ballot(qualifies); pending; pending &= pending - 1) {
    const int64_t rp = warp.shfl(p, __ffs(pending) - 1);  // the run's first position
    const int32_t first = r.order[rp];
    const K key = sorted_keys[rp];
    const Home h = home_of(t, r.table_ids[first], r.keys[first]);
    bool has_empty = false;
    for (int64_t s = lane; s < h.width; s += 32) {
      has_empty |= t.digests[h.start + s] == empty_dg && t.keys[h.start + s] == kEmptyKey;
    }
    if (warp.any(has_empty)) {
      if (lane == 0) hint[rp] = -1;
      continue;
    }
    // This lane's slots h.start + lane + 32 j: score words, and which the
    // run holds (found keys) or has chosen.
    int64_t w[kHintSlots];
    unsigned taken = 0;
    int absent = 0;
#pragma unroll
    for (int j = 0; j < kHintSlots; ++j) {
      const int64_t s = lane + 32 * j;
      w[j] = fast && s < h.width ? t.scores[h.start + s] : 0;
      if (s >= h.width) taken |= 1u << j;
    }
    for (int64_t q = rp; q < n && q - rp < kHintRun && sorted_keys[q] == key; ++q) {
      const int64_t s = r.slots[r.order[q]];
      if (s < 0) {
        ++absent;
      } else if ((s - h.start) % 32 == lane) {
        taken |= 1u << ((s - h.start) / 32);
      }
    }
    for (int c = 0; c < absent; ++c) {
      int64_t best = -1, best_w = 0;
#pragma unroll
      for (int j = 0; j < kHintSlots; ++j) {
        const int64_t slot = h.start + lane + 32 * j;
        if (!(taken >> j & 1) && hint_before(less, fast, slot, w[j], best, best_w)) {
          best = slot;
          best_w = w[j];
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        const int64_t o = warp.shfl_down(best, off), ow = warp.shfl_down(best_w, off);
        if (hint_before(less, fast, o, ow, best, best_w)) {
          best = o;
          best_w = ow;
        }
      }
      best = warp.shfl(best, 0);
      if (lane == 0) hint[rp + c] = best;
      if (best < 0) break;  // every slot held: the run fails the rest
      if ((best - h.start) % 32 == lane) taken |= 1u << ((best - h.start) / 32);
    }
  }
}

// ------------------------------------------------- allocator rebuild --
// After an insert with assign_rows (rows.h): held[e] for each entry of
// free_rows held by a key, each NO_EVICTION table's next row (the highest
// held + 1), its free rows below it placed on the stack, lowest on top.

__global__ void mark_held_kernel(TableRef t, uint8_t* held, const int32_t* ok) {
  const int64_t slot = global_thread();
  if (slot >= t.num_slots || !*ok) return;
  const int64_t e = held_row_entry(t, slot);
  if (e >= 0 && e < t.num_free_rows) held[e] = 1;
}

__global__ void next_row_kernel(TableRef t, const uint8_t* held, long long* next,
                                const int32_t* ok) {
  const int64_t e = global_thread();
  if (e >= t.num_free_rows || !*ok || !held[e]) return;
  const int64_t table = table_of_row_entry(t, e);
  atomicMax(next + table,
            static_cast<long long>(e - t.info[table * kInfoCols + kInfoRowOffset] + 1));
}

__global__ void free_flags_kernel(TableRef t, const uint8_t* held, const long long* next,
                                  int64_t* flags) {
  const int64_t e = global_thread();
  if (e >= t.num_free_rows) return;
  const int64_t table = table_of_row_entry(t, e);
  const int64_t* inf = t.info + table * kInfoCols;
  flags[e] = inf[kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction) && !held[e] &&
             e - inf[kInfoRowOffset] < next[table];
}

// free_below[e]: exclusive prefix sum of flags over all entries.
__global__ void stack_kernel(TableRef t, const int64_t* flags, const int64_t* free_below,
                             const long long* next, const int32_t* ok) {
  const int64_t e = global_thread();
  if (e >= t.num_free_rows || !*ok || !flags[e]) return;
  const int64_t table = table_of_row_entry(t, e);
  const int64_t off = t.info[table * kInfoCols + kInfoRowOffset];
  const int64_t last = off + next[table] - 1;  // next >= 1: a row below it is free
  const int64_t num_free = free_below[last] + flags[last] - free_below[off];
  t.free_rows[off + rebuilt_stack_position(free_below[e] - free_below[off], num_free)] = e - off;
}

__global__ void rebuilt_counters_kernel(TableRef t, const int64_t* flags, const int64_t* free_below,
                                        const long long* next, const int32_t* ok) {
  const int64_t table = global_thread();
  if (table >= t.num_tables || !*ok) return;
  const int64_t* inf = t.info + table * kInfoCols;
  if (inf[kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) return;
  const int64_t off = inf[kInfoRowOffset], nx = next[table];
  int64_t* cnt = t.counters + table * kCounterCols;
  cnt[kCounterNextRow] = nx;
  cnt[kCounterFreeTop] =
      nx == 0 ? 0 : free_below[off + nx - 1] + flags[off + nx - 1] - free_below[off];
}

void rebuild_row_allocators(const TableRef& t, const int32_t* ok, ScratchAllocator& scratch,
                            cudaStream_t stream) {
  const int64_t m = t.num_free_rows;
  auto* held = alloc<uint8_t>(scratch, m);
  auto* next = alloc<long long>(scratch, t.num_tables);
  auto* flags = alloc<int64_t>(scratch, m);
  auto* below = alloc<int64_t>(scratch, m);
  check_cuda(cudaMemsetAsync(held, 0, static_cast<size_t>(m), stream), "memset");
  check_cuda(cudaMemsetAsync(next, 0, sizeof(long long) * t.num_tables, stream), "memset");
  mark_held_kernel<<<grid_for(t.num_slots), kBlock, 0, stream>>>(t, held, ok);
  next_row_kernel<<<grid_for(m), kBlock, 0, stream>>>(t, held, next, ok);
  free_flags_kernel<<<grid_for(m), kBlock, 0, stream>>>(t, held, next, flags);
  size_t bytes = 0;
  check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, flags, below, m, stream), "scan (size)");
  void* tmp = scratch.allocate(bytes);
  check_cuda(cub::DeviceScan::ExclusiveSum(tmp, bytes, flags, below, m, stream), "scan");
  stack_kernel<<<grid_for(m), kBlock, 0, stream>>>(t, flags, below, next, ok);
  rebuilt_counters_kernel<<<grid_for(t.num_tables), kBlock, 0, stream>>>(t, flags, below, next, ok);
  check_launch("rebuild row allocators");
}

// The runs one thread each (the thread at the first position of a run),
// given the prefind (r.slots), in a grid-stride loop: every run and the
// invalid entries, or with `wide` only the runs whose bucket is wider than
// kTileMaxWidth (nothing unless it is set). Held to three blocks of kBlock
// per SM (80 registers, no spills): the victim paths would otherwise take the
// register count, and the occupancy every run needs, down to two.
__global__ void __launch_bounds__(kBlock, 3)
    run_kernel(TableRef t, RunArgs r, SortedKeys sk, int64_t n, int64_t total_buckets,
               const int32_t* wide) {
  if (wide && !*wide) return;
  __shared__ BlockCounters counters;
  const int64_t p0 = blockIdx.x * static_cast<int64_t>(blockDim.x);
  counters.start([&] { return p0 < n && sk[p0] != total_buckets ? r.table_ids[r.order[p0]] : -1; });
  const int64_t threads = gridDim.x * static_cast<int64_t>(blockDim.x);
  for (int64_t p = global_thread(); p < n; p += threads) {
    const int64_t k = sk[p];
    if (k == total_buckets) {
      if (wide) continue;
      const int32_t i = r.order[p];
      r.slots[i] = -1;
      r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
      if (r.row_work) r.row_work[i] = -1;
    } else if (p == 0 || sk[p - 1] != k) {
      const int32_t first = r.order[p];
      const int64_t table = r.table_ids[first];
      if (wide && t.info[table * kInfoCols + kInfoBucketCapacity] <= kTileMaxWidth) continue;
      int64_t end = p + 1;
      while (end < n && sk[end] == k) ++end;
      counters.add(t, table, run_keys(t, r, p, end, SequentialProbe{}));
    }
  }
  counters.finish(t);
}

// Segment key of a batch index for the row pass: its table, or num_tables for
// entries that take no part (invalid input).
__global__ void row_keys_kernel(TableRef t, RunArgs r, int64_t n, int64_t* seg, int32_t* iota) {
  const int64_t i = global_thread();
  if (i >= n) return;
  seg[i] =
      r.status[i] == static_cast<int8_t>(InsertStatus::kInvalid) ? t.num_tables : r.table_ids[i];
  iota[i] = static_cast<int32_t>(i);
}

// flags[q] for the q-th entry of the (table, index) order.
__global__ void row_flags_kernel(RunArgs r, int64_t n, const int32_t* idx, int64_t* flags) {
  const int64_t q = global_thread();
  if (q < n) flags[q] = r.row_work[idx[q]] >= 0 ? 1 : 0;
}

// Entries are in (table, index) order; the last entry of a table's segment
// records how many of its entries take part (no atomics on one address).
__global__ void row_assign_kernel(TableRef t, RunArgs r, int64_t n, const int32_t* idx,
                                  const int64_t* seg_sorted, const int64_t* flags,
                                  const int64_t* rank, int64_t* per_table) {
  const int64_t q = global_thread();
  if (q >= n) return;
  const int64_t seg = seg_sorted[q];
  if (seg < t.num_tables && (q + 1 == n || seg_sorted[q + 1] != seg)) {
    per_table[seg] = rank[q] + flags[q];
  }
  const int32_t i = idx[q];
  const int64_t w = r.row_work[i];
  if (w < 0) return;
  const int64_t table = r.table_ids[i];
  if (r.op == RunOp::kErase) {
    push_free_row(t, table, rank[q], w);
    return;
  }
  const int64_t row = row_for_rank(t, table, rank[q]);
  if (row < 0) {
    undo_rowless_insert(t, table, r.slots[i]);
    r.slots[i] = -1;
    r.status[i] = static_cast<int8_t>(InsertStatus::kFailed);
  } else {
    t.scores[r.slots[i] * t.num_scores] = row;
  }
}

__global__ void rowless_repeat_kernel(TableRef t, RunArgs r, int64_t n) {
  const int64_t i = global_thread();
  if (i < n) fail_rowless_repeat(t, r, i);
}

__global__ void row_finish_kernel(TableRef t, RunOp op, const int64_t* per_table) {
  const int64_t table = global_thread();
  if (table >= t.num_tables || per_table[table] == 0) return;
  if (op == RunOp::kErase) {
    finish_row_release(t, table, per_table[table]);
  } else {
    finish_row_allocation(t, table, per_table[table]);
  }
}

// Moves the selected eviction records to the front of the outputs.
__global__ void evict_gather_kernel(const int64_t* sel, const int64_t* count, int64_t n, int32_t ns,
                                    const int64_t* keys, const int64_t* scores,
                                    const int64_t* slots, const int64_t* tables, int64_t* o_keys,
                                    int64_t* o_scores, int64_t* o_slots, int64_t* o_tables) {
  const int64_t j = global_thread();
  if (j >= n) return;
  if (j < *count) {
    const int64_t p = sel[j];
    o_keys[j] = keys[p];
    o_slots[j] = slots[p];
    o_tables[j] = tables[p];
    for (int32_t c = 0; c < ns; ++c) o_scores[j * ns + c] = scores[p * ns + c];
  } else {
    o_keys[j] = kEmptyKey;
    o_slots[j] = -1;
    o_tables[j] = -1;
    for (int32_t c = 0; c < ns; ++c) o_scores[j * ns + c] = 0;
  }
}

}  // namespace

// The batch's positions in `order`, sorted by home bucket (invalid entries,
// key total_buckets, last; `iota` the positions before); returns the sorted
// keys, of K. `wide`: see sort_key_kernel.
template <class K>
const K* sort_by_bucket(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets,
                        int end_bit, const int32_t* ok, int32_t* iota, int32_t* order,
                        int32_t* wide, ScratchAllocator& scratch, cudaStream_t stream) {
  K* keys_in = alloc<K>(scratch, n);
  K* keys_sorted = alloc<K>(scratch, n);
  sort_key_kernel<K><<<grid_for(n), kBlock, 0, stream>>>(t, r.keys, r.table_ids, n, total_buckets,
                                                         keys_in, iota, ok, wide);
  check_launch("sort keys");
  size_t bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_sorted, iota, order, n,
                                             0, end_bit, stream),
             "sort (size)");
  void* tmp = scratch.allocate(bytes);
  check_cuda(cub::DeviceRadixSort::SortPairs(tmp, bytes, keys_in, keys_sorted, iota, order, n, 0,
                                             end_bit, stream),
             "sort");
  return keys_sorted;
}

void run_op(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets, bool has_rows,
            int64_t* num_evicted, ScratchAllocator& scratch, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(num_evicted, 0, sizeof(int64_t), stream), "memset");
  if (n == 0) return;
  const int32_t ns = t.num_scores;
  int32_t* order = const_cast<int32_t*>(r.order);

  const int32_t* ok = layout_ok(t, has_rows ? t.num_free_rows : INT64_MAX, total_buckets, has_rows,
                                scratch, stream);
  // insert and insert_and_evict run by tiles (tile_run.h) where the runs are
  // long enough to share a tile's lanes, else a thread per run (tile_lanes).
  // The tiles find the resident keys of their runs themselves; the prefind
  // looks up the others.
  const int lanes = tile_lanes(t, n, total_buckets);
  const bool tiles = lanes > 1 && (r.op == RunOp::kInsert || r.op == RunOp::kInsertEvict);
  int32_t* wide = nullptr;
  if (tiles) {
    wide = alloc<int32_t>(scratch, 1);
    check_cuda(cudaMemsetAsync(wide, 0, sizeof(int32_t), stream), "memset");
  } else {
    // The slots of the keys in the table when the call starts (read-only: one
    // tile per key, before the runs).
    with_find_lanes(t, [&](auto lanes_c, auto wide_c) {
      constexpr int L = decltype(lanes_c)::value;
      prefind_kernel<L, decltype(wide_c)::value><<<tile_grid_for<L>(n), kBlock, 0, stream>>>(
          t, r.keys, r.table_ids, n, r.slots, ok, nullptr);
    });
    check_launch("prefind");
  }

  // The runs write eviction records (and keep their scratch) by position.
  const bool records = r.ev_keys != nullptr;
  RunArgs w = r;
  w.score = with_timer(r.score, ns, scratch, stream);
  w.ev_keys = alloc<int64_t>(scratch, n);
  w.ev_scores = alloc<int64_t>(scratch, n * ns);
  w.ev_slots = alloc<int64_t>(scratch, n);
  w.ev_tables = alloc<int64_t>(scratch, n);
  w.ev_flags = alloc<uint8_t>(scratch, n);
  if (records) check_cuda(cudaMemsetAsync(w.ev_flags, 0, static_cast<size_t>(n), stream), "memset");
  if (!has_rows)
    w.row_work = nullptr;
  else if (!w.row_work)
    w.row_work = alloc<int64_t>(scratch, n);

  // Sorted by home bucket, then the runs on sort keys of K: by tiles, then
  // the runs of buckets too wide for a tile (given their prefind), or with
  // the victim hints (after the prefind: they read r.slots) one thread per run.
  int32_t* iota = alloc<int32_t>(scratch, n);
  const int end_bit = bits_for(total_buckets);
  auto sorted_runs = [&](auto key_type) {
    using K = decltype(key_type);
    const K* sorted =
        sort_by_bucket<K>(t, r, n, total_buckets, end_bit, ok, iota, order, wide, scratch, stream);
    const SortedKeys sk{sorted, sizeof(K) == 4};
    if (tiles) {
      with_find_lanes(t, [&](auto lanes_c, auto wide_c) {
        constexpr int L = decltype(lanes_c)::value;
        prefind_kernel<L, decltype(wide_c)::value><<<grid_strided(n * L), kBlock, 0, stream>>>(
            t, r.keys, r.table_ids, n, r.slots, ok, wide);
      });
      check_launch("prefind");
      tile_runs(lanes, t, w, sk, n, total_buckets, records, stream);
      run_kernel<<<grid_strided(n), kBlock, 0, stream>>>(t, w, sk, n, total_buckets, wide);
      return;
    }
    if (r.op == RunOp::kInsertEvict && !r.held_slots) {  // the hints know no held slots
      int64_t* hint = alloc<int64_t>(scratch, n);
      victim_hint_kernel<K>
          <<<grid_for(n), kBlock, 0, stream>>>(t, r, sorted, n, total_buckets, hint, ok);
      check_launch("victim hints");
      w.victim_hint = hint;
    }
    run_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, sk, n, total_buckets, nullptr);
  };
  // 32-bit keys when every bucket and the invalid key (total_buckets) fit; a
  // negative total_buckets (a layout `ok` refuses) keeps the 64-bit keys, in
  // which it reads back as itself.
  if (total_buckets >= 0 && end_bit <= 32) {
    sorted_runs(uint32_t{});
  } else {
    sorted_runs(static_cast<unsigned long long>(0));
  }
  check_launch("runs");

  if (has_rows && r.assign_rows && r.op != RunOp::kErase && t.num_free_rows > 0) {
    rebuild_row_allocators(t, ok, scratch, stream);
  }

  if (has_rows) {
    // Rows go out in batch order per table: order the indices by (table, index).
    int64_t* seg = alloc<int64_t>(scratch, n);
    int64_t* seg_sorted = alloc<int64_t>(scratch, n);
    int32_t* idx = alloc<int32_t>(scratch, n);
    int64_t* flags = alloc<int64_t>(scratch, n);
    int64_t* rank = alloc<int64_t>(scratch, n);
    int64_t* per_table = alloc<int64_t>(scratch, t.num_tables);
    check_cuda(cudaMemsetAsync(per_table, 0, sizeof(int64_t) * t.num_tables, stream), "memset");
    row_keys_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n, seg, iota);
    const int seg_bits = bits_for(t.num_tables);
    auto* sin = reinterpret_cast<unsigned long long*>(seg);
    auto* sout = reinterpret_cast<unsigned long long*>(seg_sorted);
    size_t sb = 0;
    check_cuda(
        cub::DeviceRadixSort::SortPairs(nullptr, sb, sin, sout, iota, idx, n, 0, seg_bits, stream),
        "row sort (size)");
    void* st = scratch.allocate(sb);
    check_cuda(
        cub::DeviceRadixSort::SortPairs(st, sb, sin, sout, iota, idx, n, 0, seg_bits, stream),
        "row sort");
    row_flags_kernel<<<grid_for(n), kBlock, 0, stream>>>(w, n, idx, flags);
    size_t cb = 0;
    check_cuda(cub::DeviceScan::ExclusiveSumByKey(nullptr, cb, seg_sorted, flags, rank, n,
                                                  ::cuda::std::equal_to<int64_t>(), stream),
               "scan (size)");
    void* ct = scratch.allocate(cb);
    check_cuda(cub::DeviceScan::ExclusiveSumByKey(ct, cb, seg_sorted, flags, rank, n,
                                                  ::cuda::std::equal_to<int64_t>(), stream),
               "scan");
    row_assign_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n, idx, seg_sorted, flags, rank,
                                                          per_table);
    if (r.op != RunOp::kErase) rowless_repeat_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n);
    row_finish_kernel<<<grid_for(t.num_tables), kBlock, 0, stream>>>(t, r.op, per_table);
    check_launch("rows");
  }

  if (r.ev_keys == nullptr) return;  // no records wanted (the admission counter)
  const int64_t* sel = select_flagged(w.ev_flags, n, 0, num_evicted, scratch, stream);
  evict_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(
      sel, num_evicted, n, ns, w.ev_keys, w.ev_scores, w.ev_slots, w.ev_tables, r.ev_keys,
      r.ev_scores, r.ev_slots, r.ev_tables);
  check_launch("evict gather");
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
