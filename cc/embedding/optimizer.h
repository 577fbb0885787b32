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
//   EXACT_ADAGRAD          G (dim)             g += wd * w (L2); G += g^2;
//                                              w -= lr * g / (sqrt(G) + eps)
//   EXACT_ROWWISE_ADAGRAD  G (1 of 4 floats)   G += mean((g + wd w)^2) (L2) or mean(g^2);
//                                              k = lr / (sqrt(G) + eps);
//                                              w = c * w - k * g, c = 1 - k wd (L2), 1 - lr wd
//                                              (decoupled, wd_mode 2), else 1
//   FTRL                   linear (dim), accum (dim): the spec's FTRL-Proximal equations with
//                                              learning_rate_power p (n^(-p); p = -0.5 is sqrt).
//   ROWWISE_RMSPROP_AR     v, p, n (3 of 4 floats): FBGEMM's row-wise RMSprop with adaptive
//                                              regularization, plus a warm-up of new rows:
//                                              v = ema_beta v + (1 - ema_beta) mean(g^2);
//                                              gap = 1 if p == 0 (never updated) else t - p;
//                                              c = max(min_shrinkage, 1 - clamp(lr ar_alpha gap,
//                                              0, 1)); k = lr u / (sqrt(v) + eps), u = min(1,
//                                              (n + 1) / row_warmup_steps) (1 without warm-up);
//                                              w = c * w - k * g; p = t; n += 1.
//                                              A row's state starts at zeros (p = 0, n = 0), so a
//                                              row is "new" from its insertion until its first
//                                              update, and its age n counts its updates since.
//
// Host-device inline code: the CPU backend and the CUDA kernels run the same
// per-row function.
#pragma once

#include <cmath>
#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace embedding {

enum class OptimType : int32_t {
  kSGD = 0,
  kAdam = 1,
  kExactAdagrad = 2,
  kExactRowwiseAdagrad = 3,
  kFTRL = 4,
  kRowwiseRmspropAR = 5,
};
constexpr int32_t kNumOptimTypes = 6;

/// Floats of state a row-wise optimizer reserves after a row (16 bytes, so
/// that rows stay aligned): row-wise Adagrad uses the first, RMSprop AR the
/// first kRmspropARStateUsed.
constexpr int64_t kRowStateFloats = 4;
constexpr int64_t kRmspropARStateUsed = 3;
/// Positions in RMSprop AR's state: the EMA of mean(g^2), the step of the
/// row's last update (0: none), the row's updates since it was inserted.
enum RmspropARState : int32_t { kArEma = 0, kArLastStep = 1, kArUpdates = 2 };

/// Whether an optimizer takes one step size per row (row_step), not per coordinate.
DEMB_HD bool is_rowwise(int32_t type) {
  return type == static_cast<int32_t>(OptimType::kExactRowwiseAdagrad) ||
         type == static_cast<int32_t>(OptimType::kRowwiseRmspropAR);
}

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
    case OptimType::kRowwiseRmspropAR:
      return kRowStateFloats;
    default:
      return 0;
  }
}

/// Floats of a row's state (of state_dim) the update reads and writes: what
/// checkpoints and deltas carry of it.
DEMB_HD int64_t state_used(int32_t type, int64_t dim) {
  switch (static_cast<OptimType>(type)) {
    case OptimType::kExactRowwiseAdagrad:
      return 1;
    case OptimType::kRowwiseRmspropAR:
      return kRmspropARStateUsed;
    default:
      return state_dim(type, dim);
  }
}

/// An optimizer and its hyper-parameters, as the update functions read them.
struct OptimArgs {
  int32_t type = 0;  ///< OptimType
  float lr = 0.01f, eps = 1e-8f, beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0.0f;
  int32_t wd_mode = 0;  ///< WeightDecayMode
  int64_t step = 1;     ///< 1-based iteration (Adam's bias correction, RMSprop AR's t)
  float lr_power = -0.5f, ftrl_beta = 0.0f, l1 = 0.0f, l2 = 0.0f;
  /// RMSprop AR (FBGEMM's names): decay coefficient, EMA decay of mean(g^2),
  /// floor of the decay multiplier; updates over which a new row's step
  /// size ramps up to lr (0: none).
  float ar_alpha = 0.0f, ema_beta = 0.99f, min_shrinkage = 0.1f, row_warmup_steps = 0.0f;
  /// Adam's bias corrections 1 - beta1^step and 1 - beta2^step, computed once
  /// per call (with_step), not per coordinate.
  float bias1 = 1.0f, bias2 = 1.0f;
  /// When set, (2) floats in the memory of the backend that take the place of
  /// the values computed from `step` (so that a traced backward takes the
  /// iteration as data): Adam's (bias1, bias2), RMSprop AR's (step, unused).
  const float* step_values = nullptr;
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
  kFieldArAlpha = 12,
  kFieldEmaBeta = 13,
  kFieldMinShrinkage = 14,
  kFieldRowWarmupSteps = 15,
  kNumOptimFields = 16,
};

/// n^(-p) for FTRL; p = -0.5 takes the square root.
DEMB_HD float ftrl_pow(float n, float p) { return p == -0.5f ? sqrtf(n) : powf(n, -p); }

