// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of the table ops. Shapes and dtypes are checked here; key
// values are not (that would synchronize): a reserved key or a table id out
// of range gets status kInvalid / slot -1 and leaves the table untouched. The
// Python wrapper checks values when asked to (ScoredHashTable(validate=True)).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cc/ops/cuda_scratch.h"
#include "cc/ops/table_args.h"
#include "cc/ops/tensor_checks.h"
#include "cc/table/table_cuda.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor find_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                     const at::Tensor& table_keys, const at::Tensor& digests, at::Tensor& scores,
                     const at::Tensor& info, at::IntArrayRef policies,
                     const at::Tensor& score_values, bool update) {
  check_find("table_find", keys, table_ids, table_keys, digests, scores, info, policies,
             score_values);
  const int64_t n = keys.numel();
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor slots = at::empty({n}, keys.options());
  const table::TableRef t = table_ref(table_keys, digests, scores, info, nullptr, nullptr);
  const table::ScoreArgs a = score_args(policies, score_values, n);
  TorchScratch scratch(keys);
  table::cuda::find(t, a, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n, update,
                    slots.data_ptr<int64_t>(), scratch, c10::cuda::getCurrentCUDAStream().stream());
  return slots;
}

std::tuple<at::Tensor, at::Tensor> find_gather_cuda(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& table_keys,
    const at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::IntArrayRef policies,
    const at::Tensor& score_values, bool update, const at::Tensor& values) {
  check_find("table_find_gather", keys, table_ids, table_keys, digests, scores, info, policies,
             score_values, &values);
  const int64_t n = keys.numel();
  check_gather(values, keys);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor slots = at::empty({n}, keys.options());
  at::Tensor out = at::empty({n, values.size(1)}, values.options());
  const table::TableRef t = table_ref(table_keys, digests, scores, info, nullptr, nullptr);
  const table::ScoreArgs a = score_args(policies, score_values, n);
  TorchScratch scratch(keys);
  table::cuda::find_gather(
      t, a, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n, update,
      slots.data_ptr<int64_t>(), static_cast<const uint8_t*>(values.data_ptr()), values.size(0),
      values.size(1) * values.element_size(), static_cast<uint8_t*>(out.data_ptr()), scratch,
      c10::cuda::getCurrentCUDAStream().stream());
  return {slots, out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
run_cuda(const at::Tensor& keys, const at::Tensor& table_ids, at::Tensor& table_keys,
         at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::Tensor& counters,
         at::Tensor& free_rows, at::IntArrayRef policies, const at::Tensor& score_values,
         int64_t op, bool assign_rows, int64_t total_buckets, bool has_rows,
         const std::optional<at::Tensor>& victim_scores,
         const std::optional<at::Tensor>& target_slots, bool refuse_cold,
         const std::optional<at::Tensor>& held_slots) {
  check_run(keys, table_ids, table_keys, digests, scores, info, counters, free_rows, policies,
            score_values, op, victim_scores, target_slots, held_slots);
  const int64_t n = keys.numel();
  TORCH_CHECK(total_buckets >= 1, "dynamicemb: total_buckets must be positive, got ",
              total_buckets);
  c10::cuda::CUDAGuard guard(keys.device());
  RunOutputs out = alloc_run_outputs(keys, scores.size(1));
  at::Tensor order = at::empty({n}, keys.options().dtype(at::kInt));
  TorchScratch scratch(keys);
  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, &free_rows);
  table::RunArgs r = run_args(keys, table_ids, order, policies, score_values, op, assign_rows, out,
                              victim_scores, target_slots, refuse_cold, held_slots);
  table::cuda::run_op(t, r, n, total_buckets, has_rows, out.num_evicted.data_ptr<int64_t>(),
                      scratch, c10::cuda::getCurrentCUDAStream().stream());
  return out.tuple();
}

ExportResult export_cuda(const at::Tensor& table_keys, const at::Tensor& scores,
                         const at::Tensor& info, int64_t slot_begin, int64_t slot_end,
                         int64_t column, int64_t threshold) {
  check_export_args(table_keys, scores, info, slot_begin, slot_end, column);
  c10::cuda::CUDAGuard guard(table_keys.device());
  ExportResult res = alloc_export(table_keys, scores, slot_end - slot_begin);
  const table::TableRef t = keys_ref(table_keys, info, &scores);
  TorchScratch scratch(table_keys);
  table::cuda::export_batch(
      t, slot_begin, slot_end, static_cast<int32_t>(column), threshold,
      std::get<0>(res).data_ptr<int64_t>(), std::get<1>(res).data_ptr<int64_t>(),
      std::get<2>(res).data_ptr<int64_t>(), std::get<3>(res).data_ptr<int64_t>(),
      std::get<4>(res).data_ptr<int64_t>(), scratch, c10::cuda::getCurrentCUDAStream().stream());
  return res;
}

at::Tensor gather_rows_cuda(const at::Tensor& values, const at::Tensor& rows) {
  check_devices("gather_rows", {{"values", &values}, {"rows", &rows}});
  check_gather(values, rows);
  c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::empty({rows.numel(), values.size(1)}, values.options());
  table::cuda::gather_rows(static_cast<const uint8_t*>(values.data_ptr()), values.size(0),
                           values.size(1) * values.element_size(), rows.data_ptr<int64_t>(),
                           rows.numel(), static_cast<uint8_t*>(out.data_ptr()),
                           c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

at::Tensor home_starts_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                            const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view("table_home_starts", table_keys, info, &keys, &table_ids);
  check_batch(keys, table_ids, table_keys);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor out = at::empty({keys.numel()}, keys.options());
  const table::TableRef t = keys_ref(table_keys, info, nullptr);
  TorchScratch scratch(keys);
  table::cuda::home_starts(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), keys.numel(),
                           out.data_ptr<int64_t>(), scratch,
                           c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

at::Tensor timer_cuda(const at::Tensor& like) {
  c10::cuda::CUDAGuard guard(like.device());
  at::Tensor out = at::empty({1}, like.options().dtype(at::kLong));
  table::cuda::read_timer(out.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

at::Tensor count_cuda(const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view("table_count", table_keys, info);
  c10::cuda::CUDAGuard guard(table_keys.device());
  at::Tensor out = at::empty({info.size(0)}, table_keys.options());
  const table::TableRef t = keys_ref(table_keys, info, nullptr);
  TorchScratch scratch(table_keys);
  table::cuda::count(t, out.data_ptr<int64_t>(), scratch,
                     c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

/// The assign_rows check on the device; the layout on a host copy of info
/// (a few words), the verdict read back: one synchronization, as the CPU
/// kernel's message needs the verdict on the host.
void check_rows_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                     const at::Tensor& table_keys, const at::Tensor& digests,
                     const at::Tensor& scores, const at::Tensor& info, const at::Tensor& free_rows,
                     const at::Tensor& score_values) {
  check_rows_args(keys, table_ids, table_keys, digests, scores, info, free_rows, score_values);
  c10::cuda::CUDAGuard guard(keys.device());
  const at::Tensor host_info = info.cpu();
  table::TableRef host_view;
  host_view.info = host_info.data_ptr<int64_t>();
  host_view.num_tables = info.size(0);
  host_view.num_slots = table_keys.numel();
  check_layout_cpu(host_view, free_rows.numel());
  at::Tensor verdict = at::empty({table::kRowVerdictWords}, keys.options().dtype(at::kLong));
  const table::TableRef t = table_ref(table_keys, digests, scores, info, nullptr, &free_rows);
  TorchScratch scratch(keys);
  table::cuda::check_rows(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                          score_values.data_ptr<int64_t>(), row_stride(score_values), keys.numel(),
                          reinterpret_cast<table::RowVerdict*>(verdict.data_ptr<int64_t>()),
                          scratch, c10::cuda::getCurrentCUDAStream().stream());
  const at::Tensor found = verdict.cpu();
  refuse_rows(*reinterpret_cast<const table::RowVerdict*>(found.data_ptr<int64_t>()), info.size(0));
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("table_find", &find_cuda);
  m.impl("table_run", &run_cuda);
  m.impl("table_find_gather", &find_gather_cuda);
  m.impl("table_export", &export_cuda);
  m.impl("table_check_rows", &check_rows_cuda);
  m.impl("table_count", &count_cuda);
  m.impl("table_home_starts", &home_starts_cuda);
  m.impl("table_timer", &timer_cuda);
  m.impl("gather_rows", &gather_rows_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
