"""The engine against Pyro's own SVI loop: the same steps give the same numbers, bit for bit.

``train(..., warm_up=False)`` builds its optimizer after the first forward pass, as ``SVI`` builds its per-parameter
optimizers; ``kl_weight`` is ``KLAnnealing`` around the model and the guide; ``KeepBest`` keeps the best-scoring
state. Every comparison is exact (``torch.equal``): the two loops do the same floating-point operations in the
same order, so any difference is a real change of the random stream, the gradients or the update.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_sample
from pyro.optim import PyroOptim

from pyro_whvi import KLAnnealing
from pyro_whvi.nn import BayesianMLP
from pyro_whvi.train.engine import Checkpoint, Minibatches, Schedule, optimize, train
from pyro_whvi.train.selection import KeepBest, holdout, select_best

from ..helpers import regression_data

STEPS, BATCH, LR = 12, 8, 0.01


def _model_and_guide(kind: str, seed: int = 0):
    pyro.set_rng_seed(seed)
    pyro.clear_param_store()
    model = BayesianMLP([5, 6, 1], dropout=0.2 if kind == "delta" else 0.0)
    guide = AutoDelta(model, init_loc_fn=init_to_sample) if kind == "delta" else AutoNormal(model)
    return model, guide


def _pyro_svi(kind: str, x, y, kl_weight: float, global_batches: bool) -> tuple[list[float], dict]:
    """The reference: Pyro's SVI with one (fused) Adam per parameter, batches drawn as ``Minibatches`` documents."""
    model, guide = _model_and_guide(kind)
    annealing = KLAnnealing(kl_weight)
    svi = SVI(annealing(model), annealing(guide), PyroOptim(torch.optim.Adam, {"lr": LR, "fused": True}), Trace_ELBO())
    generator = None if global_batches else torch.Generator().manual_seed(0)
    losses = []
    for _ in range(STEPS):
        index = torch.randint(0, len(y), (BATCH,), generator=generator)
        losses.append(svi.step(x[index], y[index], num_data=len(y)))
    return losses, {**model.state_dict(), **guide.state_dict()}


@pytest.mark.parametrize("kind", ["normal", "delta"])
@pytest.mark.parametrize("kl_weight", [1.0, 0.1])
@pytest.mark.parametrize("global_batches", [False, True])
def test_train_without_warm_up_is_pyro_svi_bit_for_bit(kind, kl_weight, global_batches):
    """AutoDelta with ``init_to_sample`` and dropout draws at set-up and in every step: the streams must align."""
    x, y = regression_data(40)
    expected_losses, expected_state = _pyro_svi(kind, x, y, kl_weight, global_batches)
    model, guide = _model_and_guide(kind)
    schedule = Schedule(STEPS, 0, BATCH, LR, lr_gamma=0.0, lr_power=0.0)
    sampler = Minibatches(len(y), BATCH, seed=None if global_batches else 0)
    losses = train(model, guide, x, y, schedule, kl_weight=kl_weight, warm_up=False, sampler=sampler, progress=False)
    assert losses == pytest.approx(expected_losses, rel=1e-6)  # SVI returns the float64 sum of float32 terms
    state = {**model.state_dict(), **guide.state_dict()}
    assert state.keys() == expected_state.keys()
    for name, value in expected_state.items():
        assert torch.equal(state[name], value), name


def test_kl_weight_scales_exactly_the_latent_terms():
    """With the guide's draws fixed, the loss is ``-log p(y|w) + lambda (log q(w) - log p(w))``."""
    x, y = regression_data(16)
    model, guide = _model_and_guide("normal")
    guide(x, y)
    elbo = Trace_ELBO()(model, guide)
    terms = {}
    for weight in (1.0, 0.25, 0.0):
        pyro.set_rng_seed(3)
        with KLAnnealing(weight).scope():
            terms[weight] = float(elbo(x, y).detach())
    observed = terms[0.0]
    assert terms[0.25] - observed == pytest.approx(0.25 * (terms[1.0] - observed), rel=1e-5)


