// Row kernels shared by the compiled CPU ops (fwht_cpu.cpp, structured_cpu.cpp): the
// vectorized Walsh–Hadamard transform of rows in L1 with optional diagonals before and
// after, and the argument checks.  Header-only, internal to the extension.

#pragma once

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pyro_whvi {
namespace detail {

// ---------------------------------------------------------------------------
// Row kernels, written with GCC/Clang vector extensions (32-byte vectors: AVX2 on
// x86-64, two NEON registers on ARM) so that they vectorize on any compiler flags.
//
// The log2(n) butterfly stages act on different bits of the index and commute, so
// they run in the order that suits the hardware:
//   1. the stages inside one vector (strides 1..W/2), as shuffles, in the same pass
//      that reads the source row and applies an optional `pre` diagonal;
//   2. the stages across vectors, up to three at a time (radix-8) in registers, the
//      last pass applying the optional `post` diagonal and the scale.
// A chunk of rows (or a block of a long row, transform_long_row) stays in L1 between
// passes: the data is read from and written to memory once, and the next chunk is
// prefetched while the L1-only passes run.

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(32)));
  static constexpr int64_t width = 8;
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(32)));
  static constexpr int64_t width = 4;
};

template <typename V, typename T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// Butterflies with the strides inside one vector: y = shuffle(v) + sign * v.
inline Vec<float>::type in_vector_stages(Vec<float>::type v) {
  using V = Vec<float>::type;
  const V sign1 = {1, -1, 1, -1, 1, -1, 1, -1};
  const V sign2 = {1, 1, -1, -1, 1, 1, -1, -1};
  const V sign4 = {1, 1, 1, 1, -1, -1, -1, -1};
  v = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6) + v * sign1;
  v = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5) + v * sign2;
  v = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3) + v * sign4;
  return v;
}

inline Vec<double>::type in_vector_stages(Vec<double>::type v) {
  using V = Vec<double>::type;
  const V sign1 = {1, -1, 1, -1};
  const V sign2 = {1, 1, -1, -1};
  v = __builtin_shufflevector(v, v, 1, 0, 3, 2) + v * sign1;
  v = __builtin_shufflevector(v, v, 2, 3, 0, 1) + v * sign2;
  return v;
}

// A diagonal operand seen from a chunk of rows: element e of the chunk (e = row
// offset * n + column) uses ptr[e & mask].  mask = n - 1 for a diagonal shared by
// the rows of the chunk, mask = ~0 for one diagonal row per data row (ptr then
// points at the chunk's first row).  ptr == nullptr means the identity.
template <typename T>
struct Diagonal {
  const T* ptr;
  int64_t mask;
};

// The chunk that the next call reads (and writes, when it writes elsewhere): prefetched
// into L2 while this one computes in L1, so that memory does not idle during those passes.
template <typename T>
struct Ahead {
  const T* read = nullptr;
  T* write = nullptr;  // nullptr: in place, or nothing to prefetch
  Ahead advanced(int64_t by) const {
    return {read == nullptr ? nullptr : read + by, write == nullptr ? nullptr : write + by};
  }
};

// log2(R) butterfly stages across R vectors held in registers (strides 1, 2, ... in a[]).
template <int R, typename V>
inline void butterflies(V* a) {
#pragma GCC unroll 16
  for (int s = 1; s < R; s <<= 1) {
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) {
      if ((k & s) == 0) {
        const V u = a[k];
        const V w = a[k + s];
        a[k] = u + w;
        a[k + s] = u - w;
      }
    }
  }
}

