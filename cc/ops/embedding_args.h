// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks and packing of the embedding ops (init_rows,
// optimizer_step, embedding_pool, embedding_update), shared by their CPU and
// CUDA kernels. Shapes, dtypes and devices are checked on every backend;
// index values only on the CPU, whose kernels would otherwise read out of
// bounds (the module builds them).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/embedding/initializer.h"
#include "cc/embedding/optimizer.h"
#include "cc/embedding/pooling.h"
#include "cc/ops/storage_args.h"
#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {

/// A float argument must be a finite number (NaN and infinity would spread
/// into every row the op writes).
inline void check_finite(double v, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(v), "dynamicemb: ", name, " must be finite, got ", v);
}

/// Checks init_rows' arguments and packs its parameters.
inline embedding::InitArgs init_args(const at::Tensor& keys, const at::Tensor& table_ids,
                                     int64_t dim, int64_t mode, double mean, double std_dev,
                                     double lower, double upper, double value, int64_t seed) {
  check_devices("init_rows", {{"keys", &keys}, {"table_ids", &table_ids}});
  check_1d(keys, at::kLong, "keys");
  check_1d(table_ids, at::kLong, "table_ids");
  TORCH_CHECK_VALUE(keys.numel() == table_ids.numel(),
                    "dynamicemb: keys and table_ids lengths differ: ", keys.numel(), " vs ",
                    table_ids.numel());
  TORCH_CHECK_VALUE(dim >= 0, "dynamicemb: dim must be non-negative, got ", dim);
  TORCH_CHECK_VALUE(dim <= (INT64_MAX / 8) / std::max<int64_t>(keys.numel(), 1),
                    "dynamicemb: ", keys.numel(), " rows of dim ", dim,
                    " are more than a tensor can address");
  check_finite(mean, "mean");
  check_finite(std_dev, "std_dev");
  check_finite(lower, "lower bound");
  check_finite(upper, "upper bound");
  check_finite(value, "value");
  TORCH_CHECK_VALUE(mode >= 0 && mode < embedding::kNumInitModes, "dynamicemb: initializer mode ",
                    mode, " is not one of 0..", embedding::kNumInitModes - 1);
  TORCH_CHECK_VALUE(std_dev >= 0, "dynamicemb: std_dev must be non-negative, got ", std_dev);
  TORCH_CHECK_VALUE(lower <= upper, "dynamicemb: lower bound ", lower, " is above upper bound ",
                    upper);
  embedding::InitArgs a;
  a.mode = static_cast<int32_t>(mode);
  a.mean = mean;
  a.std_dev = std_dev;
  a.lower = lower;
  a.upper = upper;
  a.value = value;
  a.seed = static_cast<uint64_t>(seed);
  return a;
}

/// init_rows_at's tensors on one device (CPU, CUDA, Meta).
inline void check_row_init_devices(const at::Tensor& seg0, const at::Tensor& seg1,
                                   const at::Tensor& offsets, const at::Tensor& keys,
                                   const at::Tensor& table_ids) {
  check_devices("init_rows_at", {{"offsets", &offsets},
                                 {"seg0", &seg0},
                                 {"seg1", &seg1},
                                 {"keys", &keys},
                                 {"table_ids", &table_ids}});
}

/// Checks init_rows_at's arguments and packs them (the rows' offsets on the
/// CPU only: a CUDA op does not read them on the host).
inline embedding::RowInitArgs row_init_args(const at::Tensor& seg0, const at::Tensor& seg1,
                                            const at::Tensor& offsets, const at::Tensor& keys,
                                            const at::Tensor& table_ids, int64_t dim,
                                            storage::ElementType type, int64_t state_dim,
                                            int64_t fill_from, double fill,
                                            const embedding::InitArgs& init) {
  check_row_init_devices(seg0, seg1, offsets, keys, table_ids);
  check_1d(offsets, at::kLong, "offsets");
  TORCH_CHECK_VALUE(offsets.numel() == keys.numel(),
                    "dynamicemb: offsets and keys lengths differ: ", offsets.numel(), " vs ",
                    keys.numel());
  TORCH_CHECK_VALUE(state_dim >= 0 && fill_from >= 0 && fill_from <= state_dim,
                    "dynamicemb: state_dim (", state_dim, ") and fill_from (", fill_from,
                    ") must satisfy 0 <= fill_from <= state_dim");
  check_scaled_dim(type, dim);
  embedding::RowInitArgs a;
  a.init = init;
  a.space = row_space(seg0, seg1, "rows");
  a.offsets = offsets.data_ptr<int64_t>();
  a.keys = keys.data_ptr<int64_t>();
  a.table_ids = table_ids.data_ptr<int64_t>();
  a.dim = dim;
  a.state_dim = state_dim;
  a.fill_from = fill_from;
  a.fill = static_cast<float>(fill);
  if (offsets.device().is_cpu()) {
    const int64_t bytes = storage::embedding_bytes(dim, type) + 4 * state_dim;
    for (int64_t i = 0; i < offsets.numel(); ++i) {
      check_row_offset(a.space, a.offsets[i], bytes, i, "row");
    }
  }
  return a;
}

