// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime_api.h>

#include "cc/storage/copy_rows.h"

namespace dyn_emb {
namespace storage {
namespace cuda {

/// @brief Copies the rows of `a` (copy_rows.h), a warp per row, 16-byte words
/// where the row and both addresses allow, else 4-byte words;
/// either space may be host memory mapped into the device's address space.
void copy_rows(const CopyArgs& a, cudaStream_t stream);

/// @brief Writes the rows of `a` (copy_rows.h, slot_row), a thread per entry.
void slot_rows(const SlotRowsArgs& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace storage
}  // namespace dyn_emb
