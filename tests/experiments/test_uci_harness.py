"""The UCI harness (``pyro_whvi.experiments.uci``) and the method registry
(``pyro_whvi.experiments.methods``): every method through Pyro's SVI, the two-phase noise schedule, metrics
against direct computations, resuming."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pyro
import pytest
import torch

from pyro_whvi.data import load_uci_split
from pyro_whvi.experiments.methods import BASE_METHODS, Schedule, build_method, fit, parse_method, predictive_samples
from pyro_whvi.experiments.uci import UCIConfig, load_dataset_split, parse_splits, run_uci, summarize
from pyro_whvi.metrics import mean_and_standard_error

from ..helpers import run_python, write_uci

ALL_METHODS = [*BASE_METHODS, *(f"{m}+iblm" for m in BASE_METHODS if m != "mcd")]


def test_method_names_parse_with_specific_errors():
    assert parse_method("whvi+iblm").base == "whvi" and parse_method("whvi+iblm").iblm
    assert parse_method("vsd").name == "vsd"
    with pytest.raises(ValueError, match=r"unknown method 'bbb'.*mfg, mcd, whvi"):
        parse_method("bbb")
    with pytest.raises(ValueError, match="MC dropout has none"):
        parse_method("mcd+iblm")
    assert parse_splits("0-2,5") == (0, 1, 2, 5)
    for bad in ("", "a-b", "-1"):
        with pytest.raises(ValueError, match="splits must look like"):
            parse_splits(bad)
    with pytest.raises(ValueError, match="Schedule: steps"):
        Schedule(steps=0)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_trains_with_svi_and_predicts(method):
    x = torch.randn(40, 3)
    y = x[:, 0] - x[:, 1]
    model, guide = build_method(method, [3, 8, 8, 1])
    losses = fit(method, model, guide, x, y, Schedule(steps=30, fixed_noise_steps=5, batch_size=16), progress=False)
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    f = predictive_samples(model, guide, x[:7], num_samples=5)
    assert f.shape == (5, 7) and torch.isfinite(f).all()
    assert f.std(0).mean() > 0  # predictions vary across posterior (or dropout) samples


@pytest.mark.parametrize("method", ["whvi", "mcd", "vsd+iblm", "mfg+iblm"])
def test_classification_methods_predict_logits(method):
    x = torch.randn(30, 4)
    y = (x[:, 0] > 0).long()
    model, guide = build_method(method, [4, 8, 2], likelihood="categorical")
    fit(method, model, guide, x, y, Schedule(steps=5, batch_size=None), progress=False)
    logits = predictive_samples(model, guide, x, 3)
    assert logits.shape == (3, 30, 2) and torch.isfinite(logits).all()


def test_noise_is_fixed_in_the_first_phase_then_learned():
    x = torch.randn(50, 2)
    y = 3 * x[:, 0]
    model, guide = build_method("mfg", [2, 8, 1], noise_scale=0.1)
    fit("mfg", model, guide, x, y, Schedule(steps=20, fixed_noise_steps=20), progress=False)
    assert float(pyro.param("noise_scale").detach()) == pytest.approx(0.1, abs=1e-12)
    fit("mfg", model, guide, x, y, Schedule(steps=20, fixed_noise_steps=0, lr=0.05), progress=False)
    assert float(pyro.param("noise_scale").detach()) > 0.11  # a poor fit of y = 3 x_0 pushes the noise up


def test_mean_and_standard_error():
    mean, se = mean_and_standard_error([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3) and se == pytest.approx(statistics.stdev([1, 2, 4]) / math.sqrt(3))
    assert mean_and_standard_error([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError, match="no values"):
        mean_and_standard_error([])


def test_summary_is_mean_and_standard_error():
    rows = [
        {"method": "a", "variational_parameters": 3, "rmse": v, "mnll": 2 * v, "train_seconds": 1.0} for v in (1, 2, 4)
    ]
    (entry,) = summarize(rows, ("a",))
    assert entry["rmse"] == pytest.approx(7 / 3)
    assert entry["rmse_se"] == pytest.approx(torch.tensor([1.0, 2, 4]).std().item() / math.sqrt(3))
    assert entry["mnll"] == pytest.approx(14 / 3) and entry["splits"] == 3


def test_harness_reports_original_units_and_resumes(tmp_path):
    directory = tmp_path / "toyset"
    write_uci(directory, rows=60)
    config = UCIConfig(
        methods=("mcd", "whvi"),
        splits=(0, 1),
        schedule=Schedule(steps=40, batch_size=16),
        hidden=8,
        samples=4,
        progress=False,
    )
    summary, text = run_uci(directory, config, tmp_path / "out")
    assert [e["method"] for e in summary] == ["mcd", "whvi"] and "| whvi | 2 |" in text
    saved = json.loads((tmp_path / "out" / "uci_toyset.json").read_text())
    rows = saved["meta"]["splits"]
    assert sorted((r["method"], r["split"]) for r in rows) == [("mcd", 0), ("mcd", 1), ("whvi", 0), ("whvi", 1)]
    split = load_uci_split(directory, 0)
    assert rows[0]["noise_scale"] == pytest.approx(0.1 * split.y_std, rel=0.5)  # 40 steps barely move it
    run_file = tmp_path / "out" / "runs" / "toyset" / "whvi" / "split1.json"
    stored = json.loads(run_file.read_text())
    stored["row"]["rmse"] = 123.0  # a finished split is read back, not trained again
    run_file.write_text(json.dumps(stored))
    summary, _ = run_uci(directory, config, tmp_path / "out")
    assert summary[1]["rmse"] > 60
    changed = UCIConfig(
        methods=("whvi",), splits=(1,), schedule=Schedule(steps=41, batch_size=16), hidden=8, samples=4, progress=False
    )
    summary, _ = run_uci(directory, changed, tmp_path / "out")  # other settings: trained again
    assert summary[0]["rmse"] < 60


def test_raw_targets_train_in_original_units_and_keep_stored_results_valid(tmp_path):
    """``standardize_targets=False`` (``--raw-targets``, the WHVI paper's choice) feeds the targets in their
    original units and is its own fingerprint; the default's fingerprint is the one computed before the setting
    existed (the hash below), so results stored then are still read back."""
    standardized = load_dataset_split("diabetes", 0)
    raw = load_dataset_split("diabetes", 0, standardize_targets=False)
    assert raw.y_scale == 1.0 and torch.equal(raw.x_train, standardized.x_train)
    for z, y in ((standardized.y_train, raw.y_train), (standardized.y_test, raw.y_test)):
        torch.testing.assert_close((y - raw.y_train.mean()) / standardized.y_scale, z, rtol=0, atol=1e-5)
    assert raw.y_train.std() > 50  # diabetes' progression score, not a standardized one
    # The hash of engine version 3 (fused Adam and planar flows, the compiled ELBO by default; version 2's was
    # d1942b1a6ea48c04): later settings at their default must keep it.
    assert UCIConfig().fingerprint("whvi", "k") == "285c3fb58e99d90f"
    assert UCIConfig(standardize_targets=False).fingerprint("whvi", "k") != "285c3fb58e99d90f"
    from pyro_whvi.experiments.cli import main

    args = ["uci", "--dataset", "diabetes", "--methods", "mfg", "--splits", "0", "--steps", "3", "--samples", "4"]
    assert main([*args, "--raw-targets", "--noise-scale", "0.5", "--out", str(tmp_path)]) == 0
    assert "raw targets" in (tmp_path / "uci_diabetes.md").read_text()
    # 3 steps are all in the fixed-noise phase: the noise is still its initial value, in the raw units
    row = json.loads((tmp_path / "runs" / "diabetes" / "mfg" / "split0.json").read_text())["row"]
    assert row["noise_scale"] == pytest.approx(0.5)


def test_kl_weight_tempers_the_objective_of_every_method_and_keeps_stored_results_valid(tmp_path):
    """``kl_weight`` (``--kl-weight``) reaches the loss that trains each method: with the same seed the first
    step draws the same noise whatever the weight, so its loss is exactly ``A + w KL`` in ``w``. The default's
    fingerprint is the one from before the setting existed."""
    from pyro_whvi.experiments.uci import run_split

    assert UCIConfig(kl_weight=1.0).fingerprint("whvi", "k") == "285c3fb58e99d90f"
    assert UCIConfig(kl_weight=0.5).fingerprint("whvi", "k") != "285c3fb58e99d90f"
    # The same for the schedule's cool-down: none is the fingerprint from before it existed.
    assert UCIConfig(schedule=Schedule(cooldown=0.0)).fingerprint("whvi", "k") == "285c3fb58e99d90f"
    assert UCIConfig(schedule=Schedule(cooldown=0.2)).fingerprint("whvi", "k") != "285c3fb58e99d90f"
    with pytest.raises(ValueError, match="kl_weight > 0"):
        UCIConfig(kl_weight=0.0)
    for method in ("whvi", "mcd", "mfg"):
        loss = {}
        for weight in (1.0, 0.5, 0.25):
            config = UCIConfig(
                methods=(method,), splits=(0,), schedule=Schedule(steps=1, batch_size=16), hidden=8, samples=4,
                kl_weight=weight, progress=False,
            )  # fmt: skip
            loss[weight] = run_split("diabetes", parse_method(method), 0, config)[0]["final_loss"]
        kl = 2 * (loss[1.0] - loss[0.5])
        assert abs(kl) > 1.0, (method, loss)  # the latent part of the loss is not negligible here
        # float32 sums of a few thousand terms: agreement to 1e-5 of the loss
        assert loss[0.25] == pytest.approx(loss[0.5] - kl / 4, rel=1e-5, abs=1e-5 * abs(loss[1.0])), (method, loss)
    from pyro_whvi.experiments.cli import main

    args = ["uci", "--dataset", "diabetes", "--methods", "whvi", "--splits", "0", "--steps", "2", "--samples", "4"]
    assert main([*args, "--hidden", "8", "--kl-weight", "0.1", "--out", str(tmp_path)]) == 0
    assert "KL weight 0.1 (tempered)" in (tmp_path / "uci_diabetes.md").read_text()
    assert main([*args, "--hidden", "8", "--cooldown", "0.5", "--out", str(tmp_path / "cooled")]) == 0
    assert "lr 0.001 cooled down over the last 50% of steps" in (tmp_path / "cooled" / "uci_diabetes.md").read_text()
    stored = json.loads((tmp_path / "cooled" / "uci_diabetes.json").read_text())["meta"]["config"]["schedule"]
    assert stored["cooldown"] == 0.5


def test_several_kl_weights_are_chosen_on_validation_rows_then_trained_on_all(tmp_path, monkeypatch, capsys):
    """``--kl-weight 1,0.01``: each candidate is trained on the fit part of the training rows and scored on the
    held-out rest (the scores are those of training that candidate directly); the lowest validation MNLL wins
    (a NaN never does) and the split is trained on all its training rows with it. Finished candidates are read
    back, not trained again."""
    from pyro_whvi.experiments import uci, uci_train
    from pyro_whvi.experiments.uci_report import evaluate

    schedule = Schedule(steps=20, fixed_noise_steps=0, batch_size=16, lr=0.05)
    config = UCIConfig(
        methods=("mfg",), splits=(0,), schedule=schedule, hidden=8, samples=4, kl_weight=(1.0, 0.01),
        val_fraction=0.25, progress=False,
    )  # fmt: skip
    mfg = parse_method("mfg")
    data = load_dataset_split("diabetes", 0)
    part = uci.validation_part(data, 0.25, config.seed)
    assert len(part.y_test) == round(0.25 * len(data.y_train)) and len(part.y_train) + len(part.y_test) == len(
        data.y_train
    )
    rows = {tuple(r.tolist()) for r in torch.cat([part.x_train, part.x_test])}
    assert rows == {tuple(r.tolist()) for r in data.x_train}  # a partition of the training rows, no test row
    expected = {}
    for weight in (1.0, 0.01):
        trained = uci.train_split("diabetes", mfg, 0, config, kl_weight=weight, data=part)
        f = predictive_samples(trained.model, trained.guide, part.x_test, config.samples)
        expected[repr(weight)] = evaluate(part, f, trained.model.noise_scale.detach())["mnll"]
    assert abs(expected["1.0"] - expected["0.01"]) > 1e-3  # the weight matters here: the choice is not a tie
    store = tmp_path / "split0.validation.json"
    label, settings, scores, _, factors = uci.choose_settings("diabetes", mfg, 0, config, store)
    assert factors == {}  # choose_by 'score': no noise factors
    best = settings.kl_weight
    assert scores == pytest.approx(expected, rel=1e-6)
    assert label == repr(best) == min(expected, key=expected.__getitem__)
    assert settings == replace(config, kl_weight=best)
    # The stored scores decide without training: the lowest wins, a NaN never.
    monkeypatch.setattr(uci_train, "train_split", lambda *args, **kwargs: pytest.fail("trained a finished candidate"))
    stored = json.loads(store.read_text())
    cases = [
        ({"1.0": 5.0, "0.01": 3.0}, 0.01),
        ({"1.0": 2.0, "0.01": 3.0}, 1.0),
        ({"1.0": math.nan, "0.01": 9.0}, 0.01),
    ]
    for given, winner in cases:
        store.write_text(json.dumps({**stored, "scores": given}))
        assert uci.choose_settings("diabetes", mfg, 0, config, store)[1].kl_weight == winner
    monkeypatch.undo()
    with pytest.raises(ValueError, match="pass the one to train with as kl_weight"):
        uci.train_split("diabetes", mfg, 0, config)
    run_uci("diabetes", config, tmp_path)
    saved = json.loads((tmp_path / "runs" / "diabetes" / "mfg" / "split0.json").read_text())["row"]
    assert saved["kl_weight"] == best and saved["validation_scores"] == pytest.approx(scores, rel=1e-6)
    assert saved["train_seconds"] >= saved["selection_seconds"] > 0
    losses = {w: uci.train_split("diabetes", mfg, 0, config, kl_weight=w).losses for w in (1.0, 0.01)}
    assert saved["final_loss"] == pytest.approx(sum(losses[best]) / len(losses[best]), rel=1e-6)
    assert not list((tmp_path / "runs").rglob("*.validation.json")) and not list((tmp_path / "runs").rglob("*.ckpt"))
    text = (tmp_path / "uci_diabetes.md").read_text()
    assert "KL weight chosen from 1, 0.01 on 25% of each split's training rows" in text
    assert f"KL weight chosen per split on validation: mfg: {best:g}" in text
    # A chosen weight that is not the first is the one the split trains with.
    other = 1.0 if best == 0.01 else 0.01
    monkeypatch.setattr(
        uci, "choose_settings", lambda *args: (repr(other), replace(config, kl_weight=other), {}, 0.0, {})
    )
    row = uci.run_split("diabetes", mfg, 0, config)[0]
    assert row["kl_weight"] == other and row["final_loss"] == pytest.approx(sum(losses[other]) / 20, rel=1e-6)
    # One weight is a number, with the fingerprint it had before candidates existed; several need one process.
    assert UCIConfig(kl_weight=(0.5,)).kl_weight == 0.5 and UCIConfig(kl_weight=(0.5,)).fingerprint("whvi") == (
        UCIConfig(kl_weight=0.5, val_fraction=0.3).fingerprint("whvi")
    )
    assert UCIConfig(kl_weight=[1, 0.5]).kl_weight == (1.0, 0.5)  # as the results' JSON stores them
    assert config.fingerprint("mfg") != replace(config, val_fraction=0.3).fingerprint("mfg")
    with pytest.raises(ValueError, match="give nproc 1, or one candidate"):
        replace(config, nproc=2)
    with pytest.raises(ValueError, match="val_fraction in"):
        replace(config, val_fraction=1.0)
    from pyro_whvi.experiments.cli import main

    args = ["uci", "--dataset", "diabetes", "--splits", "0", "--out", str(tmp_path / "cli")]
    few = "--val-fraction) 0.001 of 398 training rows leaves 398 to train on and 0 to validate"
    for bad, message in (
        (["--cooldown", "1"], "--cooldown: a fraction of the steps in [0, 1)"),
        (["--kl-weight", "1,-0.1"], "--kl-weight"),
        (["--kl-weight", "1,0.1", "--val-fraction", "0.001"], few),
    ):
        with pytest.raises(SystemExit) as exit_code:
            main([*args, *bad])
        assert exit_code.value.code == 2 and message in capsys.readouterr().err


def test_several_protocols_are_chosen_per_split_on_validation_rows(tmp_path, monkeypatch, capsys):
    """``--protocol table6,table3``: each candidate network and schedule trains on the fit part of the split's
    training rows and is scored on the held-out part; the best trains on all of them, and the row and the table
    name it and every candidate's score (the same path as several KL weights, jointly with them)."""
    from pyro_whvi.experiments import uci, uci_train
    from pyro_whvi.experiments.cli import main
    from pyro_whvi.experiments.uci_config import protocol_settings
    from pyro_whvi.experiments.uci_report import evaluate

    config = UCIConfig.from_protocol(
        ("table6", "table3"), "diabetes", steps=20, fixed_noise_steps=0, batch_size=16, methods=("mfg",),
        splits=(0,), samples=4, val_fraction=0.25, progress=False,
    )  # fmt: skip
    assert [p["name"] for p in config.protocols] == ["table6", "table3"] and config.choosing
    assert (config.hidden, config.layers) == (50, 1)  # the config's own network is the first candidate's
    candidates = dict(config.candidates())
    assert list(candidates) == ["table6", "table3"]
    assert (candidates["table3"].hidden, candidates["table3"].layers, candidates["table3"].protocols) == (128, 2, ())
    assert candidates["table3"].schedule == replace(config.schedule, steps=20, lr=1e-3)
    mfg = parse_method("mfg")
    part = uci.validation_part(load_dataset_split("diabetes", 0), 0.25, config.seed)
    expected = {}
    for label, settings in candidates.items():
        trained = uci.train_split("diabetes", mfg, 0, settings, data=part)
        f = predictive_samples(trained.model, trained.guide, part.x_test, settings.samples)
        expected[label] = evaluate(part, f, trained.model.noise_scale.detach())["mnll"]
    store = tmp_path / "split0.validation.json"
    label, settings, scores, seconds, _ = uci.choose_settings("diabetes", mfg, 0, config, store)
    assert scores == pytest.approx(expected, rel=1e-6) and label == min(expected, key=expected.__getitem__)
    assert settings == candidates[label] and seconds > 0
    # The stored scores decide without training; the one chosen, first or not, is what the split trains with.
    monkeypatch.setattr(uci_train, "train_split", lambda *args, **kwargs: pytest.fail("trained a finished candidate"))
    stored = json.loads(store.read_text())
    for given, winner in (({"table6": 5.0, "table3": 3.0}, "table3"), ({"table6": 2.0, "table3": 3.0}, "table6")):
        store.write_text(json.dumps({**stored, "scores": given}))
        assert uci.choose_settings("diabetes", mfg, 0, config, store)[0] == winner
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"config\.protocols holds 2 candidates"):
        uci.train_split("diabetes", mfg, 0, config)
    for winner in ("table6", "table3"):
        monkeypatch.setattr(uci, "choose_settings", lambda *args, w=winner: (w, candidates[w], {}, 0.0, {}))
        row = uci.run_split("diabetes", mfg, 0, config)[0]
        trained = uci.train_split("diabetes", mfg, 0, candidates[winner])
        assert row["protocol"] == winner and row["hidden"] == candidates[winner].hidden
        assert row["variational_parameters"] == sum(p.numel() for p in trained.guide.parameters())
        assert row["final_loss"] == pytest.approx(sum(trained.losses) / 20, rel=1e-6)
    monkeypatch.undo()
    run_uci("diabetes", config, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "runs" / "diabetes" / "mfg" / "split0.json").read_text())["row"]
    assert saved["protocol"] == label and saved["validation_scores"] == pytest.approx(scores, rel=1e-6)
    network = protocol_settings(label, "diabetes", steps=20)
    keys = ("layers", "hidden", "steps", "lr")
    assert {k: saved[k] for k in keys} == {k: network[k] for k in keys}
    text = (tmp_path / "run" / "uci_diabetes.md").read_text()
    assert (
        "protocol chosen per split from table6 (1x50, 20 steps, lr 0.001), table3 (2x128, 20 steps, lr 0.001) on "
        "25% of each split's training rows" in text
    )
    assert f"Protocol chosen per split on validation: mfg: {label}" in text
    # Several KL weights too: every (protocol, weight) pair is a candidate.
    both = replace(config, kl_weight=(1.0, 0.1))
    assert [each for each, _ in both.candidates()] == ["table6:kl1.0", "table6:kl0.1", "table3:kl1.0", "table3:kl0.1"]
    # Candidates enter the fingerprint; one protocol is the plain config, fingerprint included.
    plain = UCIConfig.from_protocol(("table3",), "diabetes")
    assert plain.protocols == () and plain == UCIConfig.from_protocol("table3", "diabetes")
    assert replace(plain, schedule=UCIConfig().schedule).fingerprint("whvi", "k") == "285c3fb58e99d90f"
    assert config.fingerprint("mfg") != replace(config, protocols=()).fingerprint("mfg")
    with pytest.raises(ValueError, match="give nproc 1, or one candidate"):
        replace(config, nproc=2)
    args = ["uci", "--dataset", "diabetes", "--methods", "mfg", "--splits", "0", "--samples", "4"]
    assert main([*args, "--protocol", "table6,table3", "--steps", "3", "--out", str(tmp_path / "cli")]) == 0
    assert "protocol chosen per split from table6" in (tmp_path / "cli" / "uci_diabetes.md").read_text()
    capsys.readouterr()
    for bad, message in (
        (
            "table3,table9",
            "auto alone, or one of table3, table6, narrow, wide, deep, or several of them separated by commas",
        ),
        ("", "auto alone, or one of table3, table6, narrow, wide"),
        ("auto,wide", "auto alone"),
    ):
        with pytest.raises(SystemExit) as exit_code:
            main([*args, "--protocol", bad, "--out", str(tmp_path / "bad")])
        assert exit_code.value.code == 2 and message in capsys.readouterr().err


