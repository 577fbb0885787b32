// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/fp8_rows_cpu.h"

#include <array>
#include <cmath>
#include <cstring>

#include "cc/common/host_device.h"
#include "cc/embedding/cpu_features.h"
#include "cc/embedding/fp8_rows.h"
#include "cc/embedding/optimizer_cpu.h"
#include "cc/embedding/philox.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from a register left undefined on
// purpose (_mm512_undefined_epi32), which -W(maybe-)uninitialized reports in
// the header wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace dyn_emb {
namespace embedding {
namespace cpu {

namespace {

// The draws of one row, one after another (philox.h: stochastic_bits).
void stochastic_bits_scalar(const StochasticDraws& r, int64_t n, uint32_t* bits) {
  for (int64_t j = 0; j * kBitsPerDraw < n; ++j) {
    const Philox4 p = philox(static_cast<uint32_t>(j), r.c1, r.c2, r.c3, r.k0, r.k1);
    for (int w = 0; w < kBitsPerDraw && j * kBitsPerDraw + w < n; ++w) {
      bits[j * kBitsPerDraw + w] = p.v[w];
    }
  }
}

#if defined(__x86_64__)

// Eight Philox states, one a lane: counter words c0..c3.
struct Lanes8 {
  __m256i c0, c1, c2, c3;
};

// A Philox round's vector operations on eight 32-bit lanes (AVX2) and on
// sixteen (AVX-512), by overload, so that the rounds are written once.
__attribute__((target("avx2"))) inline __m256i mul_even(__m256i a, uint32_t m) {
  return _mm256_mul_epu32(a, _mm256_set1_epi64x(m));
}
__attribute__((target("avx512f"))) inline __m512i mul_even(__m512i a, uint32_t m) {
  return _mm512_mul_epu32(a, _mm512_set1_epi64(m));
}
__attribute__((target("avx2"))) inline __m256i shift64(__m256i a, int left) {
  return left ? _mm256_slli_epi64(a, 32) : _mm256_srli_epi64(a, 32);
}
__attribute__((target("avx512f"))) inline __m512i shift64(__m512i a, int left) {
  return left ? _mm512_slli_epi64(a, 32) : _mm512_srli_epi64(a, 32);
}
// The even lanes of `even`, the odd lanes of `odd`.
__attribute__((target("avx2"))) inline __m256i even_odd(__m256i even, __m256i odd) {
  return _mm256_blend_epi32(even, odd, 0xaa);
}
__attribute__((target("avx512f"))) inline __m512i even_odd(__m512i even, __m512i odd) {
  return _mm512_mask_blend_epi32(0xaaaa, even, odd);
}
// a ^ b ^ key in every lane.
__attribute__((target("avx2"))) inline __m256i xor_key(__m256i a, __m256i b, uint32_t key) {
  return _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_set1_epi32(static_cast<int>(key)));
}
__attribute__((target("avx512f"))) inline __m512i xor_key(__m512i a, __m512i b, uint32_t key) {
  return _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_set1_epi32(static_cast<int>(key)));
}

// The templates below hold vectors without a vector target of their own:
// always inlined into a caller that has one, no call passes them, so the
// ABI -Wpsabi warns of is never used.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

// The rounds of G groups of draws at once, one a lane of State's vectors
// c0..c3 (Lanes8, Lanes16), interleaved: each round's multiplies wait on
// the one before, and the groups' chains fill that wait. The even lanes
// multiply into 64-bit products; the odd lanes go through it shifted down.
// Inlined into each width's caller, which gives it its vector target.
template <class State, int G>
__attribute__((always_inline)) inline void philox_rounds_lanes(State (&x)[G], uint32_t k0,
                                                               uint32_t k1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    for (int g = 0; g < G; ++g) {
      State& s = x[g];
      const auto p1e = mul_even(s.c2, kPhiloxM1), p1o = mul_even(shift64(s.c2, 0), kPhiloxM1);
      const auto p0e = mul_even(s.c0, kPhiloxM0), p0o = mul_even(shift64(s.c0, 0), kPhiloxM0);
      s.c0 = xor_key(even_odd(shift64(p1e, 0), p1o), s.c1, k0);
      s.c1 = even_odd(p1e, shift64(p1o, 1));
      s.c2 = xor_key(even_odd(shift64(p0e, 0), p0o), s.c3, k1);
      s.c3 = even_odd(p0e, shift64(p0o, 1));
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The words of eight draws (lane d of c0..c3: draw d's words) into `take`
// entries of bits in element order (element 4d + w: word w of draw d).
__attribute__((target("avx2"))) inline void store_words(const Lanes8& s, int64_t take,
                                                        uint32_t* bits) {
  const __m256i ab_lo = _mm256_unpacklo_epi32(s.c0, s.c1);  // draws 0 1 | 4 5: words 0 1
  const __m256i ab_hi = _mm256_unpackhi_epi32(s.c0, s.c1);  // draws 2 3 | 6 7: words 0 1
  const __m256i cd_lo = _mm256_unpacklo_epi32(s.c2, s.c3);
  const __m256i cd_hi = _mm256_unpackhi_epi32(s.c2, s.c3);
  const __m256i d04 = _mm256_unpacklo_epi64(ab_lo, cd_lo);  // draw 0 | draw 4
  const __m256i d15 = _mm256_unpackhi_epi64(ab_lo, cd_lo);
  const __m256i d26 = _mm256_unpacklo_epi64(ab_hi, cd_hi);
  const __m256i d37 = _mm256_unpackhi_epi64(ab_hi, cd_hi);
  alignas(32) uint32_t out[8 * kBitsPerDraw];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(d04, d15, 0x20));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8),
                     _mm256_permute2x128_si256(d26, d37, 0x20));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out + 16),
                     _mm256_permute2x128_si256(d04, d15, 0x31));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out + 24),
                     _mm256_permute2x128_si256(d26, d37, 0x31));
  std::memcpy(bits, out, static_cast<size_t>(take) * sizeof(uint32_t));
}

