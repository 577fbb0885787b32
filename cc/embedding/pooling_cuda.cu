// Copyright dynamicemb authors. Licensed under the Apache License, Version 2.0.
#include <cub/cub.cuh>

#include "cc/common/cuda_launch.cuh"
#include "cc/common/host_device.h"
#include "cc/embedding/pooling_cuda.h"
#include "cc/embedding/warp_update.cuh"

namespace dyn_emb {
namespace embedding {
namespace cuda {

namespace {

// Bags and keys are walked once per chunk of kChunk coordinates
// (warp_update.cuh; once for dims up to 128), kPer partial sums per lane in
// registers; float32 rows and outputs 16-byte aligned are read and written
// with one 16-byte access per lane (Vec, lane_coord).

/// Adds w * the lane's coordinates of the chunk at `base` of row v to acc.
template <class T, bool Vec>
__device__ __forceinline__ void add_row(const T* v, float w, int64_t base, int64_t dim, int lane,
                                        float (&acc)[kPer]) {
  if constexpr (Vec) {
    float x[kPer];
    if constexpr (storage::Scaled<T>::value) {
      load_codes4(v, base + 4 * lane, dim, x);  // the lane's four codes: one word
    } else {
      load_chunk<true>(v, base, dim, lane, x);  // float32
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[k] += w * x[k];
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane_coord<false>(base, lane, k);
      if (d < dim) acc[k] += w * storage::to_float(v[d]);
    }
  }
}

// Bag [j0, j1) into its output slice; v0 and w0: the first occurrence's row
// (nullptr: none) and weight, read ahead by the bag's lane in pool_kernel.
template <class T, bool Vec>
__device__ void pool_bag(const PoolArgs& a, const BagSlot& s, int64_t j0, int64_t j1, const T* v0,
                         float w0, int lane) {
  float* out = a.out + s.offset;
  for (int64_t base = 0; base < s.dim; base += kChunk) {
    float acc[kPer] = {};
    // A scaled (FP8) row's weight carries its scale (1 for the others).
    if (j1 > j0 && v0 != nullptr) {
      add_row<T, Vec>(v0, w0 * storage::row_scale(v0, s.dim), base, s.dim, lane, acc);
    }
    for (int64_t j = j0 + 1; j < j1; ++j) {
      const T* v = occ_row<T>(a, j);
      if (v != nullptr) {
        const float w = occ_weight(a.weights, j) * storage::row_scale(v, s.dim);
        add_row<T, Vec>(v, w, base, s.dim, lane, acc);
      }
    }
    const int64_t d0 = base + 4 * lane;
    if (Vec && d0 < s.dim) {
      *reinterpret_cast<float4*>(out + d0) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    } else if (!Vec) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane_coord<false>(base, lane, k);
        if (d < s.dim) out[d] = acc[k];
      }
    }
  }
}

// A warp per kWarp consecutive bags at a time (grid-strided): lane l first
// reads bag b0 + l's occurrences and its first occurrence's row and weight,
// so that the warp, pooling the bags one after another, waits on no index
// load of its own for a bag of one occurrence (hotness 1, sequences).
// Vectorized when the rows are float32 or FP8, the dim a multiple of 4 and
// the bag's output slice 16-byte aligned (a float32 row that is not aligned
// is read element-wise, an FP8 row's word a byte at a time).
template <class T>
__global__ void pool_kernel(PoolArgs a, int64_t num_bags) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = launch_warps() * kWarp;
  constexpr bool kVec = kVecType<T>;
  for (int64_t b0 = global_thread() / kWarp * kWarp; b0 < num_bags; b0 += stride) {
    const int64_t mine = b0 + lane;
    int64_t j0 = 0, j1 = 0;
    const T* v = nullptr;
    float w = 0.f;
    if (mine < num_bags) {
      j0 = a.bag_offsets[mine];
      j1 = a.bag_offsets[mine + 1];
      if (j1 > j0) {
        v = occ_row<T>(a, j0);
        w = occ_weight(a.weights, j0);
      }
    }
    const int count = num_bags - b0 < kWarp ? static_cast<int>(num_bags - b0) : kWarp;
    for (int k = 0; k < count; ++k) {  // uniform across the warp
      const int64_t k0 = __shfl_sync(0xffffffffu, j0, k), k1 = __shfl_sync(0xffffffffu, j1, k);
      const auto* vk = reinterpret_cast<const T*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(v), k));
      const float wk = __shfl_sync(0xffffffffu, w, k);
      const BagSlot s = bag_slot(a.layout, b0 + k);
      if (kVec && s.dim % 4 == 0 && aligned16(a.out + s.offset)) {
        pool_bag<T, kVec>(a, s, k0, k1, vk, wk, lane);
      } else {
        pool_bag<T, false>(a, s, k0, k1, vk, wk, lane);
      }
    }
  }
}

