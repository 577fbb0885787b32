// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <cooperative_groups.h>

#include <cstdlib>
#include <cub/cub.cuh>
#include <cuda/std/functional>
#include <stdexcept>
#include <string>

#include "cc/table/table_common.h"
#include "cc/table/table_cuda.h"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

constexpr int kBlock = 256;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dynamicemb table (CUDA): ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

inline unsigned grid_for(int64_t n) {
  const int64_t g = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

template <typename T>
T* alloc(ScratchAllocator& s, int64_t n) {
  return static_cast<T*>(s.allocate(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T)));
}

namespace cg = cooperative_groups;

// 1 where info describes a consistent layout (and, when given, the bucket
// count and NO_EVICTION flag the caller passed agree with it).
__global__ void layout_kernel(TableRef t, int64_t free_rows_len, int64_t total_buckets,
                              bool has_rows, int32_t* ok) {
  int64_t buckets = 0, bad = 0;
  bool rows = false;
  const int32_t e = check_layout(t, free_rows_len, &buckets, &rows, &bad);
  *ok = e == kLayoutOk && (total_buckets < 0 || buckets == total_buckets) && (has_rows || !rows);
}

__global__ void timer_kernel(int64_t* now) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *now = static_cast<int64_t>(t);
}

// The call's one reading of the device nanosecond timer, where a policy needs it.
ScoreArgs with_timer(const ScoreArgs& a, int32_t num_scores, ScratchAllocator& scratch,
                     cudaStream_t stream) {
  ScoreArgs out = a;
  for (int32_t c = 0; c < num_scores; ++c) {
    if (a.policy[c] == static_cast<int32_t>(ScorePolicy::kTimer)) {
      auto* now = static_cast<int64_t*>(scratch.allocate(sizeof(int64_t)));
      timer_kernel<<<1, 1, 0, stream>>>(now);
      out.device_now = now;
      break;
    }
  }
  return out;
}

const int32_t* layout_ok(const TableRef& t, int64_t free_rows_len, int64_t total_buckets,
                         bool has_rows, ScratchAllocator& scratch, cudaStream_t stream) {
  auto* ok = static_cast<int32_t*>(scratch.allocate(sizeof(int32_t)));
  layout_kernel<<<1, 1, 0, stream>>>(t, free_rows_len, total_buckets, has_rows, ok);
  return ok;
}

// ------------------------------------------------------- tile probing --
//
// The kernels give each key (find) or each bucket run (insert, erase) a tile
// of L lanes (8 per key for find, 1 per run for insert by default, the fastest
// on an H200; DEMB_CUDA_FIND_LANES / DEMB_CUDA_RUN_LANES pick
// 8, 16 or 32, and 1 for runs, one thread per run, for timing variants). A
// lane reads 8 digests (one 8-byte word) per step, so with 16 lanes a
// 128-slot bucket is one coalesced 128-byte read. The answers are those of
// table_common.h's sequential functions, which the CPU backend runs:
//   tile_probe  == probe        (the only key match, or the lowest empty slot)
//   tile_victim == pick_victim  (smallest (victim score, scores, position) not touched)
// Only lane 0 writes; the tile syncs before the next key reads the bucket.

template <int L, class Tile>
__device__ int64_t tile_probe(const Tile& g, const TableRef& t, const Home& h, int64_t key,
                              uint8_t digest) {
  const int64_t lane_off = static_cast<int64_t>(g.thread_rank()) * 8;
  for (int64_t base = 0; base < h.width; base += L * 8) {
    const int64_t off = base + lane_off;
    int64_t hit = -1;
    if (off < h.width) {
      uint64_t m =
          match_bytes(*reinterpret_cast<const uint64_t*>(t.digests + h.start + off), digest);
      while (m) {
        const int64_t pos = off + (ctz64(m) >> 3);
        if (t.keys[h.start + pos] == key) {
          hit = pos;
          break;
        }
        m &= m - 1;
      }
    }
    const unsigned b = g.ballot(hit >= 0);
    if (b) return g.shfl(hit, __ffs(b) - 1);
  }
  return -1;
}

// (victim key, score 0, score 1, position) lexicographically; the victim key
// is victim_key() of table_common.h (0 for every slot without victim scores).
__device__ __forceinline__ bool lex_less(int64_t ak, int64_t a0, int64_t a1, int64_t ap, int64_t bk,
                                         int64_t b0, int64_t b1, int64_t bp) {
  if (ak != bk) return ak < bk;
  if (a0 != b0) return a0 < b0;
  if (a1 != b1) return a1 < b1;
  return ap < bp;
}

