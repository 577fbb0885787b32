// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The assign_rows check on the device (row_check.h; cpu::check_rows is its
// reference): each rule's first failing entry found by an atomic minimum over
// the batch, the keys' first occurrences by two stable radix sorts (by key,
// then by table), and one thread writing the verdict.
#include <climits>
#include <cub/cub.cuh>

#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/table/layout.h"
#include "cc/table/row_check.h"
#include "cc/table/rows.h"
#include "cc/table/table_cuda.h"
#include "cc/table/table_cuda_shared.cuh"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

constexpr long long kNoEntry = LLONG_MAX;

/// The first failing entry of each rule (kNoEntry: none yet).
struct FirstFailing {
  long long key;    // rule 1
  long long range;  // rule 2
  long long taken;  // rule 3
};

/// The batch as the check reads it.
struct Batch {
  const int64_t* keys;
  const int64_t* table_ids;
  const int64_t* rows;  // score column 0: rows[i * row_stride]
  int64_t row_stride;
  int64_t n;

  __device__ int64_t row(int64_t i) const { return rows[i * row_stride]; }
};

__global__ void init_kernel(int64_t* owner, int64_t* taker, int64_t entries, FirstFailing* f) {
  const int64_t e = global_thread();
  if (e == 0) *f = FirstFailing{kNoEntry, kNoEntry, kNoEntry};
  if (e < entries) {
    owner[e] = -1;
    taker[e] = kNoEntry;
  }
}

// Rules 1 and 2, an entry a thread.
__global__ void entry_kernel(TableRef t, Batch b, FirstFailing* f) {
  const int64_t i = global_thread();
  if (i >= b.n) return;
  const int64_t table = b.table_ids[i];
  if (key_error(t, b.keys[i], table) != kRowsOk) {
    atomicMin(&f->key, static_cast<long long>(i));
    return;
  }
  if (!assigns_rows(t, table)) return;
  const int64_t row = b.row(i);
  if (row < 0 || row >= row_capacity(t, table)) atomicMin(&f->range, static_cast<long long>(i));
}

// The slot holding each row entry (the highest, if the state is corrupt), a
// slot a thread.
__global__ void owner_kernel(TableRef t, int64_t* owner) {
  const int64_t slot = global_thread();
  if (slot >= t.num_slots) return;
  const int64_t e = held_row_entry(t, slot);
  if (e >= 0) {
    atomicMax(reinterpret_cast<long long*>(owner + e), static_cast<long long>(slot));
  }
}

__global__ void iota_kernel(int64_t* out, int64_t n) {
  const int64_t i = global_thread();
  if (i < n) out[i] = i;
}

// The sort key of the second pass: the entry's table id, num_tables for an
// invalid one (whose entry fails rule 1 anyway).
__global__ void table_key_kernel(TableRef t, Batch b, const int64_t* by_key, uint64_t* out) {
  const int64_t p = global_thread();
  if (p >= b.n) return;
  const int64_t table = b.table_ids[by_key[p]];
  out[p] = static_cast<uint64_t>(table >= 0 && table < t.num_tables ? table : t.num_tables);
}

// first[i]: entry i is the first occurrence of its (table, key) pair. The
// entries come sorted by (table, key), each pair's in batch order.
__global__ void first_kernel(Batch b, const uint64_t* tables, const int64_t* order,
                             uint8_t* first) {
  const int64_t p = global_thread();
  if (p >= b.n) return;
  const int64_t i = order[p];
  first[i] = p == 0 || tables[p] != tables[p - 1] || b.keys[i] != b.keys[order[p - 1]];
}

// A new entry: valid, of a NO_EVICTION table, its row in range, the first
// occurrence of its pair, its key not in the table. Its row entry, or -1.
__device__ int64_t new_entry_row(const TableRef& t, const Batch& b, const uint8_t* first,
                                 int64_t i) {
  const int64_t key = b.keys[i], table = b.table_ids[i];
  if (!first[i] || key_error(t, key, table) != kRowsOk || !assigns_rows(t, table)) return -1;
  const int64_t row = b.row(i);
  if (row < 0 || row >= row_capacity(t, table) || find_slot(t, table, key) >= 0) return -1;
  return row_entry(t, table, row);
}

// taker[e]: the first new entry taking row entry e.
__global__ void take_kernel(TableRef t, Batch b, const uint8_t* first, int64_t* taker) {
  const int64_t i = global_thread();
  if (i >= b.n) return;
  const int64_t e = new_entry_row(t, b, first, i);
  if (e >= 0) atomicMin(reinterpret_cast<long long*>(taker + e), static_cast<long long>(i));
}

