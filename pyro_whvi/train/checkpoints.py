"""The engine's checkpoints: what a training run saves every few steps and resumes from, written atomically.

A checkpoint holds the parameters, Adam's state, the learning-rate schedule, the minibatch sampler and every
rank's random state, so a resumed run ends exactly where an uninterrupted run ends. It also holds the seconds
the run has trained, so that a resumed run's time counts the whole run (:func:`resumed_seconds`).
"""

from __future__ import annotations

import io
import pickle
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from . import distributed
from .files import notice, write_atomic

__all__ = ["Checkpoint", "read_checkpoint", "restore_rng_state", "resumed_seconds", "save_checkpoint"]

# Per checkpoint file: when this process read it (time.perf_counter()) and the seconds trained before then.
_clock: dict[Path, tuple[float, float]] = {}

FORMAT = 2  # 2: the sampler's state replaces the batch generator's


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


def _rng_state(device: torch.device) -> dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _unreadable(path: Path, error: Exception) -> str:
    """Why ``torch.load`` could not read ``path``, in a few words (not PyTorch's page on ``weights_only``)."""
    try:
        if path.stat().st_size == 0:
            return "empty file"
    except OSError as stat_error:
        return stat_error.strerror or type(stat_error).__name__
    if isinstance(error, pickle.UnpicklingError):
        return "it holds objects other than tensors and plain data: not a checkpoint of this library"
    if isinstance(error, (EOFError, zipfile.BadZipFile)) or "PytorchStreamReader" in str(error):
        return "truncated, or not a PyTorch file"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first[:120]}" if first else type(error).__name__


def read_checkpoint(checkpoint: Checkpoint, world: int, noise: str) -> dict | None:
    """The state saved in ``checkpoint.path`` if it is this run's (key, processes, noise mode), else ``None``;
    a damaged file or another run's is named in a :func:`~pyro_whvi.train.files.notice` and trained over."""
    path = checkpoint.path
    _clock[path] = (time.perf_counter(), 0.0)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not a checkpoint")
    except Exception as error:  # truncated by hand, another format: start again rather than fail
        reason = str(error) if isinstance(error, TypeError) else _unreadable(path, error)
        if distributed.rank() == 0:  # every rank reads it; one says so
            notice(f"{path} is unreadable ({reason}); training from the start")
        return None
    saved = (state.get("key"), state.get("world_size"), state.get("noise"))
    if state.get("format") != FORMAT:
        saved = ("an older checkpoint format", *saved[1:])
    if saved != (checkpoint.key, world, noise):
        if distributed.rank() == 0:
            notice(
                f"{path} belongs to another run (key, processes, noise {saved} instead of "
                f"{(checkpoint.key, world, noise)}); training from the start"
            )
        return None
    _clock[path] = (time.perf_counter(), float(state.get("seconds", 0.0)))
    return state


def resumed_seconds(checkpoint: Checkpoint | None) -> float:
    """The seconds of training that the state last resumed from ``checkpoint`` had behind it (0 if none was):
    what a resumed run adds to its own time to report the whole run's."""
    return _clock.get(checkpoint.path, (0.0, 0.0))[1] if checkpoint is not None else 0.0


def save_checkpoint(checkpoint, stateful: dict, losses, step, world, rank, noise, device) -> None:
    """Gather every rank's random state and let rank 0 write the checkpoint atomically."""
    rng = [_rng_state(device)]
    if world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if rank != 0:
        return
    started, before = _clock.get(checkpoint.path, (time.perf_counter(), 0.0))
    state = {
        "format": FORMAT,
        "seconds": before + time.perf_counter() - started,
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
