// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <stdexcept>
#include <string>

#include "cc/storage/copy_rows_cuda.h"

namespace dyn_emb {
namespace storage {
namespace cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kBlock = 256;

__global__ void copy_rows_kernel(CopyArgs a) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
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
  const int64_t threads = a.n * kWarp;
  copy_rows_kernel<<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dynamicemb copy_rows (CUDA): ") + cudaGetErrorString(e));
  }
}

}  // namespace cuda
}  // namespace storage
}  // namespace dyn_emb
