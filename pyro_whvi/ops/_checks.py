"""Input validation for the public ops (and the package's other entry points): early errors that say
what was expected and how to fix it."""

from __future__ import annotations

import torch
from torch import Tensor

_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def check_tensor(op: str, name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    if t.layout != torch.strided:
        raise TypeError(
            f"{op}: {name} is a {t.layout} tensor; the ops take dense tensors. Convert with {name}.to_dense()."
        )
    if t.dtype not in _FLOAT_DTYPES:
        kind = "complex" if t.is_complex() else ("boolean" if t.dtype == torch.bool else "integer")
        raise TypeError(
            f"{op}: {name} has {kind} dtype {t.dtype}; the Walsh–Hadamard ops take real floating "
            f"tensors (float32 or float64; float16/bfloat16 run on the reference). "
            f"Convert with {name}.float() or {name}.double()."
        )
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least one dimension (the transformed one), got a scalar.")
    return t


def check_power_of_two(op: str, name: str, size: int) -> None:
    if size <= 0 or size & (size - 1):
        hint = (
            f"Pad it with pyro_whvi.ops.pad_to_power_of_two (zeros up to {next_power_of_two(size)})"
            if size > 0
            else "An empty last dimension cannot be transformed"
        )
        raise ValueError(
            f"{op}: the last dimension of {name} has size {size}, which is not a power of two. "
            f"{hint}; for a weight matrix of any shape see pyro_whvi.ops.setup_dimensions "
            "(WHVI paper, Algorithm 1)."
        )


def next_power_of_two(n: int) -> int:
    """The smallest power of two that is ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def check_finite(where: str, name: str, t: Tensor) -> None:
    """Raise a ``ValueError`` naming ``name`` and counting its NaN and infinite entries.

    One reduction when every entry is finite (the usual case); the counts only on failure.
    """
    if t.device.type != "meta" and not torch.isfinite(t).all():  # meta tensors carry no values to check
        nan, inf = int(t.isnan().sum()), int(t.isinf().sum())
        raise ValueError(
            f"{where}: {name} has {nan} NaN and {inf} infinite entries (of {t.numel()}); remove or impute them first."
        )


def check_fwht(x: object, normalized: object, op: str = "fwht") -> Tensor:
    # The compiled op's schema would take 1.0 and reject "yes", the reference any truthy value: check here,
    # before either, so every backend answers alike.
    if not isinstance(normalized, bool):
        raise TypeError(f"{op}: normalized must be True or False, got {normalized!r} ({type(normalized).__name__}).")
    t = check_tensor(op, "x", x)
    check_power_of_two(op, "x", t.shape[-1])
    return t


def check_fwht_out(x: Tensor, out: object) -> Tensor:
    """``out`` for ``fwht(x, out=out)``: a tensor of ``x``'s shape, dtype and device that does not
    partly overlap ``x`` (``out=x`` is the in-place transform), outside autograd."""
    if not isinstance(out, Tensor):
        raise TypeError(f"fwht: out must be a torch.Tensor, got {type(out).__name__}.")
    if out.shape != x.shape:
        raise ValueError(
            f"fwht: out has shape {tuple(out.shape)} but x has {tuple(x.shape)}; pass an out of x's shape "
            "(torch.empty_like(x))."
        )
    if out.dtype != x.dtype:
        raise TypeError(f"fwht: out has dtype {out.dtype} but x has {x.dtype}; pass an out of x's dtype.")
    if out.device != x.device:
        raise ValueError(f"fwht: out is on {out.device} but x is on {x.device}; pass an out on x's device.")
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        raise RuntimeError(
            "fwht: out= does not support automatic differentiation, but x or out requires grad; "
            "call fwht(x) without out=, or call it under torch.no_grad()."
        )
    if _partly_overlap(x, out):
        raise ValueError(
            "fwht: out overlaps part of x's memory; pass out=x for the in-place transform, or a separate tensor."
        )
    return out


def _partly_overlap(a: Tensor, b: Tensor) -> bool:
    """Whether the memory spans of ``a`` and ``b`` intersect without their being the same view
    (conservative, as torch's own check: interleaved views count as overlapping)."""
    if torch.compiler.is_compiling():  # no addresses while tracing; functionalization copes with aliasing
        return False
    if a.numel() == 0 or b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return False  # same shape (checked before), same layout: the same elements

    def span(t: Tensor) -> tuple[int, int]:
        extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_fwht_inplace(x: Tensor) -> Tensor:
    """``x`` for ``fwht_(x)``: torch's own refusal of in-place ops on a leaf that requires grad, with the fix."""
    if torch.is_grad_enabled() and x.requires_grad and x.is_leaf:
        raise RuntimeError(
            "fwht_: a leaf Variable that requires grad is being used in an in-place operation; "
            "use the out-of-place fwht(x), or call fwht_ under torch.no_grad() to change the leaf's values."
        )
    return x


def has_kernel_layout(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> bool:
    """s1, s2 of shape ``(D,)`` and g ``(D,)`` or ``x.shape``: the common layouts, which need no
    broadcasting and which the compiled kernels index as they are."""
    return s1.dim() == 1 and s2.dim() == 1 and (g.dim() == 1 or g.shape == x.shape)


def check_whvi_matvec(x: object, s1: object, g: object, s2: object) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    op = "whvi_matvec"
    tensors = [check_tensor(op, name, t) for name, t in (("x", x), ("s1", s1), ("g", g), ("s2", s2))]
    x_t = tensors[0]
    size = x_t.shape[-1]
    check_power_of_two(op, "x", size)
    for name, t in zip(("s1", "g", "s2"), tensors[1:]):
        if t.shape[-1] != size:
            raise ValueError(
                f"{op}: {name} has shape {tuple(t.shape)} but x has shape {tuple(x_t.shape)}; the last "
                f"dimensions must agree (D = {size}). s1 and s2 are usually ({size},) and g is "
                f"({size},) when shared or (..., {size}) with one row per example."
            )
        if t.device != x_t.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x_t.device}; move them to one device.")
        if t.dtype != x_t.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but x has {x_t.dtype}; convert them to one dtype.")
    if has_kernel_layout(*tensors):
        return x_t, tensors[1], tensors[2], tensors[3]
    try:
        torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        shapes = ", ".join(f"{n}={tuple(t.shape)}" for n, t in zip(("x", "s1", "g", "s2"), tensors))
        raise ValueError(
            f"{op}: the batch shapes do not broadcast ({shapes}). g may be shared ({size},) or hold "
            f"one row per example, with a shape that broadcasts against x's."
        ) from None
    return tensors[0], tensors[1], tensors[2], tensors[3]
