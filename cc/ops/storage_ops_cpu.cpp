// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernel of the storage tiers' row moves, copy_rows (schema in
// schemas.cpp; cc/storage/copy_rows.h).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "cc/ops/storage_args.h"
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

std::tuple<at::Tensor, at::Tensor> slot_rows_cpu(const at::Tensor& slots, const at::Tensor& status,
                                                 int64_t stride, int64_t found) {
  return slot_rows_with(slots, status, stride, found,
                        [](const storage::SlotRowsArgs& a) { storage::cpu::slot_rows(a); });
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("copy_rows", &copy_rows_cpu);
  m.impl("slot_rows", &slot_rows_cpu);
}

}  // namespace ops
}  // namespace dyn_emb
