// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Schemas of every dynamicemb op, defined once. Backends register their kernels
// per component: table_ops_{cpu,cuda}.cpp, embedding_ops_{cpu,cuda}.cpp,
// routing_ops_{cpu,cuda}.cpp, and ops_meta.cpp for the Meta (fake) kernels.
// The table layout and the meaning of `info`, `counters`, policies and
// statuses are documented in cc/table/ (layout.h, scores.h, operations.h,
// rows.h) and cc/table/types.h.
#include <torch/library.h>

TORCH_LIBRARY(dynamicemb, m) {
  // Looks up keys.
  // Args:
  //   keys, table_ids: (n) int64, the key and the logical table of each entry.
  //   table_keys, digests, scores, info: the table state (scores is mutated
  //     when `update` is set: the policies are applied to resident keys).
  //   policies: one ScorePolicy per score column; score_values: (1 or n,
  //     num_scores) int64 values they use.
  // Result:
  //   (n) int64 slots, -1 where the key is absent (or invalid).
  m.def(
      "table_find(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor digests, "
      "Tensor(a!) scores, Tensor info, int[] policies, Tensor score_values, bool update) -> "
      "Tensor");

  // table_find fused with the copy of each found key's value row.
  // Args: as table_find, and values: (num_rows, dim) contiguous, indexed by
  //   slot; under NO_EVICTION by the table's row offset (info) plus score
  //   word 0, the tables' row blocks back to back.
  // Result:
  //   slots (n) int64 (-1 where absent), rows (n, dim) of values' dtype, zeros
  //   where absent.
  m.def(
      "table_find_gather(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor digests, "
      "Tensor(a!) scores, Tensor info, int[] policies, Tensor score_values, bool update, "
      "Tensor values) -> (Tensor, Tensor)");

  // insert (op 0), insert_and_evict (op 1), erase (op 2) or place (op 3),
  // processed as if one key after another in batch order (see
  // cc/table/operations.h).
  // Args:
  //   counters: (num_tables, kCounterCols) int64, updated on the device.
  //   free_rows: NO_EVICTION free-row stacks (may be empty when no table is).
  //   assign_rows: a new key of a NO_EVICTION table takes score_values column
  //     0 as its row (one held by no key and given to no other new key: the
  //     CPU kernel refuses others); the row allocators are then rebuilt from
  //     the rows held (cc/table/rows.h).
  //   total_buckets: buckets of all tables (sort key bound).
  //   has_rows: some table is NO_EVICTION.
  //   victim_scores: optional (num_slots) float64 on the table's device: a
  //     custom eviction score per slot ranking insert_and_evict's victims
  //     before the score words (the victim order of cc/table/scores.h). Only
  //     the slots of the buckets the batch touches are read (see
  //     table_home_starts).
  //   target_slots: place only, (n) int64: the slot each key is to occupy, in
  //     its home bucket (the CPU kernel refuses any other; CUDA marks the entry
  //     INVALID).
  //   refuse_cold: insert_and_evict only: a new key colder than its full
  //     bucket's victim is not stored (REFUSED; cc/table/operations.h, "Refusal").
  //   held_slots: insert and insert_and_evict only, optional (num_slots) uint8
  //     or bool on the table's device, 8-byte aligned: nonzero slots are held
  //     by the call from its start, never victims (cc/table/operations.h,
  //     "Held slots").
  // Result:
  //   slots (n) int64, status (n) int8 InsertStatus (erase: 0 removed, 3 absent),
  //   evicted keys (n), scores (n, num_scores), slots (n), table ids (n), the
  //   first num_evicted[0] entries valid, in (bucket, index) order (place:
  //   the keys it displaced).
  m.def(
      "table_run(Tensor keys, Tensor table_ids, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor info, Tensor(d!) counters, Tensor(e!) free_rows, int[] policies, "
      "Tensor score_values, int op, bool assign_rows, int total_buckets, bool has_rows, "
      "Tensor? victim_scores=None, Tensor? target_slots=None, bool refuse_cold=False, "
      "Tensor? held_slots=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The admission counter's add (cc/admission/counter.h): insert_and_evict of
  // the keys into a counter table (one score word, the count) adding
  // `frequencies` to their counts; a key whose count reaches `release_at`
  // leaves (a stored key is erased, an absent one is not stored).
  // Args:
  //   keys, table_ids, frequencies: (n) int64 (frequencies >= 0).
  //   table_keys, digests, scores, info, counters: the counter's table.
  //   release_at: the count at which a key leaves; INT64_MAX: none does.
  //   total_buckets: buckets of all the counter's tables.
  // Result:
  //   (n) int64, the count each key reached (0 for an invalid entry on CUDA).
  m.def(
      "counter_add(Tensor keys, Tensor table_ids, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor info, Tensor(d!) counters, Tensor frequencies, int release_at, "
      "int total_buckets) -> Tensor");

  // Admission's one pass over a batch of distinct keys (cc/admission/counter.h,
  // "Admission in one pass"): each entry looked up in the store (an embedding
  // table, read only), the keys it does not hold counted as counter_add counts
  // them with release_at = threshold; a key whose count reaches the threshold
  // is admitted (and leaves the counter), the other missing keys rejected.
  // Args:
  //   keys, table_ids, frequencies: (n) int64; a key kEmptyKey is padding.
  //   store_keys, store_digests, store_scores, store_info: the store's table.
  //   table_keys, digests, scores, info, counters: the counter's table (as
  //     many tables as the store).
  //   threshold: the count that admits, >= 0.
  //   total_buckets: buckets of all the counter's tables.
  // Result:
  //   status (n) int8 Admission (STORED, ADMITTED, REJECTED, NONE: padding,
  //   or invalid input on CUDA); per_table (num_tables, 2) int64, the entries
  //   admitted and rejected.
  m.def(
      "counter_admit(Tensor keys, Tensor table_ids, Tensor store_keys, Tensor store_digests, "
      "Tensor store_scores, Tensor store_info, Tensor(a!) table_keys, Tensor(b!) digests, "
      "Tensor(c!) scores, Tensor info, Tensor(d!) counters, Tensor frequencies, int threshold, "
      "int total_buckets) -> (Tensor, Tensor)");

  // First slot of each entry's home bucket (its bucket spans the table's
  // bucket capacity from there), -1 for a reserved key or a table id out of
  // range: the slots an insert of these keys may evict from.
  // Result: (n) int64.
  m.def(
      "table_home_starts(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor info) -> Tensor");

  // One reading of the clock the TIMER score policy uses (the host's
  // monotonic nanosecond clock on the CPU, the device's global timer on
  // CUDA), as a (1) int64 tensor on `like`'s device, in stream order.
  m.def("table_timer(Tensor like) -> Tensor");

  // Occupied slots in [slot_begin, slot_end) whose score word `score_column` is
  // at least `threshold`, in slot order.
  // Result:
  //   keys, slots, table ids (range) int64, scores (range, num_scores) int64,
  //   count (1) int64; the first count entries are valid.
  m.def(
      "table_export(Tensor table_keys, Tensor scores, Tensor info, int slot_begin, int slot_end, "
      "int score_column, int threshold) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // Rows of a value buffer by index: out[i] = values[rows[i]], zeros where
  // rows[i] is -1 (a key that is absent or failed). The copy the lookup path
  // makes after table_find.
  // Args:
  //   values: (num_rows, dim) contiguous, any dtype; rows: (n) int64.
  // Result:
  //   (n, dim) tensor of values' dtype.
  m.def("gather_rows(Tensor values, Tensor rows) -> Tensor");

  // Initial rows of keys (cc/embedding/initializer.h): the same key, table
  // and seed give the same row on every backend and in any batch.
  // Args:
  //   keys, table_ids: (n) int64; dim: row width; mode: InitMode; mean,
  //   std_dev, lower, upper, value: the initializer's parameters; seed.
  // Result:
  //   (n, dim) float32.
  m.def(
      "init_rows(Tensor keys, Tensor table_ids, int dim, int mode, float mean, float std_dev, "
      "float lower, float upper, float value, int seed) -> Tensor");

  // init_rows written in place into a row space (new rows of a batch).
  // Args:
  //   seg0, seg1: the row space (cc/storage/row_space.h), written; offsets:
  //   (n) int64 byte offset of each entry's row, -1 to skip it; keys,
  //   table_ids: (n) int64 as init_rows; dim, the initializer's mode
  //   (init_mode: an argument named `mode` would clash with torch.compile's
  //   functionalization of mutating ops) and parameters, seed: as init_rows;
  //   element_type: the embeddings' storage::ElementType; state_dim: floats of optimizer state
  //   after the embedding (padded to 4 bytes), zeros except entries from fill_from on, which are
  //   fill.
  m.def(
      "init_rows_at(Tensor(a!) seg0, Tensor(b!) seg1, Tensor offsets, Tensor keys, "
      "Tensor table_ids, int dim, int init_mode, float mean, float std_dev, float lower, "
      "float upper, float value, int seed, int element_type, int state_dim, int fill_from, "
      "float fill) -> ()");

  // Fused optimizer update of embedding rows stored with their state
  // (cc/embedding/optimizer.h).
  // Args:
  //   values: (num_rows, width) float32, updated in place; rows: (n) int64,
  //   distinct, -1 to skip; grads: (n, dim) float32 reduced gradients;
  //   optim: the optimizer (OptimArgs's fields at their OptimField positions:
  //   type, hyper-parameters, the 1-based step).
  m.def("optimizer_step(Tensor(a!) values, Tensor rows, Tensor grads, float[] optim) -> ()");

  // Occupied slots of each table, counted from the keys: (num_tables) int64.
  m.def("table_count(Tensor table_keys, Tensor info) -> Tensor");

  // Checks the rows an insert with assign_rows would give the new keys of
  // NO_EVICTION tables (cc/table/row_check.h: valid keys, rows in the table's
  // rows, held by no key, given to no other new key), raising for the first
  // bad entry; changes nothing. The rule table_run applies on the CPU; a CUDA
  // table calls this op before its run (the CUDA run does not check values).
  // Args: as table_run's (score_values: (1 or n, num_scores), word 0 the row).
  m.def(
      "table_check_rows(Tensor keys, Tensor table_ids, Tensor table_keys, Tensor digests, "
      "Tensor scores, Tensor info, Tensor free_rows, Tensor score_values) -> ()");

  // Row-wise routing of raw keys to the ranks of a sharded table
  // (cc/routing/routing.h): ranks[i] = route_key(keys[i], dist_types[f],
  // blocks[f], world_size) with f = feature_ids[i].
  // Args:
  //   keys, feature_ids: (n) int64; dist_types, blocks: (num_features) int64
  //   (DistType values; the continuous block size, ignored by the other
  //   types); world_size > 0.
  // Result:
  //   (n) int64 ranks in [0, world_size).
  m.def(
      "route_keys(Tensor keys, Tensor feature_ids, Tensor dist_types, Tensor blocks, "
      "int world_size) -> Tensor");

  // The value checks of a sharded collection's input batch
  // (cc/routing/batch_check.h), nothing read on the host.
  // Args:
  //   values: (n) int32/int64; lengths: (num_features * stride) int32/int64;
  //   weights: (n) floating or None; offsets: int32/int64, only offsets[0]
  //   read, or None; feature_mask: (num_features) bool, the features whose
  //   keys and weights are checked, or None (all); weight_rule: 0 (weights
  //   not read), 1 (finite), 2 (finite whole numbers >= 0); feature_rows:
  //   (num_features) int64, a feature's ids must lie in [0, rows) where
  //   rows > 0 (a static table's), or None (no bounds).
  // Result:
  //   (4 + num_features) int64: the verdict row (code, a, b, c; zeros when
  //   good) and the lengths per feature.
  m.def(
      "check_batch(Tensor values, Tensor lengths, Tensor? weights, Tensor? offsets, "
      "Tensor? feature_mask, int num_features, int stride, int weight_rule, "
      "Tensor? feature_rows=None) -> Tensor");

  // Every bag's (weighted) sum of its rows, written into TorchRec's output
  // layout (cc/embedding/pooling.h).
  // Args:
  //   seg0, seg1: the row space's two segments (cc/storage/row_space.h; any
  //   contiguous tensors, read as bytes); rows: (U) int64 byte offset of each
  //   distinct key's row, -1 for none; inverse: (n) distinct key of each
  //   occurrence; bag_offsets: (F * batch + 1); weights: (n) float32 or None;
  //   cols, dims: (F) first output column and dim of each feature;
  //   element_type: the embeddings' storage::ElementType (0 float32, 1
  //   float16, 2 bfloat16, 3 FP8 e4m3fn rows with a scale, at most
  //   storage::kMaxScaledDim wide); fill: (m, width) rows of that type (FP8:
  //   uint8, the rows' bytes), or None, of
  //   keys stored nowhere: rows[u] = -2 - i reads fill row i; tiled: the
  //   caller's promise that the features' columns [cols[f], cols[f] + dims[f])
  //   cover [0, out_width) (every column is then written, and the output is
  //   not zeroed first).
  // Result:
  //   (batch, out_width) float32, zeros in the columns of no feature.
  m.def(
      "embedding_pool(Tensor seg0, Tensor seg1, Tensor rows, Tensor inverse, Tensor bag_offsets, "
      "Tensor? weights, Tensor cols, Tensor dims, SymInt batch, int out_width, int element_type, "
      "Tensor? fill=None, bool tiled=False) -> Tensor");

  // embedding_pool's backward: reduces each distinct key's gradient from
  // grad_out and updates its row in place with the optimizer, in float32
  // (cc/embedding/pooling.h, optimizer.h).
  // Args:
  //   seg0, seg1: the row space, updated in place; grad_out: (batch,
  //   out_width); rows: (U) byte offsets, a negative one (no row, or a fill
  //   row of embedding_pool) not updated; occ_offsets (U + 1), occ_order (n):
  //   each key's occurrences; occ_bag (n): the bag of each occurrence;
  //   weights, cols, dims, element_type as embedding_pool; optim as
  //   optimizer_step; step_values: optional (2) float32 on the op's device,
  //   used instead of what optim's step gives (so that a traced backward takes
  //   the iteration as data, not as a constant): Adam's bias corrections
  //   1 - beta1^t and 1 - beta2^t (the adam_bias op), RMSprop AR's t (then
  //   unused); rounding: optional (U + 1) int64 on the op's device, each
  //   distinct key and then the step, the seeds of the stochastic rounding of
  //   FP8 rows (without it: each row's offset and optim's step).
  m.def(
      "embedding_update(Tensor(a!) seg0, Tensor(b!) seg1, Tensor grad_out, Tensor rows, "
      "Tensor occ_offsets, Tensor occ_order, Tensor occ_bag, Tensor? weights, Tensor cols, "
      "Tensor dims, SymInt batch, int element_type, float[] optim, Tensor? step_values=None, "
      "Tensor? rounding=None) -> ()");

  // The distinct (table, key) pairs of a batch (dynamicemb/embedding/unique.py),
  // padded: every per-pair output has the batch's length n, the distinct
  // pairs first (table by table, within a table by first occurrence), then
  // padding (key pad_key, table num_tables - 1, count 0).
  // Args:
  //   keys, table_ids: (n) int64, table ids in [0, num_tables).
  // Result:
  //   keys (n), table_ids (n), inverse (n: keys[inverse] == the input keys),
  //   counts (n), table_offsets (num_tables + 1: table t's pairs are
  //   [table_offsets[t], table_offsets[t + 1])), order (n: the input
  //   positions grouped by pair, ascending within a pair), num_unique (1),
  //   occ_offsets (n + 1: pair u's positions are
  //   order[occ_offsets[u]:occ_offsets[u + 1]]); int64.
  m.def(
      "segmented_unique(Tensor keys, Tensor table_ids, int num_tables, int pad_key) -> (Tensor, "
      "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");

  // The bag and the table of each occurrence of a batch in TBE layout (F
  // features of `batch` samples, bag b = sample b % batch of feature
  // b / batch): bag b holds occurrences [offsets[b] - offsets[0],
  // offsets[b + 1] - offsets[0]) of num_indices, its table is
  // feature_tables[b / batch]. One kernel instead of a repeat_interleave, a
  // division and a gather.
  // Args:
  //   offsets: (F * batch + 1) int64, non-decreasing; feature_tables: (F)
  //   int64; batch >= 1; sequence: every occurrence a bag of its own (pooling
  //   NONE).
  // Result:
  //   bags: (num_indices) the bag of each occurrence, or with `sequence`
  //   (num_indices + 1) 0..num_indices (the sequence's bag offsets, whose
  //   first num_indices are each occurrence's bag); table_ids: (num_indices).
  m.def(
      "occurrence_bags(Tensor offsets, Tensor feature_tables, SymInt num_indices, SymInt batch, "
      "bool sequence) -> (Tensor, Tensor)");

  // Adam's bias corrections at 1-based iteration `step`: (2) float32,
  // 1 - betas[i]^step, for embedding_update's step_values. One op, so that an
  // eager step and a traced one (where `step` is symbolic and a compiler
  // would generate its own pow) compute them alike, bit for bit.
  m.def("adam_bias(Tensor betas, SymInt step) -> Tensor");

  // Row moves of the storage tiers (cc/storage/copy_rows.h): for each i with
  // both offsets >= 0, bytes[i] bytes from the row space (src0, src1) at
  // src_offsets[i] to the row space (dst0, dst1) at dst_offsets[i].
  // Args:
  //   segments: contiguous tensors read as bytes, on one device (a segment
  //   may be host memory mapped into a CUDA device's address space);
  //   offsets and byte counts: (n) int64, multiples of 4; source and
  //   destination rows must not overlap.
  m.def(
      "copy_rows(Tensor(a!) dst0, Tensor(b!) dst1, Tensor dst_offsets, Tensor src0, Tensor src1, "
      "Tensor src_offsets, Tensor bytes) -> ()");

  // The rows of a training insert's slots in a row space of a fixed stride
  // (cc/storage/copy_rows.h, SlotRowsArgs), in one pass: (rows, new_rows),
  // (n) int64 each: rows[i] = slots[i] * stride, -1 where slots[i] is -1;
  // new_rows[i] = rows[i] where status[i] (int8) is not `found`, else -1.
  m.def("slot_rows(Tensor slots, Tensor status, int stride, int found) -> (Tensor, Tensor)");

  // A training step's failed inserts per table, added in place: counts
  // (num_tables) int64 += per table the entries i with rows[i] == -1 that
  // valid (bool, optional: all) marks; table_ids (n) int64 in range.
  m.def("count_failures(Tensor(a!) counts, Tensor rows, Tensor table_ids, Tensor? valid) -> ()");
}