template <int L, class Tile>
__device__ int64_t tile_victim(const Tile& g, const TableRef& t, const Home& h, const RunArgs& r,
                               int64_t begin, int64_t cur) {
  const int32_t ns = t.num_scores;
  int64_t bk = INT64_MAX, b0 = INT64_MAX, b1 = INT64_MAX, bp = INT64_MAX;
  const int64_t lane_off = static_cast<int64_t>(g.thread_rank()) * 8;
  for (int64_t base = 0; base < h.width; base += L * 8) {
    for (int j = 0; j < 8; ++j) {
      const int64_t pos = base + lane_off + j;
      if (pos >= h.width) break;
      const int64_t* s = t.scores + (h.start + pos) * ns;
      const int64_t sk = victim_key(r, h.start + pos), s0 = s[0], s1 = ns > 1 ? s[1] : 0;
      if (lex_less(sk, s0, s1, pos, bk, b0, b1, bp) &&
          !touched_by_run(r, begin, cur, h.start + pos)) {
        bk = sk;
        b0 = s0;
        b1 = s1;
        bp = pos;
      }
    }
  }
  for (int o = L / 2; o > 0; o >>= 1) {
    const int64_t ok = g.shfl_xor(bk, o), o0 = g.shfl_xor(b0, o), o1 = g.shfl_xor(b1, o),
                  op = g.shfl_xor(bp, o);
    if (lex_less(ok, o0, o1, op, bk, b0, b1, bp)) {
      bk = ok;
      b0 = o0;
      b1 = o1;
      bp = op;
    }
  }
  return bp == INT64_MAX ? -1 : bp;
}

// The tile-parallel probe run_keys (table_common.h) is given on the GPU.
template <int L, class Tile>
struct TileProbe {
  const Tile& g;
  __device__ int64_t find(const TableRef& t, const Home& h, int64_t key, uint8_t digest) const {
    return tile_probe<L>(g, t, h, key, digest);
  }
  __device__ int64_t victim(const TableRef& t, const Home& h, const RunArgs& r, int64_t begin,
                            int64_t cur) const {
    return tile_victim<L>(g, t, h, r, begin, cur);
  }
  __device__ bool leader() const { return g.thread_rank() == 0; }
  __device__ void sync() const { g.sync(); }
};

template <int L>
__device__ __forceinline__ int64_t tile_index() {
  return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / L;
}

template <int L>
inline unsigned tile_grid_for(int64_t n) {
  return grid_for(n * L);
}

/// Lanes per key or run chosen by an environment variable (read once).
int lanes_from_env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  const int x = std::atoi(v);
  return (x == 1 || x == 8 || x == 16 || x == 32) ? x : fallback;
}

int find_lanes() {
  static const int lanes = lanes_from_env("DEMB_CUDA_FIND_LANES", 8);
  return lanes == 1 ? 16 : lanes;
}

int run_lanes() {
  static const int lanes = lanes_from_env("DEMB_CUDA_RUN_LANES", 1);
  return lanes;
}

template <int L>
__global__ void find_kernel(TableRef t, ScoreArgs a, const int64_t* keys, const int64_t* table_ids,
                            int64_t n, bool update, int64_t* slots, const int32_t* ok) {
  const auto g = cg::tiled_partition<L>(cg::this_thread_block());
  const int64_t i = tile_index<L>();
  if (i >= n) return;
  const int64_t key = keys[i], table = table_ids[i];
  if (!*ok || !valid_input(t, key, table)) {
    if (g.thread_rank() == 0) slots[i] = -1;
    return;
  }
  const Home h = home_of(t, table, key);
  const int64_t pos = tile_probe<L>(g, t, h, key, h.digest);
  if (g.thread_rank() != 0) return;
  const int64_t slot = pos < 0 ? -1 : h.start + pos;
  slots[i] = slot;
  if (slot >= 0 && update &&
      t.info[table * kInfoCols + kInfoMode] != static_cast<int64_t>(TableMode::kNoEviction)) {
    update_score(a, i, t.num_scores, t.scores + slot * t.num_scores, /*atomic=*/true);
  }
}

