// Compiled CPU kernels for the structured products built on the transform:
//
// * whvi_design:  y = diag(H S1 X S2 H) for D x D matrices X, the adjoint of the WHVI map
//   g -> S1 H diag(g) H S2 (the design of a linear model whose weights are a WHVI matrix).
//   With the unnormalized Sylvester matrix, H_ki H_kj = H_k,(i^j), so
//       y = D^-1 H c,   c_l = sum_i s1_i s2_(i^l) X_i,(i^l),
//   one pass over X and one length-D transform per matrix instead of D transforms.
// * whvi_fourier_design_backward:  the backward of whvi_design applied to random Fourier
//   features, straight to their angles (no D x D gradient in memory).
// * fastfood:  y_b = scale_b * H(gaussian_b * P_b(H(signs_b * x))) for every block b
//   (Le et al., 2013), both transforms and the permutation of a block in L1;
//   fastfood_transpose is its adjoint (the backward, and a linear op itself).
//
// Schemas, reference kernels, fake kernels and the autograd formulas are registered from
// Python (pyro_whvi/ops/_library.py); these kernels serve CPU tensors in float32/float64.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "row_kernels.h"

#include <tuple>
#include <vector>

namespace pyro_whvi {
namespace {

using namespace detail;

// ---------------------------------------------------------------------------
// whvi_design.  Row i of X adds s1_i s2_j X_ij to c at index i ^ j.  For j = a W + b
// (W the vector width), i ^ j = ((i / W) ^ a) W + ((i % W) ^ b): the vector of row i at
// column block a lands on column block (i / W) ^ a, permuted by t = i % W inside the
// vector.  Accumulating into one buffer per t and un-permuting once at the end keeps
// the hot loop to aligned vector loads and adds.

template <typename T>
void xor_accumulate(const T* x, const T* weights, int64_t n, T* partial, T* c) {
  using V = typename Vec<T>::type;
  constexpr int64_t W = Vec<T>::width;
  if (n < W) {
    std::fill(c, c + n, T(0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) c[i ^ j] += weights[i * n + j] * x[i * n + j];
    return;
  }
  std::fill(partial, partial + W * n, T(0));
  for (int64_t i = 0; i < n; ++i) {
    const T* row = x + i * n;
    const T* w = weights + i * n;
    T* acc = partial + (i % W) * n;
    const int64_t high = i / W;
    for (int64_t a = 0; a < n / W; ++a) {
      T* target = acc + (high ^ a) * W;
      store(target, load<V>(target) + load<V>(row + a * W) * load<V>(w + a * W));
    }
  }
  std::fill(c, c + n, T(0));
  for (int64_t t = 0; t < W; ++t)
    for (int64_t e = 0; e < n; ++e) c[(e & ~(W - 1)) | ((e & (W - 1)) ^ t)] += partial[t * n + e];
}

// shifted[t * n + e] = z[e ^ t] for t < W: row i of z[i ^ j] over j is, per vector
// block a, the block (i / W) ^ a of shifted copy i % W.
template <typename T>
void xor_shifted_copies(const T* z, int64_t n, T* shifted) {
  constexpr int64_t W = Vec<T>::width;
  for (int64_t t = 0; t < std::min(W, n); ++t)
    for (int64_t e = 0; e < n; ++e) shifted[t * n + e] = z[e ^ t];
}

// One matrix of whvi_design's backward, given z = D^-1 H dy: dx = weights * z[i ^ j] and
// q += x * z[i ^ j] (q accumulates the s1/s2 gradients over matrices).  `shifted` holds W * n.
template <typename T>
void xor_backward_matrix(const T* x, const T* weights, const T* z, int64_t n, T* shifted, T* dx, T* q) {
  using V = typename Vec<T>::type;
  constexpr int64_t W = Vec<T>::width;
  if (n < W) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        dx[i * n + j] = weights[i * n + j] * z[i ^ j];
        q[i * n + j] += x[i * n + j] * z[i ^ j];
      }
    }
    return;
  }
  xor_shifted_copies(z, n, shifted);
  for (int64_t i = 0; i < n; ++i) {
    const T* copy = shifted + (i % W) * n;
    const int64_t high = i / W;
    for (int64_t a = 0; a < n / W; ++a) {
      const V zz = load<V>(copy + (high ^ a) * W);
      const int64_t e = i * n + a * W;
      store(dx + e, load<V>(weights + e) * zz);
      store(q + e, load<V>(q + e) + load<V>(x + e) * zz);
    }
  }
}

