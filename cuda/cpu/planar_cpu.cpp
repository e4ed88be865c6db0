// Compiled CPU kernels of the planar flow (Rezende & Mohamed 2015), as Pyro's `Planar` defines it:
//
//   alpha = u.w,  a = softplus(alpha) - 1,  u_hat = u + (a - alpha) w / |w|^2   (so w.u_hat = a > -1)
//   t = tanh(w.x + b),  y = x + t u_hat,  log|det J| = log|1 + (1 - t^2) a|
//
// one pass over the rows forward and one backward, instead of the thirty-odd small ops (each with
// an autograd node) that Pyro's module runs per call: NF-WHVI applies its flows to every weight
// site's g and to the per-example draws of every step. The log-determinant uses w.u_hat = a, which
// Pyro computes as a matrix product. Schemas, the reference kernels (any device), the fake kernels
// and the autograd of other devices are registered from Python (pyro_whvi/ops/planar.py); these
// serve CPU tensors in float32/float64, and the CPU autograd kernel is here.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>

#include <cmath>
#include <tuple>

namespace pyro_whvi {
namespace {

constexpr const char* kOp = "pyro_whvi::planar";

// Pyro's u_hat and what its backward needs, from u and w (D,).
template <typename T>
struct Hat {
  T alpha, norm2, a, c, dsoftplus;
};

template <typename T>
Hat<T> hat(const T* u, const T* w, int64_t d) {
  T alpha = 0, norm2 = 0;
  for (int64_t i = 0; i < d; ++i) {
    alpha += u[i] * w[i];
    norm2 += w[i] * w[i];
  }
  // torch.nn.functional.softplus (beta 1, threshold 20) and its derivative.
  const bool linear = alpha > T(20);
  const T softplus = linear ? alpha : std::log1p(std::exp(alpha));
  const T dsoftplus = linear ? T(1) : T(1) / (T(1) + std::exp(-alpha));
  const T a = softplus - T(1);
  return {alpha, norm2, a, (a - alpha) / norm2, dsoftplus};
}

void check_args(const at::Tensor& x, const at::Tensor& u, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, kOp, ": x must be (..., D) with D > 0, got ", x.sizes());
  const int64_t d = x.size(-1);
  TORCH_CHECK(u.dim() == 1 && u.size(0) == d && w.dim() == 1 && w.size(0) == d, kOp, ": u and w must be (", d,
              ",), got ", u.sizes(), " and ", w.sizes());
  TORCH_CHECK(bias.numel() == 1, kOp, ": bias must hold one value, got ", bias.sizes());
  for (const at::Tensor* t : {&u, &w, &bias})
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->device() == x.device(), kOp,
                ": u, w and bias must have x's dtype and device");
}

std::tuple<at::Tensor, at::Tensor> planar_cpu(const at::Tensor& x_in, const at::Tensor& u_in, const at::Tensor& w_in,
                                              const at::Tensor& bias_in) {
  check_args(x_in, u_in, w_in, bias_in);
  const at::Tensor x = x_in.contiguous(), u = u_in.contiguous(), w = w_in.contiguous(), bias = bias_in.contiguous();
  const int64_t d = x.size(-1), rows = x.numel() / d;
  at::Tensor y = at::empty_like(x), log_det = at::empty(x.sizes().slice(0, x.dim() - 1), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "planar_cpu", [&] {
    const scalar_t *xp = x.const_data_ptr<scalar_t>(), *up = u.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    const scalar_t b = *bias.const_data_ptr<scalar_t>();
    scalar_t *yp = y.mutable_data_ptr<scalar_t>(), *lp = log_det.mutable_data_ptr<scalar_t>();
    const Hat<scalar_t> h = hat(up, wp, d);
    at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xp + r * d;
        scalar_t* yr = yp + r * d;
        scalar_t lin = b;
        for (int64_t i = 0; i < d; ++i) lin += wp[i] * xr[i];
        const scalar_t t = std::tanh(lin);
        for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] + t * (up[i] + h.c * wp[i]);
        lp[r] = std::log(std::abs(scalar_t(1) + (scalar_t(1) - t * t) * h.a));
      }
    });
  });
  return {y, log_det};
}

