r"""Setting a guide's ``q`` for one layer from a Gaussian over the layer's weights (I-BLM §4.2).

The layer's Gaussian has independent output rows (the BLM posterior of each output unit), given as
means, the diagonal of each row's posterior precision (entries of the weight and of the bias), and
the likelihood part :math:`X^\top \operatorname{diag}(\sigma^{-2}) X` of each row's precision (the prior
part is the model's). :func:`assign_layer` hands each site's part to the guide's ``set_site_gaussian_``
(:mod:`~pyro_whvi.init.guide_protocol`), and each guide takes its best approximation; the structured
guides' fits live with their families in :mod:`pyro_whvi.distributions`
(:func:`~pyro_whvi.distributions.whvi_projection.fit_whvi_site`,
:func:`~pyro_whvi.distributions.householder.fit_vsd_alpha`):

* **mean-field** (``AutoNormal``, and the other sites of our guides): mean = posterior mean, variance
  :math:`1 / P_{ii}`, the minimizer of ``KL(q || p)`` (I-BLM App. D);
* **WHVI** (:class:`~pyro_whvi.AutoWHVIGuide`): ``s1`` and ``s2`` from the Frobenius projection of
  the mean onto the WHVI form (WHVI App. B, eq. 14). Given them, ``W = A g`` is linear in ``g``, so the
  layer's regression *in the WHVI model* (its likelihood seen through ``vect(W) = A g``, the prior
  :math:`\mathcal{N}(0, \lambda I)` on ``g``) has an exact Gaussian posterior, with precision
  :math:`A^\top X^\top L^{-1} X A + \lambda^{-1} I`; ``q(g)`` is that posterior: its mean (not eq. 14's
  ``g``, which weighs every weight entry alike where the data do not), and its inverse diagonal for a
  diagonal ``q(g)`` (also the base of planar flows, which keep their initialization), the whole
  covariance for ``"full"``, or its leading eigen-directions (a probabilistic-PCA split) plus the rest
  on the diagonal for ``"lowrank"``;
* **VSD** (:class:`~pyro_whvi.AutoVSDGuide`): :math:`\Theta` = the mean; the noise variances
  :math:`s = \operatorname{diag}(U \operatorname{diag}(\alpha) U^\top)` minimize
  ``KL(q || p_mean-field)`` given :math:`\Theta`, where :math:`W_e \sim \mathcal{N}(\Theta_e, \Theta_e^2 s_{k(e)})`:
  :math:`s_k = Q / \sum_{e \in k} P_{ee} \Theta_e^2` (the "relative variances" of the BLM); then
  :math:`\alpha \ge 0` solves :math:`(U \odot U)\alpha = s` (non-negative least squares; exact when
  ``U = I``). Householder vectors are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .._moved import moved_names
from .guide_protocol import SiteInitializer

__all__ = ["LayerGaussian", "assign_layer"]

__getattr__ = moved_names(
    __name__,
    {
        "fit_whvi_site": "pyro_whvi.distributions.whvi_projection",
        "project_onto_whvi": "pyro_whvi.distributions.whvi_projection",
        "fit_vsd_alpha": "pyro_whvi.distributions.householder",
    },
)


@dataclass
class LayerGaussian:
    """A Gaussian over one layer's weight (rows independent) and bias; ``R`` output rows, ``F`` fan-in."""

    weight_mean: Tensor  #: the weight's shape, ``(R, ...)``
    weight_precision: Tensor  #: the weight's shape: diagonal of the posterior precision
    #: ``(R, F, F)``: the likelihood part of each row's precision over its weights, or its diagonal in the
    #: weight's shape (what a guide takes of it where ``F`` exceeds
    #: :data:`~pyro_whvi.distributions.whvi_projection.FULL_ROW_PRECISION_MAX_BLOCK`)
    row_data_precision: Tensor
    row_data_rhs: Tensor  #: ``(R, F)``: the likelihood's linear term for each row's weights, bias at its mean
    bias_mean: Tensor | None = None  #: ``(R,)``
    bias_precision: Tensor | None = None  #: ``(R,)``
    bias_data_precision: Tensor | None = None  #: ``(R,)``: the likelihood part of ``bias_precision``


def assign_layer(guide: SiteInitializer, weight_site: str, bias_site: str | None, layer: LayerGaussian) -> None:
    """Set ``guide``'s ``q`` for a layer's weight (and bias) from ``layer``; see the module docstring.

    :param guide: a guide with ``set_site_gaussian_`` (:func:`~pyro_whvi.init.guide_protocol.site_initializer`).
    """
    guide.set_site_gaussian_(
        weight_site,
        layer.weight_mean,
        layer.weight_precision,
        data_precision=layer.row_data_precision,
        data_rhs=layer.row_data_rhs,
    )
    if bias_site is None or layer.bias_mean is None or layer.bias_precision is None:
        return
    data_precision = layer.bias_data_precision
    data_rhs = None if data_precision is None else data_precision * layer.bias_mean
    guide.set_site_gaussian_(
        bias_site, layer.bias_mean, layer.bias_precision, data_precision=data_precision, data_rhs=data_rhs
    )
