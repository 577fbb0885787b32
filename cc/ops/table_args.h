// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks of the table ops (caller errors, named with the bad value)
// and the tensor -> TableRef plumbing, shared by their CPU, CUDA and Meta
// kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/ops/tensor_checks.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/row_check.h"
#include "cc/table/rows.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace ops {

using table::kCounterCols;
using table::kInfoCols;
using table::kMaxScores;

// The tensor arguments of each table op, for check_devices (one list per op,
// run by its CPU, CUDA and Meta kernels).

inline void check_find_devices(const char* op, const at::Tensor& keys, const at::Tensor& table_ids,
                               const at::Tensor& table_keys, const at::Tensor& digests,
                               const at::Tensor& scores, const at::Tensor& info,
                               const at::Tensor& score_values, const at::Tensor* values = nullptr) {
  check_devices(op, {{"keys", &keys},
                     {"table_ids", &table_ids},
                     {"table_keys", &table_keys},
                     {"digests", &digests},
                     {"scores", &scores},
                     {"info", &info},
                     {"score_values", &score_values}});
  if (values) check_devices(op, {{"keys", &keys}, {"values", values}});
}

inline void check_run_devices(const at::Tensor& keys, const at::Tensor& table_ids,
                              const at::Tensor& table_keys, const at::Tensor& digests,
                              const at::Tensor& scores, const at::Tensor& info,
                              const at::Tensor& counters, const at::Tensor& free_rows,
                              const at::Tensor& score_values,
                              const std::optional<at::Tensor>& victim_scores,
                              const std::optional<at::Tensor>& target_slots,
                              const std::optional<at::Tensor>& held_slots) {
  check_find_devices("table_run", keys, table_ids, table_keys, digests, scores, info, score_values);
  check_devices("table_run", {{"keys", &keys}, {"counters", &counters}, {"free_rows", &free_rows}});
  if (victim_scores.has_value()) {
    check_devices("table_run", {{"keys", &keys}, {"victim_scores", &*victim_scores}});
  }
  if (target_slots.has_value()) {
    check_devices("table_run", {{"keys", &keys}, {"target_slots", &*target_slots}});
  }
  if (held_slots.has_value()) {
    check_devices("table_run", {{"keys", &keys}, {"held_slots", &*held_slots}});
  }
}

inline void check_export_devices(const at::Tensor& table_keys, const at::Tensor& scores,
                                 const at::Tensor& info) {
  check_devices("table_export",
                {{"table_keys", &table_keys}, {"scores", &scores}, {"info", &info}});
}

/// The ops that read the keys and info only: table_count, and
/// table_home_starts with its batch (keys, table_ids).
inline void check_keys_view_devices(const char* op, const at::Tensor& table_keys,
                                    const at::Tensor& info, const at::Tensor* keys = nullptr,
                                    const at::Tensor* table_ids = nullptr) {
  if (keys) {
    check_devices(
        op,
        {{"keys", keys}, {"table_ids", table_ids}, {"table_keys", &table_keys}, {"info", &info}});
  } else {
    check_devices(op, {{"table_keys", &table_keys}, {"info", &info}});
  }
}

inline void check_info(const at::Tensor& info) {
  TORCH_CHECK(info.scalar_type() == at::kLong && info.dim() == 2 && info.size(1) == kInfoCols &&
                  info.is_contiguous(),
              "dynamicemb: info must be a contiguous int64 (num_tables, ", kInfoCols,
              ") tensor, got ", info.scalar_type(), " ", info.sizes());
  TORCH_CHECK_VALUE(info.size(0) >= 1, "dynamicemb: info describes no table");
}

