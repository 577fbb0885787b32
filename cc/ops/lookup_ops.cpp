// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The fused lookup ops (cc/embedding/lookup.h): schemas, CPU and Meta kernels.
//
//   embedding_pool(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch,
//                  out_width, element_type)
//       -> (batch, out_width) float32, every bag's weighted sum of its rows
//   embedding_update(seg0!, seg1!, grad_out, rows, occ_offsets, occ_order, occ_bag, weights,
//                    cols, dims, batch, element_type, <optimizer type and hyper-parameters>)
//       reduces each distinct key's gradient from grad_out and updates its row in place
//
// Rows are addressed by byte offset into the row space of segments seg0 and
// seg1 (cc/storage/row_space.h; any contiguous tensors, read as bytes);
// element_type is the embedding's storage::ElementType (0 float32, 1 float16,
// 2 bfloat16).
#include "cc/ops/lookup_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "cc/embedding/lookup_cpu.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor embedding_pool_cpu(const at::Tensor& seg0, const at::Tensor& seg1,
                              const at::Tensor& rows, const at::Tensor& inverse,
                              const at::Tensor& bag_offsets,
                              const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                              const at::Tensor& dims, int64_t batch, int64_t out_width,
                              int64_t element_type) {
  return pool_with(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width,
                   element_type,
                   [](const embedding::PoolArgs& a, int64_t num_bags, storage::ElementType et) {
                     embedding::cpu::pool_forward(a, num_bags, et);
                   });
}

void embedding_update_cpu(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                          const at::Tensor& rows, const at::Tensor& occ_offsets,
                          const at::Tensor& occ_order, const at::Tensor& occ_bag,
                          const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                          const at::Tensor& dims, int64_t batch, int64_t element_type, int64_t type,
                          double lr, double eps, double beta1, double beta2, double weight_decay,
                          int64_t wd_mode, int64_t step, double lr_power, double ftrl_beta,
                          double l1, double l2) {
  update_with(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols, dims,
              batch, element_type,
              optim_params(type, lr, eps, beta1, beta2, weight_decay, wd_mode, step, lr_power,
                           ftrl_beta, l1, l2),
              [&](const embedding::UpdateArgs& a, storage::ElementType et) {
                embedding::cpu::update_backward(a, rows.numel(), et);
              });
}

at::Tensor embedding_pool_meta(const at::Tensor& seg0, const at::Tensor& seg1,
                               const at::Tensor& rows, const at::Tensor& inverse,
                               const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, int64_t batch, int64_t out_width,
                               int64_t element_type) {
  return at::empty({batch, out_width}, rows.options().dtype(at::kFloat));
}

void embedding_update_meta(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                           const at::Tensor& rows, const at::Tensor& occ_offsets,
                           const at::Tensor& occ_order, const at::Tensor& occ_bag,
                           const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                           const at::Tensor& dims, int64_t batch, int64_t element_type,
                           int64_t type, double lr, double eps, double beta1, double beta2,
                           double weight_decay, int64_t wd_mode, int64_t step, double lr_power,
                           double ftrl_beta, double l1, double l2) {}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dynamicemb, m) {
  m.def(
      "embedding_pool(Tensor seg0, Tensor seg1, Tensor rows, Tensor inverse, Tensor bag_offsets, "
      "Tensor? weights, Tensor cols, Tensor dims, int batch, int out_width, int element_type) -> "
      "Tensor");
  m.def(
      "embedding_update(Tensor(a!) seg0, Tensor(b!) seg1, Tensor grad_out, Tensor rows, "
      "Tensor occ_offsets, Tensor occ_order, Tensor occ_bag, Tensor? weights, Tensor cols, "
      "Tensor dims, int batch, int element_type, int type, float lr, float eps, float beta1, "
      "float beta2, float weight_decay, int wd_mode, int step, float lr_power, float ftrl_beta, "
      "float l1, float l2) -> ()");
}

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("embedding_pool", &embedding_pool_cpu);
  m.impl("embedding_update", &embedding_update_cpu);
}

TORCH_LIBRARY_IMPL(dynamicemb, Meta, m) {
  m.impl("embedding_pool", &embedding_pool_meta);
  m.impl("embedding_update", &embedding_update_meta);
}

}  // namespace ops
}  // namespace dyn_emb
