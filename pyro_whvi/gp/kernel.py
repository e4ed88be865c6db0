r"""A GPyTorch RBF kernel approximated by random Fourier features, with dense or FWHT-structured projections.

Shape letters: ``N`` inputs, ``d`` input dimensions, ``m`` frequencies (``2m`` features), ``*b`` the
kernel's batch shape, ``...`` any batch.

References:
    A. Rahimi, B. Recht. *Random Features for Large-Scale Kernel Machines*. NeurIPS 2007.
    D. J. Sutherland, J. Schneider. *On the Error of Random Fourier Features*. UAI 2015 (sin/cos pairs).
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4; and the workshop version (2019), §3.2.
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from gpytorch.models import exact_prediction_strategies
from linear_operator.operators import LowRankRootLinearOperator, MatmulLinearOperator, RootLinearOperator
from torch import Tensor

from ..ops._checks import check_finite
from .features import PROJECTIONS, default_block_size, draw_projection, fourier_features, project

__all__ = ["RandomFeatureKernel"]

_BUFFERS = {
    "dense": ("randn_weights",),
    "fastfood": ("fastfood_signs", "fastfood_gaussian", "fastfood_scale", "fastfood_permutation"),
    "sorf": ("sorf_signs",),
}


class RandomFeatureKernel(Kernel):
    r"""RBF kernel :math:`\sigma^2 \exp(-\tfrac12 \sum_i (x_i - x'_i)^2 / \ell_i^2)` as :math:`\phi(x)^\top \phi(x')`.

    .. math::
        \phi(x) = \frac{\sigma}{\sqrt m} \big[\cos(\Omega\, x / \ell),\ \sin(\Omega\, x / \ell)\big],
        \qquad \Omega \in \mathbb R^{m \times d},

    with the rows of :math:`\Omega` standard Gaussian (``projection="dense"``, as
    :class:`gpytorch.kernels.RFFKernel`) or drawn from a structured Fastfood or SORF ensemble and
    applied through the FWHT in :math:`O(N m \log P)` (see :mod:`pyro_whvi.gp.features`). The
    randomness lives in buffers (so ``state_dict`` and ``kernel[i]`` carry it) and is drawn at
    construction when ``num_dims`` is given, otherwise on the first call.

    :param num_samples: ``m``, the number of frequencies; there are ``2m`` features.
    :param projection: ``"dense"``, ``"fastfood"`` or ``"sorf"``.
    :param num_dims: ``d``, the input dimension after ``active_dims`` (inferred on first use if omitted).
    :param block_size: ``P`` for the structured projections, a power of two ``>= d``
        (default :func:`~pyro_whvi.gp.features.default_block_size`).
    :param seed: seeds the random projection (``None``: PyTorch's global generator), so two kernels
        with the same seed and sizes share their features.
    :param outputscale_constraint: constraint on :math:`\sigma^2` (default positive).
    :param kwargs: :class:`gpytorch.kernels.Kernel` arguments (``ard_num_dims``, ``batch_shape``,
        ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``, ...).

    References:
        Rahimi & Recht (2007); Le et al., Fastfood (ICML 2013); Yu et al., ORF/SORF (NeurIPS 2016);
        WHVI paper (Rossi et al., NeurIPS 2020), App. D.4.
    """

    has_lengthscale = True

    def __init__(
        self,
        num_samples: int,
        projection: str = "dense",
        num_dims: int | None = None,
        block_size: int | None = None,
        seed: int | None = None,
        outputscale_constraint: Interval | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"RandomFeatureKernel: num_samples must be a positive integer, got {num_samples!r}.")
        if projection not in PROJECTIONS:
            raise ValueError(f"RandomFeatureKernel: projection must be one of {PROJECTIONS}, got {projection!r}.")
        if block_size is not None and (block_size < 1 or block_size & (block_size - 1)):
            raise ValueError(f"RandomFeatureKernel: block_size must be a power of two, got {block_size!r}.")
        super().__init__(**kwargs)
        self.num_samples = num_samples
        self.projection = projection
        self.requested_block_size = block_size
        self.seed = seed
        self.register_parameter("raw_outputscale", torch.nn.Parameter(torch.zeros(self.batch_shape)))
        self.register_constraint("raw_outputscale", outputscale_constraint or Positive())
        self.outputscale = 1.0
        if num_dims is not None:
            self._draw(num_dims)

    @property
    def num_features(self) -> int:
        """``2m``: one cosine and one sine feature per frequency."""
        return 2 * self.num_samples

    @property
    def outputscale(self) -> Tensor:
        return self.raw_outputscale_constraint.transform(self.raw_outputscale)

    @outputscale.setter
    def outputscale(self, value: float | Tensor) -> None:
        value = torch.as_tensor(value).to(self.raw_outputscale)
        self.initialize(raw_outputscale=self.raw_outputscale_constraint.inverse_transform(value))

    @property
    def num_dims(self) -> int | None:
        """``d``, once the projection has been drawn."""
        return getattr(self, "_num_dims", None)

    def _draw(self, num_dims: int) -> None:
        if self.ard_num_dims is not None and self.ard_num_dims != num_dims:
            raise ValueError(
                f"RandomFeatureKernel: inputs have {num_dims} dimensions (after active_dims) but "
                f"ard_num_dims={self.ard_num_dims}."
            )
        block_size = self.requested_block_size or default_block_size(num_dims, self.num_samples)
        if block_size < num_dims:
            raise ValueError(
                f"RandomFeatureKernel: block_size {block_size} is smaller than the input dimension {num_dims}."
            )
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        dtype = self.raw_lengthscale.dtype
        with torch.inference_mode(False):  # buffers drawn under inference_mode could not be trained through later
            tensors = draw_projection(
                self.projection, self.batch_shape, num_dims, self.num_samples, block_size, dtype, generator
            )
        for name, value in tensors.items():
            self.register_buffer(name, value.to(self.raw_lengthscale.device))
        self._num_dims = num_dims

    def get_extra_state(self) -> dict[str, Any]:
        return {"num_dims": self.num_dims}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("num_dims") is not None:
            self._num_dims = int(state["num_dims"])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A kernel whose projection is drawn lazily has no buffers yet: make room for the saved ones.
        for name in _BUFFERS[self.projection]:
            if not hasattr(self, name) and prefix + name in state_dict:
                saved = state_dict[prefix + name]
                dtype = self.raw_lengthscale.dtype if saved.is_floating_point() else saved.dtype
                self.register_buffer(name, torch.empty(saved.shape, dtype=dtype, device=self.raw_lengthscale.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def projection_buffers(self) -> dict[str, Tensor]:
        """The random tensors of the projection by name (empty before the first draw)."""
        return {name: getattr(self, name) for name in _BUFFERS[self.projection] if hasattr(self, name)}

    def frequencies(self) -> Tensor:
        r"""The effective :math:`\Omega / \ell` as a ``(*b, d, m)`` matrix (``x @ frequencies()`` projects)."""
        if not self.projection_buffers():
            raise RuntimeError("RandomFeatureKernel: no projection yet; pass num_dims or call the kernel once.")
        num_dims = self.num_dims or int(self.ard_num_dims or 1)
        eye = torch.eye(num_dims, dtype=self.raw_lengthscale.dtype, device=self.raw_lengthscale.device)
        return project(self.projection, eye / self.lengthscale, self.projection_buffers(), self.num_samples)

    def _angles(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # A NaN input would reach every parameter through the gradient of one step: refuse it here,
        # where the model's, the kernel's and the regressor's paths all pass.
        check_finite(type(self).__name__, "x (the inputs)", x)
        if not self.projection_buffers():
            self._draw(x.shape[-1])
        elif self.num_dims is not None and x.shape[-1] != self.num_dims:
            raise ValueError(
                f"RandomFeatureKernel: inputs have {x.shape[-1]} dimensions, the projection was drawn for "
                f"{self.num_dims}."
            )
        angles = project(self.projection, x / self.lengthscale, self.projection_buffers(), self.num_samples)
        return angles, (self.outputscale / self.num_samples).sqrt()[..., None, None]

    def featurize(self, x: Tensor) -> Tensor:
        r"""The features :math:`\phi(x)`, ``(..., N, d)`` to ``(..., N, 2m)``, outputscale included."""
        return fourier_features(*self._angles(x))

    def feature_angles(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""``(angles, scale)`` with :meth:`feature_map` ``= scale * [cos(angles), sin(angles)]``.

        ``angles`` is :math:`x \Omega / \ell`, ``(..., N, m)``; ``scale`` is :math:`\sqrt{\sigma^2 / m}`,
        ``(*b, 1, 1)``. For consumers that fuse the cos/sin into their own product.
        """
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        return self._angles(x)

    def feature_map(self, x: Tensor) -> Tensor:
        """:meth:`featurize` after selecting ``active_dims`` (what :meth:`forward` sees through ``__call__``)."""
        return fourier_features(*self.feature_angles(x))

    # GPyTorch's RFFKernel names its feature map `_featurize`; keep the same hook name.
    _featurize = featurize

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params: Any):
        if last_dim_is_batch:
            x1 = x1.transpose(-1, -2).unsqueeze(-1)
            x2 = x2.transpose(-1, -2).unsqueeze(-1)
        same = torch.equal(x1, x2)
        z1 = self.featurize(x1)
        z2 = z1 if same else self.featurize(x2)
        if diag:
            return (z1 * z2).sum(-1)
        if same:
            return LowRankRootLinearOperator(z1) if z1.size(-1) < z1.size(-2) else RootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.transpose(-1, -2))

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return exact_prediction_strategies.LinearPredictionStrategy(
            train_inputs, train_prior_dist, train_labels, likelihood
        )

    def extra_repr(self) -> str:
        return f"num_samples={self.num_samples}, projection={self.projection!r}, num_dims={self.num_dims}"


def rbf_kernel_matrix(x1: Tensor, x2: Tensor, lengthscale: Tensor | float, outputscale: Tensor | float = 1.0) -> Tensor:
    """The exact RBF kernel matrix ``(N1, N2)``, for tests and convergence checks."""
    scaled1, scaled2 = x1 / lengthscale, x2 / lengthscale
    return outputscale * torch.exp(-0.5 * torch.cdist(scaled1, scaled2).pow(2))
