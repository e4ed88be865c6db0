// Compiled CPU kernels for pyro_whvi's Walsh–Hadamard ops.
//
// The operator schemas, the pure-PyTorch reference kernels and the fake (meta)
// kernels are registered from Python (pyro_whvi/ops/_library.py).  This file adds
// the CPU kernels and a C++ autograd kernel for CPU tensors, so that a call from
// Python on a CPU tensor never re-enters the interpreter.
//
// Layout: every op works on rows of length n (a power of two).  A "diagonal"
// argument (s1, g, s2) holds `period` rows of length n, and data row r uses the
// diagonal's row r % period: period 1 is a shared (n,) vector, period == rows is
// one diagonal per example, anything in between is a diagonal whose shape is a
// suffix of the data's shape (e.g. stacked WHVI blocks).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace pyro_whvi {
namespace {

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
// A row of up to 2^12 floats stays in L1 between passes: the data is read from and
// written to memory once.

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
// time in registers; optionally multiplies by post * scale before storing.
template <int R, typename T>
inline void cross_vector_pass(T* x, int64_t len, int64_t h, Diagonal<T> post, T scale) {
  using V = typename Vec<T>::type;
  constexpr int64_t W = Vec<T>::width;
  for (int64_t base = 0; base < len; base += R * h) {
    for (int64_t j = 0; j < h; j += W) {
      T* p = x + base + j;
      V a[R];
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) a[k] = load<V>(p + k * h);
      butterflies<R>(a);
      if (post.ptr != nullptr) {
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) a[k] *= load<V>(post.ptr + ((base + j + k * h) & post.mask)) * scale;
      } else if (scale != T(1)) {
#pragma GCC unroll 16
        for (int k = 0; k < R; ++k) a[k] *= scale;
      }
#pragma GCC unroll 16
      for (int k = 0; k < R; ++k) store(p + k * h, a[k]);
    }
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

// For each of the len / n rows of a chunk: dst = post * scale * H (pre * src), with H
// the unnormalized (+-1) matrix of size n.  dst may equal src.
template <typename T>
void transform_chunk(const T* src, Diagonal<T> pre, T* dst, int64_t n, int64_t len, Diagonal<T> post, T scale) {
  constexpr int64_t W = Vec<T>::width;
  if (n < W) {
    transform_scalar(src, pre, dst, n, len, post, scale);
    return;
  }
  int64_t cross_stages = 0;
  for (int64_t m = n / W; m > 1; m >>= 1) ++cross_stages;
  // Radix-8 passes, and a last pass of up to radix-16 (16 vectors: a few spills, cheaper than a pass).
  auto radix_log_for = [](int64_t stages) -> int { return static_cast<int>(stages <= 4 ? stages : 3); };
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
    const Diagonal<T> p = last ? post : none;
    const T s = last ? scale : T(1);
    if (radix_log == 4) cross_vector_pass<16>(dst, len, h, p, s);
    else if (radix_log == 3) cross_vector_pass<8>(dst, len, h, p, s);
    else if (radix_log == 2) cross_vector_pass<4>(dst, len, h, p, s);
    else cross_vector_pass<2>(dst, len, h, p, s);
    h <<= radix_log;
    cross_stages -= radix_log;
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
int64_t grain_rows(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 14) / n); }

// ---------------------------------------------------------------------------
// Argument checks (the Python wrapper gives friendlier messages first; these
// guard direct torch.ops calls).

int64_t check_rows(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": expected a tensor with at least one dimension");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": the compiled CPU kernel supports float32 and float64, got ", x.scalar_type());
  const int64_t n = x.size(-1);
  TORCH_CHECK(n > 0 && (n & (n - 1)) == 0, op, ": the last dimension must be a power of two, got ", n);
  return n;
}

