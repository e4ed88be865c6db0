"""Inference: the WHVI reparameterizer, the lazy WHVI weight and :class:`AutoWHVIGuide`."""

from .autoguide import AutoWHVIGuide
from .lazy_weight import WHVIWeight, local_reparameterization
from .model import ReparameterizedModel
from .reparam import WHVIReparam, g_site_name

__all__ = [
    "AutoWHVIGuide",
    "ReparameterizedModel",
    "WHVIReparam",
    "WHVIWeight",
    "g_site_name",
    "local_reparameterization",
]
