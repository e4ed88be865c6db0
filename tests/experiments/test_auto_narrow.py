"""The factor rule for WHVI below 3,000 training rows, ``--protocol auto --choose-by noise-factor``
(:mod:`pyro_whvi.experiments.auto_narrow`; not the default):
``narrow`` where its calibrated noise factor on the held-out rows is at most 1, else ``table3``. Resolved into
:class:`~pyro_whvi.experiments.uci_config.UCIConfig` (``protocols``, ``choose_by``), chosen by
:func:`~pyro_whvi.experiments.uci_train.choose_settings` and read into the split's row by
:func:`~pyro_whvi.experiments.uci.run_split`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pyro_whvi.experiments import uci, uci_train
from pyro_whvi.experiments.auto_narrow import FACTOR_RULE, SCORE_RULE
from pyro_whvi.experiments.methods import Schedule, parse_method
from pyro_whvi.experiments.uci import UCIConfig, load_dataset_split
from pyro_whvi.experiments.uci_protocols import AUTO_WIDE_FROM_ROWS, protocol_settings

ROWS = 277  # yacht's training rows


def _auto(train_rows: int = ROWS, methods=("whvi", "mcd", "mfg"), **fields) -> UCIConfig:
    fields = {"calibrate_noise": "auto", "likelihood": "auto", "dropout": "auto", "choose_by": FACTOR_RULE, **fields}
    return UCIConfig.from_protocol("auto", "yacht", train_rows=train_rows, methods=methods, **fields)


def _names(protocols) -> list[str]:
    return [protocol["name"] for protocol in protocols]


def test_auto_gives_whvi_narrow_then_table3_below_the_threshold_and_the_others_their_fingerprints():
    """WHVI alone chooses, by the factor; MC dropout and MFG train ``table3`` with the fingerprints they had before the
    rule (their stored splits stay valid); WHVI's fingerprint is the fixed protocols' with the same rule."""
    auto = _auto()
    assert _names(auto.protocols) == ["narrow", "table3"] and auto.choose_by == FACTOR_RULE
    assert {method: protocol["name"] for method, protocol in auto.method_protocols} == {
        "mcd": "table3",
        "mfg": "table3",
    }
    whvi, mcd = auto.for_method("whvi"), auto.for_method("mcd")
    assert _names(whvi.protocols) == ["narrow", "table3"] and whvi.choose_by == FACTOR_RULE and whvi.choosing
    assert (mcd.protocols, mcd.choose_by, mcd.hidden, mcd.schedule.lr) == ((), SCORE_RULE, 128, 1e-3)
    without_whvi = _auto(methods=("mcd", "mfg"))
    assert without_whvi.protocols == () and without_whvi.choose_by == SCORE_RULE
    for method in ("mcd", "mfg"):
        assert auto.fingerprint(method, "k") == without_whvi.fingerprint(method, "k")
    fixed = UCIConfig.from_protocol(
        ("narrow", "table3"), "yacht", methods=("whvi",), calibrate_noise=True, choose_by=FACTOR_RULE
    )
    scored = replace(fixed, choose_by=SCORE_RULE)
    assert auto.fingerprint("whvi", "k") == fixed.fingerprint("whvi", "k") != scored.fingerprint("whvi", "k")
    assert "narrow for whvi where its noise factor on the held-out rows is at most 1, else table3" in auto.protocol
    assert [label for label, _ in whvi.candidates()] == ["narrow", "table3"]
    assert [(s.schedule.lr, s.choose_by, s.protocols) for _, s in whvi.candidates()] == [
        (3e-3, SCORE_RULE, ()),
        (1e-3, SCORE_RULE, ()),
    ]


@pytest.mark.parametrize(
    "case",
    ["from the threshold", "uncalibrated", "several processes", "several KL weights", "I-BLM", "a head", "one lr"],
)
def test_auto_keeps_table3_for_whvi_where_the_rule_does_not_apply(case):
    """From the threshold (``wide``), where WHVI's noise is not calibrated with one noise scale (the factor is the
    rule's signal), with several KL weights (not measured), for ``whvi+iblm`` and where ``--lr`` makes the two
    candidates one."""
    fields = {
        "from the threshold": {"train_rows": AUTO_WIDE_FROM_ROWS},
        "uncalibrated": {"calibrate_noise": "off"},
        "several processes": {"nproc": 2},
        "several KL weights": {"kl_weight": (1.0, 0.3)},
        "I-BLM": {"methods": ("whvi+iblm", "mcd")},
        "a head": {"likelihood": "heteroscedastic"},
        "one lr": {"lr": 1e-3},
    }[case]
    config = _auto(**fields)
    assert config.choose_by == SCORE_RULE and "noise factor" not in config.protocol
    assert "narrow" not in _names(config.protocols)


def test_the_rule_refuses_what_it_cannot_read():
    table3 = {"name": "table3", **protocol_settings("table3", "yacht")}
    narrow = {"name": "narrow", **protocol_settings("narrow", "yacht")}
    with pytest.raises(ValueError, match="choose_by must be one of"):
        UCIConfig(choose_by="best")
    with pytest.raises(ValueError, match="chooses among protocols; give two or more"):
        UCIConfig(methods=("whvi",), calibrate_noise=True, choose_by=FACTOR_RULE)
    with pytest.raises(ValueError, match=r"whvi has its noise uncalibrated: calibrate it \(calibrate_noise"):
        UCIConfig(methods=("whvi",), protocols=(narrow, table3), choose_by=FACTOR_RULE)
    with pytest.raises(ValueError, match="mcd has likelihood 'heteroscedastic'"):
        UCIConfig(
            methods=("mcd",), protocols=(narrow, table3), choose_by=FACTOR_RULE, calibrate_noise=True,
            likelihood="heteroscedastic",
        )  # fmt: skip
    with pytest.raises(ValueError, match="gives every method its own protocol, so none chooses"):
        UCIConfig(methods=("mcd",), method_protocols=(("mcd", table3),), protocols=(narrow, table3))
    # A method with its own protocol is out of the choice, and need not be calibrated.
    UCIConfig(
        methods=("whvi", "mfg"), protocols=(narrow, table3), choose_by=FACTOR_RULE,
        method_calibrations=(("whvi", True),), method_protocols=(("mfg", table3),),
    )  # fmt: skip
    # Without --choose-by noise-factor (the default) auto gives WHVI table3, as before the rule.
    default = _auto(choose_by=SCORE_RULE)
    assert default.protocols == () and default.choose_by == SCORE_RULE and "noise factor" not in default.protocol


def _three(tmp_path) -> tuple[UCIConfig, object]:
    schedule = Schedule(steps=20, fixed_noise_steps=5, batch_size=16)
    protocols = tuple(
        {"name": name, "layers": 1, "hidden": 8, "steps": 20, "lr": lr}
        for name, lr in (("a", 0.05), ("b", 0.02), ("c", 0.01))
    )
    config = UCIConfig(
        methods=("mfg",), splits=(0,), schedule=schedule, samples=4, val_fraction=0.25, progress=False,
        protocols=protocols, choose_by=FACTOR_RULE, calibrate_noise=True,
    )  # fmt: skip
    return config, parse_method("mfg")


@pytest.mark.parametrize(
    ("given", "chosen", "trained"),
    [
        ((0.4, 9.0, 9.0), "a", ["a"]),  # the first at most 1: the others are not trained
        ((1.0, 9.0, 9.0), "a", ["a"]),  # 1 itself is "at most 1"
        ((1.3, 0.7, 0.2), "b", ["a", "b"]),
        ((1.3, 1.2, 1.5), "c", ["a", "b", "c"]),  # none: the last, whatever its factor
    ],
)
def test_the_candidates_are_tried_in_order_until_a_factor_is_at_most_one(tmp_path, monkeypatch, given, chosen, trained):
    """:func:`choose_settings` under ``"noise-factor"``: the factors come from ``factor`` on each candidate's held-out
    predictive; the row's scores and factors are those of the candidates trained; a rerun reads them back from the
    store without training, and ``factor`` is required."""
    config, mfg = _three(tmp_path)
    data = load_dataset_split("diabetes", 0)
    part = uci.validation_part(data, config.val_fraction, config.seed)
    seen: list = []

    def factor(f, noise, y):
        assert f.shape == (config.samples, len(part.y_test)) and y.equal(part.y_test)
        seen.append(given[len(seen)])
        return seen[-1]

    store = tmp_path / "split0.validation.json"
    label, settings, scores, seconds, factors = uci.choose_settings(
        "diabetes", mfg, 0, config, store, data, None, factor
    )
    assert label == chosen and settings.schedule.lr == dict(config.candidates())[chosen].schedule.lr
    assert list(scores) == list(factors) == trained and list(factors.values()) == list(given[: len(trained)])
    assert seconds > 0 and settings.choose_by == SCORE_RULE and settings.protocols == ()
    monkeypatch.setattr(uci_train, "train_split", lambda *a, **k: pytest.fail("trained a finished candidate"))
    again = uci.choose_settings("diabetes", mfg, 0, config, store, data, None, lambda *a: pytest.fail("factor"))
    assert again[0] == chosen and again[2] == scores and again[4] == factors
    assert json.loads(store.read_text())["factors"] == factors
    with pytest.raises(TypeError, match="choose_by 'noise-factor' needs factor"):
        uci.choose_settings("diabetes", mfg, 0, config, None, data)


@pytest.mark.slow  # four short trainings and their calibrations
@pytest.mark.parametrize(("factor", "expected"), [(0.5, "narrow"), (2.0, "table3")])
def test_the_rule_s_row_is_the_chosen_protocol_s_own_calibrated_row(tmp_path, monkeypatch, factor, expected):
    """A split under the rule gives, to the bit, the row of the protocol it chose trained alone with its noise
    calibrated (the same seeds: the held-out fit is the calibration's, reused), and names the factors it read. The
    factor is forced here; that it is the calibration's own is the row's ``noise_factor``."""
    schedule = Schedule(steps=30, fixed_noise_steps=5, batch_size=16)
    fields = dict(methods=("whvi",), splits=(0,), schedule=schedule, samples=4, val_fraction=0.25, progress=False)
    steps = {"steps": 30}
    rule = UCIConfig.from_protocol(
        ("narrow", "table3"), "diabetes", **steps, calibrate_noise=True, choose_by=FACTOR_RULE, **fields
    )
    alone = UCIConfig.from_protocol(expected, "diabetes", **steps, calibrate_noise=True, **fields)
    real = uci.noise_factor
    monkeypatch.setattr(uci, "noise_factor", lambda f, noise, y: (factor, *real(f, noise, y)[1:]))
    data = load_dataset_split("diabetes", 0)
    row, _ = uci.run_split("diabetes", parse_method("whvi"), 0, rule, None, tmp_path / "a.validation.json", data)
    monkeypatch.undo()
    own, _ = uci.run_split("diabetes", parse_method("whvi"), 0, alone, None, tmp_path / "b.validation.json", data)
    assert row["protocol"] == expected and list(row["noise_factors"]) == ["narrow", "table3"][: 1 + (factor > 1)]
    assert list(row["noise_factors"].values()) == [factor] * len(row["noise_factors"])
    for key in ("rmse", "mnll", "noise_scale", "noise_factor", "calibration_mnll", "learned_noise_mnll"):
        assert row[key] == own[key], key
    assert row["calibration_seconds"] == 0.0 and row["selection_seconds"] > 0  # the chosen held-out fit, reused


def test_the_command_resolves_the_rule_and_takes_choose_by_for_named_protocols(tmp_path, uci_configs, capsys):
    """``--choose-by noise-factor`` gives WHVI the rule under the default ``--protocol auto`` (the default command
    keeps ``table3``); ``--protocol narrow,table3 --choose-by noise-factor --calibrate-noise on`` is the same WHVI
    fingerprint, written out; without the calibration the flag is a usage error that says what to do."""
    from pyro_whvi.experiments.cli import main

    args = ["uci", "--dataset", "diabetes", "--methods", "whvi,mcd", "--splits", "0", "--out", str(tmp_path)]
    assert main(args) == 0
    assert main([*args, "--choose-by", FACTOR_RULE]) == 0
    fixed = ["--protocol", "narrow,table3", "--choose-by", FACTOR_RULE, "--calibrate-noise", "on"]
    assert main([*args, *fixed]) == 0
    default, opted, named = uci_configs
    assert default.choose_by == SCORE_RULE and default.protocols == ()
    assert opted.choose_by == named.choose_by == FACTOR_RULE
    assert opted.fingerprint("whvi", "k") == named.fingerprint("whvi", "k") != default.fingerprint("whvi", "k")
    with pytest.raises(SystemExit):
        main([*args, "--protocol", "narrow,table3", "--choose-by", FACTOR_RULE])
    assert "whvi has its noise uncalibrated" in capsys.readouterr().err


def test_the_table_names_the_rule_and_each_split_s_factors():
    """The header names the candidates and the rule; the line under it each split's choice with the factors read."""
    from pyro_whvi.experiments.uci_report import choices_text, summary_table

    auto = _auto(methods=("whvi", "mfg"))
    rows = [
        {"method": "whvi", "split": 0, "protocol": "narrow", "kl_weight": 1.0, "noise_factors": {"narrow": 0.52},
         "noise_factor": 0.52},
        {"method": "whvi", "split": 1, "protocol": "table3", "kl_weight": 1.0,
         "noise_factors": {"narrow": 1.16, "table3": 0.955}, "noise_factor": 0.955},
        {"method": "mfg", "split": 0, "kl_weight": 1.0},
    ]  # fmt: skip
    text = choices_text(rows, auto, 0.02)
    assert (
        "Protocol chosen per split on validation: whvi: narrow (narrow 0.52), table3 (narrow 1.16, table3 0.955)"
        in text
    )
    assert "mfg:" not in text.split("Noise calibrated")[0]
    summary = [{"method": "whvi", "splits": 2, "parameters": 1410, "rmse": 1.0, "rmse_se": 0.1, "mnll": 1.0,
                "mnll_se": 0.1, "train_seconds": 1.0}]  # fmt: skip
    header = summary_table("yacht", summary, auto).splitlines()[0]
    assert "narrow for whvi where its noise factor on the held-out rows is at most 1, else table3" in header
    assert "from narrow (2x128, 50500 steps, lr 0.003), table3 (2x128, 50500 steps, lr 0.001)" in header
    assert "(the first whose noise factor there is at most 1, else the last)" in header
