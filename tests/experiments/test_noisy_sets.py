"""Regression sets with known noise (``whvi synthetic``) and the harness's distance to their floor."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pyro_whvi.data import load_uci_split
from pyro_whvi.data.synthetic import BENCH_FUNCTIONS
from pyro_whvi.experiments.cli import main
from pyro_whvi.experiments.methods import Schedule
from pyro_whvi.experiments.noisy_sets import noise_floor, read_noise_std, split_noise_std, write_noisy_set
from pyro_whvi.experiments.uci import UCIConfig, run_uci


@pytest.mark.parametrize("name", list(BENCH_FUNCTIONS))
def test_written_set_is_the_function_plus_noise_of_the_stated_sigma(name, tmp_path):
    sigma = write_noisy_set(name, tmp_path, num_points=4000, noise=0.3, splits=2, seed=1)
    assert read_noise_std(tmp_path) == pytest.approx(sigma, rel=1e-15)
    data = np.loadtxt(tmp_path / "data.txt")
    dim = BENCH_FUNCTIONS[name].dim
    f = BENCH_FUNCTIONS[name](data[:, :dim])
    assert sigma == pytest.approx(0.3 * f.std(), rel=1e-12)  # sigma is exactly the stated fraction of std(f)
    residual = data[:, dim] - f
    # the sample std of 4000 normals is within 4 standard errors (sigma / sqrt(2 * 4000)) of sigma
    assert abs(residual.std() - sigma) < 4 * sigma / math.sqrt(2 * 4000)
    assert abs(residual.mean()) < 4 * sigma / math.sqrt(4000)
    split = load_uci_split(tmp_path, 1)
    assert split.x_train.shape == (3600, dim) and split.x_test.shape == (400, dim)
    assert json.loads((tmp_path / "README.json").read_text())["function"] == name


def test_floor_is_the_entropy_of_the_noise():
    for sigma in (0.01, 0.3, 7.0):
        entropy = torch.distributions.Normal(0.0, sigma).entropy().item()
        assert noise_floor(sigma) == {"rmse_floor": sigma, "mnll_floor": pytest.approx(entropy, abs=1e-6)}


def test_harness_reports_the_distance_to_the_floor(tmp_path):
    sigma = write_noisy_set("otlcircuit", tmp_path / "otl", num_points=300, splits=1)
    config = UCIConfig(methods=("mfg",), splits=(0,), schedule=Schedule(steps=40, fixed_noise_steps=10), samples=4)
    summary, text = run_uci(tmp_path / "otl", config, tmp_path / "out")
    row = json.loads((tmp_path / "out" / "uci_otl.json").read_text())["meta"]["splits"][0]
    floor = noise_floor(sigma)
    assert row["mnll_gap"] == pytest.approx(row["mnll"] - floor["mnll_floor"])
    assert row["rmse_ratio"] == pytest.approx(row["rmse"] / sigma)
    assert row["noise_ratio"] == pytest.approx(row["noise_scale"] / sigma)
    assert summary[0]["mnll_gap"] == pytest.approx(row["mnll_gap"])
    assert "MNLL - floor" in text and f"{floor['mnll_floor']:.3f}" in text


def test_bad_noise_file_and_bad_arguments_are_refused(tmp_path, capsys):
    write_noisy_set("hartmann6", tmp_path / "h", num_points=50, splits=1)
    (tmp_path / "h" / "noise_std.txt").write_text("-1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["uci", "--data-dir", str(tmp_path / "h"), "--splits", "0", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2 and "noise_std.txt" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["synthetic", "--functions", "borehole,nope", "--out", str(tmp_path / "s")])
    assert exit_info.value.code == 2 and "--functions" in capsys.readouterr().err
    assert (
        main(["synthetic", "--functions", "robot", "--rows", "40", "--splits", "1", "--out", str(tmp_path / "s")]) == 0
    )
    assert read_noise_std(tmp_path / "s" / "robot") is not None


def test_a_ramp_profile_writes_one_sigma_per_row_and_each_split_gets_its_test_rows_floor(tmp_path):
    sigma = write_noisy_set("hartmann4", tmp_path / "h", num_points=4000, noise=0.3, splits=2, seed=1, profile="ramp")
    data = np.loadtxt(tmp_path / "h" / "data.txt")
    row_sigma = np.loadtxt(tmp_path / "h" / "noise_std.txt")
    # hartmann4's domain is the unit cube, so the first input is its unit coordinate: sigma (0.25 + 1.5 x1).
    np.testing.assert_allclose(row_sigma, sigma * (0.25 + 1.5 * data[:, 0]), rtol=1e-14)
    f = BENCH_FUNCTIONS["hartmann4"](data[:, :4])
    assert sigma == pytest.approx(0.3 * f.std(), rel=1e-12)
    # A Latin hypercube puts one point in each 1/4000 of x1: the mean sigma(x) is sigma to within 1.5 sigma / 4000.
    assert row_sigma.mean() == pytest.approx(sigma, abs=1.5 * sigma / 4000)
    standardized = (data[:, 4] - f) / row_sigma  # standard normal if each row has its own sigma
    assert abs(standardized.std() - 1) < 4 / math.sqrt(2 * 4000) and abs(standardized.mean()) < 4 / math.sqrt(4000)
    low, high = data[:, 0] < 0.2, data[:, 0] > 0.8
    assert (data[high, 4] - f[high]).std() > 3 * (data[low, 4] - f[low]).std()  # the noise grows along x1
    assert read_noise_std(tmp_path / "h") == pytest.approx(math.sqrt((row_sigma**2).mean()), rel=1e-12)
    # The harness's floor is each split's test rows': the mean of the entropies, and their sigma's root mean square.
    config = UCIConfig(methods=("mfg",), splits=(0, 1), schedule=Schedule(steps=20, fixed_noise_steps=5), samples=4)
    _, text = run_uci(tmp_path / "h", config, tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "uci_h.json").read_text())["meta"]["splits"]
    for row in rows:
        test_sigma = row_sigma[np.loadtxt(tmp_path / "h" / f"index_test_{row['split']}.txt", dtype=int)]
        entropies = [torch.distributions.Normal(0.0, float(s)).entropy().item() for s in test_sigma]
        assert row["mnll_gap"] == pytest.approx(row["mnll"] - sum(entropies) / len(entropies), rel=1e-9)
        assert row["noise_ratio"] == pytest.approx(row["noise_scale"] / math.sqrt((test_sigma**2).mean()), rel=1e-9)
    assert "Known noise σ(x), one per row" in text and "MNLL - floor" in text
    assert noise_floor(np.full(3, 0.7)) == pytest.approx(noise_floor(0.7), rel=1e-12)


def test_each_split_gets_its_test_rows_sigma_whatever_the_folder_is_called(tmp_path):
    folder = tmp_path / "set {0} {split}"  # braces in a path are not a format string
    write_noisy_set("hartmann4", folder, num_points=60, splits=2, profile="ramp")
    row_sigma = np.loadtxt(folder / "noise_std.txt")
    sigmas = split_noise_std(folder, (0, 1))
    for split in (0, 1):
        test_rows = np.loadtxt(folder / f"index_test_{split}.txt", dtype=int)
        np.testing.assert_array_equal(sigmas[split], row_sigma[test_rows])
    assert not np.array_equal(sigmas[0], sigmas[1])


def test_a_noise_file_of_the_wrong_length_and_a_bad_profile_are_refused(tmp_path, capsys):
    write_noisy_set("hartmann4", tmp_path / "h", num_points=50, splits=1, profile="ramp")
    (tmp_path / "h" / "noise_std.txt").write_text("0.1\n0.2\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["uci", "--data-dir", str(tmp_path / "h"), "--splits", "0", "--out", str(tmp_path / "o")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "noise_std.txt: 2 values, but data.txt has 50 rows" in error
    with pytest.raises(ValueError, match=r"profile \(--noise-profile\) must be one of \('constant', 'ramp'\)"):
        write_noisy_set("hartmann4", tmp_path / "x", num_points=50, profile="linear")
    with pytest.raises(SystemExit) as exit_info:
        main(["synthetic", "--functions", "hartmann4", "--noise-profile", "linear", "--out", str(tmp_path / "s")])
    assert exit_info.value.code == 2 and "--noise-profile: invalid choice: 'linear'" in capsys.readouterr().err