// Stages with strides h, 2h, ..., (R/2)h over len elements, one vector column at a
// time in registers: reads src (times pre), optionally multiplies by post * scale,
// stores to dst (which may equal src).  The len elements of `ahead` are prefetched along
// the way.
template <int R, typename T>
inline void strided_pass(const T* src, Diagonal<T> pre, T* dst, int64_t len, int64_t h, Diagonal<T> post, T scale,
                         Ahead<T> ahead = {}) {
  using V = typename Vec<T>::type;
  constexpr int64_t W = Vec<T>::width;
  constexpr int64_t line = 64 / sizeof(T);
  for (int64_t base = 0; base < len; base += R * h) {
    for (int64_t j = 0; j < h; j += W) {
      const int64_t e = base + j;
      if (ahead.read != nullptr) {
        for (int64_t m = 0; m < R * W; m += line) __builtin_prefetch(ahead.read + m, 0, 2);
        if (ahead.write != nullptr) {
          for (int64_t m = 0; m < R * W; m += line) __builtin_prefetch(ahead.write + m, 1, 2);
        }
        ahead = ahead.advanced(R * W);
      }
      V a[R];
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) {
        a[k] = load<V>(src + e + k * h);
        if (pre.ptr != nullptr) a[k] *= load<V>(pre.ptr + ((e + k * h) & pre.mask));
      }
      butterflies<R>(a);
      if (post.ptr != nullptr) {
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) a[k] *= load<V>(post.ptr + ((e + k * h) & post.mask)) * scale;
      } else if (scale != T(1)) {
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) a[k] *= scale;
      }
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) store(dst + e + k * h, a[k]);
    }
  }
}

template <int R, typename T>
inline void cross_vector_pass(T* x, int64_t len, int64_t h, Diagonal<T> post, T scale) {
  strided_pass<R>(x, Diagonal<T>{nullptr, 0}, x, len, h, post, scale);
}

// One strided pass of radix 2^radix_log (at most 16).
template <typename T>
void strided_pass_of(int radix_log, const T* src, Diagonal<T> pre, T* dst, int64_t len, int64_t h, Diagonal<T> post,
                     T scale, Ahead<T> ahead = {}) {
  switch (radix_log) {
    case 1: strided_pass<2>(src, pre, dst, len, h, post, scale, ahead); break;
    case 2: strided_pass<4>(src, pre, dst, len, h, post, scale, ahead); break;
    case 3: strided_pass<8>(src, pre, dst, len, h, post, scale, ahead); break;
    default: strided_pass<16>(src, pre, dst, len, h, post, scale, ahead); break;
  }
}

// First pass: read R consecutive vectors of src (times pre), finish the in-vector
// stages and R/2 .. strides W, 2W, ..., (R/2)W across them, store to dst.
template <int R, typename T>
inline void first_pass(const T* src, Diagonal<T> pre, T* dst, int64_t len, Diagonal<T> post, T scale) {
  using V = typename Vec<T>::type;
  constexpr int64_t W = Vec<T>::width;
  for (int64_t base = 0; base < len; base += R * W) {
    V a[R];
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) {
      a[k] = load<V>(src + base + k * W);
      if (pre.ptr != nullptr) a[k] *= load<V>(pre.ptr + ((base + k * W) & pre.mask));
      a[k] = in_vector_stages(a[k]);
    }
    butterflies<R>(a);
    if (post.ptr != nullptr) {
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) a[k] *= load<V>(post.ptr + ((base + k * W) & post.mask)) * scale;
    } else if (scale != T(1)) {
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) a[k] *= scale;
    }
#pragma GCC unroll 16
    for (int k = 0; k < R; ++k) store(dst + base + k * W, a[k]);
  }
}

// Rows shorter than a vector: plain loops.
template <typename T>
void transform_scalar(const T* src, Diagonal<T> pre, T* dst, int64_t n, int64_t len, Diagonal<T> post, T scale) {
  for (int64_t e = 0; e < len; ++e) dst[e] = pre.ptr != nullptr ? src[e] * pre.ptr[e & pre.mask] : src[e];
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < len; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const T u = dst[j];
        const T v = dst[j + h];
        dst[j] = u + v;
        dst[j + h] = u - v;
      }
    }
  }
  for (int64_t e = 0; e < len; ++e) dst[e] *= post.ptr != nullptr ? post.ptr[e & post.mask] * scale : scale;
}

// Radix-8 passes, and a last pass of up to radix-16 (16 vectors: a few spills, cheaper than a pass).
inline int radix_log_for(int64_t stages) { return static_cast<int>(stages <= 4 ? stages : 3); }

