// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/common/cuda_launch.cuh"
#include "cc/storage/copy_rows_cuda.h"

namespace dyn_emb {
namespace storage {
namespace cuda {

namespace {

// A warp per row, 4-byte words (offsets and byte counts are multiples of 4).
__global__ void copy_rows_kernel(CopyArgs a) {
  const int64_t i = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (i >= a.n || !copies(a, i)) return;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(a.src.at(a.src_offsets[i]));
  uint32_t* dst = reinterpret_cast<uint32_t*>(a.dst.at(a.dst_offsets[i]));
  const int64_t words = a.bytes[i] / 4;
  for (int64_t w = lane; w < words; w += kWarp) dst[w] = src[w];
}

}  // namespace

void copy_rows(const CopyArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  copy_rows_kernel<<<grid_for(a.n * kWarp), kBlock, 0, stream>>>(a);
  check_launch("copy_rows");
}

}  // namespace cuda
}  // namespace storage
}  // namespace dyn_emb