/// Checks the ops' `optim` list (OptimArgs's fields at their OptimField
/// positions) and unpacks it.
inline embedding::OptimArgs optim_params(at::ArrayRef<double> optim) {
  using embedding::OptimField;
  TORCH_CHECK_VALUE(optim.size() == embedding::kNumOptimFields, "dynamicemb: optim must hold ",
                    embedding::kNumOptimFields, " values (OptimField), got ", optim.size());
  const auto integer = [&](OptimField f, const char* name) {
    const double v = optim[f];
    TORCH_CHECK_VALUE(v == std::floor(v) && std::fabs(v) < 9007199254740992.0,
                      "dynamicemb: optimizer ", name, " must be an integer, got ", v);
    return static_cast<int64_t>(v);
  };
  const int64_t type = integer(embedding::kFieldType, "type");
  const int64_t wd_mode = integer(embedding::kFieldWeightDecayMode, "weight_decay_mode");
  const int64_t step = integer(embedding::kFieldStep, "step");
  const int64_t warmup = integer(embedding::kFieldRowWarmupSteps, "row_warmup_steps");
  const double lr = optim[embedding::kFieldLearningRate];
  const double lr_power = optim[embedding::kFieldLearningRatePower];
  TORCH_CHECK_VALUE(type >= 0 && type < embedding::kNumOptimTypes, "dynamicemb: optimizer type ",
                    type, " is not one of 0..", embedding::kNumOptimTypes - 1);
  TORCH_CHECK_VALUE(wd_mode >= 0 && wd_mode < embedding::kNumWeightDecayModes,
                    "dynamicemb: weight decay mode ", wd_mode,
                    " is not 0 (none), 1 (L2) or 2 (decoupled)");
  TORCH_CHECK_VALUE(step >= 1, "dynamicemb: step must be at least 1, got ", step);
  const std::pair<OptimField, const char*> reals[] = {
      {embedding::kFieldLearningRate, "lr"},
      {embedding::kFieldEps, "eps"},
      {embedding::kFieldBeta1, "beta1"},
      {embedding::kFieldBeta2, "beta2"},
      {embedding::kFieldWeightDecay, "weight_decay"},
      {embedding::kFieldLearningRatePower, "lr_power"},
      {embedding::kFieldFtrlBeta, "ftrl_beta"},
      {embedding::kFieldL1Reg, "l1"},
      {embedding::kFieldL2Reg, "l2"},
      {embedding::kFieldArAlpha, "ar_alpha"},
      {embedding::kFieldEmaBeta, "ema_beta"},
      {embedding::kFieldMinShrinkage, "min_shrinkage"}};
  for (const auto& [field, name] : reals) check_finite(optim[field], name);
  if (type == static_cast<int64_t>(embedding::OptimType::kFTRL)) {
    TORCH_CHECK_VALUE(lr > 0, "dynamicemb: FTRL learning_rate must be positive, got ", lr);
    TORCH_CHECK_VALUE(lr_power <= 0, "dynamicemb: FTRL learning_rate_power must be <= 0, got ",
                      lr_power);
  }
  if (type == static_cast<int64_t>(embedding::OptimType::kRowwiseRmspropAR)) {
    const double ema = optim[embedding::kFieldEmaBeta];
    const double floor = optim[embedding::kFieldMinShrinkage];
    const double wd = optim[embedding::kFieldWeightDecay];
    TORCH_CHECK_VALUE(ema >= 0 && ema < 1, "dynamicemb: ROWWISE_RMSPROP_AR ema_beta must be in ",
                      "[0, 1), got ", ema);
    TORCH_CHECK_VALUE(floor >= 0 && floor <= 1, "dynamicemb: ROWWISE_RMSPROP_AR min_shrinkage ",
                      "must be in [0, 1], got ", floor);
    TORCH_CHECK_VALUE(optim[embedding::kFieldArAlpha] >= 0, "dynamicemb: ROWWISE_RMSPROP_AR ",
                      "ar_alpha must be >= 0, got ", optim[embedding::kFieldArAlpha]);
    TORCH_CHECK_VALUE(warmup >= 0, "dynamicemb: ROWWISE_RMSPROP_AR row_warmup_steps must be >= 0, ",
                      "got ", warmup);
    TORCH_CHECK_VALUE(wd == 0, "dynamicemb: ROWWISE_RMSPROP_AR takes no weight_decay (its ",
                      "adaptive regularization is its decay), got ", wd);
  }
  embedding::OptimArgs a;
  a.type = static_cast<int32_t>(type);
  a.lr = static_cast<float>(lr);
  a.eps = static_cast<float>(optim[embedding::kFieldEps]);
  a.beta1 = static_cast<float>(optim[embedding::kFieldBeta1]);
  a.beta2 = static_cast<float>(optim[embedding::kFieldBeta2]);
  a.weight_decay = static_cast<float>(optim[embedding::kFieldWeightDecay]);
  a.wd_mode = static_cast<int32_t>(wd_mode);
  a.lr_power = static_cast<float>(lr_power);
  a.ftrl_beta = static_cast<float>(optim[embedding::kFieldFtrlBeta]);
  a.l1 = static_cast<float>(optim[embedding::kFieldL1Reg]);
  a.l2 = static_cast<float>(optim[embedding::kFieldL2Reg]);
  a.ar_alpha = static_cast<float>(optim[embedding::kFieldArAlpha]);
  a.ema_beta = static_cast<float>(optim[embedding::kFieldEmaBeta]);
  a.min_shrinkage = static_cast<float>(optim[embedding::kFieldMinShrinkage]);
  a.row_warmup_steps = static_cast<float>(warmup);
  return embedding::with_step(a, step);
}

