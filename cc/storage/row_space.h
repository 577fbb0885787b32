// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Where value rows are, as the pooling kernels and the row moves see them: one
// definition for the CPU loops and the CUDA kernels.
//
// # A row
//
// A row of a table of embedding width `dim` and element type T is
//
//   [ embedding: dim elements of T | padding to 4 bytes | optimizer state: float32 ]
//
// T is float32, IEEE binary16 or bfloat16. Arithmetic is float32: a kernel
// reads an element with to_float, computes, and writes it back with
// from_float<T> (round to nearest, ties to even). The optimizer state always
// starts at embedding_bytes<T>(dim), a multiple of 4 bytes. The row's byte
// count is value_row_bytes in dynamicemb_config.py (the same rule).
//
// # FP8 rows
//
// A row of FP8 elements (Float8E4M3: e4m3fn, 1 sign, 4 exponent and 3
// mantissa bits, largest 448, no infinity) carries its scale, a float32 power
// of two, after the padded elements:
//
//   [ dim e4m3 codes | padding to 4 bytes | float32 scale | optimizer state ]
//
// Element d's value is to_float(code_d) * scale. A write of the row computes
// the new values in float32, then the scale (fp8_scale: the power of two that
// puts the row's largest magnitude in (224, 448]), then each code by
// stochastic rounding (fp8_stochastic): rounded up with the probability of the
// value's distance from the code below, so that a change smaller than half a
// step is kept on average. A power-of-two scale changes no code's precision:
// a row whose largest value moves past a power of two keeps the rest as
// they were.
//
// # A row space
//
// The rows a kernel may touch are addressed by byte offset into two segments:
// offsets in [0, size0) are in seg0, offsets in [size0, size0 + size1) at
// offset - size0 in seg1. The storage layer decides what the segments are (a
// table's device and host rows, or a device cache and a batch's overflow
// rows); seg1 may be host memory mapped into the device's address space.
// Offset -1 means "no row". Every offset is a multiple of 4.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace storage {

/// Element type of a row's embedding; the values match the order the Python
/// layer passes (storage/layout.py).
enum class ElementType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat8E4M3 = 3 };
constexpr int32_t kNumElementTypes = 4;

/// IEEE 754 binary16, stored as its bits.
struct Half {
  uint16_t bits;
};

/// bfloat16 (the high half of a float32), stored as its bits.
struct BFloat16 {
  uint16_t bits;
};

/// e4m3fn (OCP FP8 E4M3, PyTorch's float8_e4m3fn), stored as its bits.
struct Float8E4M3 {
  uint8_t bits;
};

/// Whether a row of T carries a scale (see "FP8 rows").
template <class T>
struct Scaled {
  static constexpr bool value = false;
};
template <>
struct Scaled<Float8E4M3> {
  static constexpr bool value = true;
};

/// The largest dim of an FP8 row: a GPU warp updates one with its new values
/// in registers until the row's scale is known (cc/embedding/warp_update.cuh).
constexpr int64_t kMaxScaledDim = 512;

/// The largest e4m3fn magnitude, and its code (0.1111.110).
constexpr float kFp8Max = 448.f;
constexpr uint8_t kFp8MaxCode = 0x7e;
/// The e4m3fn NaN code (S.1111.111).
constexpr uint8_t kFp8NaN = 0x7f;
static_assert(kFp8Max == 1.75f * 256.f, "e4m3fn's largest value: mantissa 1.75, exponent 8");

DEMB_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

DEMB_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

DEMB_HD float to_float(float x) { return x; }

DEMB_HD float to_float(Half h) {
#if defined(__CUDA_ARCH__)
  // The hardware's conversion (exact, as below): one instruction without
  // branches, so the compiler keeps a row's loads in flight together as it
  // does for bfloat16 (the branches below cut a pooling kernel's unrolling).
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
#else
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
#endif
}

DEMB_HD float to_float(BFloat16 b) { return bits_float(static_cast<uint32_t>(b.bits) << 16); }

