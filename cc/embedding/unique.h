// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The segmented unique (the op segmented_unique; its results are documented in
// dynamicemb/embedding/unique.py): the distinct (table, key) pairs of a batch,
// table by table, within a table in the order of their first occurrences, with
// every per-pair output padded to the batch's length. Written by the CPU kernel
// (unique_cpu.h) and the CUDA kernel (unique_cuda.h) into the same outputs.
#pragma once

#include <cstdint>

namespace dyn_emb {
namespace embedding {

/// The outputs (n entries each unless said otherwise), int64, on the kernel's
/// device.
struct UniqueOutputs {
  int64_t* keys = nullptr;
  int64_t* table_ids = nullptr;
  int64_t* inverse = nullptr;
  int64_t* counts = nullptr;
  int64_t* table_offsets = nullptr;  ///< (num_tables + 1)
  int64_t* order = nullptr;
  int64_t* num_unique = nullptr;   ///< (1)
  int64_t* occ_offsets = nullptr;  ///< (n + 1)
};

}  // namespace embedding
}  // namespace dyn_emb
