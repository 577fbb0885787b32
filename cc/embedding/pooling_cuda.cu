// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/pooling_cuda.h"
#include "cc/embedding/warp_update.cuh"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

// Bags and keys are walked once per chunk of kChunk coordinates
// (warp_update.cuh; once for dims up to 128), kPer partial sums per lane in
// registers.

// A warp per bag.
template <class T>
__global__ void pool_kernel(PoolArgs a, int64_t num_bags) {
  const int64_t b = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= num_bags) return;
  const BagSlot s = bag_slot(a.layout, b);
  const int64_t j0 = a.bag_offsets[b], j1 = a.bag_offsets[b + 1];
  for (int64_t base = 0; base < s.dim; base += kChunk) {
    float acc[kPer] = {};
    for (int64_t j = j0; j < j1; ++j) {
      const T* v = occ_row<T>(a, j);
      if (v == nullptr) continue;
      const float w = occ_weight(a.weights, j);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = base + lane + k * kWarp;
        if (d < s.dim) acc[k] += w * storage::to_float(v[d]);
      }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = base + lane + k * kWarp;
      if (d < s.dim) a.out[s.offset + d] = acc[k];
    }
  }
}

// The chunk at `base` of the gradient summed over grouped positions [i0, i1).
__device__ void grad_chunk(const UpdateArgs& a, int64_t i0, int64_t i1, int64_t base, int64_t dim,
                           int lane, float (&g)[kPer]) {
#pragma unroll
  for (int k = 0; k < kPer; ++k) g[k] = 0.f;
  for (int64_t i = i0; i < i1; ++i) {
    float w;
    const float* go = occ_grad_row(a, i, &w);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = base + lane + k * kWarp;
      if (d < dim) g[k] += w * go[d];
    }
  }
}

// Updates key u's row (one warp, warp_update_row); fill(base, g) writes the
// gradient's chunk at `base` into g.
template <class T, class Fill>
__device__ void update_key(const UpdateArgs& a, int64_t u, int lane, const Fill& fill) {
  const int64_t r = a.rows[u];
  if (r < 0) return;  // uniform across the warp
  const int64_t dim = key_dim(a, u);
  warp_update_row(a.optim, storage::embedding_at<T>(a.space, r),
                  storage::state_at<T>(a.space, r, dim), dim, lane, fill);
}

__device__ __forceinline__ bool hot(const UpdateArgs& a, int64_t u) {
  return a.occ_offsets[u + 1] - a.occ_offsets[u] > kHotChunk;
}

/// The first index i in [0, n) with v[i] > x (v non-decreasing), n if none.
__device__ int64_t upper_bound(const int64_t* v, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (v[mid] > x)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// A warp per distinct key that is not hot: reduce and update in one pass.
template <class T>
__global__ void update_kernel(UpdateArgs a, int64_t num_keys) {
  const int64_t u = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (u >= num_keys || hot(a, u)) return;
  const int64_t dim = key_dim(a, u);
  update_key<T>(a, u, lane, [&](int64_t base, float (&g)[kPer]) {
    grad_chunk(a, a.occ_offsets[u], a.occ_offsets[u + 1], base, dim, lane, g);
  });
}

// A warp per chunk of a hot key's occurrences: partial sums into its buffer row.
__global__ void hot_chunk_kernel(UpdateArgs a, HotKeys h, int64_t num_keys) {
  const int64_t c = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (c >= h.max_chunks || c >= h.chunk_offsets[num_keys]) return;
  const int64_t u = upper_bound(h.chunk_offsets, num_keys + 1, c) - 1;
  const int64_t i0 = a.occ_offsets[u] + (c - h.chunk_offsets[u]) * kHotChunk;
  const int64_t i1 = i0 + kHotChunk < a.occ_offsets[u + 1] ? i0 + kHotChunk : a.occ_offsets[u + 1];
  const int64_t dim = key_dim(a, u);
  float* row = h.buf + (h.hot_incl[u] - 1) * h.buf_width;
  for (int64_t base = 0; base < dim; base += kChunk) {
    float g[kPer];
    grad_chunk(a, i0, i1, base, dim, lane, g);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = base + lane + k * kWarp;
      if (d < dim) atomicAdd(row + d, g[k]);
    }
  }
}

// A warp per hot key: apply the summed gradient.
template <class T>
__global__ void hot_update_kernel(UpdateArgs a, HotKeys h, int64_t num_keys) {
  const int64_t k = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (num_keys == 0 || k >= h.max_hot || k >= h.hot_incl[num_keys - 1]) return;
  const int64_t u = upper_bound(h.hot_incl, num_keys, k);
  const float* row = h.buf + k * h.buf_width;
  const int64_t dim = key_dim(a, u);
  update_key<T>(a, u, lane,
                [&](int64_t base, float (&g)[kPer]) { load_chunk(row, base, dim, lane, g); });
}

/// Blocks of a launch with one warp per item.
unsigned grid(int64_t warps) { return grid_for(warps * kWarp); }

template <class T>
void pool_forward(const PoolArgs& a, int64_t num_bags, cudaStream_t stream) {
  pool_kernel<T><<<grid(num_bags), kBlock, 0, stream>>>(a, num_bags);
  check_launch("embedding_pool");
}

template <class T>
void update_backward(const UpdateArgs& a, const HotKeys& h, int64_t num_keys, cudaStream_t stream) {
  update_kernel<T><<<grid(num_keys), kBlock, 0, stream>>>(a, num_keys);
  check_launch("embedding_update");
  if (h.max_hot == 0) return;
  hot_chunk_kernel<<<grid(h.max_chunks), kBlock, 0, stream>>>(a, h, num_keys);
  check_launch("embedding_update (hot chunks)");
  hot_update_kernel<T><<<grid(h.max_hot), kBlock, 0, stream>>>(a, h, num_keys);
  check_launch("embedding_update (hot keys)");
}

}  // namespace

void pool_forward(const PoolArgs& a, int64_t num_bags, storage::ElementType type,
                  cudaStream_t stream) {
  if (num_bags == 0) return;
  switch (type) {
    case storage::ElementType::kFloat16:
      return pool_forward<storage::Half>(a, num_bags, stream);
    case storage::ElementType::kBFloat16:
      return pool_forward<storage::BFloat16>(a, num_bags, stream);
    default:
      return pool_forward<float>(a, num_bags, stream);
  }
}

void update_backward(const UpdateArgs& a, const HotKeys& h, int64_t num_keys,
                     storage::ElementType type, cudaStream_t stream) {
  if (num_keys == 0) return;
  switch (type) {
    case storage::ElementType::kFloat16:
      return update_backward<storage::Half>(a, h, num_keys, stream);
    case storage::ElementType::kBFloat16:
      return update_backward<storage::BFloat16>(a, h, num_keys, stream);
    default:
      return update_backward<float>(a, h, num_keys, stream);
  }
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
