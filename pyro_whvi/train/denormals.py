"""Subnormal ("denormal") floats during training: x86 CPUs compute with them many times more slowly than with
normal ones, and MAP training of a wide ReLU network makes hundreds of thousands of them.

Under a Gaussian prior (weight decay) the weights into a dead ReLU unit get only the prior's gradient, so Adam
shrinks them towards zero geometrically, through the subnormal range (``|w| < 1.2e-38`` in float32). In ``whvi uci
--methods mcd`` at the ``wide`` protocol (2 x 1024, the robot arm) 21% of the hidden layer's weights and 35% of
their Adam first moments were subnormal after 2,000 steps, and the steps had slowed from about 30 a second to 2.5.
``benchmarks/denormals.py`` times it from one state: 5.5x as long a step with them kept as with them flushed.
:func:`flush_denormals` makes the CPU treat them as zero (x86's FTZ/DAZ, ``torch.set_flush_denormal``): a number
below ``1.2e-38`` (float32) or ``2.2e-308`` (float64) becomes zero, nothing else changes. The engine trains under
it; a user's own ``SVI`` loop can run in ``with flush_denormals():``.

References:
    Intel 64 and IA-32 Architectures Optimization Reference Manual, "Floating-point modes and exceptions"
    (denormal operands and the FTZ/DAZ flags).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["flush_denormals", "flushing_denormals"]


def flushing_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal floats to zero now (PyTorch has no getter: half
    the smallest normal float32 is subnormal, and comes out zero only under flushing; a one-element tensor, since
    a 0-d one is divided in double precision; the CPU's mode, so a CPU tensor)."""
    smallest_normal = torch.tensor([torch.finfo(torch.float32).tiny], dtype=torch.float32, device="cpu")
    return bool(smallest_normal.div(2).eq(0).all())


@contextlib.contextmanager
def flush_denormals() -> Iterator[bool]:
    """Within the block this thread's CPU arithmetic flushes subnormal floats to zero; after it, the mode it had
    before. Yields whether the CPU supports it (x86 with SSE3, ARM64). It sets the calling thread's mode only, as
    ``torch.set_flush_denormal`` does: PyTorch's intra-op worker threads (``torch.set_num_threads(n > 1)``) keep
    theirs, so one thread per run, the harness's default, gets the whole of it."""
    before = flushing_denormals()
    supported = torch.set_flush_denormal(True)
    try:
        yield supported
    finally:
        if supported and not before:
            torch.set_flush_denormal(False)
