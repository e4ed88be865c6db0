"""``benchmarks/synthetic_learnability.py``: its learners against what a set with a known noise level allows."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pyro_whvi.experiments.noisy_sets import write_noisy_set

from ..experiments.test_data import _load_script
from ..helpers import ROOT, write_uci


@pytest.fixture
def learnability(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script imports its sibling ``_results``
    return _load_script("synthetic_learnability")


def test_additive_learner_reaches_the_floor_where_the_quadratic_leaves_the_ripple(tmp_path, learnability):
    """Rastrigin is a sum of one-input terms ``x^2 - 10 cos(2 pi x)``. The additive learner can fit each term, so
    its test RMSE is about ``sigma``; the quadratic fits ``x^2`` exactly and leaves the ripple, whose variance
    is ``5 x 50 = 250`` over whole periods, so its RMSE is about ``sqrt(sigma^2 + 250)``. 400 test rows:
    a squared error's relative standard error is about ``sqrt(2 / 400) = 7%``, 3.5% on the RMSE; the
    tolerances are about three of those."""
    sigma = write_noisy_set("rastrigin5", tmp_path / "r5", num_points=4000, splits=1, seed=1)
    args = learnability.argparse.Namespace(data_dir=tmp_path / "r5", learners=["quadratic", "additive"])
    torch.manual_seed(0)
    rows = {row["learner"]: row for row in learnability.run_split(args, 0, sigma)}
    assert rows["quadratic"]["rmse_over_sigma"] == pytest.approx(math.sqrt(1 + 250 / sigma**2), rel=0.1)
    assert rows["additive"]["rmse_over_sigma"] < 1.1
    assert rows["additive"]["noise_over_sigma"] == pytest.approx(1.0, abs=0.1)
    assert abs(rows["additive"]["mnll_minus_floor"]) < 0.1
    assert rows["quadratic"]["mnll_minus_floor"] > 1.0


def test_script_runs_every_learner_and_writes_its_tables(tmp_path, learnability):
    write_noisy_set("hartmann6", tmp_path / "h6", num_points=300, splits=2)
    argv = ["--data-dir", str(tmp_path / "h6"), "--splits", "0-1", "--mlp-layers", "1", "--mlp-width", "8"]
    argv += ["--mlp-epochs", "2", "--gp-rows", "60", "--out", str(tmp_path / "out")]
    assert learnability.main(argv) == 0
    result = json.loads((tmp_path / "out" / "h6.json").read_text())
    rows = result["results"]
    assert {row["learner"] for row in rows} == {"quadratic", "additive", "mlp", "mlp_last", "gp"}
    assert len(rows) == 10 and all(math.isfinite(row["mnll_minus_floor"]) for row in rows)
    assert all(row["rmse_over_sigma"] > 0 and row["noise_over_sigma"] > 0 for row in rows)
    assert "| gp | 2 |" in (tmp_path / "out" / "h6.md").read_text()


def test_a_folder_without_its_noise_level_is_refused_with_the_fix(tmp_path, learnability, capsys):
    write_uci(tmp_path / "plain", rows=40)
    with pytest.raises(SystemExit):
        learnability.main(["--data-dir", str(tmp_path / "plain"), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert "--data-dir" in error and "noise_std.txt" in error and "whvi synthetic" in error


def test_a_stopped_run_keeps_the_splits_it_finished(tmp_path, learnability, monkeypatch):
    write_noisy_set("hartmann6", tmp_path / "h6", num_points=300, splits=2)
    finish_split = learnability.run_split

    def stop_at_split_1(args, split, sigma):
        if split == 1:
            raise KeyboardInterrupt
        return finish_split(args, split, sigma)

    monkeypatch.setattr(learnability, "run_split", stop_at_split_1)
    argv = ["--data-dir", str(tmp_path / "h6"), "--splits", "0-1", "--learners", "quadratic,additive"]
    with pytest.raises(KeyboardInterrupt):
        learnability.main([*argv, "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "h6.json").read_text())
    assert {(row["learner"], row["split"]) for row in result["results"]} == {("quadratic", 0), ("additive", 0)}
    assert result["meta"]["splits"] == [0]


def test_gp_fitted_on_a_subset_predicts_with_the_exact_posterior_given_every_row(tmp_path, learnability):
    """``--gp-fit-rows 60 --gp-rows 300``: the hyperparameters are those fitted on the first 60 rows, and the
    prediction is the closed-form GP posterior given all 300 (mean ``m + k*^T (K + s^2 I)^-1 (y - m)``, variance
    ``k** - k*^T (K + s^2 I)^-1 k* + s^2``), to float64 round-off."""
    write_noisy_set("hartmann6", tmp_path / "h6", num_points=400, splits=1)
    data = learnability.load_dataset_split(tmp_path / "h6", 0)
    x, y, x_test = (t.double() for t in (data.x_train, data.y_train, data.x_test))
    args = learnability.argparse.Namespace(gp_rows=300, gp_fit_rows=60, gp_lengthscales=(1.0, 0.3))
    mean, std, noise = learnability.exact_gp(args, x, y, x_test)
    fitted = learnability.fit_exact_gp(x[:60], y[:60], (1.0, 0.3))  # Adam on the CPU is deterministic: the same fit
    kernel, s2 = fitted.covar_module, float(fitted.likelihood.noise.detach())
    m = float(fitted.mean_module.constant.detach())
    with torch.no_grad():
        gram = kernel(x[:300]).to_dense() + s2 * torch.eye(300, dtype=torch.float64)
        cross = kernel(x[:300], x_test).to_dense()
        prior_var = kernel(x_test, diag=True)
    solve = torch.linalg.solve(gram, torch.cat([(y[:300] - m)[:, None], cross], 1))
    assert torch.allclose(mean, m + cross.T @ solve[:, 0], atol=1e-7)
    assert torch.allclose(std**2, prior_var - (cross * solve[:, 1:]).sum(0) + s2, atol=1e-7)
    assert noise == pytest.approx(s2**0.5)
    given_60 = learnability.exact_gp(
        learnability.argparse.Namespace(gp_rows=60, gp_fit_rows=None, gp_lengthscales=(1.0,)), x, y, x_test
    )
    assert not torch.allclose(given_60[0], mean, atol=1e-3)  # the 240 further rows move the posterior


def test_gp_fit_rows_beyond_gp_rows_is_refused(tmp_path, learnability, capsys):
    write_noisy_set("hartmann6", tmp_path / "h6", num_points=300, splits=1)
    with pytest.raises(SystemExit):
        learnability.main(["--data-dir", str(tmp_path / "h6"), "--gp-rows", "100", "--gp-fit-rows", "200"])
    assert "--gp-fit-rows" in capsys.readouterr().err


def test_gp_lengthscales_must_be_positive(tmp_path, learnability, capsys):
    write_noisy_set("hartmann6", tmp_path / "h6", num_points=300, splits=1)
    with pytest.raises(SystemExit):
        learnability.main(["--data-dir", str(tmp_path / "h6"), "--gp-lengthscales", "1,-0.3"])
    assert "--gp-lengthscales" in capsys.readouterr().err
