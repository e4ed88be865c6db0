"""I-BLM initialization of variational guides (I-BLM paper, Rossi et al., ICML 2019), and its pieces.

:func:`iblm_` is the entry point; :mod:`~pyro_whvi.init.blm` holds the batched Bayesian linear
regression it solves, :mod:`~pyro_whvi.init.guide_protocol` what a guide provides to be initialized,
and :mod:`~pyro_whvi.init.assign` how a layer's Gaussian reaches the guide. Each family's fit to that
Gaussian lives with the family, in :mod:`pyro_whvi.distributions` (the projection onto the WHVI form:
:mod:`~pyro_whvi.distributions.whvi_projection`).
"""

from .._moved import moved_names
from .blm import (
    BLMPosterior,
    blm_log_marginal,
    blm_posterior,
    dirichlet_label_transform,
    evidence_hyperparameters,
)
from .guide_protocol import SiteInitializer, site_initializer
from .iblm import iblm_
from .xavier import xavier_normal_

__all__ = [
    "BLMPosterior",
    "SiteInitializer",
    "blm_log_marginal",
    "blm_posterior",
    "dirichlet_label_transform",
    "evidence_hyperparameters",
    "iblm_",
    "site_initializer",
    "xavier_normal_",
]

__getattr__ = moved_names(
    __name__,
    {
        "cholesky_with_jitter": "pyro_whvi.distributions.qg_family",
        "fit_whvi_mean": "pyro_whvi.distributions.whvi_projection",
        "whvi_precision": "pyro_whvi.distributions.whvi_projection",
    },
)
