// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CPU's FP8 row work alone, one thread: the stochastic rounding's draws
// of a row (stochastic_bits_row), and an Adam update of an FP8 row
// (update_scaled_row) against a float32 row's (update_float_row), each row laid out
// as in a table (its embedding part, then its two state vectors), the rows
// visited in a shuffled order and asked for kAhead rows ahead as the step's
// update asks (prefetch_cpu.h), at dims 16, 64 and 128. Prints ns a row, the
// best of five passes over the rows.
//
//   bazel run //cc/embedding:fp8_rows_bench [-- ROWS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cc/embedding/fp8_rows_cpu.h"
#include "cc/embedding/optimizer.h"
#include "cc/embedding/optimizer_cpu.h"
#include "cc/embedding/prefetch_cpu.h"
#include "cc/storage/row_space.h"

namespace {

using dyn_emb::embedding::OptimArgs;
using dyn_emb::embedding::OptimType;
namespace cpu = dyn_emb::embedding::cpu;
namespace storage = dyn_emb::storage;

// The best of five passes of f(r) over rows r < rows, in ns a row.
template <class F>
double ns_a_row(int64_t rows, const F& f) {
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < rows; ++r) f(r);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / rows);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 200000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 0.05f);
  OptimArgs a;
  a.type = static_cast<int32_t>(OptimType::kAdam);
  a = dyn_emb::embedding::with_step(a, 3);
  std::printf("%lld rows a pass, one thread, ns a row (best of five passes)\n",
              static_cast<long long>(rows));
  std::printf(
      "| dim | draws | Adam update, FP8 row | Adam update, float32 row | FP8 / float32 |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const int64_t dim : {16, 64, 128}) {
    // A row: its embedding part (embedding_bytes), then Adam's m and v.
    const int64_t fp8_stride = storage::embedding_bytes<storage::Float8E4M3>(dim) + 8 * dim;
    const int64_t f32_stride = storage::embedding_bytes<float>(dim) + 8 * dim;
    std::vector<uint8_t> fp8(rows * fp8_stride), f32(rows * f32_stride);
    std::vector<float> grad(dim), tmp(dim);
    std::vector<uint32_t> bits(dim);
    for (float& g : grad) g = normal(rng);
    std::vector<int64_t> order(rows);
    for (int64_t r = 0; r < rows; ++r) {
      order[r] = r;
      float* v = reinterpret_cast<float*>(&f32[r * f32_stride]);
      for (int64_t d = 0; d < dim; ++d) v[d] = normal(rng);
      std::fill(v + dim, v + 3 * dim, 0.f);
      uint8_t* w = &fp8[r * fp8_stride];
      cpu::write_scaled_row(reinterpret_cast<storage::Float8E4M3*>(w), v, dim, r, 0, bits.data());
      float* s = reinterpret_cast<float*>(w + storage::embedding_bytes<storage::Float8E4M3>(dim));
      std::fill(s, s + 2 * dim, 0.f);
    }
    std::shuffle(order.begin(), order.end(), rng);
    uint32_t sink = 0;
    const double draws = ns_a_row(rows, [&](int64_t i) {
      cpu::stochastic_bits_row(static_cast<uint64_t>(order[i]), 3, dim, bits.data());
      sink ^= bits[dim - 1];
    });
    const auto ahead = [&](const std::vector<uint8_t>& rows_of, int64_t stride, int64_t i) {
      if (i + cpu::kAhead < rows) {
        cpu::prefetch_bytes<true>(&rows_of[order[i + cpu::kAhead] * stride], stride);
      }
    };
    const double fp8_update = ns_a_row(rows, [&](int64_t i) {
      ahead(fp8, fp8_stride, i);
      uint8_t* w = &fp8[order[i] * fp8_stride];
      float* s = reinterpret_cast<float*>(w + storage::embedding_bytes<storage::Float8E4M3>(dim));
      cpu::update_scaled_row(a, reinterpret_cast<storage::Float8E4M3*>(w), s, grad.data(), dim,
                             static_cast<uint64_t>(order[i]), 3, tmp.data(), bits.data());
    });
    const double f32_update = ns_a_row(rows, [&](int64_t i) {
      ahead(f32, f32_stride, i);
      float* w = reinterpret_cast<float*>(&f32[order[i] * f32_stride]);
      cpu::update_float_row(a, w, w + dim, grad.data(), dim);
    });
    std::printf("| %lld | %.1f | %.1f | %.1f | %.2fx |%s\n", static_cast<long long>(dim), draws,
                fp8_update, f32_update, fp8_update / f32_update, sink == 1 ? " " : "");
  }
  return 0;
}
