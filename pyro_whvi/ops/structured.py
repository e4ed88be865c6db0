r"""Structured products on the FWHT: the WHVI design map and Fastfood blocks.

* :func:`whvi_design` — :math:`y = \operatorname{diag}(H S_1 X S_2 H)`, the adjoint of the WHVI map
  :math:`g \mapsto S_1 H \operatorname{diag}(g) H S_2`: for a linear model whose weight matrix ``W`` is
  a WHVI matrix, :math:`\langle X, W \rangle = y^\top g`, so ``y`` is the design row of ``g``.
* :func:`fastfood` — ``B`` Fastfood blocks :math:`\operatorname{diag}(s) H \operatorname{diag}(g) \Pi
  H \operatorname{diag}(b)` applied to an input (Le et al., 2013), the structured random projection of
  :mod:`pyro_whvi.gp.features`.

Both are ``torch.library`` operators (``torch.ops.pyro_whvi.*``) with compiled CPU kernels, the
pure-PyTorch reference for other devices, fake kernels and autograd (second derivatives included).

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, §2.2 and App. D.4 (WHVI over random-feature weights, Table 10).
    Q. Le, T. Sarlós, A. Smola. *Fastfood — Approximating Kernel Expansions in Loglinear Time*. ICML 2013.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import reference
from ._checks import check_power_of_two, check_tensor
from .backends import use_compiled_kernels, use_gpu_kernels

__all__ = ["fastfood", "whvi_design"]


def _check_companion(op: str, name: str, t: object, like: Tensor, shape: tuple[int, ...]) -> Tensor:
    tensor = check_tensor(op, name, t)
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(tensor.shape)}.")
    if tensor.device != like.device or tensor.dtype != like.dtype:
        raise ValueError(
            f"{op}: {name} is {tensor.dtype} on {tensor.device} but the input is {like.dtype} on {like.device}; "
            "convert them to one dtype and device."
        )
    return tensor


def whvi_design(x: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    r"""The diagonal of :math:`H S_1 X S_2 H` for a batch of ``D x D`` matrices, in :math:`O(D^2)` each.

    .. math:: y_k = [H \operatorname{diag}(s_1)\, X \operatorname{diag}(s_2) H]_{kk}
       = D^{-1/2} (H c)_k, \qquad c_l = \sum_i s_{1,i}\, s_{2, i \oplus l}\, X_{i, i \oplus l},

    with the orthonormal :math:`H` of :func:`~pyro_whvi.ops.fwht` (Sylvester order, so
    :math:`H_{ki} H_{kj} = H_{k, i \oplus j} / \sqrt D`). It is the adjoint of the WHVI map:
    :math:`\langle X, S_1 H \operatorname{diag}(g) H S_2 \rangle_F = y^\top g`.

    :param x: ``(..., D, D)``, ``D`` a power of two.
    :param s1: ``(D,)``.
    :param s2: ``(D,)``.
    :returns: ``(..., D)``; differentiable in all three inputs.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2 and App. D.4.
    """
    op = "whvi_design"
    x = check_tensor(op, "x", x)
    if x.dim() < 2 or x.shape[-2] != x.shape[-1]:
        raise ValueError(f"{op}: x must be a batch of square matrices (..., D, D), got shape {tuple(x.shape)}.")
    size = x.shape[-1]
    check_power_of_two(op, "x", size)
    s1 = _check_companion(op, "s1", s1, x, (size,))
    s2 = _check_companion(op, "s2", s2, x, (size,))
    if use_compiled_kernels(x) or use_gpu_kernels(x):
        return torch.ops.pyro_whvi.whvi_design(x, s1, s2)
    return reference.whvi_design(x, s1, s2)


def fastfood(x: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor) -> Tensor:
    r"""``B`` Fastfood blocks applied to every row of ``x``, each in :math:`O(P \log P)`.

    .. math:: y_b = \text{scale}_b \odot H\big(\text{gaussian}_b \odot \Pi_b H(\text{signs}_b \odot x)\big),
       \qquad (\Pi_b h)_i = h_{\text{permutation}_{bi}},

    with the orthonormal :math:`H`. Differentiable in ``x``; the other arguments are the projection's
    fixed random tensors.

    :param x: ``(..., P)``, ``P`` a power of two (zero-pad shorter inputs).
    :param signs: ``(B, P)``.
    :param permutation: ``(B, P)`` int64, entries in ``[0, P)``.
    :param gaussian: ``(B, P)``.
    :param scale: ``(B, P)``.
    :returns: ``(..., B, P)``.

    References:
        Le, Sarlós, Smola. *Fastfood*. ICML 2013, §3; WHVI paper (Rossi et al., NeurIPS 2020), §1.
    """
    op = "fastfood"
    x = check_tensor(op, "x", x)
    size = x.shape[-1]
    check_power_of_two(op, "x", size)
    signs = check_tensor(op, "signs", signs)
    if signs.dim() != 2 or signs.shape[-1] != size:
        raise ValueError(f"{op}: signs must be (B, {size}) for inputs (..., {size}), got {tuple(signs.shape)}.")
    shape = tuple(signs.shape)
    signs = _check_companion(op, "signs", signs, x, shape)
    gaussian = _check_companion(op, "gaussian", gaussian, x, shape)
    scale = _check_companion(op, "scale", scale, x, shape)
    for name, t in (("signs", signs), ("gaussian", gaussian), ("scale", scale)):
        if t.requires_grad:
            raise ValueError(f"{op}: {name} is a fixed random tensor and gets no gradient; pass it detached.")
    if not isinstance(permutation, Tensor) or permutation.dtype != torch.int64 or tuple(permutation.shape) != shape:
        raise ValueError(f"{op}: permutation must be an int64 tensor of shape {shape}.")
    # The range check reads values: on the CPU only (on a GPU it would synchronize every call; the
    # permutation is a fixed buffer, checked where it was made).
    on_cpu = permutation.device.type == "cpu"
    if on_cpu and permutation.numel() and (int(permutation.min()) < 0 or int(permutation.max()) >= size):
        raise ValueError(f"{op}: permutation entries must lie in [0, {size}).")
    if use_compiled_kernels(x) or use_gpu_kernels(x):
        return torch.ops.pyro_whvi.fastfood(x, signs, permutation, gaussian, scale)
    return reference.fastfood(x, signs, permutation, gaussian, scale)
