// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// insert and insert_and_evict of one bucket run by a tile of T lanes: the
// CUDA backend's run kernel (a tile per run, every lane on the whole bucket),
// written against a Tile of collectives so that the tests run it on the host
// too (a thread per lane). Its results are run_keys' (operations.h) bit for
// bit: the same slots, statuses, eviction records, scores and counters.
//
// # Geometry
//
// A bucket of W <= kTileMaxWidth slots is read in rows of kTileRow (128);
// lane l owns the G = 128 / T slots row * 128 + l * G + [0, G) of each row,
// bit row * G + s of its masks: 32 digests (four 8-byte words) per lane for
// T = 4, 16 for T = 8, 8 for T = 16, 4 for T = 32, read coalesced. A lane
// tracks its slots in two masks:
//   emp   may be empty: the digest is the empty digest (a key's digest can be
//         too: the slot's key, read when the slot's turn comes, confirms), or
//         freed by a release;
//   cand  a victim candidate: held a key when the run started, neither held
//         by the call (RunArgs::held_slots) nor found or filled by the run
//         since (a slot the run holds is never a victim).
// The victims of a full bucket are its candidates in victim order
// (victim_words / victim_before, scores.h).
//
// # A run
//
// The run's keys are taken T at a time, lane j holding sorted position
// begin + c * T + j of chunk c:
//  1. every key is looked up in the bucket as it is (each lane scans the whole
//     bucket's digests and reads the keys of four matching slots at a time),
//     which is the prefind (a key is never moved, only freed, before its turn);
//     found keys apply their policies, repeats of one slot one after another in
//     batch order; found slots become held, released ones empty. A key whose
//     digest the bucket lacks is new: the key of the lowest slot that may be
//     empty is read ahead for it, with the other keys' candidates, or, in a full
//     bucket of insert_and_evict, the lanes' score words are fetched into L1 for
//     the victims;
//  2. the new keys in batch order, decided one after another by the whole
//     tile (no memory access but the confirmation of an empty slot): a repeat
//     of a key the run placed finds it (in chunk 0 from the lane of its
//     previous occurrence, in later chunks by a scan of the bucket where a
//     key the run placed has its digest); else the lowest empty slot (a
//     reduction over the lanes), else the next victim (32-bit reductions of
//     the lanes' best candidates in victim order; each lane keeps its first
//     one, the later ones with the same words and the first with other words
//     from one scan of its slots, and scans again only after giving those),
//     else failure. With refuse_cold a new key colder than that
//     victim is refused instead (colder_than, operations.h,
//     "Refusal") and the victim stays the next one. Then every lane writes its
//     own key, record and results at once, and the repeats apply their
//     policies in batch order.
// A chunk with a repeat of a stored key in a call that releases (the
// admission counter: a repeat may free its slot, and the next key take it)
// writes each key in its turn instead.
//
// Buckets wider than kTileMaxWidth, erase and place are run by run_keys
// (one thread per run, given the prefind).
#pragma once

#include <cstdint>

#include "cc/common/host_device.h"
#include "cc/table/hash.h"
#include "cc/table/layout.h"
#include "cc/table/operations.h"
#include "cc/table/scores.h"
#include "cc/table/table_ref.h"
#include "cc/table/types.h"

#if defined(__CUDACC__)
#define DEMB_TILE __device__ inline
#define DEMB_TILE_UNROLL _Pragma("unroll")
#else
#define DEMB_TILE inline
#define DEMB_TILE_UNROLL
#endif

namespace dyn_emb {
namespace table {

/// Slots of a row of a tile's bucket.
constexpr int64_t kTileRow = 128;
/// The widest bucket a tile keeps in its masks.
constexpr int64_t kTileMaxWidth = 1024;

/// Which slots lane `lane` of a tile of T lanes owns (see "Geometry").
template <int T>
struct TileGeometry {
  static_assert(T == 4 || T == 8 || T == 16 || T == 32, "tiles of 4, 8, 16 or 32 lanes");
  static constexpr int G = static_cast<int>(kTileRow) / T;           ///< slots per lane and row
  static constexpr int kBits = static_cast<int>(kTileMaxWidth) / T;  ///< bits per lane
  /// Position in the bucket of bit `bit` of lane `lane`.
  static DEMB_HD int position(int lane, int bit) {
    return (bit / G) * static_cast<int>(kTileRow) + lane * G + bit % G;
  }
  static DEMB_HD int lane_of(int pos) { return (pos % static_cast<int>(kTileRow)) / G; }
  static DEMB_HD int bit_of(int pos) { return pos / static_cast<int>(kTileRow) * G + pos % G; }
};

/// N bits (32 to 256) in up to four 64-bit words, addressed without a
/// run-time array index (which would put the whole run's state in local
/// memory on the GPU).
template <int N>
struct TileBits {
  static constexpr int kWords = (N + 63) / 64;
  static_assert(kWords <= 4, "at most 256 bits");
  uint64_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;