// Rule 3: a new entry fails when an earlier one took its row or a key holds it.
__global__ void taken_kernel(TableRef t, Batch b, const uint8_t* first, const int64_t* owner,
                             const int64_t* taker, FirstFailing* f) {
  const int64_t i = global_thread();
  if (i >= b.n) return;
  const int64_t e = new_entry_row(t, b, first, i);
  if (e >= 0 && (taker[e] < i || owner[e] >= 0)) atomicMin(&f->taken, static_cast<long long>(i));
}

__global__ void verdict_kernel(TableRef t, Batch b, const int64_t* owner, const int64_t* taker,
                               const FirstFailing* f, RowVerdict* out) {
  RowVerdict v;
  if (f->key != kNoEntry) {
    const int64_t i = f->key;
    v = row_verdict(key_error(t, b.keys[i], b.table_ids[i]), i, b.keys[i], b.table_ids[i], 0);
  } else if (f->range != kNoEntry) {
    const int64_t i = f->range, table = b.table_ids[i];
    v = row_verdict(kRowOutOfRange, i, b.keys[i], table, b.row(i));
    v.row_capacity = row_capacity(t, table);
  } else if (f->taken != kNoEntry) {
    // An earlier new entry took the row only if no key holds it: it would
    // have failed first otherwise.
    const int64_t i = f->taken, table = b.table_ids[i];
    const int64_t e = row_entry(t, table, b.row(i));
    if (taker[e] < i) {
      v = row_verdict(kRowGivenTwice, i, b.keys[i], table, b.row(i));
      v.other_index = taker[e];
      v.other_key = b.keys[taker[e]];
    } else {
      v = row_verdict(kRowHeld, i, b.keys[i], table, b.row(i));
      v.other_key = t.keys[owner[e]];
    }
  }
  *out = v;
}

/// first[i] for every entry (first_kernel), by two stable radix sorts.
void first_occurrences(const TableRef& t, const Batch& b, uint8_t* first, ScratchAllocator& scratch,
                       cudaStream_t stream) {
  const int64_t n = b.n;
  int64_t* pos = alloc<int64_t>(scratch, n);
  int64_t* sorted_keys = alloc<int64_t>(scratch, n);
  int64_t* by_key = alloc<int64_t>(scratch, n);
  uint64_t* tables = alloc<uint64_t>(scratch, n);
  uint64_t* sorted_tables = alloc<uint64_t>(scratch, n);
  int64_t* order = alloc<int64_t>(scratch, n);
  const int table_bits = bits_for(t.num_tables);
  size_t by_key_bytes = 0, by_table_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, by_key_bytes, b.keys, sorted_keys, pos,
                                             by_key, n, 0, 64, stream),
             "check_rows (sort size)");
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, by_table_bytes, tables, sorted_tables, by_key,
                                             order, n, 0, table_bits, stream),
             "check_rows (sort size)");
  const size_t bytes = by_key_bytes > by_table_bytes ? by_key_bytes : by_table_bytes;
  void* temp = scratch.allocate(bytes);
  iota_kernel<<<grid_for(n), kBlock, 0, stream>>>(pos, n);
  size_t used = bytes;
  check_cuda(cub::DeviceRadixSort::SortPairs(temp, used, b.keys, sorted_keys, pos, by_key, n, 0, 64,
                                             stream),
             "check_rows (sort by key)");
  table_key_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, b, by_key, tables);
  used = bytes;
  check_cuda(cub::DeviceRadixSort::SortPairs(temp, used, tables, sorted_tables, by_key, order, n, 0,
                                             table_bits, stream),
             "check_rows (sort by table)");
  first_kernel<<<grid_for(n), kBlock, 0, stream>>>(b, sorted_tables, order, first);
}

}  // namespace

void check_rows(const TableRef& t, const int64_t* keys, const int64_t* table_ids,
                const int64_t* rows, int64_t row_stride, int64_t n, RowVerdict* verdict,
                ScratchAllocator& scratch, cudaStream_t stream) {
  const Batch b{keys, table_ids, rows, row_stride, n};
  const int64_t entries = t.num_free_rows;
  auto* f = alloc<FirstFailing>(scratch, 1);
  int64_t* owner = alloc<int64_t>(scratch, entries);
  int64_t* taker = alloc<int64_t>(scratch, entries);
  uint8_t* first = alloc<uint8_t>(scratch, n);
  init_kernel<<<grid_for(entries), kBlock, 0, stream>>>(owner, taker, entries, f);
  if (n > 0) {
    entry_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, b, f);
    if (entries > 0) owner_kernel<<<grid_for(t.num_slots), kBlock, 0, stream>>>(t, owner);
    first_occurrences(t, b, first, scratch, stream);
    take_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, b, first, taker);
    taken_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, b, first, owner, taker, f);
  }
  verdict_kernel<<<1, 1, 0, stream>>>(t, b, owner, taker, f, verdict);
  check_launch("check_rows");
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
