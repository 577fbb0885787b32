// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The tile runs of tile_run.h (the CUDA backend's insert and insert_and_evict)
// on the host, against run_keys (operations.h, the CPU backend's runs): the
// same slots, statuses, eviction records, scores out, row work, keys,
// digests, scores and counters, on random batches over full and partly full
// buckets of 16 to 1,024 slots, runs longer than a tile and than a bucket,
// repeated keys, ties, two score words, victim scores, releases, refused
// cold newcomers (refuse_cold) and NO_EVICTION tables.
//
// The tile's lanes are fibers on one thread. Between two collectives every
// lane runs once, in a random order; a lane's collective deposits its value
// in the buffer of the collective's generation (two, alternating) and yields,
// and reads the others' when it resumes. So a lane that reads what another
// wrote without a collective in between (a missing sync) sees it or not
// depending on the order, and the emulator checks that every lane reaches
// the same collectives in the same order, as a GPU tile must.
#include "cc/table/tile_run.h"

#include <gtest/gtest.h>
#include <ucontext.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cc/table/host_table_testing.h"
#include "cc/table/operations.h"

namespace dyn_emb {
namespace table {
namespace {

// T lanes as fibers (see the top of the file).
template <int T>
class Emulator {
 public:
  enum Kind : int { kSync = 1, kBallot, kShfl, kShflXor, kMatchAny, kReduceMin };

  class Tile {
   public:
    Tile(Emulator* e, int lane) : e_(e), lane_(lane) {}
    int lane() const { return lane_; }
    void sync() const { e_->put(lane_, kSync, 0); }
    unsigned ballot(bool p) const {
      const int b = e_->put(lane_, kBallot, p ? 1 : 0);
      unsigned m = 0;
      for (int j = 0; j < T; ++j) m |= static_cast<unsigned>(e_->vals_[b][j] & 1) << j;
      return m;
    }
    template <class V>
    V shfl(V v, int src) const {
      const int b = e_->put(lane_, kShfl, enc(v));
      return dec<V>(e_->vals_[b][src]);
    }
    template <class V>
    V shfl_xor(V v, int mask) const {
      const int b = e_->put(lane_, kShflXor, enc(v));
      return dec<V>(e_->vals_[b][lane_ ^ mask]);
    }
    template <class V>
    unsigned match_any(V v) const {
      const uint64_t mine = enc(v);
      const int b = e_->put(lane_, kMatchAny, mine);
      unsigned m = 0;
      for (int j = 0; j < T; ++j) m |= static_cast<unsigned>(e_->vals_[b][j] == mine) << j;
      return m;
    }
    unsigned reduce_min(unsigned v) const {
      const int b = e_->put(lane_, kReduceMin, v);
      unsigned m = v;
      for (int j = 0; j < T; ++j) m = std::min(m, static_cast<unsigned>(e_->vals_[b][j]));
      return m;
    }

   private:
    template <class V>
    static uint64_t enc(V v) {
      uint64_t x = 0;
      std::memcpy(&x, &v, sizeof(V));
      return x;
    }
    template <class V>
    static V dec(uint64_t x) {
      V v;
      std::memcpy(&v, &x, sizeof(V));
      return v;
    }
    Emulator* e_;
    int lane_;
  };

  explicit Emulator(uint64_t seed) : rng_(seed) {
    for (auto& s : stacks_) s.resize(1 << 18);
  }

  /// Runs body(tile) on the T lanes; returns an error, or "" when every lane
  /// reached the same collectives.
  std::string run(const std::function<void(const Tile&)>& body) {
    body_ = &body;
    for (int l = 0; l < T; ++l) {
      getcontext(&ctx_[l]);
      ctx_[l].uc_stack.ss_sp = stacks_[l].data();
      ctx_[l].uc_stack.ss_size = stacks_[l].size();
      ctx_[l].uc_link = &main_;
      makecontext(&ctx_[l], reinterpret_cast<void (*)()>(&Emulator::entry), 0);
      done_[l] = false;
      count_[l] = 0;
    }
    std::vector<int> order(T);
    std::iota(order.begin(), order.end(), 0);
    for (int64_t round = 0;; ++round) {
      std::shuffle(order.begin(), order.end(), rng_);
      for (const int l : order) {
        current_ = this;
        running_ = l;
        swapcontext(&main_, &ctx_[l]);
      }
      const int finished = static_cast<int>(std::count(done_, done_ + T, true));
      if (finished == T) return "";
      if (finished > 0) return "some lanes returned while others wait in a collective";
      const int b = static_cast<int>(round % 2);
      for (int l = 1; l < T; ++l) {
        if (kinds_[b][l] != kinds_[b][0]) {
          return "lanes reached different collectives in round " + std::to_string(round);
        }
      }
    }
  }

