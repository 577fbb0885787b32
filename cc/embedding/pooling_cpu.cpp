// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/pooling_cpu.h"

#include <ATen/Parallel.h>

#include <vector>

namespace dyn_emb {
namespace embedding {
namespace cpu {

// The CPU walks a bag's (a key's) occurrences once and streams whole rows.

void pool_forward(const PoolArgs& a, int64_t num_bags) {
  at::parallel_for(0, num_bags, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const BagSlot s = bag_slot(a.layout, b);
      float* o = a.out + s.offset;
      for (int64_t d = 0; d < s.dim; ++d) o[d] = 0.f;
      for (int64_t j = a.bag_offsets[b]; j < a.bag_offsets[b + 1]; ++j) {
        const float* v = occ_row(a, j);
        if (v == nullptr) continue;
        const float w = occ_weight(a.weights, j);
        for (int64_t d = 0; d < s.dim; ++d) o[d] += w * v[d];
      }
    }
  });
}

void update_backward(const UpdateArgs& a, int64_t num_keys) {
  at::parallel_for(0, num_keys, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> g;
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
      update_row(a.optim, a.values + r * a.width, g.data(), dim);
    }
  });
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
