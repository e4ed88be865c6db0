"""``whvi uci`` and the UCI split loader on malformed input: every problem is one line naming the file,
the line and the fix (a ``ValueError`` from Python, exit status 2 from the command line); the results
cache is keyed by the data and written atomically."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pyro_whvi.data import load_uci_split
from pyro_whvi.experiments.cli import main
from pyro_whvi.experiments.methods import Schedule
from pyro_whvi.experiments.reporting import save_tables, write_atomic
from pyro_whvi.experiments.uci import UCIConfig, run_uci

from ..helpers import write_uci


def _lines(folder: Path, name: str) -> list[str]:
    return (folder / name).read_text().splitlines()


def _set(folder: Path, name: str, lines: list[str]) -> None:
    (folder / name).write_text("".join(line + "\n" for line in lines))


def _token(folder: Path, line: int, column: int, token: str) -> None:
    """Replace the token at 1-based ``line``/``column`` of data.txt."""
    lines = _lines(folder, "data.txt")
    tokens = lines[line - 1].split()
    tokens[column - 1] = token
    lines[line - 1] = " ".join(tokens)
    _set(folder, "data.txt", lines)


def _append(folder: Path, name: str, *tokens: str) -> None:
    _set(folder, name, [*_lines(folder, name), *tokens])


def _ragged(folder: Path) -> None:
    lines = _lines(folder, "data.txt")
    lines[4] = " ".join(lines[4].split()[:3])
    _set(folder, "data.txt", lines)


def _commas(folder: Path) -> None:
    lines = _lines(folder, "data.txt")
    lines[1] = ",".join(lines[1].split())
    _set(folder, "data.txt", lines)


def _overlap(folder: Path) -> None:
    _set(folder, "index_test_0.txt", [_lines(folder, "index_train_0.txt")[6], *_lines(folder, "index_test_0.txt")])


# (case, how to break a 40-row, 4-column folder, pieces of the one-line message)
MALFORMED = [
    ("inf", lambda f: _token(f, 3, 2, "inf"), ["data.txt, line 3, column 2", "'inf'", "finite"]),
    ("-inf", lambda f: _token(f, 7, 4, "-inf"), ["data.txt, line 7, column 4", "'-inf'"]),
    ("nan", lambda f: _token(f, 2, 1, "nan"), ["data.txt, line 2, column 1", "missing value"]),
    ("question mark", lambda f: _token(f, 9, 3, "?"), ["data.txt, line 9, column 3", "missing value", "impute"]),
    ("text", lambda f: _token(f, 4, 1, "abc"), ["data.txt, line 4, column 1", "'abc'", "expected a finite number"]),
    ("commas", _commas, ["data.txt, line 2, column 1", "commas"]),
    ("ragged row", _ragged, ["data.txt, line 5", "expected 4 columns", "found 3"]),
    ("overflow", lambda f: [_token(f, 1, 2, "1e308"), _token(f, 2, 2, "-1e308")], ["data.txt", "too large"]),
    ("binary", lambda f: (f / "data.txt").write_bytes(b"\xff\xfe\x00\x01\n"), ["data.txt, line 1, column 1"]),
    ("empty data", lambda f: _set(f, "data.txt", []), ["data.txt", "at least 2 rows", "found 0"]),
    ("one row", lambda f: _set(f, "data.txt", _lines(f, "data.txt")[:1]), ["data.txt", "at least 2 rows", "found 1"]),
    ("empty train index", lambda f: _set(f, "index_train_0.txt", []), ["index_train_0.txt is empty"]),
    ("empty features", lambda f: _set(f, "index_features.txt", [""]), ["index_features.txt is empty"]),
    ("index out of range", lambda f: _append(f, "index_train_0.txt", "40"), ["index_train_0.txt, line 37", "0 to 39"]),
    ("negative index", lambda f: _append(f, "index_test_0.txt", "-1"), ["index_test_0.txt, line 5", "got '-1'"]),
    ("fractional index", lambda f: _append(f, "index_train_0.txt", "0.5"), ["index_train_0.txt, line 37", "whole"]),
    ("text index", lambda f: _set(f, "index_target.txt", ["last"]), ["index_target.txt, line 1", "got 'last'"]),
    ("feature out of range", lambda f: _append(f, "index_features.txt", "4"), ["index_features.txt, line 4", "0 to 3"]),
    ("target in features", lambda f: _append(f, "index_features.txt", "3"), ["index_features.txt, line 4", "target"]),
    ("two targets", lambda f: _set(f, "index_target.txt", ["2", "3"]), ["index_target.txt", "exactly one", "2"]),
    ("test overlaps train", _overlap, ["index_test_0.txt, line 1", "also in index_train_0.txt"]),
    (
        "one training row",
        lambda f: _set(f, "index_train_0.txt", ["0"]),
        ["index_train_0.txt", "at least 2 rows", "found 1"],
    ),
]


@pytest.mark.parametrize(("case", "damage", "pieces"), MALFORMED, ids=[case for case, *_ in MALFORMED])
def test_malformed_folders_name_file_line_and_fix(tmp_path, capsys, case, damage, pieces):
    folder = tmp_path / "toy"
    write_uci(folder, rows=40, features=3, splits=1)
    damage(folder)
    with pytest.raises(ValueError) as caught:
        load_uci_split(folder, 0)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and all(piece in message for piece in pieces), message
    with pytest.raises(SystemExit) as exited:  # the command line stops before training, in one line
        main(["uci", "--data-dir", str(folder), "--splits", "0", "--out", str(tmp_path / "out")])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and stderr.splitlines() == [f"whvi uci: error: {message}"]
    assert not (tmp_path / "out" / "runs").exists()


def test_lenient_forms_still_load(tmp_path):
    """Blank lines, ``#`` comments, tabs and whole numbers written as floats (``np.savetxt``'s default
    format) are accepted, and line numbers count every line of the file."""
    folder = tmp_path / "toy"
    data = write_uci(folder, rows=20, features=2, splits=1)
    reference = load_uci_split(folder, 0)
    _set(folder, "data.txt", ["# header", *["\t".join(line.split()) for line in _lines(folder, "data.txt")], "", ""])
    np.savetxt(folder / "index_train_0.txt", np.loadtxt(folder / "index_train_0.txt"))  # 1.8e+01 and so on
    split = load_uci_split(folder, 0)
    assert split.y_mean == pytest.approx(reference.y_mean) and split.x_train.shape == (18, 2)
    assert split.y_std == pytest.approx(data[np.loadtxt(folder / "index_train_0.txt").astype(int), 2].std())
    _token(folder, 3, 1, "?")  # line 3 of the file is the second data row
    with pytest.raises(ValueError, match=r"data\.txt, line 3, column 1"):
        load_uci_split(folder, 0)


def _tiny(**changes) -> UCIConfig:
    config = UCIConfig(
        methods=("mfg",), splits=(0,), schedule=Schedule(steps=2, batch_size=8), hidden=4, samples=2, progress=False
    )
    return replace(config, **changes)


def _tamper(out: Path, name: str) -> Path:
    """Mark the stored result of mfg on split 0, so that a rerun shows whether it was read back."""
    path = out / "runs" / name / "mfg" / "split0.json"
    stored = json.loads(path.read_text())
    stored["row"]["rmse"] = 123.0
    path.write_text(json.dumps(stored))
    return path


def test_cache_is_keyed_by_the_data_not_the_folder_name(tmp_path):
    first, other, out = tmp_path / "a" / "toy", tmp_path / "b" / "toy", tmp_path / "out"
    write_uci(first, rows=20, splits=1, seed=0)
    write_uci(other, rows=20, splits=1, seed=1)
    run_uci(first, _tiny(), out)
    _tamper(out, "toy")
    assert run_uci(first, _tiny(), out)[0][0]["rmse"] == 123.0  # same data and settings: read back
    summary, _ = run_uci(other, _tiny(), out)  # another folder of the same name: trained on its own data
    assert summary[0]["rmse"] != 123.0
    assert json.loads((out / "uci_toy.json").read_text())["meta"]["dataset"] == str(other)
    _tamper(out, "toy")
    _token(other, 5, 1, "7.5")  # an edited data.txt: trained again
    assert run_uci(other, _tiny(), out)[0][0]["rmse"] != 123.0


@pytest.mark.parametrize("content", ["", '{"fingerprint": "0123", "row": {"rm'], ids=["empty", "truncated"])
def test_unreadable_split_file_is_named_and_trained_again(tmp_path, capsys, content):
    folder, out = tmp_path / "toy", tmp_path / "out"
    write_uci(folder, rows=20, splits=1)
    run_uci(folder, _tiny(), out)
    path = out / "runs" / "toy" / "mfg" / "split0.json"
    path.write_text(content)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # -W ignore hides warnings, not this notice
        summary, _ = run_uci(folder, _tiny(), out)
    (notice,) = [line for line in capsys.readouterr().err.splitlines() if str(path) in line]
    reason = "empty file" if not content else "Unterminated string starting at: line 1 column .*"
    assert re.fullmatch(
        re.escape(f"warning: {path} is unreadable (") + reason + r"\); training what it held again", notice
    )
    assert json.loads(path.read_text())["row"]["rmse"] == summary[0]["rmse"]
    path.write_text(content)  # the command line: one warning line, then the table
    args = ["uci", "--data-dir", str(folder), "--methods", "mfg", "--splits", "0", "--steps", "2", "--hidden", "4"]
    assert main([*args, "--batch-size", "8", "--samples", "2", "--out", str(out)]) == 0
    notices = [line for line in capsys.readouterr().err.splitlines() if str(path) in line]
    assert len(notices) == 1 and notices[0].startswith(f"warning: {path} is unreadable")


def test_result_files_are_replaced_atomically(tmp_path, monkeypatch):
    import pyro_whvi.train.files as results  # write_atomic lives there (reporting imports it)

    replaced: list[tuple[Path, Path]] = []
    real_replace = results.os.replace
    monkeypatch.setattr(results.os, "replace", lambda a, b: [replaced.append((Path(a), Path(b))), real_replace(a, b)])
    rows = [{"method": "a", "rmse": 1.0}]
    save_tables(tmp_path, "t", {}, rows, "| a |")
    assert sorted(target.name for _, target in replaced) == ["t.csv", "t.json", "t.md"]
    assert all(temp.parent == tmp_path for temp, _ in replaced) and sorted(p.name for p in tmp_path.iterdir()) == [
        "t.csv",
        "t.json",
        "t.md",
    ]

    def fail(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(tmp_path / "t.md", "new")
    assert (tmp_path / "t.md").read_text() == "| a |\n" and len(list(tmp_path.iterdir())) == 3  # no temp left


def test_split_results_are_written_through_write_atomic(tmp_path, monkeypatch):
    import pyro_whvi.experiments.uci as uci

    written: list[str] = []
    real = uci.write_atomic
    monkeypatch.setattr(uci, "write_atomic", lambda path, data: [written.append(path.name), real(path, data)])
    write_uci(tmp_path / "toy", rows=20, splits=1)
    run_uci(tmp_path / "toy", _tiny(), tmp_path / "out")
    assert written == ["split0.json"]


def test_unwritable_out_fails_before_training(tmp_path, capsys, monkeypatch):
    import pyro_whvi.experiments.uci as uci

    write_uci(tmp_path / "toy", rows=20, splits=1)
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(uci, "run_split", lambda *args: pytest.fail("trained before checking --out"))
    with pytest.raises(OSError, match="cannot write results to"):
        run_uci(tmp_path / "toy", _tiny(), tmp_path / "file" / "out")
    for out in (tmp_path / "file", tmp_path / "file" / "out"):
        with pytest.raises(SystemExit) as exited:
            main(["uci", "--data-dir", str(tmp_path / "toy"), "--splits", "0", "--out", str(out)])
        stderr = capsys.readouterr().err
        assert exited.value.code == 2 and len(stderr.splitlines()) == 1 and str(out) in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "4294967296"], "seed"),
        (["--dataset", "digits", "--splits", "0,99999999999"], "seed"),
        (["--lr", "inf"], "expected a positive number"),
        (["--dropout", "nan"], "expected a positive number"),
        (["--threads", "100000000000"], "--threads"),
        (["--splits", "0-100000000"], "at most"),
        (["--splits", "3-1"], "splits must look like"),
        (["--methods", "whvi,bbb"], "unknown method 'bbb'"),
        (["--steps"], "expected one argument"),
        (["--data-dir", "nowhere\x00"], "is not a UCI split directory"),
    ],
)
def test_bad_uci_arguments_get_one_line(tmp_path, capsys, monkeypatch, args, message):
    import torch

    import pyro_whvi.experiments.uci as uci

    monkeypatch.setattr(uci, "run_split", lambda *args: pytest.fail("trained with bad arguments"))
    threads = torch.get_num_threads()
    with pytest.raises(SystemExit) as exited:
        main(["uci", *args, "--out", str(tmp_path)])
    torch.set_num_threads(threads)
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and len(stderr.splitlines()) == 1 and message in stderr, stderr


def test_missing_splits_are_listed_in_one_line(tmp_path, capsys):
    write_uci(tmp_path / "toy", rows=20, splits=2)
    for args, message in (
        (["--splits", "0-9"], "has splits 0-1; asked for 2, 3, 4, 5, 6, ..."),
        ([], "no index_train"),
    ):
        if not args:
            for file in tmp_path.glob("toy/index_*_*.txt"):
                file.unlink()
        with pytest.raises(SystemExit):
            main(["uci", "--data-dir", str(tmp_path / "toy"), *args, "--out", str(tmp_path / "out")])
        stderr = capsys.readouterr().err
        assert len(stderr.splitlines()) == 1 and message in stderr, stderr


def test_dataset_named_after_the_resolved_folder(tmp_path, monkeypatch):
    write_uci(tmp_path / "toy", rows=20, splits=1)
    monkeypatch.chdir(tmp_path / "toy")
    run_uci(Path("."), _tiny(), tmp_path / "out")
    assert (tmp_path / "out" / "uci_toy.md").is_file() and (tmp_path / "out" / "runs" / "toy").is_dir()


def test_command_reads_each_split_once_before_training(tmp_path, monkeypatch):
    """``whvi uci`` validates the folder once (it used to load every split twice before training)."""
    import pyro_whvi.experiments.uci as uci
    import pyro_whvi.experiments.uci_data as uci_data

    write_uci(tmp_path / "toy", rows=40, features=3, splits=2)
    loaded: list[int] = []
    original = uci_data.load_uci_split

    def counting(folder, split, *args, **kwargs):
        loaded.append(split)
        return original(folder, split, *args, **kwargs)

    monkeypatch.setattr(uci_data, "load_uci_split", counting)
    argv = ["uci", "--data-dir", str(tmp_path / "toy"), "--splits", "0,1", "--methods", "mfg,mcd", "--steps", "2"]
    assert main([*argv, "--fixed-noise-steps", "0", "--samples", "2", "--out", str(tmp_path / "out")]) == 0
    # once by the check before training, once for the training of each split, whatever the number of methods
    assert sorted(loaded) == [0, 0, 1, 1], loaded
    assert uci.check_source is uci_data.check_source


def test_the_held_out_part_is_checked_on_the_split_with_fewest_training_rows(tmp_path):
    """``check_validation`` with the sizes ``check_source`` read (no second load of every split) refuses a
    ``val_fraction`` that leaves the smallest split no rows to validate on, as loading each split does."""
    from pyro_whvi.experiments.uci import check_source, check_validation

    write_uci(tmp_path / "toy", rows=40, features=3, splits=2)
    np.savetxt(tmp_path / "toy" / "index_train_1.txt", np.arange(3), fmt="%d")  # 3 training rows; split 0 has 36
    sizes = check_source(tmp_path / "toy", (0, 1))
    assert (sizes.train, sizes.fewest_train) == (36, 3)
    config = UCIConfig(methods=("mcd",), splits=(0, 1), dropout=(0.005, 0.1), val_fraction=0.1)
    for given in (sizes, None):
        with pytest.raises(ValueError, match=r"--val-fraction\) 0.1 of 3 training rows leaves 3 to train on and 0"):
            check_validation(tmp_path / "toy", config, given)
    check_validation(tmp_path / "toy", replace(config, splits=(0,)), check_source(tmp_path / "toy", (0,)))
    check_validation(tmp_path / "toy", replace(config, val_fraction=0.4), sizes)  # 2 to train on, 1 to validate
    with pytest.raises(ValueError, match="of 3 training rows leaves 1 to train on and 2"):
        check_validation(tmp_path / "toy", replace(config, val_fraction=0.6), sizes)
