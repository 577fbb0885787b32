// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Properties of the counter-based initializers: a row depends only on (seed,
// table, key, element), values follow the requested distribution, bounds hold.
#include "cc/embedding/initializer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cc/embedding/initializer_cpu.h"

namespace dyn_emb {
namespace embedding {
namespace {

InitArgs args(InitMode m) {
  InitArgs a;
  a.mode = static_cast<int32_t>(m);
  a.seed = 1234;
  return a;
}

// The Philox4x32-10 known-answer vectors of the Random123 distribution
// (tests/kat_vectors, "philox4x32 10"; Salmon et al., SC'11): counter (4
// words), key (2 words), result (4 words).
TEST(Philox, MatchesTheRandom123KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], want[4];
  };
  const Kat kats[] = {
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
       {0x00000000u, 0x00000000u},
       {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = philox(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.v[w], k.want[w]) << "word " << w;
  }
}

TEST(Initializer, RowDependsOnlyOnSeedTableKeyAndElement) {
  const InitArgs a = args(InitMode::kNormal);
  EXPECT_EQ(init_value(a, 42, 0, 3), init_value(a, 42, 0, 3));
  EXPECT_NE(init_value(a, 42, 0, 3), init_value(a, 43, 0, 3));
  EXPECT_NE(init_value(a, 42, 0, 3), init_value(a, 42, 1, 3));
  EXPECT_NE(init_value(a, 42, 0, 3), init_value(a, 42, 0, 2));
  InitArgs b = a;
  b.seed = 99;
  EXPECT_NE(init_value(a, 42, 0, 3), init_value(b, 42, 0, 3));
}

TEST(Initializer, UniformStaysInBoundsWithTheRightMean) {
  InitArgs a = args(InitMode::kUniform);
  a.lower = -0.5;
  a.upper = 1.5;
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float v = init_value(a, i / 16, 0, i % 16);
    ASSERT_GE(v, -0.5f);
    ASSERT_LE(v, 1.5f);
    sum += v;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);  // sd of the mean: 0.577 / sqrt(n) = 0.0013
}

TEST(Initializer, NormalHasTheRequestedMeanAndStd) {
  InitArgs a = args(InitMode::kNormal);
  a.mean = 2.0;
  a.std_dev = 3.0;
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double v = init_value(a, i / 8, 0, i % 8);
    sum += v;
    sq += v * v;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 2.0, 0.03);  // sd of the mean: 3 / sqrt(n) = 0.0067
  EXPECT_NEAR(std::sqrt(var), 3.0, 0.03);
}

TEST(Initializer, TruncatedNormalStaysInBounds) {
  InitArgs a = args(InitMode::kTruncatedNormal);
  a.lower = -0.1;
  a.upper = 0.2;
  int below_zero = 0;
  for (int i = 0; i < 50000; ++i) {
    const float v = init_value(a, i, 0, 0);
    ASSERT_GE(v, -0.1f);
    ASSERT_LE(v, 0.2f);
    below_zero += v < 0;
  }
  // N(0,1) restricted to [-0.1, 0.2] is nearly uniform: about a third below 0.
  EXPECT_NEAR(below_zero / 50000.0, 1.0 / 3.0, 0.02);
}

// An interval narrower than 2 std_dev draws uniformly and keeps a draw by the
// density: the exact truncated normal, with no mass piled up at the bounds.
TEST(Initializer, TruncatedNormalOnANarrowIntervalIsExact) {
  InitArgs a = args(InitMode::kTruncatedNormal);
  a.lower = -1.0 / 64, a.upper = 1.0 / 64;  // the default bounds of 4096 rows
  const int n = 100000;
  int at_bounds = 0, below_zero = 0;
  for (int i = 0; i < n; ++i) {
    const float v = init_value(a, i / 4, 0, i % 4);
    ASSERT_GE(v, static_cast<float>(a.lower));
    ASSERT_LE(v, static_cast<float>(a.upper));
    at_bounds += v == static_cast<float>(a.lower) || v == static_cast<float>(a.upper);
    below_zero += v < 0;
  }
  EXPECT_LT(at_bounds, 5);
  EXPECT_NEAR(below_zero / static_cast<double>(n), 0.5, 0.01);
  // N(0, 1) restricted to [1, 2]: P(x < 1.5) = (Phi(1.5) - Phi(1)) / (Phi(2) - Phi(1)).
  a.lower = 1.0, a.upper = 2.0;
  int below = 0;
  for (int i = 0; i < n; ++i) {
    const float v = init_value(a, i, 0, 0);
    ASSERT_GE(v, 1.0f);
    ASSERT_LE(v, 2.0f);
    below += v < 1.5f;
  }
  auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  EXPECT_NEAR(below / static_cast<double>(n), (cdf(1.5) - cdf(1.0)) / (cdf(2.0) - cdf(1.0)), 0.01);
}

