r"""The one training loop of the application: Pyro's ELBO (or any loss module), in one process or data-parallel.

:func:`optimize` minimizes a loss module ``objective(x_batch, y_batch[, num_data=N])`` with Adam under a
:class:`Schedule`, drawing minibatches from :class:`Minibatches` (the one sampler). :func:`train` is it for a
Pyro model and guide: it optimizes ``Trace_ELBO()(model, guide)`` (Pyro's ``ELBOModule``, the path Pyro
documents for PyTorch optimizers, Lightning and DDP); the GP regressors
(:mod:`pyro_whvi.experiments.gp_regressors`) pass their negative ELBO. The same loop runs in one process and
in every rank of a ``torch.distributed`` group (:mod:`pyro_whvi.experiments.distributed`):

* **Parameters** are created by one warm-up call of the guide, then wrapped in
  ``DistributedDataParallel``, which broadcasts rank 0's values (and buffers, once: a buffer a model
  updates during training, such as BatchNorm's running statistics, stays per rank) and averages the
  gradients.
* **Minibatches**: every rank draws the same global batch of ``batch_size`` indices (with replacement, or
  without within epochs, from a generator seeded by ``seed``) and keeps its own contiguous shard of
  ``batch_size / world``; the likelihood is scaled to the full data set (``num_data``). The average of the
  ranks' gradients is then the gradient of the whole batch, and one process draws exactly today's batches.
* **Noise**: ``"per_rank"`` (default) reseeds every rank differently, so each draws its own noise;
  ``"per_example"`` draws the per-example noise of the structured guides' lazy weights from the example's
  position in the global batch and the step (:func:`~pyro_whvi.infer.example_seeds`) and keeps the other
  draws identical on all ranks, so that a run does not depend on the number of processes.
* **The fixed-noise phase** (regression, App. D.1 and D.4): the held parameters (a Gaussian model's
  ``noise_scale``, a GP likelihood's noise) get no update, and no Adam state, during the first
  ``fixed_noise_steps``; their learning-rate schedule starts when they start learning.
* **Checkpoints** (:class:`Checkpoint`): every ``every`` steps rank 0 writes, atomically, the parameters,
  Adam's state, the schedule, the sampler and every rank's random state; a run that finds a
  checkpoint with its key resumes from it and ends exactly where an uninterrupted run ends.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), App. D.1 (schedule, fixed noise phase).
    Pyro's ``examples/svi_lightning.py`` (``ELBOModule`` with DDP).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyro
import torch
import torch.distributed as dist
from pyro.infer import Trace_ELBO
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..infer import example_seeds
from . import distributed
from .reporting import write_atomic
from .schedule import Minibatches, Schedule, shard_size

__all__ = ["NOISE_MODES", "Checkpoint", "Minibatches", "Schedule", "optimize", "shard_size", "train"]

NOISE_MODES = ("per_rank", "per_example")
_CHECKPOINT_FORMAT = 2  # 2: the sampler's state replaces the batch generator's


@dataclass(frozen=True)
class Checkpoint:
    """Where and how often :func:`train` saves its state, and the key a saved state must carry to be resumed.

    :param path: the checkpoint file (written by rank 0; every rank reads it, so multi-machine runs need
        a shared folder).
    :param every: steps between checkpoints (the last step writes none: the caller stores the result).
    :param key: what identifies the run (e.g. a hash of its settings and data); a file with another key,
        another number of processes or another noise mode is ignored with a warning.
    """

    path: Path
    every: int = 1000
    key: str = ""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"Checkpoint: every >= 1 step expected, got {self.every}.")


def _noise_parameter(model) -> torch.nn.Parameter | None:
    """The unconstrained parameter of a Gaussian model's learned ``noise_scale``, if it has one."""
    if getattr(model, "likelihood", None) != "gaussian":
        return None
    parameter = getattr(model, "_parameters", {}).get("noise_scale_unconstrained")
    return parameter if isinstance(parameter, torch.nn.Parameter) else None


