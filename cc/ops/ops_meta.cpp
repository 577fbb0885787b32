// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Meta (fake) kernels: output shapes only, so the ops trace under
// torch.compile / torch.export. Every output is sized by its inputs, not by
// the data (counts travel in separate tensors). Sizes are symbolic here
// (SymInt): the value checks of the real kernels are not repeated. Like every
// kernel, each first checks that its tensors share one device (check_devices):
// a meta tensor among real ones dispatches here.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "cc/admission/counter.h"
#include "cc/ops/counter_args.h"
#include "cc/ops/embedding_args.h"
#include "cc/ops/routing_args.h"
#include "cc/ops/storage_args.h"
#include "cc/ops/table_args.h"
#include "cc/ops/unique_args.h"
#include "cc/routing/batch_check.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor find_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                     const at::Tensor& table_keys, const at::Tensor& digests, at::Tensor& scores,
                     const at::Tensor& info, at::IntArrayRef /*policies*/,
                     const at::Tensor& score_values, bool /*update*/) {
  check_find_devices("table_find", keys, table_ids, table_keys, digests, scores, info,
                     score_values);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  return at::empty_symint({keys.sym_numel()}, keys.options());
}

std::tuple<at::Tensor, at::Tensor> find_gather_meta(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& table_keys,
    const at::Tensor& digests, at::Tensor& scores, const at::Tensor& info,
    at::IntArrayRef /*policies*/, const at::Tensor& score_values, bool /*update*/,
    const at::Tensor& values) {
  check_find_devices("table_find_gather", keys, table_ids, table_keys, digests, scores, info,
                     score_values, &values);
  TORCH_CHECK_VALUE(values.dim() == 2, "dynamicemb: values must be 2-D");
  return {at::empty_symint({keys.sym_numel()}, keys.options()),
          at::empty_symint({keys.sym_numel(), values.sym_size(1)}, values.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
run_meta(const at::Tensor& keys, const at::Tensor& table_ids, at::Tensor& table_keys,
         at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::Tensor& counters,
         at::Tensor& free_rows, at::IntArrayRef /*policies*/, const at::Tensor& score_values,
         int64_t op, bool /*assign_rows*/, int64_t /*total_buckets*/, bool /*has_rows*/,
         const std::optional<at::Tensor>& victim_scores,
         const std::optional<at::Tensor>& target_slots, bool /*refuse_cold*/,
         const std::optional<at::Tensor>& held_slots) {
  check_run_devices(keys, table_ids, table_keys, digests, scores, info, counters, free_rows,
                    score_values, victim_scores, target_slots, held_slots);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  check_op(op);
  TORCH_CHECK_VALUE(op != static_cast<int64_t>(table::RunOp::kPlace) || target_slots.has_value(),
                    "dynamicemb: place (op 3) needs target_slots");
  const c10::SymInt n = keys.sym_numel();
  const c10::SymInt ns = scores.sym_size(1);
  auto l = keys.options().dtype(at::kLong);
  return {at::empty_symint({n}, l), at::empty_symint({n}, keys.options().dtype(at::kChar)),
          at::empty_symint({n}, l), at::empty_symint({n, ns}, l),
          at::empty_symint({n}, l), at::empty_symint({n}, l),
          at::empty({1}, l)};
}

ExportResult export_meta(const at::Tensor& table_keys, const at::Tensor& scores,
                         const at::Tensor& info, int64_t slot_begin, int64_t slot_end,
                         int64_t /*column*/, int64_t /*threshold*/) {
  check_export_devices(table_keys, scores, info);
  TORCH_CHECK_VALUE(slot_begin >= 0 && slot_begin <= slot_end, "dynamicemb: slot range [",
                    slot_begin, ", ", slot_end, ") is empty or negative");
  const int64_t range = slot_end - slot_begin;
  auto l = table_keys.options().dtype(at::kLong);
  return {at::empty({range}, l), at::empty({range}, l), at::empty({range}, l),
          at::empty_symint({c10::SymInt(range), scores.sym_size(1)}, l), at::empty({1}, l)};
}

at::Tensor gather_rows_meta(const at::Tensor& values, const at::Tensor& rows) {
  check_devices("gather_rows", {{"values", &values}, {"rows", &rows}});
  TORCH_CHECK_TYPE(rows.scalar_type() == at::kLong, "dynamicemb: rows must be int64, got ",
                   rows.scalar_type());
  TORCH_CHECK_VALUE(values.dim() == 2, "dynamicemb: values must be 2-D");
  return at::empty_symint({rows.sym_numel(), values.sym_size(1)}, values.options());
}

at::Tensor init_rows_meta(const at::Tensor& keys, const at::Tensor& table_ids, int64_t dim,
                          int64_t /*mode*/, double /*mean*/, double /*std_dev*/, double /*lower*/,
                          double /*upper*/, double /*value*/, int64_t /*seed*/) {
  check_devices("init_rows", {{"keys", &keys}, {"table_ids", &table_ids}});
  TORCH_CHECK_VALUE(dim >= 0, "dynamicemb: dim must be non-negative, got ", dim);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  return at::empty_symint({keys.sym_numel(), c10::SymInt(dim)}, keys.options().dtype(at::kFloat));
}

void init_rows_at_meta(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& offsets,
                       const at::Tensor& keys, const at::Tensor& table_ids, int64_t /*dim*/,
                       int64_t /*mode*/, double /*mean*/, double /*std_dev*/, double /*lower*/,
                       double /*upper*/, double /*value*/, int64_t /*seed*/,
                       int64_t /*element_type*/, int64_t /*state_dim*/, int64_t /*fill_from*/,
                       double /*fill*/) {
  check_row_init_devices(seg0, seg1, offsets, keys, table_ids);
}

void optimizer_step_meta(at::Tensor& values, const at::Tensor& rows, const at::Tensor& grads,
                         at::ArrayRef<double> /*optim*/) {
  check_devices("optimizer_step", {{"values", &values}, {"rows", &rows}, {"grads", &grads}});
  TORCH_CHECK_TYPE(values.scalar_type() == at::kFloat, "dynamicemb: values must be float32");
}

at::Tensor home_starts_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                            const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view_devices("table_home_starts", table_keys, info, &keys, &table_ids);
  return at::empty_symint({keys.sym_numel()}, keys.options().dtype(at::kLong));
}

at::Tensor timer_meta(const at::Tensor& like) {
  return at::empty({1}, like.options().dtype(at::kLong));
}

at::Tensor count_meta(const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view_devices("table_count", table_keys, info);
  return at::empty_symint({info.sym_size(0)}, table_keys.options());
}

/// table_check_rows: its devices; the rule reads values, which a Meta tensor
/// does not have.
void check_rows_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                     const at::Tensor& table_keys, const at::Tensor& digests,
                     const at::Tensor& scores, const at::Tensor& info, const at::Tensor& free_rows,
                     const at::Tensor& score_values) {
  check_rows_devices(keys, table_ids, table_keys, digests, scores, info, free_rows, score_values);
}

at::Tensor route_keys_meta(const at::Tensor& keys, const at::Tensor& feature_ids,
                           const at::Tensor& dist_types, const at::Tensor& blocks,
                           int64_t /*world_size*/) {
  check_route_devices(keys, feature_ids, dist_types, blocks);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  return at::empty_symint({keys.sym_numel()}, keys.options());
}

/// check_batch's result has the shape of its lengths per feature.
at::Tensor check_batch_meta(const at::Tensor& values, const at::Tensor& lengths,
                            const c10::optional<at::Tensor>& weights,
                            const c10::optional<at::Tensor>& offsets,
                            const c10::optional<at::Tensor>& feature_mask, int64_t num_features,
                            int64_t /*stride*/, int64_t /*weight_rule*/,
                            const c10::optional<at::Tensor>& feature_rows) {
  check_batch_devices(values, lengths, weights, offsets, feature_mask, feature_rows);
  return at::empty({routing::kVerdictWords + num_features}, values.options().dtype(at::kLong));
}

at::Tensor embedding_pool_meta(const at::Tensor& seg0, const at::Tensor& seg1,
                               const at::Tensor& rows, const at::Tensor& inverse,
                               const at::Tensor& bag_offsets,
                               const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                               const at::Tensor& dims, c10::SymInt batch, int64_t out_width,
                               int64_t /*element_type*/, const c10::optional<at::Tensor>& fill,
                               bool /*tiled*/) {
  check_pool_devices(seg0, seg1, rows, inverse, bag_offsets, weights, cols, dims, fill);
  TORCH_CHECK_VALUE(out_width >= 0, "dynamicemb: out_width must not be negative, got ", out_width);
  return at::empty_symint({batch, out_width}, rows.options().dtype(at::kFloat));
}

void embedding_update_meta(at::Tensor& seg0, at::Tensor& seg1, const at::Tensor& grad_out,
                           const at::Tensor& rows, const at::Tensor& occ_offsets,
                           const at::Tensor& occ_order, const at::Tensor& occ_bag,
                           const c10::optional<at::Tensor>& weights, const at::Tensor& cols,
                           const at::Tensor& dims, c10::SymInt /*batch*/, int64_t /*element_type*/,
                           at::ArrayRef<double> /*optim*/,
                           const c10::optional<at::Tensor>& step_values,
                           const c10::optional<at::Tensor>& rounding) {
  check_update_devices(seg0, seg1, grad_out, rows, occ_offsets, occ_order, occ_bag, weights, cols,
                       dims, step_values, rounding);
}

at::Tensor counter_add_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                            at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores,
                            const at::Tensor& info, at::Tensor& counters,
                            const at::Tensor& frequencies, int64_t /*release_at*/,
                            int64_t /*total_buckets*/) {
  check_count_devices(keys, table_ids, table_keys, digests, scores, info, counters, frequencies);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  return at::empty_symint({keys.sym_numel()}, keys.options());
}

