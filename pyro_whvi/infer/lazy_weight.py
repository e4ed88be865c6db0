r"""Weight values that are never formed unless something needs it (local reparameterization).

:class:`LazyWeight` is the base: a tensor subclass with a shape and no storage, whose
``F.linear``/``F.conv*d`` go through :meth:`LazyWeight.local_linear` / :meth:`LazyWeight.local_conv`
(one noise draw per example) and every other use through :meth:`LazyWeight.dense_weight`.

**Scope of the draws.** A lazy weight is the value of one site in one model execution. It draws
the noise of an example once, on the first ``F.linear``/``F.conv*d`` that sees the batch, and every
later use in the same execution reuses those draws: a layer called twice (tied weights, an unrolled
RNN) sees the same weight for an example each time, and the next execution draws anew. An example
is an index along ``example_dim`` of a linear layer's input (default 0, the leading batch index;
1 for sequence-first ``(T, B, D)`` inputs: a ``(B, T, D)`` input gets ``B`` draws, one per
sequence), and an image of a convolution's batch. Any other op (``W.t()``, ``x @ W.T``,
``F.embedding``, indexing) sees the dense weight of the site's single draw, shared by every
example: a warning says so, and with ``strict=True`` it is an error.

WHVI: the reparameterized model hands layers a :class:`~pyro_whvi.infer.whvi_weight.WHVIWeight` instead of a
dense tensor. Passed to ``F.linear`` or ``F.conv2d`` it computes the product through the fused WHVI op with
an independent draw of ``g`` for every example (WHVI paper §2.3, eq. 6), :math:`O(K D \log D)` per example and no
:math:`D \times D` matrix. Any other use (indexing, ``W.t()``, arithmetic, printing the values)
gets the dense weight of the site's own draw of ``g``, formed once and cached.

Local reparameterization changes the joint distribution of outputs across examples (each sees its
own weights) but not any single example's, so ELBO estimates stay unbiased and their variance
drops. Switch it off to draw coherent functions (e.g. to plot sampled curves):
``with local_reparameterization(False): ...``.

**Seeded draws.** Inside :func:`example_seeds` the noise of example ``i`` is drawn from a generator
seeded by the ``i``-th seed and the site's name, so that it does not depend on which other examples
share the batch or the process: a batch split across data-parallel ranks draws exactly what one process
drawing the whole batch would (:mod:`pyro_whvi.train.engine` uses it for world-size-independent runs).

VSD: :class:`~pyro_whvi.infer.vsd_weight.VSDWeight` is ``diag(xi) Theta`` (noise on the inputs of a linear
layer, on the output channels of a convolution); ``F.linear`` multiplies the inputs by a fresh ``xi`` per example,
``F.conv1d``/``conv2d``/``conv3d`` the output channels (VSD paper §3.4, App. B): dropout-style, the
noisy weight is never formed.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from .._moved import moved_names
from .draw_scope import (
    active_example_seeds,
    along_examples,
    check_example_dim,
    example_seeds,
    local_reparameterization,
    local_reparameterization_enabled,
    seeded_draws,
)
from .tracing import refuse_under_trace

# The draw-scope helpers are re-exported here, where they were defined until the module was split.
__all__ = [
    "LazyWeight",
    "along_examples",
    "check_example_dim",
    "example_seeds",
    "local_reparameterization",
    "local_reparameterization_enabled",
]

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
    *(getattr(Tensor, name).__get__ for name in ("shape", "ndim", "dtype", "device", "layout", "is_cuda", "is_sparse")),
}


_REQUIRES_GRAD = Tensor.requires_grad.__get__  # type: ignore[attr-defined]

# Ops that move or copy a value without computing with it: they get the site's draw quietly.
_COPIES = {torch.stack, torch.cat, Tensor.detach, Tensor.clone, Tensor.to, Tensor.cpu, Tensor.contiguous, Tensor.numpy}


class LazyWeight(Tensor):
    """Base of the lazy weights: a shape and no storage, and four hooks for subclasses.

    * :meth:`dense_weight` (required): the weight of the site's own draw, formed on demand.
    * :meth:`draw_examples`: the noise of ``count`` examples (leading dimension ``count``).
    * :meth:`local_linear`, :meth:`local_conv`: ``F.linear`` / ``F.conv1d``/``conv2d``/``conv3d``
      (batched input, no bias) with the noise of :meth:`example_noise`; return ``None`` to fall back
      to the dense weight.

    ``local`` switches the fast paths on or off (off: every op sees the site's draw, silently).
    ``example_dim`` is the input dimension of a linear layer that indexes examples; ``strict``
    makes an op that cannot use the per-example draws an error instead of a warning.
    ``requires_grad`` reports whether gradients flow to the tensors the weight is made of.
    """

    local: bool
    example_dim: int
    strict: bool
    site: str | None

    @staticmethod
    def _wrap(cls, shape, like: Tensor):
        return Tensor._make_wrapper_subclass(cls, shape, dtype=like.dtype, device=like.device, requires_grad=False)

    def _init_lazy(
        self, local: bool, parts: tuple[Tensor, ...], example_dim: int = 0, strict: bool = False, site=None
    ) -> None:
        self.local, self.example_dim, self.strict, self.site = local, example_dim, strict, site
        self._dense: dict[bool, Tensor] = {}
        self._example_noise: Tensor | None = None
        self._requires_grad = torch.is_grad_enabled() and any(_REQUIRES_GRAD(part) for part in parts)

    def dense_weight(self) -> Tensor:
        raise NotImplementedError

    def draw_examples(self, count: int) -> Tensor:
        raise NotImplementedError

    def example_noise(self, count: int) -> Tensor:
        """The noise of ``count`` examples: drawn on the first use in this model execution, then reused."""
        if self._example_noise is None:
            seeds = active_example_seeds()
            if seeds is None:
                self._example_noise = self.draw_examples(count)
                return self._example_noise
            refuse_under_trace(
                f"{self._label()}: example_seeds",
                "its per-example generators would be left out of the compiled graph; train with Trace_ELBO.",
            )
            if len(seeds) != count:
                raise ValueError(
                    f"{self._label()}: example_seeds gave {len(seeds)} seeds for a batch of {count} examples; "
                    "pass one seed per example."
                )
            self._example_noise = seeded_draws(self.draw_examples, seeds, self.site or "", self.device)
        elif self._example_noise.shape[0] != count:
            raise ValueError(
                f"{self._label()}: this model execution drew noise for {self._example_noise.shape[0]} examples and "
                f"now uses the weight on {count}; every use within one execution must see the same examples along "
                f"example_dim={self.example_dim} of a linear layer's input (dim 0 of a convolution's). Set the "
                "guide's example_dim for sequence-first inputs."
            )
        return self._example_noise

    def reset_example_noise(self) -> None:
        """Forget this execution's per-example draws: the next ``F.linear``/``F.conv*d`` draws anew."""
        self._example_noise = None

    def _label(self) -> str:
        return f"{type(self).__name__} {self.site!r}" if self.site else type(self).__name__

    def _shared_draw(self, func) -> Tensor:
        """The dense weight for an op that cannot use per-example draws: an error when strict, else a warning.

        Ops that only move or copy the value (Pyro's ``Predictive`` stacks draws, traces detach them)
        get the site's draw without either.
        """
        if self.local and func not in _COPIES:
            descriptor = getattr(func, "__self__", None)  # a property such as W.T: its getter's __self__
            name = getattr(descriptor, "__name__", None) if isinstance(descriptor, type(Tensor.T)) else None
            name = name or getattr(func, "__name__", str(func))
            message = (
                f"{self._label()}: {name} cannot use the per-example draws of F.linear/F.conv*d, so it sees the "
                "site's single draw, shared by every example (and different from the per-example weights)."
            )
            if self.strict:
                raise RuntimeError(
                    message + " Pass the weight to F.linear/F.conv*d as it is, or build the guide with strict=False "
                    "(or call .dense() explicitly) to accept one shared draw."
                )
            warnings.warn(
                message + " Build the guide with strict=True to make this an error.", UserWarning, stacklevel=4
            )
        return self.dense()

    def local_linear(self, input: Tensor) -> Tensor | None:
        return None

    def local_conv(self, conv, images: Tensor, stride, padding, dilation, groups) -> Tensor | None:
        return None

    def dense(self) -> Tensor:
        """The dense weight of the site's draw (cached per grad mode; differentiable)."""
        grad_mode = torch.is_grad_enabled()
        if grad_mode not in self._dense:
            self._dense[grad_mode] = self.dense_weight()
        return self._dense[grad_mode]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func is _REQUIRES_GRAD:
            return args[0]._requires_grad
        if func is F.linear:
            result = _linear(*args, **kwargs)
            if result is not None:
                return result
        elif func in _CONVS:
            result = _conv(func, *args, **kwargs)
            if result is not None:
                return result
        return func(*_densify(args, func), **_densify(kwargs, func))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(
            f"{cls.__name__} reached the dispatcher through {func}, which bypasses __torch_function__; "
            "call .dense() on the weight first."
        )


def _densify(tree, func=None):
    if isinstance(tree, LazyWeight):
        return tree._shared_draw(func)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_densify(item, func) for item in tree)
    if isinstance(tree, dict):
        return {key: _densify(value, func) for key, value in tree.items()}
    return tree


