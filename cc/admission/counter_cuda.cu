// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/admission/counter.h"
#include "cc/admission/counter_cuda.h"

namespace dyn_emb {
namespace admission {
namespace cuda {

namespace {
template <typename T>
T* alloc(table::cuda::ScratchAllocator& s, int64_t n) {
  return static_cast<T*>(s.allocate(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T)));
}
}  // namespace

void add(const table::TableRef& t, const int64_t* keys, const int64_t* table_ids,
         const int64_t* frequencies, int64_t n, int64_t release_at, int64_t total_buckets,
         int64_t* counts, table::cuda::ScratchAllocator& scratch, cudaStream_t stream) {
  CountScratch s;
  s.order = alloc<int32_t>(scratch, n);
  s.slots = alloc<int64_t>(scratch, n);
  s.status = alloc<int8_t>(scratch, n);
  s.ev_keys = alloc<int64_t>(scratch, n);
  s.ev_scores = alloc<int64_t>(scratch, n);
  s.ev_slots = alloc<int64_t>(scratch, n);
  s.ev_tables = alloc<int64_t>(scratch, n);
  int64_t* num_evicted = alloc<int64_t>(scratch, 1);
  table::cuda::run_op(t, count_run(keys, table_ids, frequencies, release_at, counts, s), n,
                      total_buckets, /*has_rows=*/false, num_evicted, scratch, stream);
}

}  // namespace cuda
}  // namespace admission
}  // namespace dyn_emb
