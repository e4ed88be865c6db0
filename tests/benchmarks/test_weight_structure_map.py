"""``benchmarks/weight_structure_map.py``: point-estimate networks with dense and WHVI-structured weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pyro_whvi.distributions import WHVILayout
from pyro_whvi.distributions.whvi_matrix import whvi_weight

from ..helpers import write_uci
from .in_process import run_main, script


def test_a_structured_weight_is_its_terms_sum_over_root_terms_with_he_variance_at_the_start():
    with script("weight_structure_map") as module:
        torch.manual_seed(0)
        layer = module.StructuredLinear(8, 64, terms=3)
        layout = WHVILayout.for_shape((64, 8))
        expected = sum(whvi_weight(layer.s1[r], layer.g[r], layer.s2[r], layout) for r in range(3)) / math.sqrt(3)
        torch.testing.assert_close(layer.weight, expected)
        # An entry is s1_i s2_j sum_k H_ik g_k H_kj with H orthonormal (entries +-1/sqrt(D)): variance
        # E[s1^2] E[s2^2] D (1/D^2) (2 D / D_in) = 1.01^2 * 2 / D_in for each term, and the same for the sum over
        # sqrt(terms). 400 layers of 512 entries; the entries of one layer share s1, s2 and g, so count the
        # independent draws as the 400 layers x 64 rows: the variance's relative standard error is then about
        # sqrt(2 / 25,600) = 0.9%, and 4% is over four of them.
        weights = torch.stack([module.StructuredLinear(8, 64, terms=2).weight.detach() for _ in range(400)])
    assert weights.mean().item() == pytest.approx(0.0, abs=0.01)
    assert weights.var().item() == pytest.approx(1.01**2 * 2 / 8, rel=0.04)


def test_the_networks_have_the_layouts_parameters():
    with script("weight_structure_map") as module:
        dense = module.network("ddd", 5, 8, terms=1)
        structured = module.network("www", 5, 8, terms=2)
    # 5 -> 8 -> 8 -> 1 dense: weights and biases.
    assert sum(p.numel() for p in dense.parameters()) == 5 * 8 + 8 + 8 * 8 + 8 + 8 + 1
    # Two terms of s1, g, s2 per block: 8 x 5 and 8 x 8 are one 8-block each (the input padded to 8), the 1 x 8
    # last weight a vector of 8 on one 4 x 4 block (16 >= 8); plus the biases.
    assert sum(p.numel() for p in structured.parameters()) == 2 * 3 * 8 + 8 + 2 * 3 * 8 + 8 + 2 * 3 * 4 + 1


def test_the_script_fits_each_network_and_writes_its_rows(tmp_path):
    data = write_uci(tmp_path / "set", rows=40, features=3, splits=1)
    argv = ["--data-dir", str(tmp_path / "set"), "--nets", "ddd,wwd", "--terms", "1,2", "--steps", "300"]
    code, stdout, stderr = run_main("weight_structure_map", [*argv, "--lr", "0.01", "--out", str(tmp_path / "out")])
    assert code == 0, stderr
    rows = json.loads((tmp_path / "out" / "weight_structure_set.json").read_text())["results"]
    assert [(r["net"], r["terms"]) for r in rows] == [("ddd", 0), ("wwd", 1), ("wwd", 2)]
    assert all(math.isfinite(r[k]) for r in rows for k in ("train_rmse", "test_rmse", "test_mnll", "noise"))
    # 17,000 weights memorize 36 random rows in 300 steps: far below the targets' spread.
    assert rows[0]["train_rmse"] < 0.5 * np.std(data[:, 3])
    assert "| wwd | 2 |" in stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nets", "dxd"], "one letter each"),
        (["--nets", "w"], "two or more layers"),
        (["--terms", "0"], "positive integers"),
        (["--terms", "two"], "positive integers"),
        (["--steps", "0"], "--steps"),
        (["--lr", "nan"], "--lr"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(tmp_path, argv, message):
    write_uci(tmp_path / "set", rows=20, splits=1)
    code, _, stderr = run_main("weight_structure_map", ["--data-dir", str(tmp_path / "set"), *argv])
    assert code == 2 and message in stderr and "Traceback" not in stderr
    code, _, stderr = run_main("weight_structure_map", ["--data-dir", str(tmp_path / "missing")])
    assert code == 2 and "--data-dir" in stderr
