// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Row spaces (cc/storage/row_space.h) from tensors, and their checks, shared
// by the ops that address rows by byte offset: embedding_pool,
// embedding_update and copy_rows.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <tuple>

#include "cc/ops/tensor_checks.h"
#include "cc/storage/copy_rows.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace ops {

/// The row space of two segments: contiguous tensors of any dtype, read as
/// bytes, on one device, their data 4-byte aligned.
inline storage::RowSpace row_space(const at::Tensor& seg0, const at::Tensor& seg1,
                                   const char* name) {
  TORCH_CHECK_VALUE(seg0.device() == seg1.device(), "dynamicemb: the two segments of ", name,
                    " must be on one device, got ", seg0.device(), " and ", seg1.device());
  storage::RowSpace s;
  const at::Tensor* segs[2] = {&seg0, &seg1};
  for (int k = 0; k < 2; ++k) {
    const at::Tensor& t = *segs[k];
    TORCH_CHECK_VALUE(t.is_contiguous(), "dynamicemb: segment ", k, " of ", name,
                      " must be contiguous");
    uint8_t* p = t.numel() ? static_cast<uint8_t*>(t.data_ptr()) : nullptr;
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(p) % 4 == 0, "dynamicemb: segment ", k, " of ",
                      name, " is not 4-byte aligned");
    (k == 0 ? s.seg0 : s.seg1) = p;
    (k == 0 ? s.size0 : s.size1) = t.numel() * t.element_size();
  }
  return s;
}

/// The element type of an embedding (storage::ElementType value).
inline storage::ElementType element_type(int64_t type) {
  TORCH_CHECK_VALUE(type >= 0 && type < storage::kNumElementTypes,
                    "dynamicemb: element_type must be in [0, ", storage::kNumElementTypes,
                    "), got ", type);
  return static_cast<storage::ElementType>(type);
}

/// Refuses a row of an FP8 table wider than a kernel takes.
inline void check_scaled_dim(storage::ElementType type, int64_t dim) {
  TORCH_CHECK_VALUE(type != storage::ElementType::kFloat8E4M3 || dim <= storage::kMaxScaledDim,
                    "dynamicemb: an FP8 row has at most ", storage::kMaxScaledDim,
                    " elements, got dim ", dim);
}

/// Bytes a reader of a row's embedding touches: its elements, and the scale
/// of an FP8 row (cc/storage/row_space.h).
inline int64_t read_bytes(int64_t dim, storage::ElementType type) {
  return type == storage::ElementType::kFloat8E4M3 ? storage::embedding_bytes(dim, type)
                                                   : dim * storage::element_size(type);
}

/// A CPU row offset: -1 (no row), or a multiple of 4 with `bytes` bytes in
/// one segment of `s`; else a ValueError naming it ("<what> offset o at index
/// i ...").
inline void check_row_offset(const storage::RowSpace& s, int64_t offset, int64_t bytes,
                             int64_t index, const char* what) {
  if (offset == -1) return;
  TORCH_CHECK_VALUE(offset % 4 == 0 && s.holds(offset, bytes), "dynamicemb: ", what, " offset ",
                    offset, " at index ", index, " does not hold ", bytes, " bytes in segments of ",
                    s.size0, " and ", s.size1, " bytes");
}

/// The tensor arguments of copy_rows, for check_devices (CPU, CUDA, Meta).
inline void check_copy_rows_devices(const at::Tensor& dst0, const at::Tensor& dst1,
                                    const at::Tensor& dst_offsets, const at::Tensor& src0,
                                    const at::Tensor& src1, const at::Tensor& src_offsets,
                                    const at::Tensor& bytes) {
  check_devices("copy_rows", {{"dst0", &dst0},
                              {"dst1", &dst1},
                              {"dst_offsets", &dst_offsets},
                              {"src0", &src0},
                              {"src1", &src1},
                              {"src_offsets", &src_offsets},
                              {"bytes", &bytes}});
}