/// Whether key u's row (at byte offset r) is updated vectorized.
template <class T>
__device__ __forceinline__ bool key_vectorized(const UpdateArgs& a, int64_t r, int64_t dim) {
  return vectorized(storage::embedding_at<T>(a.space, r), dim);
}

// Updates key u's row (one warp, warp_update_row); fill(base, g) writes the
// gradient's chunk at `base` into g, in the lanes' coordinates lane_coord<Vec>.
template <class T, bool Vec, class Fill>
__device__ void update_key(const UpdateArgs& a, int64_t u, int lane, const Fill& fill) {
  const int64_t r = a.rows[u];
  if (r < 0) return;  // uniform across the warp
  const int64_t dim = key_dim(a, u);
  warp_update_row<T, Vec>(a.optim, storage::embedding_at<T>(a.space, r),
                          storage::state_at<T>(a.space, r, dim), dim, lane, fill, sr_key(a, u),
                          sr_step(a));
}

// A key of at most kHotChunk occurrences (two per lane), as the lanes read
// them at once before its gradient is summed: lane l holds the place in
// grad_out and the weight of occurrences l and kWarp + l (zeros past the
// last), so the sum waits for no index load of its own.
struct KeyOccurrences {
  int64_t at[2];
  float w[2];
};

static_assert(kHotChunk <= 2 * kWarp, "a plain key's occurrences fit two per lane");

/// The occurrences [i0, i0 + c) of a key (c <= kHotChunk); returns its dim
/// (the first occurrence's feature's), the same in every lane.
__device__ __forceinline__ int64_t load_occurrences(const UpdateArgs& a, int64_t i0, int64_t c,
                                                    int lane, KeyOccurrences& o) {
  int64_t dim = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t k = lane + h * kWarp;
    o.at[h] = 0;
    o.w[h] = 0.f;
    if (k < c) {
      const int64_t j = a.occ_order[i0 + k];
      o.w[h] = occ_weight(a.weights, j);
      const BagSlot s = bag_slot(a.layout, a.occ_bag[j]);
      o.at[h] = s.offset;
      if (k == 0) dim = s.dim;
    }
  }
  return __shfl_sync(0xffffffffu, dim, 0);
}

/// The chunk at `base` of the gradient summed over the preloaded
/// occurrences, in their order, in the lanes' coordinates lane_coord<Vec>.
template <bool Vec>
__device__ void occurrences_chunk(const UpdateArgs& a, const KeyOccurrences& o, int64_t c,
                                  int64_t base, int64_t dim, int lane, float (&g)[kPer]) {
#pragma unroll
  for (int k = 0; k < kPer; ++k) g[k] = 0.f;
#pragma unroll 4
  for (int64_t i = 0; i < c; ++i) {
    const int src = static_cast<int>(i % kWarp);
    const bool second = i >= kWarp;
    const int64_t at = __shfl_sync(0xffffffffu, second ? o.at[1] : o.at[0], src);
    const float w = __shfl_sync(0xffffffffu, second ? o.w[1] : o.w[0], src);
    float x[kPer];
    load_chunk<Vec>(a.grad_out + at, base, dim, lane, x);
#pragma unroll
    for (int k = 0; k < kPer; ++k) g[k] += w * x[k];
  }
}

template <class T, bool Vec>
__device__ void update_plain_key(const UpdateArgs& a, int64_t u, int64_t r, const KeyOccurrences& o,
                                 int64_t c, int64_t dim, int lane) {
  warp_update_row<T, Vec>(
      a.optim, storage::embedding_at<T>(a.space, r), storage::state_at<T>(a.space, r, dim), dim,
      lane,
      [&](int64_t base, float (&g)[kPer]) { occurrences_chunk<Vec>(a, o, c, base, dim, lane, g); },
      sr_key(a, u), sr_step(a));
}

