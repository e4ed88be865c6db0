r""":class:`MeanFieldLinear`: a fully factorized Gaussian linear layer, the paper's mean-field last layer.

:math:`q(W_{ij}) = \mathcal{N}(\mu_{ij}, \sigma_{ij}^2)`, prior :math:`\mathcal{N}(0, \sigma_p^2)` with
:math:`\sigma_p = \text{prior\_scale} / \sqrt{D_{in}}` (as :class:`~pyro_whvi.nn.networks.BayesianMLP`). With
local reparameterization each example draws its pre-activation, which is Gaussian with mean
:math:`\mu x + \mu_b` and variance :math:`\sigma^2 x^2 + \sigma_b^2` (Kingma et al., 2015): the draws
are of outputs, not of weights, so the layer cannot be used twice in one execution (an error says so).

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §3.2 (mean-field last layer); D. P. Kingma, T. Salimans,
    M. Welling. *Variational Dropout and the Local Reparameterization Trick*. NeurIPS 2015, §2.3.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .base import VariationalLayer, normal_kl, softplus_inverse

__all__ = ["MeanFieldLinear"]


class MeanFieldLinear(VariationalLayer):
    """A mean-field Gaussian ``nn.Linear``: locations start at a prior draw, scales at ``init_scale`` times the prior's.

    :param prior_scale: the weights' prior standard deviation times :math:`\\sqrt{D_{in}}`.
    :param bias_prior_scale: the bias's prior standard deviation.
    :param init_scale: initial standard deviations relative to the priors'.
    :param example_dim: the input dimension that indexes examples.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        prior_scale: float = 1.0,
        bias_prior_scale: float = 1.0,
        init_scale: float = 0.1,
        example_dim: int = 0,
        device=None,
        dtype=None,
    ):
        super().__init__(example_dim)
        if not prior_scale > 0 or not init_scale > 0:
            raise ValueError("MeanFieldLinear: prior_scale and init_scale must be > 0.")
        self.in_features, self.out_features = in_features, out_features
        self.weight_prior_scale = prior_scale / math.sqrt(in_features)
        like = torch.empty((), device=device, dtype=dtype or torch.get_default_dtype())
        loc = self.weight_prior_scale * torch.randn(out_features, in_features, dtype=like.dtype, device=device)
        self.weight_loc = nn.Parameter(loc)
        scale = torch.full_like(loc, init_scale * self.weight_prior_scale)
        self.weight_scale_unconstrained = nn.Parameter(softplus_inverse(scale))
        self.init_bias(bias, bias_prior_scale, init_scale, like)

    @property
    def weight_scale(self) -> Tensor:
        return F.softplus(self.weight_scale_unconstrained)

    def kl_divergence(self) -> Tensor:
        return normal_kl(self.weight_loc, self.weight_scale, self.weight_prior_scale) + self.bias_kl()

    def forward(self, input: Tensor) -> Tensor:
        self.check_linear_input(input, self.in_features)
        scope = self.execution
        if scope is not None and scope.depth and self.execution_key in scope.noise and self.local():
            raise RuntimeError(
                f"MeanFieldLinear {self.execution_key!r} is used twice in one execution; its local "
                "reparameterization draws outputs, not weights, so a second use cannot see the same weight. Use "
                "WHVILinear or VSDLinear for tied weights, or local_reparameterization(False)."
            )
        self.register_with_pyro()
        if not self.local():  # one weight draw shared by every example
            noise = self.draw_noise(1, self.weight_loc.numel() + self.bias_size, input)[0]
            weight = self.weight_loc + self.weight_scale * noise[: self.weight_loc.numel()].view_as(self.weight_loc)
            bias = self.bias_sample(noise[self.weight_loc.numel() :])
            return F.linear(input, weight, bias)
        noise = self.linear_noise(input, self.out_features)
        bias_variance = None if self.bias_loc is None else F.softplus(self.bias_scale_unconstrained).square()
        mean = F.linear(input, self.weight_loc, self.bias_loc)
        variance = F.linear(input.square(), self.weight_scale.square(), bias_variance)
        return mean + variance.sqrt() * noise

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias_loc is not None}"
