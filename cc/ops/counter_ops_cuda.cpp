// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernel of counter_add. Shapes and dtypes are checked; key values and
// frequencies are not (that would synchronize): an invalid entry touches
// nothing and counts 0.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

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

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) { m.impl("counter_add", &counter_add_cuda); }

}  // namespace ops
}  // namespace dyn_emb
