"""``whvi uci --calibrate-noise auto``: the noise calibrated on held-out rows for WHVI and MC dropout below 3,000
training rows (from there for WHVI where a split chooses the head: ``test_head_calibration.py``) under
``--protocol auto`` (:mod:`pyro_whvi.experiments.auto_calibration`), resolved per method into
:class:`~pyro_whvi.experiments.uci_config.UCIConfig` and fingerprinted as the setting it resolves to."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pyro_whvi.experiments import uci
from pyro_whvi.experiments.auto_calibration import auto_calibration
from pyro_whvi.experiments.methods import Schedule
from pyro_whvi.experiments.uci import UCIConfig, run_uci
from pyro_whvi.experiments.uci_protocols import AUTO_WIDE_FROM_ROWS


def test_the_rule_calibrates_whvi_and_mc_dropout_below_the_rows_under_the_auto_protocol():
    below, at = AUTO_WIDE_FROM_ROWS - 1, AUTO_WIDE_FROM_ROWS
    for base in ("whvi", "mcd"):
        assert auto_calibration("auto", below, base) and auto_calibration("auto", 1, base)
        assert not auto_calibration("auto", at, base)  # one noise scale from here gains nothing
        assert not auto_calibration("table3", below, base)  # a fixed protocol keeps the paper's predictive
        assert not auto_calibration("", below, base)  # several protocols chosen on held-out rows
        assert not auto_calibration("auto", below, base, iblm=True)
        assert not auto_calibration("auto", below, base, nproc=2)  # the held-out fit is not data-parallel
    for base in ("mfg", "nf-whvi", "whvi-full", "ensemble"):  # not measured with it
        assert not auto_calibration("auto", below, base)
    for rows in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="auto_calibration: a positive number of training rows"):
            auto_calibration("auto", rows)


def _auto(
    train_rows: int, calibrate: str = "auto", methods=("whvi", "mcd", "mfg"), protocol="auto", **fields
) -> UCIConfig:
    return UCIConfig.from_protocol(
        protocol, "yacht", train_rows=train_rows, methods=methods, calibrate_noise=calibrate, **fields
    )


def test_auto_resolves_per_method_and_keeps_every_other_methods_fingerprint():
    """Under ``auto`` WHVI's fingerprint is the flag's (``on``: runs made with ``--calibrate-noise`` are read back) and
    every other method's is that of a run without it (``off``: their stored splits stay valid, ``val_fraction``
    not read); from 3,000 rows, under a fixed protocol and in several processes ``auto`` is ``off``."""
    auto, on, off = _auto(277), _auto(277, "on"), _auto(277, "off")
    assert auto.calibrates("whvi") and auto.calibrates("mcd") and not auto.calibrates("mfg")
    assert (on.calibrates("mfg"), off.calibrates("whvi"), off.calibrates("mcd")) == (True, False, False)
    assert auto.holding_out and auto.for_method("mcd").holding_out and not auto.for_method("mfg").holding_out
    for method in ("whvi", "mcd"):
        assert auto.fingerprint(method, "k") == on.fingerprint(method, "k") != off.fingerprint(method, "k")
        assert auto.fingerprint(method, "k") != replace(auto, val_fraction=0.3).fingerprint(method, "k")
    assert auto.fingerprint("mfg", "k") == off.fingerprint("mfg", "k") != on.fingerprint("mfg", "k")
    assert auto.fingerprint("mfg", "k") == replace(auto, val_fraction=0.3).fingerprint("mfg", "k")
    assert "noise calibrated on held-out rows for whvi, mcd (below 3,000 rows); not for mfg" in auto.protocol
    assert "calibrated" not in off.protocol and "calibrated" not in _auto(AUTO_WIDE_FROM_ROWS).protocol
    for other in (_auto(AUTO_WIDE_FROM_ROWS), _auto(277, protocol="table3"), _auto(277, nproc=2)):
        assert not any(map(other.calibrates, other.methods)) and not other.holding_out, other.protocol
    big = _auto(AUTO_WIDE_FROM_ROWS, methods=("whvi",))
    assert big.fingerprint("whvi", "k") == _auto(AUTO_WIDE_FROM_ROWS, "off", methods=("whvi",)).fingerprint("whvi", "k")
    with pytest.raises(ValueError, match="--calibrate-noise: one of auto, on, off expected, got 'yes'"):
        _auto(277, "yes")
    with pytest.raises(TypeError, match="calibrate_noise 'auto' needs train_rows"):
        UCIConfig.from_protocol("table3", "yacht", calibrate_noise="auto")
    with pytest.raises(ValueError, match=r"calibrate_noise must be True or False, got 'auto' \(from_protocol takes"):
        UCIConfig(calibrate_noise="auto")
    with pytest.raises(ValueError, match="method_calibrations names 'mfg', not one of methods"):
        UCIConfig(methods=("whvi",), method_calibrations=(("mfg", True),))


@pytest.mark.slow  # two short trainings and a calibration
def test_a_run_calibrates_the_methods_auto_names_and_reads_the_others_back(tmp_path, monkeypatch):
    """A run where only WHVI calibrates: WHVI's row has its factor, MFG's is read back from a run without the
    flag in the same folder (the same fingerprint: not trained again) and the table names WHVI's factor alone."""
    schedule = Schedule(steps=40, fixed_noise_steps=10, batch_size=16, lr=0.05)
    plain = UCIConfig(
        methods=("mfg", "whvi"), splits=(0,), schedule=schedule, hidden=8, samples=8, val_fraction=0.25, progress=False
    )
    run_uci("diabetes", plain, tmp_path)
    stored = json.loads((tmp_path / "runs" / "diabetes" / "mfg" / "split0.json").read_text())
    trained = uci.train_split

    def whvi_alone(source, spec, *args, **kwargs):
        assert spec.name != "mfg", "mfg trained again: its stored split should have been read"
        return trained(source, spec, *args, **kwargs)

    monkeypatch.setattr(uci, "train_split", whvi_alone)
    calibrating = replace(plain, method_calibrations=(("whvi", True),))
    _, text = run_uci("diabetes", calibrating, tmp_path)
    whvi, mfg = (json.loads((tmp_path / "runs" / "diabetes" / m / "split0.json").read_text()) for m in ("whvi", "mfg"))
    assert "noise_factor" in whvi["row"] and mfg == stored
    assert f"factor of the rest): whvi: {whvi['row']['noise_factor']:.3g}" in text and "mfg: " not in text


def test_the_command_takes_auto_on_and_off_and_turns_auto_off_for_classification(tmp_path, uci_configs):
    """``--calibrate-noise`` alone is ``on``; without it ``auto``, which resolves by the rows, per method, and on a
    classification set is ``off`` (where ``on`` is refused)."""
    from pyro_whvi.experiments.cli import main

    configs = uci_configs
    args = ["uci", "--methods", "whvi,mcd,mfg", "--splits", "0", "--out", str(tmp_path)]
    for extra in ([], ["--calibrate-noise"], ["--calibrate-noise", "auto"], ["--calibrate-noise", "off"]):
        assert main([*args, "--dataset", "diabetes", *extra]) == 0
    assert [(c.calibrates("whvi"), c.calibrates("mcd"), c.calibrates("mfg")) for c in configs] == [
        (True, True, False),  # the default: auto
        (True, True, True),
        (True, True, False),
        (False, False, False),
    ]
    assert main([*args, "--dataset", "digits"]) == 0  # auto, turned off for classification
    assert not any(map(configs[-1].calibrates, configs[-1].methods))
