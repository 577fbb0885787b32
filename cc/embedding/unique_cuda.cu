// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cub/cub.cuh>

#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/embedding/unique_cuda.h"
#include "cc/table/hash.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

/// Hash-set slots for n occurrences: a power of two, at least 2n.
int64_t slots_for(int64_t n) {
  int64_t c = 1;
  while (c < 2 * n) c <<= 1;
  return c;
}

/// The scratch layout: slots (int32, position + 1 or 0), each occurrence's
/// slot (int32), sort keys in and out (Key), positions in and out (int32),
/// the inclusive sums of the pair flags (int32), then cub's temporary storage
/// (the sort's or the scan's); each part 256-byte aligned.
struct Layout {
  int64_t num_slots;
  int pos_bits, key_bits;  // sort key = table << pos_bits | position; key_bits in all
  bool wide;               // 64-bit sort keys
  size_t slots, occ_slot, key_in, key_out, pos_in, pos_out, through, temp, temp_bytes, total;
};

/// Whether sorted entry i starts a pair: the first entry, or a sort key other
/// than the one before (read by the scan as it goes: no flags array).
template <class Key>
struct StartsPair {
  const Key* key_out;
  __host__ __device__ int32_t operator()(int64_t i) const {
    return i == 0 || key_out[i] != key_out[i - 1] ? 1 : 0;
  }
};

template <class Key>
using PairFlags =
    thrust::transform_iterator<StartsPair<Key>, thrust::counting_iterator<int64_t>, int32_t>;

template <class Key>
PairFlags<Key> pair_flags(const Key* key_out) {
  return PairFlags<Key>(thrust::counting_iterator<int64_t>(0), StartsPair<Key>{key_out});
}

template <class Key>
size_t temp_bytes_for(int64_t n, int key_bits) {
  size_t sort = 0, scan = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const Key*>(nullptr),
                                             static_cast<Key*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), n, 0, key_bits),
             "segmented_unique (sort size)");
  check_cuda(cub::DeviceScan::InclusiveSum(nullptr, scan, pair_flags<Key>(nullptr),
                                           static_cast<int32_t*>(nullptr), n),
             "segmented_unique (scan size)");
  return sort > scan ? sort : scan;
}

Layout layout_of(int64_t n, int64_t num_tables) {
  Layout l{};
  l.num_slots = slots_for(n);
  l.pos_bits = bits_for(n - 1);
  l.key_bits = l.pos_bits + bits_for(num_tables);  // num_tables: the out-of-range ids' table
  l.wide = l.key_bits > 32;
  const size_t un = static_cast<size_t>(n);
  const size_t key = l.wide ? sizeof(uint64_t) : sizeof(uint32_t);
  l.slots = 0;
  l.occ_slot = l.slots + scratch_aligned(static_cast<size_t>(l.num_slots) * sizeof(int32_t));
  l.key_in = l.occ_slot + scratch_aligned(un * sizeof(int32_t));
  l.key_out = l.key_in + scratch_aligned(un * key);
  l.pos_in = l.key_out + scratch_aligned(un * key);
  l.pos_out = l.pos_in + scratch_aligned(un * sizeof(int32_t));
  l.through = l.pos_out + scratch_aligned(un * sizeof(int32_t));
  l.temp = l.through + scratch_aligned(un * sizeof(int32_t));
  l.temp_bytes =
      l.wide ? temp_bytes_for<uint64_t>(n, l.key_bits) : temp_bytes_for<uint32_t>(n, l.key_bits);
  l.total = l.temp + scratch_aligned(l.temp_bytes);
  return l;
}

__device__ __forceinline__ int64_t table_of(const int64_t* table_ids, int64_t i,
                                            int64_t num_tables) {
  const int64_t t = table_ids[i];
  return t >= 0 && t < num_tables ? t : num_tables;
}

// A thread per occurrence: finds or claims its pair's slot (linear probing;
// a slot holds position + 1 of an occurrence of its pair, lowered to the
// pair's smallest).
__global__ void insert_kernel(const int64_t* keys, const int64_t* table_ids, int64_t n,
                              int64_t num_tables, int32_t* slots, int64_t num_slots,
                              int32_t* occ_slot) {
  const int64_t i = global_thread();
  if (i >= n) return;
  const int64_t k = keys[i];
  const int64_t t = table_of(table_ids, i, num_tables);
  const uint64_t h =
      table::bucket_hash(table::bucket_hash(static_cast<uint64_t>(k)) + static_cast<uint64_t>(t));
  const int64_t mask = num_slots - 1;
  const int32_t mine = static_cast<int32_t>(i + 1);
  for (int64_t s = static_cast<int64_t>(h & static_cast<uint64_t>(mask));; s = (s + 1) & mask) {
    int32_t v = slots[s];
    if (v == 0) {
      v = atomicCAS(&slots[s], 0, mine);
      if (v == 0) {
        occ_slot[i] = static_cast<int32_t>(s);
        return;
      }
    }
    const int64_t j = v - 1;
    if (keys[j] == k && table_of(table_ids, j, num_tables) == t) {
      if (mine < v) atomicMin(&slots[s], mine);
      occ_slot[i] = static_cast<int32_t>(s);
      return;
    }
  }
}

// A thread per occurrence: its sort key (table, the pair's first position)
// and its position.
template <class Key>
__global__ void sort_keys_kernel(const int64_t* table_ids, int64_t n, int64_t num_tables,
                                 const int32_t* slots, const int32_t* occ_slot, int pos_bits,
                                 Key* key_in, int32_t* pos_in) {
  const int64_t i = global_thread();
  if (i >= n) return;
  const Key first = static_cast<Key>(slots[occ_slot[i]] - 1);
  key_in[i] = static_cast<Key>(table_of(table_ids, i, num_tables)) << pos_bits | first;
  pos_in[i] = static_cast<int32_t>(i);
}

