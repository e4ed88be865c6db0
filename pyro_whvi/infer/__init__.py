"""Inference: the structured guides (WHVI, VSD), the WHVI reparameterizer, lazy weights, KL annealing, the JIT-compiled
ELBOs and the one-optimizer ``PyroOptim`` of the fast path."""

from .annealing import KLAnnealing
from .jit_elbo import JitTrace_ELBO, JitTraceMeanField_ELBO
from .joint_optim import JointOptim
from .lazy_weight import LazyWeight, example_seeds, local_reparameterization
from .model_transform import ModelModule, ModelTransform, remove_transform
from .vsd_guide import AutoVSDGuide, HouseholderVectors
from .vsd_reparam import EmpiricalBayesPrior, VSDPosterior, z_site_name
from .vsd_weight import VSDWeight
from .whvi_guide import AutoWHVIGuide
from .whvi_reparam import WHVIReparam, g_site_name
from .whvi_weight import WHVIWeight

__all__ = [
    "AutoVSDGuide",
    "AutoWHVIGuide",
    "EmpiricalBayesPrior",
    "HouseholderVectors",
    "JitTraceMeanField_ELBO",
    "JitTrace_ELBO",
    "JointOptim",
    "KLAnnealing",
    "LazyWeight",
    "ModelModule",
    "ModelTransform",
    "VSDPosterior",
    "VSDWeight",
    "WHVIReparam",
    "WHVIWeight",
    "example_seeds",
    "g_site_name",
    "local_reparameterization",
    "remove_transform",
    "z_site_name",
]