def test_auto_protocol_picks_table3_or_a_larger_network_by_the_training_rows(tmp_path, monkeypatch):
    """``--protocol auto``, the default: ``table3`` below AUTO_WIDE_FROM_ROWS training rows; from it ``wide`` for
    the WHVI family (WIDE_METHODS, O(D) variational parameters a layer), ``deep`` for WHVI from AUTO_DEEP_FROM_ROWS,
    and ``table3`` still for the dense-weight methods.
    Each method's choice is its fixed protocol's run (same settings and fingerprint, so stored results stay valid),
    also in a run that mixes them, and the table says which protocol the rows gave and which methods kept table3."""
    from pyro_whvi.experiments import uci_protocols
    from pyro_whvi.experiments.cli import main
    from pyro_whvi.experiments.methods import METHODS
    from pyro_whvi.experiments.uci_config import AUTO_DEEP_FROM_ROWS, AUTO_WIDE_FROM_ROWS, auto_protocol

    assert (AUTO_WIDE_FROM_ROWS, AUTO_DEEP_FROM_ROWS) == (3_000, 6_000)
    sizes = (1, 2_999, 3_000, 5_999, 6_000, 45_000)
    assert [auto_protocol(n) for n in sizes] == ["table3", "table3", "wide", "wide", "deep", "deep"]
    large = {base: auto_protocol(45_000, base) for base in METHODS if auto_protocol(45_000, base) != "table3"}
    assert large == {"whvi": "deep", "nf-whvi": "wide", "whvi-lowrank": "wide"}
    assert set(uci_protocols.WIDE_METHODS) == set(large) and uci_protocols.DEEP_METHODS == ("whvi",)
    assert {auto_protocol(5_999, base) for base in large} == {"wide"}
    assert {auto_protocol(2_999, base) for base in METHODS} == {"table3"}
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="positive number of training rows"):
            auto_protocol(bad)
    for rows, name in ((2_999, "table3"), (3_000, "wide"), (6_000, "deep")):
        auto = UCIConfig.from_protocol("auto", "kin8nm", train_rows=rows, steps=7, methods=("whvi",))
        fixed = UCIConfig.from_protocol(name, "kin8nm", steps=7, methods=("whvi",))
        assert replace(auto, protocol="") == replace(fixed, protocol="")
        assert auto.fingerprint("whvi", "k") == fixed.fingerprint("whvi", "k")
        assert auto.protocol == f"auto: {name} ({rows:,} training rows; wide from 3,000, deep from 6,000)"
        assert fixed.protocol == name
    default = UCIConfig.from_protocol("auto", "kin8nm", train_rows=7_373)  # mfg, mcd, whvi
    assert (default.layers, default.hidden, default.schedule.steps, default.schedule.lr) == (3, 1024, 50_500, 3e-3)
    assert default.schedule.cooldown == 0.2
    assert [method for method, _ in default.method_protocols] == ["mfg", "mcd"]
    for method, name in (("mfg", "table3"), ("mcd", "table3"), ("whvi", "deep")):
        fixed = UCIConfig.from_protocol(name, "kin8nm", methods=(method,))
        own = default.for_method(method)
        assert (own.layers, own.hidden, own.schedule) == (fixed.layers, fixed.hidden, fixed.schedule), method
        assert default.fingerprint(method, "k") == fixed.fingerprint(method, "k"), method
    assert default.protocol == (
        "auto: deep (7,373 training rows; wide from 3,000, deep from 6,000); table3 for mfg, mcd, as wide was worse "
        "than table3 for MC dropout and MFG"
    )
    # NF-WHVI keeps wide beside WHVI's deep, with its own schedule (no cool-down); the header says why.
    flows = UCIConfig.from_protocol("auto", "kin8nm", train_rows=7_373, methods=("whvi", "nf-whvi"))
    fixed = UCIConfig.from_protocol("wide", "kin8nm", methods=("nf-whvi",))
    assert flows.fingerprint("nf-whvi", "k") == fixed.fingerprint("nf-whvi", "k")
    assert flows.for_method("nf-whvi").schedule.cooldown == 0.0 and flows.for_method("whvi").layers == 3
    assert flows.protocol == (
        "auto: deep (7,373 training rows; wide from 3,000, deep from 6,000); wide for nf-whvi, as deep is not "
        "measured with nf-whvi"
    )
    alone = UCIConfig.from_protocol("auto", "kin8nm", train_rows=7_373, methods=("mcd", "vsd"))
    assert (alone.hidden, alone.method_protocols) == (128, ())  # no WHVI in the run: table3 is the run's
    assert alone.protocol == (
        "auto: table3 (7,373 training rows; wide from 3,000, deep from 6,000); table3 for mcd, vsd, as wide was "
        "worse than table3 for MC dropout and MFG and is not measured with vsd"
    )
    with pytest.raises(TypeError, match="needs train_rows"):
        UCIConfig.from_protocol("auto", "kin8nm")
    with pytest.raises(ValueError, match="give it alone"):
        UCIConfig.from_protocol(("auto", "wide"), "kin8nm", train_rows=10)
    table3 = dict(default.method_protocols)["mcd"]
    with pytest.raises(ValueError, match=r"method_protocols names 'vsd', which is not in methods \('mcd', 'whvi'\)"):
        UCIConfig(methods=("mcd", "whvi"), method_protocols=(("vsd", table3),))
    with pytest.raises(ValueError, match="gives every method its own protocol, so none chooses among protocols"):
        UCIConfig(methods=("mcd",), method_protocols=(("mcd", table3),), protocols=({**table3, "name": "a"},))
    with pytest.raises(ValueError, match="each protocol needs exactly the keys"):
        UCIConfig(methods=("mcd",), method_protocols=(("mcd", {"hidden": 3}),))
    # The command's default: diabetes has 398 training rows, so table3; with the threshold below them, wide.
    args = ["uci", "--dataset", "diabetes", "--methods", "mfg", "--splits", "0", "--samples", "4", "--steps", "3"]
    assert main([*args, "--out", str(tmp_path / "small")]) == 0
    header = (tmp_path / "small" / "uci_diabetes.md").read_text()
    assert "protocol auto: table3 (398 training rows; wide from 3,000, deep from 6,000), 2x128 ReLU" in header
    stored = tmp_path / "small" / "runs" / "diabetes" / "mfg" / "split0.json"
    first = json.loads(stored.read_text())
    assert main([*args, "--protocol", "table3", "--out", str(tmp_path / "small")]) == 0  # read back, not retrained
    assert json.loads(stored.read_text()) == first
    assert "heteroscedastic" not in header  # the paper's likelihood below the threshold
    monkeypatch.setattr(uci_protocols, "AUTO_WIDE_FROM_ROWS", 300)
    monkeypatch.setattr(uci_protocols, "AUTO_DEEP_FROM_ROWS", 350)
    args[4] = "mfg,whvi"
    assert main([*args, "--out", str(tmp_path / "small")]) == 0
    assert json.loads(stored.read_text()) == first  # MFG keeps table3 beside a deep WHVI: read back again
    header = (tmp_path / "small" / "uci_diabetes.md").read_text()
    # --likelihood auto gives WHVI the choice on the residuals with deep, but not MFG, and the header says why
    notes = (
        "table3 for mfg, as wide was worse than table3 for MC dropout and MFG; one noise scale for mfg, as a "
        "mean-variance head broke MFG at wide and is not measured with it at table3"
    )
    calibrated = (  # and the calibration, which by-residuals gives the head and a wide one noise scale
        "; noise calibrated on held-out rows for whvi (where a split chooses the mean-variance head, or keeps one "
        "noise scale with a spread share of 0.1 or more); not for mfg, as the calibration is not measured with mfg"
    )
    assert (
        f"protocol auto: deep (398 training rows; wide from 300, deep from 350); {notes}{calibrated}, 3x1024" in header
    )
    saved = json.loads((tmp_path / "small" / "uci_diabetes.json").read_text())
    parameters = {row["method"]: row["variational_parameters"] for row in saved["meta"]["splits"]}
    assert parameters["mfg"] == first["row"]["variational_parameters"] < 1024**2  # 2 x 128 (2 x 1024: over 1M)


