// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernels of counter_add and counter_admit. Every argument, key, table id
// and frequency is checked before the counter is touched, so a rejected call
// changes nothing.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "cc/admission/counter.h"
#include "cc/admission/counter_cpu.h"
#include "cc/ops/counter_args.h"
#include "cc/ops/table_args.h"
#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor counter_add_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                           at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores,
                           const at::Tensor& info, at::Tensor& counters,
                           const at::Tensor& frequencies, int64_t release_at,
                           int64_t total_buckets) {
  check_count_args(keys, table_ids, table_keys, digests, scores, info, counters, frequencies,
                   total_buckets);
  check_cpu(keys);
  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, nullptr);
  const auto [buckets, rows] = check_layout_cpu(t, 0);
  TORCH_CHECK_VALUE(total_buckets == buckets, "dynamicemb: total_buckets ", total_buckets,
                    " disagrees with info, which describes ", buckets, " buckets");
  check_counter_values_cpu(t);
  check_key_values(keys, table_ids, info.size(0));
  check_index_range(frequencies, 0, INT64_MAX, "frequency");
  at::Tensor counts = at::zeros({keys.numel()}, keys.options());
  admission::cpu::add(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                      frequencies.data_ptr<int64_t>(), keys.numel(), release_at, total_buckets,
                      counts.data_ptr<int64_t>());
  return counts;
}

std::tuple<at::Tensor, at::Tensor> counter_admit_cpu(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& store_keys,
    const at::Tensor& store_digests, const at::Tensor& store_scores, const at::Tensor& store_info,
    at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores, const at::Tensor& info,
    at::Tensor& counters, const at::Tensor& frequencies, int64_t threshold, int64_t total_buckets) {
  check_admit_args(keys, table_ids, store_keys, store_digests, store_scores, store_info, table_keys,
                   digests, scores, info, counters, frequencies, threshold, total_buckets);
  check_cpu(keys);
  const table::TableRef store =
      table_ref(store_keys, store_digests, store_scores, store_info, nullptr, nullptr);
  check_layout_cpu(store, INT64_MAX);
  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, nullptr);
  const auto [buckets, rows] = check_layout_cpu(t, 0);
  TORCH_CHECK_VALUE(total_buckets == buckets, "dynamicemb: total_buckets ", total_buckets,
                    " disagrees with info, which describes ", buckets, " buckets");
  check_counter_values_cpu(t);
  check_key_values(keys, table_ids, info.size(0), /*padding=*/true);
  check_index_range(frequencies, 0, INT64_MAX, "frequency");
  at::Tensor status = at::empty({keys.numel()}, keys.options().dtype(at::kChar));
  at::Tensor per_table = at::zeros({info.size(0), admission::kAdmitCols}, keys.options());
  admission::cpu::admit(store, t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                        frequencies.data_ptr<int64_t>(), keys.numel(), threshold, total_buckets,
                        status.data_ptr<int8_t>(), per_table.data_ptr<int64_t>());
  return {status, per_table};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("counter_add", &counter_add_cpu);
  m.impl("counter_admit", &counter_admit_cpu);
}

}  // namespace ops
}  // namespace dyn_emb