/// A row-wise optimizer's per-row factors (row_step).
struct RowFactors {
  float k = 0.f;  ///< step size
  float c = 1.f;  ///< weight scale (weight decay, adaptive regularization)
};

/// The squared gradient one coordinate adds to a row-wise optimizer's row sum
/// (L2 weight decay folded into the gradient). Summed over the row and divided
/// by dim (row_step) before any coordinate is updated.
DEMB_HD float rowwise_sq(const OptimArgs& a, float w, float g) {
  const bool l2 = a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2);
  const float gd = g + (l2 ? a.weight_decay * w : 0.f);
  return gd * gd;
}

/// The step `a` is at, as a float (RMSprop AR's step_values[0] when set).
DEMB_HD float step_of(const OptimArgs& a) {
  return a.step_values ? a.step_values[0] : static_cast<float>(a.step);
}

/// One step of a row-wise optimizer (is_rowwise) for a row whose state is s
/// (kRowStateFloats) and whose squared gradient averages `msq` over the row:
/// writes the row's new state to next (kRowStateFloats; s is only read) and
/// returns the factors of w = c * w - k * g.
DEMB_HD RowFactors row_step(const OptimArgs& a, const float* s, float msq, float* next) {
  for (int64_t i = 0; i < kRowStateFloats; ++i) next[i] = s[i];
  RowFactors f;
  if (a.type == static_cast<int32_t>(OptimType::kRowwiseRmspropAR)) {
    const float v = a.ema_beta * s[kArEma] + (1.f - a.ema_beta) * msq;
    const float t = step_of(a);
    const float n = s[kArUpdates];
    const float warm = a.row_warmup_steps > 0.f ? fminf(1.f, (n + 1.f) / a.row_warmup_steps) : 1.f;
    const float gap = s[kArLastStep] == 0.f ? 1.f : t - s[kArLastStep];
    const float lambda = fmaxf(0.f, fminf(1.f, a.lr * a.ar_alpha * gap));
    f.k = a.lr * warm / (sqrtf(v) + a.eps);
    f.c = fmaxf(a.min_shrinkage, 1.f - lambda);
    next[kArEma] = v;
    next[kArLastStep] = t;
    next[kArUpdates] = n + 1.f;
    return f;
  }
  next[0] = s[0] + msq;  // row-wise Adagrad
  f.k = a.lr / (sqrtf(next[0]) + a.eps);
  if (a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2)) {
    f.c = 1.f - f.k * a.weight_decay;
  } else if (a.wd_mode == static_cast<int32_t>(WeightDecayMode::kDecoupled)) {
    f.c = 1.f - a.lr * a.weight_decay;
  }
  return f;
}

/// Updates coordinate `d` of a row: its weight w (read into float32), its
/// state in s (the row's state, see state_dim), gradient gd. The row-wise
/// optimizers (is_rowwise) take their per-row factors `rf`, computed from the
/// whole row first (rowwise_sq, row_step); the others are per coordinate.
/// The CPU runs the coordinates of a row in a loop, the GPU gives them to the
/// lanes of a warp.
DEMB_HD void update_coord(const OptimArgs& a, float& w, float* s, float gd, int64_t d, int64_t dim,
                          const RowFactors& rf) {
  const bool l2 = a.wd_mode == static_cast<int32_t>(WeightDecayMode::kL2);
  switch (static_cast<OptimType>(a.type)) {
    case OptimType::kSGD:
      w -= a.lr * (gd + (l2 ? a.weight_decay * w : 0.f));
      break;
    case OptimType::kAdam: {
      const float c1 = a.step_values ? a.step_values[0] : a.bias1;
      const float c2 = a.step_values ? a.step_values[1] : a.bias2;
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
    case OptimType::kRowwiseRmspropAR:
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

/// A row-wise optimizer's factors (is_rowwise) for a row of `dim` elements
/// whose values are to_float(w[d]) * scale, with the gradient `g`: its state s
/// advanced (row_step) before any coordinate changes; nothing for the others.
template <class T>
DEMB_HD RowFactors row_factors(const OptimArgs& a, const T* w, float* s, const float* g,
                               int64_t dim, float scale) {
  RowFactors rf;
  if (!is_rowwise(a.type)) return rf;
  float sq = 0.f;
  for (int64_t d = 0; d < dim; ++d) sq += rowwise_sq(a, storage::to_float(w[d]) * scale, g[d]);
  float next[kRowStateFloats];
  rf = row_step(a, s, dim > 0 ? sq / static_cast<float>(dim) : 0.f, next);
  for (int64_t i = 0; i < kRowStateFloats; ++i) s[i] = next[i];
  return rf;
}

/// Updates one row in place with its (reduced) gradient `g` (dim): weights w
/// (dim T's), state s. (An FP8 row: update_scaled_row in fp8_rows_cpu.h, and
/// warp_update_scaled_row in warp_update.cuh.)
template <class T>
DEMB_HD void update_row(const OptimArgs& a, T* w, float* s, const float* g, int64_t dim) {
  using storage::from_float;
  using storage::to_float;
  const RowFactors rf = row_factors(a, w, s, g, dim, 1.f);
  for (int64_t d = 0; d < dim; ++d) {
    float wd = to_float(w[d]);
    update_coord(a, wd, s, g[d], d, dim, rf);
    w[d] = from_float<T>(wd);
  }
}

}  // namespace embedding
}  // namespace dyn_emb
