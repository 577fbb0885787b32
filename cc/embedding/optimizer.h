// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Fused optimizer updates of embedding rows stored with their state:
//
//   row = [embedding (dim) of T | padding to 4 bytes | optimizer state]   state float32
//
// T is the table's element type (float32, float16, bfloat16: cc/storage/row_space.h);
// a weight is read into float32, updated with the float32 state and rounded back.
//
//   SGD                    no state            w -= lr * (g + wd * w)            (L2 if wd_mode 1)
//   ADAM                   m (dim), v (dim)    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//                                              w -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps)
//                                              + wd * w)
//   EXACT_ADAGRAD          G (dim)             g += wd * w (L2); G += g^2; w -= lr * g / (sqrt(G) +
//   eps) EXACT_ROWWISE_ADAGRAD  G (1 of 4 floats)   G += mean((g + wd w)^2) (L2) or mean(g^2);
//                                              k = lr / (sqrt(G) + eps);
//                                              w = c * w - k * g, c = 1 - k wd (L2), 1 - lr wd
//                                              (decoupled, wd_mode 2), else 1
//   FTRL                   linear (dim), accum (dim): the spec's FTRL-Proximal equations with
//                                              learning_rate_power p (n^(-p); p = -0.5 is sqrt).
//
// Host-device inline code: the CPU backend and the CUDA kernels run the same
// per-row function.
#pragma once

#include <cmath>
#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/embedding/fp8_rows.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace embedding {

enum class OptimType : int32_t {
  kSGD = 0,
  kAdam = 1,
  kExactAdagrad = 2,
  kExactRowwiseAdagrad = 3,
  kFTRL = 4,
};
constexpr int32_t kNumOptimTypes = 5;

enum class WeightDecayMode : int32_t { kNone = 0, kL2 = 1, kDecoupled = 2 };
constexpr int32_t kNumWeightDecayModes = 3;

/// Floats of state after a row's embedding.
DEMB_HD int64_t state_dim(int32_t type, int64_t dim) {
  switch (static_cast<OptimType>(type)) {
    case OptimType::kAdam:
    case OptimType::kFTRL:
      return 2 * dim;
    case OptimType::kExactAdagrad:
      return dim;
    case OptimType::kExactRowwiseAdagrad:
      return 4;  // 16 bytes reserved, the first float used
    default:
      return 0;
  }
}

/// An optimizer and its hyper-parameters, as the update functions read them.
struct OptimArgs {
  int32_t type = 0;  ///< OptimType
  float lr = 0.01f, eps = 1e-8f, beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0.0f;
  int32_t wd_mode = 0;  ///< WeightDecayMode
  int64_t step = 1;     ///< 1-based iteration (Adam's bias correction)
  float lr_power = -0.5f, ftrl_beta = 0.0f, l1 = 0.0f, l2 = 0.0f;
  /// Adam's bias corrections 1 - beta1^step and 1 - beta2^step, computed once
  /// per call (with_step), not per coordinate; or read from `bias` ((2), in
  /// the memory of the backend) when set.
  float bias1 = 1.0f, bias2 = 1.0f;
  const float* bias = nullptr;
};

/// `a` at iteration `step` (1-based), its bias corrections computed.
DEMB_HD OptimArgs with_step(OptimArgs a, int64_t step) {
  a.step = step;
  a.bias1 = 1.f - powf(a.beta1, static_cast<float>(step));
  a.bias2 = 1.f - powf(a.beta2, static_cast<float>(step));
  return a;
}

/// Positions of OptimArgs's fields in the one float list (`optim`) the ops
/// optimizer_step and embedding_update take, op schemas having no structs.
/// Python packs the list by these positions (dynamicemb._C.constants()["OptimField"],
/// whose names are RowOptimizer's field names, upper case).
enum OptimField : int32_t {
  kFieldType = 0,
  kFieldLearningRate = 1,
  kFieldEps = 2,
  kFieldBeta1 = 3,
  kFieldBeta2 = 4,
  kFieldWeightDecay = 5,
  kFieldWeightDecayMode = 6,
  kFieldStep = 7,
  kFieldLearningRatePower = 8,
  kFieldFtrlBeta = 9,
  kFieldL1Reg = 10,
  kFieldL2Reg = 11,
  kNumOptimFields = 12,
};

/// n^(-p) for FTRL; p = -0.5 takes the square root.
DEMB_HD float ftrl_pow(float n, float p) { return p == -0.5f ? sqrtf(n) : powf(n, -p); }

/// Row-wise Adagrad's per-row factors, from the row's new accumulator s0.
struct RowFactors {
  float k = 0.f;  ///< step size: lr / (sqrt(s0) + eps)
  float c = 1.f;  ///< weight scale (weight decay)
};

/// The squared gradient one coordinate adds to row-wise Adagrad's row sum
/// (L2 weight decay folded into the gradient). Summed over the row, divided by
/// dim and added to the accumulator before any coordinate is updated.
DEMB_HD float rowwise_sq(const OptimArgs& a, float w, float g) {
  const bool l2 = a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2);
  const float gd = g + (l2 ? a.weight_decay * w : 0.f);
  return gd * gd;
}

