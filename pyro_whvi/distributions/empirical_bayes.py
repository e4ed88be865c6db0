r"""The KL terms of Variational Structured Dropout, in closed form.

With the prior :math:`p(W_{:j}) = \mathcal{N}(0, \operatorname{diag}(\beta_{:j})^{-1})` and its
precision chosen by empirical Bayes, :math:`\beta^*_{ij} = 1 / (\Theta_{ij}^2 (1 + s_i))`, the KL of
``q*(W)`` (the product of ``q(W)``'s column marginals) no longer depends on :math:`\Theta`
(VSD paper eq. 6, App. B):

.. math:: \mathrm{KL}^{EB} = \frac{Q}{2} \sum_{i=1}^K \log \frac{1 + s_i}{\alpha_i}, \qquad
          s_i = \sum_j \alpha_j U_{ij}^2 = (U \operatorname{diag}(\alpha) U^\top)_{ii}.

With the hierarchical prior :math:`p(W_{:j} \mid z) = \mathcal{N}(0, \operatorname{diag}(z \odot \beta_{:j}^{-1}))`
and the same :math:`\beta^*`, the conditional KL is (App. C, eq. 15)

.. math:: \frac{Q}{2} \sum_i \Big[ z_i - \log z_i - 1 + \log \frac{1 + s_i}{\alpha_i} \Big].

The paper prints eq. (15) with a minus sign before the last logarithm; substituting :math:`\beta^*`
into the KL above it gives a plus (and only the plus keeps the KL non-negative), which is what is
implemented and tested against a dense Gaussian KL.

References:
    VSD paper (Nguyen et al., NeurIPS 2021), §3.2–3.3, App. B (eq. 12–13), App. C (eq. 14–15).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Gamma, InverseGamma, LogNormal, register_kl

__all__ = ["kl_lognormal_gamma", "kl_lognormal_inverse_gamma", "vsd_hierarchical_kl", "vsd_kl"]


def vsd_kl(alpha: Tensor, noise_variance: Tensor, num_columns: int) -> Tensor:
    r"""Eq. (6): :math:`\frac{Q}{2} \sum_i \log((1 + s_i) / \alpha_i)` for ``alpha`` and ``s`` of shape ``(K,)``."""
    return 0.5 * num_columns * (torch.log1p(noise_variance) - alpha.log()).sum(-1)


def vsd_hierarchical_kl(
    alpha: Tensor, noise_variance: Tensor, num_columns: int, z_loc: Tensor, z_scale: Tensor
) -> Tensor:
    r""":math:`\mathbb{E}_{q(z)}` of eq. (15) for :math:`q(z) = \text{LogNormal}(\mu, \sigma)`, per row.

    Uses :math:`\mathbb{E} z = e^{\mu + \sigma^2/2}` and :math:`\mathbb{E} \log z = \mu`; add
    :math:`\mathrm{KL}(q(z) \Vert p(z))` (the model's ``z`` site) for the whole term of eq. (14).
    """
    expected_z = torch.exp(z_loc + 0.5 * z_scale.square())
    return vsd_kl(alpha, noise_variance, num_columns) + 0.5 * num_columns * (expected_z - z_loc - 1).sum(-1)


def kl_lognormal_inverse_gamma(q: LogNormal, p: InverseGamma) -> Tensor:
    r""":math:`\mathrm{KL}(\text{LogNormal}(\mu, \sigma) \Vert \text{InvGamma}(a, b))`, closed form (App. C).

    :math:`a \mu - a \log b + \log\Gamma(a) + b e^{-\mu + \sigma^2/2} - \tfrac12 \log(2\pi e \sigma^2)`;
    the expression printed in App. C is its negative.
    """
    loc, scale = q.loc, q.scale
    a, b = p.concentration, p.rate
    cross = a * b.log() - torch.lgamma(a) - (a + 1) * loc - b * torch.exp(-loc + 0.5 * scale.square())
    return -q.entropy() - cross


def kl_lognormal_gamma(q: LogNormal, p: Gamma) -> Tensor:
    r""":math:`\mathrm{KL}(\text{LogNormal}(\mu, \sigma) \Vert \text{Gamma}(a, b))` (rate ``b``), closed form."""
    loc, scale = q.loc, q.scale
    a, b = p.concentration, p.rate
    cross = a * b.log() - torch.lgamma(a) + (a - 1) * loc - b * torch.exp(loc + 0.5 * scale.square())
    return -q.entropy() - cross


register_kl(LogNormal, InverseGamma)(kl_lognormal_inverse_gamma)
register_kl(LogNormal, Gamma)(kl_lognormal_gamma)
