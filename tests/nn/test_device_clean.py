"""Device-clean code: everything a training step creates lives on its inputs' device.

Checked on the ``meta`` device, which has no data and refuses to mix with CPU tensors: a tensor made
without ``device=`` (``torch.randn(n)``, ``torch.tensor(0.5)``) inside a forward or backward pass
raises here exactly where it would put work on the CPU, or fail, on a GPU.
"""

from __future__ import annotations

import os
import sys

import pyro
import pytest
import torch
from torch import nn

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, ops
from pyro_whvi.nn import BayesianCNN, BayesianMLP, bayesian_, kl_divergence

META = torch.device("meta")


@pytest.mark.parametrize("method", ["whvi", "vsd"])
def test_variational_layers_train_on_the_inputs_device(method):
    network = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))
    bayesian_(network, method, sites="paper" if method == "whvi" else None, mean_field_last_layer=True).to(META)
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


GUIDES = {
    "whvi": lambda model: AutoWHVIGuide(model),
    "whvi-full": lambda model: AutoWHVIGuide(model, covariance="full"),
    "whvi-lowrank": lambda model: AutoWHVIGuide(model, covariance="lowrank"),
    "nf-whvi": lambda model: AutoWHVIGuide(model, flows=2),
    "whvi-paper": lambda model: AutoWHVIGuide(model, sites="paper"),
    "vsd": lambda model: AutoVSDGuide(model, reflections=2),
    "vsd-hierarchical": lambda model: AutoVSDGuide(model, hierarchical=True),
}


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_structured_guides_evaluate_the_elbo_on_the_models_device(name):
    """Set-up, one ELBO estimate (the model replayed on the guide's trace) and its backward, all on ``meta``.

    Pyro's ``Trace_ELBO`` itself reads loss values with ``.item()``, which ``meta`` cannot; the estimate
    here is the same sum of log-densities.
    """
    with pyro.validation_enabled(False):
        model = BayesianMLP([5, 16, 16, 1]).to(META)
        guide = GUIDES[name](model)
        x, y = torch.randn(8, 5, device=META), torch.randn(8, device=META)
        guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
        model_trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=guide_trace)).get_trace(x, y)
        loss = guide_trace.log_prob_sum() - model_trace.log_prob_sum()
    loss.backward()
    assert loss.device == META
    parameters = list(guide.named_parameters())
    assert parameters and all(p.device == META and p.grad is not None for _, p in parameters), [
        n for n, p in parameters if p.device != META or p.grad is None
    ]


@pytest.mark.parametrize("posterior", ["whvi", "gaussian"])
@pytest.mark.parametrize("projection", ["dense", "fastfood", "sorf"])
def test_random_feature_gps_stay_on_the_inputs_device(projection, posterior):
    """Features, posterior and KL on ``meta`` (GPyTorch's own likelihood reads values, so it is left out)."""
    from pyro_whvi.gp import RandomFeatureGP, RandomFeatureKernel

    kernel = RandomFeatureKernel(num_samples=128, projection=projection, ard_num_dims=3)
    model = RandomFeatureGP(kernel, posterior=posterior, covariance="diagonal").to(META)
    output = model(torch.randn(16, 3, device=META))
    loss = output.mean.sum() + output.lazy_covariance_matrix.diagonal().sum()
    loss = loss + model.variational_strategy.kl_divergence()
    loss.backward()
    assert loss.device == META
    assert all(p.device == META and (p.grad is None or p.grad.device == META) for p in model.parameters())


_FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.randn, torch.rand, torch.randint, torch.arange}
_FACTORIES |= {torch.eye, torch.tensor, torch.linspace, torch.as_tensor, torch.randperm, torch.normal}


class _DeviceAudit(torch.overrides.TorchFunctionMode):
    """Records tensor factories called from library code without ``device=`` (they make CPU tensors)."""

    def __init__(self):
        super().__init__()
        self.calls: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and "device" not in kwargs:
            caller = sys._getframe(1)
            name = caller.f_code.co_filename
            if f"{os.sep}pyro_whvi{os.sep}" in name and f"{os.sep}tests{os.sep}" not in name:
                self.calls.add(f"{name.split('pyro_whvi' + os.sep, 1)[-1]}:{caller.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


def test_iblm_svgp_and_methods_make_no_tensor_without_a_device():
    """The paths that read values (so cannot run on ``meta``) audited on the CPU instead: every tensor
    they create takes its device from the data (a factory without ``device=`` would land on the CPU)."""
    from pyro.infer.autoguide import AutoNormal

    from pyro_whvi import iblm_
    from pyro_whvi.experiments import methods
    from pyro_whvi.experiments.baselines import GPyTorchSVGP
    from pyro_whvi.train.engine import Schedule

    x, y = torch.randn(64, 5), torch.randn(64)
    audit = _DeviceAudit()
    for make_guide in (AutoWHVIGuide, AutoVSDGuide, AutoNormal):
        pyro.clear_param_store()
        model = BayesianMLP([5, 16, 1])  # built on the CPU, as modules are; .to() would move it
        guide = make_guide(model)
        with audit:
            guide(x, y)
            iblm_(guide, (x, y))
    pyro.clear_param_store()
    model, guide = methods.build_method("whvi", [5, 16, 1])
    with audit:
        methods.fit("whvi", model, guide, x, y, methods.Schedule(steps=3, fixed_noise_steps=1), progress=False)
        schedule = Schedule(steps=3, fixed_noise_steps=1, batch_size=256, lr=6e-4, lr_power=0.0)
        GPyTorchSVGP(x[:8].clone()).fit(x, y, schedule, progress=False)
    assert not audit.calls, sorted(audit.calls)