TEST(Initializer, ConstantAndDebugModes) {
  InitArgs c = args(InitMode::kConstant);
  c.value = 0.25;
  EXPECT_EQ(init_value(c, 5, 0, 7), 0.25f);
  const InitArgs d = args(InitMode::kDebug);
  EXPECT_EQ(init_value(d, 123456, 0, 0), 23456.0f);
  EXPECT_EQ(init_value(d, -3, 0, 1), static_cast<float>(kDebugModulus - 3));
}

// init_values4 shares the draws init_value makes again for each element (four
// UNIFORM elements, two normal ones per draw): it must give every element
// bit for bit what init_value gives it.
TEST(Initializer, FourAtATimeEqualsOneAtATime) {
  for (InitMode m : {InitMode::kNormal, InitMode::kTruncatedNormal, InitMode::kUniform,
                     InitMode::kConstant, InitMode::kDebug}) {
    InitArgs a = args(m);
    a.mean = 0.1, a.std_dev = 0.7, a.lower = -0.4, a.upper = 0.3, a.value = 0.5;
    for (int64_t key : {int64_t{0}, int64_t{7}, int64_t{-5}, int64_t{1} << 40}) {
      for (int64_t table = 0; table < 3; ++table) {
        for (int64_t blk = 0; blk < 40; ++blk) {
          float v[4];
          init_values4(a, key, table, blk, v);
          for (int k = 0; k < 4; ++k) {
            ASSERT_EQ(v[k], init_value(a, key, table, 4 * blk + k))
                << "mode " << static_cast<int>(m) << " key " << key << " table " << table
                << " element " << 4 * blk + k;
          }
        }
      }
    }
  }
}

// The CPU's rows (the ops init_rows and init_rows_at, whose UNIFORM and
// NORMAL rows come from runs of Philox draws eight at a time): every element
// bit for bit init_value's, at dims around the runs' ends, the padding of a
// float32 row's state zero and its state as the args say.
TEST(Initializer, TheCpuRowsAreInitValuesRows) {
  const std::vector<int64_t> keys = {0, 7, -5, int64_t{1} << 40, 123456789};
  const std::vector<int64_t> tables = {0, 2, 1, 0, 5};
  const int64_t n = static_cast<int64_t>(keys.size());
  for (InitMode m : {InitMode::kNormal, InitMode::kTruncatedNormal, InitMode::kUniform,
                     InitMode::kConstant, InitMode::kDebug}) {
    InitArgs a = args(m);
    a.mean = 0.1, a.std_dev = 0.7, a.lower = -0.4, a.upper = 0.3, a.value = 0.5;
    for (int64_t dim : {1, 2, 3, 4, 5, 7, 8, 31, 33, 64, 65}) {
      std::vector<float> rows(static_cast<size_t>(n * dim));
      cpu::init_rows(a, keys.data(), tables.data(), n, dim, rows.data());
      // Rows of dim floats and 3 state floats, one after another in one segment.
      const int64_t width = dim + 3;
      std::vector<float> space(static_cast<size_t>(n * width), -1.f);
      std::vector<int64_t> offsets(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) offsets[i] = i * width * 4;
      RowInitArgs r;
      r.init = a;
      r.space.seg0 = reinterpret_cast<uint8_t*>(space.data());
      r.space.size0 = n * width * 4;
      r.offsets = offsets.data();
      r.keys = keys.data();
      r.table_ids = tables.data();
      r.dim = dim;
      r.state_dim = 3;
      r.fill_from = 2;
      r.fill = 0.25f;
      cpu::init_rows_at(r, n, storage::ElementType::kFloat32);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t e = 0; e < dim; ++e) {
          const float want = init_value(a, keys[i], tables[i], e);
          ASSERT_EQ(rows[i * dim + e], want) << static_cast<int>(m) << " " << dim << " " << i;
          ASSERT_EQ(space[i * width + e], want) << static_cast<int>(m) << " " << dim << " " << i;
        }
        EXPECT_EQ(space[i * width + dim], 0.f);
        EXPECT_EQ(space[i * width + dim + 1], 0.f);
        EXPECT_EQ(space[i * width + dim + 2], 0.25f);
      }
    }
  }
}

}  // namespace
}  // namespace embedding
}  // namespace dyn_emb
