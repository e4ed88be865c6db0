"""``--calibrate-noise`` under ``--likelihood by-residuals`` (WHVI's default from 3,000 training rows): the noise is
calibrated where the split chooses the mean-variance head, on a held-out fit of the head, or keeps one noise scale
whose spread share reaches :data:`SPREAD_SHARE_THRESHOLD`, on a held-out fit of one scale; the split's own trainings
and draws are those of the run without the flag."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pyro_whvi.experiments import auto_calibration as calibration_rule
from pyro_whvi.experiments import uci
from pyro_whvi.experiments.auto_calibration import auto_calibration
from pyro_whvi.experiments.methods import parse_method
from pyro_whvi.experiments.noise_calibration import calibrate_noise
from pyro_whvi.experiments.uci_config import BY_RESIDUALS, UCIConfig
from pyro_whvi.experiments.uci_data import load_dataset_split
from pyro_whvi.experiments.uci_protocols import AUTO_WIDE_FROM_ROWS

from .test_likelihood_choice import CONFIG, SETS, _write_line

CALIBRATING = replace(CONFIG, calibrate_noise=True, val_fraction=0.25)


def _row(out) -> dict:
    return uci.read_saved(out / "runs" / "line" / "whvi" / "split0.json")["row"]


@pytest.mark.slow  # two short trainings
def test_one_noise_scale_below_the_spread_share_is_not_calibrated(tmp_path, monkeypatch):
    source = _write_line(tmp_path / "line", SETS["one level"])
    plain, _ = uci.run_uci(source, CONFIG, tmp_path / "plain", check=False)
    share = _row(tmp_path / "plain")["spread_share"]
    monkeypatch.setattr(calibration_rule, "SPREAD_SHARE_THRESHOLD", share * 1.01)
    monkeypatch.setattr(uci, "calibrate_noise", lambda *a, **k: pytest.fail("calibrated one noise scale"))
    rows, _ = uci.run_uci(source, CALIBRATING, tmp_path / "out", check=False)
    row = _row(tmp_path / "out")
    assert row["likelihood"] == "gaussian" and "noise_factor" not in row and row["spread_share"] == share
    assert (rows[0]["rmse"], rows[0]["mnll"]) == (plain[0]["rmse"], plain[0]["mnll"])
    text = (tmp_path / "out" / "uci_line.md").read_text()
    assert "– where the split kept one noise scale uncalibrated, under by-residuals): whvi: –" in text


@pytest.mark.slow  # four short trainings
def test_one_noise_scale_from_the_spread_share_is_calibrated_on_a_held_out_fit_of_one_scale(tmp_path, monkeypatch):
    source = _write_line(tmp_path / "line", SETS["one level"])
    uci.run_uci(source, CONFIG, tmp_path / "plain", check=False)
    plain_row = _row(tmp_path / "plain")
    monkeypatch.setattr(calibration_rule, "SPREAD_SHARE_THRESHOLD", plain_row["spread_share"])  # reached: >=
    uci.run_uci(source, CALIBRATING, tmp_path / "out", check=False)
    row = _row(tmp_path / "out")
    assert row["likelihood"] == plain_row["likelihood"] == "gaussian"
    # The split's training and its test draws are the run's without the flag: the held-out fit trained after it
    # leaves the random state as it found it.
    assert row["rmse"] == plain_row["rmse"] and row["final_loss"] == plain_row["final_loss"]
    assert row["learned_noise_mnll"] == pytest.approx(plain_row["mnll"], rel=1e-12)
    # The factor is that of one noise scale trained on the fit part, as --likelihood gaussian calibrates it.
    one_scale = replace(CALIBRATING, likelihood="gaussian")
    direct = calibrate_noise(source, parse_method("whvi"), 0, one_scale, load_dataset_split(source, 0))
    assert row["noise_factor"] == direct["noise_factor"] != 1.0 and row["calibration_seconds"] > 0
    assert row["mnll"] != plain_row["mnll"]
    assert f"the factor of the rest): whvi: {row['noise_factor']:.3g}" in (tmp_path / "out" / "uci_line.md").read_text()


@pytest.mark.slow  # six short trainings
def test_the_head_chosen_is_calibrated_on_a_held_out_fit_of_the_head(tmp_path):
    source = _write_line(tmp_path / "line", SETS["two levels"])
    uci.run_uci(source, CONFIG, tmp_path / "plain", check=False)
    uci.run_uci(source, CALIBRATING, tmp_path / "out", check=False)
    row, plain_row = _row(tmp_path / "out"), _row(tmp_path / "plain")
    assert row["likelihood"] == plain_row["likelihood"] == "heteroscedastic"
    # The head's own training and draws are the run's without the flag: the same fit, the learned noise's MNLL.
    assert row["rmse"] == plain_row["rmse"] and row["final_loss"] == plain_row["final_loss"]
    assert row["learned_noise_mnll"] == pytest.approx(plain_row["mnll"], rel=1e-12)
    assert row["mnll"] != plain_row["mnll"]
    # The factor is that of the head trained on the fit part, as --likelihood heteroscedastic calibrates it.
    head = replace(CALIBRATING, likelihood="heteroscedastic")
    direct = calibrate_noise(source, parse_method("whvi"), 0, head, load_dataset_split(source, 0))
    assert row["noise_factor"] == direct["noise_factor"] != 1.0
    assert row["train_seconds"] > row["calibration_seconds"] > 0
    assert f"the factor of the rest): whvi: {row['noise_factor']:.3g}" in (tmp_path / "out" / "uci_line.md").read_text()
    with pytest.raises(ValueError, match=r"calibrate_noise: the likelihood chosen .* expected, got 'by-residuals'"):
        calibrate_noise(source, parse_method("whvi"), 0, CALIBRATING, load_dataset_split(source, 0))


def test_auto_calibrates_from_3000_rows_where_the_likelihood_is_chosen_on_the_residuals():
    at = AUTO_WIDE_FROM_ROWS
    assert auto_calibration("auto", at, likelihood=BY_RESIDUALS)
    for likelihood in ("gaussian", "heteroscedastic"):  # one scale, or the head on every split: not measured
        assert not auto_calibration("auto", at, likelihood=likelihood)
    assert not auto_calibration("table3", at, likelihood=BY_RESIDUALS)
    assert not auto_calibration("auto", at, "mcd", likelihood=BY_RESIDUALS)
    config = UCIConfig.from_protocol(
        "auto", "robot", train_rows=at, methods=("whvi", "mcd"), likelihood="auto", calibrate_noise="auto"
    )
    assert config.likelihood_of("whvi") == BY_RESIDUALS and config.calibrates("whvi") and not config.calibrates("mcd")
    where = "noise calibrated on held-out rows for whvi (where a split chooses the mean-variance head, or keeps one "
    where += f"noise scale with a spread share of {calibration_rule.SPREAD_SHARE_THRESHOLD} or more)"
    assert where in config.protocol
    given = UCIConfig.from_protocol("auto", "robot", train_rows=at, likelihood="gaussian", calibrate_noise="auto")
    assert not any(map(given.calibrates, given.methods))
    # Calibrating every split under by-residuals (before 2026-12-06), or only where the head is chosen (until
    # the spread share), is another setting: its stores are not read back.
    fingerprint = UCIConfig(likelihood=BY_RESIDUALS, calibrate_noise=True).fingerprint("whvi", "k")
    assert fingerprint not in ("f63bc485426ef5be", "d6fa06f9620e9bd4")
    assert UCIConfig(calibrate_noise=True).fingerprint("whvi", "k") == "0e9ea7023b62c741"  # one scale: unchanged
