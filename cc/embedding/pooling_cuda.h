// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/embedding/pooling.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// @brief Writes every bag's pooled embedding into a.out (pooling.h); a warp per 32 bags at a time;
/// rows of element type `type`.
void pool_forward(const PoolArgs& a, int64_t num_bags, storage::ElementType type,
                  cudaStream_t stream);

/// Occurrences per chunk of a hot key (one with more than this many).
constexpr int64_t kHotChunk = 64;

/// Work space of hot keys, made on the device from the occurrence offsets
/// (hot_keys): a hot key's gradient is summed by one warp per chunk of
/// kHotChunk occurrences into `buf` (atomically), then applied by one warp per
/// hot key, so a key seen tens of thousands of times does not hold one warp
/// for them all.
struct HotKeys {
  const int64_t* chunk_offsets = nullptr;  ///< (U + 1) exclusive sum of hot keys' chunks
  const int64_t* hot_incl = nullptr;       ///< (U) inclusive count of hot keys up to u
  float* buf = nullptr;                    ///< (max_hot, buf_width), hot keys' rows zeroed
  int64_t buf_width = 0;
  int64_t max_chunks = 0;  ///< bound on chunks: n / kHotChunk + max_hot
  int64_t max_hot = 0;     ///< bound on hot keys: n / (kHotChunk + 1)
};

/// Bytes of device scratch hot_keys needs for U = num_keys distinct keys of
/// n occurrences and gradients buf_width wide; 0 when no key can be hot.
size_t hot_keys_scratch(int64_t num_keys, int64_t n, int64_t buf_width);

/// The HotKeys of the distinct keys whose occurrences start at
/// occ_offsets ((U + 1), non-decreasing), laid out in `scratch`
/// (hot_keys_scratch bytes, 256-byte aligned): one pass over the keys, one
/// scan of their (hot, chunks) pairs packed in 64 bits, one pass that unpacks
/// them, and one over the hot keys' buffer rows that zeroes them, a thread
/// per float. Nothing is read on the host.
HotKeys hot_keys(const int64_t* occ_offsets, int64_t num_keys, int64_t n, int64_t buf_width,
                 void* scratch, cudaStream_t stream);

/// @brief Reduces each distinct key's gradient and updates its row in place;
/// one warp per key, hot keys split into chunks (HotKeys).
void update_backward(const UpdateArgs& a, const HotKeys& h, int64_t num_keys,
                     storage::ElementType type, cudaStream_t stream);

/// @brief The table of each of n occurrences and their bags, as
/// cpu::occurrence_bags writes them; one thread per occurrence (a binary
/// search over the bag ends).
void occurrence_bags(const OccurrenceBags& o, int64_t n, bool sequence, int64_t* bags,
                     int64_t* tables, cudaStream_t stream);

/// Adds a step's failed inserts to their tables' counts (FailureCount), a
/// thread per entry, one atomic add per failed one.
void count_failures(const FailureCount& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
