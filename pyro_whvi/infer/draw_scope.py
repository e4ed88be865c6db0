"""Which draws a lazy weight makes (:mod:`~pyro_whvi.infer.lazy_weight`): one per example or one shared
(:func:`local_reparameterization`), from the global stream or from one seed per example (:func:`example_seeds`).

Both settings are :class:`contextvars.ContextVar` s: they hold for this thread (or asyncio task) only.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import torch
from torch import Tensor

__all__ = [
    "active_example_seeds",
    "along_examples",
    "check_example_dim",
    "example_seeds",
    "local_reparameterization",
    "local_reparameterization_enabled",
    "seeded_draws",
]

# The innermost local_reparameterization(...) block of this thread or task, if any.
_LOCAL_OVERRIDE: ContextVar[bool | None] = ContextVar("pyro_whvi_local_reparameterization", default=None)

# The seeds of the examples of the innermost example_seeds(...) block, if any.
_EXAMPLE_SEEDS: ContextVar[tuple[int, ...] | None] = ContextVar("pyro_whvi_example_seeds", default=None)


@contextlib.contextmanager
def local_reparameterization(enabled: bool) -> Iterator[None]:
    """Force local reparameterization on or off for lazy weights created inside the block.

    The setting is a :class:`contextvars.ContextVar`: it holds for this thread (or asyncio task) only.
    """
    token = _LOCAL_OVERRIDE.set(bool(enabled))
    try:
        yield
    finally:
        _LOCAL_OVERRIDE.reset(token)


def local_reparameterization_enabled(default: bool) -> bool:
    """The setting in force: the innermost :func:`local_reparameterization` block, else ``default``."""
    override = _LOCAL_OVERRIDE.get()
    return default if override is None else override


@contextlib.contextmanager
def example_seeds(seeds: Sequence[int]) -> Iterator[None]:
    """Draw the per-example noise of lazy weights created inside the block from one seed per example.

    Example ``i`` of every ``F.linear``/``F.conv*d`` gets the noise that a generator seeded with
    ``seeds[i]`` and the site's name draws for one example, whatever the batch and the process, and the
    global random stream is left as it was. Slower than one batched draw (one draw per example); meant
    for runs that must not depend on how a batch is split (data-parallel equivalence, reproducibility).

    :param seeds: one non-negative integer per example, in the order of the examples.
    """
    values = tuple(int(seed) for seed in seeds)
    if any(seed < 0 for seed in values):
        raise ValueError("example_seeds: non-negative integer seeds expected.")
    token = _EXAMPLE_SEEDS.set(values)
    try:
        yield
    finally:
        _EXAMPLE_SEEDS.reset(token)


def seeded_draws(draw, seeds: tuple[int, ...], site: str, device: torch.device) -> Tensor:
    """``draw(1)`` once per seed, each from the generator state ``seed`` and ``site`` give, concatenated."""
    key = zlib.crc32(site.encode())
    draws = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for seed in seeds:
            torch.manual_seed((seed * 2_654_435_761 + key) % 2**63)
            draws.append(draw(1))
    return torch.cat(draws)


def check_example_dim(example_dim, owner: str) -> int:
    """``example_dim`` as an int >= 0, or a ``ValueError`` naming ``owner``."""
    if isinstance(example_dim, bool) or not isinstance(example_dim, int) or example_dim < 0:
        raise ValueError(
            f"{owner}: example_dim must be an int >= 0 (the input dimension that indexes examples: 0 for (B, ..., D) "
            f"batches, 1 for sequence-first (T, B, D)), got {example_dim!r}."
        )
    return example_dim


def active_example_seeds() -> tuple[int, ...] | None:
    """The seeds of the innermost :func:`example_seeds` block, or ``None`` outside one."""
    return _EXAMPLE_SEEDS.get()


def along_examples(noise: Tensor, example_dim: int, batch_dims: int) -> Tensor:
    """Per-example ``noise`` ``(B, *event)`` viewed to broadcast against ``batch_dims`` input dimensions
    whose ``example_dim`` indexes the examples."""
    event = noise.shape[1:]
    shape = (1,) * example_dim + noise.shape[:1] + (1,) * (batch_dims - example_dim - 1) + event
    return noise.reshape(shape)
