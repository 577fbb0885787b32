// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/storage/row_space.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace dyn_emb {
namespace storage {
namespace {

float f32(uint32_t bits) { return bits_float(bits); }

TEST(HalfTest, EveryHalfSurvivesTheRoundTrip) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const Half h{static_cast<uint16_t>(b)};
    const float f = to_float(h);
    const Half back = from_float<Half>(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(back))) << b;
    } else {
      EXPECT_EQ(back.bits, h.bits) << b;
    }
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(to_float(Half{0x3c00}), 1.0f);
  EXPECT_EQ(to_float(Half{0xc000}), -2.0f);
  EXPECT_EQ(to_float(Half{0x7bff}), 65504.0f);
  EXPECT_EQ(to_float(Half{0x0001}), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(to_float(Half{0x0400}), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(to_float(Half{0x7c00})));
}

TEST(HalfTest, RoundsToNearestEven) {
  // Ties go to the even mantissa.
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(from_float<Half>(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  // Above a tie rounds up, below rounds down.
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits, 0x3c01);
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(1.0f, -11) - std::ldexp(1.0f, -20)).bits, 0x3c00);
  // Subnormals: 2^-25 is half a step (tie to 0), 3 * 2^-25 a step and a half.
  EXPECT_EQ(from_float<Half>(std::ldexp(1.0f, -25)).bits, 0x0000);
  EXPECT_EQ(from_float<Half>(3 * std::ldexp(1.0f, -25)).bits, 0x0002);
  EXPECT_EQ(from_float<Half>(-std::ldexp(1.0f, -24)).bits, 0x8001);
  // Just below the smallest normal rounds up into it.
  EXPECT_EQ(from_float<Half>(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -30)).bits, 0x0400);
  // Overflow.
  EXPECT_EQ(from_float<Half>(65519.0f).bits, 0x7bff);
  EXPECT_EQ(from_float<Half>(65520.0f).bits, 0x7c00);
  EXPECT_EQ(from_float<Half>(-1e9f).bits, 0xfc00);
  EXPECT_EQ(from_float<Half>(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(to_float(from_float<Half>(std::nanf("")))));
  EXPECT_EQ(from_float<Half>(-0.0f).bits, 0x8000);
}

