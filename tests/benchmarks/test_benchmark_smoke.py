"""The benchmark script runs end to end on a tiny sweep and writes its outputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_fwht_benchmark_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_fwht", ROOT / "benchmarks" / "fwht.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the benchmark measures fp32
    try:
        assert module.main(["--quick", "--max-log2-d", "5", "--batch", "8", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_default_dtype(previous)
    data = json.loads((tmp_path / "fwht_quick.json").read_text())
    methods = {(r["op"], r["method"]) for r in data["results"]}
    assert {("fwht", "clone"), ("fwht", "reference"), ("whvi_matvec", "dense matmul")} <= methods
    assert {r["D"] for r in data["results"]} == {16, 32}  # the sweep asked for: D = 2^4 .. 2^5
    # The ratios are of the times in this table: to the compiled kernel (where it ran) and to the clone floor.
    times = {(r["op"], r["D"], r["method"]): r["time_us"] for r in data["results"]}
    for r in data["results"]:
        compiled = times.get((r["op"], r["D"], "compiled"))
        if compiled is not None:
            assert r["x_compiled"] == pytest.approx(r["time_us"] / compiled), r
        assert r["x_clone"] == pytest.approx(r["time_us"] / times["fwht", r["D"], "clone"]), r
    assert (tmp_path / "fwht_quick.csv").is_file() and (tmp_path / "fwht_quick.md").is_file()
