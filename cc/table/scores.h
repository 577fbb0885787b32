// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The scored hash table, one semantic definition for the CPU and CUDA backends
// (host-device inline code, no torch): score words, their policies
// and the victim order.
//
// # Scores
//
// Each slot has num_scores int64 words compared lexicographically, word 0
// first, then the position in the bucket. The victim of a full bucket is the
// smallest (scores..., position). The compound TIMESTAMP+LFU strategy stores
// (frequency, timestamp), so it evicts the least frequent key, the older one on
// a tie, whatever order the user wrote the tuple in. Under NO_EVICTION word 0
// is the key's row in the value buffer, not a score.
//
// insert_and_evict may be given a float64 victim score per slot (a user's
// score_function evaluated by the layer above over the buckets the batch
// touches). The victim is then the smallest (victim score, scores...,
// position), NaN below every number (evicted first), -0.0 equal to 0.0. Only
// untouched slots of a full bucket are ever compared, and the batch changes
// none of them before it compares them, so scores evaluated before the call
// are those of eviction time.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace table {

/// The kTimer score of a call: one clock reading shared by every key, so a
/// batch's keys tie and evict in the same order on both backends.
DEMB_HD int64_t timer_now(const ScoreArgs& a) {
#if defined(__CUDA_ARCH__)
  return *a.device_now;
#else
  return a.host_now;
#endif
}

/// Lexicographic a < b over n words.
DEMB_HD bool score_less(const int64_t* a, const int64_t* b, int32_t n) {
  for (int32_t c = 0; c < n; ++c) {
    if (a[c] != b[c]) return a[c] < b[c];
  }
  return false;
}

/// The value column c of entry `index` gives (0 when the call has none).
DEMB_HD int64_t score_input(const ScoreArgs& a, int64_t index, int32_t c) {
  return a.values ? a.values[index * a.value_row_stride + c] : 0;
}

/// Score word c of a key entering the table.
DEMB_HD int64_t initial_score(const ScoreArgs& a, int64_t index, int32_t c) {
  switch (static_cast<ScorePolicy>(a.policy[c])) {
    case ScorePolicy::kAssign:
    case ScorePolicy::kAccumulate:
      return score_input(a, index, c);
    case ScorePolicy::kTimer:
      return timer_now(a);
    default:
      return 0;
  }
}

/// Applies the policies to a resident key's score words (ACCUMULATE
/// saturates at INT64_MAX / INT64_MIN instead of wrapping). `atomic` is set
/// where several threads may update one slot (find); run-wise operations own
/// theirs.
DEMB_HD void update_score(const ScoreArgs& a, int64_t index, int32_t num_scores, int64_t* s,
                          bool atomic) {
  // A constant trip count: an array s stays in registers on the GPU.
  for (int32_t c = 0; c < kMaxScores; ++c) {
    if (c >= num_scores) break;
    switch (static_cast<ScorePolicy>(a.policy[c])) {
      case ScorePolicy::kAssign:
        s[c] = score_input(a, index, c);
        break;
      case ScorePolicy::kAccumulate:  // saturates at the int64 bounds
        if (atomic) {
          atomic_add_saturating(&s[c], score_input(a, index, c));
        } else {
          s[c] = add_saturating(s[c], score_input(a, index, c));
        }
        break;
      case ScorePolicy::kTimer:
        s[c] = timer_now(a);
        break;
      default:
        break;
    }
  }
}

/// Order key of a victim score: ascending with the number, NaN first (it
/// maps to INT64_MIN, below -inf), -0.0 and 0.0 equal.
DEMB_HD int64_t victim_rank_key(double v) {
  if (v != v) return INT64_MIN;
  v += 0.0;  // -0.0 -> 0.0
#if defined(__CUDA_ARCH__)
  const int64_t b = __double_as_longlong(v);
#else
  int64_t b;
  __builtin_memcpy(&b, &v, sizeof(b));
#endif
  // Negative doubles order backwards as integers: flip their magnitude bits.
  return b >= 0 ? b : (b ^ INT64_MAX);
}

/// The victim order's first component of `slot`: its victim score's order
/// key, or 0 (all equal) when the call has none.
DEMB_HD int64_t victim_key(const RunArgs& r, int64_t slot) {
  return r.victim_scores ? victim_rank_key(r.victim_scores[slot]) : 0;
}

/// Words of a slot's place in the victim order, compared lexicographically
/// before the position: its victim_key, then its score words (0 past
/// num_scores).
constexpr int32_t kVictimWords = 1 + kMaxScores;

/// The victim order's words of `slot` (see kVictimWords).
DEMB_HD void victim_words(const TableRef& t, const RunArgs& r, int64_t slot,
                          int64_t w[kVictimWords]) {
  w[0] = victim_key(r, slot);
  for (int32_t c = 0; c < kMaxScores; ++c)
    w[1 + c] = c < t.num_scores ? t.scores[slot * t.num_scores + c] : 0;
}

/// The victim order: whether the slot with words `a` at `pa` is evicted
/// before the one with words `b` at `pb` (the smaller words first, then the
/// lower slot).
DEMB_HD bool victim_before(const int64_t* a, int64_t pa, const int64_t* b, int64_t pb) {
  for (int32_t c = 0; c < kVictimWords; ++c) {
    if (a[c] != b[c]) return a[c] < b[c];
  }
  return pa < pb;
}

}  // namespace table
}  // namespace dyn_emb
