"""One model object: the structured guides transform the user's model in place, so that the same
object goes to SVI (every ELBO, validation on or off), ``Trace_ELBO()(model, guide)``, Predictive
and iblm_; the last *layer* goes mean-field; draws are per example and per model execution."""

from __future__ import annotations

import threading
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceGraph_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, iblm_
from pyro_whvi.infer import ModelModule, local_reparameterization, remove_transform
from pyro_whvi.infer.lazy_weight import local_reparameterization_enabled
from pyro_whvi.nn import BayesianMLP

from ..helpers import GUIDES, regression_data

ELBOS = {"trace": Trace_ELBO, "meanfield": TraceMeanField_ELBO, "tracegraph": TraceGraph_ELBO}


@pytest.fixture(autouse=True)
def _fresh_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _check_objective(model, guide, x, y):
    """The ELBO's model side is the transformed model: WHVI weights are deterministic functions of g
    (observed, zero density) with the prior on g, VSD weights carry the empirical-Bayes prior."""
    guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
    model_trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    model_trace.compute_log_prob()
    for name in getattr(guide, "structured_sites", None) or {}:
        site = model_trace.nodes[name]
        if isinstance(guide, AutoWHVIGuide):
            assert site["is_observed"] and float(site["log_prob_sum"]) == 0.0
            prior = model_trace.nodes[f"{name}_whvi_g"]["fn"]
            torch.testing.assert_close(prior.base_dist.scale, torch.ones_like(prior.base_dist.scale))
        else:
            assert type(site["fn"]).__name__ == "EmpiricalBayesPrior"


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("elbo", list(ELBOS))
@pytest.mark.parametrize("kind", list(GUIDES))
def test_the_users_model_trains_on_the_right_objective(kind, elbo, validate):
    torch.manual_seed(0)
    x, y = regression_data(24, 4)
    model = BayesianMLP([4, 8, 8, 1])
    guide = GUIDES[kind](model)
    with pyro.validation_enabled(validate), warnings.catch_warnings():
        warnings.filterwarnings("error", message="Found")  # Pyro's model/guide mismatch warnings
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), ELBOS[elbo]())
        losses = [svi.step(x, y) for _ in range(3)]
        _check_objective(model, guide, x, y)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert guide.model is model or kind == "mfg"


@pytest.mark.parametrize("kind", ["whvi", "vsd"])
def test_elbos_agree_on_the_users_model(kind):
    """Same draws, same model object: Trace_ELBO and TraceGraph_ELBO give the same number."""
    x, y = regression_data(16, 4)
    model = BayesianMLP([4, 8, 1])
    guide = GUIDES[kind](model)
    guide(x, y)
    losses = []
    for elbo in (Trace_ELBO(), TraceGraph_ELBO()):
        pyro.set_rng_seed(3)
        losses.append(elbo.loss(model, guide, x, y))
    assert losses[0] == pytest.approx(losses[1], rel=1e-10)


@pytest.mark.parametrize("kind", list(GUIDES))
def test_predictive_and_iblm_take_the_same_object(kind):
    """``Predictive(model, guide=guide)`` draws varying functions for every guide, AutoNormal included
    (code written for our guides keeps working when the guide is swapped), after ``iblm_(guide, ...)``."""
    torch.manual_seed(1)
    x, y = regression_data(40, 4)
    model = BayesianMLP([4, 8, 1])
    guide = GUIDES[kind](model)
    iblm_(guide, (x, y), batch_size=40, progress=False)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    svi.step(x, y)
    f = Predictive(model, guide=guide, num_samples=6, return_sites=["f"])(x)["f"].reshape(6, -1)
    assert f.shape == (6, 40)
    assert (f.std(0) > 0).all()


def test_a_model_function_is_wrapped_once_and_named_in_the_error():
    def model_fn(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(F.linear(x, w), 0.1).to_event(1), obs=y)

    with pytest.raises(TypeError, match=r"ModelModule\(model\)"):
        AutoWHVIGuide(model_fn)
    model = ModelModule(model_fn)
    guide = AutoWHVIGuide(model)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y)
    assert list(guide.whvi_layouts) == ["w"]


def test_one_structured_guide_per_model():
    x, y = regression_data(8, 4)
    model = BayesianMLP([4, 8, 1])
    first = AutoWHVIGuide(model)
    first(x, y)
    second = AutoVSDGuide(model)
    SVI(model, second, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y)
    with pytest.raises(RuntimeError, match="one structured guide at a time"):
        first(x, y)
    remove_transform(model)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    assert not trace.nodes["layers.0.weight"]["is_observed"]  # the user's model as written
    assert type(trace.nodes["layers.0.weight"]["fn"]).__name__ != "EmpiricalBayesPrior"


