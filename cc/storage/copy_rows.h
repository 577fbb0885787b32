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

/// The rows of a training insert's slots in a row space of a fixed stride
/// (the op slot_rows): entry i's byte offset, -1 where its slot is -1 (not
/// stored), and the same offset where its row is new (its status is not
/// `found`: inserted, or in an evicted key's slot), else -1.
struct SlotRowsArgs {
  const int64_t* slots = nullptr;  ///< (n) table slots, -1: not stored
  const int8_t* status = nullptr;  ///< (n) the insert's statuses
  int64_t stride = 0;              ///< bytes from one slot's row to the next
  int8_t found = 0;                ///< the status of a key found in the table
  int64_t* rows = nullptr;         ///< (n) out
  int64_t* new_rows = nullptr;     ///< (n) out
  int64_t n = 0;
};

/// Writes entry i of slot_rows.
DEMB_HD void slot_row(const SlotRowsArgs& a, int64_t i) {
  const int64_t s = a.slots[i];
  const int64_t row = s < 0 ? -1 : s * a.stride;
  a.rows[i] = row;
  a.new_rows[i] = a.status[i] != a.found ? row : -1;
}

}  // namespace storage
}  // namespace dyn_emb
