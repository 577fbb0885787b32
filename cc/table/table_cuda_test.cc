// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Host-side checks of the CUDA backend, runnable without a GPU: it links, and
// its launches fail with an exception (not a crash) that names the backend when
// no device is usable. The kernels themselves are checked against the CPU
// backend on the GPU machine (tests/table, marked gpu).
#include "cc/table/table_cuda.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace table {
namespace {

class NullScratch : public cuda::ScratchAllocator {
 public:
  void* allocate(size_t) override { return nullptr; }
};

TEST(CudaBackend, LaunchWithoutDeviceThrowsAnErrorNamingTheBackend) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; kernels are tested in pytest";
  TableRef t;
  RunArgs r;
  NullScratch scratch;
  std::vector<int64_t> count(1);
  try {
    cuda::run_op(t, r, 0, 1, false, count.data(), scratch, nullptr);
    FAIL() << "run_op returned without a device";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("dynamicemb ", 0), 0u) << what;
    EXPECT_NE(what.find(" (CUDA): "), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace table
}  // namespace dyn_emb
