r"""The one training loop of the application: Pyro's ELBO (or any loss module), in one process or data-parallel.

:func:`optimize` minimizes a loss module ``objective(x_batch, y_batch[, num_data=N])`` with Adam under a
:class:`Schedule`, drawing minibatches from :class:`Minibatches` (the one sampler). :func:`train` is it for a
Pyro model and guide: it optimizes ``Trace_ELBO()(model, guide)`` (Pyro's ``ELBOModule``, the path Pyro documents
for PyTorch optimizers, Lightning and DDP); the GP regressors (:mod:`pyro_whvi.experiments.gp_regressors`) pass
their negative ELBO. The same loop runs in one process and in every rank of a ``torch.distributed`` group
(:mod:`pyro_whvi.train.distributed`):

* **Parameters** are created by one warm-up call of the guide, then wrapped in ``DistributedDataParallel``, which
  broadcasts rank 0's values (and buffers, once: a buffer a model updates during training, such as BatchNorm's
  running statistics, stays per rank) and averages the gradients.
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
* **Validation and early stopping**: ``callback(step)`` after every step; :class:`.selection.KeepBest` keeps the best.
* **KL weight**: ``train(..., kl_weight=lambda)``, :class:`~pyro_whvi.infer.KLAnnealing` (VSD paper App. I.1).
* **Divergence and Ctrl-C** stop the loop with :class:`~pyro_whvi.train.stops.TrainingDiverged` (a non-finite loss,
  checked every step, or parameter, checked before each checkpoint and after the last step: the last good
  checkpoint is kept) or :class:`~pyro_whvi.train.stops.TrainingInterrupted`, each naming the step.
* **Parameters made by the first step**: with ``warm_up=False`` (one process, no checkpoint) the optimizer is
  built after the first step's forward pass, as Pyro's ``SVI`` builds its optimizers, so the run draws
  exactly the random numbers a plain ``SVI`` loop draws.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), App. D.1 (schedule, fixed noise phase).
    Pyro's ``examples/svi_lightning.py`` (``ELBOModule`` with DDP).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Sequence

import pyro
import torch
from pyro.infer import Trace_ELBO
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..infer import JitTrace_ELBO, KLAnnealing, example_seeds
from ..ops._checks import check_finite
from . import distributed
from .checkpoints import Checkpoint, read_checkpoint, restore_rng_state, save_checkpoint
from .denormals import flush_denormals
from .schedule import Minibatches, Schedule, scheduled_adam, shard_size
from .stops import TrainingDiverged, TrainingInterrupted, check_parameters, divergence_cause, naming_kl_weight

__all__ = ["NOISE_MODES", "Checkpoint", "Minibatches", "Schedule", "optimize", "shard_size", "train"]
__all__ += ["TrainingDiverged", "TrainingInterrupted"]

NOISE_MODES = ("per_rank", "per_example")


def _noise_parameter(model) -> torch.nn.Parameter | None:
    """The unconstrained parameter of a Gaussian model's learned ``noise_scale``, if it has one."""
    if getattr(model, "likelihood", None) != "gaussian":
        return None
    parameter = getattr(model, "_parameters", {}).get("noise_scale_unconstrained")
    return parameter if isinstance(parameter, torch.nn.Parameter) else None


def _noise_scope(noise: str, seeds: range):
    return example_seeds(seeds) if noise == "per_example" else contextlib.nullcontext()


class _AnnealedLoss(torch.nn.Module):
    """A loss module evaluated with every latent site's log density scaled by a :class:`KLAnnealing` factor."""

    def __init__(self, loss: torch.nn.Module, annealing: KLAnnealing):
        super().__init__()
        self.loss = loss
        self.annealing = annealing

    def forward(self, *args, **kwargs) -> Tensor:
        with self.annealing.scope():
            return self.loss(*args, **kwargs)


