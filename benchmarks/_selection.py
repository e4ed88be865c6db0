"""Model selection shared by the benchmarks: train with validation checkpoints, keep the best state."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pyro
import torch
from tqdm import tqdm

from pyro_whvi.metrics import mean_and_standard_error


def holdout(num: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of ``range(num)``: ``(fit, val)`` indices, ``val`` a ``fraction`` of them."""
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    num_val = round(fraction * num)
    return order[num_val:], order[:num_val]


def train_with_checkpoints(
    step_fn: Callable[[int], object], steps: int, eval_every: int, validate: Callable[[], float], desc: str
) -> tuple[float, Any, int]:
    """Run ``step_fn(step)`` for ``step = 1..steps``; every ``eval_every`` steps (and at the end) score
    ``validate()`` (higher is better). Returns the best score, the param store's state then, and the step."""
    best: tuple[float, Any, int] = (-math.inf, None, 0)
    for step in tqdm(range(1, steps + 1), desc=desc, leave=False, mininterval=1.0):
        step_fn(step)
        if step % eval_every == 0 or step == steps:
            score = validate()
            if score > best[0]:
                best = (score, copy.deepcopy(pyro.get_param_store().get_state()), step)
    return best


def select_best(settings, fit: Callable[[Any], tuple]) -> tuple:
    """Fit every setting; ``fit(setting)`` returns ``((score, state, step), *extras)``.

    Returns the best (highest score) as ``(score, state, step, setting, *extras)``."""
    chosen: tuple | None = None
    for setting in settings:
        (score, state, step), *extras = fit(setting)
        if chosen is None or score > chosen[0]:
            chosen = (score, state, step, setting, *extras)
    if chosen is None:
        raise ValueError("select_best: no candidate settings")
    return chosen


def summarize(rows: list[dict], keys: tuple[str, ...], metrics: tuple[str, ...]) -> list[dict]:
    """Mean and standard error of ``metrics`` over the rows sharing the values of ``keys`` (in first-seen order)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for group_key, mine in groups.items():
        entry: dict = dict(zip(keys, group_key)) | {"runs": len(mine)}
        for metric in metrics:
            entry[metric], entry[metric + "_se"] = mean_and_standard_error(r[metric] for r in mine)
        summary.append(entry)
    return summary
