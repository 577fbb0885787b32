// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA side of the storage tiers: the copy_rows kernel (schema in
// schemas.cpp) and host memory the device reads and writes directly.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cc/ops/storage_args.h"
#include "cc/storage/copy_rows_cuda.h"

namespace dyn_emb {
namespace ops {
namespace {

void copy_rows_cuda(at::Tensor& dst0, at::Tensor& dst1, const at::Tensor& dst_offsets,
                    const at::Tensor& src0, const at::Tensor& src1, const at::Tensor& src_offsets,
                    const at::Tensor& bytes) {
  const c10::cuda::CUDAGuard guard(bytes.device());
  copy_rows_with(dst0, dst1, dst_offsets, src0, src1, src_offsets, bytes,
                 [](const storage::CopyArgs& a) {
                   storage::cuda::copy_rows(a, c10::cuda::getCurrentCUDAStream().stream());
                 });
}

// Mapped host memory freed while this thread captures a CUDA graph (a
// segment garbage-collected inside a capture): cudaFreeHost synchronizes the
// device, which would invalidate the capture, so it waits here until the
// next free or allocation outside a capture.
std::mutex& pending_mutex() {
  static std::mutex m;
  return m;
}

std::vector<void*>& pending_frees() {
  static std::vector<void*> v;
  return v;
}

// Whether the current stream captures (an error reads as not: the deleter
// also runs at exit, when the runtime may be gone).
bool capturing() noexcept {
  try {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return status != cudaStreamCaptureStatusNone;
  } catch (...) {  // no current stream to ask (the deleter must not throw)
    return false;
  }
}

void free_pending() {
  std::vector<void*> ready;
  {
    const std::lock_guard<std::mutex> lock(pending_mutex());
    ready.swap(pending_frees());
  }
  for (void* p : ready) (void)cudaFreeHost(p);
}

void free_mapped(void* p) {
  if (capturing()) {
    const std::lock_guard<std::mutex> lock(pending_mutex());
    pending_frees().push_back(p);
    return;
  }
  free_pending();
  (void)cudaFreeHost(p);
}

std::tuple<at::Tensor, at::Tensor> slot_rows_cuda(const at::Tensor& slots, const at::Tensor& status,
                                                  int64_t stride, int64_t found) {
  const c10::cuda::CUDAGuard guard(slots.device());
  return slot_rows_with(slots, status, stride, found, [](const storage::SlotRowsArgs& a) {
    storage::cuda::slot_rows(a, c10::cuda::getCurrentCUDAStream().stream());
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> host_mapped_empty(int64_t nbytes, int64_t device) {
  TORCH_CHECK_VALUE(nbytes >= 0, "dynamicemb: host_mapped_empty needs nbytes >= 0, got ", nbytes);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  const auto on_device = bytes.device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  // No allocation for no bytes: from_blob cannot place a null pointer on a device.
  if (nbytes == 0) return {at::empty({0}, bytes), at::empty({0}, on_device)};
  TORCH_CHECK(!capturing(),
              "dynamicemb: host_mapped_empty cannot allocate while a CUDA graph is captured");
  free_pending();
  void* host = nullptr;
  const cudaError_t e = cudaHostAlloc(&host, static_cast<size_t>(nbytes),
                                      cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error for later calls
    TORCH_CHECK(false, "dynamicemb: cannot allocate ", nbytes,
                " bytes of mapped host memory: out of memory (", cudaGetErrorString(e), ")");
  }
  // Both views share the allocation; it is freed when the last one is.
  std::shared_ptr<void> owner(host, free_mapped);
  void* dev = nullptr;
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
  at::Tensor h = at::from_blob(host, {nbytes}, [owner](void*) {}, bytes);
  at::Tensor d = at::from_blob(dev, {nbytes}, [owner](void*) {}, on_device);
  return {h, d};
}

TORCH_LIBRARY_IMPL(dynamicemb, CUDA, m) {
  m.impl("copy_rows", &copy_rows_cuda);
  m.impl("slot_rows", &slot_rows_cuda);
}

}  // namespace ops
}  // namespace dyn_emb
