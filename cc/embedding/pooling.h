// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The two fused passes of an embedding bag step, the ops embedding_pool and
// embedding_update, defined once for the CPU backend and the CUDA kernels:
//
//   forward   out[bag] = sum over the bag's occurrences j of w_j * row(rows[inverse[j]])
//             (occ_row, occ_weight)
//             written straight into TorchRec's output layout;
//   backward  g_u = sum over the occurrences j of distinct key u of w_j * grad_out[bag(j)]
//             (occ_grad_row),
//             then the optimizer's update of u's row (optimizer.h), with no
//             per-key gradient tensor in between.
//
// Bags and layout. A batch of F features and B samples has F * B bags, feature
// by feature; bag b is sample b % B of feature f = b / B. Its output is the
// slice [cols[f], cols[f] + dims[f]) of row b % B of `out` (B x out_width):
// the features side by side, as TBE and TorchRec lay them out. Sequence
// lookups (pooling NONE) are the case F = 1, B = number of occurrences, one
// occurrence per bag. MEAN pooling is SUM with w_j = 1 / bag length.
//
// Rows. rows[u] is the byte offset of distinct key u's row in the row space
// (cc/storage/row_space.h: two segments, e.g. device and host memory), or -1
// when it has none (an insert that failed): its embedding reads as zeros and
// it is not updated. A row is dims[f] elements of T (the table's element
// type), then the optimizer state in float32 (optimizer.h). Both passes are
// templates over T; pooled outputs and gradients are float32.
//
// The forward may also be given a fill buffer: rows, of T too, of keys that
// are looked up but stored nowhere (keys the eval misses, keys admission
// rejects). rows[u] = fill_row_ref(i) (-2 - i) reads fill row i. Such a key
// is not updated either: the backward skips every negative row.
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/embedding/optimizer.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace embedding {

/// The batch's bag structure and output layout, shared by both passes.
struct BagLayout {
  const int64_t* cols = nullptr;  ///< (F) first output column of feature f
  const int64_t* dims = nullptr;  ///< (F) embedding dim of feature f
  int64_t batch = 1;              ///< B, samples per feature
  int64_t out_width = 0;          ///< columns of `out` / `grad_out`
};

/// Where bag b's output starts, and its dim.
struct BagSlot {
  int64_t offset;  ///< into out / grad_out
  int64_t dim;
};

DEMB_HD BagSlot bag_slot(const BagLayout& l, int64_t b) {
  const int64_t f = b / l.batch;
  return {(b % l.batch) * l.out_width + l.cols[f], l.dims[f]};
}

/// A batch's bags in TBE layout, for the bag and table of each occurrence
/// (the op occurrence_bags): bag b holds the occurrences
/// [offsets[b] - offsets[0], offsets[b + 1] - offsets[0]).
struct OccurrenceBags {
  const int64_t* offsets = nullptr;         ///< (num_bags + 1), non-decreasing
  int64_t num_bags = 0;                     ///< F * B, >= 1
  const int64_t* feature_tables = nullptr;  ///< (F) table of feature f
  int64_t batch = 1;                        ///< B >= 1
};

/// The bag of occurrence i: the first bag whose end is past i. Clamped to the
/// last bag, so that offsets that end before the batch does (the op does not
/// read them on the host) name a bag that exists.
DEMB_HD int64_t occurrence_bag(const OccurrenceBags& o, int64_t i) {
  const int64_t b = upper_bound(o.offsets + 1, o.num_bags, o.offsets[0] + i);
  return b < o.num_bags ? b : o.num_bags - 1;
}

/// The table of bag b (feature b / B's).
DEMB_HD int64_t bag_table(const OccurrenceBags& o, int64_t b) {
  return o.feature_tables[b / o.batch];
}

/// A training step's failed inserts per table (the op count_failures):
/// counts[table_ids[i]] += 1 for each entry i with rows[i] == -1 (not stored)
/// that `valid` marks (every entry where it is null); a table id out of
/// [0, num_tables) counts nowhere.
struct FailureCount {
  const int64_t* rows = nullptr;       ///< (n)
  const int64_t* table_ids = nullptr;  ///< (n)
  const bool* valid = nullptr;         ///< (n) or null
  int64_t* counts = nullptr;           ///< (num_tables), added to
  int64_t num_tables = 0;
  int64_t n = 0;
};

/// The table whose count entry i adds one to, or -1 for none.
DEMB_HD int64_t failure_table(const FailureCount& a, int64_t i) {
  if (a.rows[i] != -1 || (a.valid != nullptr && !a.valid[i])) return -1;
  const int64_t t = a.table_ids[i];
  return t >= 0 && t < a.num_tables ? t : -1;
}

struct PoolArgs {
  BagLayout layout;
  storage::RowSpace space;
  const int64_t* rows = nullptr;         ///< (U) byte offsets, -1: none
  const int64_t* inverse = nullptr;      ///< (n) distinct key of each occurrence
  const int64_t* bag_offsets = nullptr;  ///< (F * B + 1) bag b = occurrences [o[b], o[b+1])
  const float* weights = nullptr;        ///< (n) or null (all 1)
  float* out = nullptr;                  ///< (B, out_width)
  const uint8_t* fill = nullptr;         ///< (num_fill, fill_row_bytes) or null: see "Rows"
  int64_t fill_row_bytes = 0;
};

/// rows[u] of a key that reads fill row i ("Rows"), and back.
DEMB_HD int64_t fill_row_ref(int64_t i) { return -2 - i; }
DEMB_HD int64_t fill_index(int64_t row_ref) { return -2 - row_ref; }

/// The embedding occurrence j reads (in the row space or the fill buffer),
/// or nullptr when its key has none.
template <class T>
DEMB_HD const T* occ_row(const PoolArgs& a, int64_t j) {
  const int64_t r = a.rows[a.inverse[j]];
  if (r >= 0) return storage::embedding_at<T>(a.space, r);
  if (r == -1 || a.fill == nullptr) return nullptr;
  return reinterpret_cast<const T*>(a.fill + fill_index(r) * a.fill_row_bytes);
}

DEMB_HD float occ_weight(const float* weights, int64_t j) { return weights ? weights[j] : 1.f; }

struct UpdateArgs {
  BagLayout layout;
  OptimArgs optim;
  storage::RowSpace space;               ///< rows updated in place
  const float* grad_out = nullptr;       ///< (B, out_width)
  const int64_t* rows = nullptr;         ///< (U) byte offsets, -1: none
  const int64_t* occ_offsets = nullptr;  ///< (U + 1) key u's occurrences are
  const int64_t* occ_order = nullptr;    ///< occ_order[occ_offsets[u] .. occ_offsets[u+1])
  const int64_t* occ_bag = nullptr;      ///< (n) bag of each occurrence
  const float* weights = nullptr;        ///< (n) or null
  /// (U) each key's value, the source of an FP8 row's stochastic rounding
  /// (sr_key); null: the row's offset is.
  const int64_t* keys = nullptr;
  /// (1) the step of that rounding (sr_step); null: optim.step is.
  const int64_t* rounding_step = nullptr;
};

/// What seeds the stochastic rounding of key u's FP8 row (philox.h): its key,
/// or its row's offset where the caller gives no keys.
DEMB_HD uint64_t sr_key(const UpdateArgs& a, int64_t u) {
  return static_cast<uint64_t>(a.keys != nullptr ? a.keys[u] : a.rows[u]);
}

/// The step that seeds the stochastic rounding of the FP8 rows an update
/// writes (philox.h): the caller's, or optim.step where it gives none. With
/// the key's, a row gets the same bits in whichever tier and at whichever
/// place it is updated.
DEMB_HD int64_t sr_step(const UpdateArgs& a) {
  return a.rounding_step != nullptr ? *a.rounding_step : a.optim.step;
}

/// The output-gradient slice of the occurrence at grouped position i (a key's
/// occurrences are positions occ_offsets[u] .. occ_offsets[u + 1]), and its
/// weight in *w. A key's gradient is the weighted sum of these slices over its
/// occurrences, in this order.
DEMB_HD const float* occ_grad_row(const UpdateArgs& a, int64_t i, float* w) {
  const int64_t j = a.occ_order[i];
  *w = occ_weight(a.weights, j);
  return a.grad_out + bag_slot(a.layout, a.occ_bag[j]).offset;
}

/// The dim of distinct key u: that of the bag of its first occurrence (all
/// occurrences of a key belong to features of its table, of one dim).
DEMB_HD int64_t key_dim(const UpdateArgs& a, int64_t u) {
  const int64_t i = a.occ_offsets[u];
  if (i == a.occ_offsets[u + 1]) return 0;
  return bag_slot(a.layout, a.occ_bag[a.occ_order[i]]).dim;
}

}  // namespace embedding
}  // namespace dyn_emb
