// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cc/common/cuda_launch.cuh"
#include "cc/routing/batch_check.h"
#include "cc/routing/batch_check_cuda.h"

namespace dyn_emb {
namespace routing {
namespace cuda {

namespace {

// Scratch words: the first negative length's bag, reserved key's position,
// bad weight's position and out-of-bounds id's position (kNone: none). The
// sum of the lengths is kept in out[1] until the verdict overwrites the row.
constexpr int kNegative = 0, kReserved = 1, kBadWeight = 2, kBadIdPos = 3;

__device__ __forceinline__ int64_t load_int(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

__device__ __forceinline__ double load_weight(const void* p, WeightType t, int64_t i) {
  switch (t) {
    case WeightType::kHalf:
      return __half2float(static_cast<const __half*>(p)[i]);
    case WeightType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case WeightType::kFloat:
      return static_cast<const float*>(p)[i];
    case WeightType::kDouble:
      return static_cast<const double*>(p)[i];
    default:
      return 0.0;
  }
}

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
  for (int d = kWarp / 2; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// Grid-stride over max(bags, values), a warp's 32 items at a time: the
// lengths' sums (total and per feature, one atomic per warp when its bags are
// one feature's) and the first bad length, key and weight.
__global__ void check_batch_kernel(BatchView b, int64_t first_valid_key, int64_t* out,
                                   unsigned long long* firsts) {
  const int64_t num_bags = b.num_features * b.stride;
  const int64_t items = num_bags > b.n ? num_bags : b.n;
  const int lane = threadIdx.x % kWarp;
  int64_t* per_feature = out + kVerdictWords;
  for (int64_t base = (global_thread() / kWarp) * kWarp; base < items;
       base += launch_warps() * kWarp) {
    const int64_t i = base + lane;
    int64_t len = 0, f = -1;
    if (i < num_bags) {
      len = load_int(b.lengths, b.lengths_64, i);
      f = i / b.stride;
      if (len < 0) atomicMin(firsts + kNegative, static_cast<unsigned long long>(i));
    }
    if (base < num_bags) {  // warp-uniform
      const int64_t sum = warp_sum(len);
      const int64_t first = __shfl_sync(0xffffffffu, f, 0);
      const int64_t last = __shfl_sync(0xffffffffu, f, kWarp - 1);
      if (lane == 0 && sum != 0) atomic_add_i64(out + 1, sum);
      if (first == last && first >= 0) {
        if (lane == 0 && sum != 0) atomic_add_i64(per_feature + first, sum);
      } else if (f >= 0 && len != 0) {
        atomic_add_i64(per_feature + f, len);
      }
    }
    if (i < b.n) {
      // -1: no feature to name (no bags: a finding of the lengths).
      const int64_t feature =
          b.ends != nullptr && num_bags > 0 ? bag_of(b.ends, num_bags, i) / b.stride : -1;
      const bool checked = b.feature_mask == nullptr || feature < 0 || b.feature_mask[feature];
      if (b.feature_rows != nullptr && feature >= 0 &&
          !id_ok(load_int(b.values, b.values_64, i), b.feature_rows[feature])) {
        atomicMin(firsts + kBadIdPos, static_cast<unsigned long long>(i));
      }
      if (checked && b.values_64 && static_cast<const int64_t*>(b.values)[i] < first_valid_key) {
        atomicMin(firsts + kReserved, static_cast<unsigned long long>(i));
      }
      if (checked && b.weights != nullptr &&
          !weight_ok(load_weight(b.weights, b.weight_type, i), b.weight_rule)) {
        atomicMin(firsts + kBadWeight, static_cast<unsigned long long>(i));
      }
    }
  }
}

// One thread: the verdict row from what the pass found.
__global__ void check_batch_verdict(BatchView b, int64_t* out, const unsigned long long* firsts) {
  BatchFacts facts;
  facts.n = b.n;
  if (b.offsets != nullptr) {
    facts.has_first_offset = true;
    facts.first_offset = load_int(b.offsets, b.offsets_64, 0);
  }
  facts.total = out[1];
  facts.negative = firsts[kNegative];
  if (facts.negative != kNone) {
    facts.negative_length = load_int(b.lengths, b.lengths_64, static_cast<int64_t>(facts.negative));
  }
  facts.reserved = firsts[kReserved];
  if (facts.reserved != kNone) {
    facts.reserved_key = static_cast<const int64_t*>(b.values)[facts.reserved];
  }
  facts.bad_id = firsts[kBadIdPos];
  if (facts.bad_id != kNone) {
    facts.bad_id_value = load_int(b.values, b.values_64, static_cast<int64_t>(facts.bad_id));
  }
  facts.bad_weight = firsts[kBadWeight];
  if (facts.bad_weight != kNone) {
    facts.bad_weight_bits =
        __double_as_longlong(load_weight(b.weights, b.weight_type, facts.bad_weight));
  }
  batch_verdict(facts, out + kVerdictWords, b.num_features, out);
}

}  // namespace

void check_batch(const BatchView& batch, int64_t first_valid_key, int64_t* out, void* scratch,
                 cudaStream_t stream) {
  const int64_t words = kVerdictWords + batch.num_features;
  check_cuda(cudaMemsetAsync(out, 0, words * sizeof(int64_t), stream), "check_batch");
  check_cuda(cudaMemsetAsync(scratch, 0xff, kCheckScratchBytes, stream), "check_batch");
  auto* firsts = static_cast<unsigned long long*>(scratch);
  const int64_t num_bags = batch.num_features * batch.stride;
  const int64_t items = num_bags > batch.n ? num_bags : batch.n;
  if (items > 0) {
    check_batch_kernel<<<grid_strided(items), kBlock, 0, stream>>>(batch, first_valid_key, out,
                                                                   firsts);
    check_launch("check_batch");
  }
  check_batch_verdict<<<1, 1, 0, stream>>>(batch, out, firsts);
  check_launch("check_batch");
}

}  // namespace cuda
}  // namespace routing
}  // namespace dyn_emb
