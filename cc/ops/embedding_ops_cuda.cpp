// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of the embedding ops: init_rows, optimizer_step, embedding_pool
// embedding_update and occurrence_bags (schemas in schemas.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cc/embedding/initializer_cuda.h"
#include "cc/embedding/optimizer_cuda.h"
#include "cc/embedding/pooling_cuda.h"
#include "cc/ops/embedding_args.h"

namespace dyn_emb {
namespace ops {
namespace {

/// Work space of the update's hot keys (more than kHotChunk occurrences),
/// made on the device (pooling_cuda.h) in one scratch tensor that `keep` holds.
embedding::cuda::HotKeys hot_keys(const at::Tensor& grad_out, const at::Tensor& occ_offsets,
                                  int64_t num_keys, int64_t n, at::Tensor& keep) {
  const int64_t width = grad_out.size(1);
  const size_t bytes = embedding::cuda::hot_keys_scratch(num_keys, n, width);
  if (bytes == 0) return {};
  keep = at::empty({static_cast<int64_t>(bytes)}, occ_offsets.options().dtype(at::kByte));
  return embedding::cuda::hot_keys(occ_offsets.data_ptr<int64_t>(), num_keys, n, width,
                                   keep.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
}

at::Tensor embedding_pool_cuda(const at::Tensor& seg0, const at::Tensor& seg1,
                               const at::Tensor& rows, const at::Tensor& inverse,
                               const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, int64_t batch, int64_t out_width,
                               int64_t element_type, const c10::optional<at::Tensor>& fill,
                               bool tiled) {
  const c10::cuda::CUDAGuard guard(rows.device());
  return pool_with(
      seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width, element_type,
      fill, tiled, [](const embedding::PoolArgs& a, int64_t num_bags, storage::ElementType et) {
        embedding::cuda::pool_forward(a, num_bags, et, c10::cuda::getCurrentCUDAStream().stream());
      });
}

void embedding_update_cuda(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                           const at::Tensor& rows, const at::Tensor& occ_offsets,
                           const at::Tensor& occ_order, const at::Tensor& occ_bag,
                           const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                           const at::Tensor& dims, int64_t batch, int64_t element_type,
                           at::ArrayRef<double> optim, const c10::optional<at::Tensor>& step_values,
                           const c10::optional<at::Tensor>& rounding) {
  const c10::cuda::CUDAGuard guard(rows.device());
  update_with(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols, dims,
              batch, element_type, optim_params(optim), step_values, rounding,
              [&](const embedding::UpdateArgs& a, storage::ElementType et) {
                at::Tensor keep;
                const embedding::cuda::HotKeys h =
                    hot_keys(grad_out, occ_offsets, rows.numel(), occ_order.numel(), keep);
                embedding::cuda::update_backward(a, h, rows.numel(), et,
                                                 c10::cuda::getCurrentCUDAStream().stream());
              });
}

at::Tensor init_rows_cuda(const at::Tensor& keys, const at::Tensor& table_ids, int64_t dim,
                          int64_t mode, double mean, double std_dev, double lower, double upper,
                          double value, int64_t seed) {
  const embedding::InitArgs a =
      init_args(keys, table_ids, dim, mode, mean, std_dev, lower, upper, value, seed);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor out = at::empty({keys.numel(), dim}, keys.options().dtype(at::kFloat));
  embedding::cuda::init_rows(a, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                             keys.numel(), dim, out.data_ptr<float>(),
                             c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

void init_rows_at_cuda(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& offsets,
                       const at::Tensor& keys, const at::Tensor& table_ids, int64_t dim,
                       int64_t mode, double mean, double std_dev, double lower, double upper,
                       double value, int64_t seed, int64_t element_type, int64_t state_dim,
                       int64_t fill_from, double fill) {
  const embedding::InitArgs init =
      init_args(keys, table_ids, dim, mode, mean, std_dev, lower, upper, value, seed);
  c10::cuda::CUDAGuard guard(keys.device());
  const storage::ElementType et = ops::element_type(element_type);
  embedding::cuda::init_rows_at(row_init_args(seg0, seg1, offsets, keys, table_ids, dim, et,
                                              state_dim, fill_from, fill, init),
                                keys.numel(), et, c10::cuda::getCurrentCUDAStream().stream());
}

void optimizer_step_cuda(at::Tensor& values, const at::Tensor& rows, const at::Tensor& grads,
                         at::ArrayRef<double> optim) {
  const embedding::OptimArgs a = optim_args(values, rows, grads, optim);
  c10::cuda::CUDAGuard guard(values.device());
  embedding::cuda::optimizer_step(a, values.data_ptr<float>(), values.size(0), values.size(1),
                                  rows.data_ptr<int64_t>(), grads.data_ptr<float>(), rows.numel(),
                                  grads.size(1), c10::cuda::getCurrentCUDAStream().stream());
}

std::tuple<at::Tensor, at::Tensor> occurrence_bags_cuda(const at::Tensor& offsets,
                                                        const at::Tensor& feature_tables,
                                                        int64_t num_indices, int64_t batch,
                                                        bool sequence) {
  const c10::cuda::CUDAGuard guard(offsets.device());
  return occurrence_bags_with(
      offsets, feature_tables, num_indices, batch, sequence,
      [](const embedding::OccurrenceBags& o, int64_t n, bool seq, int64_t* bags, int64_t* tables) {
        embedding::cuda::occurrence_bags(o, n, seq, bags, tables,
                                         c10::cuda::getCurrentCUDAStream().stream());
      });
}

void count_failures_cuda(at::Tensor& counts, const at::Tensor& rows, const at::Tensor& table_ids,
                         const c10::optional<at::Tensor>& valid) {
  const c10::cuda::CUDAGuard guard(rows.device());
  count_failures_with(counts, rows, table_ids, valid, [](const embedding::FailureCount& a) {
    embedding::cuda::count_failures(a, c10::cuda::getCurrentCUDAStream().stream());
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("adam_bias", &adam_bias_op);
  m.impl("count_failures", &count_failures_cuda);
  m.impl("occurrence_bags", &occurrence_bags_cuda);
  m.impl("embedding_pool", &embedding_pool_cuda);
  m.impl("embedding_update", &embedding_update_cuda);
  m.impl("init_rows", &init_rows_cuda);
  m.impl("init_rows_at", &init_rows_at_cuda);
  m.impl("optimizer_step", &optimizer_step_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
