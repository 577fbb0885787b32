// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The segmented unique on the GPU (unique.h; the CPU kernel is unique_cpu.h).
// Torch-free; every pointer on the device.
//
// The pairs are found in a hash set of input positions: each occurrence
// probes for its (table, key) pair and leaves the pair's smallest position in
// the slot. One stable radix sort of (table, smallest position), a few dozen
// bits instead of the key's 64 and the table's, then groups the occurrences
// by pair, the pairs by table and, within a table, in the order of their first
// occurrences; a scan numbers the pairs and the last passes write the outputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cc/embedding/unique.h"

namespace dyn_emb {
namespace embedding {
namespace cuda {

/// Bytes of device scratch segmented_unique needs for n occurrences of
/// num_tables tables (n < 2^31 - 1).
size_t unique_scratch(int64_t n, int64_t num_tables);

/// Writes every output for the n >= 1 occurrences (keys, table_ids), the
/// padding after the distinct pairs (key pad_key, table num_tables - 1,
/// count 0) included, using `scratch` (unique_scratch bytes, 256-byte
/// aligned). A table id outside [0, num_tables) is counted as table
/// num_tables: its pairs come last and the table offsets end before them
/// (what DYNAMICEMB_DEBUG's check of the offsets reports). Nothing is read on
/// the host.
void segmented_unique(const int64_t* keys, const int64_t* table_ids, int64_t n, int64_t num_tables,
                      int64_t pad_key, void* scratch, const UniqueOutputs& out,
                      cudaStream_t stream);

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
