"""``bayesian_`` and the variational layers say what they do not do (issue 51): layers left deterministic are
named in a warning, and an input of another dtype than the model gets one line naming both and the fix."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import nn

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide
from pyro_whvi.nn import BayesianCNN, BayesianMLP, bayesian_


def _network() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 6), nn.LayerNorm(6), nn.Linear(6, 2))


def test_layers_left_deterministic_are_named_once_and_skip_says_it_is_intended():
    with pytest.warns(UserWarning) as caught:
        network = bayesian_(_network())
    messages = [str(w.message) for w in caught if "bayesian_" in str(w.message)]
    assert messages == [
        "bayesian_: '0' (Conv1d) stay deterministic (only nn.Linear and nn.Conv2d have variational counterparts); "
        "pass skip=['0'] to say that this is intended."
    ]
    assert type(network[0]) is nn.Conv1d and type(network[4]) is nn.LayerNorm  # a norm's 1-D scale is not named
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bayesian_(_network(), skip=["0"])
        bayesian_(nn.Sequential(nn.Linear(3, 4), nn.Conv2d(1, 2, 3)))  # everything converted: no warning


@pytest.mark.parametrize("method", ["whvi", "vsd"])
@pytest.mark.parametrize(
    ("model_dtype", "data_dtype", "fix"),
    [
        (torch.float32, torch.float64, "model with model.double() or the data with x.float()"),
        (torch.float64, torch.float32, "model with model.float() or the data with x.double()"),
    ],
)
def test_an_input_of_another_dtype_gets_one_line_naming_both_and_the_fix(method, model_dtype, data_dtype, fix):
    """A float32 model given float64 data used to get PyTorch's own dtype error."""
    network = bayesian_(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), method=method)
    network.to(model_dtype)
    layer = type(network[0]).__name__
    message = f"{layer} '0': the input is {data_dtype} but the layer's parameters are {model_dtype}; convert the "
    with pytest.raises(TypeError) as refused:
        network(torch.randn(5, 4, dtype=data_dtype))
    assert str(refused.value) == message + fix + "."
    assert network(torch.randn(5, 4, dtype=model_dtype)).dtype == model_dtype


def test_a_convolution_checks_the_dtype_too():
    network = bayesian_(nn.Sequential(nn.Conv2d(1, 2, 3))).float()  # the tests' default dtype is float64
    with pytest.raises(TypeError, match=r"WHVIConv2d '0': the input is torch.float64 but .* torch.float32"):
        network(torch.randn(1, 1, 5, 5, dtype=torch.float64))


@pytest.mark.parametrize("guide_class", [AutoWHVIGuide, AutoVSDGuide, AutoNormal])
@pytest.mark.parametrize(
    ("model_dtype", "data_dtype"), [(torch.float32, torch.float64), (torch.float64, torch.float32)]
)
def test_the_ready_made_networks_name_a_data_dtype_that_is_not_the_models(guide_class, model_dtype, data_dtype):
    """A float32 model given float64 data (and the reverse) gets one message naming x's dtype and the fix, under
    every guide (the weights the guide draws are in the model's dtype), not PyTorch's matmul error."""
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(model_dtype)
        pyro.clear_param_store()
        model = BayesianMLP([4, 8, 1])
        guide = guide_class(model)
        x, y = torch.randn(16, 4, dtype=data_dtype), torch.randn(16, dtype=data_dtype)
        with pytest.raises(TypeError, match=rf"BayesianMLP: x is {data_dtype}.*x\.(float|double)\(\)"):
            SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y)
        cnn = BayesianCNN(num_classes=3, image_shape=(1, 8, 8))
        with pytest.raises(TypeError, match=rf"BayesianCNN: x is {data_dtype}"):
            cnn(torch.randn(2, 1, 8, 8, dtype=data_dtype))
    finally:
        torch.set_default_dtype(previous)