// Group `g` of a row's draws: counters 8 g .. 8 g + 7 (lane d: c0 = 8 g + d).
__attribute__((target("avx2"))) inline void draw_group(const StochasticDraws& r, int64_t g,
                                                       Lanes8& out) {
  out = Lanes8{_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                _mm256_set1_epi32(static_cast<int>(8 * g))),
               _mm256_set1_epi32(static_cast<int>(r.c1)), _mm256_set1_epi32(static_cast<int>(r.c2)),
               _mm256_set1_epi32(static_cast<int>(r.c3))};
}

// Sixteen Philox states, one a lane: counter words c0..c3.
struct Lanes16 {
  __m512i c0, c1, c2, c3;
};

// The words of sixteen draws into `take` entries of bits in element order.
// Block i (128 bits) of the unpacked vectors holds draw 4 i + k of d<k>: a
// 4 x 4 transpose of blocks puts the draws in order.
__attribute__((target("avx512f"))) inline void store_words(const Lanes16& s, int64_t take,
                                                           uint32_t* bits) {
  const __m512i ab_lo = _mm512_unpacklo_epi32(s.c0, s.c1);
  const __m512i ab_hi = _mm512_unpackhi_epi32(s.c0, s.c1);
  const __m512i cd_lo = _mm512_unpacklo_epi32(s.c2, s.c3);
  const __m512i cd_hi = _mm512_unpackhi_epi32(s.c2, s.c3);
  const __m512i d0 = _mm512_unpacklo_epi64(ab_lo, cd_lo);  // draws 0, 4, 8, 12
  const __m512i d1 = _mm512_unpackhi_epi64(ab_lo, cd_lo);  // draws 1, 5, 9, 13
  const __m512i d2 = _mm512_unpacklo_epi64(ab_hi, cd_hi);
  const __m512i d3 = _mm512_unpackhi_epi64(ab_hi, cd_hi);
  const __m512i t0 = _mm512_shuffle_i64x2(d0, d1, 0x44);  // d0 blocks 0 1, d1 blocks 0 1
  const __m512i t1 = _mm512_shuffle_i64x2(d2, d3, 0x44);
  const __m512i t2 = _mm512_shuffle_i64x2(d0, d1, 0xee);  // blocks 2 3
  const __m512i t3 = _mm512_shuffle_i64x2(d2, d3, 0xee);
  alignas(64) uint32_t out[16 * kBitsPerDraw];
  _mm512_store_si512(out, _mm512_shuffle_i64x2(t0, t1, 0x88));       // draws 0-3
  _mm512_store_si512(out + 16, _mm512_shuffle_i64x2(t0, t1, 0xdd));  // draws 4-7
  _mm512_store_si512(out + 32, _mm512_shuffle_i64x2(t2, t3, 0x88));
  _mm512_store_si512(out + 48, _mm512_shuffle_i64x2(t2, t3, 0xdd));
  std::memcpy(bits, out, static_cast<size_t>(take) * sizeof(uint32_t));
}

