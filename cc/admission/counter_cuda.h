// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// CUDA backend of the admission counter (counter.h): the table's run kernels
// (cc/table/table_cuda.h) with the counter's run arguments. Torch-free; no
// host-device synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cc/table/table_cuda.h"
#include "cc/table/table_ref.h"

namespace dyn_emb {
namespace admission {
namespace cuda {

/// @brief Device-side counter_add; see cpu::add. Key values are not checked
/// (that would synchronize): an invalid entry touches nothing and its count
/// is left as it is.
void add(const table::TableRef& t, const int64_t* keys, const int64_t* table_ids,
         const int64_t* frequencies, int64_t n, int64_t release_at, int64_t total_buckets,
         int64_t* counts, table::cuda::ScratchAllocator& scratch, cudaStream_t stream);

/// @brief Device-side counter_admit; see cpu::admit. Key values are not
/// checked: invalid input is kNone.
void admit(const table::TableRef& store, const table::TableRef& counter, const int64_t* keys,
           const int64_t* table_ids, const int64_t* frequencies, int64_t n, int64_t threshold,
           int64_t total_buckets, int8_t* status, int64_t* per_table,
           table::cuda::ScratchAllocator& scratch, cudaStream_t stream);

}  // namespace cuda
}  // namespace admission
}  // namespace dyn_emb