/// Checks optimizer_step's arguments and packs its hyper-parameters.
inline embedding::OptimArgs optim_args(const at::Tensor& values, const at::Tensor& rows,
                                       const at::Tensor& grads, at::ArrayRef<double> optim) {
  check_devices("optimizer_step", {{"values", &values}, {"rows", &rows}, {"grads", &grads}});
  TORCH_CHECK_TYPE(values.scalar_type() == at::kFloat && grads.scalar_type() == at::kFloat,
                   "dynamicemb: values and grads must be float32, got ", values.scalar_type(),
                   " and ", grads.scalar_type());
  TORCH_CHECK_VALUE(
      values.dim() == 2 && values.is_contiguous() && grads.dim() == 2 && grads.is_contiguous(),
      "dynamicemb: values and grads must be contiguous 2-D tensors, got shapes ", values.sizes(),
      " and ", grads.sizes());
  check_1d(rows, at::kLong, "rows");
  TORCH_CHECK_VALUE(rows.numel() == grads.size(0), "dynamicemb: ", rows.numel(), " rows but ",
                    grads.size(0), " gradients");
  embedding::OptimArgs a = optim_params(optim);
  const int64_t dim = grads.size(1);
  const int64_t need = dim + embedding::state_dim(a.type, dim);
  TORCH_CHECK_VALUE(values.size(1) >= need, "dynamicemb: rows of ", values.size(1),
                    " floats cannot hold dim ", dim, " plus the optimizer state (", need,
                    " floats)");
  return a;
}

/// Checks the layout tensors and returns it; num_bags = F * batch.
/// check_scaled_dim of every feature's dim (on the CPU: a CUDA op reads
/// nothing on the host; the tables' options bound an FP8 table's dim).
inline void check_scaled_dims(const at::Tensor& dims, storage::ElementType type) {
  if (type != storage::ElementType::kFloat8E4M3 || !dims.device().is_cpu()) return;
  const int64_t* d = dims.data_ptr<int64_t>();
  for (int64_t f = 0; f < dims.numel(); ++f) check_scaled_dim(type, d[f]);
}

