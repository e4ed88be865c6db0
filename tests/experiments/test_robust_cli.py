"""The ``whvi`` commands at the edges (issue 51): sizes that would not fit in memory are refused before anything
is allocated, absurd counts get a stated maximum, duplicates run once, Ctrl-C and divergence end in one line,
notices about damaged files survive warning filters, ``whvi synthetic``'s limits, resumed splits' time."""

from __future__ import annotations

import json
import re
import sys
import warnings
from fractions import Fraction

import pytest
import torch
from tqdm.auto import tqdm

import pyro_whvi.experiments.memory_budget as memory_budget
from pyro_whvi.experiments import uci
from pyro_whvi.experiments.cli import main
from pyro_whvi.experiments.methods import build_method, predictive_samples
from pyro_whvi.experiments.noisy_sets import write_noisy_set
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.train import engine
from pyro_whvi.train.checkpoints import Checkpoint, read_checkpoint, resumed_seconds, save_checkpoint
from pyro_whvi.train.files import notice
from pyro_whvi.train.stops import TrainingDiverged, TrainingInterrupted

from ..helpers import whvi_in_process, write_uci

TINY = ["--methods", "mfg", "--splits", "0", "--steps", "2", "--hidden", "4", "--batch-size", "8", "--samples", "2"]


def _exit(argv: list[str]) -> tuple[int, str]:
    """``whvi ARGV`` in-process: its exit status and its stderr."""
    code, _, stderr = whvi_in_process(*argv)
    return code, stderr


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def toy(tmp_path):
    write_uci(tmp_path / "toy", rows=40, splits=2)
    return tmp_path / "toy"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--data-dir", "TOY", "--hidden", "1000000000"], "--hidden"),
        (["--data-dir", "TOY", "--hidden", "64", "--layers", "1000000"], "--layers"),
        (["--data-dir", "BIG", "--samples", "1000000"], "--samples"),
        (["--data-dir", "TOY", "--nproc", "64", "--batch-size", "64"], "--nproc"),
    ],
)
def test_sizes_that_do_not_fit_are_refused_before_allocating(tmp_path, toy, capsys, monkeypatch, args, flag):
    monkeypatch.setattr(memory_budget, "available_memory", lambda: 2 * 10**9)
    monkeypatch.setattr(uci, "build_method", lambda *a, **k: pytest.fail("allocated before the check"), raising=False)
    monkeypatch.setattr(uci, "run_split", lambda *a, **k: pytest.fail("trained before the check"))
    write_uci(tmp_path / "big", rows=2000, splits=1)  # 200 test rows
    folders = {"TOY": str(toy), "BIG": str(tmp_path / "big")}
    argv = ["uci", *[folders.get(a, a) for a in args], "--splits", "0", "--out", str(tmp_path / "out")]
    code, stderr = _exit(argv)
    line = _one_line(stderr)
    assert code == 2 and f"{flag} " in line and "of memory, 2 GB available" in line, line
    largest = int(re.search(rf"choose {flag} (\d+) or less", line)[1])
    assert 1 <= largest < int(args[args.index(flag) + 1])


def test_check_memory_names_the_heaviest_flag_and_the_largest_value_that_fits():
    estimate = lambda sizes: 1000 * sizes["--a"] + 10 * sizes["--b"]  # noqa: E731
    memory_budget.check_memory(estimate, {"--a": 5, "--b": 5}, "it", available=5050)  # fits: nothing raised
    with pytest.raises(ValueError, match=r"^--a 9: it needs about 9.05 kB of memory, 5.05 kB available; choose --a 5 "):
        memory_budget.check_memory(estimate, {"--a": 9, "--b": 5}, "it", available=5050)
    assert memory_budget.available_memory() is None or memory_budget.available_memory() > 0


