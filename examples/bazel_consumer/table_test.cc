// dynamicemb's hash table used from C++ in another workspace: the CPU backend
// (@dynamicemb//cc/table:table_cpu) over a table held in host vectors.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cc/table/host_table_testing.h"
#include "cc/table/table_cpu.h"
#include "cc/table/types.h"

namespace {

using dyn_emb::table::HostTable;
using dyn_emb::table::InsertStatus;
using dyn_emb::table::RunOp;
using dyn_emb::table::RunOutputs;
using dyn_emb::table::ScoreArgs;
using dyn_emb::table::ScorePolicy;
namespace cpu = dyn_emb::table::cpu;

// One insert (or insert_and_evict) of `keys` into table 0, LFU scores: each
// key's score grows by its value in `scores`. Returns the keys it evicted.
std::vector<int64_t> insert(HostTable& t, RunOp op, const std::vector<int64_t>& keys,
                            const std::vector<int64_t>& scores, RunOutputs& out) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const std::vector<int64_t> tables(n, 0);
  std::vector<int64_t> scratch(n);
  ScoreArgs score;
  score.policy[0] = static_cast<int32_t>(ScorePolicy::kAccumulate);
  score.values = scores.data();
  score.value_row_stride = 1;
  out.reset(n, t.num_scores);
  const int64_t evicted = cpu::run_op(t.ref(), out.args(op, keys.data(), tables.data(), score), n,
                                      t.total_buckets(), scratch.data());
  return {out.ev_keys.begin(), out.ev_keys.begin() + evicted};
}

std::vector<int64_t> find(HostTable& t, const std::vector<int64_t>& keys) {
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int64_t> tables(n, 0), slots(n, -2);
  cpu::find(t.ref(), ScoreArgs{}, keys.data(), tables.data(), n, /*update=*/false, slots.data());
  return slots;
}

TEST(ConsumerTable, InsertedKeysAreFoundInTheirSlots) {
  HostTable t({{256, 32}}, /*num_scores=*/1);
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 40; ++k) keys.push_back(1000003 * k + 17);
  const std::vector<int64_t> ones(keys.size(), 1);
  RunOutputs ins;
  insert(t, RunOp::kInsert, keys, ones, ins);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(ins.status[i], static_cast<int8_t>(InsertStatus::kInserted)) << keys[i];
    ASSERT_GE(ins.slots[i], 0) << keys[i];
    EXPECT_EQ(t.keys[ins.slots[i]], keys[i]);
  }
  EXPECT_EQ(find(t, keys), ins.slots);
  std::vector<int64_t> size(1);
  cpu::count(t.ref(), size.data());
  EXPECT_EQ(size[0], 40);
  EXPECT_EQ(find(t, {5, 6}), (std::vector<int64_t>{-1, -1}));

  // The same keys again are found where they are, and nothing is added.
  RunOutputs again;
  insert(t, RunOp::kInsert, keys, ones, again);
  EXPECT_EQ(again.slots, ins.slots);
  for (int8_t s : again.status) EXPECT_EQ(s, static_cast<int8_t>(InsertStatus::kFound));
  cpu::count(t.ref(), size.data());
  EXPECT_EQ(size[0], 40);
}

TEST(ConsumerTable, AFullBucketEvictsItsLeastFrequentKey) {
  HostTable t({{16, 16}}, /*num_scores=*/1);  // one bucket of 16 slots
  std::vector<int64_t> keys, scores;
  for (int64_t k = 0; k < 16; ++k) {
    keys.push_back(100 + k);
    scores.push_back(k == 9 ? 1 : 5 + k);  // key 109 is the least frequent
  }
  RunOutputs out;
  insert(t, RunOp::kInsert, keys, scores, out);
  EXPECT_TRUE(insert(t, RunOp::kInsert, {500}, {50}, out).empty());
  EXPECT_EQ(out.status[0], static_cast<int8_t>(InsertStatus::kFailed));
  EXPECT_EQ(insert(t, RunOp::kInsertEvict, {500}, {50}, out), (std::vector<int64_t>{109}));
  EXPECT_EQ(out.status[0], static_cast<int8_t>(InsertStatus::kEvicted));
  EXPECT_EQ(find(t, {109, 500}), (std::vector<int64_t>{-1, out.slots[0]}));
}

}  // namespace
