"""Nothing hangs, nothing silently wrong: bad input is refused with a named error before anything is
changed (I-BLM, random-feature GPs), the ops answer alike on every backend, and a guide never reads
another guide's stale parameters."""

from __future__ import annotations

import re

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.optim import Adam

import pyro_whvi.init.iblm as iblm_module
from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, iblm_, ops
from pyro_whvi.gp import RandomFeatureGP, RandomFeatureKernel
from pyro_whvi.infer._guide_utils import deep_getattr
from pyro_whvi.nn import BayesianMLP

from .helpers import gpytorch_training_step

GUIDES = {"normal": AutoNormal, "whvi": AutoWHVIGuide, "vsd": AutoVSDGuide}


def _regression(num=40):
    x = torch.randn(num, 3)
    return x, torch.sin(x[:, 0]) + 0.1 * torch.randn(num)


def _blobs(num=60):
    labels = torch.arange(num) % 3
    return 3.0 * torch.randn(3, 3)[labels] + torch.randn(num, 3), labels


def _state(guide):
    """Every tensor I-BLM may write: the guide's parameters and the param store's entries."""
    state = {name: p.detach().clone() for name, p in guide.named_parameters()}
    state.update({f"store:{name}": p.detach().clone() for name, p in pyro.get_param_store().named_parameters()})
    return state


def _assert_unchanged(guide, before):
    after = _state(guide)
    assert after.keys() == before.keys()
    for name, value in after.items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0, msg=name)


def _set_up(name, model, x, y):
    guide = GUIDES[name](model)
    guide(x, y)  # parameters exist (as after some SVI steps) before I-BLM runs
    return guide


# -- item 4: iblm_ never corrupts a guide ------------------------------------------------------------


@pytest.mark.parametrize("name", list(GUIDES))
def test_iblm_refuses_one_example_and_leaves_the_guide_as_it_was(name):
    """One example used to leave NaN in the guide (the hidden units' targets are standardized by a std of one value)."""
    x, y = _regression()
    guide = _set_up(name, BayesianMLP([3, 8, 1]), x, y)
    before = _state(guide)
    with pytest.raises(ValueError, match="at least 2 examples, got 1"):
        iblm_(guide, (x[:1], y[:1]))
    with pytest.raises(ValueError, match="at least 2 examples, got 1"):
        iblm_(guide, (x, y), batch_size=1)
    _assert_unchanged(guide, before)


@pytest.mark.parametrize("name", list(GUIDES))
def test_a_failure_after_a_layer_was_written_restores_every_parameter(name, monkeypatch):
    """The first layer is written, then the output layer's fit is non-finite: everything is restored."""
    x, y = _regression()
    guide = _set_up(name, BayesianMLP([3, 8, 1]), x, y)
    before = _state(guide)
    real_fit = iblm_module.fit_layer  # iblm_ calls the name it imported from layer_fit
    written_before_the_failure = []

    def fit_with_nan_output(guide, layer, likelihood, stream, is_output, settings, bar):
        gaussian = real_fit(guide, layer, likelihood, stream, is_output, settings, bar)
        if is_output:
            written_before_the_failure.append(any(not torch.equal(v, before[k]) for k, v in _state(guide).items()))
            gaussian.weight_mean = torch.full_like(gaussian.weight_mean, float("nan"))
            gaussian.row_data_rhs = torch.full_like(gaussian.row_data_rhs, float("nan"))
        return gaussian

    monkeypatch.setattr(iblm_module, "fit_layer", fit_with_nan_output)
    with pytest.raises(ValueError, match=r"layer 'layers\.1\.weight' gave NaN or Inf.*left as it was"):
        iblm_(guide, (x, y), batch_size=20)
    assert written_before_the_failure == [True]
    _assert_unchanged(guide, before)


