// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Writes of FP8 rows on the CPU (fp8_rows_cpu.h): the bytes of the
// per-element definition (fp8_rows.h: scaled_code, the CUDA kernels'), every
// code within one step of its value, the row's scale by its largest
// magnitude, the same codes for the same inputs, and updates smaller than
// half a step kept on average by the stochastic rounding, where rounding to
// nearest would lose them all.
#include "cc/embedding/fp8_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/embedding/fp8_rows_cpu.h"
#include "cc/embedding/initializer.h"
#include "cc/embedding/initializer_cpu.h"
#include "cc/embedding/optimizer.h"
#include "cc/embedding/philox.h"

namespace dyn_emb {
namespace embedding {
namespace {

using storage::Float8E4M3;

// cpu::write_scaled_row with its scratch.
void write_scaled_row(Float8E4M3* w, const float* v, int64_t dim, uint64_t key, int64_t step) {
  std::vector<uint32_t> bits(static_cast<size_t>(dim));
  cpu::write_scaled_row(w, v, dim, key, step, bits.data());
}

// cpu::update_scaled_row with its scratch.
void update_scaled_row(const OptimArgs& a, Float8E4M3* w, float* s, const float* g, int64_t dim,
                       uint64_t key, int64_t step, float* tmp) {
  std::vector<uint32_t> bits(static_cast<size_t>(dim));
  cpu::update_scaled_row(a, w, s, g, dim, key, step, tmp, bits.data());
}

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
  const int64_t offset = 0, key = 4242, table = 3;
  a.offsets = &offset;
  a.keys = &key;
  a.table_ids = &table;
  cpu::init_rows_at(a, 1, storage::ElementType::kFloat8E4M3);
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

// The per-element definition of a row write (fp8_rows.h), as the CUDA
// kernels compute it, into `row`: the reference of the CPU's writes.
void define_row(Fp8Row& row, const std::vector<float>& v, uint64_t key, int64_t step) {
  float amax = 0.f;
  for (float x : v) amax = std::fmax(amax, std::fabs(x));
  const float scale = storage::fp8_scale(amax);
  for (int64_t d = 0; d < row.dim; ++d) row.codes()[d] = scaled_code(v[d], scale, key, step, d);
  *storage::scale_at(row.codes(), row.dim) = scale;
}

// Rows of values of every kind a write meets: values over many powers of
// two (codes below the smallest normal among them), zeros, both signs, and
// rows with an infinity or a NaN.
std::vector<std::vector<float>> test_rows(int64_t dim, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1u;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return x;
  };
  std::vector<std::vector<float>> rows;
  // Kinds 5 and 6: rows of the smallest and largest magnitudes, whose
  // scales' reciprocals are not normal floats.
  for (int kind = 0; kind < 7; ++kind) {
    std::vector<float> v(dim);
    for (int64_t d = 0; d < dim; ++d) {
      const uint32_t r = next();
      const float m = std::ldexp(1.f + static_cast<float>(r >> 8) / 16777216.f,
                                 -static_cast<int>(r % 24u));  // 2^0 .. 2^-23
      v[d] = (r & 0x80u) ? -m : m;
      if (r % 11u == 0) v[d] = 0.f;
    }
    if (kind == 1) v[next() % dim] = INFINITY;
    if (kind == 2) v[next() % dim] = NAN;
    if (kind == 3) std::fill(v.begin(), v.end(), 0.f);
    if (kind == 5)
      for (float& e : v) e = std::ldexp(e, -125);
    if (kind == 6)
      for (float& e : v) e = std::ldexp(e, 127);
    rows.push_back(v);
  }
  return rows;
}

// Each way the CPU's row functions can run (cpu::Simd).
const cpu::Simd kPaths[] = {cpu::Simd::kScalar, cpu::Simd::kAvx2, cpu::Simd::kAvx512};

const int64_t kDims[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 128, 257};

TEST(Fp8Rows, TheTableHoldsEachCodesValue) {
  for (int c = 0; c < 256; ++c) {
    const float want = storage::to_float(Float8E4M3{static_cast<uint8_t>(c)});
    EXPECT_EQ(storage::float_bits(cpu::kFp8Values[c]), storage::float_bits(want)) << c;
  }
}

// A lane whose four codes start past the row's end (a chunk's lanes beyond
// a row narrower than the chunk) gets zeros and reads nothing: its address,
// far past any buffer, would fault if read.
TEST(Fp8Rows, CodesPastTheRowsEndAreZerosAndNotRead) {
  std::vector<uint32_t> words(4, 0x3c3c3c3cu);
  const auto* w = reinterpret_cast<const Float8E4M3*>(words.data());
  float x[4] = {1.f, 1.f, 1.f, 1.f};
  load_codes4(w, int64_t{1} << 44, 16, x);
  for (float v : x) EXPECT_EQ(v, 0.f);
  load_codes4(w, 12, 14, x);  // the last word: two codes, two zeros
  EXPECT_EQ(x[0], storage::to_float(Float8E4M3{0x3c}));
  EXPECT_EQ(x[1], storage::to_float(Float8E4M3{0x3c}));
  EXPECT_EQ(x[2], 0.f);
  EXPECT_EQ(x[3], 0.f);
}

// Rows holding every code (at every dim around the eight-at-a-time loops):
// read_scaled_row gives each code's value times the scale, add_codes adds
// the weight times each value to what is there, bit for bit as one product
// and one sum per element.
TEST(Fp8Rows, ReadsAndPooledSumsGiveEachCodesValue) {
  for (const auto path : kPaths) {
    if (!cpu::simd_runs(path)) continue;
    for (int64_t dim : {1, 7, 8, 9, 16, 31, 32, 33, 40, 64, 256, 263}) {
      Fp8Row row(dim, 0);
      for (int64_t d = 0; d < dim; ++d) {
        row.codes()[d] = Float8E4M3{static_cast<uint8_t>((d * 37 + 11) % 256)};
      }
      *storage::scale_at(row.codes(), dim) = 0.375f;
      std::vector<float> got(dim), sum(dim), want_sum(dim);
      cpu::read_scaled_row_by(path, row.codes(), dim, got.data());
      for (int64_t d = 0; d < dim; ++d) {
        sum[d] = want_sum[d] = 0.25f * static_cast<float>(d) - 3.f;
      }
      cpu::add_codes_by(path, sum.data(), -1.5f, row.codes(), dim);
      for (int64_t d = 0; d < dim; ++d) {
        const float v = storage::to_float(row.codes()[d]);
        const float want = v * 0.375f;
        const float term = -1.5f * v;
        want_sum[d] = want_sum[d] + term;
        ASSERT_EQ(storage::float_bits(got[d]), storage::float_bits(want)) << dim << " " << d;
        ASSERT_EQ(storage::float_bits(sum[d]), storage::float_bits(want_sum[d]))
            << dim << " " << d << " path " << static_cast<int>(path);
      }
    }
  }
}

TEST(Fp8Rows, ARowsBitsAreEachElementsDraw) {
  const uint64_t keys[] = {0, 5, 0xfedcba9876543210ull, ~0ull};
  const int64_t steps[] = {0, 3, (int64_t{1} << 33) + 7, -2};
  for (uint64_t key : keys) {
    for (int64_t step : steps) {
      for (int64_t n = 0; n <= 300; n += (n < 40 ? 1 : 37)) {
        std::vector<uint32_t> bits(n + 1, 0xdeadbeefu);
        cpu::stochastic_bits_row(key, step, n, bits.data());
        for (int64_t e = 0; e < n; ++e) {
          ASSERT_EQ(bits[e], stochastic_bits(key, step, e)) << key << " " << step << " " << e;
        }
        EXPECT_EQ(bits[n], 0xdeadbeefu);  // nothing written past n
        // Each way the CPU can draw them (philox_words_by), the same words.
        for (const auto path : kPaths) {
          if (!cpu::simd_runs(path)) continue;
          std::vector<uint32_t> by(n + 1, 0xdeadbeefu);
          cpu::philox_words_by(path, stochastic_draws(key, step), n, by.data());
          ASSERT_EQ(by, bits) << key << " " << step << " " << n << " path "
                              << static_cast<int>(path);  // nothing past n either
        }
      }
    }
  }
}

TEST(Fp8Rows, ARowWriteHasThePerElementDefinitionsBytes) {
  for (int64_t dim : kDims) {
    for (const auto& v : test_rows(dim, static_cast<uint32_t>(dim))) {
      for (int64_t step : {int64_t{0}, int64_t{9}}) {
        Fp8Row got(dim, 0), want(dim, 0);
        got.words.assign(got.words.size(), 0x55555555u);  // the padding is written
        write_scaled_row(got.codes(), v.data(), dim, 31 + dim, step);
        define_row(want, v, 31 + dim, step);
        ASSERT_EQ(got.words, want.words) << dim << " " << step;
      }
    }
  }
}

// An FP8 row's update by its definition: each value read as code * scale,
// updated as update_coord updates it (row-wise optimizers: their factors
// from the row first), then written as define_row writes it.
void define_update(const OptimArgs& a, Fp8Row& row, const std::vector<float>& g, uint64_t key,
                   int64_t step) {
  const int64_t dim = row.dim;
  const float old = row.scale();
  const RowFactors rf = row_factors(a, row.codes(), row.state(), g.data(), dim, old);
  std::vector<float> v(dim);
  for (int64_t d = 0; d < dim; ++d) {
    v[d] = storage::to_float(row.codes()[d]) * old;
    update_coord(a, v[d], row.state(), g[d], d, dim, rf);
  }
  define_row(row, v, key, step);
}

TEST(Fp8Rows, AnUpdateHasThePerElementDefinitionsBytes) {
  for (int32_t type = 0; type < kNumOptimTypes; ++type) {
    for (int64_t dim : kDims) {
      OptimArgs a;
      a.type = type;
      a.lr = 0.3f;
      a.weight_decay = 0.01f;
      a.wd_mode = static_cast<int32_t>(WeightDecayMode::kL2);
      a.l1 = 0.001f;
      a = with_step(a, 4);
      const int64_t state = state_dim(type, dim);
      const auto rows = test_rows(dim, 1000u + static_cast<uint32_t>(dim));
      const auto grads = test_rows(dim, 2000u + static_cast<uint32_t>(dim));
      for (size_t i = 0; i < rows.size(); ++i) {
        Fp8Row got(dim, state);
        write_scaled_row(got.codes(), rows[i].data(), dim, 7 + i, 0);
        float* s = got.state();
        for (int64_t k = 0; k < state; ++k) s[k] = 0.01f * static_cast<float>(k % 7);
        Fp8Row want = got;
        std::vector<float> tmp(dim);
        // The first row's gradient is finite; the others bring an inf, a NaN, zeros.
        update_scaled_row(a, got.codes(), got.state(), grads[i].data(), dim, 7 + i, 4, tmp.data());
        define_update(a, want, grads[i], 7 + i, 4);
        ASSERT_EQ(got.words, want.words) << type << " " << dim << " " << i;
      }
    }
  }
}

// The CUDA kernels' four codes at a time (scaled_codes4, store_codes4,
// load_codes4), at every offset from a 4-byte boundary: the per-element
// definition's codes, zeros in the padding, nothing written past it, and the
// codes' values read back (zeros past the row's end).
TEST(Fp8Rows, FourCodesAtATimeAreThePerElementDefinitions) {
  for (int64_t dim : kDims) {
    const int64_t padded = storage::pad4(dim);
    for (const auto& v : test_rows(dim, 500u + static_cast<uint32_t>(dim))) {
      Fp8Row want(dim, 0);
      define_row(want, v, 11 + dim, 5);
      const float scale = want.scale();
      for (int shift = 0; shift < 4; ++shift) {
        std::vector<uint8_t> buf(static_cast<size_t>(padded + 8), 0xa5);
        auto* w = reinterpret_cast<Float8E4M3*>(buf.data() + shift);
        for (int64_t d0 = 0; d0 < dim; d0 += 4) {
          float x[4];
          for (int k = 0; k < 4; ++k) x[k] = d0 + k < dim ? v[d0 + k] : 0.f;
          store_codes4(w, d0, scaled_codes4(x, scale, 11 + dim, 5, d0 / 4, dim));
        }
        for (int64_t d = 0; d < padded; ++d) {
          const uint8_t code = d < dim ? want.codes()[d].bits : 0;
          ASSERT_EQ(w[d].bits, code) << dim << " " << shift << " " << d;
        }
        for (int64_t b = shift + padded; b < static_cast<int64_t>(buf.size()); ++b) {
          ASSERT_EQ(buf[b], 0xa5) << dim << " " << shift << " " << b;
        }
        for (int64_t d0 = 0; d0 < dim; d0 += 4) {
          float x[4];
          load_codes4(w, d0, dim, x);
          for (int k = 0; k < 4; ++k) {
            const float code = d0 + k < dim ? storage::to_float(want.codes()[d0 + k]) : 0.f;
            ASSERT_EQ(storage::float_bits(x[k]), storage::float_bits(code)) << dim << " " << d0;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace embedding
}  // namespace dyn_emb
