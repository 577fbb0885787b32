// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cstdint>

#include "cc/embedding/optimizer.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// @brief update_row for each i with rows[i] >= 0: values[rows[i]] (width
/// floats) with grads[i] (dim floats). Rows must be distinct.
void optimizer_step(const OptimArgs& a, float* values, int64_t width, const int64_t* rows,
                    const float* grads, int64_t n, int64_t dim);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