def test_a_bad_dataloader_batch_midway_restores_the_guide(monkeypatch):
    """A DataLoader's later batch is only seen at its turn, after earlier layers were written."""
    x, y = _regression(10)
    bad_x = x.clone()
    bad_x[0, 0] = float("nan")

    class Batches:  # clean batches, then NaN ones
        served = 0

        def __iter__(self):
            while True:
                Batches.served += 1
                yield (x if Batches.served <= 10 else bad_x), y

    guide = _set_up("whvi", BayesianMLP([3, 8, 1]), x, y)
    before = _state(guide)
    assigned = []
    real_assign = iblm_module.assign_layer
    monkeypatch.setattr(iblm_module, "assign_layer", lambda *args: (assigned.append(args[1]), real_assign(*args)))
    with pytest.raises(ValueError, match="NaN or Inf"):
        iblm_(guide, Batches())
    assert assigned == ["layers.0.weight"]
    _assert_unchanged(guide, before)


def test_n_by_1_class_labels_are_squeezed_and_other_shapes_named():
    x, labels = _blobs()
    results = []
    for y in (labels, labels[:, None]):
        pyro.clear_param_store()
        pyro.set_rng_seed(3)
        guide = AutoNormal(BayesianMLP([3, 8, 3], likelihood="categorical"))
        iblm_(guide, (x, y), batch_size=30)
        results.append({name: p.detach().clone() for name, p in guide.named_parameters()})
    assert results[0].keys() == results[1].keys()
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, msg=name)

    guide = _set_up("whvi", BayesianMLP([3, 8, 3], likelihood="categorical"), x, labels)
    before = _state(guide)
    with pytest.raises(ValueError, match=r"\(N, 3\) one-hot rows, got shape \(60, 2\)"):
        iblm_(guide, (x, torch.zeros(60, 2)))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        iblm_(guide, (x, labels + 1))
    _assert_unchanged(guide, before)


def test_non_finite_data_are_named_with_their_counts():
    x, y = _regression()
    guide = _set_up("normal", BayesianMLP([3, 8, 1]), x, y)
    before = _state(guide)
    bad_x, bad_y = x.clone(), y.clone()
    bad_x[1, 2] = bad_x[5, 0] = float("nan")
    bad_y[3] = float("-inf")
    with pytest.raises(ValueError, match=r"the data's x has 2 NaN and 0 infinite entries \(of 120\)"):
        iblm_(guide, (bad_x, y))
    with pytest.raises(ValueError, match=r"the data's y has 0 NaN and 1 infinite entries \(of 40\)"):
        iblm_(guide, (x, bad_y))
    _assert_unchanged(guide, before)


# -- item 5: random-feature GPs refuse non-finite inputs -----------------------------------------------


@pytest.mark.parametrize(("projection", "posterior"), [("dense", "gaussian"), ("fastfood", "whvi"), ("sorf", "whvi")])
def test_random_feature_gp_training_loop_refuses_non_finite_inputs(projection, posterior):
    """The README's plain GPyTorch loop: one step on NaN inputs used to make every parameter NaN."""
    x = torch.randn(32, 3)
    y = torch.sin(x[:, 0])
    model = RandomFeatureGP(RandomFeatureKernel(16, projection, ard_num_dims=3, seed=0), posterior=posterior)
    step = gpytorch_training_step(model, num_data=32)
    step(x, y)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    bad = x.clone()
    bad[3, 1], bad[7, 0] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"RandomFeatureKernel: x \(the inputs\) has 1 NaN and 1 infinite entries"):
        step(bad, y)
    with pytest.raises(ValueError, match="1 NaN and 1 infinite"):
        model.covar_module.featurize(bad)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)
    step(x, y)  # and training goes on


