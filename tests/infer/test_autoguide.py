"""AutoWHVIGuide with Pyro's own machinery: median/quantiles, site selection, conv layers, reshaped
vectors, and the errors users hit. The checks every guide passes (each ELBO, Predictive, subsampling,
state_dict and param-store round trips, dtype, every structured parameter learning) are in
tests/infer/test_guide_conformance.py."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyro_whvi import AutoWHVIGuide, WHVIMatrix, WHVINormal
from pyro_whvi.infer import ModelModule, WHVIWeight, local_reparameterization
from pyro_whvi.nn import BayesianMLP

from ..helpers import regression_data

GUIDES = {
    "diagonal": {},
    "full": {"covariance": "full"},
    "lowrank": {"covariance": "lowrank", "rank": 2},
    "flows": {"flows": 2},
}


@pytest.fixture(params=list(GUIDES), ids=list(GUIDES))
def guide_kwargs(request):
    return GUIDES[request.param]


def _train(guide, x, y, steps=30, loss=None, lr=0.01):
    svi = SVI(guide.model, guide, pyro.optim.Adam({"lr": lr}), loss or Trace_ELBO())
    return [svi.step(x, y) for _ in range(steps)]


def test_selection_default_and_parameter_count(guide_kwargs):
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model, **guide_kwargs)
    x, y = regression_data()
    guide(x, y)
    # The 16 x 5 and 16 x 16 weights are WHVI; the 1 x 16 output weight (a side of 1) is mean-field.
    assert sorted(guide.whvi_layouts) == ["layers.0.weight", "layers.1.weight"]
    assert tuple(guide.whvi_layouts["layers.0.weight"].block_shape) == (2, 8)
    assert "weight" in guide.locs.layers._modules["2"]._pyro_params
    per_site = {"diagonal": lambda k, d: 4 * k * d, "full": lambda k, d: 3 * k * d + k * d * d}
    per_site["lowrank"] = lambda k, d: 4 * k * d + k * d * 2
    per_site["flows"] = lambda k, d: 4 * k * d + 2 * (2 * k * d + 1)
    kind = next(name for name, kwargs in GUIDES.items() if kwargs == guide_kwargs)
    mean_field = 2 * (16 + 16 + 16 + 1)  # loc and scale of the biases and the 1 x 16 output weight
    expected = per_site[kind](2, 8) + per_site[kind](1, 16) + mean_field
    assert sum(p.numel() for p in guide.parameters()) == expected


def test_the_model_trace_records_s1_and_s2():
    """s1, s2 are read in the model: its trace records them as params (so SVI optimizes them; that they move
    under SVI is checked for every configuration by tests/infer/test_guide_conformance.py)."""
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model)
    x, y = regression_data()
    guide(x, y)
    guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
    model_trace = pyro.poutine.trace(pyro.poutine.replay(guide.model, guide_trace)).get_trace(x, y)
    params = {name for name, site in model_trace.nodes.items() if site["type"] == "param"}
    assert any("whvi_s1" in name for name in params) and any("whvi_s2" in name for name in params)


def test_no_dense_weight_is_formed_during_training(monkeypatch):
    calls = []
    original = WHVIWeight.dense
    monkeypatch.setattr(WHVIWeight, "dense", lambda self: calls.append(1) or original(self))
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model)
    x, y = regression_data()
    guide(x, y)  # set-up traces the model once without q(g), so it forms the weights of that trace
    calls.clear()
    _train(guide, x, y, steps=3)
    assert calls == []
    guide.local_reparameterization = False
    _train(guide, x, y, steps=1)
    assert len(calls) == 2  # switched off: one dense weight per WHVI site


def test_median_quantiles(guide_kwargs):
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model, **guide_kwargs)
    x, y = regression_data()
    _train(guide, x, y, steps=5)
    median = guide.median()
    quantiles = guide.quantiles([0.1, 0.5, 0.9], num_samples=400)
    for name in ("layers.1.weight", "layers.1.weight_whvi_g", "layers.2.weight", "layers.0.bias"):
        assert name in median and name in quantiles
        assert quantiles[name].shape == (3, *median[name].shape)
        assert (quantiles[name][0] <= quantiles[name][2]).all()
    q_w = guide.weight_distribution("layers.1.weight")
    assert isinstance(q_w, WHVIMatrix if guide_kwargs.get("flows") else WHVINormal)
    if not guide_kwargs.get("flows"):
        torch.testing.assert_close(median["layers.1.weight"], q_w.mean)
        torch.testing.assert_close(median["layers.1.weight_whvi_g"], q_w.g_dist.mean)


def test_hide_expose_and_mean_field_last_layer():
    model = BayesianMLP([5, 16, 16, 3])
    x, _ = regression_data()
    guide = AutoWHVIGuide(model, mean_field_last_layer=True)
    guide(x)
    assert sorted(guide.whvi_layouts) == ["layers.0.weight", "layers.1.weight"]
    for hide in (["layers.0.weight"], "layers.0.weight", lambda name: name == "layers.0.weight"):
        guide = AutoWHVIGuide(model, hide=hide)
        guide(x)
        assert sorted(guide.whvi_layouts) == ["layers.1.weight", "layers.2.weight"]
    guide = AutoWHVIGuide(model, expose="layers.2.weight")
    guide(x)
    assert list(guide.whvi_layouts) == ["layers.2.weight"]
    guide = AutoWHVIGuide(model, expose="all")
    guide(x)
    assert len(guide.whvi_layouts) == 6  # every weight and bias: all have at least two entries
    guide = AutoWHVIGuide(model, expose=lambda name: name.startswith("layers.1."))
    guide(x)
    assert sorted(guide.whvi_layouts) == ["layers.1.bias", "layers.1.weight"]
    assert guide.whvi_layouts["layers.1.bias"].kind == "vector"  # 16 entries on one 4 x 4 block
    assert tuple(guide.whvi_layouts["layers.1.bias"].block_shape) == (1, 4)


class ConvNet(PyroModule):
    def __init__(self):
        super().__init__()
        self.conv = PyroModule[nn.Conv2d](2, 6, kernel_size=3, padding=1, stride=2)
        self.conv.weight = PyroSample(dist.Normal(0.0, 1.0).expand([6, 2, 3, 3]).to_event(4))
        self.conv.bias = PyroSample(dist.Normal(0.0, 1.0).expand([6]).to_event(1))

    def forward(self, images, y=None):
        logits = self.conv(images).mean((-1, -2))
        with pyro.plate("data", images.shape[0]):
            return pyro.sample("obs", dist.Categorical(logits=logits), obs=y)


def test_conv_filters_through_whvi():
    model = ConvNet()
    images, labels = torch.randn(4, 2, 7, 7), torch.randint(0, 6, (4,))
    guide = AutoWHVIGuide(model, expose=["conv.weight"])
    losses = _train(guide, images, labels, steps=5)
    assert all(math.isfinite(loss) for loss in losses)
    layout = guide.whvi_layouts["conv.weight"]
    assert (layout.out_features, layout.in_features, tuple(layout.block_shape)) == (6, 18, (1, 32))
    trace = pyro.poutine.trace(pyro.poutine.replay(guide.model, pyro.poutine.trace(guide).get_trace(images)))
    weight = trace.get_trace(images).nodes["conv.weight"]["value"]
    assert isinstance(weight, WHVIWeight)
    # Local path with one shared draw per image equals the dense convolution of that draw.
    g = weight.distribution.g_dist.sample()
    weight.g = g
    weight._dense.clear()
    with torch.no_grad():
        local = weight.distribution.matvec(F.unfold(images, 3, padding=1, stride=2).mT, g).mT.reshape(4, 6, 4, 4)
        torch.testing.assert_close(local, F.conv2d(images, weight.dense(), padding=1, stride=2))
        draws = torch.stack([F.conv2d(images, weight, padding=1, stride=2) for _ in range(2)])
    assert draws.shape == (2, 4, 6, 4, 4)
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)  # one draw per image per execution
    fresh = trace.get_trace(images).nodes["conv.weight"]["value"]
    with torch.no_grad():
        assert not torch.allclose(F.conv2d(images, fresh, padding=1, stride=2), draws[0])  # the next draws anew


def test_local_reparameterization_switches():
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model, local_reparameterization=False)
    x, y = regression_data()
    guide(x, y)
    weight = pyro.poutine.trace(pyro.poutine.replay(guide.model, pyro.poutine.trace(guide).get_trace(x)))
    value = weight.get_trace(x).nodes["layers.1.weight"]["value"]
    assert not value.local
    with local_reparameterization(True):
        trace = pyro.poutine.trace(pyro.poutine.replay(guide.model, pyro.poutine.trace(guide).get_trace(x)))
        assert trace.get_trace(x).nodes["layers.1.weight"]["value"].local
    # Without a WHVI guide (prior predictive), the weight is the site's own draw.
    prior_value = pyro.poutine.trace(guide.model).get_trace(x).nodes["layers.1.weight"]["value"]
    assert not prior_value.local
    assert prior_value.dense().shape == (16, 16)


def test_materialized_weight_for_other_uses():
    model = BayesianMLP([5, 16, 16, 1])
    guide = AutoWHVIGuide(model)
    x, y = regression_data()
    guide(x, y)
    trace = pyro.poutine.trace(pyro.poutine.replay(guide.model, pyro.poutine.trace(guide).get_trace(x)))
    value = trace.get_trace(x).nodes["layers.1.weight"]["value"]
    dense = value.distribution.weight(value.g)
    torch.testing.assert_close(value.t(), dense.t())
    torch.testing.assert_close(value * 2 + 1, dense * 2 + 1)
    torch.testing.assert_close(x[:, :1].expand(-1, 16) @ value, x[:, :1].expand(-1, 16) @ dense)
    assert value.shape == (16, 16) and value.dtype == torch.float64 and "WHVIWeight" in repr(value)


def test_reparam_alone_with_any_guide():
    """WHVIReparam through poutine.reparam, guided by Pyro's AutoNormal over g: s1, s2 live in the param store."""
    from pyro.infer.autoguide import AutoNormal

    from pyro_whvi import WHVIReparam

    model = BayesianMLP([5, 16, 16, 1])
    reparam_model = pyro.poutine.reparam(model, {"layers.1.weight": WHVIReparam(prior_variance=0.5)})
    guide = AutoNormal(reparam_model)
    x, y = regression_data()
    svi = SVI(reparam_model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    svi.step(x, y)
    s1 = pyro.param("layers.1.weight_whvi_s1").detach().clone()
    losses = [svi.step(x, y) for _ in range(20)]
    assert all(math.isfinite(loss) for loss in losses)
    assert not torch.equal(pyro.param("layers.1.weight_whvi_s1").detach(), s1)
    assert guide.locs.layers._modules["1"].weight_whvi_g.shape == (1, 16)
    trace = pyro.poutine.trace(pyro.poutine.replay(reparam_model, pyro.poutine.trace(guide).get_trace(x))).get_trace(x)
    assert not trace.nodes["layers.1.weight"]["value"].local  # no WHVI guide, so no per-example q(g)


# -- errors ---------------------------------------------------------------------------------------


class Odd(PyroModule):
    def __init__(self, prior):
        super().__init__()
        self.prior = prior

    def forward(self, x=None):
        w = pyro.sample("w", self.prior)
        s = pyro.sample("s", dist.Normal(0.0, 1.0))
        k = pyro.sample("k", dist.Bernoulli(0.5))
        return w, s, k


def test_sites_whvi_cannot_take_are_named():
    with pytest.raises(ValueError, match=r"'s'.*at least two entries"):
        AutoWHVIGuide(Odd(dist.Normal(0.0, 1.0).expand([4, 4]).to_event(2)), expose=["s"])()
    with pytest.raises(ValueError, match=r"'k'.*discrete"):
        AutoWHVIGuide(Odd(dist.Normal(0.0, 1.0).expand([4, 4]).to_event(2)), expose=["k"])()
    with pytest.raises(ValueError, match=r"'w'.*not the real line"):
        AutoWHVIGuide(Odd(dist.LogNormal(0.0, 1.0).expand([4, 4]).to_event(2)), expose=["w"])()
    with pytest.raises(ValueError, match=r"'w'.*batch shape"):
        AutoWHVIGuide(Odd(dist.Normal(0.0, 1.0).expand([4, 4])), expose=["w"])()
    with pytest.raises(ValueError, match=r"expose names \['nope'\]"):
        AutoWHVIGuide(Odd(dist.Normal(0.0, 1.0).expand([4, 4]).to_event(2)), expose=["nope"])()


def test_non_gaussian_prior_warns_and_is_replaced():
    def model():
        return pyro.sample("w", dist.Laplace(0.0, 1.0).expand([4, 4]).to_event(2))

    guide = AutoWHVIGuide(ModelModule(model))
    with pytest.warns(UserWarning, match=r"'w'.*Laplace.*replaced by the WHVI prior"):
        guide()
    assert list(guide.whvi_layouts) == ["w"]


def test_changed_model_is_a_clear_error():
    network, extra = BayesianMLP([5, 16, 16, 1]), {"site": False}

    def changing(x, y=None):
        if extra["site"]:
            pyro.sample("extra", dist.Normal(0.0, 1.0))
        return network(x, y)

    model = ModelModule(changing)
    guide = AutoWHVIGuide(model)
    x, y = regression_data()
    _train(guide, x, y, steps=1)
    extra["site"] = True
    with pytest.raises(RuntimeError, match=r"'extra'.*did not have when the guide was set up"):
        _train(guide, x, y, steps=1)
    extra["site"] = False
    network.layers[0].weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, 5]).to_event(2))
    with pytest.raises(RuntimeError, match=r"'layers.0.weight' now has shape \(8, 5\)"):
        _train(guide, x, y, steps=1)