std::tuple<at::Tensor, at::Tensor> counter_admit_meta(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& store_keys,
    const at::Tensor& store_digests, const at::Tensor& store_scores, const at::Tensor& store_info,
    at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores, const at::Tensor& info,
    at::Tensor& counters, const at::Tensor& frequencies, int64_t /*threshold*/,
    int64_t /*total_buckets*/) {
  check_admit_devices(keys, table_ids, store_keys, store_digests, store_scores, store_info,
                      table_keys, digests, scores, info, counters, frequencies);
  TORCH_CHECK_TYPE(keys.scalar_type() == at::kLong, "dynamicemb: keys must be int64, got ",
                   keys.scalar_type());
  return {at::empty_symint({keys.sym_numel()}, keys.options().dtype(at::kChar)),
          at::empty({info.size(0), admission::kAdmitCols}, keys.options())};
}

void copy_rows_meta(at::Tensor& dst0, at::Tensor& dst1, const at::Tensor& dst_offsets,
                    const at::Tensor& src0, const at::Tensor& src1, const at::Tensor& src_offsets,
                    const at::Tensor& bytes) {
  check_copy_rows_devices(dst0, dst1, dst_offsets, src0, src1, src_offsets, bytes);
}

std::tuple<at::Tensor, at::Tensor> slot_rows_meta(const at::Tensor& slots, const at::Tensor& status,
                                                  int64_t /*stride*/, int64_t /*found*/) {
  check_slot_rows(slots, status);
  return {at::empty_like(slots), at::empty_like(slots)};
}