def test_the_paper_preset_makes_the_last_layer_mean_field():
    x, y = torch.randn(6, 4), torch.randn(6)
    guide = AutoWHVIGuide(BayesianMLP([4, 8, 3]), sites="paper")
    guide(x, torch.randn(6, 3))
    assert sorted(guide.whvi_layouts) == ["layers.0.bias", "layers.0.weight"]
    # Regression, one output: the 1 x 8 output weight and its bias are mean-field, the hidden weight is not.
    pyro.clear_param_store()  # each guide its own parameters (same names, other shapes)
    guide = AutoWHVIGuide(BayesianMLP([4, 8, 8, 1]), mean_field_last_layer=True)
    guide(x, y)
    assert sorted(guide.whvi_layouts) == ["layers.0.weight", "layers.1.weight"]
    pyro.clear_param_store()
    guide = AutoWHVIGuide(BayesianMLP([4, 8, 8, 1]), sites="paper")
    guide(x, y)
    assert sorted(guide.whvi_layouts) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]
    assert {"layers.2.weight", "layers.2.bias"} <= set(guide.prototype_trace.nodes)
    with pytest.raises(ValueError, match="sites must be one of"):
        AutoWHVIGuide(BayesianMLP([4, 8, 1]), sites="nope")
    # preset=, the earlier name of sites=, works for one release with a warning naming the new one.
    pyro.clear_param_store()
    with pytest.warns(DeprecationWarning, match="preset= is now sites="):
        old = AutoWHVIGuide(BayesianMLP([4, 8, 8, 1]), preset="paper")
    old(x, y)
    assert sorted(old.whvi_layouts) == sorted(guide.whvi_layouts)


class TiedNet(PyroModule):
    """One linear layer applied ``steps`` times in one execution (weight tying, an unrolled RNN).

    ``probe`` records, at every use, the implied weight of each example: the layer applied to the
    identity (``(B, D, D)`` inputs: example ``b``'s ``D`` tokens see example ``b``'s weight).
    """

    def __init__(self, width: int = 8, steps: int = 5, example_dim: int = 0):
        super().__init__()
        self.width, self.steps, self.example_dim = width, steps, example_dim
        self.cell = PyroModule[nn.Linear](width, width, bias=False)
        self.cell.weight = PyroSample(dist.Normal(0.0, width**-0.5).expand([width, width]).to_event(2))
        self.probes: list[torch.Tensor] = []

    def forward(self, x, y=None):
        eye = torch.eye(self.width).expand(x.shape[self.example_dim], -1, -1)
        if self.example_dim == 1:
            eye = eye.transpose(0, 1)  # (T = D, B, D)
        h = x
        for _ in range(self.steps):
            self.probes.append(self.cell(eye).detach())
            h = torch.tanh(self.cell(h))
        if y is not None:
            with pyro.plate("data", h.shape[self.example_dim], dim=-1 - (h.dim() - 2 - self.example_dim)):
                pyro.sample("obs", dist.Normal(h, 1.0).to_event(1), obs=y)
        return h


@pytest.mark.parametrize("kind", ["whvi", "vsd"])
def test_tied_weights_and_unrolled_loops_see_one_weight_per_example(kind):
    torch.manual_seed(2)
    model = TiedNet()
    guide = GUIDES[kind](model)
    x = torch.randn(4, 8)
    guide(x)
    model.probes.clear()
    pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x))(x)
    first, *rest = model.probes  # (B, D, D_out): example b's implied weight, transposed
    for probe in rest:
        torch.testing.assert_close(probe, first, rtol=0, atol=0)  # every use, the same weight
    assert not torch.allclose(first[0], first[1])  # examples differ
    model.probes.clear()
    pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x))(x)
    assert not torch.allclose(model.probes[0], first)  # the next execution draws anew


@pytest.mark.parametrize("kind", ["whvi", "vsd"])
def test_sequences_get_one_draw_per_example(kind):
    """A ``(B, T, D)`` input gets B draws (one per sequence), and ``example_dim=1`` serves ``(T, B, D)``."""
    torch.manual_seed(3)
    for example_dim, shape in ((0, (3, 5, 8)), (1, (5, 3, 8))):
        model = TiedNet(steps=1, example_dim=example_dim)
        options = {"example_dim": example_dim}
        guide = AutoWHVIGuide(model, **options) if kind == "whvi" else AutoVSDGuide(model, **options)
        x = torch.randn(shape)
        guide(x)
        trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x)))
        weight = trace.get_trace(x).nodes["cell.weight"]["value"]
        assert weight._example_noise.shape[0] == 3
        out = F.linear(x, weight)  # the same execution's draws: token t of sequence b uses weight b
        implied = model.probes[-1] if example_dim == 0 else model.probes[-1].transpose(0, 1)  # (B, D_in, D_out)
        expected = torch.einsum("btj,bjo->bto", x if example_dim == 0 else x.transpose(0, 1), implied)
        torch.testing.assert_close(out if example_dim == 0 else out.transpose(0, 1), expected)


