// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cstdint>

#include "cc/embedding/initializer.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// @brief out[i, e] = init_value(a, keys[i], table_ids[i], e) for e < dim.
/// @param out (n, dim) float32
void init_rows(const InitArgs& a, const int64_t* keys, const int64_t* table_ids, int64_t n,
               int64_t dim, float* out);

/// @brief Writes the new rows of a.offsets (>= 0) in place (RowInitArgs), rows of
/// element type `type`.
void init_rows_at(const RowInitArgs& a, int64_t n, storage::ElementType type);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
