r"""The GPU implementations of the ``pyro_whvi`` operators: Triton kernels (``cuda/triton/``) launched from here.

:func:`register` makes them the ``CUDA`` kernels of the ``torch.library`` operators, so
``torch.ops.pyro_whvi.*``, their autograd formulas, fake kernels and ``torch.compile`` behave on CUDA
tensors as on CPU. Registration does not import Triton: the first CUDA tensor does. Without Triton
the kernels fall back to the pure-PyTorch reference with one warning that names the fix.

The launchers take any device Triton can run on; the tests call them on CPU tensors under
``TRITON_INTERPRET=1``, the same kernel source a GPU compiles.

Why ``register_kernel``-style registration and not ``torch.library.triton_op``: the operators, their
schemas, fake kernels and autograd already exist (:mod:`pyro_whvi.ops._library`) with the CPU
kernels in C++; ``triton_op`` would define a second operator for the same function. The cost is that
``torch.compile`` sees our kernels as opaque calls instead of tracing into them, as it does for the
C++ kernels.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §2.1–2.3, §3.4, App. D.5.
"""

from __future__ import annotations

import functools
import math
import warnings
from types import ModuleType

import torch
from torch import Tensor

from . import reference

__all__ = [
    "KERNELS",
    "fastfood",
    "fastfood_transpose",
    "fwht",
    "fwht_",
    "fwht_out",
    "kernels",
    "register",
    "triton_available",
    "whvi_design",
    "whvi_design_backward",
    "whvi_fourier_design_backward",
    "whvi_matvec",
    "whvi_matvec_backward",
]