template <typename V, int L>
__global__ void find_gather_kernel(TableRef t, ScoreArgs a, const int64_t* keys,
                                   const int64_t* table_ids, int64_t n, bool update, int64_t* slots,
                                   const V* values, int64_t num_rows, int64_t vecs, V* out,
                                   const int32_t* ok) {
  const auto g = cg::tiled_partition<L>(cg::this_thread_block());
  const int64_t i = tile_index<L>();
  if (i >= n) return;
  const int64_t key = keys[i], table = table_ids[i];
  int64_t slot = -1, row = -1;
  if (*ok && valid_input(t, key, table)) {
    const Home h = home_of(t, table, key);
    const int64_t pos = tile_probe<L>(g, t, h, key, h.digest);
    if (pos >= 0) {
      slot = h.start + pos;
      const bool no_evict =
          t.info[table * kInfoCols + kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction);
      row = no_evict ? t.scores[slot * t.num_scores] : slot;
      if (row >= num_rows) row = -1;
      if (g.thread_rank() == 0 && update && !no_evict) {
        update_score(a, i, t.num_scores, t.scores + slot * t.num_scores, /*atomic=*/true);
      }
    }
  }
  if (g.thread_rank() == 0) slots[i] = slot;
  V* dst = out + i * vecs;
  if (row >= 0) {
    const V* src = values + row * vecs;
    for (int64_t v = g.thread_rank(); v < vecs; v += L) dst[v] = src[v];
  } else {
    V zero;
    memset(&zero, 0, sizeof(V));
    for (int64_t v = g.thread_rank(); v < vecs; v += L) dst[v] = zero;
  }
}

__global__ void sort_key_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids,
                                int64_t n, int64_t total_buckets, int64_t* out, int32_t* iota,
                                const int32_t* ok) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t k = *ok ? sort_key_of(t, keys[i], table_ids[i]) : INT64_MAX;
  out[i] = k == INT64_MAX ? total_buckets : k;
  iota[i] = static_cast<int32_t>(i);
}

constexpr int kCounterDeltas = 4;
__device__ __forceinline__ int delta_column(int c) {
  return c == 0   ? kCounterSize
         : c == 1 ? kCounterInsertFailures
         : c == 2 ? kCounterEvictions
                  : kCounterInserts;
}

// One tile per sorted position; the tile at the first position of a run
// processes the run. Batches are sorted by table, so a block's runs nearly
// always share one table: their counter changes are summed in shared memory
// and added with one atomic per counter per block (one global atomic per run
// on a single address would serialize the whole batch).
// Processes the run starting at p (if p starts one) with L lanes: one thread
// and the sequential probe when L == 1, else a tile.
template <int L, class Tile>
__device__ RunDeltas run_at(const Tile& g, const TableRef& t, const RunArgs& r, int64_t p,
                            int64_t end) {
  if constexpr (L == 1) {
    return run_keys(t, r, p, end, SequentialProbe{});
  } else {
    return run_keys(t, r, p, end, TileProbe<L, Tile>{g});
  }
}

template <int L>
__global__ void run_kernel(TableRef t, RunArgs r, const int64_t* sorted_keys, int64_t n,
                           int64_t total_buckets) {
  __shared__ unsigned long long block_sum[kCounterDeltas];
  __shared__ int64_t block_table;
  const auto g = cg::tiled_partition<L == 1 ? 32 : L>(cg::this_thread_block());
  const bool leader = L == 1 || g.thread_rank() == 0;
  const int64_t p = tile_index<L>();
  if (threadIdx.x == 0) {
    const int64_t p0 = (blockIdx.x * static_cast<int64_t>(blockDim.x)) / L;
    block_table = p0 < n && sorted_keys[p0] != total_buckets ? r.table_ids[r.order[p0]] : -1;
    for (int c = 0; c < kCounterDeltas; ++c) block_sum[c] = 0;
  }
  __syncthreads();
  if (p < n) {
    const int64_t k = sorted_keys[p];
    if (k == total_buckets) {
      if (leader) {
        const int32_t i = r.order[p];
        r.slots[i] = -1;
        r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
        if (r.row_work) r.row_work[i] = -1;
      }
    } else if (p == 0 || sorted_keys[p - 1] != k) {
      int64_t end = p + 1;
      while (end < n && sorted_keys[end] == k) ++end;
      const RunDeltas d = run_at<L>(g, t, r, p, end);
      const int64_t delta[kCounterDeltas] = {d.size, d.failures, d.evictions, d.inserts};
      if (leader) {
        const int64_t table = r.table_ids[r.order[p]];
        for (int c = 0; c < kCounterDeltas; ++c) {
          if (!delta[c]) continue;
          if (table == block_table) {
            atomicAdd(&block_sum[c], static_cast<unsigned long long>(delta[c]));
          } else {
            atomic_add_i64(t.counters + table * kCounterCols + delta_column(c), delta[c]);
          }
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kCounterDeltas && block_table >= 0 && block_sum[threadIdx.x]) {
    atomic_add_i64(t.counters + block_table * kCounterCols + delta_column(threadIdx.x),
                   static_cast<int64_t>(block_sum[threadIdx.x]));
  }
}

// Segment key of a batch index for the row pass: its table, or num_tables for
// entries that take no part (invalid input).
__global__ void row_keys_kernel(TableRef t, RunArgs r, int64_t n, int64_t* seg, int32_t* iota) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  seg[i] =
      r.status[i] == static_cast<int8_t>(InsertStatus::kInvalid) ? t.num_tables : r.table_ids[i];
  iota[i] = static_cast<int32_t>(i);
}

// flags[q] for the q-th entry of the (table, index) order.
__global__ void row_flags_kernel(RunArgs r, int64_t n, const int32_t* idx, int64_t* flags) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q < n) flags[q] = r.row_work[idx[q]] >= 0 ? 1 : 0;
}

