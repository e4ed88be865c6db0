"""The VSD benchmark scripts run end to end on tiny settings and write their outputs: in the test's process
(:mod:`.in_process`), and as a command where a run starts worker processes."""

from __future__ import annotations

import json

import pyro.infer.elbo
import pytest
import torch

from pyro_whvi.data import load_digits_split, load_uci_split
from pyro_whvi.train.selection import holdout

from ..helpers import ROOT, run_python, uci_directory
from .in_process import run_main, script

pytestmark = pytest.mark.slow  # each runs a benchmark script end to end


def _run(name: str, argv: list[str]) -> None:
    """``benchmarks/<name>.py ARGV`` in this process."""
    status, _, stderr = run_main(name, argv)
    assert status == 0, stderr[-3000:]


def _run_command(name: str, argv: list[str]) -> None:
    """``benchmarks/<name>.py ARGV`` in a fresh interpreter (for ``--jobs N``: spawned workers import the script)."""
    argv = [str(ROOT / "benchmarks" / f"{name}.py"), *argv]
    result = run_python(f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')")
    assert result.returncode == 0, result.stderr[-3000:]


def test_digits_benchmark(tmp_path):
    argv = ["--models", "mlp,cnn", "--seeds", "1", "--steps", "4", "--eval-every", "2", "--samples", "3"]
    argv += ["--val-samples", "3"]  # the default 30 made the validation checks most of the run
    _run("vsd_digits", [*argv, "--kl-weights", "0.01,0.1", "--dropouts", "0.2", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_digits_mlp-cnn.json").read_text())
    assert {(r["model"], r["method"]) for r in record["results"]} == {
        (m, k) for m in ("mlp", "cnn") for k in ("vsd", "mcd", "mfg")
    }
    test_size = len(load_digits_split(seed=0).y_test)
    for r in record["results"]:  # each method's own grid; the error is a count of test digits
        assert r["setting"] in ((0.2,) if r["method"] == "mcd" else (0.01, 0.1)), r
        assert r["error"] * test_size == pytest.approx(round(r["error"] * test_size), abs=1e-3), r  # float32
    assert (tmp_path / "vsd_digits_mlp-cnn.png").is_file()


def test_digits_benchmark_iblm_init(tmp_path):
    argv = ["--models", "mlp", "--seeds", "1", "--steps", "2", "--eval-every", "1", "--samples", "3", "--init", "iblm"]
    argv += ["--val-samples", "3", "--kl-weights", "0.01", "--dropouts", "0.2"]
    _run("vsd_digits", [*argv, "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_digits_mlp.json").read_text())
    assert record["meta"]["config"]["init"] == "iblm"
    assert {r["method"] for r in record["results"]} == {"vsd", "mcd", "mfg"}


def test_uci_benchmark(tmp_path):
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    argv = ["--data-dir", str(data), "--splits", "1", "--steps", "4", "--eval-every", "2", "--fixed-noise-steps", "2"]
    argv += ["--init", "prior", "--noise-scales", ""]  # learned noise
    _run("vsd_uci", [*argv, "--samples", "3", "--val-samples", "3", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_uci_toyuci.json").read_text())
    assert [r["method"] for r in record["meta"]["summary"]] == ["vsd", "mcd"]
    assert all(r["fixed_noise"] is None for r in record["results"])
    report = (tmp_path / "vsd_uci_toyuci.md").read_text()
    assert "test log-likelihood" in report and "VSD from a prior draw" in report


def test_uci_benchmark_defaults_iblm_and_fixed_noise_grid(tmp_path):
    """By default VSD starts from I-BLM and the noise std is a held-fixed candidate chosen with the
    method's setting; a method run alone (in this process) gives the same rows as in a run with both on two
    worker processes (a command)."""
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    argv = ["--data-dir", str(data), "--splits", "1", "--steps", "4", "--eval-every", "2"]
    argv += ["--kl-weights", "0.1", "--dropouts", "0.05", "--samples", "3", "--val-samples", "3"]
    _run_command("vsd_uci", [*argv, "--jobs", "2", "--out", str(tmp_path / "both")])
    record = json.loads((tmp_path / "both" / "vsd_uci_toyuci.json").read_text())
    assert record["meta"]["config"]["init"] == "iblm"
    grid = (0.15, 0.2, 0.25, 0.3, 0.4)
    y_std = float(record["results"][0]["noise_scale"]) / float(record["results"][0]["fixed_noise"])
    for row in record["results"]:
        assert row["fixed_noise"] in grid
        assert abs(row["noise_scale"] - row["fixed_noise"] * y_std) < 1e-9 * y_std  # held fixed: not trained
    report = (tmp_path / "both" / "vsd_uci_toyuci.md").read_text()
    assert f"fixed noise std from {list(grid)}" in report and "VSD from I-BLM" in report
    for method in ("vsd", "mcd"):
        _run("vsd_uci", [*argv, "--methods", method, "--out", str(tmp_path / method)])
        alone = json.loads((tmp_path / method / "vsd_uci_toyuci.json").read_text())["results"]
        together = [row for row in record["results"] if row["method"] == method]
        for row in (*alone, *together):
            del row["train_seconds"]
        assert alone == together


def test_uci_benchmark_vsd_noise_placement(tmp_path):
    """VSD's structured noise is on the inputs of both layers; ``--vsd-hidden-only`` keeps it where MC dropout drops."""
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    sites = []
    with script("vsd_uci") as vsd_uci:
        for extra in ([], ["--vsd-hidden-only"]):
            argv = ["--data-dir", str(data), "--steps", "2", "--eval-every", "1", "--val-samples", "2", *extra]
            args = vsd_uci.parse_args(argv)
            split = load_uci_split(args.data_dir, 0)
            fit, val = holdout(len(split.y_train), args.val_fraction, 0)
            *_, guide, _ = vsd_uci.fit_candidate("vsd", (0.1, 0.2), split, fit, val, 0, args)
            sites.append(sorted(guide.vsd_sites))
    default, hidden_only = sites
    assert default == ["layers.0.weight", "layers.1.weight"]
    assert hidden_only == ["layers.1.weight"]


def test_uci_benchmark_minibatches_cover_each_epoch(tmp_path, monkeypatch):
    """``--batch-size B``: each step sees B examples (the last of an epoch fewer) with the likelihood
    scaled to the fit part, and every fit example once per epoch."""
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    seen = []
    original_forward = pyro.infer.elbo.ELBOModule.forward

    def recording_forward(self, x, y, **kwargs):
        seen.append((x.clone(), kwargs.get("num_data")))
        return original_forward(self, x, y, **kwargs)

    monkeypatch.setattr(pyro.infer.elbo.ELBOModule, "forward", recording_forward)
    with script("vsd_uci") as vsd_uci:
        argv = ["--data-dir", str(data), "--batch-size", "7", "--steps", "12", "--eval-every", "6"]
        args = vsd_uci.parse_args([*argv, "--val-samples", "2"])
        split = load_uci_split(args.data_dir, 0)
        fit, val = holdout(len(split.y_train), args.val_fraction, 0)
        vsd_uci.fit_candidate("mcd", (0.1, 0.2), split, fit, val, 0, args)
    x_fit = split.x_train[fit]
    sizes = [len(x) for x, _ in seen]
    assert {n for _, n in seen} == {len(fit)}, [n for _, n in seen]
    per_epoch = -(-len(fit) // 7)
    epoch = [x for x, _ in seen[:per_epoch]]
    assert sizes[:per_epoch] == [7] * (per_epoch - 1) + [len(fit) - 7 * (per_epoch - 1)], sizes
    rows = sorted(map(tuple, torch.cat(epoch).tolist()))
    assert rows == sorted(map(tuple, x_fit.tolist())), "an epoch does not visit each fit example once"
    status, _, stderr = run_main("vsd_uci", ["--data-dir", str(data), "--batch-size", "-1"])
    assert status != 0 and "--batch-size -1" in stderr


def test_uci_benchmark_rejects_a_missing_first_split_and_no_workers(tmp_path):
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    status, _, stderr = run_main("vsd_uci", ["--data-dir", str(data), "--first-split", "1"])
    assert status != 0 and "--first-split 1" in stderr and "splits 0 to 0" in stderr
    status, _, stderr = run_main("vsd_uci", ["--data-dir", str(data), "--jobs", "0"])
    assert status != 0 and "--jobs 0" in stderr


def test_speed_benchmark(tmp_path):
    _run("vsd_speed", ["--networks", "mlp 400x2", "--repeats", "1", "--batch-size", "400", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "vsd_speed.json").read_text())["results"]
    assert {r["method"] for r in rows} >= {"deterministic", "vsd T=1", "vsd T=2"}
    deterministic = {r["network"]: r["epoch_seconds"] for r in rows if r["method"] == "deterministic"}
    for r in rows:  # the ratio is of this table's epoch times
        assert r["ratio"] == pytest.approx(r["epoch_seconds"] / deterministic[r["network"]]), r
