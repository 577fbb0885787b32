// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernels of the table ops. Every argument, and every key and table id,
// is checked before the table is touched, so a rejected call changes nothing.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <utility>

#include "cc/ops/table_args.h"
#include "cc/ops/tensor_checks.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/table_cpu.h"

namespace dyn_emb {
namespace ops {
namespace {

using table::TableMode;

void check_rows_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                    const at::Tensor& table_keys, const at::Tensor& digests,
                    const at::Tensor& scores, const at::Tensor& info, const at::Tensor& free_rows,
                    const at::Tensor& score_values) {
  check_rows_args(keys, table_ids, table_keys, digests, scores, info, free_rows, score_values);
  check_cpu(keys);
  const table::TableRef t = table_ref(table_keys, digests, scores, info, nullptr, &free_rows);
  check_layout_cpu(t, free_rows.numel());
  refuse_rows(table::cpu::check_rows(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                                     score_values.data_ptr<int64_t>(), row_stride(score_values),
                                     keys.numel()),
              info.size(0));
}

at::Tensor find_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                    const at::Tensor& table_keys, const at::Tensor& digests, at::Tensor& scores,
                    const at::Tensor& info, at::IntArrayRef policies,
                    const at::Tensor& score_values, bool update) {
  check_find("table_find", keys, table_ids, table_keys, digests, scores, info, policies,
             score_values);
  check_cpu(keys);
  const int64_t n = keys.numel();
  const table::TableRef t = table_ref(table_keys, digests, scores, info, nullptr, nullptr);
  check_layout_cpu(t, INT64_MAX);
  check_key_values(keys, table_ids, info.size(0));
  at::Tensor slots = at::empty({n}, keys.options());
  table::ScoreArgs a = score_args(policies, score_values, n);
  a.host_now = table::cpu::host_timer_ns();
  table::cpu::find(t, a, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n, update,
                   slots.data_ptr<int64_t>());
  return slots;
}

std::tuple<at::Tensor, at::Tensor> find_gather_cpu(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& table_keys,
    const at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::IntArrayRef policies,
    const at::Tensor& score_values, bool update, const at::Tensor& values) {
  check_find_devices("table_find_gather", keys, table_ids, table_keys, digests, scores, info,
                     score_values, &values);
  TORCH_CHECK_VALUE(values.dim() == 2 && values.is_contiguous(),
                    "dynamicemb: values must be a contiguous 2-D tensor, got shape ",
                    values.sizes());
  check_cpu(values);
  // The scores are updated only once every row is known to lie in values.
  at::Tensor slots =
      find_cpu(keys, table_ids, table_keys, digests, scores, info, policies, score_values, false);
  // Row of each found key: its slot, or under NO_EVICTION the table's row
  // offset plus score word 0 (the tables' row blocks lie back to back).
  at::Tensor rows = slots.clone();
  const int64_t* inf = info.data_ptr<int64_t>();
  const int64_t* tid = table_ids.data_ptr<int64_t>();
  const int64_t* sc = scores.data_ptr<int64_t>();
  int64_t* r = rows.data_ptr<int64_t>();
  const int64_t ns = scores.size(1);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    if (r[i] < 0) continue;
    const int64_t* ti = inf + tid[i] * kInfoCols;
    if (ti[table::kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction)) {
      const int64_t row = sc[r[i] * ns];
      TORCH_CHECK_VALUE(row >= 0 && row < ti[table::kInfoRowCapacity], "dynamicemb: key at index ",
                        i, " holds row ", row, ", outside the ", ti[table::kInfoRowCapacity],
                        " rows of table ", tid[i], " (the table state is corrupt)");
      r[i] = ti[table::kInfoRowOffset] + row;
    }
    TORCH_CHECK_VALUE(r[i] < values.size(0), "dynamicemb: key at index ", i, " has row ", r[i],
                      ", past the ", values.size(0), " rows of values");
  }
  if (update) {
    find_cpu(keys, table_ids, table_keys, digests, scores, info, policies, score_values, true);
  }
  at::Tensor out = at::empty({rows.numel(), values.size(1)}, values.options());
  table::cpu::gather_rows(static_cast<const uint8_t*>(values.data_ptr()),
                          values.size(1) * values.element_size(), r, rows.numel(),
                          static_cast<uint8_t*>(out.data_ptr()));
  return {slots, out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
run_cpu(const at::Tensor& keys, const at::Tensor& table_ids, at::Tensor& table_keys,
        at::Tensor& digests, at::Tensor& scores, const at::Tensor& info, at::Tensor& counters,
        at::Tensor& free_rows, at::IntArrayRef policies, const at::Tensor& score_values, int64_t op,
        bool assign_rows, int64_t total_buckets, bool has_rows,
        const std::optional<at::Tensor>& victim_scores,
        const std::optional<at::Tensor>& target_slots, bool refuse_cold,
        const std::optional<at::Tensor>& held_slots) {
  check_run(keys, table_ids, table_keys, digests, scores, info, counters, free_rows, policies,
            score_values, op, victim_scores, target_slots, held_slots);
  check_cpu(keys);
  const int64_t n = keys.numel();
  {
    const table::TableRef lt = table_ref(table_keys, digests, scores, info, &counters, &free_rows);
    const auto [buckets, rows] = check_layout_cpu(lt, free_rows.numel());
    TORCH_CHECK_VALUE(total_buckets == buckets, "dynamicemb: total_buckets ", total_buckets,
                      " disagrees with info, which describes ", buckets, " buckets");
    TORCH_CHECK_VALUE(has_rows || !rows,
                      "dynamicemb: has_rows is false but info has a NO_EVICTION table");
    check_counter_values_cpu(lt);
  }
  check_key_values(keys, table_ids, info.size(0));
  const bool place = op == static_cast<int64_t>(table::RunOp::kPlace);
  if (assign_rows && (op == static_cast<int64_t>(table::RunOp::kInsert) ||
                      op == static_cast<int64_t>(table::RunOp::kInsertEvict))) {
    const table::TableRef lt = table_ref(table_keys, digests, scores, info, &counters, &free_rows);
    refuse_rows(
        table::cpu::check_rows(lt, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                               score_values.data_ptr<int64_t>(), row_stride(score_values), n),
        info.size(0));
  }
  if (place) {
    const table::TableRef lt = table_ref(table_keys, digests, scores, info, &counters, &free_rows);
    const int64_t* k = keys.data_ptr<int64_t>();
    const int64_t* tid = table_ids.data_ptr<int64_t>();
    const int64_t* target = target_slots->data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const table::Home h = table::home_of(lt, tid[i], k[i]);
      TORCH_CHECK_VALUE(target[i] >= h.start && target[i] < h.start + h.width,
                        "dynamicemb: place: slot ", target[i], " of key ", k[i], " at index ", i,
                        " is not in its home bucket (slots ", h.start, "..", h.start + h.width - 1,
                        " of table ", tid[i], ")");
      const bool no_evict = info.data_ptr<int64_t>()[tid[i] * kInfoCols + table::kInfoMode] ==
                            static_cast<int64_t>(TableMode::kNoEviction);
      TORCH_CHECK_VALUE(!no_evict || assign_rows, "dynamicemb: place into NO_EVICTION table ",
                        tid[i], " needs assign_rows (the row of each key)");
    }
  }
  RunOutputs out = alloc_run_outputs(keys, scores.size(1));
  at::Tensor order = at::empty({n}, keys.options().dtype(at::kInt));
  at::Tensor scratch = at::empty({n}, keys.options());
  at::Tensor row_work = at::empty({has_rows ? n : 0}, keys.options());
  at::Tensor flags = at::empty({n}, keys.options().dtype(at::kByte));

  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, &free_rows);
  table::RunArgs r = run_args(keys, table_ids, order, policies, score_values, op, assign_rows, out,
                              victim_scores, target_slots, refuse_cold, held_slots);
  r.ev_flags = flags.data_ptr<uint8_t>();
  r.row_work = has_rows ? row_work.data_ptr<int64_t>() : nullptr;
  const int64_t evicted = table::cpu::run_op(t, r, n, total_buckets, scratch.data_ptr<int64_t>());
  out.num_evicted.fill_(evicted);
  return out.tuple();
}

