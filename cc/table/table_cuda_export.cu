// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CUDA backend's scans over slots: export_batch and count.
#include <cub/cub.cuh>

#include "cc/common/cuda_launch.cuh"
#include "cc/table/layout.h"
#include "cc/table/table_cuda.h"
#include "cc/table/table_cuda_shared.cuh"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

__global__ void export_flags_kernel(TableRef t, int64_t slot_begin, int64_t n, int32_t column,
                                    int64_t threshold, uint8_t* flags, const int32_t* ok) {
  const int64_t j = global_thread();
  if (j < n) flags[j] = *ok && export_selects(t, slot_begin + j, column, threshold) ? 1 : 0;
}

__global__ void export_gather_kernel(TableRef t, const int64_t* sel, const int64_t* count,
                                     int64_t n, int64_t* o_keys, int64_t* o_slots,
                                     int64_t* o_tables, int64_t* o_scores) {
  const int64_t j = global_thread();
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

__global__ void count_kernel(TableRef t, int64_t table, int64_t* out, const int32_t* ok) {
  using Reduce = cub::BlockReduce<int64_t, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
  if (!*ok) return;
  const int64_t off = t.info[table * kInfoCols + kInfoSlotOffset];
  const int64_t cap = t.info[table * kInfoCols + kInfoCapacity];
  int64_t c = 0;
  for (int64_t s = global_thread(); s < cap; s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    c += t.keys[off + s] != kEmptyKey;
  }
  const int64_t sum = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0 && sum) atomic_add_i64(out + table, sum);
}

}  // namespace

void export_batch(const TableRef& t, int64_t slot_begin, int64_t slot_end, int32_t column,
                  int64_t threshold, int64_t* out_keys, int64_t* out_slots, int64_t* out_tables,
                  int64_t* out_scores, int64_t* count, ScratchAllocator& scratch,
                  cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(count, 0, sizeof(int64_t), stream), "memset");
  const int64_t n = slot_end - slot_begin;
  if (n <= 0) return;
  uint8_t* flags = alloc<uint8_t>(scratch, n);
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  export_flags_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, slot_begin, n, column, threshold,
                                                          flags, ok);
  const int64_t* sel = select_flagged(flags, n, slot_begin, count, scratch, stream);
  export_gather_kernel<<<grid_for(n), kBlock, 0, stream>>>(t, sel, count, n, out_keys, out_slots,
                                                           out_tables, out_scores);
  check_launch("export");
}

void count(const TableRef& t, int64_t* out, ScratchAllocator& scratch, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(out, 0, sizeof(int64_t) * t.num_tables, stream), "memset");
  const int32_t* ok = layout_ok(t, INT64_MAX, -1, true, scratch, stream);
  for (int64_t table = 0; table < t.num_tables; ++table) {
    count_kernel<<<264, kBlock, 0, stream>>>(t, table, out, ok);
  }
  check_launch("count");
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