int64_t diagonal_period(const at::Tensor& d, const at::Tensor& x, const char* op, const char* name) {
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

at::Tensor fwht_cpu(const at::Tensor& x_in, bool normalized) {
  const int64_t n = check_rows(x_in, "pyro_whvi::fwht");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_fwht_cpu", [&] {
    const scalar_t* src = x.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t scale = normalized ? static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(n))) : scalar_t(1);
    const Diagonal<scalar_t> none{nullptr, 0};
    const int64_t per_chunk = chunk_rows<scalar_t>(n, true);
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for_each_chunk(begin, end, per_chunk, [&](int64_t r0, int64_t count) {
        transform_chunk<scalar_t>(src + r0 * n, none, dst + r0 * n, n, count * n, none, scale);
      });
    });
  });
  return out;
}

// y = s1 * H(g * H(s2 * x)) with the orthonormal H: two transforms per chunk in L1.
at::Tensor whvi_matvec_cpu(const at::Tensor& x_in, const at::Tensor& s1_in, const at::Tensor& g_in,
                           const at::Tensor& s2_in) {
  const char* op = "pyro_whvi::whvi_matvec";
  const int64_t n = check_rows(x_in, op);
  const int64_t p1 = diagonal_period(s1_in, x_in, op, "s1");
  const int64_t pg = diagonal_period(g_in, x_in, op, "g");
  const int64_t p2 = diagonal_period(s2_in, x_in, op, "s2");
  const at::Tensor x = x_in.contiguous(), s1 = s1_in.contiguous(), g = g_in.contiguous(), s2 = s2_in.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_whvi_matvec_cpu", [&] {
    const DiagonalOperand<scalar_t> d1{s1.const_data_ptr<scalar_t>(), p1, rows, n};
    const DiagonalOperand<scalar_t> dg{g.const_data_ptr<scalar_t>(), pg, rows, n};
    const DiagonalOperand<scalar_t> d2{s2.const_data_ptr<scalar_t>(), p2, rows, n};
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = out.data_ptr<scalar_t>();
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    const Diagonal<scalar_t> none{nullptr, 0};
    const int64_t per_chunk = chunk_rows<scalar_t>(n, d1.chunkable() && dg.chunkable() && d2.chunkable());
    at::parallel_for(0, rows, grain_rows(2 * n), [&](int64_t begin, int64_t end) {
      for_each_chunk(begin, end, per_chunk, [&](int64_t r0, int64_t count) {
        scalar_t* y = yp + r0 * n;
        // Both 1/sqrt(n) factors are folded into the first transform's output scaling.
        transform_chunk<scalar_t>(xp + r0 * n, d2.at(r0), y, n, count * n, dg.at(r0), inv_n);
        transform_chunk<scalar_t>(y, none, y, n, count * n, d1.at(r0), scalar_t(1));
      });
    });
  });
  return out;
}

