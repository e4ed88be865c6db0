r"""One interface for fitting and predicting with every GP regressor (random features and inducing points).

Shape letters: ``N`` data points, ``d`` input dimensions.

:class:`GPRegressor` is what the GP experiment (``whvi gp``) and the benchmarks talk to: ``fit(x, y)`` runs
the WHVI paper's schedule (:data:`GP_SCHEDULE`: Adam, observation noise held fixed for the first part,
App. D.4) and ``predict(x)`` returns the predictive mean and variance of ``y``. PyTorch models implement one
hook, :meth:`TorchGPRegressor.negative_elbo`, and train on the application's one loop
(:func:`pyro_whvi.train.engine.optimize`); the GPflow baseline runs its TensorFlow steps on the same
minibatches (:class:`~pyro_whvi.train.engine.Minibatches`).
:class:`RandomFeatureRegressor` wraps the library's :class:`~pyro_whvi.gp.RandomFeatureGP`.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 (initialization and schedule of the GP experiments).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import gpytorch
import torch
from torch import Tensor

from ..gp import RandomFeatureGP, RandomFeatureKernel
from ..gp.random_feature_gp import check_regression_data
from ..train.engine import Minibatches, Schedule, optimize

__all__ = [
    "GP_SCHEDULE",
    "FitResult",
    "GPInitialization",
    "GPRegressor",
    "RandomFeatureRegressor",
    "TorchGPRegressor",
]

#: The GP experiments' schedule (WHVI paper App. D.4): 12,000 Adam steps at a constant 6e-4 (5e-3 for
#: hartmann6), the noise held for the first 10,000, minibatches of 256 drawn in epochs without replacement.
GP_SCHEDULE = Schedule(steps=12000, fixed_noise_steps=10000, batch_size=256, lr=6e-4, lr_power=0.0)


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


class GPRegressor(ABC):
    """A GP regression model with a variational objective: fit on data, predict ``y`` at new inputs."""

    #: short name used in benchmark tables
    name: str = "gp"

    @property
    @abstractmethod
    def num_variational_parameters(self) -> int:
        """Number of variational parameters (kernel and likelihood hyperparameters not counted)."""

    @abstractmethod
    def fit(
        self, x: Tensor, y: Tensor, schedule: Schedule = GP_SCHEDULE, *, seed: int = 0, progress: bool = False
    ) -> FitResult:
        """Maximize the ELBO on ``(x, y)`` (``(N, d)`` and ``(N,)``) with ``schedule``; ``seed`` seeds the
        minibatches (epochs without replacement)."""

    @abstractmethod
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of ``y`` (observation noise included) at ``x``, each ``(N,)``."""

    @abstractmethod
    def elbo(self, x: Tensor, y: Tensor) -> float:
        """The ELBO on all of ``(x, y)``, divided by ``N``."""


