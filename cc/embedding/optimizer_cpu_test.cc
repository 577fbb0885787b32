// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CPU's update of float32 rows (optimizer_cpu.h: update_float_row, whose
// Adam runs eight coordinates at a time) against update_row, the per-coordinate
// definition: the same bits of every weight and state, at dims around the
// vector width, with the step's bias corrections as fields and as data, under
// each weight decay mode, for every optimizer.
#include "cc/embedding/optimizer_cpu.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace {

// A row of weights and its state (state_dim floats), drawn at magnitudes
// from 1e-6 to 1e2, a few exact zeros.
std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> power(-6, 2);
  std::vector<float> r(static_cast<size_t>(n));
  for (float& x : r) x = rng() % 17 == 0 ? 0.f : unit(rng) * std::pow(10.f, power(rng));
  return r;
}

TEST(OptimizerCpu, AFloatRowsUpdateHasUpdateRowsBits) {
  std::mt19937 rng(11);
  const float step_values[2] = {0.271f, 0.0039f};
  int cases = 0;
  for (int32_t type = 0; type < kNumOptimTypes; ++type) {
    for (const int64_t dim : {1, 7, 8, 9, 16, 31, 64, 67, 128}) {
      for (const bool as_data : {false, true}) {
        for (const int32_t mode : {0, 1, 2}) {
          OptimArgs a;
          a.type = type;
          a.lr = 0.05f;
          a.weight_decay = mode == 0 ? 0.f : 0.01f;
          a.wd_mode = mode;
          a = with_step(a, 7);
          if (as_data) a.step_values = step_values;
          const int64_t width = dim + state_dim(type, dim);
          std::vector<float> row = random_row(rng, width);
          std::vector<float> g = random_row(rng, dim);
          if (type == static_cast<int32_t>(OptimType::kAdam) ||
              type == static_cast<int32_t>(OptimType::kExactAdagrad)) {
            // Second moments are not negative.
            for (int64_t i = dim + state_dim(type, dim) / 2; i < width; ++i)
              row[i] = std::fabs(row[i]);
          }
          std::vector<float> ref = row;
          update_row(a, ref.data(), ref.data() + dim, g.data(), dim);
          cpu::update_float_row(a, row.data(), row.data() + dim, g.data(), dim);
          for (int64_t i = 0; i < width; ++i) {
            uint32_t got, want;
            std::memcpy(&got, &row[i], 4);
            std::memcpy(&want, &ref[i], 4);
            ASSERT_EQ(got, want) << "optimizer " << type << " dim " << dim << " float " << i << ": "
                                 << row[i] << " against " << ref[i];
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, kNumOptimTypes * 9 * 2 * kNumWeightDecayModes);
}

}  // namespace
}  // namespace embedding
}  // namespace dyn_emb