DEMB_HD RowFactors rowwise_factors(const OptimArgs& a, float s0) {
  RowFactors f;
  f.k = a.lr / (sqrtf(s0) + a.eps);
  if (a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2)) {
    f.c = 1.f - f.k * a.weight_decay;
  } else if (a.wd_mode == static_cast<int32_t>(WeightDecayMode::kDecoupled)) {
    f.c = 1.f - a.lr * a.weight_decay;
  }
  return f;
}

/// Updates coordinate `d` of a row: its weight w (read into float32), its
/// state in s (the row's state, see state_dim), gradient gd. Every optimizer
/// but row-wise Adagrad is per coordinate; row-wise Adagrad takes its per-row
/// factors `rf`, computed from the whole row first (rowwise_sq,
/// rowwise_factors). The CPU runs the coordinates of a row in a loop, the GPU
/// gives them to the lanes of a warp.
DEMB_HD void update_coord(const OptimArgs& a, float& w, float* s, float gd, int64_t d, int64_t dim,
                          const RowFactors& rf) {
  const bool l2 = a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2);
  switch (static_cast<OptimType>(a.type)) {
    case OptimType::kSGD:
      w -= a.lr * (gd + (l2 ? a.weight_decay * w : 0.f));
      break;
    case OptimType::kAdam: {
      const float c1 = a.bias ? a.bias[0] : a.bias1;
      const float c2 = a.bias ? a.bias[1] : a.bias2;
      float& m = s[d];
      float& v = s[dim + d];
      m = a.beta1 * m + (1.f - a.beta1) * gd;
      v = a.beta2 * v + (1.f - a.beta2) * gd * gd;
      w -= a.lr * ((m / c1) / (sqrtf(v / c2) + a.eps) + a.weight_decay * w);
      break;
    }
    case OptimType::kExactAdagrad: {
      const float g2 = gd + (l2 ? a.weight_decay * w : 0.f);
      s[d] += g2 * g2;
      w -= a.lr * g2 / (sqrtf(s[d]) + a.eps);
      break;
    }
    case OptimType::kExactRowwiseAdagrad:
      w = rf.c * w - rf.k * gd;
      break;
    case OptimType::kFTRL: {
      float& linear = s[d];
      float& accum = s[dim + d];
      const float n1 = accum + gd * gd;
      linear += gd - (ftrl_pow(n1, a.lr_power) - ftrl_pow(accum, a.lr_power)) / a.lr * w;
      w = fabsf(linear) <= a.l1 ? 0.f
                                : (copysignf(a.l1, linear) - linear) /
                                      ((a.ftrl_beta + ftrl_pow(n1, a.lr_power)) / a.lr + a.l2);
      accum = n1;
      break;
    }
  }
}

/// Updates one row in place with its (reduced) gradient `g` (dim): weights w
/// (dim T's), state s. (An FP8 row: update_scaled_row.)
template <class T>
DEMB_HD void update_row(const OptimArgs& a, T* w, float* s, const float* g, int64_t dim) {
  using storage::from_float;
  using storage::to_float;
  RowFactors rf;
  if (static_cast<OptimType>(a.type) == OptimType::kExactRowwiseAdagrad) {
    float sq = 0.f;
    for (int64_t d = 0; d < dim; ++d) sq += rowwise_sq(a, to_float(w[d]), g[d]);
    s[0] += dim > 0 ? sq / static_cast<float>(dim) : 0.f;
    rf = rowwise_factors(a, s[0]);
  }
  for (int64_t d = 0; d < dim; ++d) {
    float wd = to_float(w[d]);
    update_coord(a, wd, s, g[d], d, dim, rf);
    w[d] = from_float<T>(wd);
  }
}

/// Updates an FP8 row in place (cc/storage/row_space.h, "FP8 rows"): its
/// `dim` codes at `w` and their scale, its state `s`, with the gradient `g`.
/// The new values are computed in float32 into `tmp` (dim floats), then the
/// row gets the scale of their largest magnitude and each code its value
/// rounded stochastically with the bits of (`key`, the step, the element):
/// the same row, gradient and key give the same codes on every backend.
DEMB_HD void update_scaled_row(const OptimArgs& a, storage::Float8E4M3* w, float* s, const float* g,
                               int64_t dim, uint64_t key, float* tmp) {
  using storage::to_float;
  float* scale = storage::scale_at(w, dim);
  const float old = *scale;
  RowFactors rf;
  if (static_cast<OptimType>(a.type) == OptimType::kExactRowwiseAdagrad) {
    float sq = 0.f;
    for (int64_t d = 0; d < dim; ++d) sq += rowwise_sq(a, to_float(w[d]) * old, g[d]);
    s[0] += dim > 0 ? sq / static_cast<float>(dim) : 0.f;
    rf = rowwise_factors(a, s[0]);
  }
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) {
    float wd = to_float(w[d]) * old;
    update_coord(a, wd, s, g[d], d, dim, rf);
    tmp[d] = wd;
    amax = fmaxf(amax, fabsf(wd));
  }
  const float sc = storage::fp8_scale(amax);
  *scale = sc;
  for (int64_t d = 0; d < dim; ++d) w[d] = scaled_code(tmp[d], sc, key, a.step, d);
}

}  // namespace embedding
}  // namespace dyn_emb