inline embedding::BagLayout bag_layout(const at::Tensor& cols, const at::Tensor& dims,
                                       int64_t batch, int64_t out_width, int64_t num_bags) {
  check_1d(cols, at::kLong, "cols");
  check_1d(dims, at::kLong, "dims");
  TORCH_CHECK_VALUE(cols.numel() == dims.numel() && cols.numel() > 0,
                    "dynamicemb: cols and dims must name the same features, got ", cols.numel(),
                    " and ", dims.numel());
  TORCH_CHECK_VALUE(batch >= 0, "dynamicemb: batch must not be negative, got ", batch);
  TORCH_CHECK_VALUE(num_bags == cols.numel() * batch, "dynamicemb: ", num_bags,
                    " bags are not features (", cols.numel(), ") x batch (", batch, ")");
  if (cols.device().is_cpu()) {
    const int64_t* c = cols.data_ptr<int64_t>();
    const int64_t* d = dims.data_ptr<int64_t>();
    std::vector<std::pair<int64_t, int64_t>> spans;  // (first column, feature)
    for (int64_t f = 0; f < cols.numel(); ++f) {
      TORCH_CHECK_VALUE(d[f] >= 0 && c[f] >= 0 && c[f] + d[f] <= out_width, "dynamicemb: feature ",
                        f, " (columns ", c[f], " + dim ", d[f], ") does not fit outputs of ",
                        out_width);
      if (d[f] > 0) spans.emplace_back(c[f], f);
    }
    // Two features writing the same output columns have no defined result.
    std::sort(spans.begin(), spans.end());
    for (size_t j = 1; j < spans.size(); ++j) {
      const int64_t f = spans[j - 1].second, g = spans[j].second;
      TORCH_CHECK_VALUE(c[f] + d[f] <= c[g], "dynamicemb: features ", f, " and ", g,
                        " overlap in the output: cols ", c[f], " + dims ", d[f], " and cols ",
                        c[g]);
    }
  }
  embedding::BagLayout l;
  l.cols = cols.data_ptr<int64_t>();
  l.dims = dims.data_ptr<int64_t>();
  l.batch = batch;
  l.out_width = out_width;
  return l;
}

/// Optional per-occurrence weights: one per entry of `occurrences` (named
/// in the error), n of them.
inline const float* opt_weights(const c10::optional<at::Tensor>& weights, int64_t n,
                                const char* occurrences) {
  if (!weights.has_value()) return nullptr;
  TORCH_CHECK_TYPE(weights->scalar_type() == at::kFloat,
                   "dynamicemb: weights must be float32, got ", weights->scalar_type());
  TORCH_CHECK_VALUE(weights->dim() == 1 && weights->numel() == n && weights->is_contiguous(),
                    "dynamicemb: weights must be 1-D with one entry per occurrence (", n, " in ",
                    occurrences, "), got shape ", weights->sizes());
  return weights->data_ptr<float>();
}

/// CPU only: offsets start at 0, never decrease and end at n.
inline void check_offsets(const at::Tensor& off, int64_t n, const char* name) {
  if (!off.device().is_cpu()) return;
  const int64_t* p = off.data_ptr<int64_t>();
  const int64_t m = off.numel();
  TORCH_CHECK_VALUE(p[0] == 0 && p[m - 1] == n, "dynamicemb: ", name, " must run from 0 to ", n,
                    ", got ", p[0], " to ", p[m - 1]);
  for (int64_t i = 1; i < m; ++i) {
    TORCH_CHECK_VALUE(p[i] >= p[i - 1], "dynamicemb: ", name, " decreases at ", i, ": ", p[i - 1],
                      " then ", p[i]);
  }
}