// Group `g` of a row's draws, sixteen a group.
__attribute__((target("avx512f"))) inline void draw_group(const StochasticDraws& r, int64_t g,
                                                          Lanes16& out) {
  out = Lanes16{
      _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_epi32(static_cast<int>(16 * g))),
      _mm512_set1_epi32(static_cast<int>(r.c1)), _mm512_set1_epi32(static_cast<int>(r.c2)),
      _mm512_set1_epi32(static_cast<int>(r.c3))};
}

// The draws of one row, a group of State's lanes at a time (a draw a lane,
// its four words the bits of four elements): two groups at once while more
// than one is left, then the last alone. Inlined into each width's caller,
// which gives it its vector target.
// Elements whose bits a group of State's draws gives: four a 32-bit lane.
template <class State>
constexpr int64_t kGroupBits = sizeof(State::c0) / 4 * kBitsPerDraw;

template <class State, int G>
__attribute__((always_inline)) inline void fill_groups(const StochasticDraws& r, int64_t g,
                                                       int64_t take, uint32_t* bits) {
  constexpr int64_t k = kGroupBits<State>;
  State x[G];
  for (int i = 0; i < G; ++i) draw_group(r, g + i, x[i]);
  philox_rounds_lanes<State, G>(x, r.k0, r.k1);
  for (int i = 0; i < G; ++i) store_words(x[i], i + 1 < G ? k : take, bits + (g + i) * k);
}

template <class State>
__attribute__((always_inline)) inline void stochastic_bits_lanes(const StochasticDraws& r,
                                                                 int64_t n, uint32_t* bits) {
  constexpr int64_t k = kGroupBits<State>;
  int64_t g = 0;
  for (; n - g * k > k; g += 2) {
    const int64_t rest = n - (g + 1) * k;
    fill_groups<State, 2>(r, g, rest < k ? rest : k, bits);
  }
  if (g * k < n) fill_groups<State, 1>(r, g, n - g * k, bits);
}

#pragma GCC diagnostic pop

__attribute__((target("avx2"))) void stochastic_bits_avx2(const StochasticDraws& r, int64_t n,
                                                          uint32_t* bits) {
  stochastic_bits_lanes<Lanes8>(r, n, bits);
}

__attribute__((target("avx512f"))) void stochastic_bits_avx512(const StochasticDraws& r, int64_t n,
                                                               uint32_t* bits) {
  stochastic_bits_lanes<Lanes16>(r, n, bits);
}

