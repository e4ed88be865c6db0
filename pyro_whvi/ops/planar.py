r"""The planar flow as one fused operator: :func:`planar_flow`, ``torch.ops.pyro_whvi.planar``.

.. math:: \alpha = u^\top w, \quad a = \operatorname{softplus}(\alpha) - 1, \quad
   \hat u = u + (a - \alpha) \frac{w}{\lVert w \rVert^2},

.. math:: y = x + \hat u \tanh(w^\top x + b), \qquad
   \log\lvert\det J\rvert = \log\bigl\lvert 1 + (1 - \tanh^2(w^\top x + b))\, a \bigr\rvert,

Pyro's :class:`~pyro.distributions.transforms.Planar` map with its invertibility constraint
(:math:`w^\top \hat u = a > -1`, which the log-determinant uses). Pyro's module runs it as some thirty
small ops, each with an autograd node; NF-WHVI applies three flows to every weight site's ``g`` and to the
per-example draws on every step, so on small networks those nodes were most of a step. The compiled CPU
kernel (``cuda/cpu/planar_cpu.cpp``) does a call in one pass forward and one backward; other devices and
the ``reference`` backend run :func:`reference_planar` (differentiable torch ops).

References:
    D. J. Rezende, S. Mohamed. *Variational Inference with Normalizing Flows*. ICML 2015, §4.1 and App. A
    (the constraint on :math:`\hat u`). WHVI paper (Rossi et al., NeurIPS 2020), §2.5 (NF-WHVI).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._library import _LIB, _contiguous_like
from .backends import use_compiled_kernels

__all__ = ["planar_flow", "reference_planar", "reference_planar_backward"]

_LIB.define("planar(Tensor x, Tensor u, Tensor w, Tensor bias) -> (Tensor, Tensor)")
_LIB.define(
    "planar_backward(Tensor? grad_y, Tensor? grad_log_det, Tensor x, Tensor u, Tensor w, Tensor bias)"
    " -> (Tensor, Tensor, Tensor, Tensor)"
)


def _hat(u: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    alpha, norm2 = (u * w).sum(), (w * w).sum()
    a = F.softplus(alpha) - 1
    return alpha, norm2, a, (a - alpha) / norm2


def reference_planar(x: Tensor, u: Tensor, w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """``(y, log|det J|)`` of the planar map in differentiable torch ops; ``x`` is ``(..., D)``."""
    _, _, a, c = _hat(u, w)
    t = torch.tanh(x @ w + bias.reshape(()))
    y = x + t.unsqueeze(-1) * (u + c * w)
    return y, torch.log(torch.abs(1 + (1 - t * t) * a))


def reference_planar_backward(
    grad_y: Tensor | None, grad_log_det: Tensor | None, x: Tensor, u: Tensor, w: Tensor, bias: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Vector-Jacobian products of :func:`reference_planar` for ``x``, ``u``, ``w`` and ``bias`` (a missing
    gradient counts as zero), in differentiable torch ops."""
    alpha, norm2, a, c = _hat(u, w)
    t = torch.tanh(x @ w + bias.reshape(()))
    s = 1 - t * t
    grad_t, grad_a, grad_u_hat = torch.zeros_like(t), torch.zeros_like(a), torch.zeros_like(u)
    if grad_y is not None:
        grad_t = grad_y @ (u + c * w)
        grad_u_hat = (grad_y * t.unsqueeze(-1)).reshape(-1, x.shape[-1]).sum(0)
    if grad_log_det is not None:
        scaled = grad_log_det / (1 + s * a)
        grad_a = (scaled * s).sum()
        grad_t = grad_t - 2 * scaled * a * t
    grad_lin = grad_t * s
    grad_x = (grad_y if grad_y is not None else torch.zeros_like(x)) + grad_lin.unsqueeze(-1) * w
    grad_c = (grad_u_hat * w).sum()
    grad_a = grad_a + grad_c / norm2
    dsoftplus = torch.where(alpha > 20, torch.ones_like(alpha), torch.sigmoid(alpha))
    grad_alpha = grad_a * dsoftplus - grad_c / norm2
    grad_w = (grad_lin.unsqueeze(-1) * x).reshape(-1, x.shape[-1]).sum(0)
    grad_w = grad_w + c * grad_u_hat - 2 * grad_c * c / norm2 * w + grad_alpha * u
    return grad_x, grad_u_hat + grad_alpha * w, grad_w, grad_lin.sum().reshape(bias.shape)