inline embedding::PoolArgs pool_args(const at::Tensor& seg0, const at::Tensor& seg1,
                                     const at::Tensor& rows, const at::Tensor& inverse,
                                     const at::Tensor& bag_offsets,
                                     const c10::optional<at::Tensor>& weights,
                                     const at::Tensor& cols, const at::Tensor& dims, int64_t batch,
                                     int64_t out_width, storage::ElementType type,
                                     const c10::optional<at::Tensor>& fill, at::Tensor& out) {
  check_1d(rows, at::kLong, "rows");
  check_1d(inverse, at::kLong, "inverse");
  check_1d(bag_offsets, at::kLong, "bag_offsets");
  TORCH_CHECK_VALUE(bag_offsets.numel() >= 1, "dynamicemb: bag_offsets must not be empty");
  const int64_t n = inverse.numel();
  embedding::PoolArgs a;
  a.layout = bag_layout(cols, dims, batch, out_width, bag_offsets.numel() - 1);
  check_scaled_dims(dims, type);
  a.weights = opt_weights(weights, n, "inverse");
  check_offsets(bag_offsets, n, "bag_offsets");
  check_index_range(inverse, 0, rows.numel(), "inverse entry (an index into rows)");
  a.space = row_space(seg0, seg1, "values");
  a.rows = rows.data_ptr<int64_t>();
  int64_t num_fill = 0;
  if (fill.has_value()) {
    // FP8 fill rows are bytes: codes, padding and scale, as the table's rows.
    const at::ScalarType want = type == storage::ElementType::kFloat16      ? at::kHalf
                                : type == storage::ElementType::kBFloat16   ? at::kBFloat16
                                : type == storage::ElementType::kFloat8E4M3 ? at::kByte
                                                                            : at::kFloat;
    TORCH_CHECK_TYPE(fill->scalar_type() == want, "dynamicemb: fill must be ", want,
                     " (the embedding dtype), got ", fill->scalar_type());
    TORCH_CHECK_VALUE(fill->dim() == 2 && fill->is_contiguous(),
                      "dynamicemb: fill must be a contiguous 2-D tensor, got shape ",
                      fill->sizes());
    num_fill = fill->size(0);
    a.fill = static_cast<const uint8_t*>(fill->data_ptr());
    a.fill_row_bytes = fill->size(1) * fill->element_size();
  }
  if (rows.device().is_cpu()) {
    // Each occurrence's row (or fill row) holds its feature's embedding.
    const int64_t* bo = bag_offsets.data_ptr<int64_t>();
    const int64_t* inv = inverse.data_ptr<int64_t>();
    for (int64_t b = 0; b + 1 < bag_offsets.numel(); ++b) {
      const int64_t bytes = read_bytes(embedding::bag_slot(a.layout, b).dim, type);
      for (int64_t j = bo[b]; j < bo[b + 1]; ++j) {
        const int64_t r = a.rows[inv[j]];
        if (r >= -1) {
          check_row_offset(a.space, r, bytes, inv[j], "row");
          continue;
        }
        TORCH_CHECK_VALUE(embedding::fill_index(r) < num_fill && bytes <= a.fill_row_bytes,
                          "dynamicemb: row ", r, " at index ", inv[j], " reads fill row ",
                          embedding::fill_index(r), " of ", bytes, " bytes, but fill has ",
                          num_fill, " rows of ", a.fill_row_bytes, " bytes");
      }
    }
  }
  a.inverse = inverse.data_ptr<int64_t>();
  a.bag_offsets = bag_offsets.data_ptr<int64_t>();
  a.out = out.data_ptr<float>();
  return a;
}

