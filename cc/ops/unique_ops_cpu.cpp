// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU kernel of segmented_unique (schema in schemas.cpp): its checks and
// results around the kernel of cc/embedding/unique_cpu.h. One op, so that a
// training step pays one call from Python for it instead of some forty.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "cc/embedding/unique_cpu.h"
#include "cc/ops/tensor_checks.h"
#include "cc/ops/unique_args.h"

namespace dyn_emb {
namespace ops {
namespace {

// Table ids are checked (on the CPU their values are on the host).
UniqueResult segmented_unique_cpu(const at::Tensor& keys, const at::Tensor& table_ids,
                                  int64_t num_tables, int64_t pad_key) {
  check_unique_args(keys, table_ids, num_tables);
  check_index_range(table_ids, 0, num_tables, "table_ids: table id");
  UniqueResult out = empty_unique(keys, num_tables);
  embedding::cpu::segmented_unique(keys.data_ptr<int64_t>(), table_ids.data_ptr<int64_t>(),
                                   keys.numel(), num_tables, pad_key, unique_outputs(out));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dynamicemb, CPU, m) { m.impl("segmented_unique", &segmented_unique_cpu); }

}  // namespace ops
}  // namespace dyn_emb
