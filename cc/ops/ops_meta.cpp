// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Meta (fake) kernels: output shapes only, so the ops trace under
// torch.compile / torch.export. Every output is sized by its inputs, not by
// the data (counts travel in separate tensors).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cc/ops/ops_common.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor find_meta(const at::Tensor& keys, const at::Tensor& table_ids,
                     const at::Tensor& table_keys, const at::Tensor& digests, at::Tensor& scores,
                     const at::Tensor& info, at::IntArrayRef policies,
                     const at::Tensor& score_values, bool update) {
  check_state(table_keys, digests, scores, info);
  check_batch(keys, table_ids, table_keys);
  check_scores(policies, score_values, keys.numel(), scores.size(1), table_keys);
  return at::empty({keys.numel()}, keys.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
run_meta(const at::Tensor& keys, const at::Tensor& table_ids, at::Tensor& table_keys,
         at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::Tensor& counters,
         at::Tensor& free_rows, at::IntArrayRef policies, const at::Tensor& score_values,
         int64_t op, bool assign_rows, int64_t total_buckets, bool has_rows) {
  check_state(table_keys, digests, scores, info);
  check_batch(keys, table_ids, table_keys);
  check_counters(counters, free_rows, info, table_keys);
  check_op(op);
  check_scores(policies, score_values, keys.numel(), scores.size(1), table_keys);
  return alloc_run_outputs(keys, scores.size(1)).tuple();
}

ExportResult export_meta(const at::Tensor& table_keys, const at::Tensor& scores,
                         const at::Tensor& info, int64_t slot_begin, int64_t slot_end,
                         int64_t column, int64_t threshold) {
  check_export(table_keys, scores, slot_begin, slot_end, column);
  return alloc_export(table_keys, scores, slot_end - slot_begin);
}

at::Tensor count_meta(const at::Tensor& table_keys, const at::Tensor& info) {
  return at::empty({info.size(0)}, table_keys.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, Meta, m) {
  m.impl("table_find", &find_meta);
  m.impl("table_run", &run_meta);
  m.impl("table_export", &export_meta);
  m.impl("table_count", &count_meta);
}

}  // namespace ops
}  // namespace dyn_emb
