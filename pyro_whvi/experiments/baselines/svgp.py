r"""Sparse variational GP (inducing point) regression with GPyTorch, the WHVI paper's SVGP baseline.

Shape letters: ``N`` data points, ``d`` input dimensions, ``M`` inducing points.

The model is the whitened SVGP of Hensman et al.: ``u = L v`` with ``L L^T = K_ZZ`` and
:math:`q(v) = \mathcal{N}(m, S)`, where ``S`` is a full Cholesky factor (``covariance="full"``) or a
diagonal (``covariance="diagonal"``, mean field). The inducing inputs ``Z`` are learned with the
hyperparameters. To compare with WHVI at an equal budget, :func:`inducing_points_for_parameters`
picks the number of inducing points whose variational parameter count matches (rounded up).

References:
    J. Hensman, N. Fusi, N. D. Lawrence. *Gaussian Processes for Big Data*. UAI 2013.

    J. Hensman, A. G. de G. Matthews, Z. Ghahramani. *Scalable Variational Gaussian Process
    Classification*. AISTATS 2015.

    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 (SVGP baselines with a matched number of parameters).
"""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

from ...gp import check_regression_data
from ..gp_regressors import GPInitialization, TorchGPRegressor

__all__ = [
    "GPyTorchSVGP",
    "inducing_points_for_parameters",
    "initial_inducing_points",
    "svgp_num_variational_parameters",
]

Covariance = str  #: "full" or "diagonal", checked at run time
_COVARIANCES = ("full", "diagonal")
#: lower bound of the noise variance, the same as GPflow's ``Gaussian`` likelihood default
NOISE_VARIANCE_LOWER_BOUND = 1e-6
_PREDICT_CHUNK = 8192


def _check_covariance(covariance: str) -> None:
    if covariance not in _COVARIANCES:
        raise ValueError(f"covariance must be 'full' or 'diagonal', got {covariance!r}.")


def svgp_num_variational_parameters(num_inducing: int, input_dim: int, covariance: Covariance = "full") -> int:
    r"""Number of variational parameters of an SVGP: inducing inputs, mean and covariance of :math:`q(u)`.

    :param num_inducing: ``M``, the number of inducing points.
    :param input_dim: ``d``, the input dimension.
    :param covariance: ``"full"`` counts a Cholesky factor (:math:`M(M+1)/2`), ``"diagonal"`` ``M`` variances.
    :return: :math:`Md + M + M(M+1)/2` (full) or :math:`Md + 2M` (diagonal).
    """
    _check_covariance(covariance)
    if num_inducing < 1 or input_dim < 1:
        raise ValueError(f"num_inducing ({num_inducing}) and input_dim ({input_dim}) must be positive integers.")
    covariance_count = num_inducing * (num_inducing + 1) // 2 if covariance == "full" else num_inducing
    return num_inducing * input_dim + num_inducing + covariance_count


