// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/pooling_cpu.h"

#include <ATen/Parallel.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "cc/embedding/fp8_rows_cpu.h"
#include "cc/embedding/optimizer_cpu.h"
#include "cc/embedding/prefetch_cpu.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

// The CPU walks a bag's (a key's) occurrences once and streams whole rows.

namespace {

// o[d] += w * value(d) of a row (FP8 and float16 eight at a time where the
// CPU can, fp8_rows_cpu.h).
template <class T>
void add_row(float* o, float w, const T* v, int64_t dim) {
  if constexpr (storage::Scaled<T>::value) {
    add_codes(o, w, v, dim);
  } else if constexpr (std::is_same_v<T, storage::Half>) {
    add_halves(o, w, v, dim);
  } else {
    for (int64_t d = 0; d < dim; ++d) o[d] += w * storage::to_float(v[d]);
  }
}

}  // namespace

template <class T>
void pool_forward(const PoolArgs& a, int64_t num_bags) {
  at::parallel_for(0, num_bags, 256, [&](int64_t begin, int64_t end) {
    const int64_t last = a.bag_offsets[end];
    for (int64_t b = begin; b < end; ++b) {
      const BagSlot s = bag_slot(a.layout, b);
      // The bag's dim for the rows ahead, which may be another bag's: a hint.
      const int64_t ahead_bytes = storage::embedding_bytes<T>(s.dim);
      float* o = a.out + s.offset;
      for (int64_t d = 0; d < s.dim; ++d) o[d] = 0.f;
      for (int64_t j = a.bag_offsets[b]; j < a.bag_offsets[b + 1]; ++j) {
        if (j + kAhead < last) {
          if (const T* next = occ_row<T>(a, j + kAhead)) prefetch_bytes(next, ahead_bytes);
        }
        const T* v = occ_row<T>(a, j);
        if (v == nullptr) continue;
        const float w = occ_weight(a.weights, j) * storage::row_scale(v, s.dim);
        add_row(o, w, v, s.dim);
      }
    }
  });
}

template <class T>
void update_backward(const UpdateArgs& a, int64_t num_keys) {
  at::parallel_for(0, num_keys, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> g, tmp;
    std::vector<uint32_t> bits;
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = a.rows[u];
      if (r < 0) continue;
      const int64_t dim = key_dim(a, u);
      // The row and state of the key ahead, and its first occurrence's
      // gradient, of this key's dim (a hint).
      if (u + kAhead < end && a.rows[u + kAhead] >= 0) {
        prefetch_bytes(storage::embedding_at<T>(a.space, a.rows[u + kAhead]),
                       storage::embedding_bytes<T>(dim) + 4 * state_dim(a.optim.type, dim));
        const int64_t i = a.occ_offsets[u + kAhead];
        float w;
        if (i < a.occ_offsets[u + kAhead + 1]) prefetch_bytes(occ_grad_row(a, i, &w), 4 * dim);
      }
      g.assign(static_cast<size_t>(dim), 0.f);
      for (int64_t i = a.occ_offsets[u]; i < a.occ_offsets[u + 1]; ++i) {
        float w;
        const float* go = occ_grad_row(a, i, &w);
        for (int64_t d = 0; d < dim; ++d) g[d] += w * go[d];
      }
      if constexpr (storage::Scaled<T>::value) {
        tmp.resize(static_cast<size_t>(dim));
        bits.resize(static_cast<size_t>(dim));
        update_scaled_row(a.optim, storage::embedding_at<T>(a.space, r),
                          storage::state_at<T>(a.space, r, dim), g.data(), dim, sr_key(a, u),
                          sr_step(a), tmp.data(), bits.data());
      } else if constexpr (std::is_same_v<T, float>) {
        update_float_row(a.optim, storage::embedding_at<T>(a.space, r),
                         storage::state_at<T>(a.space, r, dim), g.data(), dim);
      } else {
        update_row(a.optim, storage::embedding_at<T>(a.space, r),
                   storage::state_at<T>(a.space, r, dim), g.data(), dim);
      }
    }
  });
}

void pool_forward(const PoolArgs& a, int64_t num_bags, storage::ElementType type) {
  switch (type) {
    case storage::ElementType::kFloat16:
      return pool_forward<storage::Half>(a, num_bags);
    case storage::ElementType::kBFloat16:
      return pool_forward<storage::BFloat16>(a, num_bags);
    case storage::ElementType::kFloat8E4M3:
      return pool_forward<storage::Float8E4M3>(a, num_bags);
    default:
      return pool_forward<float>(a, num_bags);
  }
}

void update_backward(const UpdateArgs& a, int64_t num_keys, storage::ElementType type) {
  switch (type) {
    case storage::ElementType::kFloat16:
      return update_backward<storage::Half>(a, num_keys);
    case storage::ElementType::kBFloat16:
      return update_backward<storage::BFloat16>(a, num_keys);
    case storage::ElementType::kFloat8E4M3:
      return update_backward<storage::Float8E4M3>(a, num_keys);
    default:
      return update_backward<float>(a, num_keys);
  }
}

void occurrence_bags(const OccurrenceBags& o, int64_t n, bool sequence, int64_t* bags,
                     int64_t* tables) {
  // One walk over the bags in order: bag b's occurrences follow bag b - 1's.
  int64_t b = 0;
  for (int64_t i = 0; i < n; ++i) {
    while (b + 1 < o.num_bags && o.offsets[b + 1] - o.offsets[0] <= i) ++b;
    tables[i] = bag_table(o, b);
    bags[i] = sequence ? i : b;
  }
  if (sequence) bags[n] = n;
}

void count_failures(const FailureCount& a) {
  for (int64_t i = 0; i < a.n; ++i) {
    const int64_t t = failure_table(a, i);
    if (t >= 0) ++a.counts[t];
  }
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
