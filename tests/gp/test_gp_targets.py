"""Targets are validated like inputs (issue 51): ``RandomFeatureGP`` in GPyTorch's plain training loop refuses a
NaN or infinite target in one line naming the rows, for both posteriors, before any parameter changes."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from pyro_whvi.gp import RandomFeatureGP, RandomFeatureKernel

from ..helpers import gpytorch_training_step


@pytest.mark.parametrize(("projection", "posterior"), [("dense", "gaussian"), ("sorf", "whvi"), ("fastfood", "whvi")])
def test_a_non_finite_target_is_named_and_leaves_the_parameters_as_they_were(projection, posterior):
    """One step on a NaN target used to make every parameter NaN, with no error."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=generator)
    y = torch.sin(x[:, 0])
    torch.manual_seed(0)
    model = RandomFeatureGP(RandomFeatureKernel(16, projection, ard_num_dims=3, seed=0), posterior=posterior)
    step = gpytorch_training_step(model, num_data=32)
    step(x, y)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    bad = y.clone()
    bad[3], bad[7] = float("nan"), float("-inf")
    message = (
        r"^RandomFeatureGP: y \(the targets; rows 3, 7, found by the loss's gradient\) has 1 NaN and 1 infinite "
        r"entries \(of 32\); remove or impute them first\.$"
    )
    with pytest.raises(ValueError, match=message):
        step(x, bad)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), before[name], rtol=0, atol=0, msg=name)
    step(x, y)  # and training goes on
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_one_bad_row_is_named_alone_and_predictions_without_gradients_are_unaffected():
    torch.manual_seed(1)
    x = torch.randn(8, 2)
    model = RandomFeatureGP(RandomFeatureKernel(8, "sorf", ard_num_dims=2, seed=0), posterior="whvi")
    mll = gpytorch.mlls.VariationalELBO(gpytorch.likelihoods.GaussianLikelihood(), model, num_data=8)
    y = torch.zeros(8)
    y[5] = float("nan")
    with pytest.raises(ValueError, match=r"y \(the targets; row 5, found by the loss's gradient\) has 1 NaN"):
        (-mll(model(x), y)).backward()
    with torch.no_grad():
        assert torch.isfinite(model(x).mean).all()
