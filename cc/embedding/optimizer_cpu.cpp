// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/embedding/optimizer_cpu.h"

#include <ATen/Parallel.h>

#include "cc/embedding/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dyn_emb {
namespace embedding {
namespace cpu {

namespace {

#if defined(__x86_64__)
// update_coord on coordinates [0, dim - dim % 8), eight at a time, for the
// optimizers whose coordinates take a few products, sums, divides and square
// roots (each operation in update_coord's order, no fused multiply-add);
// returns the coordinates done (0 for the others: FTRL's powers).
__attribute__((target("avx2"))) int64_t update_row_avx2(const OptimArgs& a, float* w, float* s,
                                                        const float* g, int64_t dim,
                                                        const RowFactors& rf) {
  const bool l2 = a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2);
  const __m256 lr = _mm256_set1_ps(a.lr), eps = _mm256_set1_ps(a.eps);
  const __m256 decay = _mm256_set1_ps(a.weight_decay), zero = _mm256_setzero_ps();
  // The gradient with L2 weight decay folded in (gd + 0: as update_coord adds).
  const auto decayed = [&](__m256 gd, __m256 wd) __attribute__((target("avx2"))) {
    return _mm256_add_ps(gd, l2 ? _mm256_mul_ps(decay, wd) : zero);
  };
  int64_t d = 0;
  switch (static_cast<OptimType>(a.type)) {
    case OptimType::kSGD:
      for (; d + 8 <= dim; d += 8) {
        const __m256 wd = _mm256_loadu_ps(w + d);
        const __m256 step = _mm256_mul_ps(lr, decayed(_mm256_loadu_ps(g + d), wd));
        _mm256_storeu_ps(w + d, _mm256_sub_ps(wd, step));
      }
      break;
    case OptimType::kAdam: {
      const __m256 b1 = _mm256_set1_ps(a.beta1), b2 = _mm256_set1_ps(a.beta2);
      const __m256 ob1 = _mm256_set1_ps(1.f - a.beta1), ob2 = _mm256_set1_ps(1.f - a.beta2);
      const __m256 c1 = _mm256_set1_ps(a.step_values ? a.step_values[0] : a.bias1);
      const __m256 c2 = _mm256_set1_ps(a.step_values ? a.step_values[1] : a.bias2);
      float* m = s;
      float* v = s + dim;
      for (; d + 8 <= dim; d += 8) {
        const __m256 gd = _mm256_loadu_ps(g + d);
        const __m256 wd = _mm256_loadu_ps(w + d);
        const __m256 md =
            _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + d)), _mm256_mul_ps(ob1, gd));
        const __m256 vd = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + d)),
                                        _mm256_mul_ps(_mm256_mul_ps(ob2, gd), gd));
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vd, c2)), eps);
        const __m256 step =
            _mm256_add_ps(_mm256_div_ps(_mm256_div_ps(md, c1), den), _mm256_mul_ps(decay, wd));
        _mm256_storeu_ps(m + d, md);
        _mm256_storeu_ps(v + d, vd);
        _mm256_storeu_ps(w + d, _mm256_sub_ps(wd, _mm256_mul_ps(lr, step)));
      }
      break;
    }
    case OptimType::kExactAdagrad:
      for (; d + 8 <= dim; d += 8) {
        const __m256 wd = _mm256_loadu_ps(w + d);
        const __m256 g2 = decayed(_mm256_loadu_ps(g + d), wd);
        const __m256 sd = _mm256_add_ps(_mm256_loadu_ps(s + d), _mm256_mul_ps(g2, g2));
        _mm256_storeu_ps(s + d, sd);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(sd), eps);
        _mm256_storeu_ps(w + d, _mm256_sub_ps(wd, _mm256_div_ps(_mm256_mul_ps(lr, g2), den)));
      }
      break;
    case OptimType::kExactRowwiseAdagrad:
    case OptimType::kRowwiseRmspropAR: {
      const __m256 c = _mm256_set1_ps(rf.c), k = _mm256_set1_ps(rf.k);
      for (; d + 8 <= dim; d += 8) {
        const __m256 wd = _mm256_mul_ps(c, _mm256_loadu_ps(w + d));
        _mm256_storeu_ps(w + d, _mm256_sub_ps(wd, _mm256_mul_ps(k, _mm256_loadu_ps(g + d))));
      }
      break;
    }
    default:
      break;
  }
  return d;
}
#endif

}  // namespace

void update_float_row(const OptimArgs& a, float* w, float* s, const float* g, int64_t dim) {
  // As update_row: a row-wise optimizer's factors first, then each coordinate.
  const RowFactors rf = row_factors(a, w, s, g, dim, 1.f);
  int64_t d = 0;
#if defined(__x86_64__)
  if (kAvx2) d = update_row_avx2(a, w, s, g, dim, rf);
#endif
  for (; d < dim; ++d) update_coord(a, w[d], s, g[d], d, dim, rf);
}

void optimizer_step(const OptimArgs& a, float* values, int64_t width, const int64_t* rows,
                    const float* grads, int64_t n, int64_t dim) {
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (rows[i] < 0) continue;
      float* row = values + rows[i] * width;
      update_float_row(a, row, row + dim, grads + i * dim, dim);
    }
  });
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