def test_summaries_before_set_up_say_what_to_do():
    guide = AutoWHVIGuide(BayesianMLP([5, 8, 1]))
    with pytest.raises(RuntimeError, match="call the guide once"):
        guide.median()
    with pytest.raises(RuntimeError, match="call the guide once"):
        guide.weight_distribution("layers.0.weight")


def test_vectorized_sampling_is_refused_with_the_fix():
    model = BayesianMLP([5, 8, 8, 1])
    guide = AutoWHVIGuide(model)
    x, y = regression_data()
    guide(x, y)
    with pytest.raises(ValueError, match=r"parallel=False"):
        Predictive(guide.model, guide=guide, num_samples=3, parallel=True)(x)
    with pytest.raises(ValueError, match=r"without vectorize_particles"):
        SVI(guide.model, guide, pyro.optim.Adam({}), Trace_ELBO(2, vectorize_particles=True)).step(x, y)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"covariance": "dense"}, "covariance must be one of"),
        ({"flows": 2, "covariance": "full"}, "diagonal Gaussian"),
        ({"rank": 3}, "rank must be a positive int"),
        ({"init_scale": 0}, "init_scale"),
        ({"prior_variance": 0.0}, "prior_variance"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoWHVIGuide(BayesianMLP([2, 4, 1]), **kwargs)
