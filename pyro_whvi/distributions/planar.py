r"""A diagonal Gaussian pushed through planar flows, over a ``(K, D)`` block of WHVI latents (NF-WHVI).

.. math:: z_0 \sim \mathcal{N}(\mu, \operatorname{diag}\sigma^2), \qquad
   z_k = f_k(z_{k-1}) = z_{k-1} + \hat u_k \tanh(w_k^\top z_{k-1} + b_k),

.. math:: \log q(z_K) = \log q_0(z_0) - \sum_k \log\lvert 1 + \hat u_k^\top \psi_k(z_{k-1}) \rvert .

The flows are Pyro's :class:`~pyro.distributions.transforms.Planar` (with the constraint on
:math:`\hat u` that keeps each map invertible). Planar flows have no closed-form inverse, so the
density is available for the draws this distribution made itself (the same restriction Pyro's
``TransformedDistribution`` has with them); that is all an ELBO needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.distributions.transforms import Planar
from torch import Tensor

__all__ = ["PlanarFlowNormal"]


class PlanarFlowNormal(TorchDistribution):
    """``q(g)`` of NF-WHVI: ``Normal(loc, scale)`` over the flattened latent, then planar flows.

    :param loc: base mean, ``(..., K, D)`` (any event shape; the flows act on it flattened).
    :param scale: base standard deviation, same shape.
    :param flows: planar flows of input dimension ``loc.numel()``.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.5 and App. C (eq. 18–21); Rezende & Mohamed,
        *Variational Inference with Normalizing Flows*, ICML 2015.
    """

    arg_constraints: ClassVar[dict] = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True
    _cache_size = 16

    def __init__(self, loc: Tensor, scale: Tensor, flows: list[Planar], validate_args=None):
        num_latent = loc.numel()
        for k, flow in enumerate(flows):
            if not isinstance(flow, Planar):
                raise TypeError(f"PlanarFlowNormal: flows[{k}] must be a pyro Planar transform, got {type(flow)}.")
            if flow.u.shape[-1] != num_latent:
                raise ValueError(
                    f"PlanarFlowNormal: flows[{k}] acts on {flow.u.shape[-1]} dims, the latent has {num_latent}."
                )
        self.loc, self.scale, self.flows = loc, scale, list(flows)
        self._drawn: list[tuple[Tensor, Tensor]] = []
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    @constraints.dependent_property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    def rsample_with_log_prob(self, sample_shape: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
        """A reparameterized draw and its log-density, ``(*sample_shape, *event_shape)`` and ``sample_shape``."""
        shape = torch.Size(sample_shape)
        loc, scale = self.loc.reshape(-1), self.scale.reshape(-1)
        eps = torch.randn(shape + loc.shape, dtype=loc.dtype, device=loc.device)
        z = loc + scale * eps
        log_q = torch.distributions.Normal(loc, scale).log_prob(z).sum(-1)
        for flow in self.flows:
            z_next = flow(z)
            log_q = log_q - flow.log_abs_det_jacobian(z, z_next)
            z = z_next
        return z.reshape(shape + self.event_shape), log_q

    def rsample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        value, log_q = self.rsample_with_log_prob(sample_shape)
        self._drawn = [*self._drawn[-(self._cache_size - 1) :], (value, log_q)]
        return value

    def log_prob(self, value: Tensor) -> Tensor:
        for drawn, log_q in reversed(self._drawn):
            if drawn is value:
                return log_q
        raise ValueError(
            "PlanarFlowNormal.log_prob: planar flows have no closed-form inverse, so the density is known only "
            "for values drawn by this distribution's rsample() (the last "
            f"{self._cache_size}); use rsample_with_log_prob() to get both at once."
        )