 private:
  static void entry() {
    Emulator* e = current_;
    const int l = e->running_;
    (*e->body_)(Tile(e, l));
    e->done_[l] = true;
  }

  // Deposits v for this lane's next collective and yields to the scheduler;
  // returns the buffer every lane's value of that collective is in.
  int put(int lane, int kind, uint64_t v) {
    const int b = static_cast<int>(count_[lane]++ % 2);
    vals_[b][lane] = v;
    kinds_[b][lane] = kind;
    swapcontext(&ctx_[lane], &main_);
    return b;
  }

  static inline Emulator* current_ = nullptr;
  int running_ = 0;
  std::mt19937_64 rng_;
  ucontext_t main_, ctx_[T];
  std::vector<char> stacks_[T];
  uint64_t vals_[2][T] = {};
  int kinds_[2][T] = {};
  int64_t count_[T] = {};
  bool done_[T] = {};
  const std::function<void(const Tile&)>* body_ = nullptr;
};

// A random batch over a random layout, and its run on both sides.
struct Scenario {
  std::vector<std::pair<int64_t, int64_t>> tables;  // (capacity, width)
  std::vector<int64_t> rows;                        // > 0: NO_EVICTION with that many rows
  int32_t ns = 1;
  RunOp op = RunOp::kInsertEvict;
  bool refuse_cold = false;
  bool assign_rows = false;
  int64_t release_at = kNoRelease;
  bool with_victim_scores = false;
  ScoreArgs score;
  std::vector<int64_t> values;  // (n, ns)
  std::vector<double> victim_scores;
  std::vector<uint8_t> held;  // RunArgs::held_slots when not empty
  std::vector<int64_t> keys, table_ids;
};

// The runs of a batch, given its order by (bucket, index): run_keys per run
// after the prefind (the reference), or the tiles of T lanes.
struct Side {
  HostTable h;
  RunOutputs out;
  std::vector<int64_t> scores_out;

  Side(const Scenario& s) : h(s.tables, s.ns, s.rows) {}

