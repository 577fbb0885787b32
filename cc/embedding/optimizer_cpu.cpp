// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/optimizer_cpu.h"

#include <ATen/Parallel.h>

namespace dyn_emb {
namespace embedding {
namespace cpu {

void optimizer_step(const OptimArgs& a, float* values, int64_t width, const int64_t* rows,
                    const float* grads, int64_t n, int64_t dim) {
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (rows[i] < 0) continue;
      float* row = values + rows[i] * width;
      update_row(a, row, row + dim, grads + i * dim, dim);
    }
  });
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