#: The kernels of ``cuda/triton/kernels.py``.
KERNELS = (
    "fwht_kernel",
    "whvi_matvec_kernel",
    "whvi_matvec_backward_kernel",
    "fastfood_kernel",
    "fastfood_transpose_kernel",
    "whvi_design_kernel",
    "whvi_design_backward_kernel",
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@functools.cache
def kernels() -> ModuleType | None:
    """The kernel module (imports Triton), or ``None`` with one warning when Triton cannot be imported."""
    try:
        from .._csrc.triton import kernels as module
    except ImportError as error:
        warnings.warn(
            f"pyro_whvi: CUDA tensors use the pure-PyTorch reference ops because Triton cannot be imported ({error}). "
            "Install it (`pip install triton`, part of PyTorch's CUDA wheels) for the GPU kernels.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return module


def triton_available() -> bool:
    return kernels() is not None


def _compute_type(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _launch(name: str, module: ModuleType, n_rows: int, size: int, *args, **constants) -> None:
    rows = module.rows_per_program(size, args[0].dtype == torch.float64)
    getattr(module, name)[(max(1, -(-n_rows // rows)),)](
        *args,
        n_rows,
        ROWS=rows,
        D=size,
        LOG_D=size.bit_length() - 1,
        COMPUTE=_compute_type(args[0].dtype),
        num_warps=module.num_warps(name, size),
        **constants,
    )


def _rows(t: Tensor, shape: torch.Size) -> tuple[Tensor, Tensor]:
    """``t`` as contiguous ``(n, D)`` rows and, for each row of the broadcast ``shape``, the index of its row."""
    size = shape[-1]
    t = t.reshape((1,) * (len(shape) - t.dim()) + tuple(t.shape)).contiguous()
    count = t.numel() // size
    index = torch.arange(count, device=t.device, dtype=torch.int64).reshape(t.shape[:-1]).expand(shape[:-1])
    return t.reshape(count, size), index.reshape(-1).contiguous()  # reshape can keep a zero stride


def _two_pass_fwht(x: Tensor, normalized: bool, fused_size: int) -> Tensor:
    """``H_{AB} = H_A \\otimes H_B``: the transform along ``B``-long chunks, then along the ``A`` axis.

    ``A`` and ``B`` are as even as powers of two allow (``B = 2^ceil(k/2)`` for ``D = 2^k``, at most the fused
    size): with ``B`` the fused size, ``A`` would be 2 or 4, and the second pass would run thousands of
    programs of 16 rows of 2 or 4 (a few dozen elements each) where ``A = B = 128`` runs a few of 2048."""
    size = x.shape[-1]
    inner = min(1 << -(-(size.bit_length() - 1) // 2), fused_size)
    outer = size // inner
    y = fwht(x.reshape(*x.shape[:-1], outer, inner), normalized)
    y = fwht(y.transpose(-1, -2), normalized).transpose(-1, -2)
    return y.reshape(x.shape)


def fwht(x: Tensor, normalized: bool = True) -> Tensor:
    """:func:`pyro_whvi.ops.fwht` with the Triton kernel (the reference without Triton)."""
    module = kernels()
    if module is None or x.dtype not in _DTYPES:
        return reference.fwht(x, normalized).contiguous()
    size = x.shape[-1]
    if size > module.MAX_FUSED_SIZE:
        return _two_pass_fwht(x, normalized, module.MAX_FUSED_SIZE)
    rows = x.reshape(-1, size).contiguous()
    out = torch.empty_like(rows)
    if rows.numel():
        _launch("fwht_kernel", module, rows.shape[0], size, rows, out, POWER=1 if normalized else 0)
    return out.reshape(x.shape)


def _fwht_rows_into(x: Tensor, out: Tensor, normalized: bool) -> bool:
    """Transform ``x``'s rows into the contiguous ``out`` with one launch (``out`` may be ``x``: a program
    reads its rows before it writes them); ``False`` where the two-pass or reference form is needed."""
    module = kernels()
    size = x.shape[-1]
    if module is None or x.dtype not in _DTYPES or size > module.MAX_FUSED_SIZE or not out.is_contiguous():
        return False
    rows = x.reshape(-1, size).contiguous()
    if rows.numel():
        _launch("fwht_kernel", module, rows.shape[0], size, rows, out.view(-1, size), POWER=1 if normalized else 0)
    return True


def fwht_(x: Tensor, normalized: bool = True) -> None:
    """:func:`pyro_whvi.ops.fwht_`: the kernel writes the rows where it read them (other layouts and sizes
    through the out-of-place form)."""
    if not _fwht_rows_into(x, x, normalized):
        x.copy_(fwht(x, normalized))


def fwht_out(x: Tensor, normalized: bool = True, *, out: Tensor) -> None:
    """``fwht(x, out=out)``: the kernel writes into ``out`` directly when it is contiguous."""
    if not _fwht_rows_into(x, out, normalized):
        out.copy_(fwht(x, normalized))


def whvi_matvec(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    """:func:`pyro_whvi.ops.whvi_matvec`: both transforms and three scalings in one Triton kernel."""
    module = kernels()
    shape = torch.broadcast_shapes(x.shape, s1.shape, g.shape, s2.shape)
    size = shape[-1]
    if module is None or x.dtype not in _DTYPES or size > module.MAX_FUSED_SIZE:
        return reference.whvi_matvec(x, s1, g, s2, transform=fwht).contiguous()
    n_rows = math.prod(shape[:-1])
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    if out.numel():
        operands = [part for t in (x, s1, g, s2) for part in _rows(t, shape)]
        _launch("whvi_matvec_kernel", module, n_rows, size, *operands, out)
    return out


def whvi_matvec_backward(
    grad: Tensor, x: Tensor, s1: Tensor, g: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Vector-Jacobian products of :func:`whvi_matvec`: per-row products in one kernel, summed over broadcast rows."""
    module = kernels()
    shape = grad.shape
    size = shape[-1]
    if module is None or x.dtype not in _DTYPES:
        return tuple(t.contiguous() for t in reference.whvi_matvec_backward(grad, x, s1, g, s2))  # type: ignore[return-value]
    if size > module.max_fused_size("whvi_matvec_backward_kernel", x.dtype == torch.float64):
        unfused = reference.whvi_matvec_backward(grad, x, s1, g, s2, transform=fwht)  # a kernel per transform
        return tuple(t.contiguous() for t in unfused)  # type: ignore[return-value]
    n_rows = math.prod(shape[:-1])
    products = [torch.empty(shape, dtype=x.dtype, device=x.device) for _ in range(4)]
    if grad.numel():
        operands = [part for t in (x, s1, g, s2) for part in _rows(t, shape)]
        _launch(
            "whvi_matvec_backward_kernel", module, n_rows, size, grad.contiguous(), *operands, *products,
        )  # fmt: skip
    grads = [
        reference.sum_to_shape(product, like.shape).contiguous() for product, like in zip(products, (x, s1, g, s2))
    ]
    return grads[0], grads[1], grads[2], grads[3]


def _design_args(module: ModuleType, name: str, size: int, dtype: torch.dtype) -> dict:
    constants = {"D": size, "LOG_D": size.bit_length() - 1, "COMPUTE": _compute_type(dtype)}
    chunk = module.design_chunk(name, size, dtype == torch.float64)
    return {**constants, "CHUNK": chunk, "num_warps": module.design_warps(size)}


def whvi_design(x: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    """:func:`pyro_whvi.ops.whvi_design`: one gather and one transform per matrix, in one Triton kernel."""
    module, size = kernels(), x.shape[-1]
    if module is None or x.dtype not in _DTYPES or size > module.MAX_FUSED_SIZE:
        return reference.whvi_design(x, s1, s2).contiguous()
    matrices = x.reshape(-1, size, size).contiguous()
    out = torch.empty(matrices.shape[:-1], dtype=x.dtype, device=x.device)
    if matrices.shape[0]:
        module.whvi_design_kernel[(matrices.shape[0],)](
            matrices, s1.contiguous(), s2.contiguous(), out, **_design_args(module, "whvi_design_kernel", size, x.dtype)
        )
    return out.reshape(x.shape[:-1])


def whvi_design_backward(grad: Tensor, x: Tensor, s1: Tensor, s2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Vector-Jacobian products of :func:`whvi_design`; the per-matrix ``Q`` is summed here."""
    module, size = kernels(), x.shape[-1]
    fused = module is not None and size <= module.max_fused_size(
        "whvi_design_backward_kernel", x.dtype == torch.float64
    )
    if module is None or x.dtype not in _DTYPES or not fused:
        return tuple(t.contiguous() for t in reference.whvi_design_backward(grad, x, s1, s2))  # type: ignore[return-value]
    matrices = x.reshape(-1, size, size).contiguous()
    grad_x, products = torch.empty_like(matrices), torch.empty_like(matrices)
    z = torch.empty(
        matrices.shape[:-1], dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device
    )
    if matrices.shape[0]:
        module.whvi_design_backward_kernel[(matrices.shape[0],)](
            grad.reshape(-1, size).contiguous(), matrices, s1.contiguous(), s2.contiguous(), z, grad_x, products,
            **_design_args(module, "whvi_design_backward_kernel", size, x.dtype),
        )  # fmt: skip
    q = products.sum(0)
    return grad_x.reshape(x.shape), q @ s2, s1 @ q


def whvi_fourier_design_backward(
    grad: Tensor, features: Tensor, s1: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The RF-WHVI Fourier-design backward: the reference's algebra around :func:`whvi_design_backward`."""
    parts = reference.whvi_fourier_design_backward(grad, features, s1, s2, design_backward=whvi_design_backward)
    return tuple(t.contiguous() for t in parts)  # type: ignore[return-value]


def fastfood(x: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor) -> Tensor:
    """:func:`pyro_whvi.ops.fastfood`: both transforms, the permutation and the scalings in one kernel."""
    module, size, blocks = kernels(), x.shape[-1], signs.shape[0]
    if module is None or x.dtype not in _DTYPES:
        return reference.fastfood(x, signs, permutation, gaussian, scale).contiguous()
    if size > module.MAX_FUSED_SIZE:  # the transforms in Triton, the permutation a PyTorch gather
        return reference.fastfood(x, signs, permutation, gaussian, scale, transform=fwht).contiguous()
    rows = x.reshape(-1, size).contiguous()
    out = torch.empty((*x.shape[:-1], blocks, size), dtype=x.dtype, device=x.device)
    tables = [t.contiguous() for t in (signs, permutation, gaussian, scale)]
    if out.numel():
        _launch("fastfood_kernel", module, rows.shape[0] * blocks, size, rows, *tables, out, blocks)
    return out


def fastfood_transpose(grad: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor) -> Tensor:
    """The adjoint of :func:`fastfood`: each block's row in one kernel (the inverse permutation gathers),
    summed over the blocks here."""
    module, size, blocks = kernels(), grad.shape[-1], signs.shape[0]
    if module is None or grad.dtype not in _DTYPES:
        return reference.fastfood_transpose(grad, signs, permutation, gaussian, scale).contiguous()
    if size > module.MAX_FUSED_SIZE:
        return reference.fastfood_transpose(grad, signs, permutation, gaussian, scale, transform=fwht).contiguous()
    rows = grad.reshape(-1, size).contiguous()
    parts = torch.empty_like(rows)
    inverse = torch.argsort(permutation, dim=-1)
    tables = [t.contiguous() for t in (signs, inverse, gaussian, scale)]
    if rows.numel():
        _launch("fastfood_transpose_kernel", module, rows.shape[0], size, rows, *tables, parts, blocks)
    return parts.reshape(grad.shape).sum(-2)


def register(library: torch.library.Library) -> None:
    """Make the Triton launchers the ``CUDA`` kernels of ``library``'s operators (imports nothing yet)."""
    library.impl("fwht", fwht, "CUDA")
    library.impl("fwht_", fwht_, "CUDA")
    library.impl("fwht.out", fwht_out, "CUDA")
    library.impl("whvi_matvec", whvi_matvec, "CUDA")
    library.impl("whvi_matvec_backward", whvi_matvec_backward, "CUDA")
    library.impl("whvi_design", whvi_design, "CUDA")
    library.impl("whvi_design_backward", whvi_design_backward, "CUDA")
    library.impl("whvi_fourier_design_backward", whvi_fourier_design_backward, "CUDA")
    library.impl("fastfood", fastfood, "CUDA")
    library.impl("fastfood_transpose", fastfood_transpose, "CUDA")
