r"""The WHVI conventions: where the prior scale of ``W = S1 H diag(g) H S2`` sits, in ``lambda`` or in ``S1``, ``S2``.

See :mod:`~pyro_whvi.distributions.qg_family` for why the choice matters (Adam's steps are absolute in
parameter units) although the model only sees :math:`s^4 \lambda`.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020: §2.2, App. D.1 (networks) and D.4 (GPs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GP_CONVENTION", "NETWORK_CONVENTION", "WHVIConvention"]


@dataclass(frozen=True)
class WHVIConvention:
    r"""Where the prior scale of ``W = S1 H diag(g) H S2`` sits: in ``lambda`` or in ``S1``, ``S2``.

    :param prior_variance: the default :math:`\lambda`; ``None`` means ``D`` (the block size).
    :param scale_exponent: ``s = lambda ** scale_exponent`` for the initial ``S1``, ``S2``.
    :param random_signs: ``S2`` starts with random signs (FASTFOOD's ``B``).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2, App. D.1 (networks), App. D.4 (GPs).
    """

    prior_variance: float | None
    scale_exponent: float
    random_signs: bool

    def resolve_prior_variance(self, block_size: int, prior_variance: float | None = None) -> float:
        """``prior_variance`` if given, else this convention's default for blocks of ``block_size``."""
        if prior_variance is not None:
            return prior_variance
        return float(block_size) if self.prior_variance is None else self.prior_variance

    def weight_variance(self, block_size: int, prior_variance: float | None = None) -> float:
        r"""The prior variance of each entry of ``W`` at the initial ``S1``, ``S2``: :math:`s^4 \lambda / D`."""
        lam = self.resolve_prior_variance(block_size, prior_variance)
        return lam ** (4 * self.scale_exponent) * lam / block_size

    def init_scales(self, block_shape: Sequence[int], prior_variance: float, like: Tensor) -> tuple[Tensor, Tensor]:
        """The initial ``(s1, s2)``, each of shape ``block_shape`` with ``like``'s dtype and device."""
        magnitude = float(prior_variance) ** self.scale_exponent
        s1 = like.new_full(tuple(block_shape), magnitude)
        if not self.random_signs:
            return s1, like.new_full(tuple(block_shape), magnitude)
        signs = torch.randint(0, 2, tuple(block_shape), device=like.device).to(like.dtype) * 2 - 1
        return s1, magnitude * signs


#: Networks (:class:`~pyro_whvi.AutoWHVIGuide`, :class:`~pyro_whvi.infer.WHVIReparam`): ``lambda = 1``,
#: ``s = lambda^{-1/4}`` with random signs on ``S2``; weight variance ``1/D`` whatever ``lambda``.
NETWORK_CONVENTION = WHVIConvention(prior_variance=1.0, scale_exponent=-0.25, random_signs=True)

#: Random-feature GPs (:class:`~pyro_whvi.gp.WHVIWeightPosterior`): ``lambda = D``, ``s = 1``;
#: weight variance ``lambda / D = 1``, the GP prior ``w ~ N(0, I)``.
GP_CONVENTION = WHVIConvention(prior_variance=None, scale_exponent=0.0, random_signs=False)