// For each of the len / n rows of a chunk: dst = post * scale * H (pre * src), with H
// the unnormalized (+-1) matrix of size n, n at most l1_block<T>().  dst may equal src.
// `ahead`: the next call's len elements, prefetched during the first pass that works in L1
// only.
template <typename T>
void transform_short_rows(const T* src, Diagonal<T> pre, T* dst, int64_t n, int64_t len, Diagonal<T> post, T scale,
                          Ahead<T> ahead = {}) {
  constexpr int64_t W = Vec<T>::width;
  if (n < W) {
    transform_scalar(src, pre, dst, n, len, post, scale);
    return;
  }
  int64_t cross_stages = 0;
  for (int64_t m = n / W; m > 1; m >>= 1) ++cross_stages;
  const Diagonal<T> none{nullptr, 0};
  // The first pass also does the in-vector stages: at most radix-8 there, or it spills.
  int radix_log = static_cast<int>(std::min<int64_t>(cross_stages, 3));
  bool last = radix_log == cross_stages;
  switch (radix_log) {
    case 0: first_pass<1>(src, pre, dst, len, post, scale); break;
    case 1: first_pass<2>(src, pre, dst, len, last ? post : none, last ? scale : T(1)); break;
    case 2: first_pass<4>(src, pre, dst, len, last ? post : none, last ? scale : T(1)); break;
    default: first_pass<8>(src, pre, dst, len, last ? post : none, last ? scale : T(1)); break;
  }
  int64_t h = W << radix_log;
  cross_stages -= radix_log;
  while (cross_stages > 0) {
    radix_log = radix_log_for(cross_stages);
    last = radix_log == cross_stages;
    strided_pass_of<T>(radix_log, dst, none, dst, len, h, last ? post : none, last ? scale : T(1), ahead);
    ahead = {};
    h <<= radix_log;
    cross_stages -= radix_log;
  }
}

// Bytes of a block that stays in L1 through all of its passes: the largest power of two within
// two thirds of the L1 data cache (32 KiB of a 48 KiB L1: measured 20% faster than 16 KiB at
// D = 8192), 16 KiB where the size is unknown.
inline int64_t l1_block_bytes() {
  static const int64_t bytes = [] {
    int64_t l1 = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    l1 = static_cast<int64_t>(sysconf(_SC_LEVEL1_DCACHE_SIZE));
#endif
    int64_t block = 16384;
    while (block < 65536 && 3 * 2 * block <= 2 * l1) block *= 2;
    return block;
  }();
  return bytes;
}

template <typename T>
inline int64_t l1_block() {
  return l1_block_bytes() / static_cast<int64_t>(sizeof(T));
}

// A diagonal seen from element `offset` of its chunk on, over `span` elements (both powers of
// two times the block, offset a multiple of span).
template <typename T>
inline Diagonal<T> diagonal_from(Diagonal<T> d, int64_t offset, int64_t span) {
  if (d.ptr == nullptr) return d;
  if (d.mask == ~int64_t{0}) return {d.ptr + offset, d.mask};
  return {d.ptr + (offset & d.mask), std::min(d.mask, span - 1)};
}

// A row longer than an L1 block: the stages with strides of a block or more first, in strided
// passes over the whole row (which stays in L2; the first reads src and pre), then every block
// on its own with all the shorter strides in L1.  The stages commute, so the order is free;
// this reads the row from L2 about twice instead of once per radix-8 pass.
template <typename T>
void transform_long_row(const T* src, Diagonal<T> pre, T* dst, int64_t n, Diagonal<T> post, T scale,
                        Ahead<T> ahead = {}) {
  const int64_t block = l1_block<T>();
  const Diagonal<T> none{nullptr, 0};
  int64_t high_stages = 0;
  for (int64_t m = n / block; m > 1; m >>= 1) ++high_stages;
  int64_t h = block;
  bool first = true;
  while (high_stages > 0) {
    const int radix_log = radix_log_for(high_stages);
    strided_pass_of<T>(radix_log, first ? src : dst, first ? pre : none, dst, n, h, none, T(1));
    first = false;
    h <<= radix_log;
    high_stages -= radix_log;
  }
  for (int64_t b = 0; b < n; b += block) {
    transform_short_rows<T>(dst + b, none, dst + b, block, block, diagonal_from(post, b, block), scale,
                            ahead.advanced(b));
  }
}