// A thread per sorted entry i, of pair g = through[i] - 1: the order and the
// inverse; the first entry of a pair writes the pair, the first of a table
// the table offsets up to its table.
template <class Key>
__global__ void pairs_kernel(const int64_t* keys, const Key* key_out, const int32_t* pos_out,
                             const int32_t* through, int64_t n, int64_t num_tables, int pos_bits,
                             UniqueOutputs out) {
  const int64_t i = global_thread();
  if (i >= n) return;
  const int64_t g = through[i] - 1;
  const int64_t p = pos_out[i];
  out.order[i] = p;
  out.inverse[p] = g;
  if (!StartsPair<Key>{key_out}(i)) return;
  const int64_t t = static_cast<int64_t>(key_out[i] >> pos_bits);
  out.keys[g] = keys[p];
  out.table_ids[g] = t;
  out.occ_offsets[g] = i;
  const int64_t from = i == 0 ? 0 : static_cast<int64_t>(key_out[i - 1] >> pos_bits) + 1;
  for (int64_t b = from; b <= t && b <= num_tables; ++b) out.table_offsets[b] = g;
}

// A thread per pair slot v (and per table offset v, max(n, num_tables + 1)
// threads): counts of the distinct pairs, padding after them; the offsets of
// the tables after the last entry's, and the number of distinct pairs.
template <class Key>
__global__ void pad_kernel(const Key* key_out, int64_t n, const int32_t* through,
                           int64_t num_tables, int pos_bits, int64_t pad_key, UniqueOutputs out) {
  const int64_t v = global_thread();
  const int64_t u = through[n - 1];
  if (v <= num_tables && v > static_cast<int64_t>(key_out[n - 1] >> pos_bits)) {
    out.table_offsets[v] = u;
  }
  if (v == 0) {
    out.num_unique[0] = u;
    out.occ_offsets[n] = n;
  }
  if (v >= n) return;
  if (v < u) {
    out.counts[v] = (v + 1 < u ? out.occ_offsets[v + 1] : n) - out.occ_offsets[v];
  } else {
    out.counts[v] = 0;
    out.keys[v] = pad_key;
    out.table_ids[v] = num_tables - 1;
    out.occ_offsets[v] = n;
  }
}

template <class Key>
void run(const int64_t* keys, const int64_t* table_ids, int64_t n, int64_t num_tables,
         int64_t pad_key, const Layout& l, char* scratch, const UniqueOutputs& out,
         cudaStream_t stream) {
  auto* slots = reinterpret_cast<int32_t*>(scratch + l.slots);
  auto* occ_slot = reinterpret_cast<int32_t*>(scratch + l.occ_slot);
  auto* key_in = reinterpret_cast<Key*>(scratch + l.key_in);
  auto* key_out = reinterpret_cast<Key*>(scratch + l.key_out);
  auto* pos_in = reinterpret_cast<int32_t*>(scratch + l.pos_in);
  auto* pos_out = reinterpret_cast<int32_t*>(scratch + l.pos_out);
  auto* through = reinterpret_cast<int32_t*>(scratch + l.through);
  void* temp = scratch + l.temp;
  check_cuda(cudaMemsetAsync(slots, 0, static_cast<size_t>(l.num_slots) * sizeof(int32_t), stream),
             "segmented_unique (clear)");
  insert_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, table_ids, n, num_tables, slots,
                                                    l.num_slots, occ_slot);
  check_launch("segmented_unique (hash set)");
  sort_keys_kernel<Key><<<grid_for(n), kBlock, 0, stream>>>(table_ids, n, num_tables, slots,
                                                            occ_slot, l.pos_bits, key_in, pos_in);
  check_launch("segmented_unique (sort keys)");
  size_t bytes = l.temp_bytes;
  check_cuda(cub::DeviceRadixSort::SortPairs(temp, bytes, key_in, key_out, pos_in, pos_out, n, 0,
                                             l.key_bits, stream),
             "segmented_unique (sort)");
  bytes = l.temp_bytes;
  check_cuda(
      cub::DeviceScan::InclusiveSum(temp, bytes, pair_flags<Key>(key_out), through, n, stream),
      "segmented_unique (scan)");
  pairs_kernel<Key><<<grid_for(n), kBlock, 0, stream>>>(keys, key_out, pos_out, through, n,
                                                        num_tables, l.pos_bits, out);
  check_launch("segmented_unique (pairs)");
  pad_kernel<Key><<<grid_for(n > num_tables ? n : num_tables + 1), kBlock, 0, stream>>>(
      key_out, n, through, num_tables, l.pos_bits, pad_key, out);
  check_launch("segmented_unique (padding)");
}

}  // namespace

size_t unique_scratch(int64_t n, int64_t num_tables) { return layout_of(n, num_tables).total; }

void segmented_unique(const int64_t* keys, const int64_t* table_ids, int64_t n, int64_t num_tables,
                      int64_t pad_key, void* scratch, const UniqueOutputs& out,
                      cudaStream_t stream) {
  if (n == 0) return;
  const Layout l = layout_of(n, num_tables);
  char* s = static_cast<char*>(scratch);
  if (l.wide) {
    run<uint64_t>(keys, table_ids, n, num_tables, pad_key, l, s, out, stream);
  } else {
    run<uint32_t>(keys, table_ids, n, num_tables, pad_key, l, s, out, stream);
  }
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
