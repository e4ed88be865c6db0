r"""One interface for fitting and predicting with every GP regressor (random features and inducing points).

Shape letters: ``N`` data points, ``d`` input dimensions.

:class:`GPRegressor` is what the GP benchmark and the command line talk to: ``fit(x, y)`` runs the
WHVI paper's schedule (Adam, observation noise held fixed for the first part, App. D.4) and
``predict(x)`` returns the predictive mean and variance of ``y``. PyTorch models implement one hook,
:meth:`TorchGPRegressor.negative_elbo`, and share the minibatch loop; the GPflow baseline implements
``fit`` itself.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 (initialization and schedule of the GP experiments).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

__all__ = [
    "FitResult",
    "GPInitialization",
    "GPRegressor",
    "GPSchedule",
    "TorchGPRegressor",
    "check_regression_data",
    "minibatch_indices",
]


@dataclass(frozen=True)
class GPSchedule:
    """The optimization schedule (WHVI paper App. D.4: 12,000 Adam steps, noise fixed for the first 10,000).

    :param steps: total optimizer steps.
    :param fixed_noise_steps: the first steps keep the likelihood noise at its initial value.
    :param learning_rate: Adam's step size (the paper uses 6e-4, and 5e-3 for hartmann6).
    :param batch_size: minibatch size; ``None`` uses all the data in every step.
    :param seed: seeds the minibatch order.
    """

    steps: int = 12000
    fixed_noise_steps: int = 10000
    learning_rate: float = 6e-4
    batch_size: int | None = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.fixed_noise_steps < 0:
            raise ValueError(f"GPSchedule: steps ({self.steps}) and fixed_noise_steps must be >= 0.")
        if not self.learning_rate > 0:
            raise ValueError(f"GPSchedule: learning_rate must be positive, got {self.learning_rate}.")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"GPSchedule: batch_size must be a positive integer or None, got {self.batch_size}.")


@dataclass(frozen=True)
class GPInitialization:
    r"""Hyperparameters every GP starts from (WHVI paper App. D.4).

    :param lengthscale: initial RBF lengthscale of every input dimension; ``None`` is
        :math:`\sqrt{d/2}` for ``d`` input dimensions.
    :param outputscale: initial GP variance.
    :param noise_std: initial standard deviation of the Gaussian observation noise.
    """

    lengthscale: float | None = None
    outputscale: float = 1.0
    noise_std: float = 0.02

    def lengthscale_for(self, input_dim: int) -> float:
        return math.sqrt(input_dim / 2) if self.lengthscale is None else float(self.lengthscale)


@dataclass
class FitResult:
    """What :meth:`GPRegressor.fit` returns: the per-step training loss and the wall time."""

    losses: list[float] = field(default_factory=list)  #: negative ELBO per data point, one per step
    seconds: float = 0.0


def check_regression_data(x: Tensor, y: Tensor | None = None, input_dim: int | None = None, name: str = "x") -> None:
    """Raise a specific error for inputs that are not ``(N, d)`` finite tensors with matching ``(N,)`` targets."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (N, d) tensor of inputs, got {shape}.")
    if input_dim is not None and x.shape[-1] != input_dim:
        raise ValueError(f"{name} has {x.shape[-1]} input dimensions but the model was built for {input_dim}.")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    if y is not None:
        if not isinstance(y, Tensor) or y.shape != x.shape[:1]:
            shape = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"y must be a ({x.shape[0]},) tensor of targets matching {name}, got {shape}.")
        if not torch.isfinite(y).all():
            raise ValueError("y contains NaN or infinite values.")


class GPRegressor(ABC):
    """A GP regression model with a variational objective: fit on data, predict ``y`` at new inputs."""

    #: short name used in benchmark tables
    name: str = "gp"

    @property
    @abstractmethod
    def num_variational_parameters(self) -> int:
        """Number of variational parameters (kernel and likelihood hyperparameters not counted)."""

    @abstractmethod
    def fit(self, x: Tensor, y: Tensor, schedule: GPSchedule = GPSchedule(), progress: bool = False) -> FitResult:
        """Maximize the ELBO on ``(x, y)`` (``(N, d)`` and ``(N,)``) with ``schedule``."""

    @abstractmethod
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of ``y`` (observation noise included) at ``x``, each ``(N,)``."""

    @abstractmethod
    def elbo(self, x: Tensor, y: Tensor) -> float:
        """The ELBO on all of ``(x, y)``, divided by ``N``."""


def minibatch_indices(
    num_data: int, batch_size: int | None, generator: torch.Generator, drop_last: bool = True
) -> Iterator[Tensor | None]:
    """Endless index batches drawn without replacement within an epoch (``None``: the full data);
    ``drop_last=False`` also yields each epoch's last, smaller batch, so that an epoch visits every index."""
    while True:
        if batch_size is None or batch_size >= num_data:
            yield None
            continue
        order = torch.randperm(num_data, generator=generator)
        stop = num_data - batch_size + 1 if drop_last else num_data
        for start in range(0, stop, batch_size):
            yield order[start : start + batch_size]


class TorchGPRegressor(GPRegressor, torch.nn.Module):
    """A PyTorch GP regressor; subclasses implement :meth:`negative_elbo` and :meth:`noise_parameters`."""

    @abstractmethod
    def negative_elbo(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Minibatch estimate of the negative ELBO of all ``num_data`` points, divided by ``num_data``."""

    @abstractmethod
    def noise_parameters(self) -> list[torch.nn.Parameter]:
        """The likelihood's noise parameters (held fixed during ``fixed_noise_steps``)."""

    def fit(self, x: Tensor, y: Tensor, schedule: GPSchedule = GPSchedule(), progress: bool = False) -> FitResult:
        check_regression_data(x, y)
        parameter = next(self.parameters())
        x, y = x.to(parameter), y.to(parameter)
        noise = {id(p) for p in self.noise_parameters()}
        others = [p for p in self.parameters() if id(p) not in noise and p.requires_grad]
        noise_group = [p for p in self.parameters() if id(p) in noise]
        groups: list[dict] = [{"params": others}, {"params": noise_group, "lr": 0.0}]
        optimizer = torch.optim.Adam(groups, lr=schedule.learning_rate)
        generator = torch.Generator().manual_seed(schedule.seed)
        batches = minibatch_indices(x.shape[0], schedule.batch_size, generator)
        result = FitResult()
        self.train()
        start = time.perf_counter()
        for step in tqdm(range(schedule.steps), desc=f"fit {self.name}", disable=not progress, leave=False):
            if step == schedule.fixed_noise_steps:
                optimizer.param_groups[1]["lr"] = schedule.learning_rate
            index = next(batches)
            batch_x, batch_y = (x, y) if index is None else (x[index], y[index])
            optimizer.zero_grad()
            loss = self.negative_elbo(batch_x, batch_y, x.shape[0])
            loss.backward()
            optimizer.step()
            result.losses.append(loss.item())
        result.seconds = time.perf_counter() - start
        self.eval()
        return result
