"""The engine at the edges (issue 51): divergence is named, typed and stops at once, keeping the last good
checkpoint; Ctrl-C is a typed interrupt with the step; non-finite data is refused before training."""

from __future__ import annotations

import math
import pickle

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

from pyro_whvi.nn import BayesianMLP
from pyro_whvi.train import Schedule, TrainingDiverged, TrainingInterrupted, optimize, train
from pyro_whvi.train.engine import Checkpoint

from ..helpers import regression_data


class _Quadratic(torch.nn.Module):
    """``mean((x w - y)^2)``; ``poison=k`` makes step ``k``'s loss NaN; ``poison_unseen=k`` makes step ``k``'s
    update of ``extra`` NaN, a parameter whose NaN the loss does not show (as one in a masked-out branch)."""

    def __init__(self, poison: int | None = None, poison_unseen: int | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(3))
        self.extra = torch.nn.Parameter(torch.zeros(2))
        self.calls, self.poison, self.poison_unseen = 0, poison, poison_unseen

    def forward(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None) -> torch.Tensor:
        self.calls += 1
        extra = self.extra * 1.0
        if self.calls == self.poison_unseen:
            extra.register_hook(lambda gradient: torch.full_like(gradient, math.nan))
        unseen = torch.where(torch.isfinite(extra), extra, torch.zeros_like(extra)).sum()
        loss = ((x @ self.weight - y) ** 2).mean() + 0.0 * unseen
        return loss * math.nan if self.calls == self.poison else loss


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(16, 3, generator=generator), torch.randn(16, generator=generator)


def _no_warm_up(*args, **kwargs) -> None:
    pass


SCHEDULE = Schedule(steps=20, fixed_noise_steps=0, batch_size=8, lr=0.01)


def test_a_nan_loss_stops_training_at_its_step_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
    x, y = _data()
    objective = _Quadratic(poison=7)
    checkpoint = Checkpoint(tmp_path / "run.ckpt", every=3, key="k")
    with pytest.raises(TrainingDiverged) as diverged:
        optimize(objective, x, y, SCHEDULE, warm_up=_no_warm_up, checkpoint=checkpoint, progress=False)
    error = diverged.value
    assert isinstance(error, RuntimeError) and error.step == 7
    assert str(error) == (
        "training diverged at step 7: the loss became nan; lower the learning rate (lr / --lr, now 0.01)"
    )
    assert torch.isfinite(objective.weight).all()  # stopped before the update
    saved = torch.load(checkpoint.path, weights_only=True)
    assert saved["step"] == 6 and torch.isfinite(saved["objective"]["weight"]).all()


def test_non_finite_parameters_are_caught_before_a_checkpoint_would_store_them(tmp_path):
    x, y = _data()
    objective = _Quadratic(poison_unseen=5)  # a NaN update at step 5, the losses stay finite
    checkpoint = Checkpoint(tmp_path / "run.ckpt", every=3, key="k")
    with pytest.raises(TrainingDiverged) as diverged:
        optimize(objective, x, y, SCHEDULE, warm_up=_no_warm_up, checkpoint=checkpoint, progress=False)
    assert diverged.value.step == 6  # the first check after the update: the checkpoint at step 6
    assert diverged.value.cause.startswith("parameter 'extra' is nan after the update; lower the learning rate")
    assert torch.load(checkpoint.path, weights_only=True)["step"] == 3  # the good one is kept


def test_non_finite_parameters_after_the_last_step_are_not_returned_silently():
    x, y = _data()
    with pytest.raises(TrainingDiverged, match=r"at step 4: parameter 'extra' is nan after the update"):
        optimize(_Quadratic(poison_unseen=4), x, y, Schedule(4, 0, 8, 0.01), progress=False)


def test_a_diverging_svi_run_names_the_learning_rate_and_the_kl_weight():
    """``whvi uci --lr 1e6 --kl-weight 1e300`` used to end in tracebacks at prediction."""
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    x, y = regression_data(32, 3)
    model = BayesianMLP([3, 8, 1])
    schedule = Schedule(steps=30, fixed_noise_steps=0, batch_size=16, lr=1e6)
    with pytest.raises(TrainingDiverged) as diverged:
        train(model, AutoNormal(model), x, y, schedule, kl_weight=1e300, progress=False)
    message = str(diverged.value)
    assert "\n" not in message and message.startswith(f"training diverged at step {diverged.value.step}: ")
    assert "the learning rate (lr / --lr, now 1e+06) or the KL weight (kl_weight / --kl-weight, now 1e+300)" in message


def test_ctrl_c_during_training_is_a_typed_interrupt_with_the_steps_done():
    x, y = _data()

    def press_ctrl_c(step: int) -> None:
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted) as interrupted:
        optimize(_Quadratic(), x, y, SCHEDULE, callback=press_ctrl_c, progress=False)
    assert isinstance(interrupted.value, KeyboardInterrupt) and interrupted.value.step == 4
    assert str(interrupted.value) == "training interrupted at step 4"


def test_both_stops_survive_pickling_with_their_step():
    """The launcher hands a rank's exception to its caller through a file."""
    for error in (TrainingDiverged(3, "the loss became nan"), TrainingInterrupted(9)):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.step == error.step


@pytest.mark.parametrize("name", ["x", "y"])
def test_non_finite_data_is_refused_before_training(name):
    x, y = _data()
    bad = {"x": x.clone(), "y": y.clone()}
    bad[name].view(-1)[2] = math.inf
    bad[name].view(-1)[5] = math.nan
    objective = _Quadratic()
    expected = {"x": r"train: x \(the inputs\)", "y": r"train: y \(the targets\)"}[name]
    with pytest.raises(ValueError, match=expected + r" has 1 NaN and 1 infinite entries \(of \d+\)"):
        optimize(objective, bad["x"], bad["y"], SCHEDULE, progress=False)
    assert objective.calls == 0