// Entries are in (table, index) order; the last entry of a table's segment
// records how many of its entries take part (no atomics on one address).
__global__ void row_assign_kernel(TableRef t, RunArgs r, int64_t n, const int32_t* idx,
                                  const int64_t* seg_sorted, const int64_t* flags,
                                  const int64_t* rank, int64_t* per_table) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
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
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) fail_rowless_repeat(t, r, i);
}

__global__ void row_finish_kernel(TableRef t, RunOp op, const int64_t* per_table) {
  const int64_t table = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (table >= t.num_tables || per_table[table] == 0) return;
  if (op == RunOp::kErase) {
    finish_row_release(t, table, per_table[table]);
  } else {
    finish_row_allocation(t, table, per_table[table]);
  }
}

__global__ void iota64_kernel(int64_t* out, int64_t n, int64_t base) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = base + i;
}

// Moves the selected eviction records to the front of the outputs.
__global__ void evict_gather_kernel(const int64_t* sel, const int64_t* count, int64_t n, int32_t ns,
                                    const int64_t* keys, const int64_t* scores,
                                    const int64_t* slots, const int64_t* tables, int64_t* o_keys,
                                    int64_t* o_scores, int64_t* o_slots, int64_t* o_tables) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
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

__global__ void export_flags_kernel(TableRef t, int64_t slot_begin, int64_t n, int32_t column,
                                    int64_t threshold, uint8_t* flags, const int32_t* ok) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < n) flags[j] = *ok && export_selects(t, slot_begin + j, column, threshold) ? 1 : 0;
}

__global__ void export_gather_kernel(TableRef t, const int64_t* sel, const int64_t* count,
                                     int64_t n, int64_t* o_keys, int64_t* o_slots,
                                     int64_t* o_tables, int64_t* o_scores) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  const int32_t ns = t.num_scores;
  if (j >= *count) {
    o_keys[j] = kEmptyKey;
    o_slots[j] = -1;
    o_tables[j] = -1;
    for (int32_t c = 0; c < ns; ++c) o_scores[j * ns + c] = 0;
    return;
  }
  const int64_t s = sel[j];
  o_keys[j] = t.keys[s];
  o_slots[j] = s;
  o_tables[j] = table_of_slot(t, s);
  for (int32_t c = 0; c < ns; ++c) o_scores[j * ns + c] = t.scores[s * ns + c];
}

__global__ void home_start_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids,
                                  int64_t n, int64_t* starts, const int32_t* ok) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  starts[i] = *ok ? home_start_of(t, keys[i], table_ids[i]) : -1;
}

__global__ void count_kernel(TableRef t, int64_t table, int64_t* out, const int32_t* ok) {
  using Reduce = cub::BlockReduce<int64_t, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
  if (!*ok) return;
  const int64_t off = t.info[table * kInfoCols + kInfoSlotOffset];
  const int64_t cap = t.info[table * kInfoCols + kInfoCapacity];
  int64_t c = 0;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < cap;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    c += t.keys[off + s] != kEmptyKey;
  }
  const int64_t sum = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0 && sum) atomic_add_i64(out + table, sum);
}

