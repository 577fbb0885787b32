// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// Tests of the shared per-key semantics (hash.h, layout.h, scores.h,
// operations.h, rows.h), run on the host with plain arrays: hashing, digest probing, victim
// selection and run processing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "cc/table/hash.h"
#include "cc/table/host_table_testing.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/rows.h"

namespace dyn_emb {
namespace table {
namespace {

using ::testing::ElementsAre;

// Runs one batch sequentially: the prefind pass (resident_slot), then
// process_run per run.
struct Batch : RunOutputs {
  std::vector<int64_t> keys, tables;

  const double* victim_scores = nullptr;

  void run(HostTable& h, RunOp op, ScoreArgs a) {
    const int64_t n = static_cast<int64_t>(keys.size());
    if (tables.empty()) tables.assign(n, 0);
    reset(n, h.num_scores, /*unwritten=*/-7);
    TableRef t = h.ref();
    std::vector<int64_t> sk(n);
    for (int64_t i = 0; i < n; ++i) sk[i] = sort_key_of(t, keys[i], tables[i]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return sk[x] < sk[y]; });
    RunArgs r = args(op, keys.data(), tables.data(), a);
    r.victim_scores = victim_scores;
    // The prefind pass: the slots of the keys in the table when the call starts.
    for (int64_t i = 0; i < n; ++i) slots[i] = resident_slot(t, keys[i], tables[i]);
    int64_t b = 0;
    while (b < n) {
      int64_t e = b + 1;
      while (e < n && sk[order[e]] == sk[order[b]]) ++e;
      process_run(t, r, b, e);
      b = e;
    }
  }
};

ScoreArgs assign_each(const std::vector<int64_t>& v) {
  ScoreArgs a;
  a.policy[0] = static_cast<int32_t>(ScorePolicy::kAssign);
  a.values = v.data();
  a.value_row_stride = 1;
  return a;
}

// Keys of one table (capacity = width) all share its single bucket.
std::vector<int64_t> iota_keys(int64_t n, int64_t first = 1) {
  std::vector<int64_t> k(n);
  std::iota(k.begin(), k.end(), first);
  return k;
}

// murmur3's fmix64 (MurmurHash3.cpp), the values computed independently in
// Python from its definition.
TEST(Hashing, BucketHashIsMurmur3Fmix64) {
  const std::pair<int64_t, uint64_t> kats[] = {
      {0, 0x0000000000000000ULL},         {1, 0xb456bcfc34c2cb2cULL},
      {2, 0x3abf2a20650683e7ULL},         {42, 0x810879608e4259ccULL},
      {-1, 0x64b5720b4b825f21ULL},        {INT64_MIN, 0x8f780810af31a493ULL},
      {INT64_MAX, 0xabb93df0a930edeaULL}, {0x0123456789abcdefLL, 0x87cbfbfe89022ceaULL},
  };
  for (const auto& [key, want] : kats) {
    EXPECT_EQ(bucket_hash(static_cast<uint64_t>(key)), want) << "key " << key;
  }
  // The digest is byte 4 of the hash.
  EXPECT_EQ(digest_of_hash(0xb456bcfc34c2cb2cULL), 0xfc);
}

TEST(Hashing, ReservedKeysAreTheFourSmallest) {
  EXPECT_TRUE(is_reserved_key(kEmptyKey));
  EXPECT_TRUE(is_reserved_key(kEmptyKey + 3));
  EXPECT_FALSE(is_reserved_key(kEmptyKey + 4));
  EXPECT_FALSE(is_reserved_key(-1));
  EXPECT_FALSE(is_reserved_key(0));
}

TEST(Probing, MatchBytesFlagsEveryEqualByte) {
  const uint64_t word = 0x11AB22AB33AB44ABULL;
  const uint64_t m = match_bytes(word, 0xAB);
  // Bytes 0, 2, 4, 6 are 0xAB; false positives are allowed only above a match.
  for (int b : {0, 2, 4, 6}) EXPECT_NE(m & (0x80ULL << (8 * b)), 0u) << b;
  EXPECT_EQ(match_bytes(0x0102030405060708ULL, 0xFF), 0u);
}

TEST(Probing, HomeBucketIsHashModCapacityOverWidth) {
  HostTable h({{64, 16}, {128, 32}}, 1);
  TableRef t = h.ref();
  for (int64_t key : {1, 99, -5, 123456789}) {
    const uint64_t hh = bucket_hash(static_cast<uint64_t>(key));
    const Home a = home_of(t, 0, key);
    EXPECT_EQ(a.start, static_cast<int64_t>(hh % 64) / 16 * 16);
    const Home b = home_of(t, 1, key);
    EXPECT_EQ(b.start, 64 + static_cast<int64_t>(hh % 128) / 32 * 32);
    EXPECT_EQ(b.global_bucket, 4 + static_cast<int64_t>(hh % 128) / 32);
  }
}

TEST(RunOps, FillsFirstEmptyPositionsInBatchOrder) {
  HostTable h({{16, 16}}, 1);
  Batch b;
  b.keys = {10, 11, 12};
  std::vector<int64_t> s = {5, 6, 7};
  b.run(h, RunOp::kInsertEvict, assign_each(s));
  EXPECT_THAT(b.slots, ElementsAre(0, 1, 2));
  EXPECT_THAT(b.status, ElementsAre(1, 1, 1));
  EXPECT_EQ(h.scores[1], 6);
  EXPECT_EQ(h.counters[kCounterSize], 3);
}

TEST(RunOps, VictimIsMinimumScoreLowestPositionOnTies) {
  HostTable h({{16, 16}}, 1);
  Batch fill;
  fill.keys = iota_keys(16);
  std::vector<int64_t> s(16, 50);
  s[9] = 3;
  s[12] = 3;  // a tie at a higher position
  fill.run(h, RunOp::kInsertEvict, assign_each(s));
  Batch b;
  b.keys = {100};
  std::vector<int64_t> s2 = {60};
  b.run(h, RunOp::kInsertEvict, assign_each(s2));
  EXPECT_EQ(b.status[0], static_cast<int8_t>(InsertStatus::kEvicted));
  EXPECT_EQ(b.slots[0], 9);
  EXPECT_EQ(b.ev_flags[0], 1);
  EXPECT_EQ(b.ev_keys[0], 10);  // key 10 sat at position 9
  EXPECT_EQ(b.ev_scores[0], 3);
  EXPECT_EQ(h.counters[kCounterEvictions], 1);
  EXPECT_EQ(h.counters[kCounterSize], 16);
}

TEST(Victims, RankKeyOrdersNumbersAscendingWithNanFirst) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> ascending = {-inf,   -1e308, -2.0, -1.0,  -1e-310, 0.0,
                                         1e-310, 1.0,    2.0,  1e308, inf};
  EXPECT_EQ(victim_rank_key(nan), INT64_MIN);
  EXPECT_EQ(victim_rank_key(-nan), INT64_MIN);
  for (size_t i = 0; i < ascending.size(); ++i) {
    EXPECT_LT(victim_rank_key(nan), victim_rank_key(ascending[i])) << ascending[i];
    if (i) {
      EXPECT_LT(victim_rank_key(ascending[i - 1]), victim_rank_key(ascending[i])) << i;
    }
  }
  EXPECT_EQ(victim_rank_key(-0.0), victim_rank_key(0.0));
}

TEST(Victims, VictimScoresRankBeforeScoreWordsAndTiesFallBackToThem) {
  HostTable h({{16, 16}}, 1);
  Batch fill;
  fill.keys = iota_keys(16);
  std::vector<int64_t> s(16);
  std::iota(s.begin(), s.end(), 0);  // the score words alone would evict position 0
  fill.run(h, RunOp::kInsertEvict, assign_each(s));
  std::vector<double> vs(16, 5.0);
  vs[11] = -1.0;
  vs[4] = std::numeric_limits<double>::quiet_NaN();
  vs[13] = -1.0;  // ties with position 11 on the victim score; 11 has the smaller word
  Batch b;
  b.keys = {100, 101, 102, 103};
  b.victim_scores = vs.data();
  std::vector<int64_t> s2 = {60, 60, 60, 60};
  b.run(h, RunOp::kInsertEvict, assign_each(s2));
  // NaN first, then -1.0 at 11 and 13, then a 5.0 with the smallest word (position 0).
  EXPECT_THAT(b.slots, ElementsAre(4, 11, 13, 0));
  EXPECT_THAT(b.ev_keys, ElementsAre(5, 12, 14, 1));
}

TEST(RunOps, BatchNeverEvictsWhatItTouched) {
  HostTable h({{16, 16}}, 1);
  Batch fill;
  fill.keys = iota_keys(16);
  std::vector<int64_t> s(16, 1);
  fill.run(h, RunOp::kInsertEvict, assign_each(s));
  // Touch all 16 residents, then ask for one more key in the same batch.
  Batch b;
  b.keys = iota_keys(16);
  b.keys.push_back(1000);
  std::vector<int64_t> s2(17, 9);
  b.run(h, RunOp::kInsertEvict, assign_each(s2));
  EXPECT_EQ(b.status[16], static_cast<int8_t>(InsertStatus::kFailed));
  EXPECT_EQ(b.slots[16], -1);
  EXPECT_EQ(h.counters[kCounterInsertFailures], 1);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.status[i], static_cast<int8_t>(InsertStatus::kFound));
}

