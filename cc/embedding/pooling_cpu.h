// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#pragma once

#include <cstdint>

#include "cc/embedding/pooling.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// @brief Writes every bag's pooled embedding into a.out (pooling.h); rows of
/// element type `type`.
void pool_forward(const PoolArgs& a, int64_t num_bags, storage::ElementType type);

/// @brief Reduces each distinct key's gradient and updates its row in place.
void update_backward(const UpdateArgs& a, int64_t num_keys, storage::ElementType type);

/// @brief The table of each of n occurrences (tables, n) and their bags (bags:
/// n entries, the bag of each; with `sequence`, n + 1 entries 0..n, each
/// occurrence a bag of its own).
void occurrence_bags(const OccurrenceBags& o, int64_t n, bool sequence, int64_t* bags,
                     int64_t* tables);

/// Adds a step's failed inserts to their tables' counts (FailureCount).
void count_failures(const FailureCount& a);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