def test_memory_is_not_checked_where_it_cannot_be_read(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_memory", lambda: None)
    memory_budget.check_memory(lambda sizes: 10.0 ** sizes["--a"], {"--a": 30}, "it")


def test_many_samples_are_predicted_in_chunks_with_progress(monkeypatch, capsys):
    torch.manual_seed(0)
    model, guide = build_method("mfg", [3, 8, 1])
    x = torch.randn(5, 3)
    guide(x, torch.randn(5))  # its parameters
    torch.manual_seed(1)
    whole = predictive_samples(model, guide, x, 7)
    import pyro_whvi.experiments.methods as methods

    sizes: list[int] = []
    real = methods.Predictive
    monkeypatch.setattr(
        methods,
        "Predictive",
        lambda *a, num_samples, **k: [sizes.append(num_samples), real(*a, num_samples=num_samples, **k)][1],
    )
    torch.manual_seed(1)
    assert torch.equal(predictive_samples(model, guide, x, 7), whole) and sizes == [7]  # one chunk: as before
    monkeypatch.setattr(memory_budget, "MAX_CHUNK_SAMPLES", 3)
    capsys.readouterr()
    f = predictive_samples(model, guide, x, 7, progress="split 0: predicting")
    assert f.shape == (7, 5) and sizes[1:] == [3, 3, 1]
    assert "split 0: predicting" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["uci", "--steps", "1e21"], "at most 10,000,000"),
        (["uci", "--steps", "1000000000000000000000"], "at most 10,000,000"),
        (["uci", "--fixed-noise-steps", "1e30"], "at most 10,000,000"),
        (["uci", "--samples", "1000000000"], "at most 1,000,000"),
        (["uci", "--timeout", "1e300"], "up to about four months"),
        (["uci", "--checkpoint-every", "0"], "expected a positive integer"),
        (["uci", "--seed", "-1"], "expected a non-negative integer"),
        (["demo", "--toy-steps", "1e21"], "at most 10,000,000"),
        (["demo", "--seed", "-5"], "non-negative"),
        (["gp", "--steps", "1000000000000000000000"], "at most 10,000,000 steps"),
        (["gp", "--lr-scale", "nan"], "--lr-scale must be a positive number"),
        (["gp", "--seed", "-1"], "--seed must be in [0, 2**32)"),
        (["gp", "--num-points", "2"], "at least 3"),
        (["gp", "--num-points", "1000000000000", "--functions", "borehole"], "--num-points 1000000000000: the"),
    ],
)
def test_absurd_counts_get_a_maximum_and_why(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(memory_budget, "available_memory", lambda: 10**10)
    code, stderr = _exit([*argv, "--out", str(tmp_path / "out")])
    assert code == 2 and message in _one_line(stderr), stderr


def test_duplicate_methods_are_one_method(tmp_path, toy, capsys):
    assert UCIConfig(methods=("mfg", "mfg", "whvi"), splits=(1, 1)).methods == ("mfg", "whvi")
    argv = ["uci", "--data-dir", str(toy), *TINY, "--out", str(tmp_path / "out")]
    assert main([*argv, "--methods", "mfg,mfg"]) == 0
    results = json.loads((tmp_path / "out" / "uci_toy.json").read_text())
    assert [row["splits"] for row in results["results"]] == [1] and len(results["meta"]["splits"]) == 1
    assert "| mfg | 1 |" in capsys.readouterr().out


def _raise(error: BaseException):
    def run(*args, **kwargs):
        raise error

    return run


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (TrainingInterrupted(17), 130, "whvi uci: interrupted at step 17; rerun the same command to resume"),
        (KeyboardInterrupt(), 130, "whvi uci: interrupted; rerun the same command to resume"),
        (TrainingDiverged(5, "the loss became nan; lower the learning rate (lr / --lr, now 1e+06)"), 1,
         "whvi uci: error: training diverged at step 5: the loss became nan; lower the learning rate (lr / --lr, now "
         "1e+06)"),
    ],
)  # fmt: skip
def test_ctrl_c_and_divergence_end_in_one_line(tmp_path, toy, capsys, monkeypatch, error, code, line):
    monkeypatch.setattr(uci, "run_uci", _raise(error))
    assert _exit(["uci", "--data-dir", str(toy), *TINY, "--out", str(tmp_path)]) == (code, line + "\n")


def test_ctrl_c_in_training_names_the_step_and_a_rerun_counts_the_whole_split(tmp_path, toy, capsys, monkeypatch):
    real = engine.save_checkpoint

    def then_ctrl_c(checkpoint, *args):
        real(checkpoint, *args)
        raise KeyboardInterrupt

    argv = ["uci", "--data-dir", str(toy), *TINY, "--steps", "6", "--checkpoint-every", "2", "--out", str(tmp_path)]
    monkeypatch.setattr(engine, "save_checkpoint", then_ctrl_c)
    code, stderr = _exit(argv)  # below the progress bars, one line
    assert code == 130 and "Traceback" not in stderr
    assert stderr.endswith("\nwhvi uci: interrupted at step 2; rerun the same command to resume\n"), stderr
    path = tmp_path / "runs" / "toy" / "mfg" / "split0.ckpt"
    state = torch.load(path, weights_only=True)
    assert 0 < state["seconds"] < 60
    torch.save({**state, "seconds": 1000.0}, path)  # as if the first two steps had taken 1000 s
    monkeypatch.setattr(engine, "save_checkpoint", real)
    assert main(argv) == 0
    row = json.loads((tmp_path / "runs" / "toy" / "mfg" / "split0.json").read_text())["row"]
    assert 1000 < row["train_seconds"] < 1060


