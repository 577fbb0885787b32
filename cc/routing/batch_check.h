// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The value checks of a sharded collection's input batch (the `check_batch`
// op; dynamicemb/shard/batch_checks.py makes the rest of the verdict): one
// definition of what is bad and which finding is reported, for the CPU kernel
// and the CUDA one.
//
// A batch is a KeyedJaggedTensor's values (n), lengths (num_features * stride
// bags, feature-major), optional weights (n) and offsets. Its findings, in the
// order of priority (the first one found is the verdict):
//
//   kOffsetsStart    offsets[0] != 0                       a: offsets[0]
//   kNegativeLength  the first negative length             a: bag, b: length
//   kLengthsSum      sum(lengths) != n                     a: the sum, b: n
//   kReservedKey     the first reserved key of a checked   a: position, b: key,
//                    feature (key < first valid key)          c: feature
//   kBadId           the first id of a bounded feature     a: position, b: id,
//                    (a static table's) outside [0, rows)     c: feature
//   kBadWeight       the first bad weight of a checked     a: position,
//                    feature (weight_ok)                      b: its float64 bits,
//                                                             c: feature
//
// The verdict is a row of four int64 words (code, a, b, c), zeros when the
// batch is good, followed by the batch's lengths per feature.
#pragma once

#include <cmath>
#include <cstdint>

#include "cc/common/host_device.h"

namespace dyn_emb {
namespace routing {

/// Finding codes: the values of dynamicemb.shard.batch_checks.Code.
enum class BatchCode : int64_t {
  kOk = 0,
  kOffsetsStart = 8,
  kNegativeLength = 9,
  kLengthsSum = 10,
  kReservedKey = 11,
  kBadWeight = 12,
  kBadId = 15,
};

/// What the weights of the checked features must be (check_batch's
/// weight_rule).
enum class WeightRule : int64_t {
  kNone = 0,      // not read
  kFinite = 1,    // pooling weights
  kCounters = 2,  // frequency counters: finite whole numbers >= 0
};

/// Words of the verdict row before the lengths per feature.
constexpr int64_t kVerdictWords = 4;

/// "Not found" of a first position (positions are compared as unsigned).
constexpr uint64_t kNone = ~0ULL;

/// Whether weight w follows `rule`.
DEMB_HD bool weight_ok(double w, int64_t rule) {
#if defined(__CUDA_ARCH__)
  const bool finite = isfinite(w);
  const bool whole = ::floor(w) == w;
#else
  const bool finite = std::isfinite(w);
  const bool whole = std::floor(w) == w;
#endif
  if (rule == static_cast<int64_t>(WeightRule::kFinite)) return finite;
  if (rule == static_cast<int64_t>(WeightRule::kCounters)) return finite && w >= 0.0 && whole;
  return true;
}

/// Whether `id` is a row of a feature bounded by `rows` (a static table's
/// rows; rows <= 0: not bounded).
DEMB_HD bool id_ok(int64_t id, int64_t rows) { return rows <= 0 || (id >= 0 && id < rows); }

/// The bag holding value `pos`: the number of bags whose inclusive end
/// (`ends`, the cumulative sums of the lengths clamped at 0) is <= pos,
/// clamped to the last bag.
DEMB_HD int64_t bag_of(const int64_t* ends, int64_t num_bags, int64_t pos) {
  const int64_t bag = upper_bound(ends, num_bags, pos);
  return bag < num_bags ? bag : num_bags - 1;
}

/// The feature of value `pos` from the lengths per feature (valid when no
/// length is negative: the findings that name a feature come after those).
DEMB_HD int64_t feature_of(const int64_t* length_per_feature, int64_t num_features, int64_t pos) {
  int64_t end = 0;
  for (int64_t f = 0; f < num_features; ++f) {
    end += length_per_feature[f];
    if (pos < end) return f;
  }
  return num_features > 0 ? num_features - 1 : 0;
}

/// What a pass over the batch found, before the verdict is made of it.
struct BatchFacts {
  int64_t n = 0;  // values
  bool has_first_offset = false;
  int64_t first_offset = 0;
  uint64_t negative = kNone;    // first bag with a negative length
  int64_t negative_length = 0;  // its length
  int64_t total = 0;            // sum of the lengths
  uint64_t reserved = kNone;    // first reserved key's position
  int64_t reserved_key = 0;
  uint64_t bad_id = kNone;  // first out-of-bounds id's position
  int64_t bad_id_value = 0;
  uint64_t bad_weight = kNone;  // first bad weight's position
  int64_t bad_weight_bits = 0;  // its float64 bits
};

/// The float64 bits of a weight, every NaN as the one canonical quiet NaN
/// (0x7ff8...): the CPU's and CUDA's conversions from float16 keep
/// different NaN payloads.
DEMB_HD int64_t weight_bits(int64_t bits) {
  constexpr uint64_t kExponent = 0x7ff0000000000000ULL, kMantissa = 0x000fffffffffffffULL;
  const auto u = static_cast<uint64_t>(bits);
  const bool nan = (u & kExponent) == kExponent && (u & kMantissa) != 0;
  return nan ? static_cast<int64_t>(0x7ff8000000000000ULL) : bits;
}

/// Writes the verdict row (kVerdictWords words) of `facts`;
/// `length_per_feature` names the feature of a bad key or weight.
DEMB_HD void batch_verdict(const BatchFacts& facts, const int64_t* length_per_feature,
                           int64_t num_features, int64_t* row) {
  int64_t code = static_cast<int64_t>(BatchCode::kOk), a = 0, b = 0, c = 0;
  if (facts.has_first_offset && facts.first_offset != 0) {
    code = static_cast<int64_t>(BatchCode::kOffsetsStart);
    a = facts.first_offset;
  } else if (facts.negative != kNone) {
    code = static_cast<int64_t>(BatchCode::kNegativeLength);
    a = static_cast<int64_t>(facts.negative);
    b = facts.negative_length;
  } else if (facts.total != facts.n) {
    code = static_cast<int64_t>(BatchCode::kLengthsSum);
    a = facts.total;
    b = facts.n;
  } else if (facts.reserved != kNone) {
    code = static_cast<int64_t>(BatchCode::kReservedKey);
    a = static_cast<int64_t>(facts.reserved);
    b = facts.reserved_key;
    c = feature_of(length_per_feature, num_features, a);
  } else if (facts.bad_id != kNone) {
    code = static_cast<int64_t>(BatchCode::kBadId);
    a = static_cast<int64_t>(facts.bad_id);
    b = facts.bad_id_value;
    c = feature_of(length_per_feature, num_features, a);
  } else if (facts.bad_weight != kNone) {
    code = static_cast<int64_t>(BatchCode::kBadWeight);
    a = static_cast<int64_t>(facts.bad_weight);
    b = weight_bits(facts.bad_weight_bits);
    c = feature_of(length_per_feature, num_features, a);
  }
  row[0] = code;
  row[1] = a;
  row[2] = b;
  row[3] = c;
}

}  // namespace routing
}  // namespace dyn_emb
