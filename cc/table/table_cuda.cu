// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/table/table_cuda.h"

#include <cub/cub.cuh>
#include <cuda/std/functional>

#include <stdexcept>
#include <string>

#include "cc/table/table_common.h"

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

__global__ void find_kernel(TableRef t, ScoreArgs a, const int64_t* keys, const int64_t* table_ids,
                            int64_t n, bool update, int64_t* slots) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) slots[i] = find_one(t, a, i, keys[i], table_ids[i], update);
}

__global__ void sort_key_kernel(TableRef t, const int64_t* keys, const int64_t* table_ids,
                                int64_t n, int64_t total_buckets, int64_t* out, int32_t* iota) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t k = sort_key_of(t, keys[i], table_ids[i]);
  out[i] = k == INT64_MAX ? total_buckets : k;
  iota[i] = static_cast<int32_t>(i);
}

// One thread per sorted position; the first position of each run processes it.
__global__ void run_kernel(TableRef t, RunArgs r, const int64_t* sorted_keys, int64_t n,
                           int64_t total_buckets) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= n) return;
  const int64_t k = sorted_keys[p];
  if (k == total_buckets) {
    const int32_t i = r.order[p];
    r.slots[i] = -1;
    r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
    if (r.row_work) r.row_work[i] = -1;
    return;
  }
  if (p > 0 && sorted_keys[p - 1] == k) return;
  int64_t end = p + 1;
  while (end < n && sorted_keys[end] == k) ++end;
  process_run(t, r, p, end);
}

// Segment key of a batch index for the row pass: its table, or num_tables for
// entries that take no part (invalid input).
__global__ void row_keys_kernel(TableRef t, RunArgs r, int64_t n, int64_t* seg, int32_t* iota) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  seg[i] = r.status[i] == static_cast<int8_t>(InsertStatus::kInvalid) ? t.num_tables
                                                                       : r.table_ids[i];
  iota[i] = static_cast<int32_t>(i);
}

// flags[q] for the q-th entry of the (table, index) order.
__global__ void row_flags_kernel(RunArgs r, int64_t n, const int32_t* idx, int64_t* flags) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q < n) flags[q] = r.row_work[idx[q]] >= 0 ? 1 : 0;
}

__global__ void row_assign_kernel(TableRef t, RunArgs r, int64_t n, const int32_t* idx,
                                  const int64_t* rank, int64_t* per_table) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= n) return;
  const int32_t i = idx[q];
  const int64_t w = r.row_work[i];
  if (w < 0) return;
  const int64_t table = r.table_ids[i];
  atomic_add_i64(per_table + table, 1);
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
                                    int64_t threshold, uint8_t* flags) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < n) flags[j] = export_selects(t, slot_begin + j, column, threshold) ? 1 : 0;
}

__global__ void export_gather_kernel(TableRef t, const int64_t* sel, const int64_t* count,
                                     int64_t n, int64_t* o_keys, int64_t* o_slots,
                                     int64_t* o_tables, int64_t* o_scores) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n || j >= *count) return;
  const int64_t s = sel[j];
  const int32_t ns = t.num_scores;
  o_keys[j] = t.keys[s];
  o_slots[j] = s;
  o_tables[j] = table_of_slot(t, s);
  for (int32_t c = 0; c < ns; ++c) o_scores[j * ns + c] = t.scores[s * ns + c];
}

__global__ void count_kernel(TableRef t, int64_t table, int64_t* out) {
  using Reduce = cub::BlockReduce<int64_t, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
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
          int64_t n, bool update, int64_t* slots, cudaStream_t stream) {
  if (n == 0) return;
  find_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, a, keys, table_ids, n, update, slots);
  check(cudaGetLastError(), "find");
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

  sort_key_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, r.keys, r.table_ids, n, total_buckets,
                                                      keys_in, iota);
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
  w.ev_keys = alloc<int64_t>(scratch, n);
  w.ev_scores = alloc<int64_t>(scratch, n * ns);
  w.ev_slots = alloc<int64_t>(scratch, n);
  w.ev_tables = alloc<int64_t>(scratch, n);
  w.ev_flags = alloc<uint8_t>(scratch, n);
  check(cudaMemsetAsync(w.ev_flags, 0, static_cast<size_t>(n), stream), "memset");
  if (!has_rows) w.row_work = nullptr;
  else if (!w.row_work) w.row_work = alloc<int64_t>(scratch, n);
  run_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, keys_sorted, n, total_buckets);
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
    check(cub::DeviceRadixSort::SortPairs(nullptr, sb, sin, sout, iota, idx, n, 0, seg_bits, stream),
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
    row_assign_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n, idx, rank, per_table);
    if (r.op != RunOp::kErase) rowless_repeat_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, w, n);
    row_finish_kernel<<<grid_for(t.num_tables), kBlock, 0, stream>>>(t, r.op, per_table);
    check(cudaGetLastError(), "rows");
  }

  const int64_t* sel = select_flagged(w.ev_flags, n, 0, num_evicted, scratch, stream);
  evict_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(sel, num_evicted, n, ns, w.ev_keys,
                                                          w.ev_scores, w.ev_slots, w.ev_tables,
                                                          r.ev_keys, r.ev_scores, r.ev_slots,
                                                          r.ev_tables);
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
  export_flags_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, slot_begin, n, column, threshold,
                                                          flags);
  const int64_t* sel = select_flagged(flags, n, slot_begin, count, scratch, stream);
  export_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, sel, count, n, out_keys, out_slots,
                                                           out_tables, out_scores);
  check(cudaGetLastError(), "export");
}

void count(const TableRef& t, int64_t* out, cudaStream_t stream) {
  check(cudaMemsetAsync(out, 0, sizeof(int64_t) * t.num_tables, stream), "memset");
  for (int64_t table = 0; table < t.num_tables; ++table) {
    count_kernel<<<264, kBlock, 0, stream>>>(t, table, out);
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
