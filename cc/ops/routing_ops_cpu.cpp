// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernel of route_keys (cc/routing/routing.h; schema in schemas.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cc/ops/routing_args.h"
#include "cc/ops/tensor_checks.h"
#include "cc/routing/routing.h"

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

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("route_keys", &route_keys_cpu); }

}  // namespace ops
}  // namespace dyn_emb
