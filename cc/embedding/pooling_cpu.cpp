// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/pooling_cpu.h"

#include <ATen/Parallel.h>

#include <vector>

namespace dyn_emb {
namespace embedding {
namespace cpu {

// The CPU walks a bag's (a key's) occurrences once and streams whole rows.

template <class T>
void pool_forward(const PoolArgs& a, int64_t num_bags) {
  at::parallel_for(0, num_bags, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const BagSlot s = bag_slot(a.layout, b);
      float* o = a.out + s.offset;
      for (int64_t d = 0; d < s.dim; ++d) o[d] = 0.f;
      for (int64_t j = a.bag_offsets[b]; j < a.bag_offsets[b + 1]; ++j) {
        const T* v = occ_row<T>(a, j);
        if (v == nullptr) continue;
        const float w = occ_weight(a.weights, j) * storage::row_scale(v, s.dim);
        for (int64_t d = 0; d < s.dim; ++d) o[d] += w * storage::to_float(v[d]);
      }
    }
  });
}

template <class T>
void update_backward(const UpdateArgs& a, int64_t num_keys) {
  at::parallel_for(0, num_keys, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> g, tmp;
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = a.rows[u];
      if (r < 0) continue;
      const int64_t dim = key_dim(a, u);
      g.assign(static_cast<size_t>(dim), 0.f);
      for (int64_t i = a.occ_offsets[u]; i < a.occ_offsets[u + 1]; ++i) {
        float w;
        const float* go = occ_grad_row(a, i, &w);
        for (int64_t d = 0; d < dim; ++d) g[d] += w * go[d];
      }
      if constexpr (storage::Scaled<T>::value) {
        tmp.resize(static_cast<size_t>(dim));
        update_scaled_row(a.optim, storage::embedding_at<T>(a.space, r),
                          storage::state_at<T>(a.space, r, dim), g.data(), dim, sr_key(a, u),
                          sr_step(a), tmp.data());
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