inline embedding::UpdateArgs update_args(
    at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out, const at::Tensor& rows,
    const at::Tensor& occ_offsets, const at::Tensor& occ_order, const at::Tensor& occ_bag,
    const c10::optional<at::Tensor>& weights, const at::Tensor& cols, const at::Tensor& dims,
    int64_t batch, storage::ElementType type, const embedding::OptimArgs& optim,
    const c10::optional<at::Tensor>& step_values, const c10::optional<at::Tensor>& rounding) {
  TORCH_CHECK_VALUE(batch >= 0, "dynamicemb: batch must not be negative, got ", batch);
  TORCH_CHECK_TYPE(grad_out.scalar_type() == at::kFloat,
                   "dynamicemb: grad_out must be float32, got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.dim() == 2 && grad_out.is_contiguous() && grad_out.size(0) == batch,
                    "dynamicemb: grad_out must be a contiguous (batch = ", batch,
                    ", width) tensor, got ", grad_out.sizes());
  check_1d(rows, at::kLong, "rows");
  check_1d(occ_offsets, at::kLong, "occ_offsets");
  check_1d(occ_order, at::kLong, "occ_order");
  check_1d(occ_bag, at::kLong, "occ_bag");
  const int64_t n = occ_order.numel();
  TORCH_CHECK_VALUE(occ_offsets.numel() == rows.numel() + 1 && occ_bag.numel() == n,
                    "dynamicemb: occ_offsets (", occ_offsets.numel(), ") must have rows + 1 (",
                    rows.numel() + 1, ") entries and occ_bag (", occ_bag.numel(),
                    ") one per occurrence (", n, ")");
  embedding::UpdateArgs a;
  a.layout = bag_layout(cols, dims, batch, grad_out.size(1), cols.numel() * batch);
  check_scaled_dims(dims, type);
  a.weights = opt_weights(weights, n, "occ_order");
  check_offsets(occ_offsets, n, "occ_offsets");
  check_index_range(occ_order, 0, n, "occurrence");
  check_index_range(occ_bag, 0, cols.numel() * batch, "bag");
  a.optim = optim;
  if (step_values.has_value()) {
    TORCH_CHECK_TYPE(step_values->scalar_type() == at::kFloat,
                     "dynamicemb: step_values must be float32, got ", step_values->scalar_type());
    TORCH_CHECK_VALUE(step_values->numel() == 2 && step_values->is_contiguous(),
                      "dynamicemb: step_values must hold 2 contiguous floats, got shape ",
                      step_values->sizes());
    a.optim.step_values = step_values->data_ptr<float>();
  }
  a.space = row_space(seg0, seg1, "values");
  a.grad_out = grad_out.data_ptr<float>();
  a.rows = rows.data_ptr<int64_t>();
  a.occ_offsets = occ_offsets.data_ptr<int64_t>();
  a.occ_order = occ_order.data_ptr<int64_t>();
  a.occ_bag = occ_bag.data_ptr<int64_t>();
  if (rounding.has_value()) {
    check_1d(*rounding, at::kLong, "rounding");
    TORCH_CHECK_VALUE(rounding->numel() == rows.numel() + 1,
                      "dynamicemb: rounding must hold a key per row and the step (",
                      rows.numel() + 1, " values), got ", rounding->numel());
    a.keys = rounding->data_ptr<int64_t>();
    a.rounding_step = a.keys + rows.numel();
  }
  if (rows.device().is_cpu()) {
    // Each key's row holds its embedding and the optimizer state.
    for (int64_t u = 0; u < rows.numel(); ++u) {
      const int64_t dim = embedding::key_dim(a, u);
      const int64_t bytes =
          storage::embedding_bytes(dim, type) + 4 * embedding::state_dim(optim.type, dim);
      if (a.rows[u] < 0) continue;  // no row, or a fill row of the forward: not updated
      check_row_offset(a.space, a.rows[u], bytes, u, "row");
    }
  }
  return a;
}

/// The tensor arguments of embedding_pool, for check_devices (CPU, CUDA, Meta).
inline void check_pool_devices(const at::Tensor& seg0, const at::Tensor& seg1,
                               const at::Tensor& rows, const at::Tensor& inverse,
                               const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, const c10::optional<at::Tensor>& fill) {
  check_devices("embedding_pool", {{"rows", &rows},
                                   {"seg0", &seg0},
                                   {"seg1", &seg1},
                                   {"inverse", &inverse},
                                   {"bag_offsets", &bag_offsets},
                                   {"cols", &cols},
                                   {"dims", &dims}});
  if (weights.has_value()) {
    check_devices("embedding_pool", {{"rows", &rows}, {"weights", &*weights}});
  }
  if (fill.has_value()) check_devices("embedding_pool", {{"rows", &rows}, {"fill", &*fill}});
}

/// The tensor arguments of embedding_update, for check_devices (CPU, CUDA, Meta).
inline void check_update_devices(const at::Tensor& seg0, const at::Tensor& seg1,
                                 const at::Tensor& grad_out, const at::Tensor& rows,
                                 const at::Tensor& occ_offsets, const at::Tensor& occ_order,
                                 const at::Tensor& occ_bag,
                                 const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                                 const at::Tensor& dims,
                                 const c10::optional<at::Tensor>& step_values,
                                 const c10::optional<at::Tensor>& rounding) {
  check_devices("embedding_update", {{"rows", &rows},
                                     {"seg0", &seg0},
                                     {"seg1", &seg1},
                                     {"grad_out", &grad_out},
                                     {"occ_offsets", &occ_offsets},
                                     {"occ_order", &occ_order},
                                     {"occ_bag", &occ_bag},
                                     {"cols", &cols},
                                     {"dims", &dims}});
  if (weights.has_value()) {
    check_devices("embedding_update", {{"rows", &rows}, {"weights", &*weights}});
  }
  if (step_values.has_value()) {
    check_devices("embedding_update", {{"rows", &rows}, {"step_values", &*step_values}});
  }
  if (rounding.has_value()) {
    check_devices("embedding_update", {{"rows", &rows}, {"rounding", &*rounding}});
  }
}

