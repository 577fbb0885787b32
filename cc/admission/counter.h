// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The admission counter (dynamicemb.admission.MultiTableKVCounter): the
// KVCounter shares of the tables an admission strategy serves, fused in one
// scored hash table (cc/table) with one score word, the count, and no values.
//
// counter_add is the table's run-wise insert_and_evict with the kAccumulate
// policy (the frequencies are the values) and a release threshold
// (cc/table/operations.h, "Release"), so the counter hashes, probes, orders a
// batch and evicts exactly as the table does, on both backends:
//
//   keys are taken bucket by bucket, each bucket's in call order;
//   count = stored count (0 when absent) + frequency;
//   count >= release_at: the key leaves (a stored key is erased, freeing its
//     slot for the keys after it; an absent key is not stored);
//   else the count is stored; an absent key takes its bucket's first free
//     slot, else evicts the bucket's smallest count (lowest position on a tie)
//     that the call has not found or filled, else is not stored
//     (INSERT_FAILURES).
//
// The CPU backend (counter_cpu.h) is the reference of the CUDA one
// (counter_cuda.h). A plain add is release_at = kNoRelease.
//
// # Admission in one pass (counter_admit)
//
// A frequency admitter decides for a training batch's distinct keys in one
// call, asking the embedding table (the "store", read only) itself which of
// them it holds:
//
//   an entry that is not a key (padding: kEmptyKey; on CUDA any invalid
//     input) is kNone and touches nothing;
//   a key the store holds is kStored and is not counted;
//   the other keys are counted by counter_add with release_at = threshold, as
//     if they alone had been passed, in batch order: a key whose count reaches
//     the threshold leaves the counter and is kAdmitted, the others kRejected.
//
// The CPU backend passes the missing keys to counter_add compacted; the CUDA
// one passes the whole batch with the other entries made invalid, which sort
// last and form no run, so every bucket sees the same keys in the same order
// and both give the same counts. Per table, the entries admitted and
// rejected are counted too (the module's ADMISSIONS and REJECTIONS).
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace admission {

/// Where one counter_add call's table run writes, (n) entries each, n * 1
/// for ev_scores (the run's own outputs; the caller reads only `counts`).
struct CountScratch {
  int32_t* order = nullptr;
  int64_t* slots = nullptr;
  int8_t* status = nullptr;
  int64_t* ev_keys = nullptr;
  int64_t* ev_scores = nullptr;
  int64_t* ev_slots = nullptr;
  int64_t* ev_tables = nullptr;
  uint8_t* ev_flags = nullptr;  ///< the CPU backend's; the CUDA one keeps its own
};

/// @brief The table run of counter_add.
/// @param keys (n), @param table_ids (n), @param frequencies (n) the increments
/// @param release_at the count at which a key leaves, or table::kNoRelease
/// @param counts (n) out: the count each key reached
inline table::RunArgs count_run(const int64_t* keys, const int64_t* table_ids,
                                const int64_t* frequencies, int64_t release_at, int64_t* counts,
                                const CountScratch& s) {
  table::RunArgs r;
  r.keys = keys;
  r.table_ids = table_ids;
  r.order = s.order;
  r.score.policy[0] = static_cast<int32_t>(table::ScorePolicy::kAccumulate);
  r.score.values = frequencies;
  r.score.value_row_stride = 1;
  r.op = table::RunOp::kInsertEvict;
  r.release_at = release_at;
  r.scores_out = counts;
  r.slots = s.slots;
  r.status = s.status;
  r.ev_keys = s.ev_keys;
  r.ev_scores = s.ev_scores;
  r.ev_slots = s.ev_slots;
  r.ev_tables = s.ev_tables;
  r.ev_flags = s.ev_flags;
  return r;
}

/// What counter_admit decides for one entry (dynamicemb.table.enums.Admission).
enum class Admission : int8_t {
  kStored = 0,    ///< the store holds the key: not counted, looked up
  kAdmitted = 1,  ///< missing, its count reached the threshold: it may be inserted
  kRejected = 2,  ///< missing, below the threshold: counted, not inserted
  kNone = 3,      ///< not a key (padding)
};

/// Columns of counter_admit's per-table counts: entries admitted, rejected.
constexpr int kAdmitCols = 2;

/// The decision for an entry: `valid` input, held by the store (`stored`),
/// else the `count` the counter's run gave it.
DEMB_HD Admission admission_of(bool valid, bool stored, int64_t count, int64_t threshold) {
  if (!valid) return Admission::kNone;
  if (stored) return Admission::kStored;
  return count >= threshold ? Admission::kAdmitted : Admission::kRejected;
}

/// The per-table column an entry counts in, or -1.
DEMB_HD int admit_col(Admission a) {
  return a == Admission::kAdmitted ? 0 : a == Admission::kRejected ? 1 : -1;
}

}  // namespace admission
}  // namespace dyn_emb
