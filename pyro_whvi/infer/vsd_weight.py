r"""The lazy value of a VSD weight site: :class:`VSDWeight` (see :mod:`~pyro_whvi.infer.lazy_weight`).

References:
    VSD paper (Nguyen et al., NeurIPS 2021), §3.1, §3.4, App. B.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..distributions.householder import StructuredDropoutNoise
from .lazy_weight import LazyWeight, along_examples

__all__ = ["VSDWeight", "scale_along"]


def scale_along(theta: Tensor, xi: Tensor, noise_dim: int) -> Tensor:
    r""":math:`\operatorname{diag}(\xi) \Theta` along axis ``noise_dim`` of ``theta``; ``xi`` is ``(..., K)``.

    Leading dimensions of ``xi`` (independent draws) become leading dimensions of the result.
    """
    shape = xi.shape[:-1] + (1,) * noise_dim + xi.shape[-1:] + (1,) * (theta.dim() - 1 - noise_dim)
    return xi.reshape(shape) * theta


class VSDWeight(LazyWeight):
    r"""The value of a VSD weight site: :math:`W = \operatorname{diag}(\xi) \Theta` along ``noise_dim``.

    :param theta: the deterministic weight :math:`\Theta` (PyTorch layout: ``(out, in)`` or
        ``(C_out, C_in, k...)``).
    :param noise: the distribution of :math:`\xi` (:class:`~pyro_whvi.distributions.StructuredDropoutNoise`).
    :param noise_dim: the axis of ``theta`` that :math:`\xi` scales: ``1`` (the inputs of a linear layer,
        as dropout) or ``0`` (the output channels of a convolution, §3.4).
    :param xi: the site's own draw of :math:`\xi` times ``row_scale`` (default: drawn here).
    :param row_scale: ``z`` of the hierarchical model (multiplies every draw), or ``None``.
    :param local: whether ``F.linear``/``F.conv2d`` draw :math:`\xi` per example (see the module docstring).
    :param example_dim: the input dimension of ``F.linear`` that indexes examples.
    :param strict: make other ops on the weight an error instead of a warning.
    :param site: the site's name, for messages.

    References:
        VSD paper (Nguyen et al., NeurIPS 2021), §3.1, §3.4, App. B.
    """

    @staticmethod
    def __new__(cls, theta, noise, noise_dim, xi=None, row_scale=None, local=True, **kwargs):
        return LazyWeight._wrap(cls, theta.shape, theta)

    def __init__(
        self,
        theta: Tensor,
        noise: StructuredDropoutNoise,
        noise_dim: int,
        xi: Tensor | None = None,
        row_scale: Tensor | None = None,
        local: bool = True,
        *,
        example_dim: int = 0,
        strict: bool = False,
        site: str | None = None,
    ):
        self.theta, self.noise, self.noise_dim, self.row_scale = theta, noise, noise_dim, row_scale
        self.xi = xi if xi is not None else self.draw_examples(None)
        self._init_lazy(local, (theta, self.xi), example_dim, strict, site)

    def draw_examples(self, count: int | None) -> Tensor:
        xi = self.noise.rsample(() if count is None else (count,))
        return xi if self.row_scale is None else xi * self.row_scale

    def dense_weight(self) -> Tensor:
        return scale_along(self.theta, self.xi, self.noise_dim)

    def __repr__(self, *, tensor_contents=None):
        axis = "inputs" if self.noise_dim == 1 else "output channels"
        return (
            f"VSDWeight(shape={tuple(self.shape)}, noise on {axis} (K={self.xi.shape[-1]}), "
            f"reflections={self.noise.vectors.shape[0]}, local_reparameterization={self.local})"
        )

    def local_linear(self, input):
        if self.noise_dim != 1 or self.theta.dim() != 2 or input.dim() < 2 or self.example_dim > input.dim() - 2:
            return None
        xi = self.example_noise(input.shape[self.example_dim])  # (B, K)
        return F.linear(input * along_examples(xi, self.example_dim, input.dim() - 1), self.theta)

    def local_conv(self, conv, images, stride, padding, dilation, groups):
        if self.noise_dim != 0:
            return None
        output = conv(images, self.theta, None, stride, padding, dilation, groups)
        xi = self.example_noise(images.shape[0])  # one draw per image, scaling its output channels (§3.4)
        return output * xi.reshape(xi.shape + (1,) * (output.dim() - 2))
