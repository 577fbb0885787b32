// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cc/embedding/initializer.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// @brief Device-side cpu::init_rows: the same values, bit for bit in the
/// uniform, constant and debug modes (the normal modes go through log, sqrt
/// and sin/cos, whose last bits may differ between host and device libraries).
void init_rows(const InitArgs& a, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t dim, float* out, cudaStream_t stream);

/// @brief Device-side cpu::init_rows_at: a warp per entry, entries with offset
/// -1 (most of a batch) leave at once.
void init_rows_at(const RowInitArgs& a, int64_t n, storage::ElementType type, cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