template <class T>
__global__ void update_kernel(UpdateArgs a, int64_t num_keys) {
  const int lane = threadIdx.x % kWarp;
  // Every occurrence; a padded batch's padding keys have none and start
  // there, after its distinct keys (the offsets never decrease).
  const int64_t end = a.occ_offsets[num_keys];
  for (int64_t u = global_thread() / kWarp; u < num_keys; u += launch_warps()) {
    const int64_t i0 = a.occ_offsets[u], i1 = a.occ_offsets[u + 1];
    const int64_t r = a.rows[u];
    if (i0 == end) break;  // padding, and so is every later key of this warp
    const int64_t c = i1 - i0;
    if (c > kHotChunk || r < 0) continue;  // uniform across the warp
    KeyOccurrences o;
    const int64_t dim = load_occurrences(a, i0, c, lane, o);
    if (key_vectorized<T>(a, r, dim)) {
      update_plain_key<T, kVecType<T>>(a, u, r, o, c, dim, lane);
    } else {
      update_plain_key<T, kAlwaysVec<T>>(a, u, r, o, c, dim, lane);
    }
  }
}

template <bool Vec>
__device__ void add_hot_chunk(const UpdateArgs& a, const HotKeys& h, int64_t u, int64_t i0,
                              int64_t i1, int64_t dim, int lane) {
  float* row = h.buf + (h.hot_incl[u] - 1) * h.buf_width;
  // The chunk's occurrences (at most kHotChunk) read at once, as a plain
  // key's are, so the sum waits for no index load of its own.
  KeyOccurrences o;
  load_occurrences(a, i0, i1 - i0, lane, o);
  for (int64_t base = 0; base < dim; base += kChunk) {
    float g[kPer];
    occurrences_chunk<Vec>(a, o, i1 - i0, base, dim, lane, g);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane_coord<Vec>(base, lane, k);
      if (d < dim) atomicAdd(row + d, g[k]);
    }
  }
}

// A warp per chunk of a hot key's occurrences: partial sums into its buffer row.
template <class T>
__global__ void hot_chunk_kernel(UpdateArgs a, HotKeys h, int64_t num_keys) {
  const int64_t c = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (c >= h.max_chunks || c >= h.chunk_offsets[num_keys]) return;
  const int64_t u = upper_bound(h.chunk_offsets, num_keys + 1, c) - 1;
  const int64_t i0 = a.occ_offsets[u] + (c - h.chunk_offsets[u]) * kHotChunk;
  const int64_t i1 = i0 + kHotChunk < a.occ_offsets[u + 1] ? i0 + kHotChunk : a.occ_offsets[u + 1];
  const int64_t dim = key_dim(a, u);
  // The buffer is indexed by coordinate: either lane mapping sums into it.
  if (a.rows[u] >= 0 && key_vectorized<T>(a, a.rows[u], dim)) {
    add_hot_chunk<true>(a, h, u, i0, i1, dim, lane);
  } else {
    add_hot_chunk<false>(a, h, u, i0, i1, dim, lane);
  }
}

template <class T, bool Vec>
__device__ void update_hot_key(const UpdateArgs& a, int64_t u, const float* row, int64_t dim,
                               int lane) {
  update_key<T, Vec>(a, u, lane, [&](int64_t base, float (&g)[kPer]) {
    load_chunk<Vec>(row, base, dim, lane, g);
  });
}

// A warp per hot key: apply the summed gradient.
template <class T>
__global__ void hot_update_kernel(UpdateArgs a, HotKeys h, int64_t num_keys) {
  const int64_t k = global_thread() / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (num_keys == 0 || k >= h.max_hot || k >= h.hot_incl[num_keys - 1]) return;
  const int64_t u = upper_bound(h.hot_incl, num_keys, k);
  if (a.rows[u] < 0) return;
  const float* row = h.buf + k * h.buf_width;
  const int64_t dim = key_dim(a, u);
  if (key_vectorized<T>(a, a.rows[u], dim)) {
    update_hot_key<T, kVecType<T>>(a, u, row, dim, lane);
  } else {
    update_hot_key<T, kAlwaysVec<T>>(a, u, row, dim, lane);
  }
}

/// Blocks of a launch with one warp per item.
unsigned grid(int64_t warps) { return grid_for(warps * kWarp); }

// hot_keys: per distinct key, (hot << 32) | chunks (0 for a key that is not
// hot); both halves stay below 2^32 through the scan (n / kHotChunk chunks and
// n / (kHotChunk + 1) hot keys at most).
__global__ void hot_pack_kernel(const int64_t* occ_offsets, int64_t num_keys, int64_t* packed) {
  const int64_t v = global_thread();
  if (v >= num_keys) return;
  const int64_t c = occ_offsets[v + 1] - occ_offsets[v];
  packed[v] = c > kHotChunk ? (int64_t{1} << 32) | ((c + kHotChunk - 1) / kHotChunk) : 0;
}

