r"""WHVI as layers: :class:`WHVILinear` and :class:`WHVIConv2d`.

The weight is :math:`W = S_1 H \operatorname{diag}(g) H S_2` on stacked blocks
(:class:`~pyro_whvi.distributions.WHVILayout`), with the prior :math:`g \sim \mathcal{N}(0, \lambda I)`
and :math:`q(g) = \mathcal{N}(\mu, \operatorname{diag}(\sigma^2))` (the paper's G-WHVI); ``S1``, ``S2``
are point estimates. Each example draws its own ``g`` and the product goes through the fused WHVI op,
:math:`O(K D \log D)` per example, never forming ``W`` (eq. 6). The bias is a mean-field Normal.
Defaults (``lambda = 1``, ``s = lambda^{-1/4}`` with random signs, ``mu`` a prior draw,
``sigma = 0.1 sqrt(lambda)``) are those of :class:`~pyro_whvi.AutoWHVIGuide`
(:mod:`pyro_whvi.infer.whvi_reparam` says why).

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §2.2–2.3 (eq. 2–6), §3.3 (convolutions), App. D.1.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..distributions import GaussianQG, WHVILayout, WHVINormal
from ..distributions.qg_family import diagonal_normal_kl
from ..distributions.whvi_matrix import whvi_weight
from ..infer.whvi_reparam import init_whvi_scales, whvi_prior
from ..ops.shapes import stacked_whvi_conv2d, stacked_whvi_matvec
from .base import VariationalLayer, softplus_inverse

__all__ = ["WHVIConv2d", "WHVILinear"]


class _WHVILayer(VariationalLayer):
    """The WHVI parameters of a weight of shape ``shape`` (matrix layout) and a bias."""

    def __init__(self, shape, bias, prior_variance, init_scale, bias_prior_scale, example_dim, device, dtype):
        super().__init__(example_dim)
        if not prior_variance > 0 or not init_scale > 0:
            raise ValueError(f"{type(self).__name__}: prior_variance and init_scale must be > 0.")
        layout = WHVILayout.for_shape(shape, site=type(self).__name__)
        if layout.kind != "matrix" and len(shape) != 2:
            raise ValueError(
                f"{type(self).__name__}: a filter bank of shape {tuple(shape)} needs C_out > 1 and C_in k_h k_w > 1."
            )
        self.layout, self.out_features, self.prior_variance = layout, shape[0], float(prior_variance)
        like = torch.empty((), device=device, dtype=dtype or torch.get_default_dtype())
        s1, s2 = init_whvi_scales(layout, self.prior_variance, like)
        self.s1, self.s2 = nn.Parameter(s1), nn.Parameter(s2)
        root_lambda = math.sqrt(self.prior_variance)
        self.g_loc = nn.Parameter(root_lambda * torch.randn(tuple(layout.block_shape), dtype=like.dtype, device=device))
        scale = torch.full_like(self.g_loc, init_scale * root_lambda)
        self.g_scale_unconstrained = nn.Parameter(softplus_inverse(scale))
        self.init_bias(bias, bias_prior_scale, init_scale, like)

    @property
    def g_scale(self) -> Tensor:
        return F.softplus(self.g_scale_unconstrained)

    def qg(self) -> GaussianQG:
        """:math:`q(g)` as the family's :class:`~pyro_whvi.distributions.GaussianQG` (diagonal, ``(K, D)``)."""
        return GaussianQG("diagonal", self.g_loc, scale=self.g_scale)

    def posterior(self) -> dist.TorchDistribution:
        """:math:`q(g)`, event shape ``(K, D)``."""
        return self.qg().distribution()

    def prior(self) -> dist.TorchDistribution:
        """:math:`p(g) = \\mathcal{N}(0, \\lambda I)`, event shape ``(K, D)``."""
        return whvi_prior(self.layout, self.prior_variance, self.g_loc)

    def weight_distribution(self) -> WHVINormal:
        """``q(W)``: mean, marginal variances, dense draws (:class:`~pyro_whvi.distributions.WHVINormal`)."""
        return WHVINormal(self.s1, self.s2, self.posterior(), self.layout.shape)

    def kl_divergence(self) -> Tensor:
        # The family's closed form for a diagonal q(g) (GaussianQG.kl_divergence), called directly: the
        # loss is traced by torch.compile(fullgraph=True), which need not follow a frozen dataclass.
        return diagonal_normal_kl(self.g_loc, self.g_scale, math.sqrt(self.prior_variance)) + self.bias_kl()

    def split_noise(self, noise: Tensor) -> tuple[Tensor, Tensor | None]:
        """``g`` ``(..., K, D)`` and the bias ``(..., out)`` for standard-normal ``noise`` ``(..., K D [+ out])``."""
        num_latent = self.layout.num_latent
        g = self.g_loc + self.g_scale * noise[..., :num_latent].unflatten(-1, tuple(self.layout.block_shape))
        bias = self.bias_sample(noise[..., num_latent:])
        return g, bias

    def extra_repr(self) -> str:
        return (
            f"shape={tuple(self.layout.shape)}, blocks={tuple(self.layout.block_shape)}, "
            f"bias={self.bias_loc is not None}, prior_variance={self.prior_variance}"
        )


