// Compiled CPU kernels for pyro_whvi's Walsh–Hadamard ops.
//
// The operator schemas, the pure-PyTorch reference kernels and the fake (meta)
// kernels are registered from Python (pyro_whvi/ops/_library.py).  This file adds
// the CPU kernels and a C++ autograd kernel for CPU tensors, so that a call from
// Python on a CPU tensor never re-enters the interpreter.
//
// The row kernels live in row_kernels.h.  Layout: every op works on rows of length n
// (a power of two).  A "diagonal" argument (s1, g, s2) holds `period` rows of length n,
// and data row r uses the diagonal's row r % period: period 1 is a shared (n,) vector,
// period == rows is one diagonal per example, anything in between is a diagonal whose
// shape is a suffix of the data's shape (e.g. stacked WHVI blocks).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pyro_whvi {
namespace {

using namespace detail;

// Outputs of at least 32 MiB (glibc's largest mmap threshold: every such block is fresh pages
// from the kernel, while smaller freed blocks are reused) are allocated 2 MiB-aligned with
// transparent huge pages requested (as NumPy does, and torch only under $THP_MEM_ALLOC_ENABLE):
// 16 page faults instead of 8192 per 32 MiB, which took longer than the transform itself.
constexpr size_t kHugePageBytes = size_t{1} << 21;
constexpr size_t kHugePageThreshold = size_t{32} << 20;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
void free_huge(void* p) { std::free(p); }

struct HugePageAllocator final : public c10::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    const size_t size = (nbytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = nullptr;
    TORCH_CHECK(posix_memalign(&p, kHugePageBytes, size) == 0, "pyro_whvi: could not allocate ", nbytes, " bytes");
    madvise(p, size, MADV_HUGEPAGE);  // a hint: without THP it changes nothing
    return {p, p, &free_huge, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_huge; }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }
};

at::Tensor empty_output(const at::Tensor& x) {
  if (static_cast<size_t>(x.nbytes()) < kHugePageThreshold) return at::empty_like(x, at::MemoryFormat::Contiguous);
  static HugePageAllocator allocator;
  return at::detail::empty_generic(x.sizes(), &allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   x.scalar_type(), c10::nullopt);
}
#else
at::Tensor empty_output(const at::Tensor& x) { return at::empty_like(x, at::MemoryFormat::Contiguous); }
#endif

// out = H x row by row; both contiguous with the same shape, out may be x.
void fwht_into(const at::Tensor& x, const at::Tensor& out, bool normalized) {
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pyro_whvi_fwht_cpu", [&] {
    const scalar_t* src = x.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const scalar_t scale = normalized ? static_cast<scalar_t>(1.0 / std::sqrt(static_cast<double>(n))) : scalar_t(1);
    const Diagonal<scalar_t> none{nullptr, 0};
    const int64_t per_chunk = chunk_rows<scalar_t>(n, true);
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for_each_chunk(begin, end, per_chunk, [&](int64_t r0, int64_t count) {
        Ahead<scalar_t> next;
        if (r0 + 2 * count <= end) next = {src + (r0 + count) * n, dst == src ? nullptr : dst + (r0 + count) * n};
        transform_chunk<scalar_t>(src + r0 * n, none, dst + r0 * n, n, count * n, none, scale, next);
      });
    });
  });
}

at::Tensor fwht_cpu(const at::Tensor& x_in, bool normalized) {
  check_rows(x_in, "pyro_whvi::fwht");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = empty_output(x);
  fwht_into(x, out, normalized);
  return out;
}

void fwht_inplace_cpu(at::Tensor& x, bool normalized) {
  check_rows(x, "pyro_whvi::fwht_");
  if (x.is_contiguous()) {
    fwht_into(x, x, normalized);
    return;
  }
  at::assert_no_internal_overlap(x);
  const at::Tensor rows = x.contiguous();
  fwht_into(rows, rows, normalized);
  x.copy_(rows);
}

void fwht_out_cpu(const at::Tensor& x_in, bool normalized, at::Tensor& out) {
  const char* op = "pyro_whvi::fwht.out";
  check_rows(x_in, op);
  TORCH_CHECK(out.sizes() == x_in.sizes() && out.scalar_type() == x_in.scalar_type() && out.device() == x_in.device(),
              op, ": out must have x's shape ", x_in.sizes(), ", dtype ", x_in.scalar_type(), " and device ",
              x_in.device(), "; got ", out.sizes(), ", ", out.scalar_type(), ", ", out.device());
  at::assert_no_internal_overlap(out);
  at::assert_no_partial_overlap(out, x_in);  // out may be x itself
  const at::Tensor x = x_in.contiguous();
  if (out.is_contiguous()) {
    fwht_into(x, out, normalized);
    return;
  }
  const at::Tensor rows = x.is_same(x_in) ? at::empty_like(x, at::MemoryFormat::Contiguous) : x;
  fwht_into(x, rows, normalized);
  out.copy_(rows);
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

void call_fwht_inplace(at::Tensor& x, bool normalized) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pyro_whvi::fwht_", "").typed<void(at::Tensor&, bool)>();
  op.call(x, normalized);
}

void call_fwht_out(const at::Tensor& x, bool normalized, at::Tensor& out) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pyro_whvi::fwht", "out").typed<void(
      const at::Tensor&, bool, at::Tensor&)>();
  op.call(x, normalized, out);
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

// The in-place form on a tensor that needs a gradient: mark_dirty rebases x's history onto this
// node (and refuses a leaf that requires grad, as torch's own in-place ops do).
class FwhtInplaceFunction : public torch::autograd::Function<FwhtInplaceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, bool normalized) {
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      call_fwht_inplace(x, normalized);
    }
    torch::autograd::increment_version(x);
    ctx->saved_data["normalized"] = normalized;
    ctx->mark_dirty({x});
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
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

void fwht_inplace_autograd(at::Tensor& x, bool normalized) {
  const bool requires_grad = torch::autograd::compute_requires_grad(x);
  torch::autograd::check_inplace(x, requires_grad);  // before x changes: a leaf that requires grad raises
  if (requires_grad) {
    FwhtInplaceFunction::apply(x, normalized);
    return;
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    call_fwht_inplace(x, normalized);
  }
  torch::autograd::increment_version(x);
}

// As torch's out= ops: no autograd (the result would not be connected to x).
void fwht_out_autograd(const at::Tensor& x, bool normalized, at::Tensor& out) {
  TORCH_CHECK(!torch::autograd::compute_requires_grad(x, out),
              "pyro_whvi::fwht.out: out= does not support automatic differentiation, but x or out requires grad; "
              "call fwht(x) without out=, or detach the tensors");
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    call_fwht_out(x, normalized, out);
  }
  torch::autograd::increment_version(out);
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
  m.impl("fwht_", &fwht_inplace_cpu);
  m.impl("fwht.out", &fwht_out_cpu);
  m.impl("whvi_matvec", &whvi_matvec_cpu);
  m.impl("whvi_matvec_backward", &whvi_matvec_backward_cpu);
}

TORCH_LIBRARY_IMPL(pyro_whvi, AutogradCPU, m) {
  m.impl("fwht", &fwht_autograd);
  m.impl("fwht_", &fwht_inplace_autograd);
  m.impl("fwht.out", &fwht_out_autograd);
  m.impl("whvi_matvec", &whvi_matvec_autograd);
}

}  // namespace pyro_whvi
