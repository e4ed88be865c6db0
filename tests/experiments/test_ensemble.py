"""Deep ensembles (``whvi uci --methods ensemble``, Lakshminarayanan et al. 2017): the mixture's MNLL against a
closed form, members that start apart and each learn, the predictive's noise on a set of known noise, the
command end to end (with the KL weight chosen on validation), an interrupted run resumed exactly, bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import combinations

import pyro
import pytest
import torch

from pyro_whvi.experiments import uci
from pyro_whvi.experiments.ensemble import ENSEMBLE_SIZE, EnsembleGuide, member_predictions
from pyro_whvi.experiments.memory_budget import dense_weights, mlp_bytes
from pyro_whvi.experiments.methods import Schedule, build_method, fit, parse_method, predictive_samples
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.experiments.uci_data import UCIData, load_dataset_split
from pyro_whvi.experiments.uci_report import evaluate
from pyro_whvi.experiments.uci_train import predict_split, train_split
from pyro_whvi.metrics import gaussian_mnll, rmse
from pyro_whvi.train import engine

from ..helpers import whvi_in_process, write_uci


def _normal_density(y: float, mean: float, sd: float) -> float:
    return math.exp(-0.5 * ((y - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))


def test_the_mixture_mnll_and_rmse_are_the_closed_forms_in_original_units():
    # Two components with their own means and standard deviations at three points (standardized units), and
    # the split's target scale 3: the density in original units is the standardized one over 3.
    means = torch.tensor([[0.0, 1.0, -2.0], [0.5, -1.0, 1.0]], dtype=torch.float64)
    sds = torch.tensor([[1.0, 0.5, 2.0], [0.2, 1.5, 0.3]], dtype=torch.float64)
    y = torch.tensor([0.3, 0.0, 1.2], dtype=torch.float64)
    closed = -sum(
        math.log(0.5 * _normal_density(y[n].item(), means[0, n].item(), sds[0, n].item())
                 + 0.5 * _normal_density(y[n].item(), means[1, n].item(), sds[1, n].item()))
        for n in range(3)
    ) / 3  # fmt: skip
    assert gaussian_mnll(means, sds, y) == pytest.approx(closed, rel=1e-12)
    data = UCIData(y[:, None], y, y[:, None], y, "regression", y_scale=3.0)
    row = evaluate(data, means, sds)
    assert row["mnll"] == pytest.approx(closed + math.log(3.0), rel=1e-12)
    assert row["rmse"] == pytest.approx(3.0 * math.sqrt(((means.mean(0) - y) ** 2).mean().item()), rel=1e-12)
    assert row["noise_scale"] == pytest.approx(3.0 * math.sqrt((sds**2).mean().item()), rel=1e-12)
    # One shared scale (every other method) is reported as it was.
    assert evaluate(data, means, torch.tensor(0.7))["noise_scale"] == pytest.approx(2.1)
    with pytest.raises(ValueError, match="regression split needs noise_scale"):
        evaluate(data, means, None)


def _sine(rows: int = 128, noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.linspace(-3, 3, rows)[:, None]
    return x, torch.sin(x[:, 0]) + noise * torch.randn(rows, generator=generator)


def _member_nll(means: torch.Tensor, sds: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -torch.distributions.Normal(means, sds).log_prob(y).mean(-1)


def _trained(steps: int, x: torch.Tensor, y: torch.Tensor, seed: int = 0):
    pyro.set_rng_seed(123)  # the members seed themselves: this must not matter
    pyro.clear_param_store()
    model, guide = build_method("ensemble", [1, 32, 32, 1])
    schedule = Schedule(steps=steps, batch_size=None, lr=0.02, fixed_noise_steps=0)  # full batches: fewer steps
    losses = fit("ensemble", model, guide, x, y, schedule, seed=seed, progress=False)
    return model, guide, losses


def test_members_start_apart_each_learns_and_the_predictive_finds_the_noise():
    x, y = _sine()
    start_model, start_guide, _ = _trained(1, x, y)
    start_means, start_sds = member_predictions(start_model, start_guide, x)
    assert start_means.shape == start_sds.shape == (ENSEMBLE_SIZE, 128)
    # Different initializations: every two members predict differently.
    assert min((a - b).abs().max().item() for a, b in combinations(start_means, 2)) > 0.05
    model, guide, losses = _trained(500, x, y)
    means, sds = member_predictions(model, guide, x)
    # Each member's NLL on the data falls from its (1-step) start: the same seed gives the same starts.
    start_nll, nll = _member_nll(start_means, start_sds, y), _member_nll(means, sds, y)
    assert (nll < start_nll - 0.5).all(), (start_nll, nll)
    assert losses[-1] < losses[0]
    # The heads' noise and the mixture's predictive sd, sqrt(mean(sd^2 + mean^2) - mean(mean)^2) (the variance of
    # the uniform mixture), on the data: the noise is 0.1, and 128 draws of it have a standard deviation within 13%
    # of 0.1 (two standard errors, 2 / sqrt(2 * 128)); the members' disagreement adds a little to the mixture's
    # (0.095 to 0.105 over three seeds). An untrained head (above 0.4 at the start), or one that has collapsed
    # onto the training rows, falls outside.
    assert 0.08 < sds.pow(2).mean().sqrt().item() < 0.12
    mixture_sd = ((sds**2 + means**2).mean(0) - means.mean(0) ** 2).sqrt().mean().item()
    assert 0.08 < mixture_sd < 0.125
    assert start_sds.mean().item() > 0.4  # where it started
    # The mixture's mean fits sin(x) better than the noise.
    assert rmse(means, torch.sin(x[:, 0])) < 0.06
    # predictive_samples gives the members' means, whatever the number of samples asked for.
    assert torch.equal(predictive_samples(model, guide, x, num_samples=64), means)


def test_classification_members_are_softmax_point_estimates():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, 2, generator=generator)
    labels = (x[:, 0] > 0).long()
    model, guide = build_method("ensemble", [2, 8, 2], likelihood="categorical")
    fit("ensemble", model, guide, x, labels, Schedule(steps=3, batch_size=None), progress=False)
    logits, scales = member_predictions(model, guide, x)
    assert logits.shape == (ENSEMBLE_SIZE, 40, 2) and scales is None


def test_bad_input_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"method 'ensemble\+iblm'.*use 'ensemble'"):
        parse_method("ensemble+iblm")
    with pytest.raises(ValueError, match=r"unknown method 'ensembles'.*vsd, ensemble"):
        parse_method("ensembles")
    model, _ = build_method("ensemble", [2, 4, 1])
    with pytest.raises(TypeError, match=r"build_method\('ensemble'"):
        fit("ensemble", model, object(), torch.zeros(4, 2), torch.zeros(4), progress=False)
    write_uci(tmp_path / "toy", rows=40, splits=1)
    code, _, stderr = whvi_in_process("uci", "--data-dir", str(tmp_path / "toy"), "--methods", "mcd,ensemble+iblm")
    assert code == 2 and "--methods" in stderr and "use 'ensemble'" in stderr and len(stderr.splitlines()) == 1


def test_the_memory_check_counts_five_networks():
    sizes = dict(units=20, batch=64, samples=64, test_rows=100, outputs=1, steps=1000, itemsize=4)
    one, five = mlp_bytes(("mcd",), 10**6, **sizes), mlp_bytes(("ensemble",), 10**6, **sizes)
    # One network training (32 values a weight) and four kept (2 each).
    assert five - one == pytest.approx(4 * (4 * 2 * 10**6) + 48 * 1000)


def test_uci_command_trains_the_ensemble_and_chooses_its_weight_decay(tmp_path):
    write_uci(tmp_path / "toy", rows=60, splits=1)
    argv = ["uci", "--data-dir", str(tmp_path / "toy"), "--methods", "mcd,ensemble", "--splits", "0", "--steps", "6"]
    argv += ["--hidden", "4", "--batch-size", "8", "--samples", "4", "--kl-weight", "1,0.01", "--out", str(tmp_path)]
    code, stdout, stderr = whvi_in_process(*argv)
    assert code == 0, stderr
    assert "| mcd | 1 |" in stdout and "| ensemble | 1 |" in stdout
    row = json.loads((tmp_path / "runs" / "toy" / "ensemble" / "split0.json").read_text())["row"]
    assert row["variational_parameters"] == ENSEMBLE_SIZE * dense_weights([3, 4, 4, 2])  # a mean and a variance
    assert set(row["validation_scores"]) == {"1.0", "0.01"} and row["kl_weight"] in (1.0, 0.01)
    assert all(math.isfinite(row[k]) for k in ("rmse", "mnll", "noise_scale"))
    assert not list((tmp_path / "runs").rglob("*.ckpt")) and not list((tmp_path / "runs").rglob("*.validation.json"))


def test_the_split_row_is_the_mixture_of_the_trained_members(tmp_path):
    write_uci(tmp_path / "toy", rows=60, splits=1)
    config = UCIConfig(methods=("ensemble",), splits=(0,), schedule=Schedule(steps=5, batch_size=8), hidden=4)
    config = replace(config, progress=False)
    data = load_dataset_split(tmp_path / "toy", 0)
    trained = train_split(tmp_path / "toy", parse_method("ensemble"), 0, config, data=data)
    assert isinstance(trained.guide, EnsembleGuide) and len(trained.losses) == 5
    means, sds = predict_split(trained, data.x_test, config)
    assert means.shape == sds.shape == (ENSEMBLE_SIZE, len(data.y_test))
    density = torch.distributions.Normal(means.double(), sds.double()).log_prob(data.y_test.double()).exp().mean(0)
    row, _ = uci.run_split(tmp_path / "toy", parse_method("ensemble"), 0, config, data=data)
    assert row["mnll"] == pytest.approx(-density.log().mean().item() + math.log(data.y_scale), rel=1e-5)


def test_an_interrupted_ensemble_resumes_every_member_exactly(tmp_path, monkeypatch):
    write_uci(tmp_path / "toy", rows=40, splits=1)
    tiny = ["--methods", "ensemble", "--splits", "0", "--steps", "6", "--hidden", "4", "--batch-size", "8"]
    tiny += ["--samples", "2", "--checkpoint-every", "2"]
    whole = ["uci", "--data-dir", str(tmp_path / "toy"), *tiny]
    assert whvi_in_process(*whole, "--out", str(tmp_path / "whole"))[0] == 0
    real = engine.save_checkpoint

    def ctrl_c_in_member_two(checkpoint, *args):
        real(checkpoint, *args)
        if "member2" in checkpoint.path.name:
            raise KeyboardInterrupt

    monkeypatch.setattr(engine, "save_checkpoint", ctrl_c_in_member_two)
    code, _, stderr = whvi_in_process(*whole, "--out", str(tmp_path / "cut"))
    assert code == 130 and "interrupted at step 2" in stderr
    runs = tmp_path / "cut" / "runs" / "toy" / "ensemble"
    assert sorted(p.name for p in runs.glob("*.ckpt")) == [f"split0.member{m}.ckpt" for m in range(3)]
    monkeypatch.setattr(engine, "save_checkpoint", real)
    assert whvi_in_process(*whole, "--out", str(tmp_path / "cut"))[0] == 0
    cut = json.loads((runs / "split0.json").read_text())["row"]
    uncut = json.loads((tmp_path / "whole" / "runs" / "toy" / "ensemble" / "split0.json").read_text())["row"]
    assert (cut["rmse"], cut["mnll"], cut["final_loss"]) == (uncut["rmse"], uncut["mnll"], uncut["final_loss"])
    assert not list(runs.glob("*.ckpt"))
