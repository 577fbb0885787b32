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
// starts at state_offset(dim, sizeof(T)), a multiple of 4 bytes. The row's
// byte count is value_row_bytes in dynamicemb_config.py (the same rule).
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

#include <cstdint>
#include <cstring>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace storage {

/// Element type of a row's embedding; the values match the order the Python
/// layer passes (storage/layout.py).
enum class ElementType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
constexpr int32_t kNumElementTypes = 3;

/// IEEE 754 binary16, stored as its bits.
struct Half {
  uint16_t bits;
};

/// bfloat16 (the high half of a float32), stored as its bits.
struct BFloat16 {
  uint16_t bits;
};

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
}

DEMB_HD float to_float(BFloat16 b) { return bits_float(static_cast<uint32_t>(b.bits) << 16); }

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

/// Byte offset of the optimizer state in a row: the embedding padded to 4 bytes.
DEMB_HD int64_t state_offset(int64_t dim, int64_t element_size) {
  return (dim * element_size + 3) / 4 * 4;
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
  return reinterpret_cast<float*>(s.at(offset) + state_offset(dim, sizeof(T)));
}

}  // namespace storage
}  // namespace dyn_emb
