// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/embedding/fp8_rows.h"
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

// Blocks of 4 values of an FP8 row one lane draws (storage::kMaxScaledDim).
constexpr int64_t kScaledBlocksPerLane = (storage::kMaxScaledDim / 4 + kWarp - 1) / kWarp;

// The new FP8 row of `key` at `offset` by one warp (all lanes call it): the
// lanes' blocks of 4 values, kept in registers, for the row's largest
// magnitude, then each block's four codes from one draw (scaled_codes4),
// written as one word; the codes, scale and padding are those
// write_scaled_row (fp8_rows_cpu.h) writes on the CPU.
__device__ void init_scaled_row_warp(const RowInitArgs& a, int64_t offset, int64_t key,
                                     int64_t table, int lane) {
  const int64_t blocks = (a.dim + 3) / 4;
  float v[kScaledBlocksPerLane][4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kScaledBlocksPerLane; ++i) {
    const int64_t blk = lane + i * kWarp;
    if (blk < blocks) {
      init_values4(a.init, key, table, blk, v[i]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (4 * blk + k < a.dim) amax = fmaxf(amax, fabsf(v[i][k]));
      }
    }
  }
  for (int off = kWarp / 2; off > 0; off /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  const float scale = storage::fp8_scale(amax);
  auto* w = reinterpret_cast<storage::Float8E4M3*>(a.space.at(offset));
#pragma unroll
  for (int i = 0; i < kScaledBlocksPerLane; ++i) {
    const int64_t blk = lane + i * kWarp;
    if (blk < blocks) {
      // The padding's codes are 0 (scaled_codes4), written with the word.
      store_codes4(w, 4 * blk,
                   scaled_codes4(v[i], scale, static_cast<uint64_t>(key), 0, blk, a.dim));
    }
  }
  if (lane == 0) *storage::scale_at(w, a.dim) = scale;
}

// A warp per 32 entries: each lane reads its entry's offset, key and table
// ahead, then the warp writes the new rows among them one after another (the
// values passed by shuffle, so a row waits on no load of its own), the lanes
// on consecutive blocks of 4 elements (one draw each for UNIFORM), then on
// consecutive state words. A training step passes every distinct key (most
// not new) and the padding: a warp per entry spent most of its time starting
// warps that had nothing to write.
template <class T>
__global__ void init_rows_at_kernel(RowInitArgs a, int64_t n) {
  const int64_t first = global_thread() / kWarp * kWarp;
  const int lane = threadIdx.x % kWarp;
  if (first >= n) return;  // uniform across the warp
  const int64_t mine = first + lane;
  const int64_t my_offset = mine < n ? a.offsets[mine] : -1;
  const int64_t my_key = my_offset >= 0 ? a.keys[mine] : 0;
  const int64_t my_table = my_offset >= 0 ? a.table_ids[mine] : 0;
  unsigned todo = __ballot_sync(0xffffffffu, my_offset >= 0);
  const int64_t blocks = (init_row_elements<T>(a) + 3) / 4;
  while (todo != 0) {
    const int src = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t offset = __shfl_sync(0xffffffffu, my_offset, src);
    const int64_t key = __shfl_sync(0xffffffffu, my_key, src);
    const int64_t table = __shfl_sync(0xffffffffu, my_table, src);
    if constexpr (storage::Scaled<T>::value) {
      init_scaled_row_warp(a, offset, key, table, lane);
    } else {
      for (int64_t blk = lane; blk < blocks; blk += kWarp) {
        init_row_block<T>(a, offset, key, table, blk);
      }
    }
    for (int64_t s = lane; s < a.state_dim; s += kWarp) init_state_word<T>(a, offset, s);
  }
}

template <class T>
void launch_init_rows_at(const RowInitArgs& a, int64_t n, cudaStream_t stream) {
  init_rows_at_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(a, n);
  check_launch("init_rows_at");
}

}  // namespace

void init_rows_at(const RowInitArgs& a, int64_t n, storage::ElementType type, cudaStream_t stream) {
  if (n == 0) return;
  switch (type) {
    case storage::ElementType::kFloat16:
      return launch_init_rows_at<storage::Half>(a, n, stream);
    case storage::ElementType::kBFloat16:
      return launch_init_rows_at<storage::BFloat16>(a, n, stream);
    case storage::ElementType::kFloat8E4M3:
      return launch_init_rows_at<storage::Float8E4M3>(a, n, stream);
    default:
      return launch_init_rows_at<float>(a, n, stream);
  }
}

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