def test_the_memory_check_sizes_each_method_by_its_own_protocol():
    """A method with its own network (``method_protocols``, as ``--protocol auto`` gives MFG and MC dropout) is
    checked with it, not with the run's: here MFG's is far larger than the run's 2 x 128."""
    from pyro_whvi.experiments.memory_checks import check_uci_memory
    from pyro_whvi.experiments.uci_data import SplitSizes

    sizes = SplitSizes(train=18_000, test=2_000, features=8, outputs=1)
    large = {"name": "large", "layers": 2, "hidden": 4096, "steps": 50_500, "lr": 1e-3}
    config = UCIConfig.from_protocol("table3", "robot", methods=("mfg", "whvi"))
    mixed = replace(config, method_protocols=(("mfg", large),))

    def smallest_fitting(config):  # the fewest bytes the check lets the run train in
        low, high = 1, 2**42
        while low < high:
            middle = (low + high) // 2
            try:
                check_uci_memory(config, sizes, available=middle)
                high = middle
            except ValueError:
                low = middle + 1
        return low

    own = [smallest_fitting(mixed.for_method(method)) for method in mixed.methods]
    assert smallest_fitting(mixed) == max(own) > 4 * smallest_fitting(config)
    with pytest.raises(ValueError, match="--hidden 4096"):
        check_uci_memory(mixed, sizes, available=smallest_fitting(config))


