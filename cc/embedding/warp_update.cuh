// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// One warp updates one row: the optimizer's per-coordinate rule (optimizer.h)
// spread over the lanes, shared by the plain optimizer step and
// embedding_update (CUDA only).
#pragma once

#include <cstdint>

#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

// Rows are handled in chunks of kChunk coordinates: lane l owns coordinates
// base + l + 32 k (k < kPer) of a chunk, so a warp reads a row's chunk in
// coalesced 128-byte pieces and keeps kPer values in registers.
constexpr int kPer = 4;
constexpr int64_t kChunk = kWarp * kPer;

/// The lane's coordinates of the chunk at `base` of a dense row of `dim`
/// floats (zeros past the end).
__device__ __forceinline__ void load_chunk(const float* row, int64_t base, int64_t dim, int lane,
                                           float (&g)[kPer]) {
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = base + lane + k * kWarp;
    g[k] = d < dim ? row[d] : 0.f;
  }
}

/// Updates a row (its dim weights `w` of T, its state `s`) with one warp;
/// fill(base, g) writes the lane's coordinates of the gradient's chunk at
/// `base` into g. Row-wise Adagrad first sums the row's squared gradient
/// across the warp, before any coordinate changes. All lanes must call it.
template <class T, class Fill>
__device__ void warp_update_row(const OptimArgs& optim, T* w, float* s, int64_t dim, int lane,
                                const Fill& fill) {
  using storage::from_float;
  using storage::to_float;
  RowFactors rf;
  float g[kPer];
  if (static_cast<OptimType>(optim.type) == OptimType::kExactRowwiseAdagrad) {
    float sq = 0.f;
    for (int64_t base = 0; base < dim; base += kChunk) {
      fill(base, g);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = base + lane + k * kWarp;
        if (d < dim) sq += rowwise_sq(optim, to_float(w[d]), g[k]);
      }
    }
    for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    const float s0 = s[0] + (dim > 0 ? sq / static_cast<float>(dim) : 0.f);
    rf = rowwise_factors(optim, s0);
    __syncwarp();
    if (lane == 0) s[0] = s0;
  }
  for (int64_t base = 0; base < dim; base += kChunk) {
    fill(base, g);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = base + lane + k * kWarp;
      if (d < dim) {
        float wd = to_float(w[d]);
        update_coord(optim, wd, s, g[k], d, dim, rf);
        w[d] = from_float<T>(wd);
      }
    }
  }
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
