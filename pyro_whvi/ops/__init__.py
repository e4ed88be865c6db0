r"""The fast Walsh–Hadamard transform and the fused WHVI product, for every backend.

Public ops:

* :func:`fwht` — :math:`y = H x` over the last dimension, :math:`O(D \log D)`; ``fwht(x, out=y)`` writes
  into a given tensor and :func:`fwht_` transforms ``x`` in place.
* :func:`whvi_matvec` — :math:`y = s_1 \odot H(g \odot H(s_2 \odot x))`, the product of an input with
  the WHVI weight :math:`W = S_1 H \operatorname{diag}(g) H S_2` without forming :math:`W`.
* :func:`whvi_design` and :func:`fastfood` — structured products on the transform
  (:mod:`pyro_whvi.ops.structured`): the WHVI design map and Fastfood blocks.
* :func:`planar_flow` — Pyro's planar flow and its log-determinant as one fused op (NF-WHVI's flows,
  :mod:`pyro_whvi.ops.planar`).
* Shape helpers for sizes that are not powers of two: :func:`pad_to_power_of_two`,
  :func:`setup_dimensions` (WHVI Algorithm 1), :func:`stacked_whvi_matvec`, :func:`stacked_whvi_weight`.

Both ops are ``torch.library`` operators (``torch.ops.pyro_whvi.fwht`` and
``torch.ops.pyro_whvi.whvi_matvec``; the mutating forms ``torch.ops.pyro_whvi.fwht_`` and
``torch.ops.pyro_whvi.fwht.out``) with fake kernels, so ``torch.compile(fullgraph=True)`` traces
through them, and they are differentiable in every tensor input. The backend is chosen at run time
(:mod:`pyro_whvi.ops.backends`).

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020: §2.1 (FWHT), §2.2 (``W h`` in :math:`O(D \log D)`), §2.5 and
    Algorithm 1 (shapes), §3.4 and App. D.5 (timings).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import (
    _library,  # noqa: F401  (registers the torch.ops.pyro_whvi operators)
    reference,
)
from ._checks import (
    check_fwht,
    check_fwht_inplace,
    check_fwht_out,
    check_whvi_matvec,
    has_kernel_layout,
    next_power_of_two,
)
from .backends import (
    BackendEnvironmentError,
    compiled_available,
    get_backend,
    load_compiled,
    set_backend,
    use_backend,
    use_compiled_kernels,
    use_gpu_kernels,
)
from .planar import planar_flow
from .shapes import (
    WHVIDimensions,
    pad_to_power_of_two,
    setup_dimensions,
    stacked_whvi_conv2d,
    stacked_whvi_matvec,
    stacked_whvi_weight,
)
from .structured import fastfood, whvi_design

__all__ = [
    "BackendEnvironmentError",
    "WHVIDimensions",
    "compiled_available",
    "fastfood",
    "fwht",
    "fwht_",
    "get_backend",
    "load_compiled",
    "next_power_of_two",
    "pad_to_power_of_two",
    "planar_flow",
    "reference",
    "set_backend",
    "setup_dimensions",
    "stacked_whvi_conv2d",
    "stacked_whvi_matvec",
    "stacked_whvi_weight",
    "use_backend",
    "whvi_design",
    "whvi_matvec",
]

_FWHT_OP = torch.ops.pyro_whvi.fwht.default
_FWHT_INPLACE_OP = torch.ops.pyro_whvi.fwht_.default
_FWHT_OUT_OP = torch.ops.pyro_whvi.fwht.out
_WHVI_MATVEC_OP = torch.ops.pyro_whvi.whvi_matvec.default


def fwht(x: Tensor, normalized: bool = True, *, out: Tensor | None = None) -> Tensor:
    r"""Fast Walsh–Hadamard transform over the last dimension.

    .. math:: y = D^{-1/2} H_D\, x, \qquad H_{2D} = \begin{bmatrix} H_D & H_D \\ H_D & -H_D \end{bmatrix},
       \quad H_1 = [1].

    With ``normalized=True`` (default) the matrix is orthonormal and symmetric, so the transform
    is its own inverse; with ``False`` it is the :math:`\pm 1` matrix :math:`H_D`. The backward
    pass is the same transform of the incoming gradient.

    :param x: real floating tensor of shape ``(..., D)``, ``D`` a power of two (pad other sizes
        with :func:`pad_to_power_of_two`). Non-contiguous inputs are accepted.
    :param normalized: whether to scale by :math:`D^{-1/2}`.
    :param out: optional tensor of ``x``'s shape, dtype and device to write the result into (any
        strides; ``out=x`` is the in-place transform, as :func:`fwht_`). As with torch's own ``out=``
        functions there is no autograd through it: use the plain form for gradients.
    :returns: a new contiguous tensor of the same shape and dtype, or ``out``.
    :raises ValueError: if ``D`` is not a power of two, or ``out`` has another shape or device or
        overlaps part of ``x``.
    :raises TypeError: for integer, boolean, complex or sparse inputs, a ``normalized`` that is not a bool,
        or an ``out`` of another dtype.
    :raises RuntimeError: with ``out`` while ``x`` or ``out`` requires grad (under grad mode).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.1.
    """
    check_fwht(x, normalized)
    if out is not None:
        check_fwht_out(x, out)
        if use_compiled_kernels(x) or use_gpu_kernels(x):
            _FWHT_OUT_OP(x, normalized, out=out)
        else:
            out.copy_(reference.fwht(x, normalized))
        return out
    if use_compiled_kernels(x) or use_gpu_kernels(x):
        return _FWHT_OP(x, normalized)
    return reference.fwht(x, normalized)


def fwht_(x: Tensor, normalized: bool = True) -> Tensor:
    r"""In-place :func:`fwht`: ``x`` becomes :math:`D^{-1/2} H_D\, x` (or :math:`H_D x`) and is returned.

    No output is allocated: the compiled CPU and the GPU kernels transform the rows where they are
    (a non-contiguous ``x`` goes through one temporary copy; the reference backend computes the
    out-of-place form and copies it back). Use it for buffers the caller owns.

    Autograd follows torch's in-place ops: on a tensor that is not a leaf (an intermediate result)
    the gradient flows through (the transform's adjoint is itself); on a leaf that requires grad it
    raises, unless called under :func:`torch.no_grad`. ``torch.ops.pyro_whvi.fwht_`` is the operator
    (it returns nothing; functionalized by ``torch.compile``).

    :param x: real floating tensor of shape ``(..., D)``, ``D`` a power of two; modified in place.
    :param normalized: whether to scale by :math:`D^{-1/2}`.
    :returns: ``x``.
    :raises ValueError: if ``D`` is not a power of two.
    :raises TypeError: as :func:`fwht`.
    :raises RuntimeError: if ``x`` is a leaf that requires grad (under grad mode).
    """
    check_fwht(x, normalized, "fwht_")
    check_fwht_inplace(x)
    if use_compiled_kernels(x) or use_gpu_kernels(x):
        _FWHT_INPLACE_OP(x, normalized)
    else:
        reference.fwht_(x, normalized)
    return x


def _as_suffix_of(diagonal: Tensor, shape: torch.Size) -> Tensor:
    """Reshape a diagonal so its shape is a suffix of ``shape`` (what the kernels index), or expand it."""
    while diagonal.dim() > 1 and diagonal.shape[0] == 1:
        diagonal = diagonal.squeeze(0)
    if tuple(shape[len(shape) - diagonal.dim() :]) != tuple(diagonal.shape):
        diagonal = diagonal.expand(shape)
    return diagonal


def whvi_matvec(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    r"""Product of inputs with WHVI weights, :math:`W x` with :math:`W = S_1 H \operatorname{diag}(g) H S_2`.

    .. math:: y = s_1 \odot H\big(g \odot H(s_2 \odot x)\big)

    with the orthonormal :math:`H` of :func:`fwht`, computed row by row in one pass and
    :math:`O(D \log D)` per row, without forming the :math:`D \times D` matrix :math:`W`.
    Passing one ``g`` per example (shape ``(..., D)``) is WHVI's local reparameterization
    (paper eq. 6): every example sees an independent weight sample.

    :param x: inputs, ``(..., D)``, ``D`` a power of two.
    :param s1: left diagonal, ``(D,)`` (or any shape that broadcasts with ``x``).
    :param g: the latent diagonal: ``(D,)`` shared by all rows, or ``(..., D)`` one per row.
    :param s2: right diagonal, ``(D,)`` (or broadcastable).
    :returns: tensor of the broadcast shape of all four inputs.

    All inputs must share dtype and device; gradients flow to all four.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2 (eq. 3–6), App. D.5.
    """
    check_whvi_matvec(x, s1, g, s2)
    if not (use_compiled_kernels(x) or use_gpu_kernels(x)):
        return reference.whvi_matvec(x, s1, g, s2)
    if has_kernel_layout(x, s1, g, s2):
        return _WHVI_MATVEC_OP(x, s1, g, s2)
    shape = torch.broadcast_shapes(x.shape, s1.shape, g.shape, s2.shape)
    if x.shape != shape:
        x = x.expand(shape)
    return _WHVI_MATVEC_OP(x, _as_suffix_of(s1, shape), _as_suffix_of(g, shape), _as_suffix_of(s2, shape))
