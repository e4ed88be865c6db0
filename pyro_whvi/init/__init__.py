"""I-BLM initialization of variational guides (I-BLM paper, Rossi et al., ICML 2019), and its pieces.

:func:`iblm_` is the entry point; :mod:`~pyro_whvi.init.blm` holds the batched Bayesian linear
regression it solves, :mod:`~pyro_whvi.init.whvi_projection` the projection onto the WHVI form, and
:mod:`~pyro_whvi.init.guide_protocol` what a guide provides to be initialized.
"""

from .blm import (
    BLMPosterior,
    blm_log_marginal,
    blm_posterior,
    cholesky_with_jitter,
    dirichlet_label_transform,
    evidence_hyperparameters,
)
from .guide_protocol import SiteInitializer, site_initializer
from .iblm import iblm_
from .whvi_projection import fit_whvi_mean, whvi_precision
from .xavier import xavier_normal_

__all__ = [
    "BLMPosterior",
    "SiteInitializer",
    "blm_log_marginal",
    "blm_posterior",
    "cholesky_with_jitter",
    "dirichlet_label_transform",
    "evidence_hyperparameters",
    "fit_whvi_mean",
    "iblm_",
    "site_initializer",
    "whvi_precision",
    "xavier_normal_",
]
