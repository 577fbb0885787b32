// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CPU backend of the admission counter (counter.h): the reference semantics.
#pragma once

#include <cstdint>

#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace admission {
namespace cpu {

/// @brief counter_add of `n` keys (counter.h), on a counter table `t` (one
/// score word; its layout and the key values checked by the caller).
/// @param keys (n), @param table_ids (n), @param frequencies (n)
/// @param release_at the count at which a key leaves, or table::kNoRelease
/// @param total_buckets buckets of all the counter's tables
/// @param counts (n) out: the count each key reached
void add(const table::TableRef& t, const int64_t* keys, const int64_t* table_ids,
         const int64_t* frequencies, int64_t n, int64_t release_at, int64_t total_buckets,
         int64_t* counts);

}  // namespace cpu
}  // namespace admission
}  // namespace dyn_emb
