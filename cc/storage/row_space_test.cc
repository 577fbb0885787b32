// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/storage/row_space.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(state_offset(3, 4), 12);
  EXPECT_EQ(state_offset(3, 2), 8);  // 6 bytes padded to 8
  EXPECT_EQ(state_offset(4, 2), 8);
  std::vector<uint32_t> words(8);
  const RowSpace s{reinterpret_cast<uint8_t*>(words.data()), 32, nullptr, 0};
  EXPECT_EQ(reinterpret_cast<uint8_t*>(state_at<Half>(s, 0, 3)),
            reinterpret_cast<uint8_t*>(words.data()) + 8);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(state_at<float>(s, 16, 2)),
            reinterpret_cast<uint8_t*>(words.data()) + 24);
}

}  // namespace
}  // namespace storage
}  // namespace dyn_emb