ExportResult export_cpu(const at::Tensor& table_keys, const at::Tensor& scores,
                        const at::Tensor& info, int64_t slot_begin, int64_t slot_end,
                        int64_t column, int64_t threshold) {
  check_export_args(table_keys, scores, info, slot_begin, slot_end, column);
  check_cpu(table_keys);
  ExportResult res = alloc_export(table_keys, scores, slot_end - slot_begin);
  std::get<0>(res).fill_(table::kEmptyKey);
  std::get<1>(res).fill_(-1);
  std::get<2>(res).fill_(-1);
  std::get<3>(res).zero_();
  const table::TableRef t = keys_ref(table_keys, info, &scores);
  check_layout_cpu(t, INT64_MAX);
  const int64_t c = table::cpu::export_batch(
      t, slot_begin, slot_end, static_cast<int32_t>(column), threshold,
      std::get<0>(res).data_ptr<int64_t>(), std::get<1>(res).data_ptr<int64_t>(),
      std::get<2>(res).data_ptr<int64_t>(), std::get<3>(res).data_ptr<int64_t>());
  std::get<4>(res).fill_(c);
  return res;
}

at::Tensor gather_rows_cpu(const at::Tensor& values, const at::Tensor& rows) {
  check_devices("gather_rows", {{"values", &values}, {"rows", &rows}});
  check_gather(values, rows);
  check_cpu(values);
  check_index_range(rows, -1, values.size(0), "row");
  const int64_t* r = rows.data_ptr<int64_t>();
  at::Tensor out = at::empty({rows.numel(), values.size(1)}, values.options());
  table::cpu::gather_rows(static_cast<const uint8_t*>(values.data_ptr()),
                          values.size(1) * values.element_size(), r, rows.numel(),
                          static_cast<uint8_t*>(out.data_ptr()));
  return out;
}