def inducing_points_for_parameters(num_parameters: int, input_dim: int, covariance: Covariance = "full") -> int:
    """The smallest number of inducing points with at least ``num_parameters`` variational parameters.

    This matches an SVGP to another model's parameter budget, rounding up (WHVI paper App. D.4).

    :param num_parameters: the budget, a positive integer.
    :param input_dim: ``d``, the input dimension.
    :param covariance: ``"full"`` or ``"diagonal"``, see :func:`svgp_num_variational_parameters`.
    :return: the number of inducing points ``M >= 1``.
    """
    _check_covariance(covariance)
    if num_parameters < 1:
        raise ValueError(f"num_parameters must be a positive integer, got {num_parameters}.")
    if input_dim < 1:
        raise ValueError(f"input_dim must be a positive integer, got {input_dim}.")
    # The count grows by at least d + 2 per inducing point, so the search is short; bisection keeps it exact.
    low, high = 1, max(1, num_parameters // (input_dim + 2) + 1)
    while svgp_num_variational_parameters(high, input_dim, covariance) < num_parameters:
        high *= 2
    while low < high:
        middle = (low + high) // 2
        if svgp_num_variational_parameters(middle, input_dim, covariance) >= num_parameters:
            high = middle
        else:
            low = middle + 1
    return low


def initial_inducing_points(x: Tensor, num_inducing: int, seed: int = 0) -> Tensor:
    """Initial inducing inputs: ``num_inducing`` rows of ``x`` drawn without replacement.

    :param x: ``(N, d)`` training inputs.
    :param num_inducing: ``M``, at most ``N``.
    :param seed: seeds the draw.
    :return: an ``(M, d)`` copy of the chosen rows.
    """
    check_regression_data(x)
    if not 1 <= num_inducing <= x.shape[0]:
        raise ValueError(
            f"num_inducing must be between 1 and the number of data points {x.shape[0]}, got {num_inducing}."
        )
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(x.shape[0], generator=generator)[:num_inducing]
    return x[index.to(x.device)].clone()


def check_inducing_points(inducing_points: Tensor, covariance: str) -> None:
    """Raise a specific error for inducing inputs that are not a finite ``(M, d)`` tensor, or a bad covariance."""
    _check_covariance(covariance)
    check_regression_data(inducing_points, name="inducing_points")
    if inducing_points.shape[0] < 1 or inducing_points.shape[1] < 1:
        raise ValueError(
            f"inducing_points must have M >= 1 rows and d >= 1 columns, got {tuple(inducing_points.shape)}."
        )


class _ApproximateGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points: Tensor, covariance: Covariance, learn_inducing_locations: bool) -> None:
        num_inducing, input_dim = inducing_points.shape
        # mean_init_std=0: start exactly at q(v) = N(0, I), as GPflow's whitened SVGP does.
        distribution: gpytorch.variational._VariationalDistribution
        if covariance == "full":
            distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing, mean_init_std=0.0)
        else:
            distribution = gpytorch.variational.MeanFieldVariationalDistribution(num_inducing, mean_init_std=0.0)
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, distribution, learn_inducing_locations=learn_inducing_locations
        )
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=input_dim))

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class GPyTorchSVGP(TorchGPRegressor):
    """Whitened SVGP regression (ARD RBF kernel, Gaussian noise) with GPyTorch.

    :param inducing_points: ``(M, d)`` initial inducing inputs; the model uses their dtype and device.
    :param covariance: ``"full"`` (Cholesky factor) or ``"diagonal"`` (mean field) covariance of ``q(v)``.
    :param init: initial lengthscale, outputscale and noise standard deviation.
    :param learn_inducing_locations: optimize the inducing inputs with the other parameters.
    """

    name = "svgp-gpytorch"

    def __init__(
        self,
        inducing_points: Tensor,
        covariance: Covariance = "full",
        init: GPInitialization = GPInitialization(),
        learn_inducing_locations: bool = True,
    ) -> None:
        check_inducing_points(inducing_points, covariance)
        super().__init__()
        self.covariance = covariance
        self.num_inducing, self.input_dim = inducing_points.shape
        inducing_points = inducing_points.detach().clone()
        self.model = _ApproximateGP(inducing_points, covariance, learn_inducing_locations)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(NOISE_VARIANCE_LOWER_BOUND)
        )
        self.to(device=inducing_points.device, dtype=inducing_points.dtype)
        kernel = self.model.covar_module
        kernel.base_kernel.lengthscale = torch.full_like(
            kernel.base_kernel.lengthscale,
            init.lengthscale_for(self.input_dim),
        )
        kernel.outputscale = init.outputscale
        self.likelihood.noise = init.noise_std**2

    @property
    def num_variational_parameters(self) -> int:
        return svgp_num_variational_parameters(self.num_inducing, self.input_dim, self.covariance)

    def negative_elbo(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        """Minus the ELBO of all ``num_data`` points divided by ``num_data``, from the minibatch ``(x, y)``.

        :param x: ``(B, d)`` minibatch inputs.
        :param y: ``(B,)`` minibatch targets.
        :param num_data: ``N``, the size of the full training set.
        """
        # VariationalELBO is already per data point: sum of log-likelihoods / B - KL / N. The inputs were
        # checked by fit/elbo, once, outside the training loop.
        mll = gpytorch.mlls.VariationalELBO(self.likelihood, self.model, num_data=num_data)
        return -mll(self.model(x), y)

    def noise_parameters(self) -> list[torch.nn.Parameter]:
        return [self.likelihood.noise_covar.raw_noise]

    def _parameter(self) -> Tensor:
        return self.model.variational_strategy.inducing_points

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of ``y`` (noise included) at ``(N, d)`` inputs ``x``, each ``(N,)``."""
        check_regression_data(x, input_dim=self.input_dim)
        x = x.to(self._parameter())
        was_training = self.training
        self.eval()
        means, variances = [], []
        try:
            with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
                for chunk in x.split(_PREDICT_CHUNK):
                    predictive = self.likelihood(self.model(chunk))
                    means.append(predictive.mean)
                    variances.append(predictive.variance)
        finally:
            self.train(was_training)
        return torch.cat(means), torch.cat(variances)

    def elbo(self, x: Tensor, y: Tensor) -> float:
        """The ELBO on all of ``(x, y)`` divided by ``N``."""
        check_regression_data(x, y, self.input_dim)
        parameter = self._parameter()
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                value = -self.negative_elbo(x.to(parameter), y.to(parameter), x.shape[0])
        finally:
            self.train(was_training)
        return float(value)
