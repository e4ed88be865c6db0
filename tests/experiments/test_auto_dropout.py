"""``whvi uci --dropout auto``, the default: MC dropout's rate chosen per split on held-out rows from Gal's grid
under ``--protocol auto`` below 3,000 training rows (the choice itself: ``test_dropout_choice.py``), the WHVI paper's
0.005 from there, under a fixed protocol, in several processes and on classification
(:mod:`pyro_whvi.experiments.auto_dropout`); every other method keeps the fingerprint of a run without it."""

from __future__ import annotations

import pytest

from pyro_whvi.experiments.auto_dropout import DROPOUT_GRID, PAPER_DROPOUT, auto_dropout, dropout_fields
from pyro_whvi.experiments.uci import UCIConfig
from pyro_whvi.experiments.uci_protocols import AUTO_WIDE_FROM_ROWS


def test_the_rule_chooses_from_gals_grid_below_the_rows_under_the_auto_protocol_in_one_process():
    below, at = AUTO_WIDE_FROM_ROWS - 1, AUTO_WIDE_FROM_ROWS
    assert DROPOUT_GRID == (0.005, 0.01, 0.05, 0.1) and DROPOUT_GRID[0] == PAPER_DROPOUT
    assert auto_dropout("auto", below) == auto_dropout("auto", 1) == DROPOUT_GRID
    assert auto_dropout("auto", at) == PAPER_DROPOUT  # the rates differ by hundredths of a nat there, at 5x the time
    assert auto_dropout("table3", below) == auto_dropout("wide", below) == PAPER_DROPOUT  # the paper's peer
    assert auto_dropout("", below) == PAPER_DROPOUT  # several protocols chosen on held-out rows
    assert auto_dropout("auto", below, nproc=2) == PAPER_DROPOUT  # the candidates are not trained data-parallel
    for rows in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="auto_dropout: a positive number of training rows"):
            auto_dropout("auto", rows)
    assert dropout_fields("auto", "auto", below, ("whvi",)) == {"dropout": PAPER_DROPOUT}  # no MC dropout
    assert dropout_fields((0.01, 0.1), "auto", below, ("mcd",)) == {"dropout": (0.01, 0.1)}  # given: kept
    assert dropout_fields("auto", "table3", None, ("mcd",)) == {"dropout": PAPER_DROPOUT}  # no rows needed
    with pytest.raises(TypeError, match="dropout 'auto' needs train_rows"):
        dropout_fields("auto", "auto", None, ("mcd",))
    with pytest.raises(ValueError, match="--dropout: a rate below 1, several separated by commas, or auto; got 'x'"):
        dropout_fields("x", "auto", below, ("mcd",))


def _config(dropout, protocol: str = "auto", methods=("whvi", "mcd"), rows: int = 691, **fields) -> UCIConfig:
    return UCIConfig.from_protocol(
        protocol, "energy", train_rows=rows, methods=methods, calibrate_noise="auto", dropout=dropout, **fields
    )


def test_auto_is_the_grid_for_mc_dropout_alone_with_the_fingerprint_of_the_grid_given():
    """Under ``auto`` MC dropout is the run of ``--dropout 0.005,0.01,0.05,0.1`` (the same config, so its stored
    splits are read back), and every other method's fingerprint is that of a run at the paper's rate."""
    auto, grid, paper = _config("auto"), _config(DROPOUT_GRID), _config(PAPER_DROPOUT)
    assert auto == grid and auto.for_method("mcd").dropout == DROPOUT_GRID and auto.for_method("mcd").choosing
    assert not auto.for_method("whvi").choosing and auto.for_method("whvi").dropout == PAPER_DROPOUT
    assert auto.fingerprint("whvi", "k") == paper.fingerprint("whvi", "k")
    assert auto.fingerprint("mcd", "k") != paper.fingerprint("mcd", "k")
    others = (_config("auto", "table3"), _config("auto", nproc=2), _config("auto", methods=("whvi", "mfg")))
    for fixed in (*others, _config("auto", rows=AUTO_WIDE_FROM_ROWS)):
        assert fixed.dropout == PAPER_DROPOUT and not fixed.for_method("mcd").choosing
    assert _config("auto", rows=AUTO_WIDE_FROM_ROWS) == _config(PAPER_DROPOUT, rows=AUTO_WIDE_FROM_ROWS)
    assert UCIConfig.from_protocol("table3", "robot", dropout="auto") == UCIConfig.from_protocol("table3", "robot")


def test_the_command_defaults_to_auto_and_keeps_the_papers_rate_for_classification(tmp_path, uci_configs, capsys):
    from pyro_whvi.experiments.cli import main

    configs = uci_configs
    args = ["uci", "--methods", "whvi,mcd", "--splits", "0", "--out", str(tmp_path)]
    for extra in ([], ["--dropout", "auto"], ["--protocol", "table3"], ["--dropout", "0.01,0.1"], ["--nproc", "2"]):
        assert main([*args, "--dataset", "diabetes", *extra]) == 0
    assert [c.dropout for c in configs] == [DROPOUT_GRID, DROPOUT_GRID, PAPER_DROPOUT, (0.01, 0.1), PAPER_DROPOUT]
    assert main([*args, "--dataset", "digits"]) == 0  # classification: not measured with the choice
    assert configs[-1].dropout == PAPER_DROPOUT
    with pytest.raises(SystemExit) as exited:
        main([*args, "--dataset", "diabetes", "--dropout", "grid"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and "--dropout" in stderr and "'grid'" in stderr
    assert "Traceback" not in stderr
    for mixed in ("auto,0.1", "0.005, auto"):  # auto is not a rate among rates
        with pytest.raises(SystemExit) as exited:
            main([*args, "--dataset", "diabetes", "--dropout", mixed])
        stderr = capsys.readouterr().err
        assert exited.value.code == 2 and "auto alone, or one rate below 1" in stderr and repr(mixed) in stderr