at::Tensor home_starts_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                           const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view("table_home_starts", table_keys, info, &keys, &table_ids);
  check_batch(keys, table_ids, table_keys);
  check_cpu(keys);
  const table::TableRef t = keys_ref(table_keys, info, nullptr);
  check_layout_cpu(t, INT64_MAX);
  check_key_values(keys, table_ids, info.size(0));
  at::Tensor out = at::empty({keys.numel()}, keys.options());
  table::cpu::home_starts(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), keys.numel(),
                          out.data_ptr<int64_t>());
  return out;
}

at::Tensor timer_cpu(const at::Tensor& like) {
  return at::full({1}, table::cpu::host_timer_ns(), like.options().dtype(at::kLong));
}

at::Tensor count_cpu(const at::Tensor& table_keys, const at::Tensor& info) {
  check_keys_view("table_count", table_keys, info);
  check_cpu(table_keys);
  at::Tensor out = at::zeros({info.size(0)}, table_keys.options());
  const table::TableRef t = keys_ref(table_keys, info, nullptr);
  check_layout_cpu(t, INT64_MAX);
  table::cpu::count(t, out.data_ptr<int64_t>());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("table_find", &find_cpu);
  m.impl("table_run", &run_cpu);
  m.impl("table_find_gather", &find_gather_cpu);
  m.impl("table_export", &export_cpu);
  m.impl("table_count", &count_cpu);
  m.impl("table_check_rows", &check_rows_cpu);
  m.impl("table_home_starts", &home_starts_cpu);
  m.impl("table_timer", &timer_cpu);
  m.impl("gather_rows", &gather_rows_cpu);
}

}  // namespace ops
}  // namespace dyn_emb
