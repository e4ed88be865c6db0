"""Registration of the ``pyro_whvi::*`` operators with ``torch.library``.

The schemas, the fake (meta) kernels used by ``torch.compile`` and the default kernels (the
pure-PyTorch reference, for every device) live here. The compiled extension overrides the CPU
kernels and the CPU autograd kernel from C++ (``cuda/cpu/fwht_cpu.cpp``); the CUDA kernels are
Triton's (``cuda/triton/``, :mod:`.triton_backend`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import reference, triton_backend

_LIB = torch.library.Library("pyro_whvi", "DEF")
_LIB.define("fwht(Tensor x, bool normalized=True) -> Tensor")
# The mutating forms return nothing (the caller holds the tensor): torch.compile's functionalization
# takes custom ops whose outputs carry no alias annotation.
_LIB.define("fwht_(Tensor(a!) x, bool normalized=True) -> ()")
_LIB.define("fwht.out(Tensor x, bool normalized=True, *, Tensor(a!) out) -> ()")
_LIB.define("whvi_matvec(Tensor x, Tensor s1, Tensor g, Tensor s2) -> Tensor")
_LIB.define(
    "whvi_matvec_backward(Tensor grad, Tensor x, Tensor s1, Tensor g, Tensor s2) -> (Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define("whvi_design(Tensor x, Tensor s1, Tensor s2) -> Tensor")
_LIB.define("whvi_design_backward(Tensor grad, Tensor x, Tensor s1, Tensor s2) -> (Tensor, Tensor, Tensor)")
_LIB.define(
    "whvi_fourier_design_backward(Tensor grad, Tensor features, Tensor s1, Tensor s2)"
    " -> (Tensor, Tensor, Tensor, Tensor)"
)
_LIB.define("fastfood(Tensor x, Tensor signs, Tensor permutation, Tensor gaussian, Tensor scale) -> Tensor")
_LIB.define(
    "fastfood_transpose(Tensor grad, Tensor signs, Tensor permutation, Tensor gaussian, Tensor scale) -> Tensor"
)


def _fwht_kernel(x: Tensor, normalized: bool = True) -> Tensor:
    return reference.fwht(x, normalized).contiguous()


def _fwht_inplace_kernel(x: Tensor, normalized: bool = True) -> None:
    reference.fwht_(x, normalized)


def _fwht_out_kernel(x: Tensor, normalized: bool = True, *, out: Tensor) -> None:
    out.copy_(reference.fwht(x, normalized))


def _whvi_matvec_kernel(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    return reference.whvi_matvec(x, s1, g, s2).contiguous()


def _whvi_matvec_backward_kernel(
    grad: Tensor, x: Tensor, s1: Tensor, g: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    grads = reference.whvi_matvec_backward(grad, x, s1, g, s2)
    return tuple(t.contiguous() for t in grads)  # type: ignore[return-value]


_LIB.impl("fwht", _fwht_kernel, "CompositeExplicitAutograd")
_LIB.impl("fwht_", _fwht_inplace_kernel, "CompositeExplicitAutograd")
_LIB.impl("fwht.out", _fwht_out_kernel, "CompositeExplicitAutograd")
_LIB.impl("whvi_matvec", _whvi_matvec_kernel, "CompositeExplicitAutograd")
_LIB.impl("whvi_matvec_backward", _whvi_matvec_backward_kernel, "CompositeExplicitAutograd")
_LIB.impl("whvi_design", lambda x, s1, s2: reference.whvi_design(x, s1, s2).contiguous(), "CompositeExplicitAutograd")
_LIB.impl(
    "whvi_design_backward",
    lambda grad, x, s1, s2: tuple(t.contiguous() for t in reference.whvi_design_backward(grad, x, s1, s2)),
    "CompositeExplicitAutograd",
)
_LIB.impl(
    "whvi_fourier_design_backward",
    lambda *args: tuple(t.contiguous() for t in reference.whvi_fourier_design_backward(*args)),
    "CompositeExplicitAutograd",
)
_LIB.impl("fastfood", lambda *args: reference.fastfood(*args).contiguous(), "CompositeExplicitAutograd")
_LIB.impl(
    "fastfood_transpose", lambda *args: reference.fastfood_transpose(*args).contiguous(), "CompositeExplicitAutograd"
)


def _contiguous_like(t: Tensor) -> Tensor:
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.register_fake("pyro_whvi::fwht", lib=_LIB)
def _fwht_fake(x: Tensor, normalized: bool = True) -> Tensor:
    return _contiguous_like(x)


@torch.library.register_fake("pyro_whvi::fwht_", lib=_LIB)
def _fwht_inplace_fake(x: Tensor, normalized: bool = True) -> None:
    return None


@torch.library.register_fake("pyro_whvi::fwht.out", lib=_LIB)
def _fwht_out_fake(x: Tensor, normalized: bool = True, *, out: Tensor) -> None:
    return None


@torch.library.register_fake("pyro_whvi::whvi_matvec", lib=_LIB)
def _whvi_matvec_fake(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    return _contiguous_like(x)


@torch.library.register_fake("pyro_whvi::whvi_matvec_backward", lib=_LIB)
def _whvi_matvec_backward_fake(
    grad: Tensor, x: Tensor, s1: Tensor, g: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _contiguous_like(x), _contiguous_like(s1), _contiguous_like(g), _contiguous_like(s2)


# Autograd for devices without a compiled autograd kernel (the CPU one is in C++).
def _fwht_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.normalized = inputs[1] if len(inputs) > 1 else True


def _fwht_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    return torch.ops.pyro_whvi.fwht(grad, ctx.normalized), None


# The mutating forms (register_autograd takes no mutable ops): the kernels run below autograd and
# bump the version counter that torch's ADInplaceOrView kernels bump for its own in-place ops. CPU
# tensors with the compiled kernels use the same logic in C++.
def _below_autograd(op: Any, mutated: Tensor, *args: Any, **kwargs: Any) -> None:
    with torch._C._AutoDispatchBelowADInplaceOrView():
        op(*args, **kwargs)
    torch.autograd.graph.increment_version(mutated)


class _FwhtInplace(torch.autograd.Function):
    """``fwht_`` on a tensor that needs a gradient: ``mark_dirty`` rebases its history onto this node
    (and refuses a leaf that requires grad, as torch's own in-place ops do)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, normalized: bool) -> Tensor:
        _below_autograd(torch.ops.pyro_whvi.fwht_.default, x, x, normalized)
        ctx.normalized = normalized
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return torch.ops.pyro_whvi.fwht(grad, ctx.normalized), None


def _check_inplace(x: Tensor) -> None:
    """Torch's own refusals for in-place ops (``check_inplace``), before ``x`` changes."""
    if x.is_leaf:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    base = x._base
    if base is not None and base.is_leaf and base.requires_grad:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")


def _fwht_inplace_autograd(x: Tensor, normalized: bool = True) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        _check_inplace(x)
        _FwhtInplace.apply(x, normalized)
    else:
        _below_autograd(torch.ops.pyro_whvi.fwht_.default, x, x, normalized)


def _fwht_out_autograd(x: Tensor, normalized: bool = True, *, out: Tensor) -> None:
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        raise RuntimeError(
            "pyro_whvi::fwht.out: out= does not support automatic differentiation, but x or out requires grad; "
            "call fwht(x) without out=, or detach the tensors"
        )
    _below_autograd(torch.ops.pyro_whvi.fwht.out, out, x, normalized, out=out)


_LIB.impl("fwht_", _fwht_inplace_autograd, "Autograd")
_LIB.impl("fwht.out", _fwht_out_autograd, "Autograd")


def _whvi_matvec_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _whvi_matvec_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, s1, g, s2 = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: differentiable composition for higher derivatives
        return reference.whvi_matvec_backward(grad, x, s1, g, s2)
    if not any(ctx.needs_input_grad[1:]):
        # Only x needs a gradient (e.g. fixed random diagonals): W^T = S2 H diag(g) H S1 is one fused
        # product, two transforms instead of the four that the diagonals' gradients need.
        return torch.ops.pyro_whvi.whvi_matvec(grad.contiguous(), s2, g, s1), None, None, None  # type: ignore[return-value]
    return torch.ops.pyro_whvi.whvi_matvec_backward(grad, x, s1, g, s2)


torch.library.register_autograd("pyro_whvi::fwht", _fwht_backward, setup_context=_fwht_setup_context, lib=_LIB)
torch.library.register_autograd(
    "pyro_whvi::whvi_matvec",
    _whvi_matvec_backward,
    setup_context=_whvi_matvec_setup_context,
    lib=_LIB,
)


@torch.library.register_fake("pyro_whvi::whvi_design", lib=_LIB)
def _whvi_design_fake(x: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1])