def _planar_kernel(x: Tensor, u: Tensor, w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    y, log_det = reference_planar(x, u, w, bias)
    return y.contiguous(), log_det.contiguous()


def _planar_backward_kernel(*args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.contiguous() for t in reference_planar_backward(*args))  # type: ignore[return-value]


_LIB.impl("planar", _planar_kernel, "CompositeExplicitAutograd")
_LIB.impl("planar_backward", _planar_backward_kernel, "CompositeExplicitAutograd")


@torch.library.register_fake("pyro_whvi::planar", lib=_LIB)
def _planar_fake(x: Tensor, u: Tensor, w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    return _contiguous_like(x), x.new_empty(x.shape[:-1])


@torch.library.register_fake("pyro_whvi::planar_backward", lib=_LIB)
def _planar_backward_fake(
    grad_y: Tensor | None, grad_log_det: Tensor | None, x: Tensor, u: Tensor, w: Tensor, bias: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _contiguous_like(x), _contiguous_like(u), _contiguous_like(w), _contiguous_like(bias)


# Autograd for devices without a compiled autograd kernel (the CPU one is in C++).
def _planar_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def _planar_backward(ctx: Any, grad_y: Tensor | None, grad_log_det: Tensor | None) -> tuple[Tensor, ...]:
    if torch.is_grad_enabled():  # create_graph=True: differentiable composition for higher derivatives
        return reference_planar_backward(grad_y, grad_log_det, *ctx.saved_tensors)
    return torch.ops.pyro_whvi.planar_backward(grad_y, grad_log_det, *ctx.saved_tensors)


torch.library.register_autograd("pyro_whvi::planar", _planar_backward, setup_context=_planar_setup_context, lib=_LIB)

_PLANAR_OP = torch.ops.pyro_whvi.planar.default


def planar_flow(x: Tensor, u: Tensor, w: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    r"""Pyro's planar map and its log-determinant at once (see the module docstring).

    :param x: inputs, ``(..., D)``.
    :param u: the flow's ``u``, ``(D,)`` (the constrained :math:`\hat u` is computed from it).
    :param w: the flow's ``w``, ``(D,)``.
    :param bias: the flow's ``b``, one value (Pyro's ``Planar.bias`` is ``(1,)``).
    :returns: ``y`` of ``x``'s shape and :math:`\log\lvert\det J\rvert` of shape ``x.shape[:-1]``; both
        differentiable in all four inputs (the compiled kernel's second derivatives compose torch ops).
    :raises ValueError: for shapes that do not match, or inputs of different dtypes or devices.

    References:
        Rezende & Mohamed, ICML 2015, §4.1 and App. A; WHVI paper (Rossi et al., NeurIPS 2020), §2.5.
    """
    if x.dim() < 1 or x.shape[-1] == 0 or u.shape != (x.shape[-1],) or w.shape != u.shape or bias.numel() != 1:
        raise ValueError(
            f"planar_flow: x must be (..., D) with D > 0, u and w (D,) and bias one value; got x {tuple(x.shape)}, "
            f"u {tuple(u.shape)}, w {tuple(w.shape)}, bias {tuple(bias.shape)}."
        )
    if any(t.dtype != x.dtype or t.device != x.device for t in (u, w, bias)):
        raise ValueError("planar_flow: x, u, w and bias must share one dtype and device (e.g. flow.to(x)).")
    if use_compiled_kernels(x):
        return _PLANAR_OP(x, u, w, bias)
    return reference_planar(x, u, w, bias)
