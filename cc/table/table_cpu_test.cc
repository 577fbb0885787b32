// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CPU backend's parallel, sorted driver against the definition it must
// equal: the same batch applied one key at a time.
#include "cc/table/table_cpu.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cc/table/hash.h"
#include "cc/table/host_table_testing.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/row_check.h"
#include "cc/table/rows.h"

namespace dyn_emb {
namespace table {
namespace {

struct Out : RunOutputs {
  std::vector<int64_t> scratch;
  int64_t evicted = 0;
};

Out run(HostTable& s, RunOp op, const std::vector<int64_t>& keys,
        const std::vector<int64_t>& tables, const std::vector<int64_t>& score_values) {
  const int64_t n = static_cast<int64_t>(keys.size());
  Out o;
  o.reset(n, s.num_scores);
  o.scratch.assign(n, 0);
  ScoreArgs a;
  for (int c = 0; c < s.num_scores; ++c)
    a.policy[c] = static_cast<int32_t>(ScorePolicy::kAccumulate);
  a.values = score_values.data();
  a.value_row_stride = s.num_scores;
  const RunArgs r = o.args(op, keys.data(), tables.data(), a);
  o.evicted = cpu::run_op(s.ref(), r, n, s.total_buckets(), o.scratch.data());
  return o;
}

TEST(CpuBackend, RadixOrderIsAStableSort) {
  std::mt19937_64 rng(7);
  for (int64_t total : std::vector<int64_t>{1, 5, 3000, int64_t{1} << 23}) {
    std::vector<int64_t> k(5000);
    for (auto& x : k) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(total + 1));
    std::vector<int32_t> got(k.size()), want(k.size());
    cpu::stable_order(k.data(), static_cast<int64_t>(k.size()), total, got.data());
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return k[a] < k[b]; });
    EXPECT_EQ(got, want) << total;
  }
}

// Without eviction, a batch through the parallel sorted driver leaves the
// table exactly as the same keys applied one at a time, NO_EVICTION rows
// included, at any thread count.
TEST(CpuBackend, InsertAndEraseBatchEqualsOneKeyAtATime) {
  for (int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    std::mt19937_64 rng(11 + threads);
    HostTable a({{64, 16}, {256, 32}, {128, 16}}, 2, /*row_capacities=*/{0, 0, 64});
    HostTable b = a;
    for (int step = 0; step < 6; ++step) {
      const RunOp op = step == 3 || step == 5 ? RunOp::kErase : RunOp::kInsert;
      const int64_t n = 200;
      std::vector<int64_t> keys(n), tables(n), sv(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = static_cast<int64_t>(rng() % 400) - 50;
        tables[i] = static_cast<int64_t>(rng() % 3);
        sv[2 * i] = static_cast<int64_t>(rng() % 4);
        sv[2 * i + 1] = step;
      }
      Out batch = run(a, op, keys, tables, sv);
      for (int64_t i = 0; i < n; ++i) {
        Out one = run(b, op, {keys[i]}, {tables[i]}, {sv[2 * i], sv[2 * i + 1]});
        EXPECT_EQ(one.status[0], batch.status[i]) << "step " << step << " index " << i;
        EXPECT_EQ(one.slots[0], batch.slots[i]) << "step " << step << " index " << i;
      }
      ASSERT_EQ(a.keys, b.keys) << "step " << step;
      ASSERT_EQ(a.scores, b.scores) << "step " << step;
      ASSERT_EQ(a.digests, b.digests) << "step " << step;
      ASSERT_EQ(a.counters, b.counters) << "step " << step;
      ASSERT_EQ(a.free_rows, b.free_rows) << "step " << step;
    }
  }
}

// With eviction the result does not depend on the thread count.
TEST(CpuBackend, InsertEvictIsIndependentOfThreadCount) {
  std::vector<HostTable> finals;
  std::vector<std::vector<int64_t>> evicted;
  for (int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    std::mt19937_64 rng(5);
    HostTable s({{64, 16}, {256, 32}}, 2);
    std::vector<int64_t> ev;
    for (int step = 0; step < 8; ++step) {
      const int64_t n = 300;
      std::vector<int64_t> keys(n), tables(n), sv(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = static_cast<int64_t>(rng() % 2000);
        tables[i] = static_cast<int64_t>(rng() % 2);
        sv[2 * i] = static_cast<int64_t>(rng() % 3);
        sv[2 * i + 1] = step;
      }
      Out o = run(s, RunOp::kInsertEvict, keys, tables, sv);
      ev.insert(ev.end(), o.ev_keys.begin(), o.ev_keys.begin() + o.evicted);
      ev.insert(ev.end(), o.slots.begin(), o.slots.end());
    }
    finals.push_back(s);
    evicted.push_back(ev);
  }
  at::set_num_threads(1);
  for (size_t k = 1; k < finals.size(); ++k) {
    EXPECT_EQ(finals[k].keys, finals[0].keys);
    EXPECT_EQ(finals[k].scores, finals[0].scores);
    EXPECT_EQ(finals[k].counters, finals[0].counters);
    EXPECT_EQ(evicted[k], evicted[0]);
  }
  EXPECT_GT(finals[0].counters[kCounterEvictions], 0);
}

TEST(CpuBackend, InvalidEntriesAreReportedAndChangeNothing) {
  HostTable s({{32, 16}}, 1);
  const std::vector<int64_t> before = s.keys;
  Out o = run(s, RunOp::kInsertEvict, {kEmptyKey, 5}, {0, 3}, {1, 1});
  EXPECT_EQ(o.status[0], static_cast<int8_t>(InsertStatus::kInvalid));
  EXPECT_EQ(o.status[1], static_cast<int8_t>(InsertStatus::kInvalid));
  EXPECT_EQ(s.keys, before);
  EXPECT_EQ(s.counters[kCounterSize], 0);
}