def _noise_scope(noise: str, seeds: range):
    return example_seeds(seeds) if noise == "per_example" else contextlib.nullcontext()


def _rng_state(device: torch.device) -> dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _read_checkpoint(checkpoint: Checkpoint, world: int, noise: str) -> dict | None:
    path = checkpoint.path
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated by hand, another format: start again rather than fail
        warnings.warn(f"{path} is unreadable ({error}); training from the start", stacklevel=3)
        return None
    saved = (state.get("key"), state.get("world_size"), state.get("noise"))
    if state.get("format") != _CHECKPOINT_FORMAT:
        saved = ("an older checkpoint format", *saved[1:])
    if saved != (checkpoint.key, world, noise):
        warnings.warn(
            f"{path} belongs to another run (key, processes, noise {saved} instead of "
            f"{(checkpoint.key, world, noise)}); training from the start",
            stacklevel=3,
        )
        return None
    return state


def train(
    model,
    guide,
    x: Tensor,
    y: Tensor,
    schedule: Schedule = Schedule(),
    *,
    seed: int = 0,
    initialize: Callable[[], None] | None = None,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
) -> list[float]:
    """Fit ``guide`` to ``model`` on ``(x, y)`` with ``Trace_ELBO`` and Adam under ``schedule``.

    Call it in every rank of a process group for data-parallel training (see the module docstring);
    the model must take ``(x, y, num_data=...)`` like :class:`~pyro_whvi.nn.networks.BayesianMLP`. A
    Gaussian model's learned ``noise_scale`` is held for ``schedule.fixed_noise_steps``.

    :param seed: seeds the minibatches (and, data-parallel, each rank's noise).
    :param initialize: called before the warm-up unless a checkpoint is resumed (e.g. I-BLM).
    :param progress: show a progress bar on rank 0 (a string is its label).
    :param checkpoint: save and resume here (see :class:`Checkpoint`).
    :param noise: ``"per_rank"`` or ``"per_example"`` (see the module docstring).
    :returns: this rank's loss (negative ELBO estimate) at every step, resumed steps included.
    """

    def warm_up(x_shard: Tensor, y_shard: Tensor, **scaled) -> None:
        # Create the guide's parameters before the optimizer and DDP see them ("per_example": seeded draws
        # leave the global random stream as a run with another number of processes leaves it).
        with torch.no_grad(), pyro.validation_enabled(False):
            guide(x_shard, y_shard, **scaled)

    with pyro.validation_enabled(False):
        return optimize(
            Trace_ELBO()(model, guide),
            x,
            y,
            schedule,
            seed=seed,
            held=lambda: [p for p in [_noise_parameter(model)] if p is not None],
            initialize=initialize,
            warm_up=warm_up,
            progress=progress,
            checkpoint=checkpoint,
            noise=noise,
        )


