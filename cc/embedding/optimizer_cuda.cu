// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/optimizer_cuda.h"

#include <stdexcept>
#include <string>

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

// One warp per row: the lanes stride over the row's coordinates, so a warp
// reads and writes its row (and state) in coalesced 128-byte pieces. Row-wise
// Adagrad first sums the row's squared gradient across the warp.
constexpr int kWarp = 32;

__global__ void optimizer_kernel(OptimArgs a, float* values, int64_t num_rows, int64_t width,
                                 const int64_t* rows, const float* grads, int64_t n,
                                 int64_t dim) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= n) return;  // whole warps leave together: i is uniform in a warp
  const int64_t r = rows[i];
  if (r < 0 || r >= num_rows) return;
  float* w = values + r * width;
  float* s = w + dim;
  const float* g = grads + i * dim;
  RowFactors rf;
  if (static_cast<OptimType>(a.type) == OptimType::kExactRowwiseAdagrad) {
    float sq = 0.f;
    for (int64_t d = lane; d < dim; d += kWarp) sq += rowwise_sq(a, w[d], g[d]);
    for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    const float s0 = s[0] + (dim > 0 ? sq / static_cast<float>(dim) : 0.f);
    rf = rowwise_factors(a, s0);
    __syncwarp();
    if (lane == 0) s[0] = s0;
  }
  for (int64_t d = lane; d < dim; d += kWarp) update_coord(a, w, s, g[d], d, dim, rf);
}

}  // namespace

void optimizer_step(const OptimArgs& a, float* values, int64_t num_rows, int64_t width,
                    const int64_t* rows, const float* grads, int64_t n, int64_t dim,
                    cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kBlock = 256;
  const int64_t threads = n * kWarp;
  optimizer_kernel<<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      a, values, num_rows, width, rows, grads, n, dim);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dynamicemb optimizer_step (CUDA): ") +
                             cudaGetErrorString(e));
  }
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