// write_codes eight values at a time: each lane's normal-range code as
// fp8_stochastic computes it (20 random bits added below the kept mantissa),
// and the lanes out of that range (below the smallest normal, 448 and up,
// NaN) through fp8_stochastic itself.
__attribute__((target("avx2"))) void write_codes_avx2(storage::Float8E4M3* w, const float* v,
                                                      int64_t dim, float scale,
                                                      const uint32_t* bits) {
  // scale is a power of two (fp8_scale), so v * (1 / scale) is v / scale
  // exactly, a multiply for a divide, wherever 1 / scale is finite; where it
  // is not (a scale below 2^-127), every lane's product is infinite or NaN
  // and goes to fp8_stochastic's division below.
  const __m256 inv = _mm256_set1_ps(1.f / scale);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i smallest_normal = _mm256_set1_epi32(0x3c800000);  // 2^-6
  const __m256i saturated = _mm256_set1_epi32(0x43e00000 - 1);    // below 448
  const __m256i rebias = _mm256_set1_epi32((127 - 7) << 3);
  const __m256i max_code = _mm256_set1_epi32(storage::kFp8MaxCode);
  // The low byte of each 32-bit lane, gathered into the low 4 bytes of each half.
  const __m256i low_bytes =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v + d), inv);
    const __m256i xi = _mm256_castps_si256(x);
    const __m256i u = _mm256_and_si256(xi, magnitude);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(xi, 24), _mm256_set1_epi32(0x80));
    const __m256i r =
        _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + d)), 12);
    __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_add_epi32(u, r), 20), rebias);
    code = _mm256_or_si256(_mm256_min_epu32(code, max_code), sign);
    const __m256i packed = _mm256_shuffle_epi8(code, low_bytes);
    const uint32_t lo = static_cast<uint32_t>(_mm256_extract_epi32(packed, 0));
    const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(packed, 4));
    std::memcpy(w + d, &lo, 4);
    std::memcpy(w + d + 4, &hi, 4);
    const __m256i other =
        _mm256_or_si256(_mm256_cmpgt_epi32(smallest_normal, u), _mm256_cmpgt_epi32(u, saturated));
    int lanes = _mm256_movemask_ps(_mm256_castsi256_ps(other));
    while (lanes != 0) {
      const int k = ctz32(static_cast<uint32_t>(lanes));
      lanes &= lanes - 1;
      w[d + k] = storage::fp8_stochastic(v[d + k] / scale, bits[d + k]);
    }
  }
  for (; d < dim; ++d) w[d] = storage::fp8_stochastic(v[d] / scale, bits[d]);
}

// The largest magnitude of v, as fmaxf over |v[d]| gives it (a NaN is passed
// over: _mm256_max_ps returns its second operand where either is NaN).
__attribute__((target("avx2"))) float row_amax_avx2(const float* v, int64_t dim) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8)
    m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + d), magnitude), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.f;
  for (float x : lanes) amax = fmaxf(amax, x);
  for (; d < dim; ++d) amax = fmaxf(amax, fabsf(v[d]));
  return amax;
}

// Eight codes' values (storage::to_float): a normal code's bits moved into
// float32's fields, a subnormal's mantissa times 2^-9, NaN as NaN.
__attribute__((target("avx2"))) __m256 decode8_avx2(const storage::Float8E4M3* w) {
  const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
  const __m256i em = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal =
      _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32((127 - 7) << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0.001953125f));
  __m256i mag = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub),
                                   _mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
  mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7fc00000),
                           _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f)));
  return _mm256_castsi256_ps(_mm256_or_si256(mag, sign));
}

// out[d] = value(d) * scale, eight at a time.
__attribute__((target("avx2"))) int64_t read_row_avx2(const storage::Float8E4M3* w, int64_t dim,
                                                      float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(decode8_avx2(w + d), s));
  return d;
}

// Eight elements' values of a row, for add_row8: FP8 codes (decode8_avx2),
// float16 (F16C's conversion).
struct Fp8Lanes {
  using Elem = storage::Float8E4M3;
  __attribute__((target("avx2,f16c"))) static __m256 load(const Elem* p) { return decode8_avx2(p); }
};
struct HalfLanes {
  using Elem = storage::Half;
  __attribute__((target("avx2,f16c"))) static __m256 load(const Elem* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

// o[d] += w * value(d), eight at a time (a product, then a sum: no FMA, as
// the scalar loop); returns the elements done.
template <class Lanes>
__attribute__((target("avx2,f16c"))) int64_t add_row8(float* o, float w,
                                                      const typename Lanes::Elem* v, int64_t dim) {
  const __m256 f = _mm256_set1_ps(w);
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(o + d), _mm256_mul_ps(f, Lanes::load(v + d)));
    _mm256_storeu_ps(o + d, sum);
  }
  return d;
}

