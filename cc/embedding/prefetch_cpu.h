// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Rows are read and written at random places of tables far larger than the
// caches: each row's first access misses. The CPU loops over rows (pooling,
// update, new rows) ask for the rows kAhead entries ahead, so that several
// misses are in flight while one row is worked on (a row's own loop is too
// long for the core to reach the next one's loads by itself).
#pragma once

#include <cstdint>

namespace dyn_emb {
namespace embedding {
namespace cpu {

constexpr int64_t kAhead = 4;
constexpr int64_t kCacheLine = 64;

/// Asks for the cache lines of `bytes` bytes at `p` (a hint: no fault),
/// to be read, or with `write` to be written.
template <bool write = false>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(kCacheLine - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = start; line < end; line += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), write ? 1 : 0);
  }
}

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