/// Checks the table state tensors against each other.
inline void check_state(const at::Tensor& keys, const at::Tensor& digests, const at::Tensor& scores,
                        const at::Tensor& info) {
  check_1d(keys, at::kLong, "table_keys");
  check_1d(digests, at::kByte, "digests");
  TORCH_CHECK(scores.scalar_type() == at::kLong && scores.dim() == 2 && scores.is_contiguous(),
              "dynamicemb: scores must be a contiguous int64 (slots, num_scores) tensor, got ",
              scores.scalar_type(), " ", scores.sizes());
  TORCH_CHECK(scores.size(1) >= 1 && scores.size(1) <= kMaxScores,
              "dynamicemb: num_scores must be 1..", kMaxScores, ", got ", scores.size(1));
  TORCH_CHECK(digests.numel() == keys.numel() && scores.size(0) == keys.numel(),
              "dynamicemb: table_keys, digests and scores disagree on the slot count: ",
              keys.numel(), ", ", digests.numel(), ", ", scores.size(0));
  check_info(info);
  for (const at::Tensor* t : {&digests, &scores, &info}) {
    TORCH_CHECK(t->device() == keys.device(), "dynamicemb: table tensors must share a device, got ",
                keys.device(), " and ", t->device());
  }
}

/// Checks a batch of keys and table ids, and that it lives with the table.
inline void check_batch(const at::Tensor& keys, const at::Tensor& table_ids,
                        const at::Tensor& table_keys) {
  check_1d(keys, at::kLong, "keys");
  check_1d(table_ids, at::kLong, "table_ids");
  TORCH_CHECK_VALUE(keys.numel() == table_ids.numel(),
                    "dynamicemb: keys and table_ids lengths differ: ", keys.numel(), " vs ",
                    table_ids.numel());
  TORCH_CHECK(keys.device() == table_keys.device() && table_ids.device() == table_keys.device(),
              "dynamicemb: keys and table_ids must be on the table's device ", table_keys.device(),
              ", got ", keys.device(), " and ", table_ids.device());
}

/// Checks the score policies and their values; returns num_scores.
inline void check_scores(at::IntArrayRef policies, const at::Tensor& values, int64_t n,
                         int64_t num_scores, const at::Tensor& table_keys) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(policies.size()) == num_scores,
                    "dynamicemb: expected one score policy per score column (", num_scores,
                    "), got ", policies.size());
  for (size_t c = 0; c < policies.size(); ++c) {
    TORCH_CHECK_VALUE(policies[c] >= 0 && policies[c] < table::kNumScorePolicies,
                      "dynamicemb: score policy ", policies[c], " of column ", c,
                      " is not one of 0..", table::kNumScorePolicies - 1);
  }
  TORCH_CHECK_TYPE(values.scalar_type() == at::kLong,
                   "dynamicemb: score_values must be int64, got ", values.scalar_type());
  TORCH_CHECK_VALUE(values.dim() == 2 && values.size(1) == num_scores && values.is_contiguous(),
                    "dynamicemb: score_values must be a contiguous int64 (1 or n, ", num_scores,
                    ") tensor, got ", values.scalar_type(), " ", values.sizes());
  TORCH_CHECK_VALUE(values.size(0) == 1 || values.size(0) == n,
                    "dynamicemb: score_values must have 1 or ", n, " rows, got ", values.size(0));
  TORCH_CHECK(values.device() == table_keys.device(),
              "dynamicemb: score_values must be on the table's device ", table_keys.device(),
              ", got ", values.device());
}

inline table::ScoreArgs score_args(at::IntArrayRef policies, const at::Tensor& values, int64_t n) {
  table::ScoreArgs a;
  for (size_t c = 0; c < policies.size(); ++c) a.policy[c] = static_cast<int32_t>(policies[c]);
  a.values = values.data_ptr<int64_t>();
  a.value_row_stride = (values.size(0) == 1 && n != 1) ? 0 : values.size(1);
  return a;
}

inline table::TableRef table_ref(const at::Tensor& keys, const at::Tensor& digests,
                                 const at::Tensor& scores, const at::Tensor& info,
                                 const at::Tensor* counters, const at::Tensor* free_rows) {
  table::TableRef t;
  t.keys = keys.data_ptr<int64_t>();
  t.digests = digests.data_ptr<uint8_t>();
  t.scores = scores.data_ptr<int64_t>();
  t.info = info.data_ptr<int64_t>();
  t.counters = counters ? counters->data_ptr<int64_t>() : nullptr;
  t.free_rows = (free_rows && free_rows->numel() > 0) ? free_rows->data_ptr<int64_t>() : nullptr;
  t.num_scores = static_cast<int32_t>(scores.size(1));
  t.num_tables = info.size(0);
  t.num_slots = keys.numel();
  t.num_free_rows = free_rows ? free_rows->numel() : 0;
  return t;
}

