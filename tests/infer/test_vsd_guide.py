"""AutoVSDGuide with Pyro's own machinery: where its parameters live, the KL term the ELBO sees, summaries,
conv layers, KL annealing, and the errors users hit. The checks every guide passes (each ELBO, Predictive,
subsampling, state_dict and param-store round trips, dtype, every structured parameter learning) run for
each of VSD_OPTIONS in tests/infer/test_guide_conformance.py."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, KLAnnealing
from pyro_whvi.distributions import StructuredDropoutNoise
from pyro_whvi.infer import ModelModule, VSDWeight, local_reparameterization
from pyro_whvi.nn import BayesianCNN, BayesianMLP

from ..helpers import VSD_OPTIONS, regression_data


@pytest.fixture(params=list(VSD_OPTIONS), ids=list(VSD_OPTIONS))
def guide_kwargs(request):
    return VSD_OPTIONS[request.param]


def _train(model, guide, x, y, steps=30, loss=None):
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), loss or Trace_ELBO())
    return [svi.step(x, y) for _ in range(steps)]


def test_parameters_live_where_the_docs_say(guide_kwargs):
    """(Training with each ELBO, and every one of these parameters moving under SVI, are checked for each
    of these options by tests/infer/test_guide_conformance.py.)"""
    x, y = regression_data()
    guide = AutoVSDGuide(BayesianMLP([5, 16, 16, 1]), **guide_kwargs)
    guide(x, y)
    assert sorted(guide.vsd_sites) == ["layers.0.weight", "layers.1.weight", "layers.2.weight"]
    names = {name.removeprefix("AutoVSDGuide.") for name in pyro.get_param_store().keys()}
    assert {"vsd_theta.layers.0.weight", "vsd_alpha.layers.0.weight", "locs.layers.0.bias"} <= names
    assert ("vsd_householder.layers.1.weight.first" in names) == (guide_kwargs["reflections"] >= 1)
    # alpha is optimized in log space (Pyro's positive constraint is an exp transform), unclipped.
    alpha = pyro.get_param_store()["AutoVSDGuide.vsd_alpha.layers.1.weight"]
    assert torch.allclose(alpha.unconstrained(), alpha.log())
    assert ("vsd_householder.layers.1.weight.steps.0.weight" in names) == (guide_kwargs["reflections"] == 2)
    assert ("vsd_z_loc.layers.1.weight" in names) == ("vsd_z_scale.layers.1.weight" in names) == guide.hierarchical


def test_elbo_terms_are_the_empirical_bayes_kl(guide_kwargs):
    x, y = regression_data()
    guide = AutoVSDGuide(BayesianMLP([5, 8, 1]), **guide_kwargs)
    guide(x, y)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(guide.model, trace=guide_trace)).get_trace(x, y)
    guide_trace.compute_log_prob()
    model_trace.compute_log_prob()
    for name in guide.vsd_sites:
        assert isinstance(guide_trace.nodes[name]["value"], VSDWeight)
        assert torch.allclose(guide_trace.nodes[name]["log_prob_sum"], guide.kl(name))
        assert float(model_trace.nodes[name]["log_prob_sum"]) == 0.0
        q, p = guide_trace.nodes[name]["fn"], model_trace.nodes[name]["fn"]
        assert torch.allclose(torch.distributions.kl_divergence(q, p), guide.kl(name))
        if guide.hierarchical:
            z_name = f"{name}_vsd_z"
            assert z_name in model_trace.nodes and z_name in guide_trace.nodes


def test_the_original_model_is_refused():
    """``guide.model.forward`` skips the transformation, so the ELBO would see the original priors."""
    x, y = regression_data()
    guide = AutoVSDGuide(BayesianMLP([5, 8, 1]), reflections=2)
    guide(x, y)
    with pytest.raises(ValueError, match=r"guide\.model"):
        TraceMeanField_ELBO().loss(guide.model.forward, guide, x, y)


def test_conv1d_conv3d_and_string_padding_draw_noise_per_example():
    torch.manual_seed(0)
    for conv, shape in ((torch.nn.functional.conv1d, (3, 2, 3)), (torch.nn.functional.conv3d, (3, 2, 3, 3, 3))):
        theta = torch.randn(shape)
        weight = VSDWeight(theta, StructuredDropoutNoise(torch.full((3,), 0.5), torch.randn(1, 3)), noise_dim=0)
        image = torch.randn((1, 2) + (5,) * (len(shape) - 2)).expand((6, 2) + (5,) * (len(shape) - 2))
        out = conv(image, weight, torch.ones(3), padding="same")
        clean = conv(image[:1], theta, None, padding="same")
        assert out.shape == clean.expand_as(out).shape
        ratios = ((out - 1) / clean).flatten(2)  # (N, C, pixels): one xi per image and channel
        assert torch.allclose(ratios, ratios[..., :1].expand_as(ratios), atol=1e-8)
        assert ratios[:, :, 0].std(0).min() > 0


def test_kl_annealing_scales_exactly_the_kl_part():
    x, y = regression_data()
    for make in (lambda m: AutoVSDGuide(m, reflections=2), lambda m: AutoNormal(m), lambda m: AutoWHVIGuide(m)):
        pyro.clear_param_store()
        guide = make(BayesianMLP([5, 8, 8, 1]))
        model = guide.model  # the reparameterized model for our guides, the model itself for AutoNormal
        guide(x, y)
        losses = {}
        for factor in (0.0, 0.5, 1.0):
            annealing = KLAnnealing(factor)
            pyro.set_rng_seed(3)
            losses[factor] = TraceMeanField_ELBO().loss(annealing(model), annealing(guide), x, y)
        assert losses[1.0] != pytest.approx(losses[0.0])
        assert losses[0.5] == pytest.approx(losses[0.0] + 0.5 * (losses[1.0] - losses[0.0]), rel=1e-9)
    with pytest.raises(ValueError, match="factor"):
        KLAnnealing(-0.1)
    assert repr(KLAnnealing(0.5)) == "KLAnnealing(factor=0.5)"


def test_summaries_and_vectorized_predictive_refused():
    x, y = regression_data()
    guide = AutoVSDGuide(BayesianMLP([5, 8, 8, 1]), reflections=2)
    _train(guide.model, guide, x, y, steps=5)
    quantiles = guide.quantiles([0.1, 0.5, 0.9])
    theta = guide.median()["layers.1.weight"]
    assert torch.allclose(theta, guide.vsd_theta.layers._modules["1"].weight)
    assert (quantiles["layers.1.weight"][0] <= quantiles["layers.1.weight"][2]).all()
    with pytest.raises(ValueError, match="parallel=False"):
        Predictive(guide.model, guide=guide, num_samples=2, parallel=True)(x)


def test_hierarchical_quantiles_are_monte_carlo_over_z_and_xi():
    x, y = regression_data()
    guide = AutoVSDGuide(BayesianMLP([5, 8, 1]), hierarchical=True)
    guide(x, y)
    quantiles = guide.quantiles([0.1, 0.5, 0.9], num_samples=2000)
    weight = quantiles["layers.0.weight"]
    assert weight.shape == (3, 8, 5) and (weight[0] <= weight[1]).all() and (weight[1] <= weight[2]).all()
    # Each entry is z_i xi_i Theta_ij with z > 0 and xi ~ N(1, 0.25) at init: the median keeps Theta's sign.
    theta = guide.vsd_theta.layers._modules["0"].weight
    assert torch.equal(torch.sign(weight[1]), torch.sign(theta))
    assert ((weight[2] - weight[0]) > 0).all()


def test_cnn_sites_use_output_channel_noise_and_train():
    images, labels = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    guide = AutoVSDGuide(BayesianCNN(channels=(4, 6), hidden=12), reflections=1)
    losses = _train(guide.model, guide, images, labels, steps=20)
    assert all(torch.isfinite(torch.tensor(losses)))
    conv, fc = guide.vsd_sites["conv1.weight"], guide.vsd_sites["fc1.weight"]
    assert (conv.noise_dim, conv.num_noise, conv.num_columns) == (0, 4, 9)
    assert (fc.noise_dim, fc.num_noise, fc.num_columns) == (1, 24, 12)


def test_local_noise_differs_per_example_unless_switched_off():
    guide = AutoVSDGuide(BayesianMLP([5, 8, 1]), reflections=1)
    x = torch.randn(1, 5).expand(4, 5)
    guide(x)
    f = poutine.replay(guide.model, trace=poutine.trace(guide).get_trace(x))(x)
    assert f.std() > 0
    with local_reparameterization(False):
        f = poutine.replay(guide.model, trace=poutine.trace(guide).get_trace(x))(x)
    assert torch.allclose(f, f[:1].expand_as(f))


def test_default_selection_skips_single_input_weights():
    guide = AutoVSDGuide(BayesianMLP([1, 8, 1]))
    guide(torch.randn(4, 1))
    assert sorted(guide.vsd_sites) == ["layers.1.weight"]
    # hidden_rank only matters between reflections (T >= 2); T = 0 has no Householder parameters.
    AutoVSDGuide(BayesianMLP([1, 8, 1]), expose="all", reflections=1, hidden_rank=2)(torch.randn(4, 1))
    pyro.clear_param_store()
    flat = AutoVSDGuide(BayesianMLP([3, 8, 1]), reflections=0)
    flat(torch.randn(4, 3))
    assert not any("vsd_householder" in name for name in pyro.get_param_store().keys())


def test_no_selected_site_warns():
    def batched_prior_model():
        pyro.sample("w", dist.Normal(torch.zeros(3, 4), 1.0))  # batch shape, not one event

    with pytest.warns(UserWarning, match="no weight site was selected"):
        AutoVSDGuide(ModelModule(batched_prior_model))()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"init_alpha": 0.0}, "init_alpha must be > 0"),
        ({"init_alpha": -1.0}, "init_alpha must be > 0"),
        ({"reflections": -1}, "reflections"),
        ({"hidden_rank": 0}, "hidden_rank"),
        ({"z_prior": ("cauchy", 1.0, 1.0)}, "z_prior"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoVSDGuide(BayesianMLP([5, 8, 1]), **kwargs)


def test_bad_sites():
    x = torch.randn(4, 5)
    with pytest.raises(ValueError, match="hidden_rank=6 exceeds K=5"):
        AutoVSDGuide(BayesianMLP([5, 8, 1]), reflections=2, hidden_rank=6)(x)
    with pytest.raises(ValueError, match=r"layers\.0\.bias"):
        AutoVSDGuide(BayesianMLP([5, 8, 1]), expose=["layers.0.bias"])(x)
    with pytest.raises(ValueError, match="not latent sites"):
        AutoVSDGuide(BayesianMLP([5, 8, 1]), expose=["nope"])(x)

    def discrete_model():
        pyro.sample("counts", dist.Poisson(torch.ones(3, 4)).to_event(2))

    with pytest.raises(ValueError, match="discrete"):
        AutoVSDGuide(ModelModule(discrete_model), expose="counts")()
    guide = AutoVSDGuide(BayesianMLP([5, 8, 1]))
    with pytest.raises(RuntimeError, match="call the guide once"):
        guide.noise_distribution("layers.1.weight")
