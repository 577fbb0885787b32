// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): the fused layout, addressing
// and probing.
//
// # Layout
//
// Many logical tables share one allocation. For table t (a row of `info`):
//
//   struct FusedTable {
//     int64_t keys[num_slots];              // kEmptyKey where free
//     uint8_t digests[num_slots];           // digest(hash(key)); empty_digest() where free
//     int64_t scores[num_slots][num_scores];
//   };
//   table t owns slots [info[t].slot_offset, info[t].slot_offset + info[t].capacity)
//   bucket b of table t is slots slot_offset + b * W .. + W - 1, W = info[t].bucket_capacity
//
// Every capacity, bucket width and slot offset is a multiple of kBucketAlignment
// (16), so a bucket's digests can be read 8 bytes at a time from aligned memory.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// What is wrong with an `info` tensor, if anything.
enum LayoutError : int32_t {
  kLayoutOk = 0,
  kLayoutBucketWidth = 1,   ///< bucket capacity not a positive multiple of 16
  kLayoutCapacity = 2,      ///< capacity not a positive multiple of the bucket capacity
  kLayoutSlotOffset = 3,    ///< slot offset is not the sum of the capacities before it
  kLayoutBucketOffset = 4,  ///< bucket offset is not the sum of the buckets before it
  kLayoutRows = 5,          ///< row offset/capacity inconsistent, or free_rows too short
  kLayoutMode = 6,          ///< mode is not a TableMode
  kLayoutSlotCount = 7,     ///< capacities do not add up to the slot count
};

/// Checks that `info` lays the tables out back to back over exactly
/// t.num_slots slots and `free_rows_len` free-row entries. On success fills
/// the total bucket count and whether any table is NO_EVICTION; otherwise
/// returns the error and the offending table in `*bad_table`.
DEMB_HD int32_t check_layout(const TableRef& t, int64_t free_rows_len, int64_t* total_buckets,
                             bool* has_rows, int64_t* bad_table) {
  int64_t slots = 0, buckets = 0, rows = 0;
  bool any_rows = false;
  for (int64_t table = 0; table < t.num_tables; ++table) {
    const int64_t* inf = t.info + table * kInfoCols;
    *bad_table = table;
    const int64_t w = inf[kInfoBucketCapacity], cap = inf[kInfoCapacity];
    if (w <= 0 || w % kBucketAlignment) return kLayoutBucketWidth;
    if (cap <= 0 || cap % w) return kLayoutCapacity;
    if (inf[kInfoSlotOffset] != slots) return kLayoutSlotOffset;
    if (inf[kInfoBucketOffset] != buckets) return kLayoutBucketOffset;
    const int64_t mode = inf[kInfoMode];
    if (mode != static_cast<int64_t>(TableMode::kEvicting) &&
        mode != static_cast<int64_t>(TableMode::kNoEviction)) {
      return kLayoutMode;
    }
    if (inf[kInfoRowOffset] != rows || inf[kInfoRowCapacity] < 0) return kLayoutRows;
    any_rows = any_rows || mode == static_cast<int64_t>(TableMode::kNoEviction);
    slots += cap;
    buckets += cap / w;
    rows += inf[kInfoRowCapacity];
  }
  *bad_table = -1;
  if (slots != t.num_slots) return kLayoutSlotCount;
  if (rows > free_rows_len) return kLayoutRows;
  *total_buckets = buckets;
  *has_rows = any_rows;
  return kLayoutOk;
}

// ------------------------------------------------------------ addressing --

/// Where a key lives: its home bucket's first slot and width, the bucket's
/// global index (the sort key of the run-wise operations), and the key's digest
/// (keys sharing a bucket have different digests).
struct Home {
  int64_t start;
  int64_t width;
  int64_t global_bucket;
  uint8_t digest;
};

DEMB_HD Home home_of(const TableRef& t, int64_t table, int64_t key) {
  const int64_t* inf = t.info + table * kInfoCols;
  const uint64_t h = bucket_hash(static_cast<uint64_t>(key));
  const int64_t cap = inf[kInfoCapacity];
  const int64_t width = inf[kInfoBucketCapacity];
  const int64_t local = static_cast<int64_t>(h % static_cast<uint64_t>(cap)) / width;
  return Home{inf[kInfoSlotOffset] + local * width, width, inf[kInfoBucketOffset] + local,
              digest_of_hash(h)};
}

DEMB_HD bool valid_input(const TableRef& t, int64_t key, int64_t table) {
  return !is_reserved_key(key) && table >= 0 && table < t.num_tables;
}

/// Position of `key` in the bucket at or after position `from` (a multiple
/// of 8), or -1. Reads the digests 8 at a time.
DEMB_HD int64_t probe(const TableRef& t, const Home& h, int64_t key, uint8_t digest,
                      int64_t from = 0) {
  const uint64_t* d = reinterpret_cast<const uint64_t*>(t.digests + h.start);
  for (int64_t w = from / 8; w < h.width / 8; ++w) {
    uint64_t m = match_bytes(d[w], digest);
    while (m) {
      const int64_t pos = w * 8 + (ctz64(m) >> 3);
      if (t.keys[h.start + pos] == key) return pos;
      m &= m - 1;
    }
  }
  return -1;
}

DEMB_HD int64_t find_slot(const TableRef& t, int64_t table, int64_t key) {
  const Home h = home_of(t, table, key);
  const int64_t pos = probe(t, h, key, h.digest);
  return pos < 0 ? -1 : h.start + pos;
}

// ---------------------------------------------------------------- export --

/// The last table whose `info` column `col` (an offset: the tables lay out
/// their slots, and their rows, in ascending order) is at most x.
DEMB_HD int64_t last_table_at(const TableRef& t, int32_t col, int64_t x) {
  int64_t lo = 0, hi = t.num_tables - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (t.info[mid * kInfoCols + col] <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// Table owning `slot`.
DEMB_HD int64_t table_of_slot(const TableRef& t, int64_t slot) {
  return last_table_at(t, kInfoSlotOffset, slot);
}

/// export_batch's predicate: the slot holds a key whose score word `column`
/// is at least `threshold`.
DEMB_HD bool export_selects(const TableRef& t, int64_t slot, int32_t column, int64_t threshold) {
  return t.keys[slot] != kEmptyKey && t.scores[slot * t.num_scores + column] >= threshold;
}

}  // namespace table
}  // namespace dyn_emb
