"""The Xavier-style baseline initialization of the I-BLM paper (§5), for the same guides as I-BLM."""

from __future__ import annotations

import math

import torch
from pyro import poutine

from .guide_protocol import site_initializer
from .layers import find_layers, untransformed_model

__all__ = ["xavier_normal_"]


def xavier_normal_(guide, *args, **kwargs):
    r"""Xavier-style init of ``guide`` (the I-BLM paper's baseline, §5): zero means, variance
    :math:`2 / (D_{in} + D_{out})` for every weight and bias entry (fans as PyTorch's, times the kernel
    size for a convolution), through the guide's ``set_site_isotropic_``
    (:mod:`~pyro_whvi.init.guide_protocol`). A WHVI weight keeps ``s1``, ``s2`` and gets ``g``'s variance
    that gives its entries that variance; a VSD weight gets :math:`\Theta` drawn from that Normal (a zero
    :math:`\Theta` would switch the multiplicative noise off); a bias the guide structures keeps its
    initialization. The model is traced with ``model(*args, **kwargs)``.

    References:
        I-BLM paper (Rossi et al., ICML 2019), §5 ("Xavier Normal"); X. Glorot, Y. Bengio. *Understanding
        the difficulty of training deep feedforward neural networks*. AISTATS 2010.
    """
    initializer = site_initializer(guide, "xavier_normal_")
    with torch.no_grad():
        if guide.prototype_trace is None:
            guide(*args, **kwargs)
        with untransformed_model(guide) as model:
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        layers = find_layers(model, trace)
        structured = getattr(guide, "structured_sites", None) or {}
        for layer in layers:
            receptive = math.prod(layer.weight_shape[2:])
            variance = 2.0 / (layer.fan_in + layer.out_features * receptive)
            initializer.set_site_isotropic_(layer.weight_site, variance)
            if layer.bias_site is not None and layer.bias_site not in structured:
                initializer.set_site_isotropic_(layer.bias_site, variance)
    return guide
