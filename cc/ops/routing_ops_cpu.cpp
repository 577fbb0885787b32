// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernels of route_keys (cc/routing/routing.h) and check_batch
// (cc/routing/batch_check.h); schemas in schemas.cpp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "cc/ops/routing_args.h"
#include "cc/ops/tensor_checks.h"
#include "cc/routing/batch_check.h"
#include "cc/routing/routing.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace ops {
namespace {

at::Tensor route_keys_cpu(const at::Tensor& keys, const at::Tensor& feature_ids,
                          const at::Tensor& dist_types, const at::Tensor& blocks,
                          int64_t world_size) {
  check_route_args(keys, feature_ids, dist_types, blocks, world_size);
  check_cpu(keys);
  const int64_t nf = dist_types.numel();
  const int64_t* d = dist_types.data_ptr<int64_t>();
  const int64_t* b = blocks.data_ptr<int64_t>();
  for (int64_t f = 0; f < nf; ++f) {
    TORCH_CHECK_VALUE(d[f] >= 0 && d[f] <= 2, "dynamicemb: route_keys dist type ", d[f],
                      " of feature ", f,
                      " is not 0 (continuous), 1 (roundrobin) or 2 (hash_roundrobin)");
    TORCH_CHECK_VALUE(d[f] != 0 || b[f] > 0, "dynamicemb: route_keys continuous block of feature ",
                      f, " must be positive, got ", b[f]);
  }
  const int64_t n = keys.numel();
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* fid = feature_ids.data_ptr<int64_t>();
  check_index_range(feature_ids, 0, nf, "route_keys feature id");
  at::Tensor ranks = at::empty({n}, keys.options());
  int64_t* r = ranks.data_ptr<int64_t>();
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      r[i] = routing::route_key(k[i], d[fid[i]], b[fid[i]], world_size);
    }
  });
  return ranks;
}

at::Tensor check_batch_cpu(const at::Tensor& values, const at::Tensor& lengths,
                           const c10::optional<at::Tensor>& weights,
                           const c10::optional<at::Tensor>& offsets,
                           const c10::optional<at::Tensor>& feature_mask, int64_t num_features,
                           int64_t stride, int64_t weight_rule,
                           const c10::optional<at::Tensor>& feature_rows) {
  check_batch_args(values, lengths, weights, offsets, feature_mask, num_features, stride,
                   weight_rule, feature_rows);
  check_cpu(values);
  using routing::kNone;
  const int64_t n = values.numel(), num_bags = lengths.numel();
  at::Tensor out =
      at::zeros({routing::kVerdictWords + num_features}, values.options().dtype(at::kLong));
  int64_t* per_feature = out.data_ptr<int64_t>() + routing::kVerdictWords;
  const at::Tensor len = lengths.to(at::kLong);
  const int64_t* l = len.data_ptr<int64_t>();
  routing::BatchFacts facts;
  facts.n = n;
  if (offsets.has_value()) {
    facts.has_first_offset = true;
    facts.first_offset = offsets->to(at::kLong).data_ptr<int64_t>()[0];
  }
  const bool by_feature = feature_mask.has_value() || feature_rows.has_value();
  std::vector<int64_t> ends(by_feature ? num_bags : 0);
  int64_t end = 0;
  for (int64_t i = 0; i < num_bags; ++i) {
    per_feature[i / stride] += l[i];
    facts.total += l[i];
    if (l[i] < 0 && facts.negative == kNone) {
      facts.negative = static_cast<uint64_t>(i);
      facts.negative_length = l[i];
    }
    if (!ends.empty()) ends[i] = end += l[i] > 0 ? l[i] : 0;
  }
  const bool* mask = feature_mask.has_value() ? feature_mask->data_ptr<bool>() : nullptr;
  auto feature = [&](int64_t i) { return routing::bag_of(ends.data(), num_bags, i) / stride; };
  auto checked = [&](int64_t i) { return mask == nullptr || num_bags == 0 || mask[feature(i)]; };
  if (feature_rows.has_value() && num_bags > 0) {
    const int64_t* rows = feature_rows->data_ptr<int64_t>();
    const bool v64 = values.scalar_type() == at::kLong;
    const void* v = values.data_ptr();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id =
          v64 ? static_cast<const int64_t*>(v)[i] : static_cast<const int32_t*>(v)[i];
      if (!routing::id_ok(id, rows[feature(i)])) {
        facts.bad_id = static_cast<uint64_t>(i);
        facts.bad_id_value = id;
        break;
      }
    }
  }
  if (values.scalar_type() == at::kLong) {
    const int64_t* v = values.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      if (v[i] < table::kFirstValidKey && checked(i)) {
        facts.reserved = static_cast<uint64_t>(i);
        facts.reserved_key = v[i];
        break;
      }
    }
  }
  if (weights.has_value() && weight_rule != static_cast<int64_t>(routing::WeightRule::kNone)) {
    const at::Tensor w = weights->to(at::kDouble);
    const double* p = w.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      if (!routing::weight_ok(p[i], weight_rule) && checked(i)) {
        facts.bad_weight = static_cast<uint64_t>(i);
        std::memcpy(&facts.bad_weight_bits, p + i, sizeof(double));
        break;
      }
    }
  }
  routing::batch_verdict(facts, per_feature, num_features, out.data_ptr<int64_t>());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) {
  m.impl("route_keys", &route_keys_cpu);
  m.impl("check_batch", &check_batch_cpu);
}

}  // namespace ops
}  // namespace dyn_emb
