// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/lookup_cuda.h"

#include <stdexcept>
#include <string>

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kBlock = 256;

// A warp per bag: the lanes own coordinates d, d + 32, ... so each row of the
// bag is read in coalesced 128-byte pieces.
__global__ void pool_kernel(PoolArgs a, int64_t num_bags) {
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= num_bags) return;
  const BagSlot s = bag_slot(a.layout, b);
  for (int64_t d = lane; d < s.dim; d += kWarp) a.out[s.offset + d] = pooled_coord(a, b, d);
}

// A warp per distinct key: each lane reduces the gradient of its coordinates
// and updates them (update_coord); row-wise Adagrad first sums the row's
// squared gradient across the warp, before any coordinate changes.
__global__ void update_kernel(UpdateArgs a, int64_t num_keys) {
  const int64_t u = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (u >= num_keys) return;
  const int64_t r = a.rows[u];
  if (r < 0) return;
  const int64_t dim = key_dim(a, u);
  float* w = a.values + r * a.width;
  float* s = w + dim;
  RowFactors rf;
  if (static_cast<OptimType>(a.optim.type) == OptimType::kExactRowwiseAdagrad) {
    float sq = 0.f;
    for (int64_t d = lane; d < dim; d += kWarp) sq += rowwise_sq(a.optim, w[d], key_grad(a, u, d));
    for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    const float s0 = s[0] + (dim > 0 ? sq / static_cast<float>(dim) : 0.f);
    rf = rowwise_factors(a.optim, s0);
    __syncwarp();
    if (lane == 0) s[0] = s0;
  }
  for (int64_t d = lane; d < dim; d += kWarp) update_coord(a.optim, w, s, key_grad(a, u, d), d, dim, rf);
}

unsigned grid(int64_t warps) {
  return static_cast<unsigned>((warps * kWarp + kBlock - 1) / kBlock);
}

void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dynamicemb ") + what + " (CUDA): " + cudaGetErrorString(e));
  }
}

}  // namespace

void pool_forward(const PoolArgs& a, int64_t num_bags, cudaStream_t stream) {
  if (num_bags == 0) return;
  pool_kernel<<<grid(num_bags), kBlock, 0, stream>>>(a, num_bags);
  check("embedding_pool");
}

void update_backward(const UpdateArgs& a, int64_t num_keys, cudaStream_t stream) {
  if (num_keys == 0) return;
  update_kernel<<<grid(num_keys), kBlock, 0, stream>>>(a, num_keys);
  check("embedding_update");
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
