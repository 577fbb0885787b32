// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA kernel of segmented_unique (schema in schemas.cpp): its checks and
// results around the kernel of cc/embedding/unique_cuda.h (a hash set of the
// pairs, one short radix sort and the passes around one scan), in one scratch
// tensor.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "cc/embedding/unique_cuda.h"
#include "cc/ops/unique_args.h"

namespace dyn_emb {
namespace ops {
namespace {

UniqueResult segmented_unique_cuda(const at::Tensor& keys, const at::Tensor& table_ids,
                                   int64_t num_tables, int64_t pad_key) {
  check_unique_args(keys, table_ids, num_tables);
  const c10::cuda::CUDAGuard guard(keys.device());
  const int64_t n = keys.numel();
  TORCH_CHECK_VALUE(n < std::numeric_limits<int32_t>::max(),
                    "dynamicemb: segmented_unique takes fewer than 2^31 - 1 keys, got ", n);
  UniqueResult out = empty_unique(keys, num_tables);
  if (n == 0) {
    std::get<4>(out).zero_();  // table_offsets
    std::get<6>(out).zero_();  // num_unique
    std::get<7>(out).zero_();  // occ_offsets
    return out;
  }
  at::Tensor scratch =
      at::empty({static_cast<int64_t>(embedding::cuda::unique_scratch(n, num_tables))},
                keys.options().dtype(at::kByte));
  embedding::cuda::segmented_unique(keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(), n,
                                    num_tables, pad_key, scratch.data_ptr(), unique_outputs(out),
                                    c10::cuda::getCurrentCUDAStream().stream());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) { m.impl("segmented_unique", &segmented_unique_cuda); }

}  // namespace ops
}  // namespace dyn_emb