def test_bundled_sets_load_for_both_tasks():
    diabetes = load_dataset_split("diabetes", 0)
    assert diabetes.task == "regression" and diabetes.y_scale > 1
    digits = load_dataset_split("digits", 1)
    assert digits.task == "classification" and digits.num_classes == 10
    cancer = load_dataset_split("breast_cancer", 0)
    assert cancer.num_classes == 2 and cancer.x_train.shape[1] == 30


@pytest.mark.slow
def test_cli_uci_on_a_bundled_classification_set(tmp_path):
    code = (
        "import sys; from pyro_whvi.experiments.cli import main; "
        f"sys.exit(main(['uci', '--dataset', 'breast_cancer', '--methods', 'whvi,mfg', '--splits', '0', "
        f"'--steps', '20', '--hidden', '8', '--samples', '4', '--out', {str(tmp_path)!r}]))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test ECE" in result.stdout and (tmp_path / "uci_breast_cancer.csv").is_file()
    assert (tmp_path / "uci_breast_cancer_reliability.png").is_file()
    for args, message in (
        (["uci", "--data-dir", str(tmp_path / "missing")], "is not a UCI split directory"),
        (["uci", "--methods", "mcd+iblm"], "MC dropout has none"),
        (["uci", "--splits", "x"], "splits must look like"),
        (["bench", "nope"], "unknown benchmarks ['nope']"),
    ):
        result = run_python(f"import sys; from pyro_whvi.experiments.cli import main; sys.exit(main({args!r}))")
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def load_summary_script():
    import importlib.util

    from ..helpers import ROOT

    spec = importlib.util.spec_from_file_location("uci_summary", ROOT / "benchmarks" / "uci_summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_uci_summary_script_compares_with_the_paper(tmp_path):
    directory = tmp_path / "yacht"  # a stand-in with the name of a Table 3 dataset
    write_uci(directory, rows=40)
    config = UCIConfig(
        methods=("mfg", "whvi"), splits=(0, 1), schedule=Schedule(steps=5), hidden=8, samples=4, progress=False
    )
    run_uci(directory, config, tmp_path)
    module = load_summary_script()
    module.main(["--results", str(tmp_path), "--datasets", "yacht"])
    text = (tmp_path / "uci_summary.md").read_text()
    assert "| yacht | whvi | 2 |" in text and "0.69 (0.16)" in text and "below MFG's" in text
    assert "no MC dropout row" in text
    # The published practical peers are fixed reference rows, and WHVI is checked against the best of them (1.18).
    assert "| yacht | published: MC dropout, grid-searched (Gal's DropoutUncertaintyExps) | – |" in text
    assert "| yacht | published: deep ensembles, 5 networks (Lakshminarayanan et al. 2017, Table 1) |" in text
    assert "at or below the best published peer's (1.18)" in text
    assert (tmp_path / "uci_summary.png").is_file()
    summary = {e["method"]: e for e in json.loads((tmp_path / "uci_yacht.json").read_text())["results"]}
    verdict = module.checks("yacht", summary)
    assert verdict["rmse_ok"] == (summary["whvi"]["rmse"] <= 0.69 + 0.16)
    assert verdict["mnll_below_paper"] == (summary["whvi"]["mnll"] < 1.80)
    assert verdict["mnll_below_mfg"] == (summary["whvi"]["mnll"] < summary["mfg"]["mnll"])
    assert verdict["at_or_below_mcd"] is None
    assert verdict["at_or_below_published"] == (summary["whvi"]["mnll"] <= 1.18)
    # Against an MC dropout row, each WHVI variant is compared on its own; other methods are not listed.
    row = {"rmse": 1.0, "rmse_se": 0.1, "mnll": 1.0, "mnll_se": 0.1}
    rows = {"whvi": {**row, "rmse": 0.84, "mnll": 1.2}, "nf-whvi": {**row, "mnll": 0.9}, "mfg": {**row, "mnll": 0.5}}
    verdict = module.checks("yacht", {**rows, "whvi+iblm": row, "whvi-full": {**row, "mnll": 1.01}, "mcd": row})
    assert verdict["at_or_below_mcd"] == ["nf-whvi", "whvi+iblm"]
    verdict = module.checks("yacht", {**rows, "whvi-lowrank": {**row, "mnll": 0.99}, "mcd": row})
    assert verdict["at_or_below_mcd"] == ["nf-whvi", "whvi-lowrank"]
    assert verdict["rmse_ok"] and verdict["mnll_below_paper"] and not verdict["mnll_below_mfg"]
    assert module.checks("concrete", {"mcd": row, "whvi": {**row, "rmse": 5.43}})["rmse_ok"] is False
    assert "Noise calibrated" not in text
    # A second folder with WHVI at another step count, its noise calibrated on held-out rows: its row wins and the
    # header says it is calibrated, MFG's comes from the first run.
    longer = tmp_path / "longer"
    calibrated = replace(config, methods=("whvi",), schedule=Schedule(steps=7), method_calibrations=(("whvi", True),))
    run_uci(directory, calibrated, longer)
    module.main(["--results", str(longer), "--results", str(tmp_path), "--datasets", "yacht"])
    text = (longer / "uci_summary.md").read_text()
    assert "| yacht | whvi | 2 | 7 |" in text and "| yacht | mfg | 2 | 5 |" in text
    assert "Noise calibrated on held-out training rows" in text and "run's own table): whvi on yacht." in text
    assert "Against the known noise floor" not in text and "floor" not in (longer / "uci_summary.md").read_text()
    # A tempered run (--kl-weight) is its own row, never the paper's WHVI nor a variant in the MC dropout check.
    tempered = tmp_path / "tempered"
    run_uci(directory, replace(config, methods=("whvi",), kl_weight=0.1), tempered)
    module.main(["--results", str(tempered), "--results", str(tmp_path), "--datasets", "yacht"])
    text = (tempered / "uci_summary.md").read_text()
    assert "| yacht | whvi (KL 0.1) | 2 | 5 |" in text and "| yacht | whvi | 2 | 5 |" in text
    merged = module.load([tempered, tmp_path], "yacht")
    assert merged["whvi"]["mnll"] == summary["whvi"]["mnll"] and "whvi (KL 0.1)" in merged
    assert module.checks("yacht", {**merged, "mcd": {**row, "mnll": 1e6}})["at_or_below_mcd"] == ["whvi"]
    # Our deep ensemble is a second reference for every WHVI variant, named in the verdict; absent: no clause.
    assert module.checks("yacht", merged)["at_or_below_ensemble"] is None
    for offset, expected in ((1.0, ["whvi"]), (-1.0, [])):
        ensemble = {**row, "mnll": merged["whvi"]["mnll"] + offset}
        verdict = module.checks("yacht", {**merged, "ensemble": ensemble})
        assert [m for m in verdict["at_or_below_ensemble"] if m.startswith("whvi")] == expected
        line = module.verdict_line("yacht", verdict)
        assert ("at or below our deep ensemble's: whvi" in line) == bool(expected)
    # A weight chosen on validation rows is its own row too, and a WHVI variant: no test score chose it.
    chosen = tmp_path / "chosen"
    run_uci(directory, replace(config, methods=("whvi",), splits=(0,), kl_weight=(1.0, 0.1)), chosen)
    merged = module.load([chosen, tmp_path], "yacht")
    assert "whvi (KL from 1,0.1)" in merged and merged["whvi"]["mnll"] == summary["whvi"]["mnll"]
    mcd = {**row, "mnll": 1e6, "split_mnll": {0: 1e6, 1: 1e6}}
    verdict = module.checks("yacht", {**merged, "mcd": mcd})
    assert sorted(verdict["at_or_below_mcd"]) == ["whvi", "whvi (KL from 1,0.1) (splits 0)"]
    # A row run on fewer splits is compared over those splits only: below MC dropout's mean of all splits is not
    # enough when MC dropout is lower on the splits they share.
    chosen_mnll = merged["whvi (KL from 1,0.1)"]["mnll"]
    mcd = {**row, "mnll": chosen_mnll + 1, "split_mnll": {0: chosen_mnll - 1, 1: chosen_mnll + 3}}
    assert "whvi (KL from 1,0.1)" not in " ".join(module.checks("yacht", {**merged, "mcd": mcd})["at_or_below_mcd"])
    assert module.checks("yacht", {**merged, "mcd": mcd})["at_or_below_mcd_same_choice"] is None
    # MC dropout given the same choice is a second reference for the chosen rows, and only for them.
    chosen_mcd = tmp_path / "chosen_mcd"
    run_uci(directory, replace(config, methods=("mcd",), splits=(0,), kl_weight=(1.0, 0.1)), chosen_mcd)
    merged = module.load([chosen, chosen_mcd, tmp_path], "yacht")
    tuned = merged["mcd (KL from 1,0.1)"]
    assert (
        tuned["split_mnll"].keys() == {0}
        and "mcd (KL from 1,0.1)" not in module.checks("yacht", merged)["at_or_below_mcd_same_choice"]
    )
    for offset, expected in ((1.0, ["whvi (KL from 1,0.1)"]), (-1.0, []), (0.0, ["whvi (KL from 1,0.1)"])):
        shifted = {**tuned, "mnll": chosen_mnll + offset, "split_mnll": {0: chosen_mnll + offset}}
        verdict = module.checks("yacht", {**merged, "mcd (KL from 1,0.1)": shifted})
        assert verdict["at_or_below_mcd_same_choice"] == expected
    other = {k: v for k, v in merged.items() if k != "mcd (KL from 1,0.1)"}
    assert module.checks("yacht", {**other, "mcd (KL from 1,0.3)": tuned})["at_or_below_mcd_same_choice"] is None
    module.main(["--results", str(chosen), "--results", str(chosen_mcd), "--datasets", "yacht"])
    text = (chosen / "uci_summary.md").read_text()
    assert "| yacht | mcd (KL from 1,0.1) | 1 |" in text and "for MC dropout too: " in text
    # MC dropout at another rate, or with its rate chosen on validation rows, is its own row: not the default's.
    rated = tmp_path / "rated"
    run_uci(directory, replace(config, methods=("mcd",), splits=(0,), dropout=(0.005, 0.3)), rated)
    run_uci(directory, replace(config, methods=("mcd",), splits=(0,), dropout=0.3), rated / "fixed")
    merged = module.load([rated, rated / "fixed", chosen_mcd], "yacht")
    assert {"mcd (dropout from 0.005,0.3)", "mcd (dropout 0.3)", "mcd (KL from 1,0.1)"} <= merged.keys()
    assert "mcd" not in merged and not any(module.is_whvi_variant(label) for label in merged)


def test_uci_summary_names_the_published_peers_of_the_standard_sets_only():
    """Gal's folder names and short names find the same published values; other sets, the synthetic ones among them,
    get none (and no verdict)."""
    module = load_summary_script()
    mcd, ensembles = module.PUBLISHED_MNLL
    assert module.published("naval-propulsion-plant") == module.published("naval") == {mcd: -4.45, ensembles: -5.63}
    assert module.published("power-plant")[ensembles] == 2.79 and module.published("Protein")[mcd] == 2.87
    assert module.published("boston") == module.published("bostonHousing") == {mcd: 2.40, ensembles: 2.41}
    for other in ("robot", "hartmann6", "otl", "wine-quality-red", "kin"):
        assert module.published(other) == {}
    row = {"rmse": 0.1, "mnll": -1.2}
    assert module.checks("kin8nm", {"whvi": row})["at_or_below_published"] is True
    assert module.checks("kin8nm", {"whvi": {**row, "mnll": -1.19}})["at_or_below_published"] is False
    assert module.checks("robot", {"whvi": row})["at_or_below_published"] is None
    assert module.checks("kin8nm", {"mcd": row})["at_or_below_published"] is None


def test_uci_summary_script_reports_the_noise_floor(tmp_path):
    """On a set with a known sigma the summary adds each method's distance to the floor, the JSON's own numbers,
    and names the methods that pass issue 28's check (MNLL within 0.1 nats, noise within 10% of sigma)."""
    from pyro_whvi.experiments.noisy_sets import write_noisy_set

    write_noisy_set("otlcircuit", tmp_path / "otl", num_points=60, splits=2)
    config = UCIConfig(
        methods=("whvi", "mcd"), splits=(0, 1), schedule=Schedule(steps=5), hidden=8, samples=4, progress=False
    )
    run_uci(tmp_path / "otl", config, tmp_path)
    module = load_summary_script()
    module.main(["--results", str(tmp_path), "--datasets", "otl"])
    text = (tmp_path / "uci_summary.md").read_text()
    rows = {e["method"]: e for e in json.loads((tmp_path / "uci_otl.json").read_text())["results"]}
    whvi = rows["whvi"]
    cells = " | ".join(f"{whvi[m]:.3f} ± {whvi[m + '_se']:.3f}" for m in ("mnll_gap", "rmse_ratio", "noise_ratio"))
    assert f"| otl | whvi | 2 | 5 | {whvi['parameters']:,} | {cells} |" in text
    assert "Paper: Table 3" not in text and "paper std" not in text and "within 0.1 nats of the floor" in text
    assert "published" not in text
    assert (tmp_path / "uci_summary.png").is_file()
    # The check itself, on rows placed on either side of each bound.
    at = {"mnll": 0.0, "mnll_gap": 0.1, "noise_ratio": 0.9, "rmse_ratio": 1.0}
    summary = {
        "whvi": at,
        "nf-whvi": {**at, "mnll_gap": 0.11},
        "mfg": {**at, "noise_ratio": 1.11},
        "whvi-full": {**at, "mnll_gap": -0.01, "noise_ratio": 1.099},
        "mcd": {**at, "noise_ratio": 0.89},
    }
    assert module.checks("otl", summary)["at_floor"] == ["whvi", "whvi-full"]
    assert module.checks("otl", {"whvi": {"mnll": 0.0}})["at_floor"] is None


def test_whvi_method_is_the_papers_set_up():
    _, guide = build_method("whvi", [3, 8, 8, 1])
    guide(torch.randn(4, 3), torch.randn(4))
    whvi_sites = set(guide.structured_sites)
    # every weight and bias under WHVI except the last layer's (mean-field, WHVI paper §3.2)
    assert {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"} <= whvi_sites
    assert "layers.2.weight" not in whvi_sites and "layers.2.bias" not in whvi_sites


def test_protocols_and_the_deprecated_preset_flag(tmp_path, capsys):
    """Table 3 (2x128, lr 1e-3, 50,500 steps) is the harness's default; Table 6 (App. D.2) is 1x50, 1x100 for
    protein; ``wide`` is 2x1024 at lr 3e-3, ``deep`` 3x1024 with a cool-down; explicit --hidden/--layers/--steps/--lr
    win over the preset; the run's table names the network and schedule it trained."""
    from pyro_whvi.experiments.cli import main
    from pyro_whvi.experiments.uci_config import UCI_PROTOCOLS, UCIConfig, protocol_settings

    defaults = UCIConfig()
    table3 = UCI_PROTOCOLS["table3"]
    assert {k: table3[k] for k in ("layers", "hidden")} == {"layers": defaults.layers, "hidden": 128}
    assert table3["steps"] == 50_500 and table3["lr"] == defaults.schedule.lr
    none = {"cooldown": 0.0}
    assert protocol_settings("table6", "concrete") == {"layers": 1, "hidden": 50, "steps": 50_500, "lr": 1e-3, **none}
    assert protocol_settings("table6", "protein-tertiary-structure")["hidden"] == 100
    assert protocol_settings("table6", "yacht", hidden=20)["hidden"] == 20
    assert protocol_settings("table3", "protein", layers=3, steps=10) == {
        "layers": 3,
        "hidden": 128,
        "steps": 10,
        "lr": 1e-3,
        **none,
    }
    wide = {"layers": 2, "hidden": 1024, "steps": 50_500, "lr": 3e-3, **none}
    assert protocol_settings("wide", "yacht", lr=None) == wide
    # deep: wide with a third layer and the learning rate cooled down over the last 20% of the steps.
    assert protocol_settings("deep", "yacht") == {**wide, "layers": 3, "cooldown": 0.2}
    assert protocol_settings("deep", "yacht", cooldown=0.0)["cooldown"] == 0.0
    # narrow: table3's network and steps at wide's learning rate, trained and fingerprinted as table3 --lr 3e-3.
    assert protocol_settings("narrow", "yacht") == {**protocol_settings("table3", "yacht"), "lr": wide["lr"]}
    narrow = UCIConfig.from_protocol("narrow", "yacht", methods=("whvi",))
    like = UCIConfig.from_protocol("table3", "yacht", lr=3e-3, methods=("whvi",), protocol="narrow")
    assert narrow == like and narrow.fingerprint("whvi", "k") == like.fingerprint("whvi", "k")
    with pytest.raises(ValueError, match="--protocol: choose from table3, table6, narrow, wide, deep"):
        protocol_settings("table9", "yacht")
    with pytest.raises(TypeError, match="unknown settings"):
        protocol_settings("table3", "yacht", width=3)
    # The whole UCIConfig from a preset: the schedule's other fields keep their defaults unless given.
    config = UCIConfig.from_protocol("wide", "yacht", steps=7, batch_size=32, methods=("whvi",), seed=3)
    assert (config.hidden, config.layers, config.methods, config.seed) == (1024, 2, ("whvi",), 3)
    assert config.schedule == replace(defaults.schedule, steps=7, lr=3e-3, batch_size=32)
    # deep trains, and is fingerprinted, as wide with --layers 3 --cooldown 0.2; its --cooldown can be overridden.
    deep = UCIConfig.from_protocol("deep", "yacht", methods=("whvi",))
    assert (deep.hidden, deep.layers, deep.schedule.cooldown) == (1024, 3, 0.2)
    like = UCIConfig.from_protocol("wide", "yacht", layers=3, cooldown=0.2, methods=("whvi",), protocol="deep")
    assert deep == like and deep.fingerprint("whvi", "k") == like.fingerprint("whvi", "k")
    assert UCIConfig.from_protocol("deep", "yacht", cooldown=0.0).schedule.cooldown == 0.0
    with pytest.raises(ValueError, match="needs a cooldown in"):
        UCIConfig(protocols=({"name": "a", **wide, "cooldown": 1.0}, {"name": "b", **wide}))
    args = ["uci", "--dataset", "diabetes", "--protocol", "table6", "--methods", "mfg", "--splits", "0"]
    assert main([*args, "--steps", "3", "--samples", "4", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "uci_diabetes.md").read_text().startswith("### diabetes: protocol table6, 1x50 ReLU, 3 steps")
    wide = tmp_path / "wide"
    # --preset, the flag's name before --protocol, still works for one release, with a notice on stderr.
    args = ["uci", "--dataset", "diabetes", "--preset", "wide", "--methods", "whvi", "--splits", "0", "--steps", "3"]
    capsys.readouterr()
    assert main([*args, "--samples", "4", "--out", str(wide)]) == 0
    assert "--preset is now --protocol" in capsys.readouterr().err
    assert "2x1024 ReLU, 3 steps" in (wide / "uci_diabetes.md").read_text()
    assert "lr 0.003" in (wide / "uci_diabetes.md").read_text()


def test_device_flag_cpu_is_the_default_bit_for_bit_and_keeps_stored_results_valid(tmp_path):
    """``--device cpu`` (issue 52) trains exactly what the default does; at ``"cpu"`` the device stays out of the
    fingerprint (the hash from before the setting existed), so stored CPU results are read back; a CUDA run has
    its own; CUDA trains in one process."""
    from pyro_whvi.experiments.cli import main

    assert UCIConfig(device="cpu").fingerprint("whvi", "k") == "285c3fb58e99d90f"
    assert UCIConfig(device="cuda").fingerprint("whvi", "k") != "285c3fb58e99d90f"
    with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
        UCIConfig(device="tpu")
    with pytest.raises(ValueError, match="trains in one process"):
        UCIConfig(device="cuda", nproc=2)
    args = ["uci", "--dataset", "diabetes", "--methods", "whvi,mfg", "--splits", "0", "--steps", "5", "--samples", "4"]
    args += ["--hidden", "8"]
    assert main([*args, "--out", str(tmp_path / "default")]) == 0
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    for method in ("whvi", "mfg"):
        default, cpu = (
            json.loads((tmp_path / run / "runs" / "diabetes" / method / "split0.json").read_text())
            for run in ("default", "cpu")
        )
        assert default["fingerprint"] == cpu["fingerprint"]
        # WHVI's noise is calibrated (--calibrate-noise auto) and its protocol chosen on the held-out rows
        drop = ("train_seconds", "calibration_seconds", "selection_seconds")
        assert {k: v for k, v in default["row"].items() if k not in drop} == {
            k: v for k, v in cpu["row"].items() if k not in drop
        }
    assert "trained on" not in (tmp_path / "cpu" / "uci_diabetes.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_device_cuda_without_cuda_is_a_one_line_error(tmp_path):
    code = (
        "import sys; from pyro_whvi.experiments.cli import main; "
        f"sys.exit(main(['uci', '--device', 'cuda', '--steps', '2', '--out', {str(tmp_path)!r}]))"
    )
    result = run_python(code)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "whvi uci: error: --device cuda: PyTorch sees no CUDA GPU here" in result.stderr
    assert "--device cpu" in result.stderr and not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="device cuda: PyTorch sees no CUDA GPU"):
        run_uci("diabetes", UCIConfig(device="cuda", splits=(0,), progress=False), tmp_path)


def test_the_compiled_elbo_is_the_default_and_eager_its_own_fingerprint(tmp_path, monkeypatch):
    """``whvi uci`` trains every method (an ensemble's networks too) on ``JitTrace_ELBO`` unless ``--eager``; the two
    draw other random numbers, so an eager run does not read a compiled run's stored splits."""
    import pyro_whvi.train.engine as engine
    from pyro_whvi.experiments.cli import main

    assert UCIConfig(jit=False).fingerprint("whvi", "k") != UCIConfig().fingerprint("whvi", "k")
    compiled: list[str] = []

    class Recording(engine.JitTrace_ELBO):
        def __init__(self, *args, **kwargs):
            compiled.append("jit")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine, "JitTrace_ELBO", Recording)
    args = ["uci", "--dataset", "diabetes", "--methods", "whvi,ensemble", "--splits", "0", "--steps", "5"]
    args += ["--samples", "4", "--hidden", "8"]
    assert main([*args, "--out", str(tmp_path / "jit")]) == 0
    # WHVI's held-out fit and its fit on all the rows (its noise calibrated by default), the ensemble's five networks
    assert len(compiled) == 2 + 5
    assert main([*args, "--eager", "--out", str(tmp_path / "eager")]) == 0
    assert len(compiled) == 7
    for method in ("whvi", "ensemble"):
        jit, eager = (
            json.loads((tmp_path / run / "runs" / "diabetes" / method / "split0.json").read_text())
            for run in ("jit", "eager")
        )
        assert jit["fingerprint"] != eager["fingerprint"]
        assert all(math.isfinite(run["row"]["mnll"]) for run in (jit, eager))