  /// Calls f(word) with the word holding bit b.
  template <class F>
  DEMB_HD void at(int b, const F& f) {
    const int k = b >> 6;
    if (kWords == 1 || k == 0) {
      f(w0);
    } else if (kWords == 2 || k == 1) {
      f(w1);
    } else if (kWords == 3 || k == 2) {
      f(w2);
    } else {
      f(w3);
    }
  }
  DEMB_HD bool test(int b) const {
    const int k = b >> 6;
    const uint64_t x = kWords == 1 || k == 0 ? w0 : kWords == 2 || k == 1 ? w1 : k == 2 ? w2 : w3;
    return x >> (b & 63) & 1;
  }
  DEMB_HD void set(int b) {
    at(b, [&](uint64_t& x) { x |= uint64_t{1} << (b & 63); });
  }
  DEMB_HD void clear(int b) {
    at(b, [&](uint64_t& x) { x &= ~(uint64_t{1} << (b & 63)); });
  }
  /// ORs `bits` in at bit `first` (the bits do not cross a word).
  DEMB_HD void put(int first, uint64_t bits) {
    at(first, [&](uint64_t& x) { x |= bits << (first & 63); });
  }
  /// The lowest set bit, or -1.
  DEMB_HD int lowest() const {
    if (w0) return ctz64(w0);
    if (kWords > 1 && w1) return 64 + ctz64(w1);
    if (kWords > 2 && w2) return 128 + ctz64(w2);
    if (kWords > 3 && w3) return 192 + ctz64(w3);
    return -1;
  }
};

/// Lanes below `lane`, as a mask of a tile's lanes.
DEMB_HD unsigned lanes_below(int lane) { return (1u << lane) - 1u; }

/// The highest set bit of x, or -1.
DEMB_HD int highest_bit(unsigned x) { return x ? 31 - clz32(x) : -1; }

/// A victim candidate: its words in the victim order (NK of them: the score
/// word alone for one word and no victim scores, else kVictimWords) and its
/// position in the bucket (-1: none).
template <int NK>
struct TileVictim {
  int64_t w[NK] = {};
  int pos = -1;
};

/// Whether candidate a goes before b in the victim order (none last). With
/// NK == kVictimWords it is victim_before; with one word (one score word, no
/// victim scores) the same order, its other words being equal.
template <int NK>
DEMB_HD bool tile_victim_before(const TileVictim<NK>& a, const TileVictim<NK>& b) {
  if (b.pos < 0) return a.pos >= 0;
  if (a.pos < 0) return false;
  if constexpr (NK == kVictimWords) {
    return victim_before(a.w, a.pos, b.w, b.pos);
  } else {
    return a.w[0] != b.w[0] ? a.w[0] < b.w[0] : a.pos < b.pos;
  }
}

/// A run's counter changes, as RunDeltas (a run has at most 2^31 keys).
struct TileDeltas {
  int32_t size = 0, failures = 0, evictions = 0, inserts = 0;
  DEMB_HD RunDeltas deltas() const { return RunDeltas{size, failures, evictions, inserts}; }
};

/// One batch entry of a chunk, held by its lane.
struct TileEntry {
  bool has = false;  ///< the lane holds a position of the run
  int32_t i = 0;     ///< batch index
  int64_t key = 0;
  uint8_t digest = 0;
  int8_t status = 0;  ///< after step 1: kFound, kReleased, or kInserted for a new key
};

/// One run by a tile (see the top of the file). Tile: a group of T lanes
/// with lane(), sync(), ballot(bool), shfl(v, src), shfl_xor(v, mask),
/// match_any(int64_t) and reduce_min(unsigned), every collective reached by
/// all lanes. NK: see TileVictim.
template <int T, int NK, class Tile>
class TileRun {
 public:
  using Geo = TileGeometry<T>;
  using Bits = TileBits<Geo::kBits>;

  DEMB_TILE TileRun(const Tile& g, const TableRef& t, const RunArgs& r, int64_t begin, int64_t end,
                    int64_t table, const Home& h, bool records)
      : g_(g),
        t_(t),
        r_(r),
        begin_(static_cast<int32_t>(begin)),
        end_(static_cast<int32_t>(end)),
        table_(static_cast<int32_t>(table)),
        start_(h.start),
        width_(static_cast<int32_t>(h.width)),
        records_(records) {
    lane_ = g.lane();
    no_evict_ =
        t.info[table * kInfoCols + kInfoMode] == static_cast<int64_t>(TableMode::kNoEviction);
    evict_ = r.op == RunOp::kInsertEvict && !no_evict_;
    release_ = !no_evict_ && r.release_at != kNoRelease;
  }