def test_checkpoint_notices_survive_warning_filters_with_a_short_reason(tmp_path, capsys):
    checkpoint = Checkpoint(tmp_path / "c.ckpt", 1, "key")
    reasons = {
        b"": "empty file",
        b"PK\x03\x04cut": "truncated, or not a PyTorch file",
    }
    torch.save(Fraction(1, 3), tmp_path / "object.pt")
    reasons[(tmp_path / "object.pt").read_bytes()] = "objects other than tensors"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # -W ignore, PYTHONWARNINGS=ignore
        for content, reason in reasons.items():
            checkpoint.path.write_bytes(content)
            assert read_checkpoint(checkpoint, 1, "per_rank") is None
            line = _one_line(capsys.readouterr().err)
            assert line.startswith(f"warning: {checkpoint.path} is unreadable (") and reason in line, line
            assert "weights_only" not in line and len(line) < 200 + len(str(checkpoint.path))
        save_checkpoint(Checkpoint(checkpoint.path, 1, "other"), {}, [], 1, 1, 0, "per_rank", torch.device("cpu"))
        assert read_checkpoint(checkpoint, 1, "per_rank") is None
        assert "belongs to another run" in _one_line(capsys.readouterr().err)
    assert resumed_seconds(checkpoint) == 0.0


def test_a_notice_is_a_line_of_its_own_above_the_progress_bar(capsys):
    bar = tqdm(total=10, file=sys.stderr, desc="training")
    bar.update(3)
    notice("runs/split0.json is unreadable (empty file)")
    bar.close()
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert "warning: runs/split0.json is unreadable (empty file)" in lines


def test_a_split_retrained_for_other_settings_is_said(tmp_path, toy, capsys):
    argv = ["uci", "--data-dir", str(toy), *TINY, "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*argv, "--steps", "3"]) == 0
    path = tmp_path / "runs" / "toy" / "mfg" / "split0.json"
    expected = f"warning: {path} was stored with other settings or data; training mfg on split 0 again"
    assert expected in capsys.readouterr().err.replace("\r", "\n").splitlines()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rows", "1"], "at least 10 rows expected (each 90/10 split needs a test row"),
        (["--rows", "5"], "at least 10 rows"),
        (["--noise", "1e300"], "expected a number from 1e-06 to 1e+06 (sigma / std(f)"),
        (["--noise", "0"], "from 1e-06 to 1e+06"),
        (["--splits", "1000000"], "at most 1,000"),
    ],
)
def test_synthetic_limits_get_one_line_with_the_reason(tmp_path, capsys, args, message):
    code, stderr = _exit(["synthetic", "--out", str(tmp_path), "--functions", "hartmann6", *args])
    assert code == 2 and message in _one_line(stderr) and not any(tmp_path.iterdir())


def test_synthetic_rerun_with_fewer_splits_removes_their_index_files(tmp_path):
    folder = tmp_path / "hartmann6"
    write_noisy_set("hartmann6", folder, num_points=20, splits=3)
    (folder / "index_train_notes.txt").write_text("mine")  # not a file the tool writes: kept
    write_noisy_set("hartmann6", folder, num_points=20, splits=1)
    index = sorted(path.name for path in folder.glob("index_*"))
    assert index == ["index_features.txt", "index_target.txt", "index_test_0.txt", "index_train_0.txt",
                     "index_train_notes.txt"]  # fmt: skip


def test_a_second_run_on_a_folder_in_use_refuses_in_one_line(tmp_path, toy, capsys):
    """``whvi uci`` holds its ``--out`` lock while it runs (the launcher and its ranks with it): a second run on the
    same folder refuses before training instead of racing on its files; once the first ends, a rerun works."""
    from pyro_whvi.train.folder_lock import folder_lock

    out = tmp_path / "out"
    argv = ["uci", "--data-dir", str(toy), *TINY, "--out", str(out)]
    with folder_lock(out):  # a live run holds the folder
        code, stderr = _exit(argv)
        assert code == 1 and "is in use by another run" in _one_line(stderr)
        assert not (out / "runs").exists()
    assert main(argv) == 0 and (out / "uci_toy.json").is_file()
