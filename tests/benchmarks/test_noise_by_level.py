"""``benchmarks/noise_by_level.py``: a model's distance to the floor split by the test rows' true noise."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pyro_whvi.experiments.noisy_sets import write_noisy_set

from ..helpers import write_uci
from .in_process import run_main, script


def test_each_group_gets_its_rows_numbers_in_closed_form():
    # Four rows, two noise levels (1 and 2) in two groups; two draws of f at y +- a around targets y, so the
    # posterior mean's error is 0 and the unbiased variance over the draws 2 a^2; a head of 1 and 3 per draw.
    a = 0.5
    y = torch.tensor([0.3, -1.0, 2.0, 0.7])
    sigma = torch.tensor([2.0, 1.0, 1.0, 2.0])
    f = torch.stack([y + a, y - a])
    noise = torch.tensor([1.0, 3.0])[:, None].expand(2, 4)
    with script("noise_by_level") as module:
        low, high = module.by_level(f, noise, y, sigma, bins=2)
    for group, level in ((low, 1.0), (high, 2.0)):
        assert group["sigma"] == pytest.approx(level)
        assert group["noise2"] == pytest.approx((1 + 9) / 2 / level**2)
        assert group["var_f"] == pytest.approx(2 * a**2 / level**2)
        assert group["error2"] == pytest.approx(0.0)
        assert group["noise_cv"] == pytest.approx(math.sqrt(2) / 2)  # std [1, 3] over mean 2
        density = 0.5 * sum(math.exp(-(a**2) / (2 * s**2)) / math.sqrt(2 * math.pi * s**2) for s in (1.0, 3.0))
        floor = 0.5 * math.log(2 * math.pi * level**2) + 0.5
        assert group["mnll_above_floor"] == pytest.approx(-math.log(density) - floor)
    # One learned noise scale (a scalar): no spread over the draws.
    (group,) = module.by_level(f, torch.tensor(0.5), y, sigma, bins=1)
    assert group["noise_cv"] == 0 and group["noise2"] == pytest.approx(0.25 / 2.5)
    # A draw 100 noise scales off: its density underflows, its log-density is finite (-0.5 * 100**2 - ...).
    (far,) = module.by_level(f + 10.0, torch.tensor(0.1), y, sigma, bins=1)
    assert math.isfinite(far["mnll_above_floor"]) and far["mnll_above_floor"] > 4000


def test_the_script_trains_each_method_and_writes_a_row_per_group(tmp_path):
    write_noisy_set("hartmann4", tmp_path / "h4", num_points=120, splits=1, profile="ramp")
    argv = ["--data-dir", str(tmp_path / "h4"), "--methods", "whvi,mcd", "--steps", "3", "--samples", "4"]
    code, stdout, stderr = run_main("noise_by_level", [*argv, "--out", str(tmp_path / "out")])
    assert code == 0, stderr
    rows = json.loads((tmp_path / "out" / "noise_by_level_h4_table3_heteroscedastic.json").read_text())["results"]
    assert [(r["method"], r["level"]) for r in rows] == [(m, k) for m in ("whvi", "mcd") for k in range(3)]
    assert rows[0]["sigma"] < rows[1]["sigma"] < rows[2]["sigma"]
    assert all(math.isfinite(r[k]) for r in rows for k in ("mnll_above_floor", "noise2", "var_f", "error2"))
    assert "| mcd | 0 | 2 |" in stdout


def test_a_set_with_one_noise_level_is_refused_with_the_fix(tmp_path):
    write_noisy_set("hartmann4", tmp_path / "flat", num_points=60, splits=1)
    code, _, stderr = run_main("noise_by_level", ["--data-dir", str(tmp_path / "flat")])
    assert code != 0 and "one noise value per row" in stderr and "--noise-profile ramp" in stderr
    write_uci(tmp_path / "plain", rows=40)
    code, _, stderr = run_main("noise_by_level", ["--data-dir", str(tmp_path / "plain")])
    assert code != 0 and "--noise-profile ramp" in stderr
    code, _, stderr = run_main("noise_by_level", ["--data-dir", str(tmp_path / "flat"), "--bins", "0"])
    assert code != 0 and "--bins" in stderr