# -- item 6: consistency -------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [1.0, "yes", 1, 0, None, torch.tensor(True)], ids=repr)
def test_fwht_normalized_flag_is_checked_alike_on_every_backend(backend, flag):
    """The compiled op's schema took 1.0 and refused "yes"; the reference took any truthy value."""
    with pytest.raises(TypeError, match=r"fwht: normalized must be True or False, got"):
        ops.fwht(torch.randn(2, 8), flag)
    torch.testing.assert_close(ops.fwht(torch.ones(1, 4), False), torch.tensor([[4.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_inputs_get_a_named_error_on_every_checked_op(backend, layout):
    def sparse(t):
        return t.to_sparse() if layout == "coo" else t.to_sparse_csr()

    x, d = torch.randn(4, 8), torch.randn(8)
    signs, gaussian, scale = torch.ones(2, 8), torch.randn(2, 8), torch.ones(2, 8)
    permutation = torch.arange(8).expand(2, 8).contiguous()
    calls = {
        "fwht: x": lambda: ops.fwht(sparse(x)),
        "whvi_matvec: x": lambda: ops.whvi_matvec(sparse(x), d, d, d),
        "whvi_matvec: g": lambda: ops.whvi_matvec(x, d, sparse(x), d),
        "whvi_design: x": lambda: ops.whvi_design(sparse(torch.randn(8, 8)), d, d),
        "fastfood: x": lambda: ops.fastfood(sparse(x), signs, permutation, gaussian, scale),
        "fastfood: gaussian": lambda: ops.fastfood(x, signs, permutation, sparse(gaussian), scale),
    }
    for prefix, call in calls.items():
        with pytest.raises(TypeError, match=rf"{prefix} is a torch\.sparse_{layout} tensor.*to_dense\(\)"):
            call()


@pytest.mark.parametrize("make_guide", [AutoWHVIGuide, AutoVSDGuide], ids=["whvi", "vsd"])
def test_an_integer_init_scale_is_accepted(make_guide):
    x, y = _regression(16)
    model = BayesianMLP([3, 8, 1])
    guide = make_guide(model, init_scale=1)
    assert torch.isfinite(torch.tensor(SVI(model, guide, Adam({"lr": 1e-3}), Trace_ELBO()).step(x, y)))
    assert guide._init_scale == 1.0 and isinstance(guide._init_scale, float)


@pytest.mark.parametrize(
    ("make_guide", "stale"),
    [
        (AutoWHVIGuide, "AutoWHVIGuide.whvi_s1.layers.0.weight' with shape (2, 4)"),
        (AutoVSDGuide, "AutoVSDGuide.vsd_theta.layers.0.weight' with shape (8, 3)"),
    ],
    ids=["whvi", "vsd"],
)
def test_a_guide_for_another_shape_names_the_stale_parameter_and_the_fix(make_guide, stale):
    """Pyro's AutoNormal fails here too ("Model and guide shapes disagree"); ours name the entry and the fix."""
    x, y = _regression(16)
    first = BayesianMLP([3, 8, 1])
    SVI(first, make_guide(first), Adam({"lr": 1e-3}), Trace_ELBO()).step(x, y)
    wider = BayesianMLP([3, 16, 1])
    svi = SVI(wider, make_guide(wider), Adam({"lr": 1e-3}), Trace_ELBO())
    with pytest.raises(ValueError, match=rf"already holds '{re.escape(stale)}.*pyro\.clear_param_store\(\)"):
        svi.step(x, y)
    pyro.clear_param_store()
    svi = SVI(wider, make_guide(wider), Adam({"lr": 1e-3}), Trace_ELBO())
    assert torch.isfinite(torch.tensor(svi.step(x, y)))


@pytest.mark.parametrize("make_guide", [AutoWHVIGuide, AutoVSDGuide], ids=["whvi", "vsd"])
def test_a_guide_of_the_same_shape_still_reads_the_store_as_pyro_does(make_guide):
    """Same shapes (e.g. a loaded param store): the new guide takes the stored values, as AutoNormal does."""
    x, y = _regression(16)
    model = BayesianMLP([3, 8, 1])
    first = make_guide(model)
    SVI(model, first, Adam({"lr": 1e-2}), Trace_ELBO()).step(x, y)
    second = make_guide(BayesianMLP([3, 8, 1]))
    second(x, y)
    store = pyro.get_param_store()
    name = "whvi_s1.layers.0.weight" if make_guide is AutoWHVIGuide else "vsd_theta.layers.0.weight"
    with second._pyro_context:
        torch.testing.assert_close(deep_getattr(second, name), store[f"{type(second).__name__}.{name}"])
