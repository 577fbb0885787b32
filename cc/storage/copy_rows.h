// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Moving rows between row spaces (row_space.h): the one operation every move
// between storage tiers is made of (a cache fill, a write-back, a relayout, a
// checkpoint's read), whatever the mix of tables and row widths.
#pragma once

#include <cstdint>

#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace storage {

/// The arguments of a copy: for each i with dst_offsets[i] >= 0 and
/// src_offsets[i] >= 0, bytes[i] bytes (a multiple of 4) from src at
/// src_offsets[i] to dst at dst_offsets[i]. Source and destination regions
/// must not overlap.
struct CopyArgs {
  RowSpace dst;
  const int64_t* dst_offsets = nullptr;
  RowSpace src;
  const int64_t* src_offsets = nullptr;
  const int64_t* bytes = nullptr;
  int64_t n = 0;
};

/// Whether entry i is copied.
DEMB_HD bool copies(const CopyArgs& a, int64_t i) {
  return a.dst_offsets[i] >= 0 && a.src_offsets[i] >= 0;
}

}  // namespace storage
}  // namespace dyn_emb