def test_keep_best_scores_on_schedule_and_restores_the_best_state():
    module = torch.nn.Linear(2, 1)
    scores = iter([0.1, 0.5, 0.3, 0.5])  # steps 3, 6, 9 and the last, 10; the tie at 10 keeps step 6
    seen = []

    def score() -> float:
        seen.append(float(module.bias.detach()))
        return next(scores)

    keeper = KeepBest([module], score, every=3, last=10)
    for step in range(1, 11):
        with torch.no_grad():
            module.bias.fill_(step)
        keeper(step)
    assert seen == [3.0, 6.0, 9.0, 10.0]
    assert (keeper.best_step, keeper.best_score) == (6, 0.5)
    keeper.restore()
    assert float(module.bias.detach()) == 6.0


def test_keep_best_restore_wins_over_a_later_models_param_store_entry():
    """A PyroModule takes the param store's value under its name: restore clears the store first."""
    x, y = regression_data(16)
    model, guide = _model_and_guide("normal")
    guide(x, y)
    keeper = KeepBest([model, guide], lambda: 0.0, every=1, last=1)
    keeper(1)
    kept = {k: v.clone() for k, v in guide.state_dict().items()}
    _, later = _model_and_guide("normal", seed=1)
    later(x, y)  # registers other values under the same names
    keeper.restore()
    guide(x, y)
    for name, value in guide.state_dict().items():
        assert torch.equal(value, kept[name]), name


def test_select_best_takes_the_first_of_equal_scores():
    def fit(setting):
        keeper = KeepBest([torch.nn.Linear(1, 1)], lambda: {"a": 1.0, "b": 2.0, "c": 2.0}[setting], 1, 1)
        keeper(1)
        return keeper, setting.upper()

    keeper, setting, extra = select_best(["a", "b", "c"], fit)
    assert (setting, extra, keeper.best_score) == ("b", "B", 2.0)
    with pytest.raises(ValueError, match="no candidate"):
        select_best([], fit)


def test_holdout_is_a_seeded_partition():
    fit, val = holdout(50, 0.2, seed=4)
    assert len(val) == 10 and sorted(torch.cat([fit, val]).tolist()) == list(range(50))
    assert torch.equal(holdout(50, 0.2, seed=4)[1], val) and not torch.equal(holdout(50, 0.2, seed=5)[1], val)
    with pytest.raises(ValueError, match="fraction"):
        holdout(50, 1.0, seed=0)


def test_minibatches_without_seed_draw_from_the_global_stream():
    torch.manual_seed(7)
    expected = [torch.randint(0, 30, (4,)) for _ in range(3)]
    torch.manual_seed(7)
    sampler = Minibatches(30, 4, seed=None)
    assert all(torch.equal(next(sampler), batch) for batch in expected)


def test_callback_sees_every_step_and_the_optimizer_exists_before_it():
    x, y = regression_data(16)
    model, guide = _model_and_guide("normal")
    steps = []
    train(model, guide, x, y, Schedule(5, 0, 4), warm_up=False, callback=steps.append, progress=False)
    assert steps == [1, 2, 3, 4, 5]


def test_optimize_rejects_what_it_cannot_do(tmp_path):
    x, y = regression_data(16)
    model, guide = _model_and_guide("normal")
    objective = Trace_ELBO()(model, guide)
    with pytest.raises(ValueError, match="warm_up"):
        optimize(objective, x, y, Schedule(2, 0, 4), checkpoint=Checkpoint(tmp_path / "c.pt"), progress=False)
    with pytest.raises(ValueError, match="Minibatches\\(len\\(x\\)"):
        optimize(objective, x, y, Schedule(2, 0, 4), sampler=Minibatches(16, 8), progress=False)