DEMB_HD float to_float(Float8E4M3 q) {
  const uint32_t sign = static_cast<uint32_t>(q.bits & 0x80u) << 24;
  const uint32_t exp = (q.bits >> 3) & 0xfu;
  const uint32_t mant = q.bits & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-9, exact in float32.
    const float v = static_cast<float>(mant) * 0.001953125f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + (127 - 7)) << 23) | (mant << 20));
}

template <class T>
DEMB_HD T from_float(float x);

template <>
DEMB_HD float from_float<float>(float x) {
  return x;
}

/// Round to nearest even; overflow gives infinity, NaN stays a (quiet) NaN.
template <>
DEMB_HD Half from_float<Half>(float x) {
  uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) {  // |x| >= 65536 (rounds to inf), inf or NaN
    return Half{static_cast<uint16_t>(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  }
  if (u < 0x38800000u) {
    // Below the smallest normal half (2^-14): add 0.5f, whose unit in the
    // last place is 2^-24 (a half subnormal step), so the float addition
    // rounds to nearest even; the low mantissa bits are then the half.
    const float sum = bits_float(u) + 0.5f;
    return Half{static_cast<uint16_t>(sign | (float_bits(sum) - 0x3f000000u))};
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even (a
  // carry into the exponent is right, up to infinity for [65520, 65536)).
  const uint32_t odd = (u >> 13) & 1u;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return Half{static_cast<uint16_t>(sign | (u >> 13))};
}

/// Round to nearest even; NaN stays a (quiet) NaN.
template <>
DEMB_HD BFloat16 from_float<BFloat16>(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  return BFloat16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

/// Round to nearest even; a magnitude past 448 saturates to 448 (e4m3fn has
/// no infinity), NaN stays NaN.
template <>
DEMB_HD Float8E4M3 from_float<Float8E4M3>(float x) {
  uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return Float8E4M3{static_cast<uint8_t>(sign | kFp8NaN)};
  if (u >= 0x43e00000u) return Float8E4M3{static_cast<uint8_t>(sign | kFp8MaxCode)};  // >= 448
  if (u < 0x3c800000u) {
    // Below the smallest normal (2^-6): a multiple of 2^-9, rounded to even
    // (|x| * 512 is exact; 8 is the code of 2^-6).
    const float m = bits_float(u) * 512.f;
    const float r = rintf(m);
    return Float8E4M3{static_cast<uint8_t>(sign | static_cast<uint32_t>(r))};
  }
  // Normal: round the 20 dropped mantissa bits to nearest even (a carry into
  // the exponent is right), rebias the exponent.
  const uint32_t odd = (u >> 20) & 1u;
  const uint32_t code = ((u + 0x7ffffu + odd) >> 20) - ((127u - 7u) << 3);
  return Float8E4M3{static_cast<uint8_t>(sign | (code > kFp8MaxCode ? kFp8MaxCode : code))};
}

/// Stochastic rounding to e4m3fn: `x` rounded away from zero with the
/// probability of its distance from the code toward zero, in steps of the
/// code's (`random`: 32 uniform bits); unbiased for |x| <= 448. Saturates to
/// 448, NaN stays NaN.
DEMB_HD Float8E4M3 fp8_stochastic(float x, uint32_t random) {
  uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return Float8E4M3{static_cast<uint8_t>(sign | kFp8NaN)};
  if (u >= 0x43e00000u) return Float8E4M3{static_cast<uint8_t>(sign | kFp8MaxCode)};
  if (u < 0x3c800000u) {
    // Subnormal steps of 2^-9: the fraction of a step has at most 21 bits,
    // so fraction * 2^32 is an exact integer to compare the random bits with.
    const float m = bits_float(u) * 512.f;
    const float below = floorf(m);
    const uint32_t threshold = static_cast<uint32_t>((m - below) * 4294967296.f);
    const uint32_t code = static_cast<uint32_t>(below) + (random < threshold ? 1u : 0u);
    return Float8E4M3{static_cast<uint8_t>(sign | code)};
  }
  // Normal: 20 random bits added below the kept mantissa carry into it with
  // the probability of the dropped bits' value.
  const uint32_t code = ((u + (random >> 12)) >> 20) - ((127u - 7u) << 3);
  return Float8E4M3{static_cast<uint8_t>(sign | (code > kFp8MaxCode ? kFp8MaxCode : code))};
}

/// The scale of an FP8 row whose largest magnitude is `amax`: the power of
/// two s with amax / s in (224, 448]; 1 for a row of zeros (or not finite).
DEMB_HD float fp8_scale(float amax) {
  if (!(amax > 0.f) || !(amax <= 3.402823466e38f)) return 1.f;
  int e = 0;
  const float m = frexpf(amax / kFp8Max, &e);  // amax / 448 = m * 2^e, m in [0.5, 1)
  return ldexpf(1.f, m == 0.5f ? e - 1 : e);
}

/// Bytes of `bytes` rounded up to a multiple of 4.
DEMB_HD int64_t pad4(int64_t bytes) { return (bytes + 3) / 4 * 4; }

/// Bytes of a row's embedding part: its elements padded to 4 bytes, and the
/// scale of a scaled (FP8) row; the optimizer state starts there.
template <class T>
DEMB_HD int64_t embedding_bytes(int64_t dim) {
  return pad4(dim * static_cast<int64_t>(sizeof(T))) + (Scaled<T>::value ? 4 : 0);
}

/// The element size of a type, in bytes.
DEMB_HD int64_t element_size(ElementType type) {
  return type == ElementType::kFloat32 ? 4 : type == ElementType::kFloat8E4M3 ? 1 : 2;
}

/// embedding_bytes for an element type known at run time.
DEMB_HD int64_t embedding_bytes(int64_t dim, ElementType type) {
  return pad4(dim * element_size(type)) + (type == ElementType::kFloat8E4M3 ? 4 : 0);
}

/// The scale word of a scaled row whose `dim` elements start at `w`.
template <class T>
DEMB_HD float* scale_at(T* w, int64_t dim) {
  return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(w) +
                                  pad4(dim * static_cast<int64_t>(sizeof(T))));
}
template <class T>
DEMB_HD const float* scale_at(const T* w, int64_t dim) {
  return reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(w) +
                                        pad4(dim * static_cast<int64_t>(sizeof(T))));
}

/// The factor of a row's elements: its scale for a scaled row, else 1.
template <class T>
DEMB_HD float row_scale(const T* w, int64_t dim) {
  if constexpr (Scaled<T>::value) {
    return *scale_at(w, dim);
  } else {
    return 1.f;
  }
}

/// Two segments of rows addressed by byte offset (see the top of the file).
struct RowSpace {
  uint8_t* seg0 = nullptr;
  int64_t size0 = 0;  ///< bytes of seg0
  uint8_t* seg1 = nullptr;
  int64_t size1 = 0;  ///< bytes of seg1

  DEMB_HD uint8_t* at(int64_t offset) const {
    return offset < size0 ? seg0 + offset : seg1 + (offset - size0);
  }
  DEMB_HD int64_t size() const { return size0 + size1; }
  /// Whether `bytes` bytes at `offset` lie inside one segment.
  DEMB_HD bool holds(int64_t offset, int64_t bytes) const {
    if (offset < 0 || bytes < 0) return false;
    if (offset < size0) return offset + bytes <= size0;
    return offset - size0 + bytes <= size1;
  }
};

/// The embedding of the row at `offset` (4-byte aligned), as T.
template <class T>
DEMB_HD T* embedding_at(const RowSpace& s, int64_t offset) {
  return reinterpret_cast<T*>(s.at(offset));
}

/// The optimizer state of the row at `offset` whose embedding has `dim` T's.
template <class T>
DEMB_HD float* state_at(const RowSpace& s, int64_t offset, int64_t dim) {
  return reinterpret_cast<float*>(s.at(offset) + embedding_bytes<T>(dim));
}

}  // namespace storage
}  // namespace dyn_emb