// The inclusive scan unpacked: chunk offsets (exclusive, U + 1), hot keys up
// to each key (inclusive).
__global__ void hot_unpack_kernel(const int64_t* incl, int64_t num_keys, int64_t* chunk_offsets,
                                  int64_t* hot_incl) {
  const int64_t v = global_thread();
  if (v > num_keys) return;
  constexpr int64_t kLow = (int64_t{1} << 32) - 1;
  chunk_offsets[v] = v == 0 ? 0 : incl[v - 1] & kLow;
  if (v < num_keys) hot_incl[v] = incl[v] >> 32;
}

// The hot keys' buffer rows zeroed, a thread per float (grid-strided): as
// many rows as there are hot keys (the scan's last count), not max_hot.
__global__ void hot_zero_kernel(const int64_t* incl, int64_t num_keys, float* buf,
                                int64_t buf_width) {
  const int64_t total = (incl[num_keys - 1] >> 32) * buf_width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = global_thread(); i < total; i += stride) buf[i] = 0.0f;
}

// A thread per occurrence i, and with `sequence` one more for the end (n).
// Two threads of a block first find the bags of its first and last
// occurrence; the others search only the bags between (a few steps for short
// bags instead of log2 of all of them).
__global__ void occurrence_bags_kernel(OccurrenceBags o, int64_t n, bool sequence, int64_t* bags,
                                       int64_t* tables) {
  __shared__ int64_t bounds[2];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x;
  if (threadIdx.x < 2 && n > 0) {
    const int64_t last = first + blockDim.x - 1 < n ? first + blockDim.x - 1 : n - 1;
    bounds[threadIdx.x] = occurrence_bag(o, threadIdx.x == 0 ? (first < n ? first : n - 1) : last);
  }
  __syncthreads();
  const int64_t i = global_thread();
  if (i > n || (i == n && !sequence)) return;
  if (i < n) {
    // Bags are non-decreasing in the occurrence: i's is in [bounds[0], bounds[1]].
    const int64_t lo = bounds[0];
    const int64_t b = lo + upper_bound(o.offsets + 1 + lo, bounds[1] - lo + 1, o.offsets[0] + i);
    const int64_t bag = b < o.num_bags ? b : o.num_bags - 1;
    tables[i] = bag_table(o, bag);
    bags[i] = sequence ? i : bag;
  } else {
    bags[n] = n;
  }
}

__global__ void count_failures_kernel(FailureCount a) {
  const int64_t i = global_thread();
  if (i >= a.n) return;
  const int64_t t = failure_table(a, i);
  if (t >= 0) atomicAdd(reinterpret_cast<unsigned long long*>(a.counts + t), 1ULL);
}

/// Scratch layout of hot_keys: packed, inclusive sums, chunk offsets, hot
/// counts (int64), the buffer (float), then cub's temporary storage; each
/// part 256-byte aligned.
struct HotLayout {
  size_t packed, incl, chunks, hot, buf, temp, temp_bytes, total;
};

HotLayout hot_layout(int64_t num_keys, int64_t max_hot, int64_t buf_width) {
  HotLayout l{};
  const size_t u = static_cast<size_t>(num_keys);
  l.packed = 0;
  l.incl = l.packed + scratch_aligned(u * sizeof(int64_t));
  l.chunks = l.incl + scratch_aligned(u * sizeof(int64_t));
  l.hot = l.chunks + scratch_aligned((u + 1) * sizeof(int64_t));
  l.buf = l.hot + scratch_aligned(u * sizeof(int64_t));
  l.temp = l.buf + scratch_aligned(static_cast<size_t>(max_hot * buf_width) * sizeof(float));
  check_cuda(cub::DeviceScan::InclusiveSum(nullptr, l.temp_bytes, static_cast<int64_t*>(nullptr),
                                           static_cast<int64_t*>(nullptr), num_keys),
             "embedding_update (hot keys scan size)");
  l.total = l.temp + scratch_aligned(l.temp_bytes);
  return l;
}

int64_t max_hot_of(int64_t num_keys, int64_t n) { return num_keys > 0 ? n / (kHotChunk + 1) : 0; }

template <class T>
void pool_forward(const PoolArgs& a, int64_t num_bags, cudaStream_t stream) {
  // A warp per kWarp bags.
  pool_kernel<T>
      <<<grid_strided((num_bags + kWarp - 1) / kWarp * kWarp), kBlock, 0, stream>>>(a, num_bags);
  check_launch("embedding_pool");
}