def test_cooldown_ramps_the_decayed_rate_to_zero_and_adam_follows_it(monkeypatch):
    """``cooldown=c`` scales the paper's decay by ``(T - t) / floor(cT)`` over the last ``floor(cT)`` steps; the
    noise scale's group, held for ``fixed_noise_steps``, decays from when it starts but ramps on the same steps.
    The rates Adam uses at every step are read off its parameter groups."""
    steps, fixed, lr = 20, 4, 0.01
    schedule = Schedule(steps, fixed, 4, lr, lr_gamma=0.1, lr_power=0.5, cooldown=0.25)

    def decay(t: int) -> float:
        return (1 + 0.1 * max(t, 0)) ** -0.5

    for t in range(steps + 1):
        ramp = min(1.0, (steps - t) / 5)
        assert schedule.lr_factor(t) == pytest.approx(decay(t) * ramp, rel=1e-12, abs=0), t
        assert schedule.lr_factor(t, delay=fixed) == pytest.approx(decay(t - fixed) * ramp, rel=1e-12, abs=0), t
    assert schedule.lr_factor(steps - 1) > 0 == schedule.lr_factor(steps)  # the last update is small, not skipped
    assert Schedule(steps).lr_factor(steps) == (1 + 5e-4 * steps) ** -0.3  # the default: the paper's, no ramp
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="cooldown is a fraction of the steps"):
            Schedule(steps, cooldown=bad)

    used: list[list[float]] = []
    adam_step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        used.append([group["lr"] for group in self.param_groups])
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    x, y = regression_data(16)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    model = BayesianMLP([5, 6, 1])  # its noise scale is the held group
    train(model, AutoNormal(model), x, y, schedule, progress=False)
    expected = [[lr * schedule.lr_factor(t), lr * schedule.lr_factor(t, delay=fixed)] for t in range(steps)]
    assert len(used) == steps
    assert all(rates == pytest.approx(want, rel=1e-12, abs=0) for rates, want in zip(used, expected))


@pytest.mark.parametrize("kl_weight", [1.0, 0.1])
def test_train_with_the_jit_takes_the_eager_steps(kl_weight):
    """``jit=True`` optimizes the compiled ELBO: with AutoNormal, whose draws all reach the loss, the same numbers
    as ``Trace_ELBO`` step for step, the KL weight included (run as traced: the optimizing executor may regroup
    draws)."""
    x, y = regression_data(40)
    schedule = Schedule(STEPS, 0, BATCH, LR, lr_gamma=0.0, lr_power=0.0)
    runs = []
    for jit in (False, True, "eager"):  # the eager ELBO, torch.jit.trace, torch.compile's recording
        model, guide = _model_and_guide("normal")
        with torch.jit.optimized_execution(False):
            runs.append(train(model, guide, x, y, schedule, kl_weight=kl_weight, progress=False, jit=jit))
    assert runs[1] == pytest.approx(runs[0], rel=1e-9)
    assert runs[2] == pytest.approx(runs[0], rel=1e-9)
    with pytest.raises(ValueError, match=r"noise='per_example'.*jit=False"):
        train(model, guide, x, y, schedule, progress=False, jit=True, noise="per_example")


@pytest.mark.parametrize("users", [True, False])
def test_only_compiled_graphs_are_run_as_traced(users, monkeypatch):
    """``jit`` runs TorchScript graphs without the optimizing executor (its rewrite rounds differently, so a resumed
    run would not match); an eager run leaves the user's setting alone, for TorchScript modules inside a model."""
    from pyro_whvi.train import engine

    seen = []
    monkeypatch.setattr(
        engine, "optimize", lambda *args, **kwargs: seen.append(torch._C._get_graph_executor_optimize())
    )
    x, y = regression_data(10)
    for jit in (False, True):
        model, guide = _model_and_guide("normal")
        with torch.jit.optimized_execution(users):
            train(model, guide, x, y, Schedule(1, 0, BATCH, LR), progress=False, jit=jit)
    assert seen == [users, False]
