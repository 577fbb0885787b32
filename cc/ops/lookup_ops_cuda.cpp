// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of the fused lookup ops (schemas in lookup_ops.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cc/embedding/lookup_cuda.h"
#include "cc/ops/lookup_ops.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor embedding_pool_cuda(const at::Tensor& values, const at::Tensor& rows,
                               const at::Tensor& inverse, const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, int64_t batch, int64_t out_width) {
  TORCH_CHECK_VALUE(out_width >= 0, "dynamicemb: out_width must not be negative, got ", out_width);
  check_same_device(values, {&rows, &inverse, &bag_offsets, &cols, &dims});
  if (weights.has_value()) check_same_device(values, {&*weights});
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::empty({batch, out_width}, values.options());
  const embedding::PoolArgs a =
      pool_args(values, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width, out);
  embedding::cuda::pool_forward(a, bag_offsets.numel() - 1,
                                c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

void embedding_update_cuda(at::Tensor& values, const at::Tensor& grad_out, const at::Tensor& rows,
                           const at::Tensor& occ_offsets, const at::Tensor& occ_order,
                           const at::Tensor& occ_bag, const c10::optional<at::Tensor>& weights,
                           const at::Tensor& cols, const at::Tensor& dims, int64_t batch,
                           int64_t type, double lr, double eps, double beta1, double beta2,
                           double weight_decay, int64_t wd_mode, int64_t step, double lr_power,
                           double ftrl_beta, double l1, double l2) {
  check_same_device(values, {&grad_out, &rows, &occ_offsets, &occ_order, &occ_bag, &cols, &dims});
  if (weights.has_value()) check_same_device(values, {&*weights});
  const c10::cuda::CUDAGuard guard(values.device());
  const embedding::OptimArgs o = optim_params(type, lr, eps, beta1, beta2, weight_decay, wd_mode,
                                              step, lr_power, ftrl_beta, l1, l2);
  const embedding::UpdateArgs a = update_args(values, grad_out, rows, occ_offsets, occ_order,
                                              occ_bag, weights, cols, dims, batch, o);
  // Hot keys (more than kHotChunk occurrences) are summed chunk by chunk.
  constexpr int64_t K = embedding::cuda::kHotChunk;
  const int64_t U = rows.numel(), n = occ_order.numel();
  embedding::cuda::HotKeys h;
  h.max_hot = n / (K + 1);
  at::Tensor chunk_offsets, hot_incl, buf;
  if (h.max_hot > 0 && U > 0) {
    const at::Tensor counts = occ_offsets.slice(0, 1) - occ_offsets.slice(0, 0, U);
    const at::Tensor hot = (counts > K).to(at::kLong);
    chunk_offsets = at::zeros({U + 1}, occ_offsets.options());
    chunk_offsets.slice(0, 1).copy_(at::cumsum(hot * at::floor_divide(counts + (K - 1), K), 0));
    hot_incl = at::cumsum(hot, 0);
    buf = at::zeros({h.max_hot, values.size(1)}, values.options());
    h.chunk_offsets = chunk_offsets.data_ptr<int64_t>();
    h.hot_incl = hot_incl.data_ptr<int64_t>();
    h.buf = buf.data_ptr<float>();
    h.buf_width = values.size(1);
    h.max_chunks = n / K + h.max_hot;
  } else {
    h.max_hot = 0;
  }
  embedding::cuda::update_backward(a, h, U, c10::cuda::getCurrentCUDAStream().stream());
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("embedding_pool", &embedding_pool_cuda);
  m.impl("embedding_update", &embedding_update_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
