"""Argument types and the parser class of the ``whvi`` command line: one-line errors, checked numbers."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from .memory_budget import MAX_SAMPLES, MAX_STEPS

__all__ = [
    "OneLineErrorParser",
    "at_most",
    "check_device",
    "choices",
    "float_in",
    "nonnegative",
    "positive",
    "positive_float",
    "positive_numbers",
    "rates",
    "samples",
    "steps",
]


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``whvi uci: error: ...`` (exit status 2), without the
    usage block (``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.splitlines())}\n")


def _whole(text: str, expected: str) -> int:
    """``text`` as a whole number: ``50500``, or in scientific notation ``5e4``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return int(value)


def positive(text: str) -> int:
    value = _whole(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative(text: str) -> int:
    value = _whole(text, "a non-negative integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def at_most(maximum: int, why: str, *, minimum: int = 1) -> Callable[[str], int]:
    """The argument type of a whole number in ``[minimum, maximum]``; ``why`` explains the maximum."""

    def parse(text: str) -> int:
        value = nonnegative(text) if minimum == 0 else positive(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,} expected ({why}), got {text!r}")
        return value

    return parse


#: Optimizer steps (``--steps`` and the like).
steps = at_most(MAX_STEPS, "200 times the WHVI paper's 50,500; every step's loss is kept in memory and checkpoints")
#: Posterior samples to predict with (``--samples``).
samples = at_most(MAX_SAMPLES, "the Monte-Carlo error shrinks as 1/sqrt(samples): 10^6 resolve it to 0.1%")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_numbers(text: str) -> float | tuple[float, ...]:
    """The argument type of one positive number, or of several separated by commas (candidates, as a tuple)."""
    numbers = tuple(positive_float(part.strip()) for part in text.split(","))
    return numbers if len(numbers) > 1 else numbers[0]


def rates(text: str) -> float | tuple[float, ...]:
    """:func:`positive_numbers` below 1: one rate, or several candidates (e.g. MC dropout's)."""
    numbers = positive_numbers(text)
    if max(numbers if isinstance(numbers, tuple) else (numbers,)) >= 1:
        raise argparse.ArgumentTypeError(f"expected rates below 1, e.g. 0.005,0.01,0.05,0.1, got {text!r}")
    return numbers


def float_in(low: float, high: float, why: str) -> Callable[[str], float]:
    """The argument type of a number in ``[low, high]``; ``why`` explains the range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a number from {low:g} to {high:g} ({why}), got {text!r}")
        return value

    return parse


def choices(text: str, names: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """The comma-separated ``names`` in ``text``, each once, in order."""
    chosen = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{flag}: choose from {','.join(names)}, got {text!r}")
    return chosen


def check_device(device: str, flag: str = "--device") -> str:
    """``device`` (``"cpu"`` or ``"cuda"``) if this process can use it.

    :raises ValueError: one line naming ``flag`` and the fix, when ``device`` is ``"cuda"`` and PyTorch sees no
        CUDA GPU (a CPU-only build, no driver, or ``CUDA_VISIBLE_DEVICES`` hiding every GPU).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"{flag}: choose from cpu,cuda, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"{flag} cuda: PyTorch sees no CUDA GPU here (torch.cuda.is_available() is False; torch "
                f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); run with {flag} cpu (the "
                "default), or on a machine with an NVIDIA GPU and a CUDA build of PyTorch"
            )
    return device
