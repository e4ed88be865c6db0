"""Device-clean code: everything a training step creates lives on its inputs' device.

Checked on the ``meta`` device, which has no data and refuses to mix with CPU tensors: a tensor made
without ``device=`` (``torch.randn(n)``, ``torch.tensor(0.5)``) inside a forward or backward pass
raises here exactly where it would put work on the CPU, or fail, on a GPU.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from pyro_whvi import ops
from pyro_whvi.models import BayesianCNN, BayesianMLP
from pyro_whvi.nn import bayesian_, kl_divergence

META = torch.device("meta")


@pytest.mark.parametrize("method", ["whvi", "vsd"])
def test_variational_layers_train_on_the_inputs_device(method):
    network = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))
    bayesian_(network, method, preset="paper" if method == "whvi" else None, mean_field_last_layer=True).to(META)
    loss = network(torch.randn(8, 3, 6, 6, device=META)).square().sum() + kl_divergence(network)
    loss.backward()
    assert loss.device == META
    assert all(p.grad is not None and p.grad.device == META for p in network.parameters())


def test_ops_run_on_the_inputs_device():
    x = torch.randn(4, 3, 16, device=META)
    s1, g, s2 = (torch.randn(3, 16, device=META) for _ in range(3))
    assert ops.fwht(x).device == META
    assert ops.whvi_matvec(x, s1, g, s2).device == META
    assert ops.whvi_design(torch.randn(2, 16, 16, device=META), s1[0], s2[0]).device == META


@pytest.mark.parametrize(
    ("model", "x"),
    [(BayesianMLP([5, 8, 1]), torch.randn(4, 5)), (BayesianCNN(channels=(2, 4), hidden=8), torch.randn(4, 1, 8, 8))],
    ids=["mlp", "cnn"],
)
def test_the_ready_made_models_priors_follow_the_module(model, x):
    """``model.to(device)`` moves the priors too (their scales are buffers), so a model trace on a GPU stays there."""
    model.to(META)
    with pyro.validation_enabled(False):
        trace = pyro.poutine.trace(model).get_trace(x.to(META))
    sites = [site for site in trace.nodes.values() if site["type"] == "sample" and not site["is_observed"]]
    assert sites and all(site["value"].device == META for site in sites)
    assert not any("prior_scale" in key for key in model.state_dict())  # checkpoints keep their keys
