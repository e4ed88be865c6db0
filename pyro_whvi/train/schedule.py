r"""What each training step sees: the learning-rate schedule, the minibatch indices, each process's shard.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), App. D.1 (the schedule) and App. D.4 (the GP experiments').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Minibatches", "Schedule", "scheduled_adam", "shard_size"]

_FUSED_ADAM_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Schedule:
    r"""The training schedule (defaults: the WHVI paper's, App. D.1, with fewer steps).

    :param steps: SVI steps in all, both phases.
    :param fixed_noise_steps: first steps with the Gaussian noise scale held at its initial value.
    :param batch_size: examples per step, over all processes (``None`` or ``>= N``: full batch).
    :param lr: :math:`\lambda_0`, Adam's initial learning rate.
    :param lr_gamma: :math:`\gamma` in :math:`\lambda_t = \lambda_0 (1 + \gamma t)^{-p}`.
    :param lr_power: :math:`p` (0 keeps the learning rate constant).
    :param cooldown: the last fraction of the steps, :math:`c`, over which the decayed rate is also scaled
        linearly down towards 0: by :math:`\min(1, (T - t) / \lfloor c T \rfloor)` at step :math:`t` of
        :math:`T` (0, the paper's schedule: none). Adam's last updates then move the variational parameters
        by little more than their gradient noise allows, instead of at the decayed rate the paper's schedule
        ends on (0.375 of :math:`\lambda_0` after 50,500 steps).
    """

    steps: int = 20000
    fixed_noise_steps: int = 500
    batch_size: int | None = 64
    lr: float = 1e-3
    lr_gamma: float = 5e-4
    lr_power: float = 0.3
    cooldown: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.fixed_noise_steps < 0 or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError(f"Schedule: steps >= 1, fixed_noise_steps >= 0 and batch_size >= 1 expected, got {self}.")
        if self.lr <= 0 or self.lr_gamma < 0 or self.lr_power < 0:
            raise ValueError(f"Schedule: lr > 0, lr_gamma >= 0 and lr_power >= 0 expected, got {self}.")
        if not 0.0 <= self.cooldown < 1.0:
            raise ValueError(
                f"Schedule: cooldown is a fraction of the steps in [0, 1) (0: none), got {self.cooldown!r}."
            )

    def lr_factor(self, step: int, delay: int = 0) -> float:
        r"""The learning rate at step ``t`` over :math:`\lambda_0`: :math:`(1 + \gamma (t - \text{delay}))^{-p}`
        (1 before ``delay``, where a parameter group starts late), times the cool-down's ramp at ``t``."""
        factor = (1.0 + self.lr_gamma * max(step - delay, 0)) ** -self.lr_power
        length = int(self.cooldown * self.steps)
        if length and step > self.steps - length:
            factor *= max(self.steps - step, 0) / length
        return factor


class Minibatches:
    """The one minibatch sampler: endless global batches of indices into ``num_data`` examples.

    :param batch_size: indices per batch (``None`` or ``>= num_data``: every draw is ``None``, the full data).
    :param seed: seeds the sampler's own generator (the global random state is left alone); ``None`` draws
        from the global random stream instead, as a plain loop calling ``torch.randint`` does.
    :param replacement: draw each batch with replacement (the WHVI paper's schedule); otherwise shuffle once
        per epoch and cut the permutation into consecutive batches.
    :param drop_last: without replacement, skip an epoch's last, smaller batch (``False``: every epoch
        visits every index).
    """

    def __init__(
        self,
        num_data: int,
        batch_size: int | None,
        seed: int | None = 0,
        *,
        replacement: bool = True,
        drop_last: bool = True,
    ):
        if num_data < 1 or (batch_size is not None and batch_size < 1):
            raise ValueError(f"Minibatches: num_data >= 1 and batch_size >= 1 expected, got {num_data}, {batch_size}.")
        self.num_data = num_data
        self.batch_size = min(batch_size or num_data, num_data)
        self.replacement = replacement
        self.drop_last = drop_last
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self._order: Tensor | None = None
        self._position = 0

    @property
    def full_batch(self) -> bool:
        return self.batch_size >= self.num_data

    def __iter__(self) -> Minibatches:
        return self

    def __next__(self) -> Tensor | None:
        if self.full_batch:
            return None
        if self.replacement:
            return torch.randint(self.num_data, (self.batch_size,), generator=self.generator)
        left = self.num_data - self._position
        if self._order is None or left <= 0 or (self.drop_last and left < self.batch_size):
            self._order, self._position = torch.randperm(self.num_data, generator=self.generator), 0
        batch = self._order[self._position : self._position + self.batch_size]
        self._position += self.batch_size
        return batch

    def state_dict(self) -> dict:
        generator = self.generator.get_state() if self.generator is not None else None
        return {"generator": generator, "order": self._order, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self._order, self._position = state["order"], int(state["position"])


def shard_size(global_batch: int, world: int) -> int:
    """The examples each of ``world`` processes takes from a batch of ``global_batch``; a ``ValueError``
    saying what to change when they cannot share it evenly."""
    if global_batch < world or global_batch % world:
        raise ValueError(
            f"a batch of {global_batch} examples cannot be split evenly over {world} processes: use a batch size that "
            f"is a multiple of the number of processes (each rank takes batch_size / {world}), or fewer processes."
        )
    return global_batch // world


def scheduled_adam(
    groups: list[dict], lr: float, factors: list[Callable[[int], float]]
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam over the parameter ``groups`` from learning rate ``lr``, and the ``LambdaLR`` scaling each group's rate by
    its factor of the step (e.g. :meth:`Schedule.lr_factor`).

    Torch's fused Adam (one kernel over every tensor) where it has one, else the foreach form: on the demo's small
    networks the foreach form's per-tensor Python work was 11-18% of a step. The update of an element does not
    depend on the grouping, so Pyro's ``SVI`` with ``PyroOptim(torch.optim.Adam, {"fused": True})`` (one optimizer
    per tensor) gives the same numbers bit for bit (``tests/train/test_engine.py``).
    """
    fused = all(p.device.type in _FUSED_ADAM_DEVICES for group in groups for p in group["params"])
    adam = torch.optim.Adam(groups, lr=lr, fused=fused or None, foreach=None if fused else True)
    return adam, torch.optim.lr_scheduler.LambdaLR(adam, factors)
