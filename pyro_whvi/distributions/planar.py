r"""A diagonal Gaussian pushed through planar flows, over a ``(K, D)`` block of WHVI latents (NF-WHVI).

.. math:: z_0 \sim \mathcal{N}(\mu, \operatorname{diag}\sigma^2), \qquad
   z_k = f_k(z_{k-1}) = z_{k-1} + \hat u_k \tanh(w_k^\top z_{k-1} + b_k),

.. math:: \log q(z_K) = \log q_0(z_0) - \sum_k \log\lvert 1 + \hat u_k^\top \psi_k(z_{k-1}) \rvert .

:class:`PlanarFlowNormal` is a Pyro :class:`~pyro.distributions.TransformedDistribution`: the base
``Normal`` over the flattened latent, the flows, then a reshape to the block's shape. The flows are
Pyro's :class:`~pyro.distributions.transforms.Planar` modules (with the constraint on :math:`\hat u` that
keeps each map invertible), applied by the fused :func:`~pyro_whvi.ops.planar_flow`: one op per flow for
the map and its log-determinant, instead of the thirty-odd of Pyro's module. Planar flows have no
closed-form inverse, so ``log_prob`` works through the transforms' caches: it knows the density of the
distribution's last ``rsample()``, which is all an ELBO needs.

The caches are the distribution's own. The guide's ``Planar`` modules are shared by every
``PlanarFlowNormal`` of a site and by the model's per-example draws (local reparameterization), so each
distribution wraps them in transforms with a one-draw cache of their own, and ``rsample_with_log_prob``
draws without touching it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pyro.distributions import Normal, TransformedDistribution, constraints
from pyro.distributions.torch_distribution import TorchDistributionMixin
from pyro.distributions.transforms import Planar
from torch import Tensor
from torch.distributions.transforms import ReshapeTransform, Transform
from torch.distributions.utils import _sum_rightmost

from ..ops.planar import planar_flow

__all__ = ["PlanarFlowNormal"]


class _OwnCache(Transform):
    """A shared planar flow with a one-draw cache, and the log-determinant of that draw, of its own (the
    fused op computes both at once)."""

    domain = constraints.real_vector
    codomain = constraints.real_vector
    bijective = True

    def __init__(self, flow: Planar):
        super().__init__(cache_size=1)
        self.flow = flow
        self._log_det: Tensor | None = None

    def _call(self, x: Tensor) -> Tensor:
        flow = self.flow
        y, self._log_det = planar_flow(x, flow.u, flow.w, flow.bias)
        return y

    def _inverse(self, y: Tensor) -> Tensor:
        raise ValueError(
            "PlanarFlowNormal.log_prob: planar flows have no closed-form inverse, so the density is known only "
            "for the last value drawn by this distribution's rsample(); use rsample_with_log_prob() to get a "
            "draw and its density at once."
        )

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        x_old, y_old = self._cached_x_y
        if x is x_old and y is y_old and self._log_det is not None:
            return self._log_det
        return planar_flow(x, self.flow.u, self.flow.w, self.flow.bias)[1]


class PlanarFlowNormal(TransformedDistribution):
    """``q(g)`` of NF-WHVI: ``Normal(loc, scale)`` over the flattened latent, then planar flows.

    :param loc: base mean, ``(..., K, D)`` (any event shape; the flows act on it flattened).
    :param scale: base standard deviation, same shape.
    :param flows: planar flows of input dimension ``loc.numel()``.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.5 and App. C (eq. 18–21); Rezende & Mohamed,
        *Variational Inference with Normalizing Flows*, ICML 2015.
    """

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
        base = Normal(loc.reshape(-1), scale.reshape(-1), validate_args=validate_args).to_event(1)
        # The reshape caches too: its inverse must hand the last flow the very tensor that flow returned.
        reshape = ReshapeTransform(torch.Size([num_latent]), loc.shape, cache_size=1)
        transforms: list[Transform] = [*(_OwnCache(flow) for flow in self.flows), reshape]
        super().__init__(base, transforms, validate_args=validate_args)
        self._base_draw: tuple[Tensor, Tensor] | None = None

    def expand(self, batch_shape, _instance=None):
        """Pyro's generic :class:`~pyro.distributions.torch_distribution.ExpandedDistribution` (this
        distribution's caches stay its own; ``TransformedDistribution.expand`` would share them)."""
        return TorchDistributionMixin.expand(self, batch_shape, _instance)

    def rsample(self, sample_shape: Sequence[int] = torch.Size()) -> Tensor:
        """``TransformedDistribution.rsample``, with the base density of the draw computed right away.

        The transforms cache the draw; the base density is remembered alongside. Computing it here rather
        than in ``log_prob`` keeps its autograd nodes ahead of the flows', and backward adds gradients in
        the order the graph was built: NF-WHVI's stored results were computed that way, bit for bit.
        """
        x = self.base_dist.rsample(torch.Size(sample_shape))
        self._base_draw = (x, self.base_dist.log_prob(x))
        for transform in self.transforms:
            x = transform(x)
        return x

    def log_prob(self, value: Tensor) -> Tensor:
        """``TransformedDistribution.log_prob`` with the terms added in the forward order.

        Pyro's adds the log-determinants last flow first and the base density last; this adds the base
        density first, then each flow's term in order, as NF-WHVI's stored results were computed
        (floating-point sums depend on the order).
        """
        if self._validate_args:
            self._validate_sample(value)
        event_dim = len(self.event_shape)
        log_dets = []
        y = value
        for transform in reversed(self.transforms):
            x = transform.inv(y)
            event_dim += transform.domain.event_dim - transform.codomain.event_dim
            log_dets.append(
                _sum_rightmost(transform.log_abs_det_jacobian(x, y), event_dim - transform.domain.event_dim)
            )
            y = x
        drawn = self._base_draw
        base_log_prob = drawn[1] if drawn is not None and drawn[0] is y else self.base_dist.log_prob(y)
        log_prob = _sum_rightmost(base_log_prob, event_dim - len(self.base_dist.event_shape))
        for log_det in reversed(log_dets):
            log_prob = log_prob - log_det
        return log_prob

    def rsample_with_log_prob(self, sample_shape: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
        """A reparameterized draw and its log-density, ``(*sample_shape, *event_shape)`` and ``sample_shape``.

        The draw leaves this distribution's cache alone: ``log_prob`` still knows its last ``rsample()``.
        """
        fresh = type(self)(self.loc, self.scale, self.flows, validate_args=False)
        value = fresh.rsample(torch.Size(sample_shape))
        return value, fresh.log_prob(value)