// For each of the len / n rows of a chunk: dst = post * scale * H (pre * src), with H
// the unnormalized (+-1) matrix of size n.  dst may equal src.  `ahead` (optional): the
// next call's chunk, prefetched while this one computes in cache.
template <typename T>
void transform_chunk(const T* src, Diagonal<T> pre, T* dst, int64_t n, int64_t len, Diagonal<T> post, T scale,
                     Ahead<T> ahead = {}) {
  if (n <= l1_block<T>()) {
    transform_short_rows(src, pre, dst, n, len, post, scale, ahead);
    return;
  }
  for (int64_t e = 0; e < len; e += n) {
    const Ahead<T> next = e + n < len ? Ahead<T>{src + e + n, dst == src ? nullptr : dst + e + n} : ahead;
    transform_long_row(src + e, diagonal_from(pre, e, n), dst + e, n, diagonal_from(post, e, n), scale, next);
  }
}

// How a diagonal operand with `period` rows (of `rows` data rows) is addressed.
template <typename T>
struct DiagonalOperand {
  const T* data;
  int64_t period;
  int64_t rows;
  int64_t n;
  bool shared() const { return period == 1; }
  bool per_row() const { return period == rows; }
  bool chunkable() const { return shared() || per_row(); }
  // The view of a chunk starting at row r0 (a general period needs one-row chunks).
  Diagonal<T> at(int64_t r0) const {
    if (per_row()) return {data + r0 * n, ~int64_t{0}};
    return {data + (r0 % period) * n, n - 1};
  }
};

// Rows per chunk: whole rows, about 16 KiB, so that every pass over a chunk hits L1.
template <typename T>
int64_t chunk_rows(int64_t n, bool chunkable) {
  if (!chunkable) return 1;
  return std::max<int64_t>(1, static_cast<int64_t>(16384 / sizeof(T)) / n);
}

template <typename T>
inline void multiply_into(T* __restrict out, const T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// acc[e & mask] += a[e] * b[e] over a chunk.
template <typename Acc, typename T>
inline void accumulate_product(Acc* __restrict acc, int64_t mask, const T* __restrict a, const T* __restrict b,
                               int64_t len) {
  for (int64_t e = 0; e < len; ++e) acc[e & mask] += static_cast<Acc>(a[e]) * static_cast<Acc>(b[e]);
}

// Tasks of at least ~16k elements: below that, threads cost more than they save.
inline int64_t grain_rows(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 14) / n); }

// ---------------------------------------------------------------------------
// Argument checks (the Python wrapper gives friendlier messages first; these
// guard direct torch.ops calls).

inline int64_t check_rows(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": expected a tensor with at least one dimension");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": the compiled CPU kernel supports float32 and float64, got ", x.scalar_type());
  const int64_t n = x.size(-1);
  TORCH_CHECK(n > 0 && (n & (n - 1)) == 0, op, ": the last dimension must be a power of two, got ", n);
  return n;
}

inline int64_t diagonal_period(const at::Tensor& d, const at::Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(d.scalar_type() == x.scalar_type(), op, ": ", name, " has dtype ", d.scalar_type(),
              " but x has ", x.scalar_type());
  TORCH_CHECK(d.device() == x.device(), op, ": ", name, " is on ", d.device(), " but x is on ", x.device());
  TORCH_CHECK(d.dim() >= 1 && d.dim() <= x.dim(), op, ": ", name, " must have 1 to x.dim() dimensions");
  const int64_t offset = x.dim() - d.dim();
  for (int64_t k = 0; k < d.dim(); ++k) {
    TORCH_CHECK(d.size(k) == x.size(offset + k), op, ": the shape of ", name, " ", d.sizes(),
                " must equal the trailing dimensions of x ", x.sizes());
  }
  return d.numel() / x.size(-1);
}

// ---------------------------------------------------------------------------
// Forward kernels.

template <typename F>
void for_each_chunk(int64_t begin, int64_t end, int64_t rows_per_chunk, F&& f) {
  for (int64_t r0 = begin; r0 < end; r0 += rows_per_chunk) f(r0, std::min(rows_per_chunk, end - r0));
}

}  // namespace detail
}  // namespace pyro_whvi