template <class T>
void update_backward(const UpdateArgs& a, const HotKeys& h, int64_t num_keys, cudaStream_t stream) {
  update_kernel<T><<<grid_strided(num_keys * kWarp), kBlock, 0, stream>>>(a, num_keys);
  check_launch("embedding_update");
  if (h.max_hot == 0) return;
  hot_chunk_kernel<T><<<grid(h.max_chunks), kBlock, 0, stream>>>(a, h, num_keys);
  check_launch("embedding_update (hot chunks)");
  hot_update_kernel<T><<<grid(h.max_hot), kBlock, 0, stream>>>(a, h, num_keys);
  check_launch("embedding_update (hot keys)");
}

}  // namespace

void pool_forward(const PoolArgs& a, int64_t num_bags, storage::ElementType type,
                  cudaStream_t stream) {
  if (num_bags == 0) return;
  switch (type) {
    case storage::ElementType::kFloat16:
      return pool_forward<storage::Half>(a, num_bags, stream);
    case storage::ElementType::kBFloat16:
      return pool_forward<storage::BFloat16>(a, num_bags, stream);
    case storage::ElementType::kFloat8E4M3:
      return pool_forward<storage::Float8E4M3>(a, num_bags, stream);
    default:
      return pool_forward<float>(a, num_bags, stream);
  }
}

size_t hot_keys_scratch(int64_t num_keys, int64_t n, int64_t buf_width) {
  const int64_t max_hot = max_hot_of(num_keys, n);
  return max_hot == 0 ? 0 : hot_layout(num_keys, max_hot, buf_width).total;
}

HotKeys hot_keys(const int64_t* occ_offsets, int64_t num_keys, int64_t n, int64_t buf_width,
                 void* scratch, cudaStream_t stream) {
  HotKeys h;
  h.max_hot = max_hot_of(num_keys, n);
  if (h.max_hot == 0) return h;
  const HotLayout l = hot_layout(num_keys, h.max_hot, buf_width);
  char* base = static_cast<char*>(scratch);
  auto* packed = reinterpret_cast<int64_t*>(base + l.packed);
  auto* incl = reinterpret_cast<int64_t*>(base + l.incl);
  auto* chunks = reinterpret_cast<int64_t*>(base + l.chunks);
  auto* hot = reinterpret_cast<int64_t*>(base + l.hot);
  auto* buf = reinterpret_cast<float*>(base + l.buf);
  hot_pack_kernel<<<grid_for(num_keys), kBlock, 0, stream>>>(occ_offsets, num_keys, packed);
  check_launch("embedding_update (hot keys)");
  size_t temp_bytes = l.temp_bytes;
  check_cuda(
      cub::DeviceScan::InclusiveSum(base + l.temp, temp_bytes, packed, incl, num_keys, stream),
      "embedding_update (hot keys scan)");
  hot_unpack_kernel<<<grid_for(num_keys + 1), kBlock, 0, stream>>>(incl, num_keys, chunks, hot);
  check_launch("embedding_update (hot keys)");
  hot_zero_kernel<<<grid_strided(h.max_hot * buf_width), kBlock, 0, stream>>>(incl, num_keys, buf,
                                                                              buf_width);
  check_launch("embedding_update (hot keys' rows)");
  h.chunk_offsets = chunks;
  h.hot_incl = hot;
  h.buf = buf;
  h.buf_width = buf_width;
  h.max_chunks = n / kHotChunk + h.max_hot;
  return h;
}

void update_backward(const UpdateArgs& a, const HotKeys& h, int64_t num_keys,
                     storage::ElementType type, cudaStream_t stream) {
  if (num_keys == 0) return;
  switch (type) {
    case storage::ElementType::kFloat16:
      return update_backward<storage::Half>(a, h, num_keys, stream);
    case storage::ElementType::kBFloat16:
      return update_backward<storage::BFloat16>(a, h, num_keys, stream);
    case storage::ElementType::kFloat8E4M3:
      return update_backward<storage::Float8E4M3>(a, h, num_keys, stream);
    default:
      return update_backward<float>(a, h, num_keys, stream);
  }
}

void occurrence_bags(const OccurrenceBags& o, int64_t n, bool sequence, int64_t* bags,
                     int64_t* tables, cudaStream_t stream) {
  if (n == 0 && !sequence) return;
  occurrence_bags_kernel<<<grid_for(n + 1), kBlock, 0, stream>>>(o, n, sequence, bags, tables);
  check_launch("occurrence_bags");
}

void count_failures(const FailureCount& a, cudaStream_t stream) {
  if (a.n == 0) return;
  count_failures_kernel<<<grid_for(a.n), kBlock, 0, stream>>>(a);
  check_launch("count_failures");
}

}  // namespace cuda
}  // namespace embedding
}  // namespace dyn_emb
