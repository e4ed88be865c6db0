"""Model selection on held-out data: a validation split, early stopping during training, the best of several settings.

:class:`KeepBest` is the engine's validation callback (``train(..., callback=KeepBest(...))``): it scores the
model every few steps and keeps a copy of its state at the best score; :func:`select_best` trains every
candidate setting and keeps the best-scoring one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import pyro
import torch
from torch import Tensor

from .engine import Schedule, train

__all__ = ["KeepBest", "holdout", "select_best", "train_keeping_best"]

Setting = TypeVar("Setting")


def holdout(num: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of ``range(num)``: ``(fit, val)`` indices, ``val`` a ``fraction`` of them."""
    if not 0 < fraction < 1:
        raise ValueError(f"holdout: fraction must be in (0, 1), got {fraction}.")
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    num_val = round(fraction * num)
    return order[num_val:], order[:num_val]


class KeepBest:
    """Score ``modules`` with ``score()`` (higher is better) every ``every`` steps and at step ``last``; keep a
    copy of their state at the best score (ties: the earlier step).

    :param modules: what to save and :meth:`restore` (e.g. the model and the guide; modules whose parameters
        the first step creates are read when they are scored, not before).
    :param score: the validation score of the current state.
    :param every: steps between scores.
    :param last: the last step (always scored).
    """

    def __init__(self, modules: Sequence[torch.nn.Module], score: Callable[[], float], every: int, last: int):
        if every < 1 or last < 1:
            raise ValueError(f"KeepBest: every >= 1 and last >= 1 expected, got {every}, {last}.")
        self.modules = list(modules)
        self.score = score
        self.every = every
        self.last = last
        self.best_score = -math.inf
        self.best_step = 0
        self.best_state: list[dict[str, Any]] | None = None

    def __call__(self, step: int) -> None:
        if step % self.every and step != self.last:
            return
        value = self.score()
        if value > self.best_score:
            self.best_score, self.best_step = value, step
            self.best_state = [copy.deepcopy(module.state_dict()) for module in self.modules]

    def restore(self) -> None:
        """Load the best state back into the modules.

        Pyro's param store is cleared first: a ``PyroModule`` takes a value the store holds under its name
        (e.g. from a model trained after this one) over its own, and re-registers its own in an empty store."""
        if self.best_state is None:
            raise RuntimeError("KeepBest.restore: no step was scored (or every score was NaN or -inf).")
        pyro.clear_param_store()
        for module, state in zip(self.modules, self.best_state):
            module.load_state_dict(state)


def train_keeping_best(
    model, guide, x: Tensor, y: Tensor, schedule: Schedule, score: Callable[[], float], every: int, **options
) -> KeepBest:
    """:func:`~pyro_whvi.train.engine.train` with ``score()`` taken every ``every`` steps and at the last;
    returns the :class:`KeepBest` holding the best state of ``model`` and ``guide`` (``options`` go to ``train``)."""
    keeper = KeepBest([model, guide], score, every, schedule.steps)
    train(model, guide, x, y, schedule, callback=keeper, **options)
    return keeper


def select_best(
    settings: Iterable[Setting], fit: Callable[[Setting], tuple], score: Callable[[tuple], float] | None = None
) -> tuple:
    """Train every candidate setting and keep the best on held-out rows: the library's one such path
    (``whvi uci``'s choice among ``--kl-weight`` candidates and the VSD benchmarks' grids both use it).

    :param fit: ``fit(setting)`` trains the setting and returns ``(result, *extras)``.
    :param score: the held-out score of ``fit``'s return value, higher is better; default
        ``result.best_score`` (``result`` a trained :class:`KeepBest`). A NaN score never wins over a number.
    :returns: ``(result, setting, *extras)`` of the best score (ties: the first setting).
    """
    chosen: tuple | None = None
    chosen_score = -math.inf
    for setting in settings:
        result, *extras = fit(setting)
        value = score((result, *extras)) if score is not None else result.best_score
        value = -math.inf if math.isnan(value) else value
        if chosen is None or value > chosen_score:
            chosen, chosen_score = (result, setting, *extras), value
    if chosen is None:
        raise ValueError("select_best: no candidate settings")
    return chosen