/// A read-only view for export and count: keys, info and (optionally) scores.
inline table::TableRef keys_ref(const at::Tensor& keys, const at::Tensor& info,
                                const at::Tensor* scores) {
  table::TableRef t;
  t.keys = const_cast<int64_t*>(keys.data_ptr<int64_t>());
  t.info = info.data_ptr<int64_t>();
  t.num_tables = info.size(0);
  t.num_slots = keys.numel();
  if (scores) {
    t.scores = const_cast<int64_t*>(scores->data_ptr<int64_t>());
    t.num_scores = static_cast<int32_t>(scores->size(1));
  }
  return t;
}

/// The table's counters: (num_tables, kCounterCols) int64 on its device.
inline void check_counter_cols(const at::Tensor& counters, const at::Tensor& info,
                               const at::Tensor& table_keys) {
  TORCH_CHECK(counters.scalar_type() == at::kLong && counters.dim() == 2 &&
                  counters.size(0) == info.size(0) && counters.size(1) == kCounterCols &&
                  counters.is_contiguous(),
              "dynamicemb: counters must be a contiguous int64 (tables of info = ", info.size(0),
              ", ", kCounterCols, ") tensor, got ", counters.scalar_type(), " ", counters.sizes());
  TORCH_CHECK(counters.device() == table_keys.device(),
              "dynamicemb: counters must be on the table's device");
}

inline void check_counters(const at::Tensor& counters, const at::Tensor& free_rows,
                           const at::Tensor& info, const at::Tensor& table_keys) {
  check_counter_cols(counters, info, table_keys);
  check_1d(free_rows, at::kLong, "free_rows");
  TORCH_CHECK(free_rows.device() == table_keys.device(),
              "dynamicemb: free_rows must be on the table's device");
}

/// Checks a per-slot argument of run: a contiguous (num_slots) tensor on the
/// table's device (its dtype: the caller).
inline void check_per_slot(const at::Tensor& v, const char* name, const at::Tensor& table_keys) {
  TORCH_CHECK_VALUE(v.dim() == 1 && v.numel() == table_keys.numel() && v.is_contiguous(),
                    "dynamicemb: ", name, " must be a contiguous (", table_keys.numel(),
                    ") tensor, one per slot, got shape ", v.sizes());
  TORCH_CHECK(v.device() == table_keys.device(), "dynamicemb: ", name,
              " must be on the table's device ", table_keys.device(), ", got ", v.device());
}

/// Checks run's optional victim scores: (num_slots) float64 on the table's device.
inline void check_victim_scores(const std::optional<at::Tensor>& v, const at::Tensor& table_keys) {
  if (!v.has_value()) return;
  TORCH_CHECK_TYPE(v->scalar_type() == at::kDouble,
                   "dynamicemb: victim_scores must be float64, got ", v->scalar_type());
  check_per_slot(*v, "victim_scores", table_keys);
}

/// Checks run's optional held slots: a (num_slots) uint8 or bool mask on the
/// table's device, its first byte 8-byte aligned (the tiles read it as they
/// read the digests), for insert and insert_and_evict only.
inline void check_held_slots(const std::optional<at::Tensor>& h, int64_t op,
                             const at::Tensor& table_keys) {
  if (!h.has_value()) return;
  TORCH_CHECK_VALUE(
      op == static_cast<int64_t>(table::RunOp::kInsert) ||
          op == static_cast<int64_t>(table::RunOp::kInsertEvict),
      "dynamicemb: held_slots is for insert and insert_and_evict (op 0 or 1), got op ", op);
  TORCH_CHECK_TYPE(h->scalar_type() == at::kByte || h->scalar_type() == at::kBool,
                   "dynamicemb: held_slots must be uint8 or bool, got ", h->scalar_type());
  check_per_slot(*h, "held_slots", table_keys);
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(h->data_ptr()) % 8 == 0,
                    "dynamicemb: held_slots must start at an 8-byte aligned address (a tensor "
                    "of its own, not a view at an offset)");
}

