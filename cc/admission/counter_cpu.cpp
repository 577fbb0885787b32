// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/admission/counter_cpu.h"

#include <cstddef>
#include <vector>

#include "cc/admission/counter.h"
#include "cc/table/table_cpu.h"

namespace dyn_emb {
namespace admission {
namespace cpu {

void add(const table::TableRef& t, const int64_t* keys, const int64_t* table_ids,
         const int64_t* frequencies, int64_t n, int64_t release_at, int64_t total_buckets,
         int64_t* counts) {
  if (n == 0) return;
  const size_t m = static_cast<size_t>(n);
  std::vector<int32_t> order(m);
  std::vector<int64_t> slots(m), ev_keys(m), ev_scores(m), ev_slots(m), ev_tables(m), sort_keys(m);
  std::vector<int8_t> status(m);
  std::vector<uint8_t> ev_flags(m);
  const CountScratch s{order.data(),     slots.data(),    status.data(),    ev_keys.data(),
                       ev_scores.data(), ev_slots.data(), ev_tables.data(), ev_flags.data()};
  table::cpu::run_op(t, count_run(keys, table_ids, frequencies, release_at, counts, s), n,
                     total_buckets, sort_keys.data());
}

}  // namespace cpu
}  // namespace admission
}  // namespace dyn_emb
