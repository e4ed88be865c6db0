"""Data loaders and metrics against hand-made data, and the experiment scripts end to end on tiny runs."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from pyro_whvi.data import TOY_GAP, load_uci_split, num_uci_splits, toy_function, toy_regression_1d
from pyro_whvi.metrics import gaussian_mnll, gaussian_row_nll, rmse

from ..helpers import ROOT, write_uci


def test_uci_split_is_standardized_with_training_statistics(tmp_path):
    data = write_uci(tmp_path / "toy")
    split = load_uci_split(tmp_path / "toy", 1)
    train = np.loadtxt(tmp_path / "toy" / "index_train_1.txt", dtype=int)
    assert num_uci_splits(tmp_path / "toy") == 2
    assert split.x_train.shape == (36, 3) and split.x_test.shape == (4, 3)
    torch.testing.assert_close(split.x_train.mean(0), torch.zeros(3), atol=1e-12, rtol=0)
    assert split.y_mean == pytest.approx(data[train, 3].mean()) and split.y_std == pytest.approx(data[train, 3].std())
    raw = split.y_test * split.y_std + split.y_mean
    test = np.loadtxt(tmp_path / "toy" / "index_test_1.txt", dtype=int)
    torch.testing.assert_close(raw, torch.as_tensor(data[test, 3]))


def test_uci_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing.*data.txt"):
        load_uci_split(tmp_path, 0)
    write_uci(tmp_path / "toy")
    with pytest.raises(FileNotFoundError, match="split 7"):
        load_uci_split(tmp_path / "toy", 7)
    bad = np.loadtxt(tmp_path / "toy" / "data.txt")
    bad[0, 0] = np.nan
    np.savetxt(tmp_path / "toy" / "data.txt", bad)
    with pytest.raises(ValueError, match="NaN"):
        load_uci_split(tmp_path / "toy", 0)


def test_metrics_match_closed_forms():
    y = torch.tensor([0.0, 1.0, 2.0])
    f = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    assert rmse(f, y) == pytest.approx(math.sqrt(2 / 3))
    # Mixture of two Gaussians with sd 0.5 at each point.
    expected = -np.mean(
        [
            math.log(
                0.5
                * (math.exp(-0.5 * (a / 0.5) ** 2) + math.exp(-0.5 * (b / 0.5) ** 2))
                / (0.5 * math.sqrt(2 * math.pi))
            )
            for a, b in [(0.0, 2.0), (0.0, 0.0), (0.0, 2.0)]
        ]
    )
    assert gaussian_mnll(f, 0.5, y) == pytest.approx(expected)
    rows = gaussian_row_nll(f, 0.5, y)
    assert rows.shape == (3,) and rows[1] < rows[0] == rows[2]  # both samples at the middle point's target
    assert gaussian_mnll(f, 0.5, y) == float(rows.mean())  # the mean of the rows, the same float


def test_gaussian_mnll_of_a_scale_mixture_matches_its_closed_form():
    """Weights w on noise components: the density is sum_k w_k (1/S) sum_s N(y | f_s, sigma_k^2), written out here
    for two samples at three points; a component of weight 1 is the plain predictive, one per sample and point
    included. Weights that do not match the components or do not sum to 1 are refused."""
    y = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    f = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]], dtype=torch.float64)

    def normal(residual, sd):
        return math.exp(-0.5 * (residual / sd) ** 2) / (sd * math.sqrt(2 * math.pi))

    residuals = [(0.0, 2.0), (0.0, 0.0), (0.0, 2.0)]
    each_row = [
        -math.log(sum(w * 0.5 * (normal(a, sd) + normal(b, sd)) for w, sd in ((0.9, 0.5), (0.1, 3.0))))
        for a, b in residuals
    ]
    noise = torch.tensor([0.5, 3.0], dtype=torch.float64)
    assert gaussian_row_nll(f, noise, y, (0.9, 0.1)).tolist() == pytest.approx(each_row, rel=1e-12)
    assert gaussian_mnll(f, noise, y, (0.9, 0.1)) == pytest.approx(np.mean(each_row), rel=1e-12)
    assert gaussian_mnll(f, noise, y, (1.0, 0.0)) == pytest.approx(gaussian_mnll(f, 0.5, y), rel=1e-12)
    per_point = torch.rand(2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.2
    stacked = torch.stack([per_point, per_point * 4])
    assert gaussian_mnll(f, stacked, y, (0.0, 1.0)) == pytest.approx(gaussian_mnll(f, per_point * 4, y), rel=1e-12)
    with pytest.raises(ValueError, match="one weight per noise component"):
        gaussian_mnll(f, noise, y, (0.5, 0.25, 0.25))
    with pytest.raises(ValueError, match="sum to 1"):
        gaussian_mnll(f, noise, y, (0.5, 0.6))


def test_toy_problem_has_its_gap():
    x, y = toy_regression_1d(128, seed=3)
    assert x.shape == (128, 1) and y.shape == (128,)
    assert ((x < TOY_GAP[0]) | (x > TOY_GAP[1])).all() and (x >= -1).all() and (x <= 2).all()
    assert (y - toy_function(x[:, 0])).std() == pytest.approx(math.exp(-1.5), rel=0.25)
    torch.testing.assert_close(toy_regression_1d(128, seed=3)[1], y)


def _load_script(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uci_regression_script_runs(tmp_path):
    write_uci(tmp_path / "tiny", rows=30)
    args = ["--data-dir", str(tmp_path / "tiny"), "--splits", "0-1", "--steps", "3", "--hidden", "8"]
    args += ["--methods", "whvi,nf-whvi,mfg", "--samples", "4", "--out", str(tmp_path / "out")]
    assert _load_script("uci_regression").main(args) == 0
    result = json.loads((tmp_path / "out" / "uci_tiny.json").read_text())
    assert [entry["method"] for entry in result["results"]] == ["whvi", "nf-whvi", "mfg"]
    rows = result["meta"]["splits"]
    assert len(rows) == 6 and all(math.isfinite(row["rmse"]) and math.isfinite(row["mnll"]) for row in rows)
    assert (tmp_path / "out" / "uci_tiny.md").is_file()


def test_sklearn_diabetes_split_is_standardized_on_train():
    from pyro_whvi.data import load_diabetes_split

    split = load_diabetes_split(split=3)
    assert split.x_train.shape == (398, 10) and split.x_test.shape == (44, 10)
    assert torch.allclose(split.x_train.mean(0), torch.zeros(10), atol=1e-10)
    assert torch.allclose(split.x_train.std(0, unbiased=False), torch.ones(10))
    assert abs(split.y_train.mean().item()) < 1e-10 and abs(split.y_train.std(unbiased=False).item() - 1) < 1e-10
    raw = torch.cat([split.y_train, split.y_test]) * split.y_std + split.y_mean
    from sklearn.datasets import load_diabetes

    assert torch.allclose(raw.sort().values, torch.as_tensor(load_diabetes().target).sort().values.to(raw))
    again, other = load_diabetes_split(split=3), load_diabetes_split(split=4)
    assert torch.equal(again.x_test, split.x_test) and not torch.equal(other.x_test, split.x_test)


def test_sklearn_breast_cancer_split():
    from pyro_whvi.data import load_breast_cancer_split

    split = load_breast_cancer_split(seed=1)
    assert split.x_train.shape[1] == 30 and split.x_train.shape[0] + split.x_test.shape[0] == 569
    assert split.y_train.dtype == torch.long and set(split.y_train.unique().tolist()) == {0, 1}
    assert torch.allclose(split.x_train.mean(0), torch.zeros(30), atol=1e-10)
    with pytest.raises(ValueError, match="test_fraction"):
        load_breast_cancer_split(test_fraction=1.5)
    with pytest.raises(ValueError, match="non-negative integer"):
        load_breast_cancer_split(seed=-1)