// ---------------------------------------------------------------------------
// Backward of whvi_matvec.  With u = H(s2 x), v = H(g u), w = H(s1 dy), z = H(g w):
//   dx = s2 z,  ds1 = sum dy v,  dg = sum w u,  ds2 = sum x z,
// where each sum runs over the data rows that share the diagonal row.  A diagonal
// with one row per data row is written directly; others are accumulated per
// thread (in double) and reduced at the end.

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> whvi_matvec_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& x_in, const at::Tensor& s1_in, const at::Tensor& g_in,
    const at::Tensor& s2_in) {
  const char* op = "pyro_whvi::whvi_matvec_backward";
  const int64_t n = check_rows(x_in, op);
  TORCH_CHECK(grad_in.sizes() == x_in.sizes(), op, ": grad has shape ", grad_in.sizes(), " but x has ", x_in.sizes());
  const int64_t rows = x_in.numel() / n;
  const int64_t p1 = diagonal_period(s1_in, x_in, op, "s1");
  const int64_t pg = diagonal_period(g_in, x_in, op, "g");
  const int64_t p2 = diagonal_period(s2_in, x_in, op, "s2");
  const at::Tensor dy = grad_in.contiguous().to(x_in.scalar_type()), x = x_in.contiguous(), s1 = s1_in.contiguous(),
                   g = g_in.contiguous(), s2 = s2_in.contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor ds1 = at::empty_like(s1, at::MemoryFormat::Contiguous);
  at::Tensor dgt = at::empty_like(g, at::MemoryFormat::Contiguous);
  at::Tensor ds2 = at::empty_like(s2, at::MemoryFormat::Contiguous);

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_whvi_matvec_backward_cpu", [&] {
    using acc_t = double;
    const DiagonalOperand<scalar_t> d1{s1.const_data_ptr<scalar_t>(), p1, rows, n};
    const DiagonalOperand<scalar_t> dg{g.const_data_ptr<scalar_t>(), pg, rows, n};
    const DiagonalOperand<scalar_t> d2{s2.const_data_ptr<scalar_t>(), p2, rows, n};
    const int64_t threads = at::get_num_threads();
    // Per-thread accumulators for the diagonals that are shared between rows.
    const int64_t acc1 = d1.per_row() ? 0 : p1 * n, accg = dg.per_row() ? 0 : pg * n,
                  acc2 = d2.per_row() ? 0 : p2 * n;
    const int64_t acc_size = acc1 + accg + acc2;
    std::vector<acc_t> partial(static_cast<size_t>(threads * acc_size), acc_t(0));

    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    scalar_t* ds1p = ds1.data_ptr<scalar_t>();
    scalar_t* dgp = dgt.data_ptr<scalar_t>();
    scalar_t* ds2p = ds2.data_ptr<scalar_t>();
    const scalar_t scale = static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(n)));
    const Diagonal<scalar_t> none{nullptr, 0};
    const int64_t per_chunk = chunk_rows<scalar_t>(n, d1.chunkable() && dg.chunkable() && d2.chunkable());

    // ds = sum a * b for one diagonal: a direct write when it has a row per data row.
    auto gradient_of = [&](const DiagonalOperand<scalar_t>& d, scalar_t* out, acc_t* acc, int64_t r0, int64_t len,
                           const scalar_t* a, const scalar_t* b) {
      if (d.per_row()) {
        multiply_into(out + r0 * n, a, b, len);
      } else {
        accumulate_product(acc + (r0 % d.period) * n, n - 1, a, b, len);
      }
    };

    at::parallel_for(0, rows, grain_rows(4 * n), [&](int64_t begin, int64_t end) {
      acc_t* mine = partial.data() + at::get_thread_num() * acc_size;
      std::vector<scalar_t> u(static_cast<size_t>(per_chunk * n)), v(static_cast<size_t>(per_chunk * n));
      for_each_chunk(begin, end, per_chunk, [&](int64_t r0, int64_t count) {
        const int64_t len = count * n;
        const scalar_t* xr = xp + r0 * n;
        const scalar_t* dyr = dyp + r0 * n;
        scalar_t* dxr = dxp + r0 * n;
        transform_chunk<scalar_t>(xr, d2.at(r0), u.data(), n, len, none, scale);        // u
        transform_chunk<scalar_t>(u.data(), dg.at(r0), v.data(), n, len, none, scale);  // v
        gradient_of(d1, ds1p, mine, r0, len, dyr, v.data());
        transform_chunk<scalar_t>(dyr, d1.at(r0), v.data(), n, len, none, scale);  // w
        gradient_of(dg, dgp, mine + acc1, r0, len, v.data(), u.data());
        transform_chunk<scalar_t>(v.data(), dg.at(r0), dxr, n, len, none, scale);  // z
        gradient_of(d2, ds2p, mine + acc1 + accg, r0, len, xr, dxr);
        const Diagonal<scalar_t> s2c = d2.at(r0);
        for (int64_t e = 0; e < len; ++e) dxr[e] *= s2c.ptr[e & s2c.mask];
      });
    });

    auto reduce = [&](int64_t offset, int64_t size, scalar_t* out) {
      for (int64_t i = 0; i < size; ++i) {
        acc_t total = 0;
        for (int64_t t = 0; t < threads; ++t) total += partial[t * acc_size + offset + i];
        out[i] = static_cast<scalar_t>(total);
      }
    };
    if (!d1.per_row()) reduce(0, acc1, ds1p);
    if (!dg.per_row()) reduce(acc1, accg, dgp);
    if (!d2.per_row()) reduce(acc1 + accg, acc2, ds2p);
  });
  return {dx, ds1, dgt, ds2};
}

