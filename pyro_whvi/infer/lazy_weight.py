r"""A weight value that is never formed unless something needs it (WHVI local reparameterization).

The reparameterized model hands layers a :class:`WHVIWeight` instead of a dense tensor. Passed to
``F.linear`` or ``F.conv2d`` it computes the product through the fused WHVI op with an independent
draw of ``g`` for every example (WHVI paper §2.3, eq. 6), :math:`O(K D \log D)` per example and no
:math:`D \times D` matrix. Any other use (indexing, ``W.t()``, arithmetic, printing the values)
gets the dense weight of the site's own draw of ``g``, formed once and cached.

Local reparameterization changes the joint distribution of outputs across examples (each sees its
own weights) but not any single example's, so ELBO estimates stay unbiased and their variance
drops. Switch it off to draw coherent functions (e.g. to plot sampled curves):
``with local_reparameterization(False): ...``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..distributions import WHVIMatrix

__all__ = ["WHVIWeight", "local_reparameterization", "local_reparameterization_enabled"]

_LOCAL_OVERRIDE: list[bool] = []

_METADATA = {
    Tensor.size,
    Tensor.dim,
    Tensor.ndimension,
    Tensor.numel,
    Tensor.nelement,
    Tensor.element_size,
    Tensor.is_floating_point,
    Tensor.is_complex,
    Tensor.__len__,
    *(
        getattr(Tensor, name).__get__
        for name in ("shape", "ndim", "dtype", "device", "layout", "is_cuda", "is_sparse", "requires_grad")
    ),
}


@contextlib.contextmanager
def local_reparameterization(enabled: bool) -> Iterator[None]:
    """Force local reparameterization on or off for WHVI weights created inside the block."""
    _LOCAL_OVERRIDE.append(bool(enabled))
    try:
        yield
    finally:
        _LOCAL_OVERRIDE.pop()


def local_reparameterization_enabled(default: bool) -> bool:
    """The setting in force: the innermost :func:`local_reparameterization` block, else ``default``."""
    return _LOCAL_OVERRIDE[-1] if _LOCAL_OVERRIDE else default


class WHVIWeight(Tensor):
    """The value of a WHVI weight site: ``distribution`` (``q(W)``) and the site's draw ``g``.

    :param distribution: the :class:`~pyro_whvi.distributions.WHVIMatrix` the weight follows.
    :param g: the site's draw of ``g``, ``(K, D)``; the dense weight is ``distribution.weight(g)``.
    :param local: whether ``F.linear``/``F.conv2d`` draw a fresh ``g`` per example.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.3 (eq. 6) and §3.3 (convolutions as products).
    """

    distribution: WHVIMatrix
    g: Tensor
    local: bool

    @staticmethod
    def __new__(cls, distribution: WHVIMatrix, g: Tensor, local: bool = True):
        return Tensor._make_wrapper_subclass(
            cls, distribution.layout.shape, dtype=g.dtype, device=g.device, requires_grad=False
        )

    def __init__(self, distribution: WHVIMatrix, g: Tensor, local: bool = True):
        self.distribution = distribution
        self.g = g
        self.local = local
        self._dense: dict[bool, Tensor] = {}

    def dense(self) -> Tensor:
        """The dense weight of the site's draw of ``g`` (cached; differentiable)."""
        grad_mode = torch.is_grad_enabled()
        if grad_mode not in self._dense:
            self._dense[grad_mode] = self.distribution.weight(self.g)
        return self._dense[grad_mode]

    def __repr__(self, *, tensor_contents=None):
        layout = self.distribution.layout
        return (
            f"WHVIWeight(shape={tuple(layout.shape)}, blocks={tuple(layout.block_shape)}, "
            f"local_reparameterization={self.local})"
        )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func is F.linear:
            result = _linear(*args, **kwargs)
            if result is not None:
                return result
        elif func is F.conv2d:
            result = _conv2d(*args, **kwargs)
            if result is not None:
                return result
        return func(*_densify(args), **_densify(kwargs))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(
            f"WHVIWeight reached the dispatcher through {func}, which bypasses __torch_function__; "
            "call .dense() on the weight first."
        )


def _densify(tree):
    if isinstance(tree, WHVIWeight):
        return tree.dense()
    if isinstance(tree, (list, tuple)):
        return type(tree)(_densify(item) for item in tree)
    if isinstance(tree, dict):
        return {key: _densify(value) for key, value in tree.items()}
    return tree


def _fast_path(weight, x) -> bool:
    return (
        isinstance(weight, WHVIWeight)
        and weight.local
        and weight.distribution.layout.kind == "matrix"
        and isinstance(x, Tensor)
        and not isinstance(x, WHVIWeight)
    )


def _linear(input, weight, bias=None):
    if not _fast_path(weight, input) or weight.dim() != 2 or input.dim() < 1:
        return None
    distribution = weight.distribution
    if input.shape[-1] != distribution.layout.in_features:
        return None  # let F.linear raise its usual shape error on the dense weight
    output = distribution.matvec(input)  # a fresh draw of g per row
    if bias is not None:
        output = output + _densify(bias)
    return output


def _conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _fast_path(weight, input) or groups != 1 or isinstance(padding, str) or weight.dim() != 4:
        return None
    if input.dim() not in (3, 4) or input.shape[-3] != weight.shape[1]:
        return None
    unbatched = input.dim() == 3
    images = input.unsqueeze(0) if unbatched else input
    out_channels, _, kernel_h, kernel_w = weight.shape
    pair = torch.nn.modules.utils._pair
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    patches = F.unfold(images, (kernel_h, kernel_w), dilation=dilation, padding=padding, stride=stride)
    height = (images.shape[-2] + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    width = (images.shape[-1] + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    distribution = weight.distribution
    g = distribution.g_dist.rsample(images.shape[:1]).unsqueeze(-3)  # one draw per image: (N, 1, K, D)
    output = distribution.matvec(patches.mT, g)  # (N, L, C_out)
    output = output.mT.reshape(images.shape[0], out_channels, height, width)
    if bias is not None:
        output = output + _densify(bias).reshape(-1, 1, 1)
    return output.squeeze(0) if unbatched else output
