// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The segmented unique's passes after its two sorts, on the GPU (the op
// segmented_unique, cc/ops/unique_ops_cuda.cpp; its results are documented in
// dynamicemb/embedding/unique.py). Torch-free; every pointer on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// The entries in (table, key) order: entry i is input position
/// by_key[by_table[i]], its key key_sorted[by_table[i]], its table
/// table_sorted[i] (int16 or int32 per `table_bytes`).
struct SortedPairs {
  const int64_t* key_sorted = nullptr;  ///< (n) keys, ascending (the first sort)
  const int64_t* by_key = nullptr;      ///< (n) input position of each
  const void* table_sorted = nullptr;   ///< (n) table ids of by_table's order
  int table_bytes = 2;                  ///< 2 (int16) or 4 (int32)
  const int64_t* by_table = nullptr;    ///< (n) stable order of the second sort
  int64_t n = 0;
};

/// Pass 1: order[i] (the input position of entry i) and new_pair[i] (1 where
/// entry i starts a distinct pair, else 0).
void unique_flags(const SortedPairs& s, int64_t* order, int64_t* new_pair, cudaStream_t stream);

/// The outputs of the passes after the scan.
struct UniqueOutputs {
  int64_t* keys = nullptr;           ///< (n)
  int64_t* table_ids = nullptr;      ///< (n)
  int64_t* inverse = nullptr;        ///< (n)
  int64_t* counts = nullptr;         ///< (n)
  int64_t* table_offsets = nullptr;  ///< (num_tables + 1)
  int64_t* num_unique = nullptr;     ///< (1)
  int64_t* occ_offsets = nullptr;    ///< (n + 1)
};

/// Passes 2 and 3: with pairs_through[i] the inclusive scan of new_pair
/// (distinct pairs among entries 0..i), writes every output: the distinct
/// pairs, the inverse, the table and occurrence offsets, then the padding
/// (key pad_key, table num_tables - 1, count 0) and the counts. n >= 1.
void unique_pairs(const SortedPairs& s, const int64_t* order, const int64_t* new_pair,
                  const int64_t* pairs_through, int64_t num_tables, int64_t pad_key,
                  const UniqueOutputs& out, cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