inline void check_op(int64_t op) {
  TORCH_CHECK_VALUE(
      op >= 0 && op <= static_cast<int64_t>(table::RunOp::kPlace),
      "dynamicemb: run op must be 0 (insert), 1 (insert_and_evict), 2 (erase) or 3 (place), got ",
      op);
}

/// Checks run's optional target slots: required by place (and only read by
/// it), (n) int64 (the device: check_run_devices).
inline void check_targets(const std::optional<at::Tensor>& targets, int64_t op,
                          const at::Tensor& keys) {
  if (op != static_cast<int64_t>(table::RunOp::kPlace)) return;
  TORCH_CHECK_VALUE(targets.has_value(), "dynamicemb: place (op 3) needs target_slots");
  TORCH_CHECK_TYPE(targets->scalar_type() == at::kLong,
                   "dynamicemb: target_slots must be int64, got ", targets->scalar_type());
  TORCH_CHECK_VALUE(
      targets->dim() == 1 && targets->numel() == keys.numel() && targets->is_contiguous(),
      "dynamicemb: target_slots must be a contiguous (", keys.numel(),
      ") tensor, one per key, got shape ", targets->sizes());
}

/// The checks table_find and table_find_gather (`op`, with its `values`)
/// make on every backend.
inline void check_find(const char* op, const at::Tensor& keys, const at::Tensor& table_ids,
                       const at::Tensor& table_keys, const at::Tensor& digests,
                       const at::Tensor& scores, const at::Tensor& info, at::IntArrayRef policies,
                       const at::Tensor& score_values, const at::Tensor* values = nullptr) {
  check_find_devices(op, keys, table_ids, table_keys, digests, scores, info, score_values, values);
  check_state(table_keys, digests, scores, info);
  check_batch(keys, table_ids, table_keys);
  check_scores(policies, score_values, keys.numel(), scores.size(1), table_keys);
}

/// The checks table_run makes on every backend.
inline void check_run(const at::Tensor& keys, const at::Tensor& table_ids,
                      const at::Tensor& table_keys, const at::Tensor& digests,
                      const at::Tensor& scores, const at::Tensor& info, const at::Tensor& counters,
                      const at::Tensor& free_rows, at::IntArrayRef policies,
                      const at::Tensor& score_values, int64_t op,
                      const std::optional<at::Tensor>& victim_scores,
                      const std::optional<at::Tensor>& target_slots,
                      const std::optional<at::Tensor>& held_slots) {
  check_run_devices(keys, table_ids, table_keys, digests, scores, info, counters, free_rows,
                    score_values, victim_scores, target_slots, held_slots);
  check_find("table_run", keys, table_ids, table_keys, digests, scores, info, policies,
             score_values);
  check_counters(counters, free_rows, info, table_keys);
  check_op(op);
  check_victim_scores(victim_scores, table_keys);
  check_targets(target_slots, op, keys);
  check_held_slots(held_slots, op, table_keys);
}

/// The checks of the ops that read the keys and info only (table_count,
/// table_home_starts with its batch; table_export also scores).
inline void check_keys_view(const char* op, const at::Tensor& table_keys, const at::Tensor& info,
                            const at::Tensor* keys = nullptr,
                            const at::Tensor* table_ids = nullptr) {
  check_keys_view_devices(op, table_keys, info, keys, table_ids);
  check_1d(table_keys, at::kLong, "table_keys");
  check_info(info);
  TORCH_CHECK(info.device() == table_keys.device(),
              "dynamicemb: info must be on the table's device ", table_keys.device(), ", got ",
              info.device());
}

/// Outputs of table_run, allocated like `keys`.
struct RunOutputs {
  at::Tensor slots, status, ev_keys, ev_scores, ev_slots, ev_tables, num_evicted;
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
  tuple() const {
    return {slots, status, ev_keys, ev_scores, ev_slots, ev_tables, num_evicted};
  }
};

