// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Enumerations and layout constants of the scored hash table.
//
// This header is the single definition of every number the table shares with
// the layers above it: reserved key values, score policies, per-key insert
// status codes, the columns of the per-table `info` and `counters` tensors.
// The Python side reads them through `dynamicemb._C.constants()` (see
// cc/ops/module.cpp); it never restates them.
#pragma once

#include <cstdint>
#include <limits>

namespace dyn_emb {
namespace table {

/// Keys below `kFirstValidKey` are reserved for slot states; user keys in that
/// range are refused with an error.
constexpr int64_t kEmptyKey = std::numeric_limits<int64_t>::min();  ///< unused slot
constexpr int64_t kLockedKey = kEmptyKey + 1;                       ///< slot being written (GPU)
constexpr int64_t kFirstValidKey = kEmptyKey + 4;
static_assert(kLockedKey < kFirstValidKey, "reserved keys must lie below kFirstValidKey");

/// Digest probing reads slot digests in groups of this many bytes; every
/// bucket width and every table capacity is a multiple of it.
constexpr int64_t kBucketAlignment = 16;

/// How an operation treats the score word(s) of the keys it touches.
/// One policy per score column.
enum class ScorePolicy : int32_t {
  kNone = 0,        ///< find: leave as is; insert: a new key starts at 0
  kAssign = 1,      ///< set to the given value (STEP, CUSTOMIZED, replay)
  kAccumulate = 2,  ///< add the given value; a new key starts at it (LFU)
  kTimer = 3,       ///< set to the device nanosecond timer (TIMESTAMP)
};
constexpr int32_t kNumScorePolicies = 4;

/// Result of insert/insert_and_evict for one input key.
enum class InsertStatus : int8_t {
  kFound = 0,     ///< the key was in the table; its score was updated
  kInserted = 1,  ///< new key, placed in a free slot
  kEvicted = 2,   ///< new key, placed in the slot of an evicted key
  kFailed = 3,    ///< not placed: bucket full and nothing may be evicted
  kInvalid = 4,   ///< reserved key or table id out of range (unchecked calls)
  kReleased = 5,  ///< score word 0 reached RunArgs::release_at: not stored (see operations.h)
  kRefused =
      6,  ///< new key colder than its full bucket's victim: not stored (RunArgs::refuse_cold)
};

/// RunArgs::release_at of a call that releases nothing.
constexpr int64_t kNoRelease = INT64_MAX;

/// Per-table storage mode.
enum class TableMode : int64_t {
  kEvicting = 0,    ///< a full bucket evicts its minimum-score key
  kNoEviction = 1,  ///< never evicts; score word 0 holds the value row
};

/// Columns of the int64 `info` tensor, shape (num_tables, kInfoCols).
enum InfoCol : int32_t {
  kInfoSlotOffset = 0,      ///< first slot of the table in the fused arrays
  kInfoCapacity = 1,        ///< slots of the table (multiple of bucket width)
  kInfoBucketCapacity = 2,  ///< slots per bucket (multiple of 16)
  kInfoBucketOffset = 3,    ///< global index of the table's first bucket
  kInfoRowOffset = 4,       ///< NO_EVICTION: first entry in `free_rows`
  kInfoRowCapacity = 5,     ///< NO_EVICTION: rows of the value buffer
  kInfoMode = 6,            ///< TableMode
  kInfoCols = 8,
};

/// Columns of the int64 `counters` tensor, shape (num_tables, kCounterCols).
/// They live on the table's device and are updated by the kernels, so that
/// reading them is the only synchronization metrics and safe-check need.
enum CounterCol : int32_t {
  kCounterSize = 0,            ///< keys stored
  kCounterInsertFailures = 1,  ///< keys that could not be placed (cumulative)
  kCounterEvictions = 2,       ///< resident keys evicted (cumulative)
  kCounterNextRow = 3,         ///< NO_EVICTION: rows handed out so far
  kCounterFreeTop = 4,         ///< NO_EVICTION: rows on the free stack
  kCounterInserts = 5,         ///< new keys placed (cumulative)
  kCounterCols = 8,
};

/// Operation performed on a run of keys that share a bucket.
enum class RunOp : int32_t {
  kInsert = 0,       ///< find or insert; a full bucket fails
  kInsertEvict = 1,  ///< find or insert; a full bucket evicts its minimum
  kErase = 2,        ///< remove
  kPlace = 3,        ///< put each key at a given slot of its home bucket (replay)
};

}  // namespace table
}  // namespace dyn_emb
