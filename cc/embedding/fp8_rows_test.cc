// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Writes of FP8 rows (fp8_rows.h, update_scaled_row in optimizer.h): every
// code within one step of its value, the row's scale by its largest
// magnitude, the same codes for the same inputs, and updates smaller than
// half a step kept on average by the stochastic rounding, where rounding to
// nearest would lose them all.
#include "cc/embedding/fp8_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/embedding/initializer.h"
#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace {

using storage::Float8E4M3;

// A row of `dim` FP8 codes with its scale, and `state` floats after it.
struct Fp8Row {
  std::vector<uint32_t> words;
  int64_t dim;
  Fp8Row(int64_t d, int64_t state)
      : words(storage::embedding_bytes<Float8E4M3>(d) / 4 + state), dim(d) {}
  Float8E4M3* codes() { return reinterpret_cast<Float8E4M3*>(words.data()); }
  float scale() { return *storage::scale_at(codes(), dim); }
  float* state() {
    return reinterpret_cast<float*>(words.data()) + storage::embedding_bytes<Float8E4M3>(dim) / 4;
  }
  float value(int64_t d) { return storage::to_float(codes()[d]) * scale(); }
};

// One e4m3fn step (the distance to the next code away from zero) at value y
// of a row's elements divided by its scale.
double step_at(double y) {
  const double a = std::fabs(y);
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 1 - 3);
}

TEST(Fp8Rows, AWrittenRowHoldsItsValuesWithinAStep) {
  const int64_t dim = 37;
  std::vector<float> v(dim);
  for (int64_t d = 0; d < dim; ++d) v[d] = 0.05f * std::sin(0.7f * d) - 0.001f * d;
  Fp8Row row(dim, 0);
  write_scaled_row(row.codes(), v.data(), dim, 77, 0);
  const float scale = row.scale();
  float amax = 0.f;
  for (float x : v) amax = std::fmax(amax, std::fabs(x));
  EXPECT_EQ(scale, storage::fp8_scale(amax));
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_LT(std::fabs(row.value(d) - v[d]), step_at(v[d] / scale) * scale) << d;
  }
  for (int64_t d = dim; d < storage::pad4(dim); ++d) EXPECT_EQ(row.codes()[d].bits, 0);
  Fp8Row again(dim, 0);
  write_scaled_row(again.codes(), v.data(), dim, 77, 0);
  EXPECT_EQ(again.words, row.words);  // the same key and step: the same codes
  Fp8Row other(dim, 0);
  write_scaled_row(other.codes(), v.data(), dim, 78, 0);
  EXPECT_NE(other.words, row.words);  // another key: other draws
}

TEST(Fp8Rows, AnInitialRowIsTheInitializersRowRounded) {
  RowInitArgs a;
  a.init.mode = static_cast<int32_t>(InitMode::kUniform);
  a.init.lower = -0.1;
  a.init.upper = 0.1;
  a.dim = 19;
  Fp8Row row(a.dim, 0);
  a.space = storage::RowSpace{reinterpret_cast<uint8_t*>(row.words.data()),
                              static_cast<int64_t>(row.words.size() * 4), nullptr, 0};
  std::vector<float> tmp(storage::pad4(a.dim));
  init_scaled_row(a, 0, 4242, 3, tmp.data());
  for (int64_t d = 0; d < a.dim; ++d) {
    const float want = init_value(a.init, 4242, 3, d);
    EXPECT_LT(std::fabs(row.value(d) - want), step_at(want / row.scale()) * row.scale()) << d;
  }
}

TEST(Fp8Rows, AnUpdateRescalesTheRowAndKeepsItsState) {
  const int64_t dim = 8;
  OptimArgs a;
  a.type = static_cast<int32_t>(OptimType::kAdam);
  a.lr = 0.5f;
  a = with_step(a, 3);
  Fp8Row row(dim, 2 * dim);
  std::vector<float> v(dim, 0.01f), g(dim, -1.f), tmp(dim);
  write_scaled_row(row.codes(), v.data(), dim, 5, 0);
  const float before = row.scale();
  update_scaled_row(a, row.codes(), row.state(), g.data(), dim, 5, 3, tmp.data());
  // Adam moved every value by about lr: the scale followed the largest.
  float amax = 0.f;
  for (float x : tmp) amax = std::fmax(amax, std::fabs(x));
  EXPECT_GT(row.scale(), before);
  EXPECT_EQ(row.scale(), storage::fp8_scale(amax));
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_LT(std::fabs(row.value(d) - tmp[d]), step_at(tmp[d] / row.scale()) * row.scale());
    EXPECT_NE(row.state()[d], 0.f);        // m
    EXPECT_NE(row.state()[dim + d], 0.f);  // v
  }
}

// SGD steps of a tenth of a code's step, over many rows (keys): rounding to
// nearest would leave every row where it was; stochastic rounding moves
// their mean by the steps' sum.
TEST(Fp8Rows, StepsSmallerThanHalfACodeAccumulateOnAverage) {
  const int64_t dim = 4, rows = 4000, steps = 40;
  OptimArgs a;
  a.type = static_cast<int32_t>(OptimType::kSGD);
  // Values near 0.75 of a row whose largest magnitude is 1 (scale 2^-8:
  // 1 / 2^-8 = 256 in (224, 448]): a step of 0.75 / 2^-8 = 192 is 16 there,
  // 2^-4 in the row's values; each update moves by a tenth of that.
  const float code_step = 16.f * std::ldexp(1.f, -8);
  a.lr = code_step / 10.f;
  std::vector<float> g = {0.f, 1.f, 1.f, 1.f}, tmp(dim);
  double mean = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    Fp8Row row(dim, 0);
    std::vector<float> v = {1.f, 0.75f, 0.75f, 0.75f};
    write_scaled_row(row.codes(), v.data(), dim, 1000 + r, 0);
    for (int64_t s = 1; s <= steps; ++s) {
      OptimArgs at = with_step(a, s);
      update_scaled_row(at, row.codes(), row.state(), g.data(), dim, 1000 + r, s, tmp.data());
    }
    EXPECT_EQ(row.value(0), 1.f);  // no gradient: the largest keeps the scale
    mean += (row.value(1) + row.value(2) + row.value(3)) / 3.0;
  }
  mean /= rows;
  const double want = 0.75 - steps * a.lr;  // 0.75 - 4 code steps
  // Each of the 40 roundings adds a variance of at most step^2 / 4 per value.
  const double sigma = code_step * std::sqrt(steps / 4.0 / (3.0 * rows));
  EXPECT_NEAR(mean, want, 6 * sigma);
  EXPECT_LT(mean, 0.75 - 3 * code_step);  // it moved (to nearest: not at all)
}

}  // namespace
}  // namespace embedding
}  // namespace dyn_emb
