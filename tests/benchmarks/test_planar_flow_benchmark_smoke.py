"""The planar-flow benchmark runs end to end on a tiny sweep, in the test's process, and writes its outputs; the
baseline step really runs Pyro's modules and leaves the fused path in place afterwards."""

from __future__ import annotations

import json

from pyro_whvi.distributions.planar import _OwnCache

from .in_process import run_main


def test_planar_flow_benchmark_tiny(tmp_path):
    fused_call = _OwnCache._call
    argv = ["--sizes", "8", "--rounds", "1", "--min-run-time", "0.01", "--out", str(tmp_path)]
    status, _, stderr = run_main("planar_flow", argv)
    assert status == 0, stderr[-3000:]
    assert _OwnCache._call is fused_call
    rows = {row["case"]: row for row in json.loads((tmp_path / "planar_flow.json").read_text())["results"]}
    assert sorted(rows) == ["NF-WHVI toy step", "planar (128, 8)", "planar (8,)"]
    for row in rows.values():
        assert row["pyro (us)"] > 0 and row["fused (us)"] > 0
        ratio = row["pyro (us)"] / row["fused (us)"]  # the row's times are rounded to 0.1 us
        assert abs(row["speed-up of fused"] - ratio) <= 0.01 + 0.002 * ratio
    assert (tmp_path / "planar_flow.md").read_text().startswith("| case |")
