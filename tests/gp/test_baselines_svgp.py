"""SVGP baselines: parameter counting, input checks, the fixed-noise phase, and GPyTorch against GPflow."""

from __future__ import annotations

import sys

import gpytorch
import pytest
import torch

from pyro_whvi.experiments.baselines import (
    GPflowSVGP,
    GPyTorchSVGP,
    inducing_points_for_parameters,
    initial_inducing_points,
    svgp_num_variational_parameters,
)
from pyro_whvi.experiments.gp_regressors import GPInitialization
from pyro_whvi.train.engine import Schedule

from ..helpers import run_python

NUM_INDUCING = 15
COVARIANCES = ("full", "diagonal")


def _function(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1])


def _data(num: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = 2 * torch.rand(num, 2, generator=generator, dtype=torch.float64) - 1
    return x, _function(x) + 0.1 * torch.randn(num, generator=generator, dtype=torch.float64)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny: one intra-op thread is faster, and robust to a busy machine (OpenMP barriers with a
    core taken by another process, or by TensorFlow's thread pool, slowed the GPyTorch runs ~10x)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    return (*_data(200, generator), *_data(300, generator))


@pytest.fixture(scope="module")
def inducing(data) -> torch.Tensor:
    return initial_inducing_points(data[0], NUM_INDUCING, seed=0)


@pytest.fixture
def gpflow_ready() -> None:
    from pyro_whvi.experiments.baselines.gpflow_svgp import _import_gpflow

    try:
        _import_gpflow()
    except ImportError:
        pytest.skip("needs the [baselines] extra (gpflow, tensorflow)")


def _rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    return float((mean - y).pow(2).mean().sqrt())


def _jitter_correction(model: GPyTorchSVGP) -> float:
    """GPyTorch adds its Cholesky jitter to the marginal variances of f (GPflow adds it to K_ZZ only), which
    lowers the expected log-likelihood of every point by jitter / (2 noise variance)."""
    jitter = gpytorch.settings.variational_cholesky_jitter.value(torch.float64)
    return 0.5 * jitter / float(model.likelihood.noise)


# ---------------------------------------------------------------- parameter counts


def test_parameter_count_and_round_up() -> None:
    assert svgp_num_variational_parameters(15, 2, "full") == 30 + 15 + 120
    assert svgp_num_variational_parameters(15, 2, "diagonal") == 30 + 15 + 15
    assert svgp_num_variational_parameters(1, 1, "full") == 3
    assert inducing_points_for_parameters(165, 2, "full") == 15
    assert inducing_points_for_parameters(164, 2, "full") == 15
    assert inducing_points_for_parameters(166, 2, "full") == 16
    assert inducing_points_for_parameters(60, 2, "diagonal") == 15
    assert inducing_points_for_parameters(61, 2, "diagonal") == 16
    assert inducing_points_for_parameters(1, 8, "full") == 1
    for covariance in COVARIANCES:
        previous = 1
        for budget in range(1, 3000, 7):
            num = inducing_points_for_parameters(budget, 5, covariance)
            assert num >= previous
            assert svgp_num_variational_parameters(num, 5, covariance) >= budget
            assert num == 1 or svgp_num_variational_parameters(num - 1, 5, covariance) < budget
            previous = num


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 2, "full"), "num_parameters must be a positive integer"),
        ((10, 0, "full"), "input_dim must be a positive integer"),
        ((10, 2, "low-rank"), "covariance must be 'full' or 'diagonal'"),
    ],
)
def test_inducing_points_for_parameters_rejects_bad_arguments(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        inducing_points_for_parameters(*args)
    with pytest.raises(ValueError, match="must be positive integers"):
        svgp_num_variational_parameters(0, 2)


def test_initial_inducing_points_are_distinct_seeded_rows(data) -> None:
    x = data[0]
    z = initial_inducing_points(x, 10, seed=3)
    assert z.shape == (10, 2)
    assert torch.equal(z, initial_inducing_points(x, 10, seed=3))
    assert not torch.equal(z, initial_inducing_points(x, 10, seed=4))
    rows = {tuple(row.tolist()) for row in z}
    assert len(rows) == 10 and rows <= {tuple(row.tolist()) for row in x}
    with pytest.raises(ValueError, match="num_inducing must be between 1 and the number of data points 200"):
        initial_inducing_points(x, 201)


# ---------------------------------------------------------------- GPyTorch model


@pytest.mark.parametrize("covariance", COVARIANCES)
def test_gpytorch_initial_state_and_predict(data, inducing, covariance) -> None:
    init = GPInitialization(lengthscale=0.7, outputscale=1.3, noise_std=0.05)
    model = GPyTorchSVGP(inducing, covariance, init)
    distribution = model.model.variational_strategy.variational_distribution
    assert torch.equal(distribution.mean, torch.zeros(NUM_INDUCING, dtype=torch.float64))
    assert torch.allclose(distribution.covariance_matrix, torch.eye(NUM_INDUCING, dtype=torch.float64))
    assert torch.allclose(model.model.covar_module.base_kernel.lengthscale, torch.full((1, 2), 0.7))
    assert float(model.model.covar_module.outputscale) == pytest.approx(1.3)
    assert float(model.likelihood.noise) == pytest.approx(0.05**2)
    assert model.num_variational_parameters == svgp_num_variational_parameters(NUM_INDUCING, 2, covariance)
    mean, variance = model.predict(data[2])
    assert mean.shape == variance.shape == (300,)
    assert mean.dtype == torch.float64 and bool((variance > 0).all())
    # Before training q(v) = N(0, I) is the prior: zero mean, variance outputscale + noise (+ jitter).
    assert torch.allclose(mean, torch.zeros(300), atol=1e-12)
    assert torch.allclose(variance, torch.full((300,), 1.3 + 0.05**2), rtol=1e-5)


def test_gpytorch_follows_inducing_dtype(inducing) -> None:
    model = GPyTorchSVGP(inducing.float())
    assert model.model.variational_strategy.inducing_points.dtype == torch.float32
    assert model.likelihood.noise.dtype == torch.float32


def _bad_input_cases(x: torch.Tensor, y: torch.Tensor):
    nan_x = x.clone()
    nan_x[3, 1] = float("nan")
    nan_y = y.clone()
    nan_y[0] = float("nan")
    return [
        ("predict", (torch.cat([x, x[:, :1]], dim=1),), "has 3 input dimensions but the model was built for 2"),
        ("predict", (x[:, 0],), r"x must be a \(N, d\) tensor of inputs"),
        ("predict", (nan_x,), "x contains NaN or infinite values"),
        ("elbo", (x, y[:-1]), r"y must be a \(200,\) tensor of targets"),
        ("elbo", (x, nan_y), "y contains NaN or infinite values"),
        ("fit", (x, y[:, None]), r"y must be a \(200,\) tensor of targets"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_gpytorch_rejects_bad_inputs(data, inducing, case) -> None:
    method, args, message = _bad_input_cases(data[0], data[1])[case]
    with pytest.raises(ValueError, match=message):
        getattr(GPyTorchSVGP(inducing), method)(*args)


def test_constructor_rejects_bad_arguments(inducing) -> None:
    with pytest.raises(ValueError, match="covariance must be 'full' or 'diagonal'"):
        GPyTorchSVGP(inducing, "low-rank")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"inducing_points must be a \(N, d\) tensor"):
        GPyTorchSVGP(inducing[:, 0])
    with pytest.raises(ValueError, match="inducing_points contains NaN"):
        GPyTorchSVGP(torch.full((3, 2), float("nan")))


def test_gpytorch_fixed_noise_phase(data, inducing) -> None:
    x, y = data[:2]
    model = GPyTorchSVGP(inducing)
    raw_noise = model.likelihood.noise_covar.raw_noise.detach().clone()
    result = model.fit(x, y, Schedule(steps=30, fixed_noise_steps=30, lr=0.01, batch_size=64, lr_power=0.0))
    assert len(result.losses) == 30 and result.losses[-1] < result.losses[0]
    assert torch.equal(model.likelihood.noise_covar.raw_noise, raw_noise)
    model.fit(x, y, Schedule(steps=5, fixed_noise_steps=2, lr=0.01, batch_size=64, lr_power=0.0))
    assert not torch.equal(model.likelihood.noise_covar.raw_noise, raw_noise)


# ---------------------------------------------------------------- GPflow model


def test_missing_extra_error_names_baselines(inducing, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gpflow", None)
    with pytest.raises(ImportError, match=r"pyro_whvi\[baselines\]") as error:
        GPflowSVGP(inducing)
    assert isinstance(error.value.__cause__, ImportError)


@pytest.mark.slow  # imports TensorFlow (GPflow)
@pytest.mark.usefixtures("gpflow_ready")
def test_gpflow_predict_inputs_and_fixed_noise(data, inducing) -> None:
    x, y, x_test, _ = data
    model = GPflowSVGP(inducing.numpy(), init=GPInitialization(noise_std=0.05))
    assert model.name == "svgp-gpflow"
    assert model.num_variational_parameters == 165
    for method, args, message in _bad_input_cases(x, y):
        with pytest.raises(ValueError, match=message):
            getattr(model, method)(*args)
    noise = model.model.likelihood.variance.unconstrained_variable.numpy().copy()
    result = model.fit(x, y, Schedule(steps=30, fixed_noise_steps=30, lr=0.01, batch_size=64, lr_power=0.0))
    assert len(result.losses) == 30 and result.losses[-1] < result.losses[0]
    assert model.model.likelihood.variance.unconstrained_variable.numpy() == noise
    assert model.noise_variance == pytest.approx(0.05**2, rel=1e-12)
    mean, variance = model.predict(x_test)
    assert mean.shape == variance.shape == (300,)
    assert mean.dtype == variance.dtype == torch.float64 and bool((variance > 0).all())
    model.fit(x, y, Schedule(steps=5, fixed_noise_steps=2, lr=0.01, batch_size=64, lr_power=0.0))
    assert model.model.likelihood.variance.unconstrained_variable.numpy() != noise


@pytest.mark.slow  # imports TensorFlow (GPflow)
@pytest.mark.usefixtures("gpflow_ready")
@pytest.mark.parametrize("covariance", COVARIANCES)
def test_gpytorch_and_gpflow_agree(data, inducing, covariance) -> None:
    import gpflow

    x, y, x_test, y_test = data
    # Both libraries add the same jitter to K_ZZ.
    assert gpflow.config.default_jitter() == gpytorch.settings.variational_cholesky_jitter.value(torch.float64)
    torch_model, tf_model = GPyTorchSVGP(inducing, covariance), GPflowSVGP(inducing, covariance)
    assert torch_model.num_variational_parameters == tf_model.num_variational_parameters

    # Same model, same starting point: the ELBOs (both per data point) agree to round-off once GPyTorch's jitter
    # on the marginal variances of f is accounted for (it alone is ~1e-6 relative here).
    before_torch, before_tf = torch_model.elbo(x, y), tf_model.elbo(x, y)
    assert before_torch + _jitter_correction(torch_model) == pytest.approx(before_tf, rel=1e-9)
    assert before_torch == pytest.approx(before_tf, rel=1e-6)

    # Minibatch losses agree step by step only if both libraries draw the same batches.
    short = Schedule(steps=4, fixed_noise_steps=2, lr=0.01, lr_power=0.0, batch_size=64)
    short_torch = GPyTorchSVGP(inducing, covariance).fit(x, y, short, seed=5).losses
    short_tf = GPflowSVGP(inducing, covariance).fit(x, y, short, seed=5).losses
    assert short_torch == pytest.approx(short_tf, rel=1e-5)

    schedule = Schedule(steps=300, fixed_noise_steps=100, lr=0.01, batch_size=None, lr_power=0.0)
    torch_model.fit(x, y, schedule)
    tf_model.fit(x, y, schedule)
    after_torch, after_tf = torch_model.elbo(x, y) + _jitter_correction(torch_model), tf_model.elbo(x, y)
    rmse_torch, rmse_tf = _rmse(torch_model.predict(x_test)[0], y_test), _rmse(tf_model.predict(x_test)[0], y_test)
    assert after_torch > before_torch + 1000 and rmse_torch < 0.2
    # The parametrizations match (softplus hyperparameters, unconstrained Cholesky factor / standard deviations),
    # so what remains is round-off and Adam's epsilon (Keras adds it before the bias correction, PyTorch after).
    # With a full covariance the runs stay within ~1e-5 of each other. The mean-field standard deviations are driven
    # towards zero, where log(s^2) in the KL amplifies small differences into oscillations of the loss (~2e-3 of the
    # ELBO after 300 steps, ~5e-4 of the RMSE), so that case gets a 5x margin on what was measured.
    elbo_tolerance, rmse_tolerance = (1e-4, 1e-4) if covariance == "full" else (1e-2, 3e-3)
    assert after_torch == pytest.approx(after_tf, rel=elbo_tolerance)
    assert rmse_torch == pytest.approx(rmse_tf, rel=rmse_tolerance)
    assert float(torch_model.likelihood.noise) == pytest.approx(tf_model.noise_variance, rel=10 * elbo_tolerance)


@pytest.mark.slow  # imports TensorFlow (GPflow)
def test_torch_adam_after_gpflow_import(gpflow_ready):
    """`whvi gp` imports GPflow first (to fail early without the extra), then trains PyTorch models. Torch's Adam
    loads Triton on its first step, and Triton loaded after TensorFlow (both bundle LLVM) aborted the process."""
    result = run_python(
        """
        from pyro_whvi.experiments.baselines.gpflow_svgp import _import_gpflow
        _import_gpflow()
        import torch
        parameter = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.Adam([parameter])
        parameter.sum().backward()
        optimizer.step()
        print("stepped", float(parameter[0]))
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "stepped 0.999" in result.stdout
