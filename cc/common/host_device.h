// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The one host-device marker of the project, the few intrinsics whose host
// and device spellings differ, and the small helpers the layers' kernels
// share. Code written with DEMB_HD compiles as inline C++ for the CPU backend
// and as __host__ __device__ functions under nvcc, so both backends run one
// definition.
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

/// Index of the lowest set bit of x (x != 0).
DEMB_HD int ctz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}

/// Leading zero bits of x (32 for 0).
DEMB_HD int clz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(x));
#else
  return x ? __builtin_clz(x) : 32;
#endif
}

/// Set bits of x.
DEMB_HD int popc32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
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

/// a + b clamped to [INT64_MIN, INT64_MAX] instead of wrapping around.
DEMB_HD int64_t add_saturating(int64_t a, int64_t b) {
  if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
  if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
  return a + b;
}

/// Atomically *p = add_saturating(*p, v) (relaxed on the host).
DEMB_HD void atomic_add_saturating(int64_t* p, int64_t v) {
#if defined(__CUDA_ARCH__)
  auto* u = reinterpret_cast<unsigned long long*>(p);
  unsigned long long old = *u, seen;
  do {
    seen = old;
    const int64_t next = add_saturating(static_cast<int64_t>(seen), v);
    old = atomicCAS(u, seen, static_cast<unsigned long long>(next));
  } while (old != seen);
#else
  int64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, add_saturating(old, v), /*weak=*/true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

/// Bits that hold every value in [0, v], at least 1 (a radix sort's end bit).
DEMB_HD int bits_for(int64_t v) {
  int b = 1;
  while (b < 63 && (int64_t{1} << b) <= v) ++b;
  return b;
}

/// The first index i in [0, n) with v[i] > x (v non-decreasing), n if none.
DEMB_HD int64_t upper_bound(const int64_t* v, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (v[mid] > x) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace dyn_emb
