// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/storage/copy_rows_cpu.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace dyn_emb {
namespace storage {
namespace cpu {

void copy_rows(const CopyArgs& a) {
  at::parallel_for(0, a.n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!copies(a, i)) continue;
      std::memcpy(a.dst.at(a.dst_offsets[i]), a.src.at(a.src_offsets[i]),
                  static_cast<size_t>(a.bytes[i]));
    }
  });
}

void slot_rows(const SlotRowsArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) slot_row(a, i);
}

}  // namespace cpu
}  // namespace storage
}  // namespace dyn_emb