// One thread per (row, vector) element: consecutive threads copy consecutive
// vectors of a row, then of the next row, so loads and stores coalesce.
template <typename V>
__global__ void gather_rows_kernel(const V* values, int64_t num_rows, int64_t vecs,
                                   const int64_t* rows, int64_t n, V* out) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= n * vecs) return;
  const int64_t i = e / vecs, v = e - i * vecs;
  const int64_t row = rows[i];
  V x;
  if (row >= 0 && row < num_rows) {
    x = values[row * vecs + v];
  } else {
    memset(&x, 0, sizeof(V));
  }
  out[e] = x;
}

template <typename V>
void launch_gather(const uint8_t* values, int64_t num_rows, int64_t row_bytes, const int64_t* rows,
                   int64_t n, uint8_t* out, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  gather_rows_kernel<V><<<grid_for(n * vecs), kBlock, 0, stream>>>(
      reinterpret_cast<const V*>(values), num_rows, vecs, rows, n, reinterpret_cast<V*>(out));
}

// Compacts the positions whose flag is set; returns the selected positions.
template <typename Flag>
int64_t* select_flagged(const Flag* flags, int64_t n, int64_t base, int64_t* count,
                        ScratchAllocator& scratch, cudaStream_t stream) {
  int64_t* pos = alloc<int64_t>(scratch, n);
  int64_t* sel = alloc<int64_t>(scratch, n);
  iota64_kernel<<<grid_for(n), kBlock, 0, stream>>>(pos, n, base);
  size_t bytes = 0;
  check(cub::DeviceSelect::Flagged(nullptr, bytes, pos, flags, sel, count, n, stream),
        "select (size)");
  void* tmp = scratch.allocate(bytes);
  check(cub::DeviceSelect::Flagged(tmp, bytes, pos, flags, sel, count, n, stream), "select");
  return sel;
}

}  // namespace

void find(const TableRef& t, const ScoreArgs& a, const int64_t* keys, const int64_t* table_ids,
          int64_t n, bool update, int64_t* slots, ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  const ScoreArgs at = update ? with_timer(a, t.num_scores, scratch, stream) : a;
  switch (find_lanes()) {
    case 8:
      find_kernel<8><<<tile_grid_for<8>(n), kBlock, 0, stream>>>(t, at, keys, table_ids, n, update,
                                                                 slots, ok);
      break;
    case 32:
      find_kernel<32><<<tile_grid_for<32>(n), kBlock, 0, stream>>>(t, at, keys, table_ids, n,
                                                                   update, slots, ok);
      break;
    default:
      find_kernel<16><<<tile_grid_for<16>(n), kBlock, 0, stream>>>(t, at, keys, table_ids, n,
                                                                   update, slots, ok);
  }
  check(cudaGetLastError(), "find");
}

void find_gather(const TableRef& t, const ScoreArgs& a, const int64_t* keys,
                 const int64_t* table_ids, int64_t n, bool update, int64_t* slots,
                 const uint8_t* values, int64_t num_rows, int64_t row_bytes, uint8_t* out,
                 ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  const ScoreArgs at = update ? with_timer(a, t.num_scores, scratch, stream) : a;
  const auto aligned = [&](size_t al) {
    return row_bytes % static_cast<int64_t>(al) == 0 &&
           reinterpret_cast<uintptr_t>(values) % al == 0 &&
           reinterpret_cast<uintptr_t>(out) % al == 0;
  };
  const int lanes = find_lanes();
  const auto launch = [&](auto tag) {
    using V = decltype(tag);
    const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
    const auto* src = reinterpret_cast<const V*>(values);
    auto* dst = reinterpret_cast<V*>(out);
    if (lanes == 8) {
      find_gather_kernel<V, 8><<<tile_grid_for<8>(n), kBlock, 0, stream>>>(
          t, at, keys, table_ids, n, update, slots, src, num_rows, vecs, dst, ok);
    } else if (lanes == 32) {
      find_gather_kernel<V, 32><<<tile_grid_for<32>(n), kBlock, 0, stream>>>(
          t, at, keys, table_ids, n, update, slots, src, num_rows, vecs, dst, ok);
    } else {
      find_gather_kernel<V, 16><<<tile_grid_for<16>(n), kBlock, 0, stream>>>(
          t, at, keys, table_ids, n, update, slots, src, num_rows, vecs, dst, ok);
    }
  };
  if (aligned(16)) {
    launch(uint4{});
  } else if (aligned(8)) {
    launch(uint2{});
  } else if (aligned(4)) {
    launch(uint32_t{});
  } else {
    launch(uint8_t{});
  }
  check(cudaGetLastError(), "find_gather");
}

