// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// What the CPU's vector loops may use, asked of the CPU once: the AVX2 paths
// (x86-64 only), F16C's half-precision conversion beside them, and AVX-512's
// F and BW instructions (the Philox draws, the FP8 codes' values).
#pragma once

namespace dyn_emb {
namespace embedding {
namespace cpu {

#if defined(__x86_64__)
inline bool ask_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
inline const bool kAvx2 = ask_avx2();
inline const bool kAvx2F16c = kAvx2 && __builtin_cpu_supports("f16c");
inline const bool kAvx512 =
    kAvx2F16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
inline constexpr bool kAvx2 = false;
inline constexpr bool kAvx2F16c = false;
inline constexpr bool kAvx512 = false;
#endif

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
