// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks of counter_add (the admission counter, cc/admission), shared
// by its CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include "cc/ops/table_args.h"
#include "cc/ops/tensor_checks.h"

namespace dyn_emb {
namespace ops {

/// The tensor arguments of counter_add, for check_devices (CPU, CUDA, Meta).
inline void check_count_devices(const at::Tensor& keys, const at::Tensor& table_ids,
                                const at::Tensor& table_keys, const at::Tensor& digests,
                                const at::Tensor& scores, const at::Tensor& info,
                                const at::Tensor& counters, const at::Tensor& frequencies) {
  check_devices("counter_add", {{"keys", &keys},
                                {"table_ids", &table_ids},
                                {"table_keys", &table_keys},
                                {"digests", &digests},
                                {"scores", &scores},
                                {"info", &info},
                                {"counters", &counters},
                                {"frequencies", &frequencies}});
}

/// Checks a counter table and a batch of keys, table ids and frequencies.
inline void check_count_args(const at::Tensor& keys, const at::Tensor& table_ids,
                             const at::Tensor& table_keys, const at::Tensor& digests,
                             const at::Tensor& scores, const at::Tensor& info,
                             const at::Tensor& counters, const at::Tensor& frequencies,
                             int64_t total_buckets) {
  check_count_devices(keys, table_ids, table_keys, digests, scores, info, counters, frequencies);
  check_state(table_keys, digests, scores, info);
  check_batch(keys, table_ids, table_keys);
  TORCH_CHECK_VALUE(scores.size(1) == 1, "dynamicemb: a counter keeps one score word, got ",
                    scores.size(1));
  check_counter_cols(counters, info, table_keys);
  check_1d(frequencies, at::kLong, "frequencies");
  TORCH_CHECK_VALUE(frequencies.numel() == keys.numel(), "dynamicemb: ", keys.numel(), " keys but ",
                    frequencies.numel(), " frequencies");
  TORCH_CHECK_VALUE(total_buckets >= 1, "dynamicemb: total_buckets must be positive, got ",
                    total_buckets);
}

}  // namespace ops
}  // namespace dyn_emb
