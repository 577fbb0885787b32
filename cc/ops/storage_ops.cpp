// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The row moves of the storage tiers (cc/storage/copy_rows.h): schema, CPU and
// Meta kernels.
//
//   copy_rows(dst0!, dst1!, dst_offsets, src0, src1, src_offsets, bytes)
//       for each i with both offsets >= 0: bytes[i] bytes from the row space
//       (src0, src1) at src_offsets[i] to the row space (dst0, dst1) at
//       dst_offsets[i]; segments are contiguous tensors read as bytes, offsets
//       and byte counts multiples of 4, source and destination disjoint.
#include "cc/ops/storage_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "cc/storage/copy_rows_cpu.h"

namespace dyn_emb {
namespace ops {
namespace {

void copy_rows_cpu(at::Tensor& dst0, at::Tensor& dst1, const at::Tensor& dst_offsets,
                   const at::Tensor& src0, const at::Tensor& src1, const at::Tensor& src_offsets,
                   const at::Tensor& bytes) {
  copy_rows_with(dst0, dst1, dst_offsets, src0, src1, src_offsets, bytes,
                 [](const storage::CopyArgs& a) { storage::cpu::copy_rows(a); });
}

void copy_rows_meta(at::Tensor& dst0, at::Tensor& dst1, const at::Tensor& dst_offsets,
                    const at::Tensor& src0, const at::Tensor& src1, const at::Tensor& src_offsets,
                    const at::Tensor& bytes) {}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dynamicemb, m) {
  m.def(
      "copy_rows(Tensor(a!) dst0, Tensor(b!) dst1, Tensor dst_offsets, Tensor src0, Tensor src1, "
      "Tensor src_offsets, Tensor bytes) -> ()");
}

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("copy_rows", &copy_rows_cpu); }

TORCH_LIBRARY_IMPL(dynamicemb, Meta, m) { m.impl("copy_rows", &copy_rows_meta); }

}  // namespace ops
}  // namespace dyn_emb
