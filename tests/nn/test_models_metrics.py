"""The ready-made models (classification, CNN, MC dropout, minibatch scaling), the digits split and
the classification metrics against direct computations."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta, init_to_sample

from pyro_whvi.data import load_digits_split
from pyro_whvi.metrics import (
    categorical_nll,
    error_rate,
    expected_calibration_error,
    predictive_entropy,
    predictive_probs,
)
from pyro_whvi.nn import BayesianCNN, BayesianMLP


def test_categorical_mlp_and_cnn_sites_and_shapes():
    mlp = BayesianMLP([64, 10, 3], likelihood="categorical")
    trace = poutine.trace(mlp).get_trace(torch.randn(7, 64), torch.randint(0, 3, (7,)))
    assert type(trace.nodes["obs"]["fn"]).__name__ == "Categorical"
    assert trace.nodes["f"]["value"].shape == (7, 3) and mlp.noise_scale is None
    cnn = BayesianCNN(channels=(4, 6), hidden=12)
    trace = poutine.trace(cnn).get_trace(torch.rand(5, 1, 8, 8))
    assert trace.nodes["f"]["value"].shape == (5, 10)
    assert trace.nodes["conv1.weight"]["fn"].event_shape == (4, 1, 3, 3)
    # N(0, 1/fan_in) priors: fan-in C_in k^2 for a filter bank.
    assert torch.allclose(trace.nodes["conv2.weight"]["fn"].base_dist.scale, torch.tensor(1 / math.sqrt(4 * 9)))
    with pytest.raises(ValueError, match=r"\(N, 1, 8, 8\)"):
        cnn(torch.rand(5, 64))


def test_num_data_scales_the_likelihood():
    model = BayesianMLP([3, 4, 1])
    x, y = torch.randn(8, 3), torch.randn(8)
    trace = poutine.trace(model).get_trace(x, y, num_data=80)
    assert trace.nodes["obs"]["scale"] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="num_data"):
        model(x, y, num_data=4)


def test_mc_dropout_is_stochastic_with_a_point_estimate():
    model = BayesianMLP([3, 32, 1], dropout=0.5)
    guide = AutoDelta(model, init_loc_fn=init_to_sample)
    x = torch.randn(1, 3).expand(64, 3)
    guide(x)
    f = poutine.replay(model, trace=poutine.trace(guide).get_trace(x))(x)
    assert f.std() > 0
    with pytest.raises(ValueError, match="dropout"):
        BayesianMLP([3, 4, 1], dropout=1.0)


def test_digits_split():
    split = load_digits_split(seed=1, images=True)
    assert split.x_train.shape[1:] == (1, 8, 8) and len(split.y_train) + len(split.y_test) == 1797
    assert 0 <= split.x_train.min() and split.x_train.max() <= 1
    again = load_digits_split(seed=1)
    assert torch.equal(again.y_test, split.y_test) and again.x_test.shape[1] == 64


def test_classification_metrics_match_direct_computations():
    logits = torch.randn(5, 40, 3)
    labels = torch.randint(0, 3, (40,))
    probs = logits.softmax(-1).mean(0)
    assert torch.allclose(predictive_probs(logits), probs)
    assert torch.allclose(categorical_nll(logits, labels), -probs[torch.arange(40), labels].log().mean())
    assert torch.allclose(error_rate(logits, labels), (probs.argmax(-1) != labels).double().mean())
    assert torch.allclose(predictive_entropy(logits), -(probs * probs.log()).sum(-1))
    # ECE by hand: bins of width 1/num_bins over the confidence.
    confidence, predicted = probs.max(-1)
    ece = 0.0
    for b in range(4):
        low, high = b / 4, (b + 1) / 4
        in_bin = (confidence >= low) & ((confidence < high) if b < 3 else (confidence <= high))
        if in_bin.any():
            accuracy = (predicted[in_bin] == labels[in_bin]).double().mean()
            ece += in_bin.double().mean() * (accuracy - confidence[in_bin].mean()).abs()
    assert torch.allclose(expected_calibration_error(logits, labels, num_bins=4), torch.as_tensor(ece))
    # A perfectly calibrated, always-right predictor has zero ECE and zero error.
    sure = torch.full((1, 4, 2), -30.0)
    sure[0, torch.arange(4), torch.tensor([0, 1, 1, 0])] = 30.0
    assert float(expected_calibration_error(sure, torch.tensor([0, 1, 1, 0]))) < 1e-12
    with pytest.raises(ValueError, match=r"\(S, N, C\)"):
        categorical_nll(probs, labels)


def test_vsd_learns_digits_quickly():
    from pyro.infer import SVI, Predictive, Trace_ELBO

    from pyro_whvi import AutoVSDGuide, KLAnnealing

    torch.set_default_dtype(torch.float32)
    pyro.set_rng_seed(0)
    data = load_digits_split(seed=0, dtype=torch.float32)
    model = BayesianMLP([64, 64, 10], likelihood="categorical")
    guide = AutoVSDGuide(model, reflections=2)
    annealing = KLAnnealing(0.01)
    svi = SVI(annealing(guide.model), annealing(guide), pyro.optim.Adam({"lr": 5e-3}), Trace_ELBO())
    num = len(data.y_train)
    for _ in range(300):
        batch = torch.randint(0, num, (100,))
        svi.step(data.x_train[batch], data.y_train[batch], num_data=num)
    logits = Predictive(guide.model, guide=guide, num_samples=20, return_sites=["f"])(data.x_test)["f"]
    logits = logits.reshape(20, len(data.y_test), 10)
    # Chance is 0.9; a network that learned nothing useful stays far above 0.1.
    assert float(error_rate(logits, data.y_test)) < 0.1
