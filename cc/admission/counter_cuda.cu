// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/admission/counter.h"
#include "cc/admission/counter_cuda.h"
#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/table/layout.h"

namespace dyn_emb {
namespace admission {
namespace cuda {

namespace {
template <typename T>
T* alloc(table::cuda::ScratchAllocator& s, int64_t n) {
  return static_cast<T*>(s.allocate(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T)));
}

// The counter's input: the key where the store does not hold it, else an
// invalid entry (it sorts last and forms no run).
__global__ void missing_kernel(const int64_t* keys, const int64_t* slots, int64_t n,
                               int64_t* missing) {
  const int64_t i = global_thread();
  if (i < n) missing[i] = slots[i] < 0 ? keys[i] : table::kEmptyKey;
}

// Each entry's Admission, and the admitted and rejected entries per table.
// Batches come grouped by table, so a block's entries nearly always share
// its first entry's table: a warp counts them with one ballot, a block adds
// them with one global atomic per column (one atomic per entry on a few
// addresses would serialize the batch); entries of other tables add their own.
__global__ void decide_kernel(table::TableRef counter, const int64_t* keys,
                              const int64_t* table_ids, const int64_t* slots, const int64_t* counts,
                              int64_t n, int64_t threshold, int8_t* status, int64_t* per_table) {
  __shared__ unsigned long long block_sum[kAdmitCols];
  __shared__ int64_t block_table;
  const int64_t i = global_thread();
  if (threadIdx.x == 0) {
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x;
    const int64_t t = first < n ? table_ids[first] : -1;
    block_table = t >= 0 && t < counter.num_tables ? t : -1;
    for (int c = 0; c < kAdmitCols; ++c) block_sum[c] = 0;
  }
  __syncthreads();
  int col = -1;
  int64_t table = -1;
  if (i < n) {
    table = table_ids[i];
    const bool valid = table::valid_input(counter, keys[i], table);
    const bool stored = slots[i] >= 0;
    // The run wrote the count of every valid entry it was given.
    const int64_t count = valid && !stored ? counts[i] : 0;
    const Admission a = admission_of(valid, stored, count, threshold);
    status[i] = static_cast<int8_t>(a);
    col = admit_col(a);
  }
  for (int c = 0; c < kAdmitCols; ++c) {
    const bool here = col == c && table == block_table;
    const unsigned votes = __ballot_sync(0xffffffffu, here);
    if ((threadIdx.x & 31) == 0 && votes) atomicAdd(&block_sum[c], __popc(votes));
    if (col == c && !here) atomic_add_i64(per_table + table * kAdmitCols + c, 1);
  }
  __syncthreads();
  if (threadIdx.x < kAdmitCols && block_table >= 0 && block_sum[threadIdx.x]) {
    atomic_add_i64(per_table + block_table * kAdmitCols + threadIdx.x,
                   static_cast<int64_t>(block_sum[threadIdx.x]));
  }
}
}  // namespace

void add(const table::TableRef& t, const int64_t* keys, const int64_t* table_ids,
         const int64_t* frequencies, int64_t n, int64_t release_at, int64_t total_buckets,
         int64_t* counts, table::cuda::ScratchAllocator& scratch, cudaStream_t stream) {
  // No eviction records out (ev_* null): the run keeps its own, nothing is compacted.
  CountScratch s;
  s.order = alloc<int32_t>(scratch, n);
  s.slots = alloc<int64_t>(scratch, n);
  s.status = alloc<int8_t>(scratch, n);
  int64_t* num_evicted = alloc<int64_t>(scratch, 1);
  table::cuda::run_op(t, count_run(keys, table_ids, frequencies, release_at, counts, s), n,
                      total_buckets, /*has_rows=*/false, num_evicted, scratch, stream);
}

void admit(const table::TableRef& store, const table::TableRef& counter, const int64_t* keys,
           const int64_t* table_ids, const int64_t* frequencies, int64_t n, int64_t threshold,
           int64_t total_buckets, int8_t* status, int64_t* per_table,
           table::cuda::ScratchAllocator& scratch, cudaStream_t stream) {
  if (n == 0) return;
  int64_t* slots = alloc<int64_t>(scratch, n);
  table::cuda::find(store, table::ScoreArgs{}, keys, table_ids, n, /*update=*/false, slots, scratch,
                    stream);
  int64_t* missing = alloc<int64_t>(scratch, n);
  missing_kernel<<<grid_for(n), kBlock, 0, stream>>>(keys, slots, n, missing);
  check_launch("admission: missing keys");
  int64_t* counts = alloc<int64_t>(scratch, n);
  add(counter, missing, table_ids, frequencies, n, threshold, total_buckets, counts, scratch,
      stream);
  decide_kernel<<<grid_for(n), kBlock, 0, stream>>>(counter, keys, table_ids, slots, counts, n,
                                                    threshold, status, per_table);
  check_launch("admission: decide");
}

}  // namespace cuda
}  // namespace admission
}  // namespace dyn_emb
