"""The engine's checkpoints: what a training run saves every few steps and resumes from, written atomically.

A checkpoint holds the parameters, Adam's state, the learning-rate schedule, the minibatch sampler and every
rank's random state, so a resumed run ends exactly where an uninterrupted run ends.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from .files import write_atomic

__all__ = ["Checkpoint", "read_checkpoint", "restore_rng_state", "save_checkpoint"]

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


def read_checkpoint(checkpoint: Checkpoint, world: int, noise: str) -> dict | None:
    path = checkpoint.path
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated by hand, another format: start again rather than fail
        warnings.warn(f"{path} is unreadable ({error}); training from the start", stacklevel=3)
        return None
    saved = (state.get("key"), state.get("world_size"), state.get("noise"))
    if state.get("format") != FORMAT:
        saved = ("an older checkpoint format", *saved[1:])
    if saved != (checkpoint.key, world, noise):
        warnings.warn(
            f"{path} belongs to another run (key, processes, noise {saved} instead of "
            f"{(checkpoint.key, world, noise)}); training from the start",
            stacklevel=3,
        )
        return None
    return state


def save_checkpoint(checkpoint, stateful: dict, losses, step, world, rank, noise, device) -> None:
    """Gather every rank's random state and let rank 0 write the checkpoint atomically."""
    rng = [_rng_state(device)]
    if world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if rank != 0:
        return
    state = {
        "format": FORMAT,
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
