// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/initializer_cpu.h"

#include <ATen/Parallel.h>

#include <vector>

#include "cc/embedding/fp8_rows_cpu.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

void init_rows(const InitArgs& a, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t dim, float* out) {
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < dim; ++j) out[i * dim + j] = init_value(a, keys[i], table_ids[i], j);
    }
  });
}

namespace {

template <class T>
void init_rows_at(const RowInitArgs& a, int64_t n) {
  const int64_t blocks = (init_row_elements<T>(a) + 3) / 4;
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    std::vector<float> tmp;
    std::vector<uint32_t> bits;
    for (int64_t i = b; i < e; ++i) {
      const int64_t offset = a.offsets[i];
      if (offset < 0) continue;
      if constexpr (storage::Scaled<T>::value) {
        tmp.resize(static_cast<size_t>(storage::pad4(a.dim)));
        bits.resize(static_cast<size_t>(a.dim));
        init_row_values(a, a.keys[i], a.table_ids[i], tmp.data());
        write_scaled_row(reinterpret_cast<storage::Float8E4M3*>(a.space.at(offset)), tmp.data(),
                         a.dim, static_cast<uint64_t>(a.keys[i]), 0, bits.data());
      } else {
        for (int64_t blk = 0; blk < blocks; ++blk) {
          init_row_block<T>(a, offset, a.keys[i], a.table_ids[i], blk);
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
