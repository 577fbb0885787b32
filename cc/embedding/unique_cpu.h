// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The segmented unique on the CPU (unique.h; the CUDA kernel is unique_cuda.h).
#pragma once

#include <cstdint>

#include "cc/embedding/unique.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// Writes every output for the n >= 0 occurrences (keys, table_ids), the
/// padding after the distinct pairs (key pad_key, table num_tables - 1, count
/// 0) included. Every table id must lie in [0, num_tables) (the op checks).
///
/// The stable sort by key, then a stable counting sort by table, which groups
/// each pair's occurrences in input order; the pairs of a table are then put
/// in the order of their first occurrences (the CUDA kernel's order) and one
/// pass writes every output.
void segmented_unique(const int64_t* keys, const int64_t* table_ids, int64_t n, int64_t num_tables,
                      int64_t pad_key, const UniqueOutputs& out);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
