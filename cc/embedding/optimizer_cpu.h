// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cstdint>

#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// @brief update_row of a float32 row: w (dim), its state s, gradient g.
/// The coordinates go eight at a time where the CPU has AVX2 (every
/// optimizer but FTRL; the operations in update_coord's order, each rounded
/// as there: no fused multiply-add), to the same values.
void update_float_row(const OptimArgs& a, float* w, float* s, const float* g, int64_t dim);

/// @brief update_float_row for each i with rows[i] >= 0: values[rows[i]] (width
/// floats) with grads[i] (dim floats). Rows must be distinct.
void optimizer_step(const OptimArgs& a, float* values, int64_t width, const int64_t* rows,
                    const float* grads, int64_t n, int64_t dim);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