// ds1 = Q s2 and ds2 = Q^T s1 from the per-thread partial sums of Q (threads, D, D), in double.
std::tuple<at::Tensor, at::Tensor> diagonal_gradients(const at::Tensor& partial_q, const at::Tensor& s1,
                                                      const at::Tensor& s2) {
  const at::Tensor total_q = partial_q.sum(0);
  return {at::mv(total_q, s2.to(at::kDouble)).to(s2.scalar_type()),
          at::mv(total_q.t(), s1.to(at::kDouble)).to(s1.scalar_type())};
}

void check_design_args(const at::Tensor& x, const at::Tensor& s1, const at::Tensor& s2, const char* op) {
  const int64_t n = check_rows(x, op);
  TORCH_CHECK(x.dim() >= 2 && x.size(-2) == n, op, ": x must be (..., D, D), got ", x.sizes());
  for (const at::Tensor* d : {&s1, &s2}) {
    TORCH_CHECK(d->dim() == 1 && d->size(0) == n, op, ": s1 and s2 must be (", n, ",), got ", d->sizes());
    TORCH_CHECK(d->scalar_type() == x.scalar_type() && d->device() == x.device(), op,
                ": s1, s2 and x must share dtype and device");
  }
}

at::Tensor whvi_design_cpu(const at::Tensor& x_in, const at::Tensor& s1, const at::Tensor& s2) {
  const char* op = "pyro_whvi::whvi_design";
  check_design_args(x_in, s1, s2, op);
  const int64_t n = x_in.size(-1);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor weights = at::outer(s1, s2).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  at::Tensor out = at::empty(out_shape, x.options());
  const int64_t matrices = x.numel() / (n * n);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_whvi_design_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = weights.const_data_ptr<scalar_t>();
    scalar_t* yp = out.data_ptr<scalar_t>();
    const Diagonal<scalar_t> none{nullptr, 0};
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    at::parallel_for(0, matrices, grain_rows(n * n), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> partial(static_cast<size_t>(Vec<scalar_t>::width * n));
      for (int64_t m = begin; m < end; ++m) {
        scalar_t* y = yp + m * n;
        xor_accumulate(xp + m * n * n, wp, n, partial.data(), y);
        transform_chunk<scalar_t>(y, none, y, n, n, none, inv_n);
      }
    });
  });
  return out;
}

// With z = D^-1 H dy (per matrix): dX_ij = s1_i s2_j z_(i^j), and with
// Q = sum over matrices of X_ij z_(i^j): ds1 = Q s2, ds2 = Q^T s1.
std::tuple<at::Tensor, at::Tensor, at::Tensor> whvi_design_backward_cpu(const at::Tensor& grad_in,
                                                                        const at::Tensor& x_in,
                                                                        const at::Tensor& s1_in,
                                                                        const at::Tensor& s2_in) {
  const char* op = "pyro_whvi::whvi_design_backward";
  check_design_args(x_in, s1_in, s2_in, op);
  const int64_t n = x_in.size(-1);
  TORCH_CHECK(grad_in.sizes() == x_in.sizes().slice(0, x_in.dim() - 1), op, ": grad has shape ", grad_in.sizes(),
              " but x has ", x_in.sizes());
  const at::Tensor dy = grad_in.contiguous().to(x_in.scalar_type()), x = x_in.contiguous(),
                   s1 = s1_in.contiguous(), s2 = s2_in.contiguous();
  const at::Tensor weights = at::outer(s1, s2).contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t matrices = x.numel() / (n * n);
  const int64_t threads = at::get_num_threads();
  at::Tensor partial_q = at::zeros({threads, n, n}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_whvi_design_backward_cpu", [&] {
    constexpr int64_t W = Vec<scalar_t>::width;
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = weights.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    double* qp = partial_q.data_ptr<double>();
    const Diagonal<scalar_t> none{nullptr, 0};
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    at::parallel_for(0, matrices, grain_rows(n * n), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> z(static_cast<size_t>(n)), shifted(static_cast<size_t>(W * n));
      std::vector<scalar_t> q(static_cast<size_t>(n * n), scalar_t(0));
      for (int64_t m = begin; m < end; ++m) {
        transform_chunk<scalar_t>(dyp + m * n, none, z.data(), n, n, none, inv_n);
        xor_backward_matrix(xp + m * n * n, wp, z.data(), n, shifted.data(), dxp + m * n * n, q.data());
      }
      double* mine = qp + at::get_thread_num() * n * n;
      for (int64_t e = 0; e < n * n; ++e) mine[e] += static_cast<double>(q[e]);
    });
  });
  const auto [ds1, ds2] = diagonal_gradients(partial_q, s1, s2);
  return {dx, ds1, ds2};
}