TEST(RunOps, ResidentKeyOfTheBatchIsFoundBeforeANewKeyEvicts) {
  HostTable h({{16, 16}}, 1);
  Batch fill;
  fill.keys = iota_keys(16);
  std::vector<int64_t> s(16);
  std::iota(s.begin(), s.end(), 1);  // key 1 at position 0 has the minimum
  fill.run(h, RunOp::kInsertEvict, assign_each(s));
  Batch b;
  b.keys = {100, 1};  // the new key first: key 1 is still found and kept
  std::vector<int64_t> s2 = {50, 50};
  b.run(h, RunOp::kInsertEvict, assign_each(s2));
  EXPECT_THAT(b.status, ElementsAre(static_cast<int8_t>(InsertStatus::kEvicted),
                                    static_cast<int8_t>(InsertStatus::kFound)));
  EXPECT_THAT(b.slots, ElementsAre(1, 0));
  EXPECT_EQ(b.ev_keys[0], 2);  // the next minimum
  EXPECT_EQ(h.scores[0], 50);
}

TEST(Victims, SelectVictimsTakesTheSmallestUntouchedSlotsInVictimOrder) {
  HostTable h({{32, 32}}, 1);
  Batch fill;
  fill.keys = iota_keys(32);
  std::vector<int64_t> s = {9, 4, 4, 7, 1, 8, 2, 6, 3, 5, 9, 9, 9, 9, 9, 9,
                            9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 0};
  fill.run(h, RunOp::kInsertEvict, assign_each(s));
  TableRef t = h.ref();
  RunArgs r;
  const Home home = home_of(t, 0, 1);
  const std::vector<int64_t> touched = {4, 31};  // the two smallest are held by the run
  std::vector<int64_t> out(5);
  EXPECT_EQ(select_victims(t, r, home, touched.data(), 2, 5, out.data()), 5);
  EXPECT_THAT(out, ElementsAre(6, 8, 1, 2, 9));  // scores 2, 3, 4, 4 (lower slot first), 5
  std::vector<int64_t> all(40);
  EXPECT_EQ(select_victims(t, r, home, touched.data(), 2, 40, all.data()), 30);
  EXPECT_THAT(std::vector<int64_t>(all.begin(), all.begin() + 5), ElementsAre(6, 8, 1, 2, 9));
}

