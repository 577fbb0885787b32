// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The admission counter's CPU backend on hand-computed sequences, over a
// counter table in host vectors. (The Python tests compare it with a model on
// random calls, and the CUDA backend with it.)
#include "cc/admission/counter_cpu.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cc/admission/counter.h"
#include "cc/table/host_table_testing.h"
#include "cc/table/types.h"

namespace dyn_emb {
namespace admission {
namespace {

using table::HostTable;
using table::kCounterEvictions;
using table::kCounterInsertFailures;
using table::kCounterSize;
using table::kEmptyKey;
using ::testing::ElementsAre;

// One counter table of a single bucket of 16 slots: keys land in call order.
struct OneBucket {
  HostTable h{{{16, 16}}, 1};

  std::vector<int64_t> add(std::vector<int64_t> keys, std::vector<int64_t> freqs = {},
                           int64_t release_at = table::kNoRelease) {
    const int64_t n = static_cast<int64_t>(keys.size());
    if (freqs.empty()) freqs.assign(n, 1);
    std::vector<int64_t> tables(n, 0), counts(n, -1);
    cpu::add(h.ref(), keys.data(), tables.data(), freqs.data(), n, release_at, h.total_buckets(),
             counts.data());
    return counts;
  }
  int64_t counter(int col) const { return h.counters[col]; }
};

std::vector<int64_t> iota(int64_t n, int64_t first) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(Counter, AccumulatesAndEvictsTheSmallestCount) {
  OneBucket c;
  EXPECT_EQ(c.add(iota(16, 1)), std::vector<int64_t>(16, 1));
  EXPECT_THAT(c.add({1}, {2}), ElementsAre(3));
  // Full: key 100 evicts the smallest count at the lowest position (key 2).
  EXPECT_THAT(c.add({100}), ElementsAre(1));
  EXPECT_EQ(c.h.keys[1], 100);
  EXPECT_EQ(c.h.scores[1], 1);
  EXPECT_EQ(c.counter(kCounterEvictions), 1);
  EXPECT_EQ(c.counter(kCounterSize), 16);
}

TEST(Counter, ACallNeverEvictsWhatItFound) {
  OneBucket c;
  c.add(iota(16, 1));
  std::vector<int64_t> keys = iota(16, 1);
  keys.push_back(99);
  const std::vector<int64_t> counts = c.add(keys);
  EXPECT_EQ(counts[0], 2);
  EXPECT_EQ(counts[16], 1);  // counted, not stored
  EXPECT_EQ(c.counter(kCounterInsertFailures), 1);
  EXPECT_EQ(c.counter(kCounterEvictions), 0);
}

TEST(Counter, AKeyReachingTheThresholdLeavesAndFreesItsSlot) {
  OneBucket c;
  c.add(iota(16, 1));
  EXPECT_THAT(c.add({1, 50}, {2, 1}, 3), ElementsAre(3, 1));
  EXPECT_EQ(c.h.keys[0], 50);  // key 1's slot, no eviction
  EXPECT_EQ(c.counter(kCounterEvictions), 0);
  EXPECT_EQ(c.counter(kCounterSize), 16);
  // An absent key counted to the threshold at once is never stored.
  EXPECT_THAT(c.add({60}, {5}, 3), ElementsAre(5));
  EXPECT_EQ(c.counter(kCounterEvictions), 0);
  for (int64_t k : c.h.keys) EXPECT_NE(k, 60);
}

TEST(Counter, ThresholdZeroStoresNothing) {
  OneBucket c;
  EXPECT_THAT(c.add({7, 8, 7}, {1, 1, 1}, 0), ElementsAre(1, 1, 1));
  for (int64_t k : c.h.keys) EXPECT_EQ(k, kEmptyKey);
  EXPECT_EQ(c.counter(kCounterSize), 0);
}

TEST(Counter, AdmitCountsOnlyTheKeysTheStoreMisses) {
  OneBucket store, c;
  store.add({5});  // the store holds key 5
  c.add({7});      // the counter has seen 7 once
  std::vector<int64_t> keys = {5, 7, 8, 9, kEmptyKey}, tables(5, 0), freqs = {1, 1, 1, 2, 0};
  std::vector<int8_t> status(5, -1);
  std::vector<int64_t> per_table(kAdmitCols, 0);
  cpu::admit(store.h.ref(), c.h.ref(), keys.data(), tables.data(), freqs.data(), 5, 2,
             c.h.total_buckets(), status.data(), per_table.data());
  const auto as = [](Admission a) { return static_cast<int8_t>(a); };
  EXPECT_THAT(status, ElementsAre(as(Admission::kStored), as(Admission::kAdmitted),
                                  as(Admission::kRejected), as(Admission::kAdmitted),
                                  as(Admission::kNone)));
  EXPECT_THAT(per_table, ElementsAre(2, 1));
  // 7 and 9 reached 2 and left (9 was never stored), 8 waits with 1, 5 was not counted.
  EXPECT_EQ(c.counter(kCounterSize), 1);
  EXPECT_EQ(c.h.keys[0], 8);
  EXPECT_EQ(c.h.scores[0], 1);
  EXPECT_EQ(store.counter(kCounterSize), 1);
}

}  // namespace
}  // namespace admission
}  // namespace dyn_emb
