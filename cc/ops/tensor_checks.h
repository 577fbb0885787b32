// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Checks of op arguments that any op makes: dtype, shape, contiguity and
// device, and index ranges of CPU tensors. Errors are caller errors
// (TORCH_CHECK_*), named with the bad value.
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>

namespace dyn_emb {
namespace ops {

inline void check_1d(const at::Tensor& t, at::ScalarType dtype, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, "dynamicemb: ", name, " must be ", dtype, ", got ",
                   t.scalar_type());
  TORCH_CHECK(t.dim() == 1, "dynamicemb: ", name, " must be 1-D, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "dynamicemb: ", name, " must be contiguous");
}

/// Every entry of the int64 tensor `idx` in [lo, hi), else a ValueError naming
/// the first bad one ("<what> v at index i is out of range [lo, hi)"). Only CPU
/// tensors are read: their values are on the host.
inline void check_index_range(const at::Tensor& idx, int64_t lo, int64_t hi, const char* what) {
  if (!idx.device().is_cpu()) return;
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    TORCH_CHECK_VALUE(p[i] >= lo && p[i] < hi, "dynamicemb: ", what, " ", p[i], " at index ", i,
                      " is out of range [", lo, ", ", hi, ")");
  }
}

/// Every tensor of `others` on a's device.
inline void check_same_device(const at::Tensor& a,
                              std::initializer_list<const at::Tensor*> others) {
  for (const at::Tensor* t : others) {
    TORCH_CHECK(t->device() == a.device(), "dynamicemb: every tensor must be on ", a.device(),
                ", got one on ", t->device());
  }
}

/// The dispatcher sent a CPU kernel CPU tensors.
inline void check_cpu(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu(), "dynamicemb: CPU kernel got a ", t.device(),
                        " tensor");
}

}  // namespace ops
}  // namespace dyn_emb