class WHVILinear(_WHVILayer):
    r"""``y = W x + b``, :math:`W = S_1 H \operatorname{diag}(g) H S_2`, one draw of ``g`` per example.

    :param in_features: ``D_in``.
    :param out_features: ``D_out``; ``K = ceil(D_out / D)`` blocks of size ``D``, the next power of two
        of ``D_in``. A weight with a side of one (``n`` entries) is a reshaped vector instead: one
        ``D x D`` block with ``D^2 >= n`` (§2.5), whose dense weight each example forms
        (:math:`O(D^2 \log D)`, ``D ~ sqrt(n)``).
    :param bias: learn a mean-field Normal bias with prior :math:`\mathcal{N}(0, \text{bias\_prior\_scale}^2)`.
    :param prior_variance: :math:`\lambda`.
    :param init_scale: initial :math:`\sigma` in units of :math:`\sqrt\lambda` (of the bias: of its prior scale).
    :param example_dim: the input dimension that indexes examples (one draw each).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2–2.3, §2.5 (Algorithm 1), App. D.1.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        prior_variance: float = 1.0,
        init_scale: float = 0.1,
        bias_prior_scale: float = 1.0,
        example_dim: int = 0,
        device=None,
        dtype=None,
    ):
        self.in_features = in_features
        shape = (out_features, in_features)
        super().__init__(shape, bias, prior_variance, init_scale, bias_prior_scale, example_dim, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        self.check_linear_input(input, self.in_features)
        g, bias = self.split_noise(self.linear_noise(input, self.layout.num_latent + self.bias_size))
        if self.layout.kind == "vector":  # a side of one: each example's (small) dense weight, §2.5
            weight = whvi_weight(self.s1, g, self.s2, self.layout)
            output = (weight @ input.unsqueeze(-1)).squeeze(-1)
        else:
            g = g.expand(*input.shape[:-1], *g.shape[-2:])
            output = stacked_whvi_matvec(input, self.s1, g, self.s2, self.out_features)
        self.register_with_pyro()
        return output if bias is None else output + bias


class WHVIConv2d(_WHVILayer):
    r"""A 2-D convolution whose filter bank, read as a ``(C_out, C_in k_h k_w)`` matrix, is a WHVI weight (§3.3).

    One draw of ``g`` per image; every patch goes through the WHVI product. Arguments as
    :class:`WHVILinear`, and ``kernel_size``, ``stride``, ``padding`` (numbers), ``dilation`` as
    ``nn.Conv2d`` (``groups=1``).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §3.3.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        bias: bool = True,
        *,
        prior_variance: float = 1.0,
        init_scale: float = 0.1,
        bias_prior_scale: float = 1.0,
        device=None,
        dtype=None,
    ):
        if isinstance(padding, str):
            raise ValueError(f"WHVIConv2d: padding must be a number or a pair, got {padding!r}.")
        pair = torch.nn.modules.utils._pair
        self.in_channels, self.kernel_size = in_channels, pair(kernel_size)
        self.stride, self.padding, self.dilation = pair(stride), pair(padding), pair(dilation)
        shape = (out_channels, in_channels, *self.kernel_size)
        super().__init__(shape, bias, prior_variance, init_scale, bias_prior_scale, 0, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return self.convolve(input, self.in_channels, self._convolution)

    def _convolution(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        g, bias = self.split_noise(self.image_noise(images, self.layout.num_latent + self.bias_size))
        g = g.expand(images.shape[0], *g.shape[-2:])
        shape, stride, padding, dilation = self.layout.shape, self.stride, self.padding, self.dilation
        return stacked_whvi_conv2d(images, self.s1, g, self.s2, shape, stride, padding, dilation), bias