inline RunOutputs alloc_run_outputs(const at::Tensor& keys, int64_t num_scores) {
  const int64_t n = keys.numel();
  auto l = keys.options().dtype(at::kLong);
  return RunOutputs{at::empty({n}, l), at::empty({n}, keys.options().dtype(at::kChar)),
                    at::empty({n}, l), at::empty({n, num_scores}, l),
                    at::empty({n}, l), at::empty({n}, l),
                    at::zeros({1}, l)};
}

/// table_run's arguments and outputs as the backends take them; the
/// backend-specific work arrays (ev_flags, row_work) are left to the caller.
inline table::RunArgs run_args(const at::Tensor& keys, const at::Tensor& table_ids,
                               at::Tensor& order, at::IntArrayRef policies,
                               const at::Tensor& score_values, int64_t op, bool assign_rows,
                               RunOutputs& out, const std::optional<at::Tensor>& victim_scores,
                               const std::optional<at::Tensor>& target_slots, bool refuse_cold,
                               const std::optional<at::Tensor>& held_slots) {
  table::RunArgs r;
  r.keys = keys.data_ptr<int64_t>();
  r.table_ids = table_ids.data_ptr<int64_t>();
  r.order = order.data_ptr<int32_t>();
  r.score = score_args(policies, score_values, keys.numel());
  r.op = static_cast<table::RunOp>(op);
  r.assign_rows = assign_rows;
  r.slots = out.slots.data_ptr<int64_t>();
  r.status = out.status.data_ptr<int8_t>();
  r.ev_keys = out.ev_keys.data_ptr<int64_t>();
  r.ev_scores = out.ev_scores.data_ptr<int64_t>();
  r.ev_slots = out.ev_slots.data_ptr<int64_t>();
  r.ev_tables = out.ev_tables.data_ptr<int64_t>();
  r.victim_scores = victim_scores.has_value() ? victim_scores->data_ptr<double>() : nullptr;
  r.targets = op == static_cast<int64_t>(table::RunOp::kPlace) ? target_slots->data_ptr<int64_t>()
                                                               : nullptr;
  r.refuse_cold = refuse_cold;
  r.held_slots =
      held_slots.has_value() ? static_cast<const uint8_t*>(held_slots->data_ptr()) : nullptr;
  return r;
}

using ExportResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

inline void check_export(const at::Tensor& keys, const at::Tensor& scores, int64_t slot_begin,
                         int64_t slot_end, int64_t column) {
  TORCH_CHECK_TYPE(scores.scalar_type() == at::kLong, "dynamicemb: scores must be int64, got ",
                   scores.scalar_type());
  TORCH_CHECK_VALUE(scores.dim() == 2 && scores.is_contiguous() && keys.numel() == scores.size(0),
                    "dynamicemb: scores must be a contiguous (", keys.numel(),
                    ", num_scores) tensor, one row per slot of table_keys, got shape ",
                    scores.sizes());
  TORCH_CHECK_VALUE(slot_begin >= 0 && slot_begin <= slot_end && slot_end <= keys.numel(),
                    "dynamicemb: slot range [", slot_begin, ", ", slot_end, ") is not within [0, ",
                    keys.numel(), "]");
  TORCH_CHECK_VALUE(column >= 0 && column < scores.size(1), "dynamicemb: score column ", column,
                    " is not one of 0..", scores.size(1) - 1);
}

/// table_export's checks on every backend.
inline void check_export_args(const at::Tensor& table_keys, const at::Tensor& scores,
                              const at::Tensor& info, int64_t slot_begin, int64_t slot_end,
                              int64_t column) {
  check_export_devices(table_keys, scores, info);
  check_keys_view("table_export", table_keys, info);
  TORCH_CHECK_VALUE(scores.dim() == 2 && table_keys.numel() == scores.size(0),
                    "dynamicemb: table_keys and scores disagree on the slot count");
  check_export(table_keys, scores, slot_begin, slot_end, column);
}

