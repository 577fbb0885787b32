// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/initializer_cpu.h"

#include <ATen/Parallel.h>

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

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