  /// Processes the run, given its first chunk's entries (entry() of each
  /// lane's position); returns its counter changes (the same in every lane).
  DEMB_TILE RunDeltas run(const TileEntry& first) {
    read_digests();
    if (end_ - begin_ <= T) {
      TileEntry e = first;
      find_resident(e, false);
      place_new(e, true);
      return d_.deltas();
    }
    for (int64_t c = begin_; c < end_; c += T) {
      TileEntry e = c == begin_ ? first : entry(r_, c + lane_, end_);
      find_resident(e, true);
    }
    for (int64_t c = begin_; c < end_; c += T) {
      TileEntry e = entry(r_, c + lane_, end_);
      if (e.has) e.status = r_.status[e.i];
      place_new(e, c == begin_);
    }
    return d_.deltas();
  }

  /// The entry at sorted position q (has: q < end, the run's end).
  static DEMB_TILE TileEntry entry(const RunArgs& r, int64_t q, int64_t end) {
    TileEntry e;
    e.has = q < end;
    if (e.has) {
      e.i = r.order[q];
      e.key = r.keys[e.i];
      e.digest = digest_of_hash(bucket_hash(static_cast<uint64_t>(e.key)));
    }
    return e;
  }

 private:
  static constexpr unsigned kNone = 0xffffffffu;
  /// Bits of the filter of the digests a run placed (place_new).
  static constexpr int kPlacedBits = 128;

  /// emp and cand from this lane's digests (and the held slots), G of them
  /// per row.
  DEMB_TILE void read_digests() {
    constexpr int G = Geo::G;
    const uint8_t empty = empty_digest();
    DEMB_TILE_UNROLL
    for (int row = 0; row < static_cast<int>(kTileMaxWidth / kTileRow); ++row) {
      const int64_t off = row * kTileRow + lane_ * G;
      if (off >= width_) continue;
      const uint8_t* d = t_.digests + start_ + off;
      // The slots of the group in the bucket: all of them unless G (32)
      // exceeds the width's multiple of 16.
      const int in = width_ - off < G ? static_cast<int>(width_ - off) : G;
      // bit s: slot off + s has the empty digest; is held by the call
      const uint64_t e = byte_bits(d, in, [&](uint8_t x) { return x == empty; });
      const uint64_t held =
          r_.held_slots ? byte_bits(r_.held_slots + start_ + off, in, [](uint8_t x) { return x; })
                        : 0;
      const uint64_t mask = in == 64 ? ~uint64_t{0} : (uint64_t{1} << in) - 1;
      emp_.put(row * G, e & mask);
      cand_.put(row * G, ~(e | held) & mask);
    }
  }

  /// Bit s: p(b[s]) for the lane's G bytes of a row at b (s < in; digests,
  /// held slots), read eight at a time.
  template <class P>
  static DEMB_TILE uint64_t byte_bits(const uint8_t* b, int in, const P& p) {
    constexpr int G = Geo::G;
    uint64_t bits = 0;
    DEMB_TILE_UNROLL
    for (int q = 0; q < (G + 7) / 8; ++q) {
      uint64_t word = 0;
      if constexpr (G >= 8) {
        if (q * 8 < in) word = reinterpret_cast<const uint64_t*>(b)[q];
      } else {
        word = *reinterpret_cast<const uint32_t*>(b);
      }
      DEMB_TILE_UNROLL
      for (int k = 0; k < (G < 8 ? G : 8); ++k) {
        bits |= static_cast<uint64_t>(p(static_cast<uint8_t>(word >> (8 * k))) ? 1 : 0)
                << (8 * q + k);
      }
    }
    return bits;
  }

  /// The lane's slots' score words (and victim scores) into L1, for the
  /// victims of a full bucket.
  DEMB_TILE void fetch_scores() const {
#if defined(__CUDA_ARCH__)
    constexpr int G = Geo::G;
    const int64_t ns = t_.num_scores;
    for (int row = 0; row < static_cast<int>(kTileMaxWidth / kTileRow); ++row) {
      const int64_t off = row * kTileRow + lane_ * G;
      if (off >= width_) break;
      const int64_t first = start_ + off;
      const int64_t in = width_ - off < G ? width_ - off : G;
      for (int64_t b = 0; b < in * ns * 8; b += 128) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(
            reinterpret_cast<const char*>(t_.scores + first * ns) + b));
      }
      if (r_.victim_scores) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(r_.victim_scores + first));
      }
    }