def _fast_path(weight, x) -> bool:
    return isinstance(weight, LazyWeight) and weight.local and isinstance(x, Tensor) and not isinstance(x, LazyWeight)


def _linear(input, weight, bias=None):
    if not _fast_path(weight, input) or weight.dim() != 2 or input.dim() < 1:
        return None
    if input.shape[-1] != weight.shape[-1]:
        return None  # let F.linear raise its usual shape error on the dense weight
    output = weight.local_linear(input)
    if output is not None and bias is not None:
        output = output + _densify(bias, F.linear)
    return output


_CONVS = (F.conv1d, F.conv2d, F.conv3d)


def _conv(conv, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _fast_path(weight, input) or weight.dim() != _CONVS.index(conv) + 3:
        return None
    if (
        input.dim() not in (weight.dim() - 1, weight.dim())
        or input.shape[-weight.dim() + 1] != weight.shape[1] * groups
    ):
        return None  # let the convolution raise its usual error on the dense weight
    unbatched = input.dim() == weight.dim() - 1
    images = input.unsqueeze(0) if unbatched else input
    output = weight.local_conv(conv, images, stride, padding, dilation, groups)
    if output is None:
        return None
    if bias is not None:
        output = output + _densify(bias, conv).reshape((-1,) + (1,) * (output.dim() - 2))
    return output.squeeze(0) if unbatched else output


__getattr__ = moved_names(
    __name__,
    {
        "WHVIWeight": "pyro_whvi.infer.whvi_weight",
        "VSDWeight": "pyro_whvi.infer.vsd_weight",
        "scale_along": "pyro_whvi.infer.vsd_weight",
    },
)