inline ExportResult alloc_export(const at::Tensor& keys, const at::Tensor& scores, int64_t range) {
  auto l = keys.options().dtype(at::kLong);
  return {at::empty({range}, l), at::empty({range}, l), at::empty({range}, l),
          at::empty({range, scores.size(1)}, l), at::zeros({1}, l)};
}

/// Checks the layout `info` describes (CPU tensors), naming what is wrong.
/// Returns the total bucket count and whether a table is NO_EVICTION.
inline std::pair<int64_t, bool> check_layout_cpu(const table::TableRef& t, int64_t free_rows_len) {
  int64_t total = 0, bad = -1;
  bool rows = false;
  const int32_t e = table::check_layout(t, free_rows_len, &total, &rows, &bad);
  if (e == table::kLayoutOk) return {total, rows};
  const int64_t* inf = t.info + (bad < 0 ? 0 : bad) * kInfoCols;
  switch (e) {
    case table::kLayoutBucketWidth:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: bucket capacity ",
                        inf[table::kInfoBucketCapacity], " of table ", bad,
                        " is not a positive multiple of ", table::kBucketAlignment);
    case table::kLayoutCapacity:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: capacity ", inf[table::kInfoCapacity],
                        " of table ", bad, " is not a positive multiple of its bucket capacity ",
                        inf[table::kInfoBucketCapacity]);
    case table::kLayoutSlotOffset:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: slot offset ", inf[table::kInfoSlotOffset],
                        " of table ", bad, " does not follow the tables before it");
    case table::kLayoutBucketOffset:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: bucket offset ", inf[table::kInfoBucketOffset],
                        " of table ", bad, " does not follow the tables before it");
    case table::kLayoutMode:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: mode ", inf[table::kInfoMode], " of table ", bad,
                        " is not 0 (evicting) or 1 (NO_EVICTION)");
    case table::kLayoutRows:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: NO_EVICTION rows (offset ",
                        inf[table::kInfoRowOffset], ", capacity ", inf[table::kInfoRowCapacity],
                        ") of table ", bad, " do not follow the tables before it or do not fit ",
                        "free_rows of ", free_rows_len, " entries");
    default:
      TORCH_CHECK_VALUE(false, "dynamicemb: info: the capacities do not add up to the ",
                        t.num_slots, " slots of table_keys");
  }
  return {0, false};
}

/// Checks the counters of every table (CPU tensors): sizes within the
/// capacities, the row allocators' invariant (rows.h), naming what is wrong.
inline void check_counter_values_cpu(const table::TableRef& t) {
  int64_t bad = -1;
  const int32_t e = table::check_counters(t, &bad);
  if (e == table::kCountersOk) return;
  const int64_t* inf = t.info + bad * kInfoCols;
  const int64_t* cnt = t.counters + bad * kCounterCols;
  switch (e) {
    case table::kCounterSizeRange:
      TORCH_CHECK_VALUE(false, "dynamicemb: counters: size ", cnt[table::kCounterSize],
                        " of table ", bad, " is not within [0, ", inf[table::kInfoCapacity], "]");
    case table::kCounterNextRowRange:
      TORCH_CHECK_VALUE(false, "dynamicemb: counters: next row ", cnt[table::kCounterNextRow],
                        " of table ", bad, " is not within [0, ", inf[table::kInfoRowCapacity],
                        "]");
    case table::kCounterFreeTopRange:
      TORCH_CHECK_VALUE(false, "dynamicemb: counters: free-row top ", cnt[table::kCounterFreeTop],
                        " of table ", bad, " is not within [0, ", cnt[table::kCounterNextRow],
                        "] (the next row)");
    default:
      TORCH_CHECK_VALUE(false, "dynamicemb: counters: a cumulative counter of table ", bad,
                        " is negative");
  }
}