void run_op(const TableRef& t, const RunArgs& r, int64_t n, int64_t total_buckets, bool has_rows,
            int64_t* num_evicted, ScratchAllocator& scratch, cudaStream_t stream) {
  check(cudaMemsetAsync(num_evicted, 0, sizeof(int64_t), stream), "memset");
  if (n == 0) return;
  const int32_t ns = t.num_scores;
  int64_t* keys_in = alloc<int64_t>(scratch, n);
  int64_t* keys_sorted = alloc<int64_t>(scratch, n);
  int32_t* iota = alloc<int32_t>(scratch, n);
  int32_t* order = const_cast<int32_t*>(r.order);

  const int32_t* ok = layout_ok(t, has_rows ? t.num_free_rows : INT64_MAX, total_buckets, has_rows,
                                scratch, stream);
  sort_key_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, r.keys, r.table_ids, n, total_buckets,
                                                      keys_in, iota, ok);
  check(cudaGetLastError(), "sort keys");
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= total_buckets) ++end_bit;
  auto* kin = reinterpret_cast<unsigned long long*>(keys_in);
  auto* kout = reinterpret_cast<unsigned long long*>(keys_sorted);
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, kin, kout, iota, order, n, 0, end_bit,
                                        stream),
        "sort (size)");
  void* tmp = scratch.allocate(bytes);
  check(cub::DeviceRadixSort::SortPairs(tmp, bytes, kin, kout, iota, order, n, 0, end_bit, stream),
        "sort");

  // The runs write eviction records by position into scratch.
  RunArgs w = r;
  w.score = with_timer(r.score, ns, scratch, stream);
  w.ev_keys = alloc<int64_t>(scratch, n);
  w.ev_scores = alloc<int64_t>(scratch, n * ns);
  w.ev_slots = alloc<int64_t>(scratch, n);
  w.ev_tables = alloc<int64_t>(scratch, n);
  w.ev_flags = alloc<uint8_t>(scratch, n);
  check(cudaMemsetAsync(w.ev_flags, 0, static_cast<size_t>(n), stream), "memset");
  if (!has_rows)
    w.row_work = nullptr;
  else if (!w.row_work)
    w.row_work = alloc<int64_t>(scratch, n);
  switch (run_lanes()) {
    case 1:
      run_kernel<1>
          <<<tile_grid_for<1>(n), kBlock, 0, stream>>>(t, w, keys_sorted, n, total_buckets);
      break;
    case 8:
      run_kernel<8>
          <<<tile_grid_for<8>(n), kBlock, 0, stream>>>(t, w, keys_sorted, n, total_buckets);
      break;
    case 32:
      run_kernel<32>
          <<<tile_grid_for<32>(n), kBlock, 0, stream>>>(t, w, keys_sorted, n, total_buckets);
      break;
    default:
      run_kernel<16>
          <<<tile_grid_for<16>(n), kBlock, 0, stream>>>(t, w, keys_sorted, n, total_buckets);
  }
  check(cudaGetLastError(), "runs");

  if (has_rows) {
    // Rows go out in batch order per table: order the indices by (table, index).
    int64_t* seg = alloc<int64_t>(scratch, n);
    int64_t* seg_sorted = alloc<int64_t>(scratch, n);
    int32_t* idx = alloc<int32_t>(scratch, n);
    int64_t* flags = alloc<int64_t>(scratch, n);
    int64_t* rank = alloc<int64_t>(scratch, n);
    int64_t* per_table = alloc<int64_t>(scratch, t.num_tables);
    check(cudaMemsetAsync(per_table, 0, sizeof(int64_t) * t.num_tables, stream), "memset");
    row_keys_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n, seg, iota);
    int seg_bits = 1;
    while ((int64_t{1} << seg_bits) <= t.num_tables) ++seg_bits;
    auto* sin = reinterpret_cast<unsigned long long*>(seg);
    auto* sout = reinterpret_cast<unsigned long long*>(seg_sorted);
    size_t sb = 0;
    check(
        cub::DeviceRadixSort::SortPairs(nullptr, sb, sin, sout, iota, idx, n, 0, seg_bits, stream),
        "row sort (size)");
    void* st = scratch.allocate(sb);
    check(cub::DeviceRadixSort::SortPairs(st, sb, sin, sout, iota, idx, n, 0, seg_bits, stream),
          "row sort");
    row_flags_kernel<<<grid_for(n), kBlock, 0, stream>>>(w, n, idx, flags);
    size_t cb = 0;
    check(cub::DeviceScan::ExclusiveSumByKey(nullptr, cb, seg_sorted, flags, rank, n,
                                             ::cuda::std::equal_to<int64_t>(), stream),
          "scan (size)");
    void* ct = scratch.allocate(cb);
    check(cub::DeviceScan::ExclusiveSumByKey(ct, cb, seg_sorted, flags, rank, n,
                                             ::cuda::std::equal_to<int64_t>(), stream),
          "scan");
    row_assign_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n, idx, seg_sorted, flags, rank,
                                                          per_table);
    if (r.op != RunOp::kErase) rowless_repeat_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n);
    row_finish_kernel<<<grid_for(t.num_tables), kBlock, 0, stream>>>(t, r.op, per_table);
    check(cudaGetLastError(), "rows");
  }

  const int64_t* sel = select_flagged(w.ev_flags, n, 0, num_evicted, scratch, stream);
  evict_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(
      sel, num_evicted, n, ns, w.ev_keys, w.ev_scores, w.ev_slots, w.ev_tables, r.ev_keys,
      r.ev_scores, r.ev_slots, r.ev_tables);
  check(cudaGetLastError(), "evict gather");
}