def test_per_example_weights_have_the_posterior_moments():
    """Implied per-example weights of a (B, T, D) batch have q(W)'s mean and variance (B = 4000 draws)."""
    torch.manual_seed(4)
    model = TiedNet(steps=1)
    guide = AutoWHVIGuide(model)
    x = torch.randn(4000, 8)
    guide(x[:2])
    model.probes.clear()
    with torch.no_grad():
        pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x))(x)
    weights = model.probes[0].transpose(-1, -2)  # (B, D_out, D_in)
    q = guide.weight_distribution("cell.weight")
    num = weights.shape[0]
    # Standard errors of a sample mean and of a sample variance (Gaussian: sqrt(2) var / sqrt(n)).
    assert ((weights.mean(0) - q.mean).abs() < 5 * q.stddev / num**0.5).all()
    assert ((weights.var(0) - q.variance).abs() < 5 * 2**0.5 * q.variance / num**0.5).all()


def test_strict_mode_and_the_shared_draw_warning():
    x = torch.randn(4, 8)
    for strict in (False, True):
        model = TiedNet(steps=1)
        guide = AutoWHVIGuide(model, strict=strict)
        guide(x)
        weight = pyro.poutine.trace(pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x)))
        weight = weight.get_trace(x).nodes["cell.weight"]["value"]
        if strict:
            with pytest.raises(RuntimeError, match=r"cell.weight': T cannot.*strict=False"):
                x @ weight.T
        else:
            with pytest.warns(UserWarning, match="single draw, shared by every example"):
                x @ weight.T
        torch.testing.assert_close(weight.dense(), weight.distribution.weight(weight.g))  # explicit: no error


def test_requires_grad_is_truthful_and_the_switch_is_per_thread():
    x = torch.randn(4, 8)
    model = TiedNet(steps=1)
    guide = AutoWHVIGuide(model)
    guide(x)
    trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x)))
    assert trace.get_trace(x).nodes["cell.weight"]["value"].requires_grad
    with torch.no_grad():
        trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=pyro.poutine.trace(guide).get_trace(x)))
        assert not trace.get_trace(x).nodes["cell.weight"]["value"].requires_grad
    seen = []
    with local_reparameterization(False):
        thread = threading.Thread(target=lambda: seen.append(local_reparameterization_enabled(True)))
        thread.start()
        thread.join()
        assert not local_reparameterization_enabled(True)
    assert seen == [True]  # the block holds for its own thread only


@pytest.fixture
def module_local_params():
    pyro.settings.set(module_local_params=True)
    yield
    pyro.settings.set(module_local_params=False)


@pytest.mark.parametrize("kind", list(GUIDES))
def test_module_local_params_with_elbo_module_and_torch_optim(kind, module_local_params):
    """Pyro's recommended path (the one for Lightning and DDP): ``Trace_ELBO()(model, guide)`` is an
    ``nn.Module`` whose ``parameters()`` are the model's and the guide's; SVI works in that mode too."""
    torch.manual_seed(5)
    x, y = regression_data(64, 4)
    model = BayesianMLP([4, 16, 1])
    guide = GUIDES[kind](model)
    guide(x, y)
    elbo = Trace_ELBO(num_particles=4)(model, guide)
    names = {name for name, _ in elbo.named_parameters()}
    assert "model.noise_scale_unconstrained" in names
    optimizer = torch.optim.Adam(elbo.parameters(), lr=0.02)
    before = float(elbo(x, y).detach())
    # Every guide parameter, those of the structured sites included, is one the optimizer gets, and moves.
    initial = {name: p.detach().clone() for name, p in guide.named_parameters()}
    assert {id(p) for p in guide.parameters()} <= {id(p) for p in elbo.parameters()}
    for _ in range(150):
        optimizer.zero_grad()
        loss = elbo(x, y)
        loss.backward()
        optimizer.step()
    assert float(sum(elbo(x, y).detach() for _ in range(4)) / 4) < before
    unmoved = [name for name, p in guide.named_parameters() if torch.equal(p.detach(), initial[name])]
    assert not unmoved, unmoved
    SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y)


@pytest.mark.parametrize("kind", ["whvi", "vsd"])
def test_another_guide_on_a_transformed_model_is_refused(kind):
    """AutoNormal built on a model a structured guide transformed would fit the transformed model;
    its first step says so, and after ``remove_transform`` it fits the model as written."""
    x, y = regression_data(8, 4)
    model = BayesianMLP([4, 8, 1])
    GUIDES[kind](model)(x, y)
    mean_field = AutoNormal(model)
    svi = SVI(model, mean_field, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    with pytest.raises(RuntimeError, match=r"remove_transform\(model\)"):
        svi.step(x, y)
    remove_transform(model)
    pyro.clear_param_store()
    mean_field = AutoNormal(model)
    SVI(model, mean_field, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y)
    assert "layers.0.weight" in mean_field.prototype_trace.nodes
