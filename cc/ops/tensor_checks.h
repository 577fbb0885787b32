// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Checks of op arguments that any op makes: dtype, shape, contiguity and
// device, and index ranges of CPU tensors. Errors are caller errors
// (TORCH_CHECK_*), named with the bad value.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <utility>

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

/// A tensor argument and its name, for check_devices.
using NamedTensor = std::pair<const char*, const at::Tensor*>;

/// Every tensor argument of one call defined (None given for a Tensor arrives
/// undefined) and on one device, that of the first. Every kernel of an op,
/// Meta included, runs this before anything else: the dispatcher picks the
/// kernel of the "highest" device among the arguments (meta above cuda above
/// cpu), so a kernel can be handed tensors of other devices, whose memory it
/// must not read.
inline void check_devices(const char* op, std::initializer_list<NamedTensor> args) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& a : args) {
    TORCH_CHECK_VALUE(a.second->defined(), "dynamicemb: ", op, ": ", a.first,
                      " is None, a tensor is required");
    if (first == nullptr) {
      first = &a;
      continue;
    }
    TORCH_CHECK_VALUE(a.second->device() == first->second->device(), "dynamicemb: ", op, ": ",
                      a.first, " is on ", a.second->device(), " but ", first->first, " is on ",
                      first->second->device(), ": every tensor must be on one device");
  }
}

/// The dispatcher sent a CPU kernel CPU tensors.
inline void check_cpu(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu(), "dynamicemb: CPU kernel got a ", t.device(),
                        " tensor");
}

}  // namespace ops
}  // namespace dyn_emb
