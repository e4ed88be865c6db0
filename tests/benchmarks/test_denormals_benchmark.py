"""``benchmarks/denormals.py``: its count of subnormal weights, and the script end to end on a few steps."""

from __future__ import annotations

import json

import pytest
import torch

from pyro_whvi.train.denormals import flushing_denormals

from ..experiments.test_data import _load_script
from ..helpers import ROOT
from .in_process import run_main


@pytest.fixture
def denormals(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return _load_script("denormals")


def test_subnormal_fraction_counts_only_the_nonzero_numbers_below_the_smallest_normal(denormals):
    tiny = torch.finfo(torch.float32).tiny
    values = torch.tensor([0.0, tiny / 4, -tiny / 2, tiny, 1.0, -2 * tiny, 1e-45, 3.0], dtype=torch.float32)
    assert denormals.subnormal_fraction([values[:4], values[4:]]) == pytest.approx(3 / 8)  # tiny/4, -tiny/2, 1e-45


def test_script_times_both_modes_from_one_state_and_leaves_subnormals_kept(tmp_path):
    argv = ["--pretrain-steps", "2", "--timed-steps", "1", "--rounds", "2", "--out", str(tmp_path)]
    status, _, stderr = run_main("denormals", argv)
    assert status == 0, stderr[-3000:]
    data = json.loads((tmp_path / "denormals.json").read_text())
    kept, flushed = data["results"]
    assert (kept["subnormals"], flushed["subnormals"]) == ("kept", "flushed")
    assert len(kept["rounds_ms"]) == len(flushed["rounds_ms"]) == 2
    assert kept["ratio_to_flushed"] == pytest.approx(kept["ms_per_step"] / flushed["ms_per_step"])
    assert 0 <= data["meta"]["subnormal_fraction"] <= 1
    assert "| kept |" in (tmp_path / "denormals.md").read_text()
    assert not flushing_denormals()