// Vector-Jacobian products for x, u, w and bias; an undefined grad_y or grad_log_det counts as zero.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> planar_backward_cpu(
    const at::Tensor& grad_y_in, const at::Tensor& grad_log_det_in, const at::Tensor& x_in, const at::Tensor& u_in,
    const at::Tensor& w_in, const at::Tensor& bias_in) {
  check_args(x_in, u_in, w_in, bias_in);
  const at::Tensor x = x_in.contiguous(), u = u_in.contiguous(), w = w_in.contiguous(), bias = bias_in.contiguous();
  const bool has_y = grad_y_in.defined(), has_log_det = grad_log_det_in.defined();
  const at::Tensor grad_y = has_y ? grad_y_in.contiguous() : grad_y_in;
  const at::Tensor grad_log_det = has_log_det ? grad_log_det_in.contiguous() : grad_log_det_in;
  TORCH_CHECK(!has_y || grad_y.sizes() == x.sizes(), kOp, ": grad of y must have x's shape");
  TORCH_CHECK(!has_log_det || grad_log_det.numel() == x.numel() / x.size(-1), kOp,
              ": grad of log_det must have one entry per row of x");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  at::Tensor grad_x = at::empty_like(x), grad_u = at::zeros_like(u), grad_w = at::zeros_like(w);
  at::Tensor grad_bias = at::zeros_like(bias);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "planar_backward_cpu", [&] {
    using T = scalar_t;
    const T *xp = x.const_data_ptr<T>(), *up = u.const_data_ptr<T>(), *wp = w.const_data_ptr<T>();
    const T b = *bias.const_data_ptr<T>();
    const T* gyp = has_y ? grad_y.const_data_ptr<T>() : nullptr;
    const T* glp = has_log_det ? grad_log_det.const_data_ptr<T>() : nullptr;
    T *gxp = grad_x.mutable_data_ptr<T>(), *gup = grad_u.mutable_data_ptr<T>(), *gwp = grad_w.mutable_data_ptr<T>();
    const Hat<T> h = hat(up, wp, d);
    // grad_u accumulates the gradient of u_hat first.
    T grad_a = 0, grad_b = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * d;
      const T* gyr = has_y ? gyp + r * d : nullptr;
      T* gxr = gxp + r * d;
      T lin = b;
      for (int64_t i = 0; i < d; ++i) lin += wp[i] * xr[i];
      const T t = std::tanh(lin), s = T(1) - t * t;
      T grad_t = 0;
      if (has_y) {
        for (int64_t i = 0; i < d; ++i) {
          grad_t += gyr[i] * (up[i] + h.c * wp[i]);
          gup[i] += gyr[i] * t;
        }
      }
      if (has_log_det) {
        const T scaled = glp[r] / (T(1) + s * h.a);
        grad_a += scaled * s;
        grad_t -= scaled * h.a * T(2) * t;
      }
      const T grad_lin = grad_t * s;
      grad_b += grad_lin;
      for (int64_t i = 0; i < d; ++i) {
        gxr[i] = (has_y ? gyr[i] : T(0)) + grad_lin * wp[i];
        gwp[i] += grad_lin * xr[i];
      }
    }
    // u_hat = u + c w with c = (a - alpha) / |w|^2, a = softplus(alpha) - 1, alpha = u.w.
    T grad_c = 0;
    for (int64_t i = 0; i < d; ++i) grad_c += gup[i] * wp[i];
    grad_a += grad_c / h.norm2;
    const T grad_alpha = grad_a * h.dsoftplus - grad_c / h.norm2;
    const T grad_norm2 = -grad_c * h.c / h.norm2;
    for (int64_t i = 0; i < d; ++i) {
      const T grad_u_hat = gup[i];
      gwp[i] += h.c * grad_u_hat + T(2) * grad_norm2 * wp[i] + grad_alpha * up[i];
      gup[i] = grad_u_hat + grad_alpha * wp[i];
    }
    *grad_bias.mutable_data_ptr<T>() = grad_b;
  });
  return {grad_x, grad_u, grad_w, grad_bias};
}

