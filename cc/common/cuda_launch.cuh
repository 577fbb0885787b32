// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Launch geometry and error checks of the project's CUDA kernels, written once:
// one-dimensional grids of kBlock threads, and errors turned into exceptions
// ("dynamicemb <what> (CUDA): <CUDA's message>") that the torch ops pass on to
// Python. Torch-free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dyn_emb {

/// Threads per block of every one-dimensional launch.
constexpr int kBlock = 256;

/// Lanes of a warp.
constexpr int kWarp = 32;

/// Blocks of `block` threads covering `threads` threads; at least one.
inline unsigned grid_for(int64_t threads, int block = kBlock) {
  const int64_t g = (threads + block - 1) / block;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

/// Blocks of kBlock threads for a grid-stride loop over `threads` threads:
/// grid_for(threads), but at most four waves of the current device's SMs (8
/// blocks each). Starting a block costs time even when its threads have
/// nothing to do (the padding of a batch): past that many blocks, the
/// resident warps take the next items instead.
inline unsigned grid_strided(int64_t threads) {
  static thread_local int device = -1, sms = 0;
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) d = 0;
  if (d != device) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess) sms = 0;
    device = d;
  }
  const unsigned all = grid_for(threads);
  const int64_t cap = static_cast<int64_t>(sms > 0 ? sms : 1) * (2048 / kBlock) * 4;
  return all < cap ? all : static_cast<unsigned>(cap);
}

/// `bytes` rounded up to 256: the alignment of each part of a kernel's
/// scratch layout (one allocation, parts at aligned offsets).
inline size_t scratch_aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Throws std::runtime_error naming `what` unless `e` is cudaSuccess.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dynamicemb ") + what +
                             " (CUDA): " + cudaGetErrorString(e));
  }
}

/// After a kernel launch: throws if the launch failed.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

#if defined(__CUDACC__)
/// This thread's index in a one-dimensional launch.
__device__ __forceinline__ int64_t global_thread() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}

/// Warps of the launch (a grid-stride loop's step, in warps).
__device__ __forceinline__ int64_t launch_warps() {
  return gridDim.x * static_cast<int64_t>(blockDim.x) / kWarp;
}
#endif

}  // namespace dyn_emb