def optimize(
    objective: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    schedule: Schedule = Schedule(),
    *,
    seed: int = 0,
    held: Callable[[], Sequence[torch.nn.Parameter]] = list,
    initialize: Callable[[], None] | None = None,
    warm_up: Callable[..., None] | None = None,
    replacement: bool = True,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
) -> list[float]:
    """Minimize ``objective(x_batch, y_batch, num_data=N)`` with Adam under ``schedule`` (``num_data`` only
    when the batch is a minibatch), in one process or in every rank of a process group.

    :param held: the parameters held during ``schedule.fixed_noise_steps`` (called after the warm-up).
    :param initialize: called first, unless a checkpoint is resumed.
    :param warm_up: called with this rank's first shard (and ``num_data``) to create lazily made parameters
        before the optimizer and DDP see them.
    :param replacement: minibatches with replacement (:class:`Minibatches`); otherwise epochs of a permutation.
    :returns: this rank's loss at every step, resumed steps included.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"train: x has {x.shape[0]} rows but y has {y.shape[0]}.")
    if noise not in NOISE_MODES:
        raise ValueError(f"train: noise must be one of {NOISE_MODES}, got {noise!r}")
    world, rank = distributed.world_size(), distributed.rank()
    num_data = x.shape[0]
    sampler = Minibatches(num_data, schedule.batch_size, seed, replacement=replacement)
    local = shard_size(sampler.batch_size, world)
    state = _read_checkpoint(checkpoint, world, noise) if checkpoint is not None else None
    if state is None and initialize is not None:
        initialize()
    scaled = {} if sampler.full_batch else {"num_data": num_data}
    if warm_up is not None:
        with _noise_scope(noise, range(local)):
            warm_up(x[:local], y[:local], **scaled)

    held_parameters = list(held())
    held_ids = {id(p) for p in held_parameters}
    others = [p for p in objective.parameters() if id(p) not in held_ids and p.requires_grad]
    groups: list[dict] = [{"params": others}]
    factors: list[Callable[[int], float]] = [schedule.lr_factor]
    if held_parameters:
        fixed = schedule.fixed_noise_steps
        groups.append({"params": held_parameters})
        factors.append(lambda step: schedule.lr_factor(step - fixed))
    optimizer = torch.optim.Adam(groups, lr=schedule.lr)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
    losses: list[float] = []
    start = 0
    if state is not None:
        objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        lr_schedule.load_state_dict(state["lr_schedule"])
        sampler.load_state_dict(state["sampler"])
        _set_rng_state(state["rng"][rank], x.device)
        losses, start = list(state["losses"]), int(state["step"])
    elif world > 1 and noise == "per_rank":
        pyro.set_rng_seed((seed + 7919 * (rank + 1)) % 2**32)

    step_loss: torch.nn.Module = objective
    if world > 1:
        device_ids = [x.device.index] if x.device.type == "cuda" else None
        # Buffers (prior scales, fixed signs) are synchronized once here, not before every step.
        step_loss = DistributedDataParallel(
            objective, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    fixed_phase = schedule.fixed_noise_steps if held_parameters else 0
    label = progress if isinstance(progress, str) else "training"
    hidden = not progress or rank != 0
    steps = range(start, schedule.steps)
    bar = tqdm(steps, desc=label, total=schedule.steps, initial=start, disable=hidden, leave=False, mininterval=1.0)
    for step in bar:
        index = next(sampler)
        if index is None:  # full batch: each rank its slice
            x_batch, y_batch = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        else:
            index = index[rank * local : (rank + 1) * local].to(x.device)
            x_batch, y_batch = x[index], y[index]
        optimizer.zero_grad(set_to_none=True)
        first = (seed * 1_000_003 + step) * 2**24 + rank * local  # the shard's positions in the global batch
        with _noise_scope(noise, range(first, first + local)):
            loss = step_loss(x_batch, y_batch, **scaled)
        loss.backward()
        if step < fixed_phase:
            for parameter in held_parameters:
                parameter.grad = None
        optimizer.step()
        lr_schedule.step()
        losses.append(float(loss.detach()))
        if checkpoint is not None and (step + 1) % checkpoint.every == 0 and step + 1 < schedule.steps:
            stateful = {"objective": objective, "optimizer": optimizer, "lr_schedule": lr_schedule, "sampler": sampler}
            _save(checkpoint, stateful, losses, step + 1, world, rank, noise, x.device)
    return losses


def _save(checkpoint, stateful: dict, losses, step, world, rank, noise, device) -> None:
    """Gather every rank's random state and let rank 0 write the checkpoint atomically."""
    rng = [_rng_state(device)]
    if world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if rank != 0:
        return
    state = {
        "format": _CHECKPOINT_FORMAT,
        "key": checkpoint.key,
        "world_size": world,
        "noise": noise,
        "step": step,
        **{name: part.state_dict() for name, part in stateful.items()},
        "rng": rng,
        "losses": losses,
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(checkpoint.path, buffer.getvalue())