// ---------------------------------------------------------------------------
// Autograd for CPU tensors, in C++ so that no Python runs per call.  The
// backward goes through the dispatcher, so it lands on these same kernels.

at::Tensor call_fwht(const at::Tensor& x, bool normalized) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pyro_whvi::fwht", "").typed<at::Tensor(
      const at::Tensor&, bool)>();
  return op.call(x, normalized);
}

at::Tensor call_whvi_matvec(const at::Tensor& x, const at::Tensor& s1, const at::Tensor& g, const at::Tensor& s2) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pyro_whvi::whvi_matvec", "").typed<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x, s1, g, s2);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_whvi_matvec_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& s1, const at::Tensor& g, const at::Tensor& s2) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyro_whvi::whvi_matvec_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&)>();
  return op.call(dy, x, s1, g, s2);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FwhtFunction : public torch::autograd::Function<FwhtFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, bool normalized) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["normalized"] = normalized;
    return call_fwht(x, normalized);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // H is symmetric, so the vector-Jacobian product is the same transform.
    return {call_fwht(grads[0], ctx->saved_data["normalized"].toBool()), at::Tensor()};
  }
};

class WhviMatvecFunction : public torch::autograd::Function<WhviMatvecFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s1, const at::Tensor& g,
                            const at::Tensor& s2) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x, s1, g, s2});
    return call_whvi_matvec(x, s1, g, s2);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &s1 = saved[1], &g = saved[2], &s2 = saved[3];
    if (at::GradMode::is_enabled()) {
      // create_graph=True: compose differentiable ops so that higher derivatives are right
      // (the fused backward kernel has no derivative of its own).
      const at::Tensor dy = grads[0];
      const at::Tensor u = call_fwht(s2 * x, true), v = call_fwht(g * u, true);
      const at::Tensor w = call_fwht(s1 * dy, true), z = call_fwht(g * w, true);
      return {s2 * z, at::sum_to(dy * v, s1.sizes()), at::sum_to(w * u, g.sizes()), at::sum_to(x * z, s2.sizes())};
    }
    if (!ctx->needs_input_grad(1) && !ctx->needs_input_grad(2) && !ctx->needs_input_grad(3)) {
      // Only x needs a gradient (fixed random diagonals, e.g. SORF features): W^T = S2 H diag(g) H S1
      // is one fused product, two transforms instead of the four the diagonals' gradients need.
      return {call_whvi_matvec(grads[0].contiguous(), s2, g, s1), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto [dx, ds1, dg, ds2] = call_whvi_matvec_backward(grads[0], x, s1, g, s2);
    return {dx, ds1, dg, ds2};
  }
};

// Without inputs that need gradients, skip building a graph node (a measurable
// share of a small call).
at::Tensor fwht_autograd(const at::Tensor& x, bool normalized) {
  if (!torch::autograd::compute_requires_grad(x)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_fwht(x, normalized);
  }
  return FwhtFunction::apply(x, normalized);
}

at::Tensor whvi_matvec_autograd(const at::Tensor& x, const at::Tensor& s1, const at::Tensor& g,
                                const at::Tensor& s2) {
  if (!torch::autograd::compute_requires_grad(x, s1, g, s2)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_whvi_matvec(x, s1, g, s2);
  }
  return WhviMatvecFunction::apply(x, s1, g, s2);
}

}  // namespace

TORCH_LIBRARY_IMPL(pyro_whvi, CPU, m) {
  m.impl("fwht", &fwht_cpu);
  m.impl("whvi_matvec", &whvi_matvec_cpu);
  m.impl("whvi_matvec_backward", &whvi_matvec_backward_cpu);
}

TORCH_LIBRARY_IMPL(pyro_whvi, AutogradCPU, m) {
  m.impl("fwht", &fwht_autograd);
  m.impl("whvi_matvec", &whvi_matvec_autograd);
}

}  // namespace pyro_whvi