/// occurrence_bags's arguments (CPU, CUDA, Meta): offsets (F * batch + 1) and
/// feature_tables (F), int64, contiguous, on one device; batch >= 1;
/// num_indices >= 0, in no bag only when there are none.
inline void check_occurrence_bags(const at::Tensor& offsets, const at::Tensor& feature_tables,
                                  const c10::SymInt& num_indices, const c10::SymInt& batch) {
  check_devices("occurrence_bags", {{"offsets", &offsets}, {"feature_tables", &feature_tables}});
  check_1d(offsets, at::kLong, "offsets");
  check_1d(feature_tables, at::kLong, "feature_tables");
  TORCH_CHECK_VALUE(batch >= 1, "dynamicemb: occurrence_bags: batch must be >= 1, got ", batch);
  TORCH_CHECK_VALUE(offsets.sym_numel() == feature_tables.sym_numel() * batch + 1,
                    "dynamicemb: occurrence_bags: offsets has ", offsets.sym_numel(),
                    " entries, not num_features (", feature_tables.sym_numel(), ") * batch (",
                    batch, ") + 1");
  TORCH_CHECK_VALUE(num_indices >= 0,
                    "dynamicemb: occurrence_bags: num_indices must not be negative, got ",
                    num_indices);
  TORCH_CHECK_VALUE(offsets.sym_numel() > 1 || num_indices == 0,
                    "dynamicemb: occurrence_bags: ", num_indices, " occurrences but no bag");
}

/// occurrence_bags on one backend: checks, allocates (bags, table ids), then
/// run(bags, n, sequence, bags, tables) writes them (pooling.h's
/// OccurrenceBags).
template <class Run>
std::tuple<at::Tensor, at::Tensor> occurrence_bags_with(const at::Tensor& offsets,
                                                        const at::Tensor& feature_tables,
                                                        int64_t num_indices, int64_t batch,
                                                        bool sequence, const Run& run) {
  check_occurrence_bags(offsets, feature_tables, num_indices, batch);
  at::Tensor bags = at::empty({num_indices + (sequence ? 1 : 0)}, offsets.options());
  at::Tensor tables = at::empty({num_indices}, offsets.options());
  embedding::OccurrenceBags o;
  o.offsets = offsets.data_ptr<int64_t>();
  o.num_bags = offsets.numel() - 1;
  o.feature_tables = feature_tables.data_ptr<int64_t>();
  o.batch = batch;
  run(o, num_indices, sequence, bags.data_ptr<int64_t>(), tables.data_ptr<int64_t>());
  return {bags, tables};
}

/// count_failures's arguments (CPU, CUDA, Meta): counts (num_tables), rows
/// and table_ids (n) int64, valid (n) bool, on one device.
inline void check_count_failures(const at::Tensor& counts, const at::Tensor& rows,
                                 const at::Tensor& table_ids,
                                 const c10::optional<at::Tensor>& valid) {
  if (valid.has_value()) {
    check_devices(
        "count_failures",
        {{"counts", &counts}, {"rows", &rows}, {"table_ids", &table_ids}, {"valid", &*valid}});
  } else {
    check_devices("count_failures",
                  {{"counts", &counts}, {"rows", &rows}, {"table_ids", &table_ids}});
  }
  check_1d(counts, at::kLong, "counts");
  check_1d(rows, at::kLong, "rows");
  check_1d(table_ids, at::kLong, "table_ids");
  if (valid.has_value()) check_1d(*valid, at::kBool, "valid");
  TORCH_CHECK_VALUE(table_ids.sym_numel() == rows.sym_numel() &&
                        (!valid.has_value() || valid->sym_numel() == rows.sym_numel()),
                    "dynamicemb: count_failures takes one table id (and valid flag) per row, got ",
                    table_ids.sym_numel(), " table ids for ", rows.sym_numel(), " rows");
}

