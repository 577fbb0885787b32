// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/optimizer_cuda.h"
#include "cc/embedding/warp_update.cuh"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

// One warp per row (warp_update_row), the row's gradient read in chunks.
__global__ void optimizer_kernel(OptimArgs a, float* values, int64_t num_rows, int64_t width,
                                 const int64_t* rows, const float* grads, int64_t n, int64_t dim) {
  const int64_t i = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= n) return;  // whole warps leave together: i is uniform in a warp
  const int64_t r = rows[i];
  if (r < 0 || r >= num_rows) return;
  const float* g = grads + i * dim;
  float* row = values + r * width;
  warp_update_row(a, row, row + dim, dim, lane,
                  [&](int64_t base, float (&c)[kPer]) { load_chunk(g, base, dim, lane, c); });
}

}  // namespace

void optimizer_step(const OptimArgs& a, float* values, int64_t num_rows, int64_t width,
                    const int64_t* rows, const float* grads, int64_t n, int64_t dim,
                    cudaStream_t stream) {
  if (n == 0) return;
  optimizer_kernel<<<grid_for(n * kWarp), kBlock, 0, stream>>>(a, values, num_rows, width, rows,
                                                               grads, n, dim);
  check_launch("optimizer_step");
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