  RunArgs args(const Scenario& s, const std::vector<int32_t>& order) {
    const int64_t n = static_cast<int64_t>(s.keys.size());
    out.reset(n, s.ns, -7);
    out.order = order;
    scores_out.assign(n, -9);
    RunArgs r = out.args(s.op, s.keys.data(), s.table_ids.data(), s.score);
    r.assign_rows = s.assign_rows;
    r.refuse_cold = s.refuse_cold;
    r.release_at = s.release_at;
    r.scores_out = scores_out.data();
    r.victim_scores = s.with_victim_scores ? s.victim_scores.data() : nullptr;
    r.held_slots = s.held.empty() ? nullptr : s.held.data();
    bool rows = false;
    for (const int64_t x : s.rows) rows = rows || x > 0;
    if (!rows) r.row_work = nullptr;
    return r;
  }
};

void reference(Side& side, const Scenario& s, const std::vector<int32_t>& order,
               const std::vector<int64_t>& sk, int64_t total_buckets) {
  RunArgs r = side.args(s, order);
  TableRef t = side.h.ref();
  const int64_t n = static_cast<int64_t>(s.keys.size());
  for (int64_t i = 0; i < n; ++i) r.slots[i] = resident_slot(t, s.keys[i], s.table_ids[i]);
  int64_t b = 0;
  while (b < n) {
    if (sk[b] == total_buckets) {
      const int32_t i = order[b];
      r.slots[i] = -1;
      r.status[i] = static_cast<int8_t>(InsertStatus::kInvalid);
      if (r.row_work) r.row_work[i] = -1;
      ++b;
      continue;
    }
    int64_t e = b + 1;
    while (e < n && sk[e] == sk[b]) ++e;
    process_run(t, r, b, e);
    b = e;
  }
}

template <int T, int NK>
std::string tiles(Side& side, const Scenario& s, const std::vector<int32_t>& order,
                  const std::vector<int64_t>& sk, int64_t total_buckets, uint64_t seed) {
  RunArgs r = side.args(s, order);
  TableRef t = side.h.ref();
  const int64_t n = static_cast<int64_t>(s.keys.size());
  Emulator<T> emu(seed);
  return emu.run([&](const typename Emulator<T>::Tile& g) {
    for (int64_t p = 0; p < n; ++p) {
      int64_t table = -1;
      RunDeltas d;
      if (tile_run_at<T, NK>(g, t, r, sk, p, n, total_buckets, true, &table, &d) && g.lane() == 0) {
        add_deltas(t, table, d);
      }
    }
  });
}

Scenario random_scenario(std::mt19937_64& rng) {
  const auto pick = [&](int64_t m) {
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(m));
  };
  Scenario s;
  const int64_t widths[] = {16, 48, 128, 256, 1024};
  const int num_tables = 1 + static_cast<int>(pick(3));
  for (int k = 0; k < num_tables; ++k) {
    const int64_t w = widths[pick(5)];
    s.tables.push_back({w * (1 + pick(w > 256 ? 2 : 6)), w});
    s.rows.push_back(pick(5) == 0 ? s.tables.back().first / 2 + pick(s.tables.back().first) : 0);
  }
  s.ns = 1 + static_cast<int32_t>(pick(2));
  s.op = pick(4) == 0 ? RunOp::kInsert : RunOp::kInsertEvict;
  s.with_victim_scores = pick(3) == 0;
  const bool release = pick(4) == 0;
  for (int32_t c = 0; c < s.ns; ++c) {
    s.score.policy[c] = static_cast<int32_t>(release && c == 0 ? ScorePolicy::kAccumulate
                                                               : static_cast<ScorePolicy>(pick(4)));
  }
  s.score.host_now = 1000 + pick(3);
  if (release) s.release_at = 3 + pick(4);
  s.assign_rows = pick(3) == 0;
  int64_t slots = 0;
  for (const auto& tw : s.tables) slots += tw.first;
  // Few keys and scores: repeats and ties.
  const int64_t key_range = 1 + slots / 2 + pick(slots * 2);
  const int64_t n = 1 + pick(std::min<int64_t>(2 * slots, 1500));
  for (int64_t i = 0; i < n; ++i) {
    s.keys.push_back(pick(10) == 0 ? kEmptyKey + pick(4) : 1 + pick(key_range));
    s.table_ids.push_back(pick(20) == 0 ? num_tables : pick(num_tables));
    for (int32_t c = 0; c < s.ns; ++c) s.values.push_back(pick(4) - (pick(8) == 0 ? 2 : 0));
  }
  if (s.assign_rows) {
    // Rows for NO_EVICTION tables: mostly valid, some out of range.
    for (int64_t i = 0; i < n; ++i) s.values[i * s.ns] = pick(40) - 3;
  }
  s.score.values = s.values.data();
  s.score.value_row_stride = s.ns;
  s.victim_scores.resize(slots);
  for (auto& v : s.victim_scores) v = pick(7) == 0 ? std::nan("") : static_cast<double>(pick(3));
  s.refuse_cold = pick(3) == 0;
  if (pick(3) == 0) {  // a third of the slots held by the call
    s.held.resize(slots);
    for (auto& h : s.held) h = pick(3) == 0 ? static_cast<uint8_t>(1 + pick(255)) : 0;
  }
  return s;
}

::testing::AssertionResult same(const Side& a, const Side& b) {
  const auto fail = [](const std::string& what) { return ::testing::AssertionFailure() << what; };
  if (a.out.slots != b.out.slots) return fail("slots");
  if (a.out.status != b.out.status) return fail("status");
  if (a.scores_out != b.scores_out) return fail("scores_out");
  if (a.out.row_work != b.out.row_work) return fail("row_work");
  if (a.out.ev_flags != b.out.ev_flags) return fail("ev_flags");
  const size_t n = a.out.ev_flags.size();
  const size_t ns = static_cast<size_t>(a.h.num_scores);
  for (size_t p = 0; p < n; ++p) {
    if (!a.out.ev_flags[p]) continue;
    if (a.out.ev_keys[p] != b.out.ev_keys[p] || a.out.ev_slots[p] != b.out.ev_slots[p] ||
        a.out.ev_tables[p] != b.out.ev_tables[p]) {
      return fail("eviction record at " + std::to_string(p));
    }
    for (size_t c = 0; c < ns; ++c) {
      if (a.out.ev_scores[p * ns + c] != b.out.ev_scores[p * ns + c]) return fail("ev_scores");
    }
  }
  if (a.h.keys != b.h.keys) return fail("keys");
  if (a.h.digests != b.h.digests) return fail("digests");
  if (a.h.scores != b.h.scores) return fail("scores");
  if (a.h.counters != b.h.counters) return fail("counters");
  return ::testing::AssertionSuccess();
}

// One batch of `s` on both sides, from the same state, which they must
// leave the same.
template <int T>
::testing::AssertionResult same_batch(Side& ref, Side& tile, const Scenario& s, uint64_t seed) {
  TableRef t = ref.h.ref();
  const int64_t n = static_cast<int64_t>(s.keys.size());
  const int64_t total = ref.h.total_buckets();
  std::vector<int64_t> key_of(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x = sort_key_of(t, s.keys[i], s.table_ids[i]);
    key_of[i] = x == INT64_MAX ? total : x;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key_of[a] < key_of[b]; });
  std::vector<int64_t> sk(n);
  for (int64_t q = 0; q < n; ++q) sk[q] = key_of[order[q]];
  reference(ref, s, order, sk, total);
  const bool words = s.ns > 1 || s.with_victim_scores;
  const std::string err = words ? tiles<T, kVictimWords>(tile, s, order, sk, total, seed)
                                : tiles<T, 1>(tile, s, order, sk, total, seed);
  if (!err.empty()) return ::testing::AssertionFailure() << err;
  return same(ref, tile);
}

// Batches on random scenarios' tables (see random_scenario).
template <int T>
void check_random(uint64_t seed, int scenarios) {
  std::mt19937_64 rng(seed);
  int64_t refused = 0;  // the scenarios refuse some keys
  for (int k = 0; k < scenarios; ++k) {
    Scenario s = random_scenario(rng);
    Side ref(s), tile(s);
    for (int step = 0; step < 3; ++step) {
      if (step > 0) {
        // The next batch: the same keys shuffled, a third of them new.
        std::shuffle(s.keys.begin(), s.keys.end(), rng);
        for (size_t i = 0; i < s.keys.size(); i += 3) {
          s.keys[i] = 1 + static_cast<int64_t>(rng() % 100000);
        }
        for (auto& v : s.values) v = static_cast<int64_t>(rng() % 5);
        if (s.assign_rows) {
          for (size_t i = 0; i < s.keys.size(); ++i) {
            s.values[i * s.ns] = static_cast<int64_t>(rng() % 40) - 3;
          }
        }
      }
      ASSERT_TRUE(same_batch<T>(ref, tile, s, seed + k * 31 + step))
          << "T " << T << " scenario " << k << " step " << step << " n " << s.keys.size() << " ns "
          << s.ns << " op " << static_cast<int>(s.op) << " release " << s.release_at
          << " refuse_cold " << s.refuse_cold << " held " << !s.held.empty();
      refused += std::count(tile.out.status.begin(), tile.out.status.end(),
                            static_cast<int8_t>(InsertStatus::kRefused));
    }
  }
  EXPECT_GT(refused, 0);
}

// A batch of one key per entry into one table of `width` slots.
Scenario one_table(int64_t width, std::vector<int64_t> keys, std::vector<int64_t> values,
                   int64_t rows = 0) {
  Scenario s;
  s.tables = {{width, width}};
  s.rows = {rows};
  s.keys = std::move(keys);
  s.table_ids.assign(s.keys.size(), 0);
  s.values = std::move(values);
  s.score.values = s.values.data();
  s.score.value_row_stride = 1;
  return s;
}

template <int T>
void check_repeats() {
  // NO_EVICTION with assigned rows: the first occurrence's row is out of
  // range (kInvalid), the second places the key, the third finds it.
  Scenario rows = one_table(16, {5, 7, 5, 5, 9}, {-1, 2, 3, 4, 6}, 20);
  rows.assign_rows = true;
  rows.op = RunOp::kInsert;
  rows.score.policy[0] = static_cast<int32_t>(ScorePolicy::kAssign);
  Side ref(rows), tile(rows);
  ASSERT_TRUE(same_batch<T>(ref, tile, rows, 1));
  EXPECT_EQ(tile.out.status, (std::vector<int8_t>{4, 1, 1, 0, 1}));
  EXPECT_EQ(tile.out.slots[3], tile.out.slots[2]);
  // Counts that reach 3 leave (the admission counter): the second
  // occurrence frees the slot the first took, the third takes it again, the
  // fourth finds it; a long run repeats them across chunks.
  std::vector<int64_t> keys = {9, 9, 9, 9}, freq = {1, 2, 1, 1};
  for (int64_t k = 0; k < 70; ++k) {
    keys.push_back(100 + k % 30);
    freq.push_back(1 + k % 2);
  }
  Scenario counts = one_table(32, keys, freq);
  counts.release_at = 3;
  counts.score.policy[0] = static_cast<int32_t>(ScorePolicy::kAccumulate);
  Side cref(counts), ctile(counts);
  ASSERT_TRUE(same_batch<T>(cref, ctile, counts, 2));
  EXPECT_EQ(std::vector<int8_t>(ctile.out.status.begin(), ctile.out.status.begin() + 4),
            (std::vector<int8_t>{1, 5, 1, 0}));
  ASSERT_TRUE(same_batch<T>(cref, ctile, counts, 3));
}

template <int T>
void check_refusals() {
  // A full bucket of 16 keys scored 5 (ASSIGN); refuse_cold: a newcomer
  // below 5 is refused and the victim, the lowest slot, stays for the next;
  // a repeat of a refused key is refused again; at 5 or above it evicts.
  std::vector<int64_t> keys, values;
  for (int64_t k = 0; k < 16; ++k) {
    keys.push_back(1000 + k);
    values.push_back(5 + (k == 3 ? 1 : 0));
  }
  Scenario s = one_table(16, keys, values);
  s.score.policy[0] = static_cast<int32_t>(ScorePolicy::kAssign);
  s.refuse_cold = true;
  Side ref(s), tile(s);
  ASSERT_TRUE(same_batch<T>(ref, tile, s, 4));
  s.keys = {1, 2, 1, 3, 4, 5, 6, 7, 8, 2};
  s.values = {3, 5, 3, 4, 9, 0, 6, 1, 2, 7};
  s.table_ids.assign(s.keys.size(), 0);
  s.score.values = s.values.data();
  ASSERT_TRUE(same_batch<T>(ref, tile, s, 5));
  constexpr int8_t kR = static_cast<int8_t>(InsertStatus::kRefused);
  constexpr int8_t kE = static_cast<int8_t>(InsertStatus::kEvicted);
  constexpr int8_t kF = static_cast<int8_t>(InsertStatus::kFound);
  EXPECT_EQ(tile.out.status, (std::vector<int8_t>{kR, kE, kR, kR, kE, kR, kE, kR, kR, kF}));
  EXPECT_EQ(tile.out.slots[0], -1);
  EXPECT_EQ(tile.out.slots[3], -1);
  // Victims in slot order among the 5s (1003 holds 6), nothing skipped.
  std::vector<int64_t> victims;
  for (size_t p = 0; p < tile.out.ev_flags.size(); ++p) {
    if (tile.out.ev_flags[p]) victims.push_back(tile.out.ev_keys[p]);
  }
  EXPECT_EQ(victims, (std::vector<int64_t>{1000, 1001, 1002}));
  EXPECT_EQ(tile.h.counters[kCounterEvictions], 3);
  EXPECT_EQ(tile.h.counters[kCounterInsertFailures], 0);
  EXPECT_EQ(tile.h.counters[kCounterSize], 16);
}

template <int T>
void check_held() {
  // A full bucket of 16 keys scored by slot (the victim order is the slots'
  // order); the call holds the six lowest and two others: eight new keys
  // evict the eight untouched ones in order, two more fail.
  std::vector<int64_t> keys, values;
  for (int64_t k = 0; k < 16; ++k) {
    keys.push_back(1000 + k);
    values.push_back(10 + k);
  }
  Scenario s = one_table(16, keys, values);
  s.score.policy[0] = static_cast<int32_t>(ScorePolicy::kAssign);
  Side ref(s), tile(s);
  ASSERT_TRUE(same_batch<T>(ref, tile, s, 6));
  std::vector<int64_t> slot_of(16);
  for (int64_t k = 0; k < 16; ++k) slot_of[k] = tile.out.slots[k];
  s.held.assign(16, 0);
  for (int64_t k : {0, 1, 2, 3, 4, 5, 9, 12}) s.held[slot_of[k]] = 1;
  s.keys.clear();
  s.values.clear();
  for (int64_t k = 0; k < 10; ++k) {
    s.keys.push_back(1 + k);
    s.values.push_back(1);
  }
  s.table_ids.assign(s.keys.size(), 0);
  s.score.values = s.values.data();
  ASSERT_TRUE(same_batch<T>(ref, tile, s, 7));
  std::vector<int64_t> victims;
  for (size_t p = 0; p < tile.out.ev_flags.size(); ++p) {
    if (tile.out.ev_flags[p]) victims.push_back(tile.out.ev_keys[p]);
  }
  std::sort(victims.begin(), victims.end());
  EXPECT_EQ(victims, (std::vector<int64_t>{1006, 1007, 1008, 1010, 1011, 1013, 1014, 1015}));
  constexpr int8_t kE = static_cast<int8_t>(InsertStatus::kEvicted);
  constexpr int8_t kX = static_cast<int8_t>(InsertStatus::kFailed);
  EXPECT_EQ(tile.out.status, (std::vector<int8_t>{kE, kE, kE, kE, kE, kE, kE, kE, kX, kX}));
  for (int64_t k : {0, 1, 2, 3, 4, 5, 9, 12}) {
    EXPECT_EQ(tile.h.keys[slot_of[k]], 1000 + k);
    EXPECT_EQ(tile.h.scores[slot_of[k]], 10 + k);
  }
  EXPECT_EQ(tile.h.counters[kCounterInsertFailures], 2);
}

TEST(TileRun, HeldSlotsAreNeverVictimsAsInTheSequentialRuns) {
  check_held<4>();
  check_held<8>();
  check_held<16>();
  check_held<32>();
}

TEST(TileRun, RefusesColdNewcomersAsTheSequentialRuns) {
  check_refusals<4>();
  check_refusals<8>();
  check_refusals<16>();
  check_refusals<32>();
}

TEST(TileRun, RepeatsAfterAnInvalidOrReleasedOccurrence) {
  check_repeats<4>();
  check_repeats<8>();
  check_repeats<16>();
  check_repeats<32>();
}

TEST(TileRun, FourLanesMatchTheSequentialRuns) { check_random<4>(10, 40); }
TEST(TileRun, EightLanesMatchTheSequentialRuns) { check_random<8>(11, 40); }
TEST(TileRun, SixteenLanesMatchTheSequentialRuns) { check_random<16>(12, 30); }
TEST(TileRun, ThirtyTwoLanesMatchTheSequentialRuns) { check_random<32>(13, 30); }

TEST(TileRun, GeometryMapsEveryPositionToOneLaneAndBit) {
  const auto check = [](auto geo) {
    using G = decltype(geo);
    std::vector<int> seen(kTileMaxWidth, 0);
    for (int lane = 0; lane < static_cast<int>(kTileRow) / G::G; ++lane) {
      for (int bit = 0; bit < G::kBits; ++bit) {
        const int pos = G::position(lane, bit);
        ASSERT_LT(pos, kTileMaxWidth);
        ++seen[pos];
        EXPECT_EQ(G::lane_of(pos), lane);
        EXPECT_EQ(G::bit_of(pos), bit);
      }
    }
    for (const int x : seen) EXPECT_EQ(x, 1);
  };
  check(TileGeometry<4>{});
  check(TileGeometry<8>{});
  check(TileGeometry<16>{});
  check(TileGeometry<32>{});
}

}  // namespace
}  // namespace table
}  // namespace dyn_emb