void count_failures_meta(at::Tensor& counts, const at::Tensor& rows, const at::Tensor& table_ids,
                         const c10::optional<at::Tensor>& valid) {
  check_count_failures(counts, rows, table_ids, valid);
}

at::Tensor adam_bias_meta(const at::Tensor& betas, c10::SymInt /*step*/) {
  check_betas(betas);
  return at::empty_like(betas);
}

std::tuple<at::Tensor, at::Tensor> occurrence_bags_meta(const at::Tensor& offsets,
                                                        const at::Tensor& feature_tables,
                                                        c10::SymInt num_indices, c10::SymInt batch,
                                                        bool sequence) {
  check_occurrence_bags(offsets, feature_tables, num_indices, batch);
  return {at::empty_symint({num_indices + (sequence ? 1 : 0)}, offsets.options()),
          at::empty_symint({num_indices}, offsets.options())};
}

UniqueResult segmented_unique_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, int64_t /*pad_key*/) {
  check_unique_args(keys, table_ids, num_tables);
  return empty_unique(keys, num_tables);
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, Meta, m) {
  m.impl("segmented_unique", &segmented_unique_meta);
  m.impl("adam_bias", &adam_bias_meta);
  m.impl("occurrence_bags", &occurrence_bags_meta);
  m.impl("table_find", &find_meta);
  m.impl("table_run", &run_meta);
  m.impl("counter_add", &counter_add_meta);
  m.impl("counter_admit", &counter_admit_meta);
  m.impl("table_find_gather", &find_gather_meta);
  m.impl("table_export", &export_meta);
  m.impl("table_count", &count_meta);
  m.impl("table_check_rows", &check_rows_meta);
  m.impl("table_home_starts", &home_starts_meta);
  m.impl("table_timer", &timer_meta);
  m.impl("gather_rows", &gather_rows_meta);
  m.impl("init_rows", &init_rows_meta);
  m.impl("init_rows_at", &init_rows_at_meta);
  m.impl("optimizer_step", &optimizer_step_meta);
  m.impl("copy_rows", &copy_rows_meta);
  m.impl("slot_rows", &slot_rows_meta);
  m.impl("count_failures", &count_failures_meta);
  m.impl("route_keys", &route_keys_meta);
  m.impl("check_batch", &check_batch_meta);
  m.impl("embedding_pool", &embedding_pool_meta);
  m.impl("embedding_update", &embedding_update_meta);
}

}  // namespace ops
}  // namespace dyn_emb
