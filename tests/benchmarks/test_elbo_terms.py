"""``benchmarks/elbo_terms.py``: its Monte Carlo per-site KLs against the closed form, and the script end to end."""

from __future__ import annotations

import json
from operator import attrgetter

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

from pyro_whvi.nn import BayesianMLP

from ..experiments.test_data import _load_script
from ..helpers import write_uci


@pytest.mark.slow
def test_site_kls_match_the_closed_form_for_mean_field_sites():
    """For AutoNormal, each site's ``E_q[log q - log p]`` is ``KL(N(loc, scale) || prior)`` in closed form.
    4000 draws: the Monte Carlo standard error of a site's KL is about std(log q - log p) / 63, a few
    hundredths of a nat here, so 0.2 nats is about five standard errors."""
    elbo_terms = _load_script("elbo_terms")
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    model = BayesianMLP([3, 8, 1])
    guide = AutoNormal(model, init_scale=0.3)
    x, y = torch.randn(20, 3), torch.randn(20)
    guide(x, y)
    with torch.no_grad():  # move the posterior away from its initial values, so the KLs are not all alike
        for _, value in pyro.get_param_store().items():
            value.unconstrained().add_(0.2 * torch.randn_like(value))
    with pyro.validation_enabled(False):  # it checks arguments only: the same estimates, in three quarters of the time
        kls, log_likelihood = elbo_terms.site_kls(model, guide, x, y, draws=4000)
    assert set(kls) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    for name, estimate in kls.items():
        posterior = dist.Normal(attrgetter(name)(guide.locs), attrgetter(name)(guide.scales))
        prior_scale = model.get_submodule(name.rsplit(".", 1)[0]).get_buffer(name.rsplit(".", 1)[1] + "_prior_scale")
        exact = float(torch.distributions.kl_divergence(posterior, dist.Normal(0.0, prior_scale)).sum())
        assert abs(estimate - exact) < 0.2, (name, estimate, exact)
    assert log_likelihood < 0


def test_elbo_terms_script_runs(tmp_path):
    write_uci(tmp_path / "tiny", rows=40)
    script = _load_script("elbo_terms")
    args = ["--data-dir", str(tmp_path / "tiny"), "--steps", "5", "--draws", "2", "--out", str(tmp_path / "out")]
    assert script.main(args) == 0
    result = json.loads((tmp_path / "out" / "elbo_terms_tiny_whvi.json").read_text())
    (row,) = result["results"]
    assert row["kl_whvi_g"] != 0 and row["kl_other"] != 0 and row["noise"] > 0
    assert row["sigma_from_terms"] >= row["train_residual"]