/// slot_rows on one backend: checks slots (n) int64 and status (n) int8 on
/// one device and a stride >= 0, allocates (rows, new_rows), then run(args)
/// writes them (copy_rows.h, SlotRowsArgs).
inline void check_slot_rows(const at::Tensor& slots, const at::Tensor& status) {
  check_devices("slot_rows", {{"slots", &slots}, {"status", &status}});
  check_1d(slots, at::kLong, "slots");
  check_1d(status, at::kChar, "status");
  TORCH_CHECK_VALUE(status.sym_numel() == slots.sym_numel(),
                    "dynamicemb: slot_rows takes one status per slot, got ", status.sym_numel(),
                    " for ", slots.sym_numel());
}

template <class Run>
std::tuple<at::Tensor, at::Tensor> slot_rows_with(const at::Tensor& slots, const at::Tensor& status,
                                                  int64_t stride, int64_t found, const Run& run) {
  check_slot_rows(slots, status);
  TORCH_CHECK_VALUE(stride >= 0, "dynamicemb: slot_rows: stride must not be negative, got ",
                    stride);
  TORCH_CHECK_VALUE(found >= -128 && found <= 127,
                    "dynamicemb: slot_rows: found must be an int8 status, got ", found);
  at::Tensor rows = at::empty_like(slots);
  at::Tensor new_rows = at::empty_like(slots);
  storage::SlotRowsArgs a;
  a.slots = slots.data_ptr<int64_t>();
  a.status = status.data_ptr<int8_t>();
  a.stride = stride;
  a.found = static_cast<int8_t>(found);
  a.rows = rows.data_ptr<int64_t>();
  a.new_rows = new_rows.data_ptr<int64_t>();
  a.n = slots.numel();
  run(a);
  return {rows, new_rows};
}

/// copy_rows on one backend: checks (offsets and byte counts on the CPU) and
/// packs the arguments, then run(args) copies.
template <class Run>
void copy_rows_with(at::Tensor& dst0, at::Tensor& dst1, const at::Tensor& dst_offsets,
                    const at::Tensor& src0, const at::Tensor& src1, const at::Tensor& src_offsets,
                    const at::Tensor& bytes, const Run& run) {
  check_copy_rows_devices(dst0, dst1, dst_offsets, src0, src1, src_offsets, bytes);
  check_1d(dst_offsets, at::kLong, "dst_offsets");
  check_1d(src_offsets, at::kLong, "src_offsets");
  check_1d(bytes, at::kLong, "bytes");
  const int64_t n = bytes.numel();
  TORCH_CHECK_VALUE(dst_offsets.numel() == n && src_offsets.numel() == n,
                    "dynamicemb: copy_rows takes one destination offset, source offset and byte "
                    "count per row, got ",
                    dst_offsets.numel(), ", ", src_offsets.numel(), " and ", n);
  storage::CopyArgs a;
  a.dst = row_space(dst0, dst1, "dst");
  a.src = row_space(src0, src1, "src");
  a.dst_offsets = dst_offsets.data_ptr<int64_t>();
  a.src_offsets = src_offsets.data_ptr<int64_t>();
  a.bytes = bytes.data_ptr<int64_t>();
  a.n = n;
  if (bytes.device().is_cpu()) {
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK_VALUE(a.bytes[i] >= 0 && a.bytes[i] % 4 == 0, "dynamicemb: byte count ",
                        a.bytes[i], " at index ", i, " is not a multiple of 4");
      if (!storage::copies(a, i)) continue;
      check_row_offset(a.dst, a.dst_offsets[i], a.bytes[i], i, "destination");
      check_row_offset(a.src, a.src_offsets[i], a.bytes[i], i, "source");
    }
  }
  run(a);
}

#ifdef DEMB_WITH_CUDA
/// `nbytes` of pinned host memory mapped into the address space of CUDA
/// device `device`: (CPU uint8 tensor, CUDA uint8 tensor) views of the same
/// bytes, uninitialized; freed when both views are. Out of memory raises.
std::tuple<at::Tensor, at::Tensor> host_mapped_empty(int64_t nbytes, int64_t device);
#endif

}  // namespace ops
}  // namespace dyn_emb
