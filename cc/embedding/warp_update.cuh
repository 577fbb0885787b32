// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// One warp updates one row: the optimizer's per-coordinate rule (optimizer.h)
// spread over the lanes, shared by the plain optimizer step and
// embedding_update (CUDA only).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/fp8_rows.h"
#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

// Rows are handled in chunks of kChunk coordinates, kPer of them per lane:
// lane l owns coordinates base + l + 32 k (k < kPer) of a chunk, so a warp
// reads a chunk in coalesced 128-byte pieces of any element type; or
// ("vectorized") base + 4 l + k: for float32 rows whose coordinates start
// 16-byte aligned each lane reads its coordinates with one 16-byte load, and
// an FP8 row's lane reads its four codes as one word and rounds them with
// one draw (scaled_codes4).
constexpr int kPer = 4;
constexpr int64_t kChunk = kWarp * kPer;

/// The lane's coordinate k of the chunk at `base`.
template <bool Vec>
__device__ __forceinline__ int64_t lane_coord(int64_t base, int lane, int k) {
  return Vec ? base + 4 * lane + k : base + lane + k * kWarp;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

/// Whether rows of T can be updated vectorized (float32 and FP8), and
/// whether they always are (FP8: a lane's codes are read a byte at a time
/// where the row is not 4-byte aligned).
template <class T>
constexpr bool kVecType = std::is_same_v<T, float> || storage::Scaled<T>::value;
template <class T>
constexpr bool kAlwaysVec = storage::Scaled<T>::value;

/// Whether a row of `dim` T's at `w` is updated vectorized: float32, dim a
/// multiple of 4, 16-byte aligned; any FP8 row.
template <class T>
__device__ __forceinline__ bool vectorized(const T* w, int64_t dim) {
  if constexpr (std::is_same_v<T, float>) {
    return dim % 4 == 0 && aligned16(w);
  } else {
    return kAlwaysVec<T>;
  }
}

/// The lane's coordinates of the chunk at `base` of a dense row of `dim`
/// floats (zeros past the end); with Vec, one 16-byte load when the lane's
/// four coordinates are inside the row and aligned.
template <bool Vec>
__device__ __forceinline__ void load_chunk(const float* row, int64_t base, int64_t dim, int lane,
                                           float (&g)[kPer]) {
  if constexpr (Vec) {
    const int64_t d0 = base + 4 * lane;
    if (d0 + 3 < dim && aligned16(row + d0)) {
      const float4 v = *reinterpret_cast<const float4*>(row + d0);
      g[0] = v.x, g[1] = v.y, g[2] = v.z, g[3] = v.w;
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane_coord<Vec>(base, lane, k);
    g[k] = d < dim ? row[d] : 0.f;
  }
}

/// The row factors of the update of a row by one warp (its elements'
/// values to_float(w[d]) * scale): for a row-wise optimizer (is_rowwise),
/// the row's mean squared gradient summed across the warp and its state
/// advanced (row_step) before any coordinate changes; nothing for the other
/// optimizers. All lanes must call it.
template <class T, bool Vec, class Fill>
__device__ RowFactors warp_row_factors(const OptimArgs& optim, const T* w, float* s, int64_t dim,
                                       int lane, const Fill& fill, float scale) {
  RowFactors rf;
  if (!is_rowwise(optim.type)) return rf;
  float g[kPer];
  float sq = 0.f;
  for (int64_t base = 0; base < dim; base += kChunk) {
    fill(base, g);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane_coord<Vec>(base, lane, k);
      if (d < dim) sq += rowwise_sq(optim, storage::to_float(w[d]) * scale, g[k]);
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
  float next[kRowStateFloats];
  rf = row_step(optim, s, dim > 0 ? sq / static_cast<float>(dim) : 0.f, next);
  __syncwarp();  // every lane has read the state
  if (lane == 0) {
    for (int64_t i = 0; i < kRowStateFloats; ++i) s[i] = next[i];
  }
  return rf;
}

/// Chunks of an FP8 row's new values a warp keeps in its lanes' registers
/// until the row's scale is known: up to storage::kMaxScaledDim values.
constexpr int kMaxScaledChunks = 4;
static_assert(kMaxScaledChunks * kChunk >= storage::kMaxScaledDim,
              "a warp holds an FP8 row of the largest dim in registers");

/// update_scaled_row (fp8_rows_cpu.h) by one warp, vectorized (lane l owns
/// coordinates base + 4 l + k): the new values in registers, their largest
/// magnitude across the warp, then each lane's four codes from one draw as
/// one word. The same codes as on the CPU for the same row, gradient and key.
/// dim <= storage::kMaxScaledDim; all lanes must call it.
template <bool Vec, class Fill>
__device__ void warp_update_scaled_row(const OptimArgs& optim, storage::Float8E4M3* w, float* s,
                                       int64_t dim, int lane, const Fill& fill, uint64_t key,
                                       int64_t step) {
  static_assert(Vec, "an FP8 row is updated vectorized (kAlwaysVec)");
  float* scale = storage::scale_at(w, dim);
  const float old = *scale;
  const RowFactors rf =
      warp_row_factors<storage::Float8E4M3, true>(optim, w, s, dim, lane, fill, old);
  float g[kPer];
  float x[kMaxScaledChunks][kPer];
  float amax = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxScaledChunks; ++c) {
    const int64_t base = c * kChunk;
    const int64_t d0 = base + 4 * lane;
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[c][k] = 0.f;
    if (base < dim) {  // uniform across the warp
      fill(base, g);
      if (d0 < dim) {
        float q[kPer];
        load_codes4(w, d0, dim, q);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          if (d0 + k < dim) {
            float wd = q[k] * old;
            update_coord(optim, wd, s, g[k], d0 + k, dim, rf);
            x[c][k] = wd;
            amax = fmaxf(amax, fabsf(wd));
          }
        }
      }
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  const float sc = storage::fp8_scale(amax);
  __syncwarp();  // every lane has read the old codes and scale
#pragma unroll
  for (int c = 0; c < kMaxScaledChunks; ++c) {
    const int64_t d0 = c * kChunk + 4 * lane;
    if (d0 < dim) store_codes4(w, d0, scaled_codes4(x[c], sc, key, step, d0 / 4, dim));
  }
  if (lane == 0) *scale = sc;
}

/// warp_update_row of a row of float32, float16 or bfloat16.
template <class T, bool Vec, class Fill>
__device__ void update_unscaled_row(const OptimArgs& optim, T* w, float* s, int64_t dim, int lane,
                                    const Fill& fill) {
  using storage::from_float;
  using storage::to_float;
  const RowFactors rf = warp_row_factors<T, Vec>(optim, w, s, dim, lane, fill, 1.f);
  float g[kPer];
  for (int64_t base = 0; base < dim; base += kChunk) {
    fill(base, g);
    if constexpr (Vec) {
      // float32, dim % 4 == 0, w aligned: the lane's 4 weights in one load.
      const int64_t d0 = base + 4 * lane;
      if (d0 < dim) {
        float4 v = *reinterpret_cast<const float4*>(w + d0);
        float x[kPer] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < kPer; ++k) update_coord(optim, x[k], s, g[k], d0 + k, dim, rf);
        v.x = x[0], v.y = x[1], v.z = x[2], v.w = x[3];
        *reinterpret_cast<float4*>(w + d0) = v;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane_coord<false>(base, lane, k);
        if (d < dim) {
          float wd = to_float(w[d]);
          update_coord(optim, wd, s, g[k], d, dim, rf);
          w[d] = from_float<T>(wd);
        }
      }
    }
  }
}

/// Updates a row (its dim weights `w` of T, its state `s`) with one warp;
/// fill(base, g) writes the lane's coordinates (lane_coord<Vec>) of the
/// gradient's chunk at `base` into g. Vec needs vectorized(w, dim); an FP8
/// row needs Vec (kAlwaysVec).
/// A row-wise optimizer (is_rowwise) first sums the row's squared gradient
/// across the warp, before any coordinate changes. An FP8 row goes to warp_update_scaled_row
/// (`key`, `step`: its stochastic rounding's). All lanes must call it.
template <class T, bool Vec = false, class Fill>
__device__ void warp_update_row(const OptimArgs& optim, T* w, float* s, int64_t dim, int lane,
                                const Fill& fill, uint64_t key = 0, int64_t step = 0) {
  if constexpr (storage::Scaled<T>::value) {
    warp_update_scaled_row<Vec>(optim, w, s, dim, lane, fill, key, step);
  } else {
    (void)key;
    (void)step;
    update_unscaled_row<T, Vec>(optim, w, s, dim, lane, fill);
  }
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
