// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernels of counter_add and counter_admit. Shapes and dtypes are
// checked; key values and frequencies are not (that would synchronize): an
// invalid entry touches nothing (counter_add: it counts 0; counter_admit: kNone).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "cc/admission/counter.h"
#include "cc/admission/counter_cuda.h"
#include "cc/ops/counter_args.h"
#include "cc/ops/cuda_scratch.h"
#include "cc/ops/table_args.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor counter_add_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                            at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores,
                            const at::Tensor& info, at::Tensor& counters,
                            const at::Tensor& frequencies, int64_t release_at,
                            int64_t total_buckets) {
  check_count_args(keys, table_ids, table_keys, digests, scores, info, counters, frequencies,
                   total_buckets);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor counts = at::zeros({keys.numel()}, keys.options());
  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, nullptr);
  TorchScratch scratch(keys);
  admission::cuda::add(t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                       frequencies.data_ptr<int64_t>(), keys.numel(), release_at, total_buckets,
                       counts.data_ptr<int64_t>(), scratch,
                       c10::cuda::getCurrentCUDAStream().stream());
  return counts;
}

std::tuple<at::Tensor, at::Tensor> counter_admit_cuda(
    const at::Tensor& keys, const at::Tensor& table_ids, const at::Tensor& store_keys,
    const at::Tensor& store_digests, const at::Tensor& store_scores, const at::Tensor& store_info,
    at::Tensor& table_keys, at::Tensor& digests, at::Tensor& scores, const at::Tensor& info,
    at::Tensor& counters, const at::Tensor& frequencies, int64_t threshold, int64_t total_buckets) {
  check_admit_args(keys, table_ids, store_keys, store_digests, store_scores, store_info, table_keys,
                   digests, scores, info, counters, frequencies, threshold, total_buckets);
  c10::cuda::CUDAGuard guard(keys.device());
  at::Tensor status = at::empty({keys.numel()}, keys.options().dtype(at::kChar));
  at::Tensor per_table = at::zeros({info.size(0), admission::kAdmitCols}, keys.options());
  const table::TableRef store =
      table_ref(store_keys, store_digests, store_scores, store_info, nullptr, nullptr);
  const table::TableRef t = table_ref(table_keys, digests, scores, info, &counters, nullptr);
  TorchScratch scratch(keys);
  admission::cuda::admit(store, t, keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                         frequencies.data_ptr<int64_t>(), keys.numel(), threshold, total_buckets,
                         status.data_ptr<int8_t>(), per_table.data_ptr<int64_t>(), scratch,
                         c10::cuda::getCurrentCUDAStream().stream());
  return {status, per_table};
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("counter_add", &counter_add_cuda);
  m.impl("counter_admit", &counter_admit_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
