// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/initializer_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "cc/embedding/fp8_rows_cpu.h"
#include "cc/embedding/prefetch_cpu.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

namespace {

// The initial values of a row (init_row_values: 4 * ceil(dim / 4) floats)
// where its draws form one run of Philox draws (draw's counter word 0 the
// block, the rest the key's): UNIFORM's element e is word e % 4 of draw
// e / 4, NORMAL's the Box-Muller pair of draw e / 2; the draws come from
// philox_words (eight at a time with AVX2), the values are init_value's bit
// for bit. False for the other modes (init_row_values draws them).
bool run_row_values(const InitArgs& a, int64_t key, int64_t table, int64_t dim, float* v,
                    std::vector<uint32_t>& words) {
  const auto mode = static_cast<InitMode>(a.mode);
  if (mode != InitMode::kUniform && mode != InitMode::kNormal) return false;
  const auto k = static_cast<uint64_t>(key);
  const StochasticDraws r{0u, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32),
                          static_cast<uint32_t>(a.seed),
                          static_cast<uint32_t>(a.seed >> 32) ^ static_cast<uint32_t>(table)};
  const int64_t padded = storage::pad4(dim);
  if (mode == InitMode::kUniform) {
    words.resize(static_cast<size_t>(padded));
    philox_words(r, padded, words.data());
    for (int64_t e = 0; e < padded; ++e) v[e] = uniform_of(a, words[e]);
    return true;
  }
  const int64_t pairs = padded / 2;
  words.resize(static_cast<size_t>(4 * pairs));
  philox_words(r, 4 * pairs, words.data());
  for (int64_t j = 0; j < pairs; ++j) {
    const Philox4 p{{words[4 * j], words[4 * j + 1], words[4 * j + 2], words[4 * j + 3]}};
    double n2[2];
    normal_pair(p, n2);
    for (int w = 0; w < 2; ++w) v[2 * j + w] = static_cast<float>(a.mean + a.std_dev * n2[w]);
  }
  return true;
}

}  // namespace

void init_rows(const InitArgs& a, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t dim, float* out) {
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(storage::pad4(dim)));
    std::vector<uint32_t> words;
    for (int64_t i = b; i < e; ++i) {
      float* row = out + i * dim;
      if (run_row_values(a, keys[i], table_ids[i], dim, tmp.data(), words)) {
        std::copy(tmp.begin(), tmp.begin() + dim, row);
      } else {
        for (int64_t j = 0; j < dim; ++j) row[j] = init_value(a, keys[i], table_ids[i], j);
      }
    }
  });
}

namespace {

template <class T>
void init_rows_at(const RowInitArgs& a, int64_t n) {
  const int64_t elements = init_row_elements<T>(a);
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(storage::pad4(a.dim)));
    std::vector<uint32_t> bits;
    const int64_t row_bytes = storage::embedding_bytes<T>(a.dim) + 4 * a.state_dim;
    for (int64_t i = b; i < e; ++i) {
      const int64_t offset = a.offsets[i];
      // The row kAhead entries ahead, to be written (prefetch_cpu.h).
      if (i + kAhead < e && a.offsets[i + kAhead] >= 0) {
        prefetch_bytes<true>(a.space.at(a.offsets[i + kAhead]), row_bytes);
      }
      if (offset < 0) continue;
      if (!run_row_values(a.init, a.keys[i], a.table_ids[i], a.dim, tmp.data(), bits)) {
        init_row_values(a, a.keys[i], a.table_ids[i], tmp.data());
      }
      if constexpr (storage::Scaled<T>::value) {
        bits.resize(static_cast<size_t>(a.dim));
        write_scaled_row(reinterpret_cast<storage::Float8E4M3*>(a.space.at(offset)), tmp.data(),
                         a.dim, static_cast<uint64_t>(a.keys[i]), 0, bits.data());
      } else {
        // init_row_block's elements: the values, zeros past dim.
        T* row = reinterpret_cast<T*>(a.space.at(offset));
        for (int64_t d = 0; d < elements; ++d) {
          row[d] = storage::from_float<T>(d < a.dim ? tmp[d] : 0.f);
        }
      }
      for (int64_t s = 0; s < a.state_dim; ++s) init_state_word<T>(a, offset, s);
    }
  });
}

}  // namespace

void init_rows_at(const RowInitArgs& a, int64_t n, storage::ElementType type) {
  switch (type) {
    case storage::ElementType::kFloat16:
      return init_rows_at<storage::Half>(a, n);
    case storage::ElementType::kBFloat16:
      return init_rows_at<storage::BFloat16>(a, n);
    case storage::ElementType::kFloat8E4M3:
      return init_rows_at<storage::Float8E4M3>(a, n);
    default:
      return init_rows_at<float>(a, n);
  }
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
