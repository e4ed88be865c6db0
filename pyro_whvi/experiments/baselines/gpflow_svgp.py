r"""Sparse variational GP regression with GPflow, a reference implementation of the SVGP baseline.

Shape letters: ``N`` data points, ``d`` input dimensions, ``M`` inducing points.

:class:`GPflowSVGP` is the same model as :class:`~pyro_whvi.experiments.baselines.svgp.GPyTorchSVGP` (whitened,
ARD squared-exponential kernel, Gaussian noise, same initialization) trained with the same schedule
and the same minibatch order, so the two libraries can check each other. TensorFlow and GPflow are
the optional ``[baselines]`` extra and are imported only when a :class:`GPflowSVGP` is built.

Two conventions follow the PyTorch loop (:func:`pyro_whvi.train.engine.optimize`): the loss is the
negative ELBO divided by ``N`` (Adam is not scale invariant through its epsilon), and during the fixed-noise
steps the noise gets neither updates nor Adam state: it has an Adam of its own that starts counting when the
noise starts learning, as PyTorch's per-parameter Adam state does.

References:
    J. Hensman, N. Fusi, N. D. Lawrence. *Gaussian Processes for Big Data*. UAI 2013.

    J. Hensman, A. G. de G. Matthews, Z. Ghahramani. *Scalable Variational Gaussian Process
    Classification*. AISTATS 2015.

    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ...gp import check_regression_data
from ...train.engine import Minibatches, Schedule
from ..gp_regressors import GP_SCHEDULE, FitResult, GPInitialization, GPRegressor
from .svgp import (
    NOISE_VARIANCE_LOWER_BOUND,
    Covariance,
    check_inducing_points,
    svgp_num_variational_parameters,
)

__all__ = ["GPflowSVGP"]

_MISSING_EXTRA = (
    "GPflowSVGP needs the optional [baselines] extra: pip install 'pyro_whvi[baselines]' (gpflow, tensorflow-cpu, "
    "tf-keras)"
)
# Adam's epsilon of torch.optim.Adam (Keras defaults to 1e-7).
_ADAM_EPSILON = 1e-8


def _import_gpflow() -> tuple[Any, Any]:
    """Import TensorFlow and GPflow (legacy Keras 2 optimizers, quiet C++ logging); return ``(tf, gpflow)``."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if importlib.util.find_spec("triton") is not None:
        # TensorFlow and Triton each bundle LLVM. Triton loaded after TensorFlow (as torch.optim's first step
        # loads it) aborts the process ("LLVM ERROR: inconsistency in registered CommandLine options");
        # loaded first, both work.
        import triton  # noqa: F401
    try:
        import gpflow
        import tensorflow as tf
    except ImportError as error:
        raise ImportError(_MISSING_EXTRA) from error
    return tf, gpflow


def _to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