class TorchGPRegressor(GPRegressor, torch.nn.Module):
    """A PyTorch GP regressor; subclasses implement :meth:`negative_elbo` and :meth:`noise_parameters`."""

    @abstractmethod
    def negative_elbo(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Minibatch estimate of the negative ELBO of all ``num_data`` points, divided by ``num_data``."""

    @abstractmethod
    def noise_parameters(self) -> list[torch.nn.Parameter]:
        """The likelihood's noise parameters (held fixed during ``fixed_noise_steps``)."""

    def fit(
        self, x: Tensor, y: Tensor, schedule: Schedule = GP_SCHEDULE, *, seed: int = 0, progress: bool = False
    ) -> FitResult:
        check_regression_data(x, y)
        parameter = next(self.parameters())
        x, y = x.to(parameter), y.to(parameter)
        self.train()
        start = time.perf_counter()
        losses = optimize(
            _NegativeELBO(self),
            x,
            y,
            schedule,
            seed=seed,
            held=self.noise_parameters,
            sampler=Minibatches(len(x), schedule.batch_size, seed, replacement=False),
            progress=f"fit {self.name}" if progress else False,
        )
        seconds = time.perf_counter() - start
        self.eval()
        return FitResult(losses, seconds)


class _NegativeELBO(torch.nn.Module):
    """A regressor's :meth:`~TorchGPRegressor.negative_elbo` as the engine's loss module."""

    def __init__(self, regressor: TorchGPRegressor):
        super().__init__()
        self.regressor = regressor

    def forward(self, x: Tensor, y: Tensor, num_data: int | None = None) -> Tensor:
        return self.regressor.negative_elbo(x, y, x.shape[0] if num_data is None else num_data)


class RandomFeatureRegressor(TorchGPRegressor):
    r""":class:`RandomFeatureGP` with a :class:`gpytorch.likelihoods.GaussianLikelihood`, fit and predict.

    The loss is GPyTorch's :class:`~gpytorch.mlls.VariationalELBO` of the model (negated; per data
    point), written out in closed form from the model's mean and covariance root (see :meth:`negative_elbo`).

    :param input_dim: ``d``.
    :param num_features: ``F = 2m``, an even number.
    :param projection: ``"dense"``, ``"fastfood"`` or ``"sorf"`` (see :class:`RandomFeatureKernel`).
    :param posterior: ``"gaussian"`` or ``"whvi"``.
    :param covariance: ``"diagonal"`` or ``"full"``.
    :param init: initial hyperparameters (WHVI paper App. D.4).
    :param seed: seeds the random projection.
    :param dtype: parameter dtype.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), App. D.4.
    """

    def __init__(
        self,
        input_dim: int,
        num_features: int,
        projection: str = "dense",
        posterior: str = "whvi",
        covariance: str = "diagonal",
        init: GPInitialization = GPInitialization(),
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        if not isinstance(num_features, int) or num_features < 2 or num_features % 2:
            raise ValueError(
                f"RandomFeatureRegressor: num_features must be an even integer >= 2, got {num_features!r}."
            )
        kernel = RandomFeatureKernel(
            num_features // 2, projection, num_dims=input_dim, ard_num_dims=input_dim, seed=seed
        ).to(dtype)
        kernel.lengthscale = torch.full((input_dim,), init.lengthscale_for(input_dim), dtype=dtype)
        kernel.outputscale = init.outputscale
        self.model = RandomFeatureGP(kernel, posterior, covariance).to(dtype)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(1e-6)
        ).to(dtype)
        self.likelihood.noise = init.noise_std**2
        self.input_dim = input_dim
        self.name = f"rf-{posterior}-{covariance}"

    @property
    def num_variational_parameters(self) -> int:
        return self.model.weights.num_variational_parameters

    def noise_parameters(self) -> list[torch.nn.Parameter]:
        return [self.likelihood.noise_covar.raw_noise]

    def negative_elbo(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        # -gpytorch.mlls.VariationalELBO(likelihood, model, num_data)(model(x), y), written out: the Gaussian
        # expectation needs only the mean and the root's row norms (tests/gp/test_gp_model.py checks the two agree).
        # GPyTorch's path (the distribution, the likelihood's noise operator, the ELBO's prior and added-loss
        # walks) adds about 0.1 ms to every step: +8-16% on the RF-WHVI steps of benchmarks/gp_speed.py
        # (D = 8 and 32, batch 256, float32, one thread).
        mean, root = self.model.variational_strategy.mean_and_root(x)
        noise = self.likelihood.noise
        expected = -0.5 * torch.log(2 * math.pi * noise) - ((y - mean).pow(2) + root.pow(2).sum(-1)) / (2 * noise)
        return self.model.variational_strategy.kl_divergence() / num_data - expected.mean()

    @torch.no_grad()
    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        check_regression_data(x, input_dim=self.input_dim)
        predictive = self.likelihood(self.model(x.to(self.likelihood.noise)))
        return predictive.mean, predictive.variance

    @torch.no_grad()
    def elbo(self, x: Tensor, y: Tensor) -> float:
        check_regression_data(x, y, input_dim=self.input_dim)
        parameter = self.likelihood.noise
        return -self.negative_elbo(x.to(parameter), y.to(parameter), x.shape[0]).item()