#endif
  }

  /// Position of `key` in the bucket as it is now, or -1 (inactive lanes:
  /// -1). Each lane reads the bucket's digests 32 slots at a time (read_digests
  /// brought them to L1) and holds the positions whose digest is its key's,
  /// kHeld of them, then reads their keys together: one wait for a key's
  /// slots, where reading each key as its digest matched waited once per
  /// match (about five in a full bucket of 1,024 slots, and the tile waits on
  /// the slowest lane each time). `seen` (where given): whether `digest` is
  /// among the bucket's (a lane that does not find its key reads them all).
  DEMB_TILE int probe(int64_t key, uint8_t digest, bool active, bool* seen = nullptr) const {
    constexpr int kHeld = 4;    // positions whose keys are read together
    constexpr int kGroup = 32;  // slots whose digests are read together
    const uint64_t* d = reinterpret_cast<const uint64_t*>(t_.digests + start_);
    int found = -1;
    bool any = false;
    int from = active ? 0 : width_;  // the next slot this lane looks at
    while (g_.ballot(from < width_)) {
      uint64_t held = 0;  // positions, 16 bits each
      int n = 0;
      while (from < width_ && n < kHeld) {
        const int g0 = from & ~(kGroup - 1);
        uint64_t m[kGroup / 8];
        DEMB_TILE_UNROLL
        for (int w = 0; w < kGroup / 8; ++w) {
          const int lo = from - (g0 + 8 * w);  // slots of the word before `from`
          m[w] = g0 + 8 * w < width_ && lo < 8 ? match_bytes(d[g0 / 8 + w], digest) : 0;
          if (lo > 0 && lo < 8) m[w] &= ~uint64_t{0} << (8 * lo);
        }
        int next = g0 + kGroup;
        bool full = false;
        DEMB_TILE_UNROLL
        for (int w = 0; w < kGroup / 8; ++w) {
          while (m[w] && !full) {
            const int pos = g0 + 8 * w + (ctz64(m[w]) >> 3);
            if (n == kHeld) {
              next = pos;
              full = true;
            } else {
              held |= static_cast<uint64_t>(pos) << (16 * n);
              ++n;
              m[w] &= m[w] - 1;
            }
          }
        }
        from = next;
      }
      any = any || n > 0;
      int64_t k[kHeld];
      DEMB_TILE_UNROLL
      for (int j = 0; j < kHeld; ++j) {
        k[j] = j < n ? t_.keys[start_ + static_cast<int64_t>(held >> (16 * j) & 0xffff)] : 0;
      }
      DEMB_TILE_UNROLL
      for (int j = 0; j < kHeld; ++j) {
        if (j < n && found < 0 && k[j] == key) found = static_cast<int>(held >> (16 * j) & 0xffff);
      }
      if (found >= 0) from = width_;
    }
    if (seen != nullptr) *seen = any;
    return found;
  }

  /// This lane's bookkeeping of a slot the run found or freed (every lane
  /// calls it with the same slot).
  DEMB_TILE void mark(int pos, bool freed) {
    if (pos == ahead_pos_) ahead_pos_ = -1;  // the key read ahead is stale
    if (freed) no_empty_ = false;
    if (Geo::lane_of(pos) != lane_) return;
    const int b = Geo::bit_of(pos);
    cand_.clear(b);
    forget();  // the candidates changed: the next take() scans them
    if (freed) {
      emp_.set(b);
    } else {
      emp_.clear(b);
    }
  }

  /// Step 1 for one chunk: the keys in the table (see the top of the file).
  /// `placeholders`: new keys' results are written too (read back by step 2
  /// of a run of several chunks).
  DEMB_TILE void find_resident(TileEntry& e, bool placeholders) {
    // A key whose digest the bucket lacks is new (the probe's one scan of
    // the digests tells); for the first, the empty slot's key or the
    // victims' words are read ahead.
    bool seen = false;
    const int pos = probe(e.key, e.digest, e.has, &seen);
    if (!scanned_ && ahead_pos_ < 0 && g_.ballot(e.has && !seen)) {
      // New keys: read ahead the key of the lowest slot that may be empty
      // (with the candidates' keys below), else fetch the victims' words.
      const int b = emp_.lowest();
      const unsigned lo =
          g_.reduce_min(b >= 0 ? static_cast<unsigned>(Geo::position(lane_, b)) : kNone);
      if (lo != kNone) {
        ahead_pos_ = static_cast<int>(lo);
        if (lane_ == Geo::lane_of(ahead_pos_)) ahead_key_ = t_.keys[start_ + ahead_pos_];
      } else if (evict_) {
        fetch_scores();
      }
    }
    if (e.has && r_.row_work) r_.row_work[e.i] = -1;
    const bool found = pos >= 0;
    const int rank = popc32(g_.match_any(found ? pos : -1 - lane_) & lanes_below(lane_));
    e.status = static_cast<int8_t>(InsertStatus::kInserted);
    const int64_t slot = start_ + pos;
    for (int k = 0; g_.ballot(found && rank >= k); ++k) {
      if (found && rank == k && (!release_ || t_.keys[slot] == e.key)) {
        const bool gone = !no_evict_ && update_or_release(t_, r_, e.i, slot, true);
        e.status = static_cast<int8_t>(gone ? InsertStatus::kReleased : InsertStatus::kFound);
      }
      g_.sync();
    }
    const bool freed = e.status == static_cast<int8_t>(InsertStatus::kReleased);
    d_.size -= popc32(g_.ballot(freed));
    for (unsigned m = g_.ballot(found && e.status != static_cast<int8_t>(InsertStatus::kInserted));
         m; m &= m - 1) {
      const int src = ctz32(m);
      mark(g_.shfl(pos, src), g_.shfl(freed, src));
    }
    if (e.has && (placeholders || e.status != static_cast<int8_t>(InsertStatus::kInserted))) {
      r_.slots[e.i] = e.status == static_cast<int8_t>(InsertStatus::kFound) ? slot : -1;
      r_.status[e.i] = e.status;
    }
  }

  /// The lowest empty position, or -1, now held. Its owner confirms a
  /// candidate with the slot's key (its sector of four keys, read once into
  /// L1); a slot that is not empty becomes a victim candidate unless the call
  /// holds it. Once none is left, none is looked for until a release frees
  /// one (mark).
  DEMB_TILE int next_empty() {
    if (no_empty_) return -1;
    for (;;) {
      const int b = emp_.lowest();
      const unsigned lo =
          g_.reduce_min(b >= 0 ? static_cast<unsigned>(Geo::position(lane_, b)) : kNone);
      if (lo == kNone) {
        no_empty_ = true;
        return -1;
      }
      const int pos = static_cast<int>(lo);
      const int owner = Geo::lane_of(pos);
      bool ok = false;
      if (lane_ == owner) {
        emp_.clear(b);
        ok = (pos == ahead_pos_ ? ahead_key_ : t_.keys[start_ + pos]) == kEmptyKey;
        if (!ok && !(r_.held_slots && r_.held_slots[start_ + pos])) {
          cand_.set(b);
          forget();
        }
      }
      if (pos == ahead_pos_) ahead_pos_ = -1;
      if (g_.shfl(ok, owner)) return pos;
    }
  }

  /// The words of the slot at `pos` in the victim order.
  DEMB_TILE void words(int pos, int64_t* w) const {
    const int64_t slot = start_ + pos;
    if constexpr (NK == 1) {
      w[0] = t_.scores[slot];
    } else {
      victim_words(t_, r_, slot, w);
    }
  }

  /// This lane's first candidate in victim order into best_, the later ones
  /// with the same words (ties, in slot order) into ties_, and the first
  /// candidate with other words into second_ (pos -1: none).
  DEMB_TILE void scan_candidates() {
    constexpr int G = Geo::G;
    constexpr int kAhead = NK == 1 ? 4 : 2;  // candidates read before any is compared
    TileVictim<NK> best, second;
    Bits ties;
    for (int row = 0; row < static_cast<int>(kTileMaxWidth / kTileRow); ++row) {
      const int first = row * static_cast<int>(kTileRow) + lane_ * G;
      if (first >= width_) break;
      for (int s0 = 0; s0 < G; s0 += kAhead) {
        TileVictim<NK> c[kAhead];
        DEMB_TILE_UNROLL
        for (int s = 0; s < kAhead; ++s) {
          if (cand_.test(row * G + s0 + s)) {
            c[s].pos = first + s0 + s;
            words(c[s].pos, c[s].w);
          }
        }
        DEMB_TILE_UNROLL
        for (int s = 0; s < kAhead; ++s) {
          // Slots come in order: a candidate with best's words is after it.
          if (c[s].pos >= 0 && best.pos >= 0 && same_words(c[s], best)) {
            ties.set(row * G + s0 + s);
          } else if (tile_victim_before(c[s], best)) {
            second = best;
            best = c[s];
            ties = Bits{};
          } else if (tile_victim_before(c[s], second)) {
            second = c[s];
          }
        }
      }
    }
    best_ = best;
    second_ = second;
    ties_ = ties;
    has_second_ = true;
  }

  /// Whether two candidates have the same words in the victim order.
  static DEMB_TILE bool same_words(const TileVictim<NK>& a, const TileVictim<NK>& b) {
    bool same = true;
    DEMB_TILE_UNROLL
    for (int c = 0; c < NK; ++c) same = same && a.w[c] == b.w[c];
    return same;
  }

  /// The candidates changed (a slot found, freed or found taken): the next
  /// take() scans them again.
  DEMB_TILE void forget() {
    has_second_ = false;
    ties_ = Bits{};
  }

  /// The next victim's position (-1: none left): the first of the lanes'
  /// best candidates in victim order, still a candidate until take(). The
  /// order's words are compared 32 bits at a time, each a reduce_min over the
  /// lanes still tied (a word's sign bit flipped: unsigned order is then
  /// signed order), then the position among the lanes tied on every word:
  /// 2 NK + 1 reductions, one instruction each on the GPU, where a butterfly
  /// of the words and position took (NK + 1) log2(T) dependent shuffles.
  DEMB_TILE int next_victim() {
    if (!scanned_) {
      scan_candidates();
      scanned_ = true;
    }
    bool tied = best_.pos >= 0;
    DEMB_TILE_UNROLL
    for (int c = 0; c < NK; ++c) {
      const uint64_t u = static_cast<uint64_t>(best_.w[c]) ^ (uint64_t{1} << 63);
      const unsigned hi = static_cast<unsigned>(u >> 32), lo = static_cast<unsigned>(u);
      const unsigned min_hi = g_.reduce_min(tied ? hi : kNone);  // every lane reduces
      tied = tied && min_hi == hi;
      const unsigned min_lo = g_.reduce_min(tied ? lo : kNone);
      tied = tied && min_lo == lo;
    }
    const unsigned pos = g_.reduce_min(tied ? static_cast<unsigned>(best_.pos) : kNone);
    return pos == kNone ? -1 : static_cast<int>(pos);
  }

  /// Takes victim `pos` (every lane calls it): no longer a candidate, its
  /// lane's next best is the next of its ties, else the second of its last
  /// scan, while nothing else changed its candidates since (a candidate's
  /// score words do not change during the run), else it scans them again.
  /// A bucket's victims are spread over its lanes, and the slots a step
  /// filled share their score (a timestamp, a count of one), so a lane
  /// seldom scans twice in a run: the run's victims cost a reduction each,
  /// not a scan of a lane's slots each.
  DEMB_TILE void take(int pos) {
    if (Geo::lane_of(pos) == lane_) {
      cand_.clear(Geo::bit_of(pos));
      const int tie = ties_.lowest();
      if (tie >= 0) {
        ties_.clear(tie);
        best_.pos = Geo::position(lane_, tie);
      } else if (has_second_) {
        best_ = second_;
        has_second_ = false;
      } else {
        scan_candidates();
      }
    }
  }

  /// A new key's outcome, decided by the tile.
  struct Outcome {
    int pos = -1;  ///< its position in the bucket (-1: none)
    int8_t status = 0;
    bool repeat = false;  ///< found at a slot the run placed (policies applied later)
    int32_t at = -1;      ///< its eviction record's position (kEvicted)
  };

  /// Writes a new key's outcome: its eviction record (the evicted key and
  /// score words, read before the slot is written), the key in its slot, its
  /// results.
  DEMB_TILE void write(const TileEntry& e, const Outcome& o) const {
    const int32_t ns = t_.num_scores;
    const int32_t i = e.i;
    if (!no_evict_ && r_.scores_out) r_.scores_out[i] = initial_score(r_.score, i, 0);
    const bool placed = o.status == static_cast<int8_t>(InsertStatus::kInserted) ||
                        o.status == static_cast<int8_t>(InsertStatus::kEvicted);
    const int64_t slot = start_ + o.pos;
    int64_t* s = t_.scores + (placed ? slot : 0) * ns;
    if (o.status == static_cast<int8_t>(InsertStatus::kEvicted) && records_) {
      r_.ev_keys[o.at] = t_.keys[slot];
      for (int32_t c = 0; c < ns; ++c) r_.ev_scores[o.at * ns + c] = s[c];
      r_.ev_slots[o.at] = slot;
      r_.ev_tables[o.at] = table_;
      r_.ev_flags[o.at] = 1;
    }
    if (placed) {
      t_.keys[slot] = e.key;
      t_.digests[slot] = e.digest;
      if (no_evict_) {
        if (r_.assign_rows) {
          s[0] = score_input(r_.score, i, 0);
        } else {
          s[0] = -1;  // handed out by the row pass
          if (r_.row_work) r_.row_work[i] = 1;
        }
        for (int32_t c = 1; c < ns; ++c) s[c] = 0;
      } else {
        for (int32_t c = 0; c < ns; ++c) s[c] = initial_score(r_.score, i, c);
      }
    }
    r_.slots[i] = placed ? slot : -1;
    r_.status[i] = o.status;
  }

  /// A repeat of a key the run holds at `pos`: its policies; returns whether
  /// it was released.
  DEMB_TILE bool found_again(const TileEntry& e, int pos) const {
    const int64_t slot = start_ + pos;
    const bool gone = !no_evict_ && update_or_release(t_, r_, e.i, slot, true);
    r_.slots[e.i] = gone ? -1 : slot;
    r_.status[e.i] = static_cast<int8_t>(gone ? InsertStatus::kReleased : InsertStatus::kFound);
    return gone;
  }

  /// Step 2 for one chunk: its new keys (see the top of the file).
  DEMB_TILE void place_new(const TileEntry& e, bool first_chunk) {
    const bool is_new = e.has && e.status == static_cast<int8_t>(InsertStatus::kInserted);
    const unsigned news = g_.ballot(is_new);
    if (!news) return;
    // The previous occurrence of this lane's key in the chunk, else (after
    // the first chunk) where the run placed it: looked for only where a key
    // the run placed has its digest.
    const unsigned same = g_.match_any(is_new ? e.key : kEmptyKey) & news;
    const int prev = is_new ? highest_bit(same & lanes_below(lane_)) : -1;
    const int held_at =
        first_chunk
            ? -1
            : probe(e.key, e.digest, is_new && prev < 0 && placed_.test(e.digest % kPlacedBits));
    const int64_t* inf = t_.info + static_cast<int64_t>(table_) * kInfoCols;
    const bool invalid =
        is_new && no_evict_ && r_.assign_rows && !assigned_row_valid(r_.score, e.i, inf);
    const bool stays_out = is_new && !no_evict_ && released(r_, initial_score(r_.score, e.i, 0));
    const bool now = release_ && g_.ballot(is_new && (prev >= 0 || held_at >= 0));
    const unsigned invalids = g_.ballot(invalid), outs = g_.ballot(stays_out);
    Outcome mine;
    for (unsigned m = news; m; m &= m - 1) {
      const int j = ctz32(m);
      const bool me = lane_ == j;
      const int pj = g_.shfl(prev, j);
      const int before = g_.shfl(mine.pos, pj < 0 ? j : pj);
      const int at = pj < 0 ? g_.shfl(held_at, j) : before;
      if (at >= 0) {  // a repeat of a key the run holds
        if (now) {
          bool gone = false;
          if (me) {
            gone = found_again(e, at);
            mine.pos = gone ? -1 : at;
          }
          if (g_.shfl(gone, j)) {
            --d_.size;
            mark(at, true);
          }
          g_.sync();
        } else if (me) {
          mine.repeat = true;
          mine.pos = at;
        }
        continue;
      }
      Outcome o;
      o.status = static_cast<int8_t>(InsertStatus::kFailed);
      if (invalids >> j & 1u) {
        o.status = static_cast<int8_t>(InsertStatus::kInvalid);
      } else if (outs >> j & 1u) {
        o.status = static_cast<int8_t>(InsertStatus::kReleased);
      } else {
        o.pos = next_empty();
        if (o.pos >= 0) {
          ++d_.size;
          o.status = static_cast<int8_t>(InsertStatus::kInserted);
        } else if (evict_) {
          const int v = next_victim();
          if (v >= 0 && r_.refuse_cold && colder_than(t_, r_.score, g_.shfl(e.i, j), start_ + v)) {
            o.status = static_cast<int8_t>(InsertStatus::kRefused);  // "Refusal"
          } else if (v >= 0) {
            take(v);
            o.pos = v;
            o.status = static_cast<int8_t>(InsertStatus::kEvicted);
            o.at = begin_ + d_.evictions;
            ++d_.evictions;
          }
        }
        if (o.pos >= 0) {
          ++d_.inserts;
        } else if (o.status != static_cast<int8_t>(InsertStatus::kRefused)) {
          ++d_.failures;  // a refusal changes no counter, as in run_keys
        }
      }
      if (me) mine = o;
      if (now) {
        if (me) write(e, o);
        g_.sync();
      }
    }
    if (end_ - begin_ > T) {  // chunks follow: the digests of the keys placed
      for (unsigned m = g_.ballot(is_new && mine.pos >= 0); m; m &= m - 1) {
        placed_.set(g_.shfl(static_cast<int>(e.digest % kPlacedBits), ctz32(m)));
      }
    }
    if (now) return;
    if (is_new && !mine.repeat) write(e, mine);
    g_.sync();
    // The repeats' policies, in batch order per slot (they release nothing here).
    const unsigned repeats = g_.ballot(mine.repeat);
    if (!repeats) return;
    const int rank =
        popc32(g_.match_any(mine.repeat ? mine.pos : -1 - lane_) & repeats & lanes_below(lane_));
    for (int k = 0; g_.ballot(mine.repeat && rank >= k); ++k) {
      if (mine.repeat && rank == k) found_again(e, mine.pos);
      g_.sync();
    }
  }

  const Tile& g_;
  const TableRef& t_;
  const RunArgs& r_;
  const int32_t begin_, end_, table_;  // a batch has fewer than 2^31 keys
  const int64_t start_;                // the bucket's first slot
  const int32_t width_;                // and width
  const bool records_;
  int lane_ = 0;
  bool no_evict_ = false, evict_ = false, release_ = false;
  Bits emp_, cand_;
  int ahead_pos_ = -1;     ///< the position whose key was read ahead (-1: none)
  int64_t ahead_key_ = 0;  ///< that key (its owner lane's)
  bool scanned_ = false;
  /// The digests (mod kPlacedBits) of the keys the run placed (the tile's, uniform).
  TileBits<kPlacedBits> placed_;
  bool no_empty_ = false;         ///< no lane has a slot that may be empty (the tile's, uniform)
  TileVictim<NK> best_, second_;  ///< this lane's first two candidates (scan_candidates)
  Bits ties_;                     ///< its candidates after best_ with best_'s words
  bool has_second_ = false;       ///< second_ is the next best after best_ and ties_
  TileDeltas d_;
};

