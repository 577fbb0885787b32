// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Scratch memory of the CUDA ops: the torch-free CUDA backends ask for it
// through table::cuda::ScratchAllocator.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "cc/table/table_cuda.h"

namespace dyn_emb {
namespace ops {

/// Scratch from the caching allocator, kept alive until the op returns
/// (stream-ordered reuse makes that safe).
class TorchScratch : public table::cuda::ScratchAllocator {
 public:
  explicit TorchScratch(const at::Tensor& like) : opts_(like.options().dtype(at::kByte)) {}
  void* allocate(size_t bytes) override {
    buffers_.push_back(at::empty({static_cast<int64_t>(bytes < 1 ? 1 : bytes)}, opts_));
    return buffers_.back().data_ptr();
  }

 private:
  at::TensorOptions opts_;
  std::vector<at::Tensor> buffers_;
};

}  // namespace ops
}  // namespace dyn_emb
