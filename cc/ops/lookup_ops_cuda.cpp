// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of the fused lookup ops (schemas in lookup_ops.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "cc/embedding/lookup_cuda.h"
#include "cc/ops/lookup_ops.h"

namespace dyn_emb {
namespace ops {
namespace {

/// Work space of the update's hot keys (more than kHotChunk occurrences),
/// summed chunk by chunk: see lookup_cuda.h. The tensors in `keep` hold it.
embedding::cuda::HotKeys hot_keys(const at::Tensor& grad_out, const at::Tensor& occ_offsets,
                                  int64_t num_keys, int64_t n, std::vector<at::Tensor>& keep) {
  constexpr int64_t K = embedding::cuda::kHotChunk;
  embedding::cuda::HotKeys h;
  h.max_hot = num_keys > 0 ? n / (K + 1) : 0;
  if (h.max_hot == 0) return h;
  const at::Tensor counts = occ_offsets.slice(0, 1) - occ_offsets.slice(0, 0, num_keys);
  const at::Tensor hot = (counts > K).to(at::kLong);
  at::Tensor chunk_offsets = at::zeros({num_keys + 1}, occ_offsets.options());
  chunk_offsets.slice(0, 1).copy_(at::cumsum(hot * at::floor_divide(counts + (K - 1), K), 0));
  keep = {chunk_offsets, at::cumsum(hot, 0),
          at::zeros({h.max_hot, grad_out.size(1)}, grad_out.options())};
  h.chunk_offsets = keep[0].data_ptr<int64_t>();
  h.hot_incl = keep[1].data_ptr<int64_t>();
  h.buf = keep[2].data_ptr<float>();
  h.buf_width = grad_out.size(1);
  h.max_chunks = n / K + h.max_hot;
  return h;
}

at::Tensor embedding_pool_cuda(const at::Tensor& seg0, const at::Tensor& seg1,
                               const at::Tensor& rows, const at::Tensor& inverse,
                               const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, int64_t batch, int64_t out_width,
                               int64_t element_type) {
  const c10::cuda::CUDAGuard guard(rows.device());
  return pool_with(
      seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width, element_type,
      [](const embedding::PoolArgs& a, int64_t num_bags, storage::ElementType et) {
        embedding::cuda::pool_forward(a, num_bags, et, c10::cuda::getCurrentCUDAStream().stream());
      });
}

void embedding_update_cuda(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                           const at::Tensor& rows, const at::Tensor& occ_offsets,
                           const at::Tensor& occ_order, const at::Tensor& occ_bag,
                           const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                           const at::Tensor& dims, int64_t batch, int64_t element_type,
                           int64_t type, double lr, double eps, double beta1, double beta2,
                           double weight_decay, int64_t wd_mode, int64_t step, double lr_power,
                           double ftrl_beta, double l1, double l2) {
  const c10::cuda::CUDAGuard guard(rows.device());
  update_with(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols, dims,
              batch, element_type,
              optim_params(type, lr, eps, beta1, beta2, weight_decay, wd_mode, step, lr_power,
                           ftrl_beta, l1, l2),
              [&](const embedding::UpdateArgs& a, storage::ElementType et) {
                std::vector<at::Tensor> keep;
                const embedding::cuda::HotKeys h =
                    hot_keys(grad_out, occ_offsets, rows.numel(), occ_order.numel(), keep);
                embedding::cuda::update_backward(a, h, rows.numel(), et,
                                                 c10::cuda::getCurrentCUDAStream().stream());
              });
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("embedding_pool", &embedding_pool_cuda);
  m.impl("embedding_update", &embedding_update_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