TEST(Victims, OneVictimIsTheMinimumOfTheUntouchedSlotsInVictimOrder) {
  // select_victims with limit 1 against a brute-force minimum of
  // (victim score, score words, slot) and against the heap's first entry.
  uint64_t state = 12345;
  const auto next = [&](uint64_t m) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((state >> 33) % m);
  };
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t ns = 1 + static_cast<int32_t>(trial % 2);
    const bool with_victim_scores = trial % 4 >= 2;
    HostTable h({{64, 64}}, ns);
    for (auto& s : h.scores) s = next(4);  // few values: many ties
    std::vector<double> vs(64);
    for (auto& v : vs) v = static_cast<double>(next(3));
    std::vector<int64_t> touched;
    const int64_t density = trial % 5 == 4 ? 1 : 8;  // some trials touch every slot
    for (int64_t s = 0; s < 64; ++s) {
      if (next(density) == 0) touched.push_back(s);
    }
    TableRef t = h.ref();
    RunArgs r;
    if (with_victim_scores) r.victim_scores = vs.data();
    const Home home = home_of(t, 0, 1);
    int64_t expected = -1;
    const auto order = [&](int64_t s) {
      std::vector<int64_t> o = {with_victim_scores ? victim_rank_key(vs[s]) : 0};
      for (int32_t c = 0; c < ns; ++c) o.push_back(h.scores[s * ns + c]);
      o.push_back(s);
      return o;
    };
    for (int64_t s = 0; s < 64; ++s) {
      if (std::find(touched.begin(), touched.end(), s) != touched.end()) continue;
      if (expected < 0 || order(s) < order(expected)) expected = s;
    }
    std::vector<int64_t> one(1, -7), two(2, -7);
    const auto nt = static_cast<int64_t>(touched.size());
    ASSERT_EQ(select_victims(t, r, home, touched.data(), nt, 1, one.data()), expected < 0 ? 0 : 1);
    ASSERT_EQ(select_victims(t, r, home, touched.data(), nt, 2, two.data()),
              std::min<int64_t>(2, 64 - nt));
    if (expected >= 0) {
      EXPECT_EQ(one[0], expected) << "trial " << trial;
      EXPECT_EQ(two[0], expected) << "trial " << trial;
    } else {
      EXPECT_EQ(one[0], -7);  // nothing written
    }
  }
}