/// The results of batch entry `index`, which has no bucket (an invalid key,
/// or one the call leaves out).
DEMB_TILE void tile_invalid(const RunArgs& r, int32_t index) {
  r.slots[index] = -1;
  r.status[index] = static_cast<int8_t>(InsertStatus::kInvalid);
  if (r.row_work) r.row_work[index] = -1;
}

/// The tile at sorted position p of a run-wise insert or insert_and_evict
/// (the sort keys `sk[q]`, q < n, the invalid entries' total_buckets, sorted
/// by bucket): an invalid entry's results, or, when p starts a run whose
/// bucket is at most kTileMaxWidth wide, the run. Returns whether it ran one,
/// with the run's table and counter changes (to add once, by one lane).
/// Lane l first reads the sort key at p - 1 + l and the batch index at p + l
/// together, which tell whether p starts a run, where most runs end, and its
/// first chunk's keys.
template <int T, int NK, class Tile, class Keys>
DEMB_TILE bool tile_run_at(const Tile& g, const TableRef& t, const RunArgs& r, const Keys& sk,
                           int64_t p, int64_t n, int64_t total_buckets, bool records,
                           int64_t* table, RunDeltas* d) {
  const int lane = g.lane();
  const int64_t q = p - 1 + lane;
  const int64_t mine = q >= 0 && q < n ? sk[q] : INT64_MIN;
  const int32_t index = p + lane < n ? r.order[p + lane] : 0;
  const int64_t k = g.shfl(mine, 1);
  if (k == total_buckets) {
    if (lane == 0) tile_invalid(r, index);
    return false;
  }
  if (g.shfl(mine, 0) == k) return false;  // p does not start a run
  // The run's end: the first position past p holding another key.
  int64_t end = p - 1;
  unsigned stop = g.ballot(lane >= 2 && (q >= n || mine != k));
  if (!stop) {
    for (end = p + T - 1;; end += T) {
      stop = g.ballot(end + lane >= n || sk[end + lane] != k);
      if (stop) break;
    }
  }
  end += ctz32(stop);
  TileEntry first;
  first.has = p + lane < end;
  if (first.has) {
    first.i = index;
    first.key = r.keys[index];
    first.digest = digest_of_hash(bucket_hash(static_cast<uint64_t>(first.key)));
  }
  *table = r.table_ids[g.shfl(index, 0)];
  const Home h = home_of(t, *table, g.shfl(first.key, 0));
  if (h.width > kTileMaxWidth) return false;
  *d = TileRun<T, NK, Tile>(g, t, r, p, end, *table, h, records).run(first);
  return true;
}

}  // namespace table
}  // namespace dyn_emb