@torch.library.register_fake("pyro_whvi::whvi_design_backward", lib=_LIB)
def _whvi_design_backward_fake(grad: Tensor, x: Tensor, s1: Tensor, s2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _contiguous_like(x), _contiguous_like(s1), _contiguous_like(s2)


@torch.library.register_fake("pyro_whvi::whvi_fourier_design_backward", lib=_LIB)
def _whvi_fourier_design_backward_fake(
    grad: Tensor, features: Tensor, s1: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    half = features.shape[-1] // 2
    batch = grad.shape[:-1]
    return grad.new_empty((*batch, half)), _contiguous_like(s1), _contiguous_like(s2), grad.new_empty(batch)


@torch.library.register_fake("pyro_whvi::fastfood", lib=_LIB)
def _fastfood_fake(x: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], *signs.shape))


@torch.library.register_fake("pyro_whvi::fastfood_transpose", lib=_LIB)
def _fastfood_transpose_fake(
    grad: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor
) -> Tensor:
    return grad.new_empty((*grad.shape[:-2], grad.shape[-1]))


def _whvi_design_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _whvi_design_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    x, s1, s2 = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph=True: differentiable composition for higher derivatives
        grads = reference.whvi_design_backward(grad, x, s1, s2)
    else:
        grads = torch.ops.pyro_whvi.whvi_design_backward(grad.contiguous(), x, s1, s2)
    return tuple(g if needed else None for g, needed in zip(grads, ctx.needs_input_grad))


# Fastfood is linear in its first argument with fixed random tensors: each op's backward is the other.
def _fastfood_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs[1:])


def _fastfood_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    return torch.ops.pyro_whvi.fastfood_transpose(grad.contiguous(), *ctx.saved_tensors), None, None, None, None


def _fastfood_transpose_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    return torch.ops.pyro_whvi.fastfood(grad.contiguous(), *ctx.saved_tensors), None, None, None, None


torch.library.register_autograd(
    "pyro_whvi::whvi_design", _whvi_design_backward, setup_context=_whvi_design_setup_context, lib=_LIB
)
torch.library.register_autograd(
    "pyro_whvi::fastfood", _fastfood_backward, setup_context=_fastfood_setup_context, lib=_LIB
)
torch.library.register_autograd(
    "pyro_whvi::fastfood_transpose", _fastfood_transpose_backward, setup_context=_fastfood_setup_context, lib=_LIB
)

# CUDA: the Triton kernels (Triton itself is imported by the first CUDA tensor, not here).
triton_backend.register(_LIB)
