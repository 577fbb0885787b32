// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// What the CUDA backend's operations share (table_cuda_shared.cuh), the lane
// counts of tile_probe.cuh, the timer and the device count.
#include <cstdlib>
#include <cub/cub.cuh>

#include "cc/common/cuda_launch.cuh"
#include "cc/table/layout.h"
#include "cc/table/rows.h"
#include "cc/table/table_cuda_shared.cuh"
#include "cc/table/tile_probe.cuh"

namespace dyn_emb {
namespace table {
namespace cuda {

namespace {

// Tables whose info and counters the layout check reads from shared memory
// (kLayoutStage int64 words): a block copies them there at once, then one
// thread walks them. Reading them from global memory one dependent load
// after another took 17 us for 10 tables, on every run-wise call.
constexpr int64_t kLayoutStage = 4096;
constexpr int kLayoutThreads = 256;

// 1 where info describes a consistent layout (and, when given, the bucket
// count and NO_EVICTION flag the caller passed agree with it, and the
// counters keep their invariants, rows.h).
__global__ void layout_kernel(TableRef t, int64_t free_rows_len, int64_t total_buckets,
                              bool has_rows, int32_t* ok) {
  __shared__ int64_t staged[kLayoutStage];
  const int64_t info_words = t.num_tables * kInfoCols;
  const int64_t words = info_words + (t.counters ? t.num_tables * kCounterCols : 0);
  if (words <= kLayoutStage) {
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      staged[w] = w < info_words ? t.info[w] : t.counters[w - info_words];
    }
    __syncthreads();
    t.info = staged;
    if (t.counters) t.counters = staged + info_words;
  }
  if (threadIdx.x != 0) return;
  int64_t buckets = 0, bad = 0;
  bool rows = false;
  const int32_t e = check_layout(t, free_rows_len, &buckets, &rows, &bad);
  *ok = e == kLayoutOk && (total_buckets < 0 || buckets == total_buckets) && (has_rows || !rows) &&
        (t.counters == nullptr || check_counters(t, &bad) == kCountersOk);
}

__global__ void timer_kernel(int64_t* now) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *now = static_cast<int64_t>(t);
}

__global__ void iota64_kernel(int64_t* out, int64_t n, int64_t base) {
  const int64_t i = global_thread();
  if (i < n) out[i] = base + i;
}

/// Lanes per key or run chosen by an environment variable (read once).
int lanes_from_env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  const int x = std::atoi(v);
  return (x == 1 || x == 2 || x == 4 || x == 8 || x == 16 || x == 32) ? x : fallback;
}

}  // namespace

const int32_t* layout_ok(const TableRef& t, int64_t free_rows_len, int64_t total_buckets,
                         bool has_rows, ScratchAllocator& scratch, cudaStream_t stream) {
  auto* ok = static_cast<int32_t*>(scratch.allocate(sizeof(int32_t)));
  layout_kernel<<<1, kLayoutThreads, 0, stream>>>(t, free_rows_len, total_buckets, has_rows, ok);
  return ok;
}

ScoreArgs with_timer(const ScoreArgs& a, int32_t num_scores, ScratchAllocator& scratch,
                     cudaStream_t stream) {
  ScoreArgs out = a;
  for (int32_t c = 0; c < num_scores; ++c) {
    if (a.policy[c] == static_cast<int32_t>(ScorePolicy::kTimer)) {
      auto* now = static_cast<int64_t*>(scratch.allocate(sizeof(int64_t)));
      timer_kernel<<<1, 1, 0, stream>>>(now);
      out.device_now = now;
      break;
    }
  }
  return out;
}

int64_t* select_flagged(const uint8_t* flags, int64_t n, int64_t base, int64_t* count,
                        ScratchAllocator& scratch, cudaStream_t stream) {
  int64_t* pos = alloc<int64_t>(scratch, n);
  int64_t* sel = alloc<int64_t>(scratch, n);
  iota64_kernel<<<grid_for(n), kBlock, 0, stream>>>(pos, n, base);
  size_t bytes = 0;
  check_cuda(cub::DeviceSelect::Flagged(nullptr, bytes, pos, flags, sel, count, n, stream),
             "select (size)");
  void* tmp = scratch.allocate(bytes);
  check_cuda(cub::DeviceSelect::Flagged(tmp, bytes, pos, flags, sel, count, n, stream), "select");
  return sel;
}

int find_lanes() {
  static const int lanes = lanes_from_env("DEMB_CUDA_FIND_LANES", 4);
  return lanes == 1 ? 16 : lanes;
}

int tile_lanes(const TableRef& t, int64_t n, int64_t total_buckets) {
  static const int lanes = [] {
    const int x = lanes_from_env("DEMB_CUDA_RUN_LANES", 0);
    return x == 1 || x == 4 || x == 8 || x == 16 || x == 32 ? x : 0;
  }();
  if (lanes) return lanes;
  if (total_buckets <= 0) return 8;
  if (n < kTileMinKeysPerBucket * total_buckets) return 1;
  return t.num_slots / total_buckets > 256 ? 32 : 8;
}

void read_timer(int64_t* now, cudaStream_t stream) {
  timer_kernel<<<1, 1, 0, stream>>>(now);
  check_launch("read_timer");
}

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  return e == cudaSuccess ? n : -static_cast<int>(e);
}

}  // namespace cuda
}  // namespace table
}  // namespace dyn_emb