// The float16 bits of each e4m3 magnitude (a code & 0x7f; 0x7f: NaN), for
// decode32_avx512.
alignas(64) const std::array<uint16_t, 128> kFp8Halves = [] {
  std::array<uint16_t, 128> t{};
  for (int code = 0; code < 128; ++code) {
    const float v = storage::to_float(storage::Float8E4M3{static_cast<uint8_t>(code)});
    if (std::isnan(v)) {
      t[code] = 0x7e00;
    } else if (v != 0.f) {  // 2^-9 .. 448: a normal float16, its mantissa's 3 bits exact
      int e = 0;
      const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
      t[code] =
          static_cast<uint16_t>(((e - 1 + 15) << 10) | static_cast<int>((2.f * m - 1.f) * 1024.f));
    }
  }
  return t;
}();

// Thirty-two codes' values: their magnitudes' float16 bits looked up (two
// 64-entry lookups, bit 6 choosing), the sign or-ed in, then converted.
__attribute__((target("avx512f,avx512bw"))) inline void decode32_avx512(
    const storage::Float8E4M3* w, __m512& lo, __m512& hi) {
  const __m512i* t = reinterpret_cast<const __m512i*>(kFp8Halves.data());
  const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  const __m512i em = _mm512_and_si512(x, _mm512_set1_epi16(0x7f));
  const __m512i below =
      _mm512_permutex2var_epi16(_mm512_load_si512(t), em, _mm512_load_si512(t + 1));
  const __m512i above =
      _mm512_permutex2var_epi16(_mm512_load_si512(t + 2), em, _mm512_load_si512(t + 3));
  __m512i h =
      _mm512_mask_blend_epi16(_mm512_test_epi16_mask(em, _mm512_set1_epi16(0x40)), below, above);
  h = _mm512_or_si512(h, _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// out[d] = value(d) * scale, 32 at a time.
__attribute__((target("avx512f,avx512bw"))) int64_t read_row_avx512(const storage::Float8E4M3* w,
                                                                    int64_t dim, float scale,
                                                                    float* out) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) {
    __m512 lo, hi;
    decode32_avx512(w + d, lo, hi);
    _mm512_storeu_ps(out + d, _mm512_mul_ps(lo, s));
    _mm512_storeu_ps(out + d + 16, _mm512_mul_ps(hi, s));
  }
  return d;
}

// o[d] += w * value(d), 32 at a time (a product, then a sum).
__attribute__((target("avx512f,avx512bw"))) int64_t
add_codes_avx512(float* o, float w, const storage::Float8E4M3* codes, int64_t dim) {
  const __m512 f = _mm512_set1_ps(w);
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) {
    __m512 lo, hi;
    decode32_avx512(codes + d, lo, hi);
    _mm512_storeu_ps(o + d, _mm512_add_ps(_mm512_loadu_ps(o + d), _mm512_mul_ps(f, lo)));
    _mm512_storeu_ps(o + d + 16, _mm512_add_ps(_mm512_loadu_ps(o + d + 16), _mm512_mul_ps(f, hi)));
  }
  return d;
}

#endif

// The codes of the values `v` in a row of scale `scale` (the padding left
// as it is), from bits[d] (stochastic_bits_row).
void write_codes(storage::Float8E4M3* w, const float* v, int64_t dim, float scale,
                 const uint32_t* bits) {
#if defined(__x86_64__)
  if (kAvx2) {
    write_codes_avx2(w, v, dim, scale, bits);
  } else {
#endif
    for (int64_t d = 0; d < dim; ++d) w[d] = storage::fp8_stochastic(v[d] / scale, bits[d]);
#if defined(__x86_64__)
  }
#endif
  *storage::scale_at(w, dim) = scale;
}

float row_amax(const float* v, int64_t dim) {
#if defined(__x86_64__)
  if (kAvx2) return row_amax_avx2(v, dim);
#endif
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) amax = fmaxf(amax, fabsf(v[d]));
  return amax;
}

