"""Argument types and the parser class of the ``whvi`` command line: one-line errors, checked numbers."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

__all__ = ["OneLineErrorParser", "check_device", "choices", "nonnegative", "positive", "positive_float"]


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``whvi uci: error: ...`` (exit status 2), without the
    usage block (``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.splitlines())}\n")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative(text: str) -> int:
    return positive(text) if text != "0" else 0


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def choices(text: str, names: tuple[str, ...], flag: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
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