/// count_failures on one backend: checks, then run(args) adds the counts
/// (pooling.h, FailureCount).
template <class Run>
void count_failures_with(at::Tensor& counts, const at::Tensor& rows, const at::Tensor& table_ids,
                         const c10::optional<at::Tensor>& valid, const Run& run) {
  check_count_failures(counts, rows, table_ids, valid);
  embedding::FailureCount a;
  a.rows = rows.data_ptr<int64_t>();
  a.table_ids = table_ids.data_ptr<int64_t>();
  a.valid = valid.has_value() ? valid->data_ptr<bool>() : nullptr;
  a.counts = counts.data_ptr<int64_t>();
  a.num_tables = counts.numel();
  a.n = rows.numel();
  run(a);
}

/// adam_bias's betas: (2) float32 (CPU, CUDA, Meta).
inline void check_betas(const at::Tensor& betas) {
  TORCH_CHECK_TYPE(betas.scalar_type() == at::kFloat, "dynamicemb: betas must be float32, got ",
                   betas.scalar_type());
  TORCH_CHECK_VALUE(betas.dim() == 1 && betas.sym_numel() == 2,
                    "dynamicemb: betas must hold 2 values (beta1, beta2), got shape ",
                    betas.sym_sizes());
}

/// The adam_bias op (CPU and CUDA): 1 - betas^step, float32.
inline at::Tensor adam_bias_op(const at::Tensor& betas, int64_t step) {
  check_betas(betas);
  TORCH_CHECK_VALUE(step >= 1, "dynamicemb: adam_bias: step must be >= 1 (1-based), got ", step);
  return at::rsub(at::pow(betas, static_cast<double>(step)), 1.0);
}

/// embedding_pool on one backend: checks, allocates the output, then
/// run(args, num_bags) computes it.
template <class Run>
at::Tensor pool_with(const at::Tensor& seg0, const at::Tensor& seg1, const at::Tensor& rows,
                     const at::Tensor& inverse, const at::Tensor& bag_offsets,
                     const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                     const at::Tensor& dims, int64_t batch, int64_t out_width, int64_t type,
                     const c10::optional<at::Tensor>& fill, bool tiled, const Run& run) {
  check_pool_devices(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, fill);
  TORCH_CHECK_VALUE(out_width >= 0, "dynamicemb: out_width must not be negative, got ", out_width);
  TORCH_CHECK_VALUE(batch >= 0, "dynamicemb: batch must not be negative, got ", batch);
  check_1d(cols, at::kLong, "cols");
  check_1d(bag_offsets, at::kLong, "bag_offsets");
  TORCH_CHECK_VALUE(bag_offsets.numel() == cols.numel() * batch + 1, "dynamicemb: bag_offsets has ",
                    bag_offsets.numel(), " entries, not features (", cols.numel(),
                    " in cols) x batch (", batch, ") + 1");
  TORCH_CHECK_VALUE(out_width <= (INT64_MAX / 8) / std::max<int64_t>(batch, 1),
                    "dynamicemb: an output of batch (", batch, ") x out_width (", out_width,
                    ") floats is more than a tensor can address");
  const storage::ElementType et = element_type(type);
  // Every bag writes its feature's columns: only columns of no feature need
  // zeros (a pass over the whole output otherwise).
  const auto f32 = rows.options().dtype(at::kFloat);
  at::Tensor out = tiled ? at::empty({batch, out_width}, f32) : at::zeros({batch, out_width}, f32);
  run(pool_args(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width, et,
                fill, out),
      bag_offsets.numel() - 1, et);
  return out;
}

/// embedding_update on one backend: checks and packs, then run(args) updates.
template <class Run>
void update_with(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                 const at::Tensor& rows, const at::Tensor& occ_offsets, const at::Tensor& occ_order,
                 const at::Tensor& occ_bag, const c10::optional<at::Tensor>& weights,
                 const at::Tensor& cols, const at::Tensor& dims, int64_t batch, int64_t type,
                 const embedding::OptimArgs& optim, const c10::optional<at::Tensor>& step_values,
                 const c10::optional<at::Tensor>& rounding, const Run& run) {
  check_update_devices(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols,
                       dims, step_values, rounding);
  const storage::ElementType et = element_type(type);
  run(update_args(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols, dims,
                  batch, et, optim, step_values, rounding),
      et);
}

}  // namespace ops
}  // namespace dyn_emb
