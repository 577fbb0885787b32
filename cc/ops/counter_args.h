// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Argument checks of counter_add and counter_admit (the admission counter,
// cc/admission), shared by their CPU, CUDA and Meta kernels.
#pragma once

#include <ATen/core/Tensor.h>

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

/// The tensor arguments of counter_admit, for check_devices (CPU, CUDA,
/// Meta): the batch, the store's and the counter's, all on the keys' device.
inline void check_admit_devices(const at::Tensor& keys, const at::Tensor& table_ids,
                                const at::Tensor& store_keys, const at::Tensor& store_digests,
                                const at::Tensor& store_scores, const at::Tensor& store_info,
                                const at::Tensor& table_keys, const at::Tensor& digests,
                                const at::Tensor& scores, const at::Tensor& info,
                                const at::Tensor& counters, const at::Tensor& frequencies) {
  const char* op = "counter_admit";
  check_devices(op, {{"keys", &keys}, {"table_ids", &table_ids}, {"frequencies", &frequencies}});
  check_devices(op, {{"keys", &keys},
                     {"store_keys", &store_keys},
                     {"store_digests", &store_digests},
                     {"store_scores", &store_scores},
                     {"store_info", &store_info}});
  check_devices(op, {{"keys", &keys},
                     {"table_keys", &table_keys},
                     {"digests", &digests},
                     {"scores", &scores},
                     {"info", &info},
                     {"counters", &counters}});
}

/// Checks a counter table and a batch of keys, table ids and frequencies
/// (their devices checked by the caller).
inline void check_count_batch(const at::Tensor& keys, const at::Tensor& table_ids,
                              const at::Tensor& table_keys, const at::Tensor& digests,
                              const at::Tensor& scores, const at::Tensor& info,
                              const at::Tensor& counters, const at::Tensor& frequencies,
                              int64_t total_buckets) {
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

/// Checks counter_add's arguments.
inline void check_count_args(const at::Tensor& keys, const at::Tensor& table_ids,
                             const at::Tensor& table_keys, const at::Tensor& digests,
                             const at::Tensor& scores, const at::Tensor& info,
                             const at::Tensor& counters, const at::Tensor& frequencies,
                             int64_t total_buckets) {
  check_count_devices(keys, table_ids, table_keys, digests, scores, info, counters, frequencies);
  check_count_batch(keys, table_ids, table_keys, digests, scores, info, counters, frequencies,
                    total_buckets);
}

/// Checks counter_admit's arguments: the counter's batch as counter_add's,
/// the store (an embedding table's state, read only) of as many tables, a
/// threshold >= 0.
inline void check_admit_args(const at::Tensor& keys, const at::Tensor& table_ids,
                             const at::Tensor& store_keys, const at::Tensor& store_digests,
                             const at::Tensor& store_scores, const at::Tensor& store_info,
                             const at::Tensor& table_keys, const at::Tensor& digests,
                             const at::Tensor& scores, const at::Tensor& info,
                             const at::Tensor& counters, const at::Tensor& frequencies,
                             int64_t threshold, int64_t total_buckets) {
  check_admit_devices(keys, table_ids, store_keys, store_digests, store_scores, store_info,
                      table_keys, digests, scores, info, counters, frequencies);
  check_count_batch(keys, table_ids, table_keys, digests, scores, info, counters, frequencies,
                    total_buckets);
  check_state(store_keys, store_digests, store_scores, store_info);
  TORCH_CHECK_VALUE(store_info.size(0) == info.size(0), "dynamicemb: the store has ",
                    store_info.size(0), " tables but the counter ", info.size(0));
  TORCH_CHECK_VALUE(threshold >= 0, "dynamicemb: threshold must be >= 0, got ", threshold);
}

}  // namespace ops
}  // namespace dyn_emb
