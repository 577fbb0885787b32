// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
//
// The CPU's reads and writes of FP8 rows (cc/storage/row_space.h, "FP8 rows"):
// the bytes of the per-element definition (fp8_rows.h: scaled_code, the CUDA
// kernels' too), computed a row at a time. A row's random bits come from
// Philox in SIMD lanes, eight elements a pass where the CPU has AVX2; codes
// are read eight at a time where the CPU has AVX2, else through a table of
// the 256 values (and float16 rows' pooled sums eight at a time too).
#pragma once

#include <array>
#include <cstdint>

#include "cc/embedding/optimizer.h"
#include "cc/embedding/philox.h"
#include "cc/storage/row_space.h"

namespace dyn_emb {
namespace embedding {
namespace cpu {

/// bits[4 j + w] = word w of philox(j, r.c1, r.c2, r.c3, r.k0, r.k1), for
/// 4 j + w in [0, n): a run of Philox draws whose first counter word counts
/// (sixteen at a time where the CPU has AVX-512, eight with AVX2).
void philox_words(const StochasticDraws& r, int64_t n, uint32_t* bits);

/// The ways the row functions here can run, widest last; the same results
/// from each (kAvx512: AVX-512 F and BW; kAvx2: AVX2 and F16C).
enum class Simd : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// Whether this CPU runs `path` (kScalar: always).
bool simd_runs(Simd path);

/// philox_words by `path`, or the widest path below it this CPU runs.
void philox_words_by(Simd path, const StochasticDraws& r, int64_t n, uint32_t* bits);

/// bits[e] = stochastic_bits(key, step, e) for e in [0, n).
void stochastic_bits_row(uint64_t key, int64_t step, int64_t n, uint32_t* bits);

/// storage::to_float of each of the 256 codes, by its bits.
extern const std::array<float, 256> kFp8Values;

/// The values of an FP8 row of `dim` codes at `w`: out[d] = code's value * scale.
void read_scaled_row(const storage::Float8E4M3* w, int64_t dim, float* out);

/// o[d] += w * the value of code d, for d < dim (a pooled row: `w` its
/// weight times its scale); each term a product, then a sum. The codes'
/// values come from a table of their float16 bits (exact: every e4m3 value
/// is a float16 one), 32 at a time with AVX-512, or from their bits moved
/// into float32's fields, eight at a time with AVX2.
void add_codes(float* o, float w, const storage::Float8E4M3* codes, int64_t dim);

/// read_scaled_row and add_codes by `path`, or the widest path below it
/// this CPU runs.
void read_scaled_row_by(Simd path, const storage::Float8E4M3* w, int64_t dim, float* out);
void add_codes_by(Simd path, float* o, float w, const storage::Float8E4M3* codes, int64_t dim);

/// add_codes for a float16 row (eight at a time where the CPU converts half
/// precision, F16C).
void add_halves(float* o, float w, const storage::Half* v, int64_t dim);

/// Writes the float32 values `v` (dim) as the FP8 row at `w` of `key` at
/// `step`: its scale, its codes (scaled_code's), zeros in the padding to 4
/// bytes. `bits`: scratch of dim words.
void write_scaled_row(storage::Float8E4M3* w, const float* v, int64_t dim, uint64_t key,
                      int64_t step, uint32_t* bits);

/// Updates an FP8 row in place: its `dim` codes at `w` and their scale, its
/// state `s`, with the gradient `g`. The row's values are read into `tmp`
/// (dim floats) and updated there as a float32 row is (update_row), then
/// written back as write_scaled_row writes them (the padding left as it
/// is): the same row, gradient, key and step give the same bytes as the CUDA
/// kernel's. `bits`: scratch of dim words.
void update_scaled_row(const OptimArgs& a, storage::Float8E4M3* w, float* s, const float* g,
                       int64_t dim, uint64_t key, int64_t step, float* tmp, uint32_t* bits);

}  // namespace cpu
}  // namespace embedding
}  // namespace dyn_emb
