"""Why a training run stopped before its last step: the typed exceptions of :mod:`pyro_whvi.train.engine`.

* :class:`TrainingDiverged` — the loss or a parameter became NaN or infinite. The engine checks the loss
  every step (it is read anyway) and the parameters only before a checkpoint, after the last step and when the
  loss is not finite, so the check costs nothing measurable; the last good checkpoint is kept.
* :class:`TrainingInterrupted` — Ctrl-C (``SIGINT``) during the loop; a :class:`KeyboardInterrupt`, so code that
  stops on Ctrl-C still does.

Both carry the step (the number of steps done, as the checkpoints count them) and pickle with it, so that
:func:`pyro_whvi.train.distributed.launch` hands a rank's exception to its caller as it was raised.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

__all__ = [
    "TrainingDiverged",
    "TrainingInterrupted",
    "check_parameters",
    "divergence_cause",
    "naming_kl_weight",
    "non_finite_parameter",
]


class TrainingDiverged(RuntimeError):
    """The loss or a parameter became NaN or infinite at ``step``; ``cause`` says which and what to lower.

    Its message is one line: ``training diverged at step 37: the loss became nan; lower the learning rate ...``.
    """

    def __init__(self, step: int, cause: str) -> None:
        super().__init__(f"training diverged at step {step}: {cause}")
        self.step = int(step)
        self.cause = cause

    def __reduce__(self):
        return type(self), (self.step, self.cause)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training after ``step`` steps (a checkpointed run resumes from its last checkpoint)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"training interrupted at step {step}")
        self.step = int(step)

    def __reduce__(self):
        return type(self), (self.step,)


def non_finite_parameter(module: torch.nn.Module) -> str | None:
    """``"'name' is nan"`` for the first parameter of ``module`` holding a NaN or infinite entry; ``None`` if none."""
    for name, parameter in module.named_parameters():
        if parameter.device.type != "meta" and not torch.isfinite(parameter).all():
            kind = "nan" if parameter.isnan().any() else "inf"
            return f"parameter {name!r} is {kind}"
    return None


def divergence_cause(loss: float | None, module: torch.nn.Module, lr: float) -> str:
    """What went non-finite (the loss ``loss``, or with ``loss=None`` a parameter of ``module``) and the likely fix.

    :raises ValueError: if neither the loss nor any parameter is non-finite (nothing diverged).
    """
    parameter = non_finite_parameter(module)
    if loss is not None and not math.isfinite(loss):
        what = f"the loss became {loss}" + (f" ({parameter})" if parameter else "")
    elif parameter is not None:
        what = f"{parameter} after the update"
    else:
        raise ValueError("divergence_cause: the loss and every parameter are finite")
    return f"{what}; lower the learning rate (lr / --lr, now {lr:g})"


def check_parameters(module: torch.nn.Module, step: int, lr: float) -> None:
    """Raise :class:`TrainingDiverged` at ``step`` if a parameter of ``module`` is NaN or infinite."""
    if non_finite_parameter(module) is not None:
        raise TrainingDiverged(step, divergence_cause(None, module, lr))


@contextlib.contextmanager
def naming_kl_weight(kl_weight: float) -> Iterator[None]:
    """Add the KL weight to the likely causes of a :class:`TrainingDiverged` when it is not the ELBO's 1."""
    try:
        yield
    except TrainingDiverged as error:
        if kl_weight == 1.0:
            raise
        cause = f"{error.cause} or the KL weight (kl_weight / --kl-weight, now {kl_weight:g})"
        raise TrainingDiverged(error.step, cause) from None