class GPflowSVGP(GPRegressor):
    """Whitened SVGP regression (ARD squared-exponential kernel, Gaussian noise) with GPflow, in float64.

    :param inducing_points: ``(M, d)`` initial inducing inputs, a torch tensor or a NumPy array.
    :param covariance: ``"full"`` (Cholesky factor) or ``"diagonal"`` (mean field) covariance of ``q(v)``.
    :param init: initial lengthscale, outputscale and noise standard deviation.
    :param learn_inducing_locations: optimize the inducing inputs with the other parameters.
    :raises ImportError: without the ``[baselines]`` extra (GPflow, TensorFlow, tf-keras).
    """

    name = "svgp-gpflow"

    def __init__(
        self,
        inducing_points: Tensor | np.ndarray,
        covariance: Covariance = "full",
        init: GPInitialization = GPInitialization(),
        learn_inducing_locations: bool = True,
    ) -> None:
        inducing = torch.as_tensor(_to_numpy(inducing_points))
        check_inducing_points(inducing, covariance)
        self._tf, gpflow = _import_gpflow()
        self.covariance = covariance
        self.num_inducing, self.input_dim = inducing.shape
        with gpflow.config.as_context(dataclasses.replace(gpflow.config.config(), float=np.float64)):
            kernel = gpflow.kernels.SquaredExponential(
                variance=init.outputscale, lengthscales=[init.lengthscale_for(self.input_dim)] * self.input_dim
            )
            likelihood = gpflow.likelihoods.Gaussian(
                variance=init.noise_std**2, variance_lower_bound=NOISE_VARIANCE_LOWER_BOUND
            )
            self.model = gpflow.models.SVGP(
                kernel=kernel,
                likelihood=likelihood,
                inducing_variable=inducing.numpy().copy(),
                num_data=None,
                whiten=True,
                q_diag=covariance == "diagonal",
            )
            if covariance == "diagonal":
                # GPflow keeps diagonal standard deviations positive through a softplus; GPyTorch's mean field
                # optimizes them unconstrained (only their squares enter). The same parametrization makes Adam
                # follow the same path in both libraries.
                self.model.q_sqrt = gpflow.Parameter(np.ones((self.num_inducing, 1)), transform=None)
        gpflow.set_trainable(self.model.inducing_variable.Z, learn_inducing_locations)

    @property
    def num_variational_parameters(self) -> int:
        return svgp_num_variational_parameters(self.num_inducing, self.input_dim, self.covariance)

    @property
    def noise_variance(self) -> float:
        """The current Gaussian noise variance."""
        return float(self.model.likelihood.variance.numpy())

    def _step_function(self, num_data: int) -> Callable[[Any, Any, bool, Any, Any], Any]:
        from gpflow.keras import tf_keras

        tf = self._tf
        model = self.model
        noise = model.likelihood.variance.unconstrained_variable
        others = [v for v in model.trainable_variables if v is not noise]
        if len(others) == len(model.trainable_variables):
            raise RuntimeError("GPflowSVGP: the likelihood noise variance must be trainable.")
        optimizers = [tf_keras.optimizers.Adam(learning_rate=1.0, epsilon=_ADAM_EPSILON) for _ in range(2)]
        optimizers[0].build(others)  # Adam's slots exist before the traced step (tf.function makes none)
        optimizers[1].build([noise])

        @tf.function
        def step(x: Any, y: Any, update_noise: bool, lr: Any, noise_lr: Any) -> Any:  # lr: tensors, no retracing
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(model.trainable_variables)
                loss = -model.elbo((x, y)) / num_data
            *gradients, noise_gradient = tape.gradient(loss, [*others, noise])
            optimizers[0].learning_rate.assign(lr)
            optimizers[0].apply_gradients(zip(gradients, others))
            if update_noise:
                optimizers[1].learning_rate.assign(noise_lr)
                optimizers[1].apply_gradients([(noise_gradient, noise)])
            return loss

        return step

    def fit(
        self, x: Tensor, y: Tensor, schedule: Schedule = GP_SCHEDULE, *, seed: int = 0, progress: bool = False
    ) -> FitResult:
        """Maximize the ELBO on ``(x, y)`` (``(N, d)`` and ``(N,)``) with Adam and ``schedule``.

        The minibatches are those of :meth:`TorchGPRegressor.fit` with the same seed.
        """
        check_regression_data(x, y, self.input_dim)
        tf = self._tf
        x_all, y_all = _to_numpy(x), _to_numpy(y)[:, None]
        num_data = x_all.shape[0]
        self.model.num_data = num_data
        step = self._step_function(num_data)
        batches = Minibatches(num_data, schedule.batch_size, seed, replacement=False)
        full = (tf.constant(x_all), tf.constant(y_all))
        fixed = schedule.fixed_noise_steps
        losses = []
        start = time.perf_counter()
        for index in tqdm(range(schedule.steps), desc=f"fit {self.name}", disable=not progress, leave=False):
            batch = next(batches)
            if batch is None:
                batch_x, batch_y = full
            else:
                rows = batch.numpy()
                batch_x, batch_y = tf.constant(x_all[rows]), tf.constant(y_all[rows])
            lr, noise_lr = (
                tf.constant(schedule.lr * schedule.lr_factor(index, delay), tf.float32) for delay in (0, fixed)
            )
            loss = step(batch_x, batch_y, index >= fixed, lr, noise_lr)
            losses.append(float(loss.numpy()))
        return FitResult(losses, time.perf_counter() - start)

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean and variance of ``y`` (noise included) at ``(N, d)`` inputs ``x``, float64 ``(N,)``."""
        check_regression_data(x, input_dim=self.input_dim)
        mean, variance = self.model.predict_y(_to_numpy(x))
        return torch.from_numpy(mean.numpy()[:, 0]), torch.from_numpy(variance.numpy()[:, 0])

    def elbo(self, x: Tensor, y: Tensor) -> float:
        """The ELBO on all of ``(x, y)`` divided by ``N``."""
        check_regression_data(x, y, self.input_dim)
        num_data = x.shape[0]
        previous, self.model.num_data = self.model.num_data, num_data
        try:
            value = self.model.elbo((_to_numpy(x), _to_numpy(y)[:, None]))
        finally:
            self.model.num_data = previous
        return float(value.numpy()) / num_data
