"""MC dropout's rate chosen per split on held-out rows (``whvi uci --dropout 0.005,0.01,0.05,0.1``, Gal's grid):
the candidates are ``mcd``'s alone, each scored as training it directly would score it, the split trained on all
its rows with the winner, and the other methods of the run trained, and fingerprinted, as with the first rate."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pyro_whvi.experiments.methods import Schedule, parse_method
from pyro_whvi.experiments.uci import UCIConfig, load_dataset_split, run_uci

RATES = (0.005, 0.3)  # far apart, so that the choice on 25% of diabetes's rows is not a tie


def _config(**fields) -> UCIConfig:
    schedule = Schedule(steps=20, fixed_noise_steps=0, batch_size=16, lr=0.05)
    settings = dict(methods=("mcd", "mfg"), splits=(0,), schedule=schedule, hidden=8, samples=4, progress=False)
    return UCIConfig(**{**settings, "val_fraction": 0.25, "dropout": RATES, **fields})


def test_dropout_rates_are_candidates_for_mc_dropout_alone(tmp_path):
    from pyro_whvi.experiments import uci
    from pyro_whvi.experiments.uci_report import evaluate
    from pyro_whvi.experiments.uci_train import predict_split

    config = _config()
    mcd = parse_method("mcd")
    assert config.for_method("mcd").dropout == RATES and config.for_method("mfg").dropout == RATES[0]
    assert config.for_method("mcd").choosing and not config.for_method("mfg").choosing
    with pytest.raises(ValueError, match=r"config\.dropout holds 2 candidates for mcd"):
        uci.train_split("diabetes", mcd, 0, config)
    # Each candidate's score is that of training MC dropout at that rate on the fit part, scored on the rest.
    data = load_dataset_split("diabetes", 0)
    part = uci.validation_part(data, 0.25, config.seed)
    expected = {}
    for rate in RATES:
        alone = replace(config, dropout=rate, methods=("mcd",))
        trained = uci.train_split("diabetes", mcd, 0, alone, data=part)
        expected[f"dropout{rate!r}"] = evaluate(part, *predict_split(trained, part.x_test, alone))["mnll"]
    assert abs(expected["dropout0.005"] - expected["dropout0.3"]) > 1e-3
    label, settings, scores, _, factors = uci.choose_settings("diabetes", mcd, 0, config.for_method("mcd"), None, data)
    assert scores == pytest.approx(expected, rel=1e-6)
    assert label == min(expected, key=expected.__getitem__) == f"dropout{settings.dropout!r}"
    assert factors == {}  # choose_by 'score': no noise factors
    best = settings.dropout
    # The run: mcd's row names the rate and every candidate's score, and its fit is the chosen rate's own run.
    run_uci("diabetes", config, tmp_path / "chosen")
    rows = {
        m: json.loads((tmp_path / "chosen" / "runs" / "diabetes" / m / "split0.json").read_text())
        for m in ("mcd", "mfg")
    }
    assert rows["mcd"]["row"]["dropout"] == best
    assert rows["mcd"]["row"]["validation_scores"] == pytest.approx(expected, rel=1e-6)
    single = replace(config, dropout=best, methods=("mcd",))
    direct = uci.run_split("diabetes", mcd, 0, single)[0]
    assert rows["mcd"]["row"]["final_loss"] == pytest.approx(direct["final_loss"], rel=1e-6)
    assert rows["mcd"]["row"]["mnll"] == pytest.approx(direct["mnll"], rel=1e-6)
    # MFG has no dropout: it does not choose, and keeps the fingerprint of a run at the first rate alone.
    assert "dropout" not in rows["mfg"]["row"] and "validation_scores" not in rows["mfg"]["row"]
    assert rows["mfg"]["fingerprint"] == replace(config, dropout=RATES[0]).fingerprint(
        "mfg", uci.data_key("diabetes", 0)
    )
    assert config.fingerprint("mcd") != replace(config, dropout=best).fingerprint("mcd")
    text = (tmp_path / "chosen" / "uci_diabetes.md").read_text()
    assert "MC dropout's rate chosen from 0.005, 0.3 on 25% of each split's training rows" in text
    assert f"MC dropout's rate chosen per split on validation: mcd: dropout {best:g}" in text
    assert "mfg:" not in text.split("chosen per split on validation")[1].split("\n\n")[0]
    assert "MC dropout rate " not in text  # several are named as candidates, one as the rate (below)
    run_uci("diabetes", replace(config, dropout=0.005, methods=("mcd",)), tmp_path / "one")
    assert ", MC dropout rate 0.005" in (tmp_path / "one" / "uci_diabetes.md").read_text()
    mfg_alone = replace(config, dropout=0.005, methods=("mfg",))
    assert mfg_alone.fingerprint("mfg", "k") == replace(config, methods=("mfg",)).fingerprint("mfg", "k")


@pytest.mark.parametrize(
    ("value", "message"),
    [((0.0, 0.1), "dropout in \\(0, 1\\)"), (1.0, "dropout in \\(0, 1\\)"), ((), "dropout in \\(0, 1\\)")],
)
def test_bad_dropout_rates_name_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        UCIConfig(dropout=value)


def test_dropout_argument_parses_candidates_and_refuses_rates_of_one(tmp_path, capsys):
    from pyro_whvi.experiments.arguments import rates

    assert rates("0.005") == 0.005 and rates("0.005, 0.01,0.05,0.1") == (0.005, 0.01, 0.05, 0.1)
    from pyro_whvi.experiments.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["uci", "--dataset", "diabetes", "--dropout", "0.05,1", "--out", str(tmp_path)])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and len(stderr.splitlines()) == 1 and "expected rates below 1" in stderr
    assert UCIConfig(dropout=[0.01, 0.05]).dropout == (0.01, 0.05)  # as the results' JSON stores them
    assert UCIConfig(dropout=(0.01, 0.01)).dropout == 0.01  # one: a number, with its old fingerprint
    assert UCIConfig(dropout=(0.01,)).fingerprint("mcd") == UCIConfig(dropout=0.01).fingerprint("mcd")