TEST(CpuBackend, RebuiltRowAllocatorHandsOutTheLowestFreeRowFirst) {
  HostTable s({{32, 16}, {32, 16}}, 1, /*row_capacities=*/{0, 16});
  // Keys of table 1 hold rows 5 and 2 (as an insert with assign_rows leaves them).
  const int64_t slot_a = 32 + 3, slot_b = 32 + 20;
  s.keys[slot_a] = 100;
  s.scores[slot_a] = 5;
  s.keys[slot_b] = 200;
  s.scores[slot_b] = 2;
  cpu::rebuild_row_allocators(s.ref());
  const int64_t* cnt = s.counters.data() + kCounterCols;
  EXPECT_EQ(cnt[kCounterNextRow], 6);
  EXPECT_EQ(cnt[kCounterFreeTop], 4);
  // Free rows 4, 3, 1, 0 from the bottom: 0 is handed out first.
  EXPECT_EQ(std::vector<int64_t>(s.free_rows.begin(), s.free_rows.begin() + 4),
            (std::vector<int64_t>{4, 3, 1, 0}));
  EXPECT_EQ(row_for_rank(s.ref(), 1, 0), 0);
  EXPECT_EQ(row_for_rank(s.ref(), 1, 4), 6);
}

RowVerdict check(HostTable& s, const std::vector<int64_t>& keys, const std::vector<int64_t>& tables,
                 const std::vector<int64_t>& rows) {
  return cpu::check_rows(s.ref(), keys.data(), tables.data(), rows.data(), 1,
                         static_cast<int64_t>(keys.size()));
}

TEST(CpuBackend, CheckRowsNamesTheFirstEntryBreakingTheFirstRule) {
  // Table 1 has 8 rows; keys 100 and 200 hold rows 0 and 1.
  HostTable s({{32, 16}, {32, 16}}, 1, /*row_capacities=*/{0, 8});
  run(s, RunOp::kInsert, {100, 200}, {1, 1}, {0, 0});
  ASSERT_EQ(s.counters[kCounterCols + kCounterNextRow], 2);
  const std::vector<int64_t> before = s.keys;
  EXPECT_EQ(check(s, {300, 400}, {1, 1}, {2, 3}).error, kRowsOk);
  EXPECT_EQ(check(s, {300, 5}, {1, 0}, {2, 99}).error, kRowsOk);  // an evicting table's row
  EXPECT_EQ(check(s, {300, 300, 400}, {1, 1, 1}, {2, 7, 7}).error, kRowsOk);  // a repeat
  EXPECT_EQ(check(s, {100, 300}, {1, 1}, {5, 2}).error, kRowsOk);             // a resident key
  RowVerdict v = check(s, {300, kEmptyKey}, {1, 1}, {2, 3});
  EXPECT_EQ(v.error, kRowKeyReserved);
  EXPECT_EQ(v.index, 1);
  v = check(s, {300, 400}, {1, 2}, {2, 3});
  EXPECT_EQ(v.error, kRowTableRange);
  EXPECT_EQ(v.table, 2);
  // A row out of range is named before an earlier entry's held row.
  v = check(s, {300, 400}, {1, 1}, {0, 8});
  EXPECT_EQ(v.error, kRowOutOfRange);
  EXPECT_EQ(v.index, 1);
  EXPECT_EQ(v.row, 8);
  EXPECT_EQ(v.row_capacity, 8);
  v = check(s, {300, 400, 500}, {1, 1, 1}, {2, 5, 2});
  EXPECT_EQ(v.error, kRowGivenTwice);
  EXPECT_EQ(v.index, 2);
  EXPECT_EQ(v.other_index, 0);
  EXPECT_EQ(v.other_key, 300);
  v = check(s, {300, 100, 400}, {1, 1, 1}, {4, 1, 0});
  EXPECT_EQ(v.error, kRowHeld);
  EXPECT_EQ(v.index, 2);
  EXPECT_EQ(v.key, 400);
  EXPECT_EQ(v.other_key, 100);
  EXPECT_EQ(s.keys, before);
}

TEST(CpuBackend, ExportAndCountAgreeWithTheKeys) {
  HostTable s({{64, 16}, {64, 32}}, 1);
  std::vector<int64_t> keys(80), tables(80), sv(80);
  for (int i = 0; i < 80; ++i) {
    keys[i] = i * 7 + 1;
    tables[i] = i % 2;
    sv[i] = i;
  }
  run(s, RunOp::kInsert, keys, tables, sv);
  std::vector<int64_t> cnt(2);
  cpu::count(s.ref(), cnt.data());
  EXPECT_EQ(cnt[0], s.counters[kCounterSize]);
  EXPECT_EQ(cnt[1], s.counters[kCounterCols + kCounterSize]);
  std::vector<int64_t> k(128), sl(128), tb(128), sc(128);
  const int64_t c =
      cpu::export_batch(s.ref(), 0, 128, 0, 40, k.data(), sl.data(), tb.data(), sc.data());
  int64_t expect = 0;
  for (int64_t slot = 0; slot < 128; ++slot)
    expect += s.keys[slot] != kEmptyKey && s.scores[slot] >= 40;
  EXPECT_EQ(c, expect);
  for (int64_t j = 0; j < c; ++j) {
    EXPECT_EQ(s.keys[sl[j]], k[j]);
    EXPECT_GE(sc[j], 40);
    EXPECT_EQ(tb[j], sl[j] < 64 ? 0 : 1);
    if (j) {
      EXPECT_LT(sl[j - 1], sl[j]);
    }
  }
}

}  // namespace
}  // namespace table
}  // namespace dyn_emb