def train(
    model,
    guide,
    x: Tensor,
    y: Tensor,
    schedule: Schedule = Schedule(),
    *,
    seed: int = 0,
    kl_weight: float = 1.0,
    initialize: Callable[[], None] | None = None,
    warm_up: bool = True,
    sampler: Minibatches | None = None,
    callback: Callable[[int], None] | None = None,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
    jit: bool | str = False,
) -> list[float]:
    """Fit ``guide`` to ``model`` on ``(x, y)`` with ``Trace_ELBO`` and Adam under ``schedule``.

    Call it in every rank of a process group for data-parallel training (see the module docstring);
    the model must take ``(x, y, num_data=...)`` like :class:`~pyro_whvi.nn.networks.BayesianMLP`. A
    Gaussian model's learned ``noise_scale`` is held for ``schedule.fixed_noise_steps``.

    :param seed: seeds the minibatches (and, data-parallel, each rank's noise).
    :param kl_weight: :math:`\\lambda` of the tempered ELBO (:class:`~pyro_whvi.infer.KLAnnealing`); 1 is the ELBO.
    :param initialize: called before the warm-up unless a checkpoint is resumed (e.g. I-BLM).
    :param warm_up: create the guide's parameters by one call on the first shard before training (needed
        data-parallel and for checkpoints); ``False``: the first step creates them (see :func:`optimize`).
    :param sampler: the minibatches (default: :class:`Minibatches` with replacement, seeded by ``seed``).
    :param callback: called with the number of steps done after every step (e.g.
        :class:`~pyro_whvi.train.selection.KeepBest`).
    :param progress: show a progress bar on rank 0 (a string is its label).
    :param checkpoint: save and resume here (see :class:`Checkpoint`).
    :param noise: ``"per_rank"`` or ``"per_example"`` (see the module docstring).
    :param jit: optimize :class:`~pyro_whvi.infer.JitTrace_ELBO` (``True``: by ``torch.jit.trace``; a string: the
        ``backend``, e.g. ``"inductor"``) instead of ``Trace_ELBO``: the same loss and gradients, other random numbers
        where the compiled graph drops a draw the loss does not use; not with ``noise="per_example"``.
    :returns: this rank's loss (negative ELBO estimate) at every step, resumed steps included.
    :raises TrainingDiverged: the loss or a parameter became non-finite (see :func:`optimize`); its cause also
        names ``kl_weight`` when it is not 1.
    :raises TrainingInterrupted: on Ctrl-C, with the steps done.
    """

    def call_guide(x_shard: Tensor, y_shard: Tensor, **scaled) -> None:
        # Create the guide's parameters before the optimizer and DDP see them ("per_example": seeded draws
        # leave the global random stream as a run with another number of processes leaves it).
        with torch.no_grad(), pyro.validation_enabled(False):
            guide(x_shard, y_shard, **scaled)

    if jit and noise == "per_example":
        raise ValueError("train: noise='per_example' draws from seeds the JIT cannot compile; pass jit=False.")
    elbo = JitTrace_ELBO(backend=jit if isinstance(jit, str) else "torchscript") if jit else Trace_ELBO()
    loss: torch.nn.Module = elbo(model, guide)
    if kl_weight != 1.0:
        loss = _AnnealedLoss(loss, KLAnnealing(kl_weight))
    # Graphs run as traced: the optimizing executor's rewrite rounds differently, so a resumed run would not match.
    as_traced = torch.jit.optimized_execution(False) if jit else contextlib.nullcontext()  # eager: the user's setting
    with pyro.validation_enabled(False), naming_kl_weight(kl_weight), as_traced:
        return optimize(
            loss,
            x,
            y,
            schedule,
            seed=seed,
            held=lambda: [p for p in [_noise_parameter(model)] if p is not None],
            initialize=initialize,
            warm_up=call_guide if warm_up else None,
            sampler=sampler,
            callback=callback,
            progress=progress,
            checkpoint=checkpoint,
            noise=noise,
        )


