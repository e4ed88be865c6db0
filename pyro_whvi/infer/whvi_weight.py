r"""The lazy value of a WHVI weight site: :class:`WHVIWeight` (see :mod:`~pyro_whvi.infer.lazy_weight`).

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §2.3 (eq. 6) and §3.3 (convolutions as products).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..distributions import WHVIMatrix
from ..ops.shapes import stacked_whvi_conv2d
from .lazy_weight import LazyWeight, along_examples

__all__ = ["WHVIWeight"]


class WHVIWeight(LazyWeight):
    """The value of a WHVI weight site: ``distribution`` (``q(W)``) and the site's draw ``g``.

    :param distribution: the :class:`~pyro_whvi.distributions.WHVIMatrix` the weight follows.
    :param g: the site's draw of ``g``, ``(K, D)``; the dense weight is ``distribution.weight(g)``.
    :param local: whether ``F.linear``/``F.conv2d`` draw ``g`` per example (see the module docstring).
    :param example_dim: the input dimension of ``F.linear`` that indexes examples.
    :param strict: make other ops on the weight an error instead of a warning.
    :param site: the site's name, for messages.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.3 (eq. 6) and §3.3 (convolutions as products).
    """

    distribution: WHVIMatrix
    g: Tensor

    @staticmethod
    def __new__(cls, distribution: WHVIMatrix, g: Tensor, local: bool = True, **kwargs):
        return LazyWeight._wrap(cls, distribution.layout.shape, g)

    def __init__(
        self,
        distribution: WHVIMatrix,
        g: Tensor,
        local: bool = True,
        *,
        example_dim: int = 0,
        strict: bool = False,
        site: str | None = None,
    ):
        self.distribution = distribution
        self.g = g
        self._init_lazy(local, (g, distribution.s1, distribution.s2), example_dim, strict, site)

    def dense_weight(self) -> Tensor:
        return self.distribution.weight(self.g)

    def draw_examples(self, count: int) -> Tensor:
        g_dist = self.distribution.g_dist
        # Per-example draws never need their density: a flow's rsample would cache one for each
        # (seeded draws make one call per example) and push the site's own draw out of its cache.
        with_log_prob = getattr(g_dist, "rsample_with_log_prob", None)
        return with_log_prob((count,))[0] if with_log_prob is not None else g_dist.rsample((count,))

    def __repr__(self, *, tensor_contents=None):
        layout = self.distribution.layout
        return (
            f"WHVIWeight(shape={tuple(layout.shape)}, blocks={tuple(layout.block_shape)}, "
            f"local_reparameterization={self.local})"
        )

    def local_linear(self, input):
        if self.distribution.layout.kind != "matrix" or input.dim() < 2 or self.example_dim > input.dim() - 2:
            return None
        g = self.example_noise(input.shape[self.example_dim])  # (B, K, D)
        if input.dim() > 2 or self.example_dim:
            g = along_examples(g, self.example_dim, input.dim() - 1).expand(*input.shape[:-1], *g.shape[1:])
        return self.distribution.matvec(input, g)

    def local_conv(self, conv, images, stride, padding, dilation, groups):
        distribution = self.distribution
        if conv is not F.conv2d or groups != 1 or isinstance(padding, str) or distribution.layout.kind != "matrix":
            return None
        g = self.example_noise(images.shape[0])  # one draw per image: (N, K, D)
        return stacked_whvi_conv2d(images, distribution.s1, g, distribution.s2, self.shape, stride, padding, dilation)
