// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include "cc/storage/copy_rows.h"

namespace dyn_emb {
namespace storage {
namespace cpu {

/// @brief Copies the rows of `a` (copy_rows.h), rows in parallel.
void copy_rows(const CopyArgs& a);

/// @brief Writes the rows of `a` (copy_rows.h, slot_row).
void slot_rows(const SlotRowsArgs& a);

}  // namespace cpu
}  // namespace storage
}  // namespace dyn_emb
