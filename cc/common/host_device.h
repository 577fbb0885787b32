// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The one host-device marker of the project, and the few intrinsics whose host
// and device spellings differ. Code written with DEMB_HD compiles as inline C++
// for the CPU backend and as __host__ __device__ functions under nvcc, so both
// backends run one definition.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DEMB_HD __host__ __device__ __forceinline__
#else
#define DEMB_HD inline
#endif

namespace dyn_emb {

/// Index of the lowest set bit of x (x != 0).
DEMB_HD int ctz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

/// Atomically adds v to *p (relaxed on the host); returns the old value.
DEMB_HD int64_t atomic_add_i64(int64_t* p, int64_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(
      atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v)));
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

}  // namespace dyn_emb
