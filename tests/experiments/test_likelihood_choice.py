"""``whvi uci --likelihood by-residuals`` (WHVI's ``auto`` from 3,000 training rows): one noise scale, then the
mean-variance head where a variance model of the inputs gains :data:`NOISE_GAIN_THRESHOLD` nats a row on the
training residuals. The gain is the Jensen gap of a known variance function and about 0 without one; each branch
trains exactly what ``--likelihood gaussian`` or ``heteroscedastic`` trains; a rerun does not repeat the check."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from pyro_whvi.experiments import likelihood_choice, uci
from pyro_whvi.experiments.likelihood_choice import (
    NOISE_GAIN_THRESHOLD,
    noise_variation_gain,
    spread_share,
    train_choosing_likelihood,
)
from pyro_whvi.experiments.methods import Schedule, parse_method
from pyro_whvi.experiments.uci_config import BY_RESIDUALS, UCIConfig
from pyro_whvi.experiments.uci_data import data_key, load_dataset_split

from ..helpers import whvi_in_process


def _jensen_gap(variance: torch.Tensor) -> float:
    """The test MNLL one (best) noise variance loses to the true ``variance`` per row."""
    return 0.5 * (variance.mean().log() - variance.log().mean()).item()


@pytest.mark.parametrize(("rows", "features"), [(4000, 4), (20000, 9)])
def test_the_gain_is_about_zero_where_the_noise_is_one_level(rows, features):
    # Twice the gain of k - 1 free coefficients on residuals of one variance is chi-squared with k - 1 degrees of
    # freedom (Wilks), so the corrected gain has mean 0 and standard deviation sqrt(2 (k - 1)) / (2 N): 0.0005 and
    # 0.00015 here; six of them bound every seed.
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, features, generator=generator)
    bound = 6 * math.sqrt(2 * 2 * features) / (2 * rows)
    for _ in range(5):
        gain = noise_variation_gain(x, 3.0 * torch.randn(rows, generator=generator))
        assert abs(gain) < bound, gain
    assert bound < NOISE_GAIN_THRESHOLD / 5  # far below the threshold from 3,000 rows on


@pytest.mark.parametrize("profile", ["log-linear", "ramp"])
def test_the_gain_is_the_jensen_gap_of_a_variance_that_varies(profile):
    # Log-linear: in the model, the estimate's error is the sampling error of the Gaussian log-likelihood's mean,
    # about sqrt(1 / (2 N)) = 0.005 here. The ramp (sigma grows linearly along x1, as `whvi synthetic --noise-profile
    # ramp` writes) is outside it; its log is close to quadratic on the design and the gap is within 0.02 of it.
    rows = 20000
    generator = torch.Generator().manual_seed(1)
    u = torch.rand(rows, 3, generator=generator)
    x = (u - 0.5) / math.sqrt(1 / 12)  # standardized, as whvi uci's inputs
    sigma = torch.exp(0.8 * x[:, 0]) if profile == "log-linear" else 0.2 + u[:, 0]
    gain = noise_variation_gain(x, sigma * torch.randn(rows, generator=generator))
    assert gain == pytest.approx(_jensen_gap(sigma**2), abs=0.025 if profile == "log-linear" else 0.02)
    assert gain > 5 * NOISE_GAIN_THRESHOLD


def test_repeated_features_count_once_and_bad_input_is_refused():
    # A binary input's square repeats it: the coefficients are counted by the rank, so the gain stays unbiased.
    generator = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(3000, 2, generator=generator), torch.randint(0, 2, (3000, 1), generator=generator)], 1)
    gains = [noise_variation_gain(x, torch.randn(3000, generator=generator)) for _ in range(5)]
    assert abs(sum(gains) / 5) < 0.001 and all(math.isfinite(gain) for gain in gains)
    with pytest.raises(ValueError, match=r"x \(N, D\) and residuals \(N,\) expected, got \(10, 2\) and \(9,\)"):
        noise_variation_gain(torch.randn(10, 2), torch.randn(9))
    with pytest.raises(ValueError, match="4 rows for 5 coefficients"):
        noise_variation_gain(torch.randn(4, 2), torch.randn(4))
    with pytest.raises(ValueError, match="finite residuals, not all zero"):
        noise_variation_gain(torch.randn(10, 1), torch.zeros(10))
    with pytest.raises(ValueError, match="finite residuals"):
        noise_variation_gain(torch.randn(10, 1), torch.full((10,), float("nan")))


def _write_line(folder, noise_std, rows=400, seed=0):
    """A UCI-format folder of y = x1 + noise (x uniform on [-1, 1]^2, one 90/10 split) with the noise's standard
    deviation ``noise_std(x1)``."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(rows, 2))
    y = x[:, 0] + noise_std(x[:, 0]) * rng.normal(size=rows)
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.column_stack([x, y]))
    np.savetxt(folder / "index_features.txt", [0, 1], fmt="%d")
    np.savetxt(folder / "index_target.txt", [2], fmt="%d")
    order = rng.permutation(rows)
    np.savetxt(folder / "index_train_0.txt", order[: rows * 9 // 10], fmt="%d")
    np.savetxt(folder / "index_test_0.txt", order[rows * 9 // 10 :], fmt="%d")
    return folder


CONFIG = UCIConfig(
    methods=("whvi",),
    splits=(0,),
    schedule=Schedule(steps=200, fixed_noise_steps=0, batch_size=None, lr=0.02),
    hidden=32,
    layers=1,
    samples=16,
    likelihood=BY_RESIDUALS,
    checkpoint_every=0,
    progress=False,
)
#: The gains measured on these 360 training rows after 200 steps: 0.002 and 0.41 (the two levels' Jensen gap is
#: 0.81), each an order of magnitude from the threshold.
SETS = {"one level": lambda x1: np.full_like(x1, 0.1), "two levels": lambda x1: np.where(x1 < 0, 0.05, 0.5)}


@pytest.mark.parametrize(("noise", "chosen"), [("one level", "gaussian"), ("two levels", "heteroscedastic")])
def test_each_choice_trains_what_that_likelihood_trains(tmp_path, noise, chosen):
    source = _write_line(tmp_path / "line", SETS[noise])
    rows, _ = uci.run_uci(source, CONFIG, tmp_path / "out", check=False)
    row = (uci.read_saved(tmp_path / "out" / "runs" / "line" / "whvi" / "split0.json"))["row"]
    assert row["likelihood"] == chosen
    assert (row["noise_gain"] >= NOISE_GAIN_THRESHOLD) == (chosen == "heteroscedastic")
    # The same seeded training as the likelihood given outright: the same metrics, to the last digit.
    alone, _ = uci.run_uci(source, replace(CONFIG, likelihood=chosen), tmp_path / chosen, check=False)
    assert rows[0]["rmse"] == alone[0]["rmse"] and rows[0]["mnll"] == alone[0]["mnll"]
    text = (tmp_path / "out" / "uci_line.md").read_text()
    assert "the likelihood chosen per split on the training residuals for whvi" in text
    shown = "head" if chosen == "heteroscedastic" else "one scale"
    assert f"whvi: {shown} ({row['noise_gain']:.3f}, {row['spread_share']:.2f})" in text
    assert 0 < row["spread_share"] < 1  # q's spread of f on the training rows, a share of the noise's variance


def test_a_rerun_reads_the_check_back(tmp_path, monkeypatch):
    # A split that chose the head and stopped while training it resumes the head, without the one noise scale or
    # the check again; the row's seconds count the first training's, as stored.
    source = _write_line(tmp_path / "line", SETS["two levels"])
    spec, store = parse_method("whvi"), tmp_path / "split0.likelihood.json"
    data = load_dataset_split(source, 0)
    first, chosen = train_choosing_likelihood(source, spec, 0, CONFIG, None, data, store=store)
    assert chosen["likelihood"] == "heteroscedastic" and store.exists()
    trained: list[str] = []
    original = likelihood_choice.train_split

    def counted(source, spec, split, settings, *args, **kwargs):
        trained.append(settings.likelihood)
        return original(source, spec, split, settings, *args, **kwargs)

    monkeypatch.setattr(likelihood_choice, "train_split", counted)
    monkeypatch.setattr(likelihood_choice, "residual_check", lambda *args: pytest.fail("checked again"))
    again, chosen_again = train_choosing_likelihood(source, spec, 0, CONFIG, None, data, store=store)
    assert trained == ["heteroscedastic"] and chosen_again == chosen
    fingerprint = CONFIG.fingerprint("whvi", data_key(source, 0))
    stored = likelihood_choice.read_check(store, fingerprint)
    assert stored is not None and stored[0] == {key: chosen[key] for key in ("noise_gain", "spread_share")}
    assert again.seconds > stored[1] and first.seconds > stored[1]  # the one scale's training and check counted
    # Another setting is another run: the stored check is not used.
    trained.clear()
    monkeypatch.undo()
    other = replace(CONFIG, seed=1)
    assert likelihood_choice.read_check(store, other.fingerprint("whvi", "elsewhere")) is None
    # A check of the code before the spread's share is checked again.
    saved = likelihood_choice.read_saved(store, "check")
    del saved["check"]["spread_share"]
    store.write_text(json.dumps(saved))
    assert likelihood_choice.read_check(store, fingerprint) is None
    store.write_text("{not json")
    assert likelihood_choice.read_check(store, CONFIG.fingerprint("whvi", "x")) is None


def test_the_spread_share_is_q_s_variance_of_f_over_the_noise_variance():
    # Samples whose variance per row is known exactly (a row's two values +-a: population variance a^2, and
    # torch.var's unbiased estimate 2 a^2 over S - 1 = 1), over the noise variance 0.5^2.
    a = torch.tensor([0.1, 0.2, 0.3])
    f = torch.stack([1.0 + a, 1.0 - a])
    assert spread_share(f, torch.tensor(0.5)) == pytest.approx((2 * a**2).mean().item() / 0.25, rel=1e-12)
    assert spread_share(torch.ones(8, 5), 0.3) == 0.0  # no spread of f: none of the noise is q's


def test_the_command_takes_it_and_refuses_it_where_it_cannot_apply(tmp_path):
    source = _write_line(tmp_path / "line", SETS["one level"], rows=60)
    common = ["uci", "--data-dir", str(source), "--splits", "0", "--steps", "2", "--samples", "2"]
    code, _, stderr = whvi_in_process(*common, "--methods", "whvi+iblm", "--likelihood", BY_RESIDUALS)
    assert code == 2 and "without '+iblm'" in stderr
    code, _, stderr = whvi_in_process(
        "uci", "--dataset", "breast_cancer", "--methods", "whvi", "--likelihood", BY_RESIDUALS, "--splits", "0"
    )
    assert code == 2 and "is for regression" in stderr
    code, out, stderr = whvi_in_process(
        *common, "--methods", "whvi", "--likelihood", BY_RESIDUALS, "--out", str(tmp_path)
    )
    assert code == 0, stderr
    assert "Likelihood chosen per split on the training residuals" in out