std::array<float, 256> fp8_values() {
  std::array<float, 256> t{};
  for (int code = 0; code < 256; ++code) {
    t[code] = storage::to_float(storage::Float8E4M3{static_cast<uint8_t>(code)});
  }
  return t;
}

}  // namespace

const std::array<float, 256> kFp8Values = fp8_values();

bool simd_runs(Simd path) {
  switch (path) {
    case Simd::kAvx512:
      return kAvx512;
    case Simd::kAvx2:
      return kAvx2F16c;
    default:
      return true;
  }
}

namespace {

// Whether a call by `path` takes the `way` path: no wider than asked, and
// this CPU runs it.
bool takes(Simd path, Simd way) {
  return static_cast<int>(path) >= static_cast<int>(way) && simd_runs(way);
}

}  // namespace

void philox_words_by(Simd path, const StochasticDraws& r, int64_t n, uint32_t* bits) {
#if defined(__x86_64__)
  if (takes(path, Simd::kAvx512)) return stochastic_bits_avx512(r, n, bits);
  if (takes(path, Simd::kAvx2)) return stochastic_bits_avx2(r, n, bits);
#endif
  stochastic_bits_scalar(r, n, bits);
}

void philox_words(const StochasticDraws& r, int64_t n, uint32_t* bits) {
  philox_words_by(Simd::kAvx512, r, n, bits);
}

void stochastic_bits_row(uint64_t key, int64_t step, int64_t n, uint32_t* bits) {
  philox_words(stochastic_draws(key, step), n, bits);
}

void read_scaled_row_by(Simd path, const storage::Float8E4M3* w, int64_t dim, float* out) {
  const float scale = *storage::scale_at(w, dim);
  int64_t d = 0;
#if defined(__x86_64__)
  if (takes(path, Simd::kAvx512)) d = read_row_avx512(w, dim, scale, out);
  if (takes(path, Simd::kAvx2)) d += read_row_avx2(w + d, dim - d, scale, out + d);
#endif
  for (; d < dim; ++d) out[d] = kFp8Values[w[d].bits] * scale;
}

void read_scaled_row(const storage::Float8E4M3* w, int64_t dim, float* out) {
  read_scaled_row_by(Simd::kAvx512, w, dim, out);
}

void add_codes_by(Simd path, float* o, float w, const storage::Float8E4M3* codes, int64_t dim) {
  int64_t d = 0;
#if defined(__x86_64__)
  if (takes(path, Simd::kAvx512)) d = add_codes_avx512(o, w, codes, dim);
  if (takes(path, Simd::kAvx2)) d += add_row8<Fp8Lanes>(o + d, w, codes + d, dim - d);
#endif
  for (; d < dim; ++d) o[d] += w * kFp8Values[codes[d].bits];
}

void add_codes(float* o, float w, const storage::Float8E4M3* codes, int64_t dim) {
  add_codes_by(Simd::kAvx512, o, w, codes, dim);
}

void add_halves(float* o, float w, const storage::Half* v, int64_t dim) {
  int64_t d = 0;
#if defined(__x86_64__)
  if (kAvx2F16c) d = add_row8<HalfLanes>(o, w, v, dim);
#endif
  for (; d < dim; ++d) o[d] += w * storage::to_float(v[d]);
}

void write_scaled_row(storage::Float8E4M3* w, const float* v, int64_t dim, uint64_t key,
                      int64_t step, uint32_t* bits) {
  stochastic_bits_row(key, step, dim, bits);
  write_codes(w, v, dim, storage::fp8_scale(row_amax(v, dim)), bits);
  for (int64_t d = dim; d < storage::pad4(dim); ++d) w[d] = storage::Float8E4M3{0};
}

void update_scaled_row(const OptimArgs& a, storage::Float8E4M3* w, float* s, const float* g,
                       int64_t dim, uint64_t key, int64_t step, float* tmp, uint32_t* bits) {
  read_scaled_row(w, dim, tmp);
  update_float_row(a, tmp, s, g, dim);
  stochastic_bits_row(key, step, dim, bits);
  write_codes(w, tmp, dim, storage::fp8_scale(row_amax(tmp, dim)), bits);
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
