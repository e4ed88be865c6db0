r"""Variational Structured Dropout as layers: :class:`VSDLinear` and :class:`VSDConv2d`.

The weight is :math:`W = \operatorname{diag}(\xi) \Theta` with structured multiplicative noise
:math:`\xi \sim \mathcal{N}(1, U \operatorname{diag}(\alpha) U^\top)`, ``U`` a product of Householder
reflections (:class:`~pyro_whvi.distributions.StructuredDropoutNoise`); on the inputs of a linear
layer (dropout on them), on the output channels of a convolution (§3.4). Each example draws its own
:math:`\xi`; the noisy weight is never formed. The KL is the empirical-Bayes term of eq. (6),
:math:`\frac{Q}{2} \sum_i \log((1 + s_i) / \alpha_i)`, as :class:`~pyro_whvi.AutoVSDGuide` computes
it (non-hierarchical model); the bias is a mean-field Normal.

References:
    VSD paper (Nguyen et al., NeurIPS 2021), §3.1–3.4 (eq. 6), App. B, App. D.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..distributions.empirical_bayes import vsd_kl
from ..distributions.householder import StructuredDropoutNoise
from ..infer.vsd_guide import HouseholderVectors
from .base import VariationalLayer

__all__ = ["VSDConv2d", "VSDLinear"]


class _VSDLayer(VariationalLayer):
    """:math:`\\Theta` of shape ``shape`` (``nn.Linear``/``nn.Conv2d`` init), noise over ``num_noise`` entries."""

    def __init__(self, shape, num_noise, bias, reflections, hidden_rank, init_alpha, bias_prior_scale, init_scale,
                 example_dim, device, dtype):  # fmt: skip
        super().__init__(example_dim)
        if not init_alpha > 0 or not isinstance(reflections, int) or reflections < 0:
            raise ValueError(f"{type(self).__name__}: init_alpha must be > 0 and reflections an int >= 0.")
        like = torch.empty((), device=device, dtype=dtype or torch.get_default_dtype())
        theta = torch.empty(shape, dtype=like.dtype, device=device)
        nn.init.kaiming_uniform_(theta, a=math.sqrt(5))  # nn.Linear's and nn.Conv2d's own initialization
        self.theta = nn.Parameter(theta)
        self.num_noise, self.num_columns = num_noise, math.prod(shape) // num_noise
        self.log_alpha = nn.Parameter(torch.full((num_noise,), math.log(init_alpha), dtype=like.dtype, device=device))
        self.householder = HouseholderVectors(num_noise, reflections, hidden_rank, like)
        self.out_features = shape[0]
        self.init_bias(bias, bias_prior_scale, init_scale, like)

    def noise_distribution(self) -> StructuredDropoutNoise:
        r""":math:`q(\xi) = \mathcal{N}(1, U \operatorname{diag}(\alpha) U^\top)`."""
        return StructuredDropoutNoise(self.log_alpha.exp(), self.householder(), validate_args=False)

    def kl_divergence(self) -> Tensor:
        noise = self.noise_distribution()
        return vsd_kl(noise.alpha, noise.variance, self.num_columns) + self.bias_kl()

    def split_noise(self, noise: Tensor) -> tuple[Tensor, Tensor | None]:
        r""":math:`\xi` ``(..., K)`` and the bias ``(..., out)`` for standard-normal ``noise``."""
        distribution = self.noise_distribution()
        xi = distribution.alpha.sqrt() * noise[..., : self.num_noise]
        for transform in distribution.transforms:  # the distribution's own rsample, on this execution's noise
            xi = transform(xi)
        bias = self.bias_sample(noise[..., self.num_noise :])
        return xi, bias

    def extra_repr(self) -> str:
        return (
            f"shape={tuple(self.theta.shape)}, noise entries={self.num_noise}, "
            f"reflections={self.householder.reflections}, bias={self.bias_loc is not None}"
        )


class VSDLinear(_VSDLayer):
    r"""``y = \Theta (\xi \odot x) + b``: structured dropout on the inputs, one :math:`\xi` per example.

    :param reflections: ``T`` Householder reflections (0: Gaussian dropout; the paper uses 1 or 2).
    :param hidden_rank: rank of the bottleneck between successive Householder vectors (``None``: full).
    :param init_alpha: initial :math:`\alpha` (``p / (1 - p)`` for a dropout rate ``p``).
    :param bias_prior_scale: prior standard deviation of the (mean-field) bias.
    :param init_scale: initial standard deviation of the bias relative to its prior's.
    :param example_dim: the input dimension that indexes examples.

    References:
        VSD paper (Nguyen et al., NeurIPS 2021), §3.1–3.2, eq. (6).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        reflections: int = 1,
        hidden_rank: int | None = None,
        init_alpha: float = 0.25,
        bias_prior_scale: float = 1.0,
        init_scale: float = 0.1,
        example_dim: int = 0,
        device=None,
        dtype=None,
    ):
        self.in_features = in_features
        super().__init__((out_features, in_features), in_features, bias, reflections, hidden_rank, init_alpha,
                         bias_prior_scale, init_scale, example_dim, device, dtype)  # fmt: skip

    def forward(self, input: Tensor) -> Tensor:
        self.check_linear_input(input, self.in_features)
        xi, bias = self.split_noise(self.linear_noise(input, self.num_noise + self.bias_size))
        output = F.linear(input * xi, self.theta)
        self.register_with_pyro()
        return output if bias is None else output + bias


class VSDConv2d(_VSDLayer):
    r"""A 2-D convolution with structured dropout on its output channels (§3.4), one :math:`\xi` per image.

    Convolution arguments as ``nn.Conv2d`` (``groups`` and string padding included); the others as
    :class:`VSDLinear`.

    References:
        VSD paper (Nguyen et al., NeurIPS 2021), §3.4, App. B.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        *,
        reflections: int = 1,
        hidden_rank: int | None = None,
        init_alpha: float = 0.25,
        bias_prior_scale: float = 1.0,
        init_scale: float = 0.1,
        device=None,
        dtype=None,
    ):
        pair = torch.nn.modules.utils._pair
        self.in_channels, self.kernel_size, self.groups = in_channels, pair(kernel_size), groups
        self.stride, self.dilation = pair(stride), pair(dilation)
        self.padding = padding if isinstance(padding, str) else pair(padding)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        super().__init__(shape, out_channels, bias, reflections, hidden_rank, init_alpha, bias_prior_scale,
                         init_scale, 0, device, dtype)  # fmt: skip

    def forward(self, input: Tensor) -> Tensor:
        return self.convolve(input, self.in_channels, self._convolution)

    def _convolution(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        xi, bias = self.split_noise(self.image_noise(images, self.num_noise + self.bias_size))
        output = F.conv2d(images, self.theta, None, self.stride, self.padding, self.dilation, self.groups)
        return output * xi[..., None, None], bias
