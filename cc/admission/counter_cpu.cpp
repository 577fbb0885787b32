// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include "cc/admission/counter_cpu.h"

#include <cstddef>
#include <vector>

#include "cc/admission/counter.h"
#include "cc/table/layout.h"
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

void admit(const table::TableRef& store, const table::TableRef& counter, const int64_t* keys,
           const int64_t* table_ids, const int64_t* frequencies, int64_t n, int64_t threshold,
           int64_t total_buckets, int8_t* status, int64_t* per_table) {
  if (n == 0) return;
  std::vector<int64_t> slots(static_cast<size_t>(n));
  table::cpu::find(store, table::ScoreArgs{}, keys, table_ids, n, /*update=*/false, slots.data());
  // The missing keys, compacted in batch order.
  std::vector<int64_t> idx, m_keys, m_tables, m_freqs;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] >= 0 || !table::valid_input(counter, keys[i], table_ids[i])) continue;
    idx.push_back(i);
    m_keys.push_back(keys[i]);
    m_tables.push_back(table_ids[i]);
    m_freqs.push_back(frequencies[i]);
  }
  const int64_t m = static_cast<int64_t>(idx.size());
  std::vector<int64_t> counts(idx.size());
  add(counter, m_keys.data(), m_tables.data(), m_freqs.data(), m, threshold, total_buckets,
      counts.data());
  for (int64_t i = 0, j = 0; i < n; ++i) {
    const bool missing = j < m && idx[j] == i;
    const bool valid = missing || slots[i] >= 0;
    const Admission a = admission_of(valid, !missing, missing ? counts[j++] : 0, threshold);
    status[i] = static_cast<int8_t>(a);
    const int col = admit_col(a);
    if (col >= 0) per_table[table_ids[i] * kAdmitCols + col] += 1;
  }
}

}  // namespace cpu
}  // namespace admission
}  // namespace dyn_emb