// Through the dispatcher, so that fake tensors (torch.compile) reach the fake kernel.
std::tuple<at::Tensor, at::Tensor> call_planar(const at::Tensor& x, const at::Tensor& u, const at::Tensor& w,
                                               const at::Tensor& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyro_whvi::planar", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, const at::Tensor&)>();
  return op.call(x, u, w, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_planar_backward(
    const at::Tensor& grad_y, const at::Tensor& grad_log_det, const at::Tensor& x, const at::Tensor& u,
    const at::Tensor& w, const at::Tensor& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyro_whvi::planar_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(grad_y.defined() ? std::optional<at::Tensor>(grad_y) : std::nullopt,
                 grad_log_det.defined() ? std::optional<at::Tensor>(grad_log_det) : std::nullopt, x, u, w, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> planar_backward_op_cpu(
    const std::optional<at::Tensor>& grad_y, const std::optional<at::Tensor>& grad_log_det, const at::Tensor& x,
    const at::Tensor& u, const at::Tensor& w, const at::Tensor& bias) {
  return planar_backward_cpu(grad_y.value_or(at::Tensor()), grad_log_det.value_or(at::Tensor()), x, u, w, bias);
}

// The same vector-Jacobian products composed of differentiable ATen ops: the backward under
// create_graph=True, so that higher derivatives are right (the fused kernel has none of its own).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> planar_backward_differentiable(
    const at::Tensor& grad_y, const at::Tensor& grad_log_det, const at::Tensor& x, const at::Tensor& u,
    const at::Tensor& w, const at::Tensor& bias) {
  const at::Tensor alpha = (u * w).sum(), norm2 = (w * w).sum();
  const at::Tensor a = at::softplus(alpha) - 1, c = (a - alpha) / norm2, u_hat = u + c * w;
  const at::Tensor t = at::tanh(at::matmul(x, w) + bias.reshape({})), s = 1 - t * t;
  at::Tensor grad_t = at::zeros_like(t), grad_a = at::zeros_like(a), grad_u_hat = at::zeros_like(u);
  if (grad_y.defined()) {
    grad_t = at::matmul(grad_y, u_hat);
    grad_u_hat = (grad_y * t.unsqueeze(-1)).reshape({-1, x.size(-1)}).sum(0);
  }
  if (grad_log_det.defined()) {
    const at::Tensor scaled = grad_log_det / (1 + s * a);
    grad_a = (scaled * s).sum();
    grad_t = grad_t - scaled * a * 2 * t;
  }
  const at::Tensor grad_lin = grad_t * s;
  const at::Tensor grad_x = (grad_y.defined() ? grad_y : at::zeros_like(x)) + grad_lin.unsqueeze(-1) * w;
  const at::Tensor grad_c = (grad_u_hat * w).sum();
  grad_a = grad_a + grad_c / norm2;
  const at::Tensor grad_alpha = grad_a * at::sigmoid(alpha) * (alpha <= 20) + grad_a * (alpha > 20) - grad_c / norm2;
  const at::Tensor grad_w = (grad_lin.unsqueeze(-1) * x).reshape({-1, x.size(-1)}).sum(0) + c * grad_u_hat -
                            2 * grad_c * c / norm2 * w + grad_alpha * u;
  return {grad_x, grad_u_hat + grad_alpha * w, grad_w, grad_lin.sum().reshape(bias.sizes())};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class PlanarFunction : public torch::autograd::Function<PlanarFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& u, const at::Tensor& w,
                               const at::Tensor& bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({x, u, w, bias});
    auto [y, log_det] = call_planar(x, u, w, bias);
    return {y, log_det};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (at::GradMode::is_enabled()) {
      auto [gx, gu, gw, gb] = planar_backward_differentiable(grads[0], grads[1], saved[0], saved[1], saved[2], saved[3]);
      return {gx, gu, gw, gb};
    }
    auto [gx, gu, gw, gb] = call_planar_backward(grads[0], grads[1], saved[0], saved[1], saved[2], saved[3]);
    return {gx, gu, gw, gb};
  }
};

std::tuple<at::Tensor, at::Tensor> planar_autograd(const at::Tensor& x, const at::Tensor& u, const at::Tensor& w,
                                                   const at::Tensor& bias) {
  if (!torch::autograd::compute_requires_grad(x, u, w, bias)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_planar(x, u, w, bias);
  }
  const auto outputs = PlanarFunction::apply(x, u, w, bias);
  return {outputs[0], outputs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyro_whvi, CPU, m) {
  m.impl("planar", &planar_cpu);
  m.impl("planar_backward", &planar_backward_op_cpu);
}

TORCH_LIBRARY_IMPL(pyro_whvi, AutogradCPU, m) { m.impl("planar", &planar_autograd); }

}  // namespace pyro_whvi