// ---------------------------------------------------------------------------
// whvi_fourier_design_backward: the backward of y = whvi_design(R) for random Fourier
// features R = [scale cos(A), scale sin(A), 0 ...] (F = 2m entries read row by row into
// the D x D matrix), straight to the angles A: with dR from whvi_design's backward,
//   dA_f = R_f dR_(f+m) - R_(f+m) dR_f,   d scale (per row) = sum_f dR_f R_f / scale,
// without materializing dR (one D x D buffer per thread, in L1/L2).  Returns dA, ds1,
// ds2 and the per-row sums sum_f dR_f R_f (the caller divides by the scale).

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> whvi_fourier_design_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& features_in, const at::Tensor& s1_in, const at::Tensor& s2_in) {
  const char* op = "pyro_whvi::whvi_fourier_design_backward";
  const int64_t n = check_rows(grad_in, op);
  const int64_t num_features = features_in.size(-1);
  TORCH_CHECK(num_features % 2 == 0 && num_features <= n * n, op, ": features must have an even number of entries ",
              "at most D^2 = ", n * n, ", got ", num_features);
  TORCH_CHECK(features_in.sizes().slice(0, features_in.dim() - 1) == grad_in.sizes().slice(0, grad_in.dim() - 1), op,
              ": grad ", grad_in.sizes(), " and features ", features_in.sizes(), " must share the batch shape");
  for (const at::Tensor* d : {&s1_in, &s2_in, &features_in}) {
    TORCH_CHECK(d->scalar_type() == grad_in.scalar_type() && d->device() == grad_in.device(), op,
                ": grad, features, s1 and s2 must share dtype and device");
  }
  TORCH_CHECK(s1_in.dim() == 1 && s1_in.size(0) == n && s2_in.sizes() == s1_in.sizes(), op, ": s1 and s2 must be (",
              n, ",)");
  const at::Tensor dy = grad_in.contiguous(), features = features_in.contiguous(), s1 = s1_in.contiguous(),
                   s2 = s2_in.contiguous();
  const at::Tensor weights = at::outer(s1, s2).contiguous();
  const int64_t half = num_features / 2;
  std::vector<int64_t> batch(dy.sizes().begin(), dy.sizes().end() - 1);
  std::vector<int64_t> angles_shape = batch;
  angles_shape.push_back(half);
  at::Tensor dangles = at::empty(angles_shape, dy.options());
  at::Tensor dscale = at::empty(batch, dy.options());
  const int64_t rows = dy.numel() / n;
  const int64_t threads = at::get_num_threads();
  at::Tensor partial_q = at::zeros({threads, n, n}, dy.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(dy.scalar_type(), "pyro_whvi_whvi_fourier_design_backward_cpu", [&] {
    using V = typename Vec<scalar_t>::type;
    constexpr int64_t W = Vec<scalar_t>::width;
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* fp = features.const_data_ptr<scalar_t>();
    const scalar_t* wp = weights.const_data_ptr<scalar_t>();
    scalar_t* dap = dangles.data_ptr<scalar_t>();
    scalar_t* dsp = dscale.data_ptr<scalar_t>();
    double* qp = partial_q.data_ptr<double>();
    const Diagonal<scalar_t> none{nullptr, 0};
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    at::parallel_for(0, rows, grain_rows(n * n), [&](int64_t begin, int64_t end) {
      const size_t area = static_cast<size_t>(n * n);
      std::vector<scalar_t> z(static_cast<size_t>(n)), shifted(static_cast<size_t>(W * n));
      std::vector<scalar_t> matrix(area, scalar_t(0)), dmatrix(area), q(area, scalar_t(0));
      for (int64_t r = begin; r < end; ++r) {
        transform_chunk<scalar_t>(dyp + r * n, none, z.data(), n, n, none, inv_n);
        const scalar_t* feature_row = fp + r * num_features;
        const scalar_t* x = feature_row;
        if (num_features < n * n) {  // zero-padded copy (the tail of `matrix` stays zero)
          std::copy(feature_row, feature_row + num_features, matrix.begin());
          x = matrix.data();
        }
        scalar_t* dx = dmatrix.data();
        xor_backward_matrix(x, wp, z.data(), n, shifted.data(), dx, q.data());
        scalar_t* da = dap + r * half;
        V acc = {};
        int64_t f = 0;
        for (; f + W <= half; f += W) {
          const V c = load<V>(x + f), s = load<V>(x + f + half), dc = load<V>(dx + f), ds = load<V>(dx + f + half);
          store(da + f, c * ds - s * dc);
          acc += c * dc + s * ds;
        }
        scalar_t total = 0;
        for (int64_t k = 0; k < W; ++k) total += acc[k];
        for (; f < half; ++f) {
          const scalar_t c = x[f], s = x[f + half], dc = dx[f], ds = dx[f + half];
          da[f] = c * ds - s * dc;
          total += c * dc + s * ds;
        }
        dsp[r] = total;
      }
      double* mine = qp + at::get_thread_num() * n * n;
      for (size_t e = 0; e < area; ++e) mine[e] += static_cast<double>(q[e]);
    });
  });
  const auto [ds1, ds2] = diagonal_gradients(partial_q, s1, s2);
  return {dangles, ds1, ds2, dscale};
}

// ---------------------------------------------------------------------------
// fastfood.  x (rows, P); signs, gaussian, scale (B, P); permutation (B, P) int64 with
// (P_b h)_i = h_(perm_bi), any index in [0, P) (the transpose scatter-adds, the adjoint of
// any gather); out (rows, B, P).  Both 1/sqrt(P) factors are folded into the last transform.

// The projection's random tensors, contiguous, with their sizes; FastfoodData reads them for one dtype.
struct FastfoodArgs {
  int64_t blocks;
  int64_t n;
  at::Tensor signs, permutation, gaussian, scale;
};

template <typename T>
struct FastfoodData {
  const T* signs;
  const int64_t* permutation;
  const T* gaussian;
  const T* scale;
  explicit FastfoodData(const FastfoodArgs& a)
      : signs(a.signs.const_data_ptr<T>()),
        permutation(a.permutation.const_data_ptr<int64_t>()),
        gaussian(a.gaussian.const_data_ptr<T>()),
        scale(a.scale.const_data_ptr<T>()) {}
};

FastfoodArgs check_fastfood_args(const at::Tensor& data, const at::Tensor& signs, const at::Tensor& permutation,
                                 const at::Tensor& gaussian, const at::Tensor& scale, const char* op) {
  const int64_t n = check_rows(data, op);
  TORCH_CHECK(signs.dim() == 2 && signs.size(1) == n, op, ": signs must be (B, ", n, "), got ", signs.sizes());
  const int64_t blocks = signs.size(0);
  for (const at::Tensor* t : {&gaussian, &scale}) {
    TORCH_CHECK(t->sizes() == signs.sizes(), op, ": gaussian and scale must have the shape of signs ", signs.sizes(),
                ", got ", t->sizes());
  }
  for (const at::Tensor* t : {&signs, &gaussian, &scale}) {
    TORCH_CHECK(t->scalar_type() == data.scalar_type() && t->device() == data.device(), op,
                ": signs, gaussian and scale must share the data's dtype and device");
  }
  TORCH_CHECK(permutation.scalar_type() == at::kLong && permutation.sizes() == signs.sizes(), op,
              ": permutation must be an int64 tensor of shape ", signs.sizes());
  TORCH_CHECK(permutation.numel() == 0 ||
                  (permutation.min().item<int64_t>() >= 0 && permutation.max().item<int64_t>() < n),
              op, ": permutation entries must lie in [0, ", n, ")");
  return {blocks, n, signs.contiguous(), permutation.contiguous(), gaussian.contiguous(), scale.contiguous()};
}

at::Tensor fastfood_cpu(const at::Tensor& x_in, const at::Tensor& signs_in, const at::Tensor& permutation_in,
                        const at::Tensor& gaussian_in, const at::Tensor& scale_in) {
  const char* op = "pyro_whvi::fastfood";
  const FastfoodArgs args = check_fastfood_args(x_in, signs_in, permutation_in, gaussian_in, scale_in, op);
  const int64_t blocks = args.blocks, n = args.n;
  const at::Tensor x = x_in.contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(blocks);
  out_shape.push_back(n);
  at::Tensor out = at::empty(out_shape, x.options());
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_fastfood_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const FastfoodData<scalar_t> d(args);
    const scalar_t *sp = d.signs, *gp = d.gaussian, *cp = d.scale;
    const int64_t* pp = d.permutation;
    scalar_t* yp = out.data_ptr<scalar_t>();
    const Diagonal<scalar_t> none{nullptr, 0};
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    at::parallel_for(0, rows, grain_rows(2 * blocks * n), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> first(static_cast<size_t>(n)), second(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t offset = b * n;
          transform_chunk<scalar_t>(xp + r * n, {sp + offset, n - 1}, first.data(), n, n, none, scalar_t(1));
          for (int64_t i = 0; i < n; ++i) second[i] = first[pp[offset + i]] * gp[offset + i];
          transform_chunk<scalar_t>(second.data(), none, yp + (r * blocks + b) * n, n, n, {cp + offset, n - 1}, inv_n);
        }
      }
    });
  });
  return out;
}