@flush_denormals()  # every call: the loop's arithmetic with subnormals as zero, the caller's mode after
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
    sampler: Minibatches | None = None,
    callback: Callable[[int], None] | None = None,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
) -> list[float]:
    """Minimize ``objective(x_batch, y_batch, num_data=N)`` with Adam under ``schedule`` (``num_data`` only
    when the batch is a minibatch), in one process or in every rank of a process group.

    :param held: the parameters held during ``schedule.fixed_noise_steps`` (called when the optimizer is built).
    :param initialize: called first, unless a checkpoint is resumed.
    :param warm_up: called with this rank's first shard (and ``num_data``) to create lazily made parameters
        before the optimizer and DDP see them. Without it (one process, no checkpoint) the optimizer is built
        after the first step's forward pass, from the parameters that pass created, as Pyro's ``SVI`` does.
    :param sampler: the minibatches (default ``Minibatches(N, schedule.batch_size, seed)``: with replacement);
        its ``num_data`` and ``batch_size`` must be the data's and the schedule's.
    :param callback: called with the number of steps done (``1 .. schedule.steps``) after every step.
    :returns: this rank's loss at every step, resumed steps included.
    :raises ValueError: ``x`` or ``y`` holds NaN or infinite entries, or does not fit the schedule and sampler.
    :raises TrainingDiverged: the loss (checked every step) or a parameter (checked before each checkpoint and
        after the last step) became NaN or infinite: training stops at once, before any update or checkpoint
        with that state, so the last checkpoint written is a good one.
    :raises TrainingInterrupted: on Ctrl-C (``KeyboardInterrupt``) during the loop, with the steps done.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"train: x has {x.shape[0]} rows but y has {y.shape[0]}.")
    check_finite("train", "x (the inputs)", x)
    check_finite("train", "y (the targets)", y)
    if noise not in NOISE_MODES:
        raise ValueError(f"train: noise must be one of {NOISE_MODES}, got {noise!r}")
    world, rank = distributed.world_size(), distributed.rank()
    if warm_up is None and (world > 1 or checkpoint is not None):
        raise ValueError(
            "train: data-parallel training and checkpoints need the parameters before the first step: pass "
            "warm_up (train(..., warm_up=True)), or train in one process without a checkpoint."
        )
    num_data = x.shape[0]
    sampler = sampler if sampler is not None else Minibatches(num_data, schedule.batch_size, seed)
    expected = min(schedule.batch_size or num_data, num_data)
    if (sampler.num_data, sampler.batch_size) != (num_data, expected):
        raise ValueError(
            f"train: the sampler draws batches of {sampler.batch_size} from {sampler.num_data} examples, but the data "
            f"has {num_data} rows and the schedule's batch is {expected}: build Minibatches(len(x), "
            "schedule.batch_size, ...)."
        )
    local = shard_size(sampler.batch_size, world)
    state = read_checkpoint(checkpoint, world, noise) if checkpoint is not None else None
    if state is None and initialize is not None:
        initialize()
    scaled = {} if sampler.full_batch else {"num_data": num_data}
    if warm_up is not None:
        with _noise_scope(noise, range(local)):
            warm_up(x[:local], y[:local], **scaled)

    held_parameters: list[torch.nn.Parameter] = []
    optimizer: torch.optim.Adam | None = None
    lr_schedule: torch.optim.lr_scheduler.LambdaLR | None = None

    def build_optimizer() -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
        held_parameters.extend(held())
        held_ids = {id(p) for p in held_parameters}
        others = [p for p in objective.parameters() if id(p) not in held_ids and p.requires_grad]
        groups: list[dict] = [{"params": others}]
        factors: list[Callable[[int], float]] = [schedule.lr_factor]
        if held_parameters:
            fixed = schedule.fixed_noise_steps
            groups.append({"params": held_parameters})
            factors.append(lambda step: schedule.lr_factor(step, delay=fixed))
        return scheduled_adam(groups, schedule.lr, factors)

    if warm_up is not None:
        optimizer, lr_schedule = build_optimizer()
    losses: list[float] = []
    start = 0
    if state is not None:
        assert optimizer is not None and lr_schedule is not None
        objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        lr_schedule.load_state_dict(state["lr_schedule"])
        sampler.load_state_dict(state["sampler"])
        restore_rng_state(state["rng"][rank], x.device)
        losses, start = list(state["losses"]), int(state["step"])
    elif world > 1 and noise == "per_rank":
        pyro.set_rng_seed((seed + 7919 * (rank + 1)) % 2**32)

    step_loss: torch.nn.Module = objective
    if world > 1:
        device_ids = [x.device.index] if x.device.type == "cuda" else None
        # Buffers (prior scales, fixed signs) are synchronized once here, not before every step: torch's
        # replacement for broadcast_buffers=False still syncs at init, so torch itself advises keeping it.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
            step_loss = DistributedDataParallel(
                objective, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True
            )
    label = progress if isinstance(progress, str) else "training"
    hidden = not progress or rank != 0
    steps = range(start, schedule.steps)
    bar = tqdm(steps, desc=label, total=schedule.steps, initial=start, disable=hidden, leave=False, mininterval=1.0)
    done = start  # the steps whose update is applied
    try:
        for step in bar:
            index = next(sampler)
            if index is None:  # full batch: each rank its slice
                x_batch, y_batch = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
            else:
                index = index[rank * local : (rank + 1) * local].to(x.device)
                x_batch, y_batch = x[index], y[index]
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            first = (seed * 1_000_003 + step) * 2**24 + rank * local  # the shard's positions in the global batch
            with _noise_scope(noise, range(first, first + local)):
                loss = step_loss(x_batch, y_batch, **scaled)
            if optimizer is None:  # the first forward pass has created the parameters
                optimizer, lr_schedule = build_optimizer()
            assert lr_schedule is not None
            value = float(loss.detach())
            if not math.isfinite(value):  # before the update: the parameters stay as they were
                raise TrainingDiverged(step + 1, divergence_cause(value, objective, schedule.lr))
            loss.backward()
            if step < schedule.fixed_noise_steps:
                for parameter in held_parameters:
                    parameter.grad = None
            optimizer.step()
            lr_schedule.step()
            losses.append(value)
            done = step + 1
            if checkpoint is not None and done % checkpoint.every == 0 and done < schedule.steps:
                check_parameters(objective, done, schedule.lr)  # a non-finite state never replaces a good one
                stateful = dict(objective=objective, optimizer=optimizer, lr_schedule=lr_schedule, sampler=sampler)
                save_checkpoint(checkpoint, stateful, losses, done, world, rank, noise, x.device)
            if callback is not None:
                callback(done)
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:
        raise TrainingInterrupted(done) from None
    if done > start:
        check_parameters(objective, done, schedule.lr)
    return losses
