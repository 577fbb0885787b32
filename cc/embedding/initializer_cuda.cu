// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/initializer_cuda.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

// One thread per element; consecutive threads write consecutive elements.
__global__ void init_rows_kernel(InitArgs a, const int64_t* keys, const int64_t* table_ids,
                                 int64_t n, int64_t dim, float* out) {
  const int64_t x = global_thread();
  if (x >= n * dim) return;
  const int64_t i = x / dim, e = x - i * dim;
  out[x] = init_value(a, keys[i], table_ids[i], e);
}

}  // namespace

void init_rows(const InitArgs& a, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t dim, float* out, cudaStream_t stream) {
  const int64_t total = n * dim;
  if (total == 0) return;
  init_rows_kernel<<<grid_for(total), kBlock, 0, stream>>>(a, keys, table_ids, n, dim, out);
  check_launch("init_rows");
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