// dx = sum_b signs_b * H(P_b^T (gaussian_b * H(scale_b * dy_b))).
at::Tensor fastfood_transpose_cpu(const at::Tensor& grad_in, const at::Tensor& signs_in,
                                  const at::Tensor& permutation_in, const at::Tensor& gaussian_in,
                                  const at::Tensor& scale_in) {
  const char* op = "pyro_whvi::fastfood_transpose";
  const FastfoodArgs args = check_fastfood_args(grad_in, signs_in, permutation_in, gaussian_in, scale_in, op);
  const int64_t blocks = args.blocks, n = args.n;
  TORCH_CHECK(grad_in.dim() >= 2 && grad_in.size(-2) == blocks, op, ": grad must be (..., ", blocks, ", ", n,
              "), got ", grad_in.sizes());
  const at::Tensor dy = grad_in.contiguous();
  std::vector<int64_t> out_shape(dy.sizes().begin(), dy.sizes().end() - 2);
  out_shape.push_back(n);
  at::Tensor out = at::empty(out_shape, dy.options());
  const int64_t rows = dy.numel() / (blocks * n);
  AT_DISPATCH_FLOATING_TYPES(dy.scalar_type(), "pyro_whvi_fastfood_transpose_cpu", [&] {
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const FastfoodData<scalar_t> d(args);
    const scalar_t *sp = d.signs, *gp = d.gaussian, *cp = d.scale;
    const int64_t* pp = d.permutation;
    scalar_t* dxp = out.data_ptr<scalar_t>();
    const Diagonal<scalar_t> none{nullptr, 0};
    const scalar_t inv_n = static_cast<scalar_t>(1.0 / static_cast<double>(n));
    at::parallel_for(0, rows, grain_rows(2 * blocks * n), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> first(static_cast<size_t>(n)), second(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* dx = dxp + r * n;
        std::fill(dx, dx + n, scalar_t(0));
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t offset = b * n;
          transform_chunk<scalar_t>(dyp + (r * blocks + b) * n, {cp + offset, n - 1}, first.data(), n, n, none,
                                    scalar_t(1));
          std::fill(second.begin(), second.end(), scalar_t(0));  // scatter-add: the adjoint of any gather
          for (int64_t i = 0; i < n; ++i) second[pp[offset + i]] += first[i] * gp[offset + i];
          transform_chunk<scalar_t>(second.data(), none, second.data(), n, n, {sp + offset, n - 1}, inv_n);
          for (int64_t i = 0; i < n; ++i) dx[i] += second[i];
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pyro_whvi, CPU, m) {
  m.impl("whvi_design", &whvi_design_cpu);
  m.impl("whvi_design_backward", &whvi_design_backward_cpu);
  m.impl("whvi_fourier_design_backward", &whvi_fourier_design_backward_cpu);
  m.impl("fastfood", &fastfood_cpu);
  m.impl("fastfood_transpose", &fastfood_transpose_cpu);
}

}  // namespace pyro_whvi