TEST(Scores, AccumulateSaturatesAtTheInt64Bounds) {
  EXPECT_EQ(add_saturating(INT64_MAX - 1, 5), INT64_MAX);
  EXPECT_EQ(add_saturating(INT64_MIN + 1, -5), INT64_MIN);
  EXPECT_EQ(add_saturating(-3, 5), 2);
  int64_t x = INT64_MAX - 2;
  atomic_add_saturating(&x, 7);
  EXPECT_EQ(x, INT64_MAX);
}

TEST(RunOps, InsertWithoutEvictionFailsOnFullBucket) {
  HostTable h({{16, 16}}, 1);
  Batch b;
  b.keys = iota_keys(17);
  b.run(h, RunOp::kInsert, ScoreArgs{});
  EXPECT_EQ(b.status[16], static_cast<int8_t>(InsertStatus::kFailed));
  EXPECT_EQ(h.counters[kCounterInsertFailures], 1);
  EXPECT_EQ(h.counters[kCounterSize], 16);
}

TEST(RunOps, DuplicateKeyFindsItsFirstSlotAndAccumulates) {
  HostTable h({{16, 16}}, 1);
  Batch b;
  b.keys = {5, 5, 5};
  std::vector<int64_t> s = {2, 3, 4};
  ScoreArgs a = assign_each(s);
  a.policy[0] = static_cast<int32_t>(ScorePolicy::kAccumulate);
  b.run(h, RunOp::kInsertEvict, a);
  EXPECT_THAT(b.slots, ElementsAre(0, 0, 0));
  EXPECT_THAT(b.status, ElementsAre(1, 0, 0));
  EXPECT_EQ(h.scores[0], 9);
}

