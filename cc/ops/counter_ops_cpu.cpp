// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernel of counter_add. Every argument, key, table id and frequency is
// checked before the counter is touched, so a rejected call changes nothing.
#include <ATen/ATen.h>
#include <torch/library.h>

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

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("counter_add", &counter_add_cpu); }

}  // namespace ops
}  // namespace dyn_emb