void export_batch(const TableRef& t, int64_t slot_begin, int64_t slot_end, int32_t column,
                  int64_t threshold, int64_t* out_keys, int64_t* out_slots, int64_t* out_tables,
                  int64_t* out_scores, int64_t* count, ScratchAllocator& scratch,
                  cudaStream_t stream) {
  check(cudaMemsetAsync(count, 0, sizeof(int64_t), stream), "memset");
  const int64_t n = slot_end - slot_begin;
  if (n <= 0) return;
  uint8_t* flags = alloc<uint8_t>(scratch, n);
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  export_flags_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, slot_begin, n, column, threshold,
                                                          flags, ok);
  const int64_t* sel = select_flagged(flags, n, slot_begin, count, scratch, stream);
  export_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, sel, count, n, out_keys, out_slots,
                                                           out_tables, out_scores);
  check(cudaGetLastError(), "export");
}

void gather_rows(const uint8_t* values, int64_t num_rows, int64_t row_bytes, const int64_t* rows,
                 int64_t n, uint8_t* out, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return;
  const auto aligned = [&](size_t a) {
    return row_bytes % static_cast<int64_t>(a) == 0 &&
           reinterpret_cast<uintptr_t>(values) % a == 0 &&
           reinterpret_cast<uintptr_t>(out) % a == 0;
  };
  if (aligned(16)) {
    launch_gather<uint4>(values, num_rows, row_bytes, rows, n, out, stream);
  } else if (aligned(8)) {
    launch_gather<uint2>(values, num_rows, row_bytes, rows, n, out, stream);
  } else if (aligned(4)) {
    launch_gather<uint32_t>(values, num_rows, row_bytes, rows, n, out, stream);
  } else {
    launch_gather<uint8_t>(values, num_rows, row_bytes, rows, n, out, stream);
  }
  check(cudaGetLastError(), "gather rows");
}

void home_starts(const TableRef& t, const int64_t* keys, const int64_t* table_ids, int64_t n,
                 int64_t* starts, ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  home_start_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, keys, table_ids, n, starts, ok);
  check(cudaGetLastError(), "home_starts");
}

void read_timer(int64_t* now, cudaStream_t stream) {
  timer_kernel<<<1, 1, 0, stream>>>(now);
  check(cudaGetLastError(), "read_timer");
}

void count(const TableRef& t, int64_t* out, ScratchAllocator& scratch, cudaStream_t stream) {
  check(cudaMemsetAsync(out, 0, sizeof(int64_t) * t.num_tables, stream), "memset");
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  for (int64_t table = 0; table < t.num_tables; ++table) {
    count_kernel<<<264, kBlock, 0, stream>>>(t, table, out, ok);
  }
  check(cudaGetLastError(), "count");
}

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  return e == cudaSuccess ? n : -static_cast<int>(e);
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