TEST(RunOps, CompoundScoresEvictLeastFrequentThenOlder) {
  HostTable h({{16, 16}}, 2);
  Batch fill;
  fill.keys = iota_keys(16);
  std::vector<int64_t> s(32);
  for (int i = 0; i < 16; ++i) {
    s[2 * i] = 5;            // frequency
    s[2 * i + 1] = 100 + i;  // timestamp
  }
  s[2 * 3] = 2;
  s[2 * 3 + 1] = 500;  // rare but recent
  s[2 * 7] = 2;
  s[2 * 7 + 1] = 400;  // rare and older: the victim
  ScoreArgs a;
  a.policy[0] = a.policy[1] = static_cast<int32_t>(ScorePolicy::kAssign);
  a.values = s.data();
  a.value_row_stride = 2;
  fill.run(h, RunOp::kInsertEvict, a);
  Batch b;
  b.keys = {99};
  std::vector<int64_t> s2 = {1, 999};
  a.values = s2.data();
  b.run(h, RunOp::kInsertEvict, a);
  EXPECT_EQ(b.slots[0], 7);
  EXPECT_EQ(b.ev_keys[0], 8);
  EXPECT_THAT(std::vector<int64_t>(h.scores.begin() + 14, h.scores.begin() + 16),
              ElementsAre(1, 999));
}

TEST(RunOps, EraseFreesTheSlotAndCountsOnce) {
  HostTable h({{16, 16}}, 1);
  Batch fill;
  fill.keys = {1, 2, 3};
  fill.run(h, RunOp::kInsert, ScoreArgs{});
  Batch e;
  e.keys = {2, 2, 9};
  e.run(h, RunOp::kErase, ScoreArgs{});
  EXPECT_THAT(e.status, ElementsAre(0, 3, 3));
  EXPECT_EQ(h.keys[1], kEmptyKey);
  EXPECT_EQ(h.digests[1], empty_digest());
  EXPECT_EQ(h.counters[kCounterSize], 2);
  EXPECT_EQ(find_slot(h.ref(), 0, 2), -1);
  EXPECT_EQ(find_slot(h.ref(), 0, 3), 2);
}

TEST(RunOps, InvalidInputFormsNoRun) {
  HostTable h({{16, 16}}, 1);
  TableRef t = h.ref();
  EXPECT_EQ(sort_key_of(t, kEmptyKey, 0), INT64_MAX);
  EXPECT_EQ(sort_key_of(t, 5, 1), INT64_MAX);
  EXPECT_EQ(sort_key_of(t, 5, -1), INT64_MAX);
  EXPECT_EQ(find_one(t, ScoreArgs{}, 0, 5, 3, false), -1);
}

TEST(Rows, NoEvictionHandsOutFreeRowsTopFirstThenFresh) {
  HostTable h({{32, 16}}, 1, {32});
  TableRef t = h.ref();
  // Two rows on the free stack: 7 (bottom), 4 (top); next fresh row is 10.
  h.free_rows[0] = 7;
  h.free_rows[1] = 4;
  h.counters[kCounterFreeTop] = 2;
  h.counters[kCounterNextRow] = 10;
  EXPECT_EQ(row_for_rank(t, 0, 0), 4);
  EXPECT_EQ(row_for_rank(t, 0, 1), 7);
  EXPECT_EQ(row_for_rank(t, 0, 2), 10);
  EXPECT_EQ(row_for_rank(t, 0, 23), 31);
  EXPECT_EQ(row_for_rank(t, 0, 24), -1);  // row capacity 32 exhausted
  finish_row_allocation(t, 0, 3);
  EXPECT_EQ(h.counters[kCounterFreeTop], 0);
  EXPECT_EQ(h.counters[kCounterNextRow], 11);
}

TEST(Export, SelectsOccupiedSlotsAtOrAboveThreshold) {
  HostTable h({{16, 16}, {32, 16}}, 1);
  Batch b;
  b.keys = {1, 2, 3};
  b.tables = {0, 1, 1};
  std::vector<int64_t> s = {5, 1, 9};
  b.run(h, RunOp::kInsert, assign_each(s));
  TableRef t = h.ref();
  std::vector<int64_t> picked;
  for (int64_t slot = 0; slot < t.num_slots; ++slot) {
    if (export_selects(t, slot, 0, 5)) picked.push_back(h.keys[slot]);
  }
  std::sort(picked.begin(), picked.end());
  EXPECT_THAT(picked, ElementsAre(1, 3));
  EXPECT_EQ(table_of_slot(t, 15), 0);
  EXPECT_EQ(table_of_slot(t, 16), 1);
  EXPECT_EQ(table_of_slot(t, 47), 1);
}

}  // namespace
}  // namespace table
}  // namespace dyn_emb
