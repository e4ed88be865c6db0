"""``whvi uci --calibrate-noise``: the factor of the noise chosen on held-out training rows
(:mod:`pyro_whvi.experiments.noise_calibration`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from pyro_whvi.experiments import noise_calibration, uci
from pyro_whvi.experiments.methods import Schedule, parse_method
from pyro_whvi.experiments.noise_calibration import NOISE_FACTORS, calibrate_noise, keep_weight, noise_factor
from pyro_whvi.experiments.uci import UCIConfig, load_dataset_split, run_uci
from pyro_whvi.metrics import gaussian_mnll

# NOISE_FACTORS are log-spaced: the best factor on the grid is within half a step of the exact one in log.
HALF_STEP = math.log(10.0) * 3 / 600 / 2


def test_noise_factor_is_the_maximum_likelihood_scale_when_the_samples_agree():
    """With every sample of f equal the predictive is one Gaussian, whose maximum-likelihood standard deviation
    is the residuals' root mean square: the factor is that over the noise, to the grid's resolution. With a noise
    per row (a head's) the maximum-likelihood factor is the root mean square of the standardized residuals."""
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(200, generator=generator, dtype=torch.float64)
    y = mean + 0.3 * torch.randn(200, generator=generator, dtype=torch.float64)
    f = mean.expand(8, -1)
    for noise, exact in (
        (torch.tensor(1.5, dtype=torch.float64), (y - mean).pow(2).mean().sqrt() / 1.5),
        (
            (per_row := 0.2 + torch.rand(200, generator=generator, dtype=torch.float64)).expand(8, -1),
            ((y - mean) / per_row).pow(2).mean().sqrt(),
        ),
    ):
        factor, calibrated, learned = noise_factor(f, noise, y)
        assert abs(math.log(factor) - math.log(float(exact))) <= HALF_STEP + 1e-12
        assert calibrated == pytest.approx(gaussian_mnll(f, noise * factor, y), rel=1e-12)
        assert learned == pytest.approx(gaussian_mnll(f, noise, y), rel=1e-12)
        assert calibrated < learned  # the noise given is 3-5 times too large
    # A factor already right stays (within a grid step), and never leaves the grid.
    factor, *_ = noise_factor(f, (y - mean).pow(2).mean().sqrt(), y)
    assert abs(math.log(factor)) <= HALF_STEP + 1e-12
    assert NOISE_FACTORS[0] <= noise_factor(f, 1e6, y)[0] == NOISE_FACTORS[0]


def test_keeping_the_learned_noise_bounds_every_rows_loss():
    """A calibrated noise chosen on rows near the mean fails a row far from it; keeping a weight eps on the learned
    noise bounds that row's NLL by the learned predictive's plus log(1/eps), and costs the rows near the mean at most
    -log(1 - eps) each against the calibrated noise alone."""
    generator = torch.Generator().manual_seed(1)
    mean = torch.randn(120, generator=generator, dtype=torch.float64)
    y = mean + 0.1 * torch.randn(120, generator=generator, dtype=torch.float64)
    f = mean.expand(4, -1)
    noise = torch.tensor(1.0, dtype=torch.float64)
    keep = keep_weight(len(y))
    assert keep == 1 / 122
    factor, alone, learned_mnll = noise_factor(f, noise, y)
    stacked, weights = noise_calibration.calibrated_noise(noise, {"noise_factor": factor, "learned_noise_weight": keep})
    assert weights == (1 - keep, keep) and torch.equal(stacked, torch.stack([noise * factor, noise]))
    near = gaussian_mnll(f, stacked, y, weights)
    assert alone < near <= alone - math.log(1 - keep) + 1e-12 and near < learned_mnll
    far = torch.tensor([mean[0] + 4.0], dtype=torch.float64)  # 4 learned noises, 40 residual scales, from the mean
    f_far = f[:, :1]
    with_keep, learned = gaussian_mnll(f_far, stacked, far, weights), gaussian_mnll(f_far, noise, far)
    assert gaussian_mnll(f_far, noise * factor, far) > learned + 100  # the noise alone fails it
    assert learned < with_keep <= learned + math.log(1 / keep)


def _config(**changes) -> UCIConfig:
    schedule = Schedule(steps=40, fixed_noise_steps=10, batch_size=16, lr=0.05)
    settings = dict(methods=("mfg",), splits=(0,), schedule=schedule, hidden=8, samples=8, val_fraction=0.25)
    return UCIConfig(**{**settings, "progress": False, **changes})


def test_the_factor_is_chosen_on_the_held_out_rows_and_scales_the_full_fits_noise(tmp_path, monkeypatch):
    """The factor is the held-out rows' (the fit part trained as the candidates' choice trains it); the split is
    then trained as without the flag (the same draws: the same RMSE and learned noise) and its noise multiplied by
    the factor; the row names the factor and its cost, the table each split's. A stored calibration is read
    back, not trained again."""
    mfg = parse_method("mfg")
    config = _config(calibrate_noise=True)
    data = load_dataset_split("diabetes", 0)
    part = uci.validation_part(data, 0.25, config.seed)
    fit = uci.train_split("diabetes", mfg, 0, config, data=part)
    f, noise = uci.predict_split(fit, part.x_test, config)
    keep = keep_weight(len(part.y_test))
    expected, _, learned = noise_factor(f, noise, part.y_test)
    calibrated = gaussian_mnll(f, torch.stack([noise * expected, noise]), part.y_test, (1 - keep, keep))
    assert expected != 1.0
    run_uci("diabetes", config, tmp_path / "calibrated")
    run_uci("diabetes", replace(config, calibrate_noise=False), tmp_path / "plain")
    row, plain = (
        json.loads((tmp_path / folder / "runs" / "diabetes" / "mfg" / "split0.json").read_text())["row"]
        for folder in ("calibrated", "plain")
    )
    assert row["noise_factor"] == expected and row["learned_noise_weight"] == keep
    shift = math.log(data.y_scale)
    assert row["calibration_mnll"] == pytest.approx([learned + shift, calibrated + shift], rel=1e-9)
    assert row["rmse"] == plain["rmse"] and row["final_loss"] == plain["final_loss"]
    assert row["noise_scale"] == pytest.approx(plain["noise_scale"] * expected, rel=1e-6)
    # The row's MNLL is the mixture's: the full fit's samples (trained again: the same draws) with both noises.
    full = uci.train_split("diabetes", mfg, 0, config, data=data)
    f_test, noise_test = uci.predict_split(full, data.x_test, config)
    mixture = gaussian_mnll(f_test, torch.stack([noise_test * expected, noise_test]), data.y_test, (1 - keep, keep))
    assert row["mnll"] == pytest.approx(mixture + shift, rel=1e-9)
    assert plain["mnll"] == pytest.approx(gaussian_mnll(f_test, noise_test, data.y_test) + shift, rel=1e-9)
    assert row["mnll"] != plain["mnll"]
    assert row["learned_noise_mnll"] == pytest.approx(plain["mnll"], rel=1e-12)  # what the calibration changed
    assert row["train_seconds"] > row["calibration_seconds"] > 0
    assert not list((tmp_path / "calibrated" / "runs").rglob("*.calibration.json"))
    text = (tmp_path / "calibrated" / "uci_diabetes.md").read_text()
    assert f"learned noise; the factor of the rest): mfg: {expected:.3g}" in text
    assert "calibrated" not in (tmp_path / "plain" / "uci_diabetes.md").read_text()

    store = tmp_path / "split0.calibration.json"
    first = calibrate_noise("diabetes", mfg, 0, config, data, store=store)
    assert first["noise_factor"] == expected and store.exists() and not list(tmp_path.glob("*.ckpt"))
    monkeypatch.setattr(noise_calibration, "train_split", lambda *a, **k: pytest.fail("trained a stored calibration"))
    assert calibrate_noise("diabetes", mfg, 0, config, data, store=store) == first
    with pytest.raises(ValueError, match="classification"):
        calibrate_noise("digits", mfg, 0, config, load_dataset_split("digits", 0))


def test_a_chosen_candidates_fit_is_calibrated_without_training_it_again(monkeypatch):
    """With candidates to choose from (MC dropout's rates) the held-out fit the calibration needs is the chosen
    candidate's, on the same rows: the row's calibration is what training that fit again gives (to the float32
    predictive's precision), no fit is trained for it, and its seconds are the choice's (0 in the row)."""
    mcd = parse_method("mcd")
    config = _config(methods=("mcd",), dropout=(0.005, 0.3), calibrate_noise=True)
    data = load_dataset_split("diabetes", 0)
    label, chosen, *_ = uci.choose_settings("diabetes", mcd, 0, config.for_method("mcd"), None, data)
    trained_again = calibrate_noise("diabetes", mcd, 0, chosen, data, label)
    assert trained_again["calibration_seconds"] > 0 and trained_again["noise_factor"] != 1.0
    monkeypatch.setattr(noise_calibration, "train_split", lambda *a, **k: pytest.fail("trained the fit again"))
    row, _ = uci.run_split("diabetes", mcd, 0, config, data=data)
    assert row["dropout"] == chosen.dropout and row["calibration_seconds"] == 0.0
    assert row["noise_factor"] == trained_again["noise_factor"]
    assert row["learned_noise_weight"] == trained_again["learned_noise_weight"]
    assert row["calibration_mnll"] == pytest.approx(trained_again["calibration_mnll"], rel=1e-6)
    assert row["calibration_mnll"][0] == pytest.approx(row["validation_scores"][label], rel=1e-6)
    assert row["train_seconds"] > row["selection_seconds"] > 0


def test_calibrating_is_fingerprinted_and_checked_before_training(tmp_path, capsys):
    """Stored results without the flag stay valid (the same fingerprint as before it existed); with it the
    fingerprint differs and reads ``val_fraction``; it needs one process, a regression set and enough rows."""
    assert UCIConfig().fingerprint("whvi", "k") == "285c3fb58e99d90f"  # the hash before the flag existed
    assert UCIConfig(calibrate_noise=True).fingerprint("whvi", "k") != "285c3fb58e99d90f"
    config = _config()
    calibrating = replace(config, calibrate_noise=True)
    assert calibrating.fingerprint("mfg") != config.fingerprint("mfg")
    assert config.fingerprint("mfg") == replace(config, val_fraction=0.3).fingerprint("mfg")
    assert calibrating.fingerprint("mfg") != replace(calibrating, val_fraction=0.3).fingerprint("mfg")
    with pytest.raises(
        ValueError, match=r"calibrate_noise runs in one process; give nproc 1 \(or no --calibrate-noise\)"
    ):
        replace(calibrating, nproc=2)
    with pytest.raises(ValueError, match="val_fraction in"):
        replace(calibrating, val_fraction=1.0)
    from pyro_whvi.experiments.cli import main

    args = ["uci", "--splits", "0", "--calibrate-noise", "--out", str(tmp_path / "cli")]
    for bad, message in (
        (["--dataset", "digits"], "--calibrate-noise calibrates a regression likelihood's noise; digits is a"),
        (["--dataset", "diabetes", "--val-fraction", "0.001"], "or hold no rows out"),
        (["--dataset", "diabetes", "--nproc", "2"], "runs in one process; give nproc 1"),
    ):
        with pytest.raises(SystemExit) as exit_code:
            main([*args, *bad])
        assert exit_code.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()
