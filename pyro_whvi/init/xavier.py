"""The Xavier-style baseline initialization of the I-BLM paper (§5), for the same guides as I-BLM."""

from __future__ import annotations

import math

import torch
from pyro import poutine

from ..infer import AutoVSDGuide, AutoWHVIGuide
from .assign import check_guide, set_param, set_whvi_isotropic
from .layers import find_layers, untransformed_model

__all__ = ["xavier_normal_"]


def xavier_normal_(guide, *args, **kwargs):
    r"""Xavier-style init of ``guide`` (the I-BLM paper's baseline, §5): zero means, variance
    :math:`2 / (D_{in} + D_{out})` for every weight and bias entry (fans as PyTorch's, times the kernel
    size for a convolution). A WHVI weight keeps ``s1``, ``s2`` and gets ``g``'s variance that gives its
    entries that variance; a VSD weight gets :math:`\Theta` drawn from that Normal (a zero :math:`\Theta`
    would switch the multiplicative noise off). The model is traced with ``model(*args, **kwargs)``.

    References:
        I-BLM paper (Rossi et al., ICML 2019), §5 ("Xavier Normal"); X. Glorot, Y. Bengio. *Understanding
        the difficulty of training deep feedforward neural networks*. AISTATS 2010.
    """
    check_guide(guide)
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
            like = trace.nodes[layer.weight_site]["value"]
            shape = layer.weight_shape
            if isinstance(guide, AutoWHVIGuide) and layer.weight_site in structured:
                set_whvi_isotropic(guide, layer.weight_site, variance)
            elif isinstance(guide, AutoVSDGuide) and layer.weight_site in structured:
                set_param(guide.vsd_theta, layer.weight_site, variance**0.5 * torch.randn_like(like))
            else:
                set_param(guide.locs, layer.weight_site, like.new_zeros(shape))
                set_param(guide.scales, layer.weight_site, like.new_full(shape, variance**0.5))
            if layer.bias_site is not None and layer.bias_site not in structured:
                bias = trace.nodes[layer.bias_site]["value"]
                set_param(guide.locs, layer.bias_site, bias.new_zeros(bias.shape))
                set_param(guide.scales, layer.bias_site, bias.new_full(bias.shape, variance**0.5))
    return guide
