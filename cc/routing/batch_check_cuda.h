// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dyn_emb {
namespace routing {
namespace cuda {

/// Element types of a batch's tensors as the kernels read them.
enum class WeightType : int { kNone = 0, kHalf = 1, kBFloat16 = 2, kFloat = 3, kDouble = 4 };

/// A KeyedJaggedTensor's tensors, every pointer on the device (batch_check.h).
struct BatchView {
  const void* values = nullptr;  // (n) int32 or int64
  bool values_64 = true;
  int64_t n = 0;
  const void* lengths = nullptr;  // (num_features * stride) int32 or int64
  bool lengths_64 = true;
  int64_t num_features = 0;
  int64_t stride = 0;
  const void* weights = nullptr;  // (n) or nullptr
  WeightType weight_type = WeightType::kNone;
  int64_t weight_rule = 0;        // WeightRule
  const void* offsets = nullptr;  // first word read, or nullptr
  bool offsets_64 = true;
  const bool* feature_mask = nullptr;     // (num_features): checked features; nullptr: all
  const int64_t* feature_rows = nullptr;  // (num_features): ids in [0, rows) where rows > 0;
                                          // nullptr: no bounds
  const int64_t* ends = nullptr;          // (num_bags) inclusive sums of the lengths clamped at 0;
                                          // needed with a feature_mask or feature_rows only
};

/// Bytes of device scratch check_batch needs.
constexpr int64_t kCheckScratchBytes = 64;

/// @brief Writes the verdict row and the lengths per feature of `batch`
/// (batch_check.h) into `out` (kVerdictWords + num_features int64), using
/// `scratch` (kCheckScratchBytes): two memsets and two kernels, nothing read
/// on the host.
void check_batch(const BatchView& batch, int64_t first_valid_key, int64_t* out, void* scratch,
                 cudaStream_t stream);

}  // namespace cuda
}  // namespace routing
}  // namespace dyn_emb