/// Refuses entry i when its key is reserved or its table id out of range;
/// with `padding`, kEmptyKey marks a padding entry and is taken.
inline void check_key_value(int64_t i, int64_t key, int64_t table, int64_t num_tables,
                            bool padding = false) {
  TORCH_CHECK_VALUE(!table::is_reserved_key(key) || (padding && key == table::kEmptyKey),
                    "dynamicemb: key ", key, " at index ", i, " is reserved (keys below ",
                    table::kFirstValidKey, " mark slot states)");
  TORCH_CHECK_VALUE(table >= 0 && table < num_tables, "dynamicemb: table id ", table, " at index ",
                    i, " is out of range [0, ", num_tables, ")");
}

/// CPU tensors: refuses reserved keys and table ids out of range, naming the
/// first one (check_key_value).
inline void check_key_values(const at::Tensor& keys, const at::Tensor& table_ids,
                             int64_t num_tables, bool padding = false) {
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* t = table_ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < keys.numel(); ++i) check_key_value(i, k[i], t[i], num_tables, padding);
}

/// table_check_rows's tensors on one device (every backend, Meta included).
inline void check_rows_devices(const at::Tensor& keys, const at::Tensor& table_ids,
                               const at::Tensor& table_keys, const at::Tensor& digests,
                               const at::Tensor& scores, const at::Tensor& info,
                               const at::Tensor& free_rows, const at::Tensor& score_values) {
  check_find_devices("table_check_rows", keys, table_ids, table_keys, digests, scores, info,
                     score_values);
  check_devices("table_check_rows", {{"keys", &keys}, {"free_rows", &free_rows}});
}

/// table_check_rows's argument checks on the CPU and CUDA: the devices, the
/// state's and the batch's shapes, one value row or one per key.
inline void check_rows_args(const at::Tensor& keys, const at::Tensor& table_ids,
                            const at::Tensor& table_keys, const at::Tensor& digests,
                            const at::Tensor& scores, const at::Tensor& info,
                            const at::Tensor& free_rows, const at::Tensor& score_values) {
  check_rows_devices(keys, table_ids, table_keys, digests, scores, info, free_rows, score_values);
  check_state(table_keys, digests, scores, info);
  check_batch(keys, table_ids, table_keys);
  check_1d(free_rows, at::kLong, "free_rows");
  const std::vector<int64_t> assign(static_cast<size_t>(scores.size(1)),
                                    static_cast<int64_t>(table::ScorePolicy::kAssign));
  check_scores(assign, score_values, keys.numel(), scores.size(1), table_keys);
}

/// The row of entry i is score_values[i * stride] (score column 0).
inline int64_t row_stride(const at::Tensor& score_values) {
  return score_values.size(0) == 1 ? 0 : score_values.size(1);
}

/// Refuses a batch the assign_rows check found fault with (row_check.h),
/// naming the entry and what its row collides with.
inline void refuse_rows(const table::RowVerdict& v, int64_t num_tables) {
  switch (v.error) {
    case table::kRowsOk:
      return;
    case table::kRowKeyReserved:
    case table::kRowTableRange:
      check_key_value(v.index, v.key, v.table, num_tables);
      return;
    case table::kRowOutOfRange:
      TORCH_CHECK_VALUE(false, "dynamicemb: row ", v.row, " at index ", v.index,
                        " is out of range [0, ", v.row_capacity, ") of table ", v.table);
    case table::kRowGivenTwice:
      TORCH_CHECK_VALUE(false, "dynamicemb: row ", v.row, " at index ", v.index,
                        " is given to key ", v.other_key, " at index ", v.other_index,
                        " too: a row holds one key");
    default:
      TORCH_CHECK_VALUE(false, "dynamicemb: row ", v.row, " at index ", v.index, " is held by key ",
                        v.other_key, " of table ", v.table);
  }
}

inline void check_gather(const at::Tensor& values, const at::Tensor& rows) {
  TORCH_CHECK_VALUE(values.dim() == 2 && values.is_contiguous(),
                    "dynamicemb: values must be a contiguous 2-D tensor, got shape ",
                    values.sizes());
  check_1d(rows, at::kLong, "rows");
  TORCH_CHECK(rows.device() == values.device(), "dynamicemb: rows must be on the values' device ",
              values.device(), ", got ", rows.device());
}

}  // namespace ops
}  // namespace dyn_emb
