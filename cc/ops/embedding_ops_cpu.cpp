// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernels of the embedding ops: init_rows, optimizer_step, embedding_pool
// embedding_update and occurrence_bags (schemas in schemas.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cc/embedding/initializer_cpu.h"
#include "cc/embedding/optimizer_cpu.h"
#include "cc/embedding/pooling_cpu.h"
#include "cc/ops/embedding_args.h"
#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor embedding_pool_cpu(const at::Tensor& seg0, const at::Tensor& seg1,
                              const at::Tensor& rows, const at::Tensor& inverse,
                              const at::Tensor& bag_offsets,
                              const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                              const at::Tensor& dims, int64_t batch, int64_t out_width,
                              int64_t element_type, const c10::optional<at::Tensor>& fill,
                              bool tiled) {
  return pool_with(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, batch, out_width,
                   element_type, fill, tiled,
                   [](const embedding::PoolArgs& a, int64_t num_bags, storage::ElementType et) {
                     embedding::cpu::pool_forward(a, num_bags, et);
                   });
}

void embedding_update_cpu(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                          const at::Tensor& rows, const at::Tensor& occ_offsets,
                          const at::Tensor& occ_order, const at::Tensor& occ_bag,
                          const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                          const at::Tensor& dims, int64_t batch, int64_t element_type,
                          at::ArrayRef<double> optim, const c10::optional<at::Tensor>& step_values,
                          const c10::optional<at::Tensor>& rounding) {
  update_with(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols, dims,
              batch, element_type, optim_params(optim), step_values, rounding,
              [&](const embedding::UpdateArgs& a, storage::ElementType et) {
                embedding::cpu::update_backward(a, rows.numel(), et);
              });
}

at::Tensor init_rows_cpu(const at::Tensor& keys, const at::Tensor& table_ids, int64_t dim,
                         int64_t mode, double mean, double std_dev, double lower, double upper,
                         double value, int64_t seed) {
  const embedding::InitArgs a =
      init_args(keys, table_ids, dim, mode, mean, std_dev, lower, upper, value, seed);
  check_cpu(keys);
  at::Tensor out = at::empty({keys.numel(), dim}, keys.options().dtype(at::kFloat));
  embedding::cpu::init_rows(a, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                            keys.numel(), dim, out.data_ptr<float>());
  return out;
}

void init_rows_at_cpu(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& offsets,
                      const at::Tensor& keys, const at::Tensor& table_ids, int64_t dim,
                      int64_t mode, double mean, double std_dev, double lower, double upper,
                      double value, int64_t seed, int64_t element_type, int64_t state_dim,
                      int64_t fill_from, double fill) {
  const embedding::InitArgs init =
      init_args(keys, table_ids, dim, mode, mean, std_dev, lower, upper, value, seed);
  check_cpu(keys);
  const storage::ElementType et = ops::element_type(element_type);
  embedding::cpu::init_rows_at(row_init_args(seg0, seg1, offsets, keys, table_ids, dim, et,
                                             state_dim, fill_from, fill, init),
                               keys.numel(), et);
}

void optimizer_step_cpu(at::Tensor& values, const at::Tensor& rows, const at::Tensor& grads,
                        at::ArrayRef<double> optim) {
  const embedding::OptimArgs a = optim_args(values, rows, grads, optim);
  check_cpu(values);
  check_index_range(rows, -1, values.size(0), "row");
  const int64_t* r = rows.data_ptr<int64_t>();
  embedding::cpu::optimizer_step(a, values.data_ptr<float>(), values.size(1), r,
                                 grads.data_ptr<float>(), rows.numel(), grads.size(1));
}

std::tuple<at::Tensor, at::Tensor> occurrence_bags_cpu(const at::Tensor& offsets,
                                                       const at::Tensor& feature_tables,
                                                       int64_t num_indices, int64_t batch,
                                                       bool sequence) {
  return occurrence_bags_with(
      offsets, feature_tables, num_indices, batch, sequence,
      [](const embedding::OccurrenceBags& o, int64_t n, bool seq, int64_t* bags, int64_t* tables) {
        embedding::cpu::occurrence_bags(o, n, seq, bags, tables);
      });
}

void count_failures_cpu(at::Tensor& counts, const at::Tensor& rows, const at::Tensor& table_ids,
                        const c10::optional<at::Tensor>& valid) {
  count_failures_with(counts, rows, table_ids, valid,
                      [](const embedding::FailureCount& a) { embedding::cpu::count_failures(a); });
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("adam_bias", &adam_bias_op);
  m.impl("count_failures", &count_failures_cpu);
  m.impl("occurrence_bags", &occurrence_bags_cpu);
  m.impl("embedding_pool", &embedding_pool_cpu);
  m.impl("embedding_update", &embedding_update_cpu);
  m.impl("init_rows", &init_rows_cpu);
  m.impl("init_rows_at", &init_rows_at_cpu);
  m.impl("optimizer_step", &optimizer_step_cpu);
}

}  // namespace ops
}  // namespace dyn_emb