TEST(BFloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(to_float(BFloat16{0x3f80}), 1.0f);
  EXPECT_EQ(from_float<BFloat16>(1.0f).bits, 0x3f80);
  EXPECT_EQ(from_float<BFloat16>(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie, even
  EXPECT_EQ(from_float<BFloat16>(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie, even
  EXPECT_EQ(from_float<BFloat16>(f32(0x3f808001u)).bits, 0x3f81);                 // above a tie
  EXPECT_EQ(from_float<BFloat16>(f32(0x7f7fffffu)).bits, 0x7f80);  // max float rounds to inf
  EXPECT_TRUE(std::isnan(to_float(from_float<BFloat16>(std::nanf("")))));
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const BFloat16 h{static_cast<uint16_t>(b)};
    if (!std::isnan(to_float(h))) {
      EXPECT_EQ(from_float<BFloat16>(to_float(h)).bits, h.bits) << b;
    }
  }
}

TEST(RowSpaceTest, OffsetsAddressTwoSegments) {
  std::vector<uint8_t> a(64), b(32);
  const RowSpace s{a.data(), 64, b.data(), 32};
  EXPECT_EQ(s.at(0), a.data());
  EXPECT_EQ(s.at(60), a.data() + 60);
  EXPECT_EQ(s.at(64), b.data());
  EXPECT_EQ(s.at(80), b.data() + 16);
  EXPECT_EQ(s.size(), 96);
  EXPECT_TRUE(s.holds(48, 16));
  EXPECT_FALSE(s.holds(56, 16));  // would straddle the two segments
  EXPECT_TRUE(s.holds(64, 32));
  EXPECT_FALSE(s.holds(72, 32));
  EXPECT_FALSE(s.holds(-4, 4));
}

TEST(RowSpaceTest, StateFollowsThePaddedEmbedding) {
  EXPECT_EQ(embedding_bytes<float>(3), 12);
  EXPECT_EQ(embedding_bytes<Half>(3), 8);  // 6 bytes padded to 8
  EXPECT_EQ(embedding_bytes<Half>(4), 8);
  EXPECT_EQ(embedding_bytes<Float8E4M3>(3), 8);  // 3 codes padded to 4, then the scale
  EXPECT_EQ(embedding_bytes<Float8E4M3>(8), 12);
  for (int64_t dim : {1, 3, 4, 5, 64, 129}) {
    EXPECT_EQ(embedding_bytes(dim, ElementType::kFloat32), embedding_bytes<float>(dim));
    EXPECT_EQ(embedding_bytes(dim, ElementType::kFloat16), embedding_bytes<Half>(dim));
    EXPECT_EQ(embedding_bytes(dim, ElementType::kBFloat16), embedding_bytes<BFloat16>(dim));
    EXPECT_EQ(embedding_bytes(dim, ElementType::kFloat8E4M3), embedding_bytes<Float8E4M3>(dim));
  }
  std::vector<uint32_t> words(8);
  const RowSpace s{reinterpret_cast<uint8_t*>(words.data()), 32, nullptr, 0};
  EXPECT_EQ(reinterpret_cast<uint8_t*>(state_at<Half>(s, 0, 3)),
            reinterpret_cast<uint8_t*>(words.data()) + 8);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(state_at<float>(s, 16, 2)),
            reinterpret_cast<uint8_t*>(words.data()) + 24);
}

// e4m3fn's value of a code, by its definition: (-1)^s 2^(e - 7) (1 + m / 8),
// subnormal 2^-6 (m / 8), NaN for S.1111.111.
double fp8_value(uint32_t code) {
  const int sign = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

TEST(Float8Test, EveryCodeDecodesToItsValueAndBack) {
  for (uint32_t c = 0; c < 256; ++c) {
    const Float8E4M3 q{static_cast<uint8_t>(c)};
    const double want = fp8_value(c);
    const float got = to_float(q);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE(std::isnan(to_float(from_float<Float8E4M3>(got)))) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << c;
    const Float8E4M3 back = from_float<Float8E4M3>(got);
    if (want == 0.0) {
      EXPECT_EQ(back.bits & 0x7f, 0) << c;
    } else {
      EXPECT_EQ(back.bits, q.bits) << c;
    }
  }
  EXPECT_EQ(to_float(Float8E4M3{kFp8MaxCode}), kFp8Max);
  EXPECT_EQ(to_float(Float8E4M3{0x01}), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(to_float(Float8E4M3{0x08}), std::ldexp(1.0f, -6));  // smallest normal
}

// The finite codes in increasing order of value.
std::vector<double> fp8_ladder() {
  std::vector<double> v;
  for (uint32_t c = 0; c < 256; ++c) {
    const double x = fp8_value(c);
    if (!std::isnan(x) && !(x == 0.0 && c != 0)) v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Float8Test, RoundsToNearestEvenAndSaturates) {
  const std::vector<double> ladder = fp8_ladder();
  for (size_t i = 0; i + 1 < ladder.size(); ++i) {
    const double lo = ladder[i], hi = ladder[i + 1];
    for (double t : {0.25, 0.5, 0.75}) {
      const float x = static_cast<float>(lo + t * (hi - lo));
      const double got = to_float(from_float<Float8E4M3>(x));
      if (t < 0.5) {
        EXPECT_EQ(got, lo) << x;
      }
      if (t > 0.5) {
        EXPECT_EQ(got, hi) << x;
      }
      if (t == 0.5) {  // a tie: the even code (its mantissa's last bit 0)
        const uint8_t code = from_float<Float8E4M3>(x).bits;
        EXPECT_EQ(code & 1, 0) << x;
        EXPECT_TRUE(got == lo || got == hi) << x;
      }
    }
  }
  EXPECT_EQ(to_float(from_float<Float8E4M3>(1000.f)), 448.f);
  EXPECT_EQ(to_float(from_float<Float8E4M3>(-1e30f)), -448.f);
  EXPECT_EQ(to_float(from_float<Float8E4M3>(std::numeric_limits<float>::infinity())), 448.f);
  EXPECT_TRUE(std::isnan(to_float(from_float<Float8E4M3>(std::nanf("")))));
}

TEST(Float8Test, StochasticRoundingPicksANeighbourAndIsUnbiased) {
  const std::vector<double> ladder = fp8_ladder();
  uint32_t state = 12345u;
  auto next = [&] {  // xorshift32: any uniform bits serve
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  // Values between neighbours of every binade, subnormals and the sign.
  for (size_t i = 0; i + 1 < ladder.size(); i += 7) {
    const double lo = ladder[i], hi = ladder[i + 1];
    const float x = static_cast<float>(lo + 0.3 * (hi - lo));
    const int draws = 20000;
    double sum = 0.0;
    for (int k = 0; k < draws; ++k) {
      const double got = to_float(fp8_stochastic(x, next()));
      ASSERT_TRUE(got == lo || got == hi) << x << " gave " << got;
      sum += got;
    }
    // The mean within 5 standard deviations of x (p = 0.3 of a step).
    const double sigma = (hi - lo) * std::sqrt(0.3 * 0.7 / draws);
    EXPECT_NEAR(sum / draws, static_cast<double>(x), 5 * sigma + 1e-12) << x;
  }
  // A representable value is kept whatever the bits; saturation, NaN.
  for (uint32_t r : {0u, 1u, 0x80000000u, 0xffffffffu}) {
    EXPECT_EQ(to_float(fp8_stochastic(0.75f, r)), 0.75f);
    EXPECT_EQ(to_float(fp8_stochastic(-448.f, r)), -448.f);
    EXPECT_EQ(to_float(fp8_stochastic(500.f, r)), 448.f);
    EXPECT_TRUE(std::isnan(to_float(fp8_stochastic(std::nanf(""), r))));
  }
  // All bits set: a value just above a code rounds up; none set: down.
  EXPECT_EQ(to_float(fp8_stochastic(1.01f, 0xffffffffu)), 1.125f);
  EXPECT_EQ(to_float(fp8_stochastic(1.01f, 0u)), 1.0f);
}

TEST(Float8Test, TheScalePutsTheLargestMagnitudeInTheTopBinade) {
  for (float amax : {1e-30f, 1e-6f, 0.01f, 0.05f, 1.f, 224.f, 224.0001f, 448.f, 3000.f, 1e30f}) {
    const float s = fp8_scale(amax);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << amax;  // a power of two
    EXPECT_GT(amax / s, 224.f) << amax;
    EXPECT_LE(amax / s, 448.f) << amax;
  }
  EXPECT_EQ(fp8_scale(0.f), 1.f);
  EXPECT_EQ(fp8_scale(std::numeric_limits<float>::infinity()), 1.f);
  EXPECT_EQ(fp8_scale(std::nanf("")), 1.f);
}

}  // namespace
}  // namespace storage
}  // namespace dyn_emb
