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

/// @brief counter_admit of `n` entries (counter.h, "Admission in one pass"):
/// each looked up in `store`, the missing keys counted on `counter` (layouts
/// and key values checked by the caller; padding entries hold kEmptyKey).
/// @param threshold the count that admits (release_at of the counter's run)
/// @param total_buckets buckets of all the counter's tables
/// @param status (n) out: Admission of each entry
/// @param per_table (num_tables, kAdmitCols) in/out: admitted and rejected
///        entries added per table
void admit(const table::TableRef& store, const table::TableRef& counter, const int64_t* keys,
           const int64_t* table_ids, const int64_t* frequencies, int64_t n, int64_t threshold,
           int64_t total_buckets, int8_t* status, int64_t* per_table);

}  // namespace cpu
}  // namespace admission
}  // namespace dyn_emb
