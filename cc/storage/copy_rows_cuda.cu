// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <cstdint>

#include "cc/common/cuda_launch.cuh"
#include "cc/storage/copy_rows_cuda.h"

namespace dyn_emb {
namespace storage {
namespace cuda {

namespace {

// Words each lane loads before it stores any: with 16-byte words a warp has
// 2 KiB of a row in flight, a whole row of most tables (a row of dim 128 and
// Adam's state is 1.5 KiB). Rows in pinned host memory are read over the bus,
// whose latency only many loads in flight hide.
constexpr int kInFlight = 4;

// Copies `words` words of W from src to dst, a warp's lanes taking every
// 32nd word, kInFlight loads issued before the stores.
template <class W>
__device__ __forceinline__ void copy_words(const W* __restrict__ src, W* __restrict__ dst,
                                           int64_t words, int lane) {
  for (int64_t base = lane; base < words; base += kWarp * kInFlight) {
    W v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t w = base + k * kWarp;
      if (w < words) v[k] = src[w];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t w = base + k * kWarp;
      if (w < words) dst[w] = v[k];
    }
  }
}

// A warp per row (grid-strided over the rows): 16-byte words when both
// addresses and the byte count are multiples of 16 (every row of a table
// whose row bytes are, in segments the allocators align), else 4-byte words
// (offsets and byte counts are multiples of 4).
__global__ void copy_rows_kernel(CopyArgs a) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t i = global_thread() / kWarp; i < a.n; i += launch_warps()) {
    if (!copies(a, i)) continue;
    const uint8_t* src = a.src.at(a.src_offsets[i]);
    uint8_t* dst = a.dst.at(a.dst_offsets[i]);
    const int64_t bytes = a.bytes[i];
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
          static_cast<uintptr_t>(bytes)) &
         15u) == 0) {
      copy_words(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), bytes / 16,
                 lane);
    } else {
      copy_words(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst),
                 bytes / 4, lane);
    }
  }
}

__global__ void slot_rows_kernel(SlotRowsArgs a) {
  const int64_t i = global_thread();
  if (i < a.n) slot_row(a, i);
}

}  // namespace

void copy_rows(const CopyArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  copy_rows_kernel<<<grid_strided(a.n * kWarp), kBlock, 0, stream>>>(a);
  check_launch("copy_rows");
}

void slot_rows(const SlotRowsArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  slot_rows_kernel<<<grid_for(a.n), kBlock, 0, stream>>>(a);
  check_launch("slot_rows");
}

}  // namespace cuda
}  // namespace storage
}  // namespace dyn_emb
