"""BayesianMLP's mean-variance head (``likelihood="heteroscedastic"``, Lakshminarayanan et al. 2017, §2.2.1): its
output split into a mean and ``softplus(raw) + 1e-6`` variance, the likelihood it observes, and that it learns a
noise that varies with the input."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, init_to_sample

from pyro_whvi.nn import BayesianMLP
from pyro_whvi.nn.networks import mean_and_scale


def test_mean_and_scale_is_the_mean_and_the_root_of_softplus_plus_the_floor():
    h = torch.tensor([[0.5, -2.0], [-1.0, 3.0]], dtype=torch.float64)
    mean, scale = mean_and_scale(h)
    assert mean.tolist() == [0.5, -1.0]
    expected = [math.sqrt(math.log1p(math.exp(raw)) + 1e-6) for raw in (-2.0, 3.0)]
    assert scale.tolist() == pytest.approx(expected, rel=1e-12)
    # Two targets: (N, 4) -> two (N, 2), the means first.
    mean, scale = mean_and_scale(torch.arange(8.0).reshape(2, 4))
    assert mean.tolist() == [[0.0, 1.0], [4.0, 5.0]] and scale.shape == (2, 2)
    assert torch.allclose(scale[0, 0] ** 2, torch.nn.functional.softplus(torch.tensor(2.0)) + 1e-6)
    # A very negative raw variance still leaves the floor: the likelihood stays finite.
    assert mean_and_scale(torch.tensor([[0.0, -200.0]]))[1].item() == pytest.approx(1e-3, rel=1e-6)


def test_the_head_observes_a_gaussian_with_its_own_scale_per_example():
    model = BayesianMLP([3, 5, 1], likelihood="heteroscedastic")
    assert model.noise_scale is None and model.layers[-1].out_features == 2
    x, y = torch.randn(6, 3), torch.randn(6)
    trace = poutine.trace(model).get_trace(x, y, num_data=12)
    obs, f, noise = trace.nodes["obs"], trace.nodes["f"]["value"], trace.nodes["noise"]["value"]
    assert f.shape == (6,) and noise.shape == (6,) and obs["scale"] == pytest.approx(2.0)
    assert torch.equal(obs["fn"].loc, f) and torch.equal(obs["fn"].scale, noise)
    raw = poutine.condition(model.predict, data={k: v["value"] for k, v in trace.nodes.items() if "layers" in k})(x)
    assert raw.shape == (6, 2) and torch.equal(mean_and_scale(raw)[1], noise)
    direct = torch.distributions.Normal(raw[:, 0], (torch.nn.functional.softplus(raw[:, 1]) + 1e-6).sqrt())
    assert torch.allclose(obs["fn"].log_prob(y).sum(), direct.log_prob(y).sum())
    with pytest.raises(ValueError, match="likelihood must be one of"):
        BayesianMLP([3, 1], likelihood="poisson")


def test_the_head_learns_a_noise_that_grows_with_the_input():
    # y = x + (0.05 + 0.4 |x|) eps: the true noise sd is 0.65 at |x| = 1.5 and 0.15 at |x| = 0.25 (4.3 times); a
    # learned homoscedastic scale, or a head whose variance did not train, would give one ratio near 1.
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(400, 1, generator=generator) * 4 - 2
    y = x[:, 0] + (0.05 + 0.4 * x[:, 0].abs()) * torch.randn(400, generator=generator)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    model = BayesianMLP([1, 32, 1], likelihood="heteroscedastic")
    guide = AutoDelta(model, init_loc_fn=init_to_sample)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(600):
        svi.step(x, y)
    probe = torch.tensor([[-1.5], [-0.25], [0.25], [1.5]])
    noise = poutine.trace(poutine.replay(model, trace=poutine.trace(guide).get_trace(probe))).get_trace(probe)
    scale = noise.nodes["noise"]["value"].detach()
    ratio = (scale[0] + scale[3]) / (scale[1] + scale[2])
    assert 2.5 < ratio < 7, scale
    assert ((scale[[0, 3]] - 0.65).abs() < 0.2).all(), scale
