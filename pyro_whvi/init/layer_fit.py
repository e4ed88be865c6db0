"""One layer of I-BLM (:func:`~pyro_whvi.init.iblm_`): its Bayesian linear regression on the layer's inputs, in
chunks of units within :data:`MEMORY_BUDGET`, its hyperparameters (the prior chosen among
:data:`PRIOR_FACTORS` by the marginal likelihood), and the guide's state saved and restored around the fit.

References:
    S. Rossi, P. Michiardi, M. Filippone. *Good Initializations of Variational Bayes for Deep Models*.
    ICML 2019: §4 (Algorithm 1), App. B–D.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

from ..distributions.whvi_matrix import base_distribution
from ..distributions.whvi_projection import FULL_ROW_PRECISION_MAX_BLOCK
from .assign import LayerGaussian
from .blm import blm_posterior, dirichlet_label_transform, evidence_hyperparameters
from .layers import BayesianLayer, Likelihood, capture_layer_inputs, patches

__all__ = [
    "EVIDENCE_UNITS",
    "MEMORY_BUDGET",
    "PRIOR_FACTORS",
    "check_written",
    "fit_layer",
    "regression_targets",
    "restore",
    "snapshot",
]

#: Entries (rows x inputs) of the regression inputs held in memory at once; more units are done in chunks.
MEMORY_BUDGET = 1 << 24


def _normal_prior(fn, shape: torch.Size, site: str, prior_variance: float | str, like: Tensor):
    """``(loc, variance)`` of the prior over a site's entries, both of ``shape``."""
    if not isinstance(prior_variance, str):
        return like.new_zeros(shape), like.new_full(shape, float(prior_variance))
    base = base_distribution(fn)
    if not isinstance(base, dist.Normal):
        raise ValueError(
            f"iblm_: the prior of site {site!r} is {type(base).__name__}, not a Normal; pass prior_variance=<float> "
            "to regress with N(0, prior_variance) instead of the model's prior."
        )
    loc, scale = torch.broadcast_tensors(fn.mean, fn.stddev)
    return loc.detach().to(like).reshape(shape), scale.detach().to(like).pow(2).reshape(shape)


def regression_targets(likelihood: Likelihood, y: Tensor, alpha: float, like: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(N, k)`` regression targets, and ``(N, k)`` noise variances for classification (else ``None``)."""
    if likelihood.kind == "categorical":
        classes = likelihood.outputs
        if y.dim() == 2 and y.shape[-1] == 1:  # (N, 1) class indices
            y = y.squeeze(-1)
        if y.dim() != 1 and tuple(y.shape[1:]) != (classes,):
            raise ValueError(
                f"iblm_: the labels y of site {likelihood.site!r} must be (N,) or (N, 1) class indices or "
                f"(N, {classes}) one-hot rows, got shape {tuple(y.shape)}."
            )
        targets, noise = dirichlet_label_transform(y, classes, alpha)
        return targets.to(like), noise.to(like)
    return y.reshape(y.shape[0], -1).to(like), None


#: Factors of the model's prior variance searched by ``prior_variance="evidence"``.
PRIOR_FACTORS = (0.25, 1.0, 4.0, 16.0, 64.0, 256.0)
#: Units of a layer whose marginal likelihood picks the layer's hyperparameters.
EVIDENCE_UNITS = 16


def _hyperparameters(inputs, targets, noise, prior_loc, prior_var, settings, hidden):
    """``(noise variance, prior factor)`` for a layer: given, or by type-II maximum likelihood on a few units."""
    given_noise = settings["hidden_noise"] if hidden else settings["noise"]
    search_noise = noise is None and given_noise == "evidence"
    search_prior = settings["prior"] == "evidence"
    noise_variance = given_noise if noise is None and not search_noise else None
    if not (search_noise or search_prior):
        return noise_variance, 1.0
    units = slice(0, EVIDENCE_UNITS)
    offset = (inputs[units] @ prior_loc[units].unsqueeze(-1)).squeeze(-1)  # the prior mean's prediction
    factors = torch.tensor(PRIOR_FACTORS, dtype=inputs.dtype, device=inputs.device) if search_prior else None
    fixed = noise[units] if noise is not None else noise_variance
    best_noise, factor = evidence_hyperparameters(
        inputs[units], targets[units] - offset, prior_var[units], fixed, factors
    )
    return (float(best_noise) if noise is None else None), float(factor)


def snapshot(guide) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, tensor, copy)`` of every tensor ``iblm_`` may write: the guide's parameters and their
    param-store entries (the guides write both when they are distinct tensors)."""
    tensors = dict(guide.named_parameters())
    prefix = guide._pyro_name + "."
    tensors.update((name, t) for name, t in pyro.get_param_store().named_parameters() if name.startswith(prefix))
    return [(name, t, t.detach().clone()) for name, t in tensors.items()]


@torch.no_grad()
def restore(snapshot: list[tuple[str, Tensor, Tensor]]) -> None:
    for _, tensor, saved in snapshot:
        tensor.copy_(saved)


def check_written(snapshot: list[tuple[str, Tensor, Tensor]], layer: BayesianLayer) -> None:
    """Refuse NaN or Inf that fitting ``layer`` wrote into a parameter that was finite."""
    for name, tensor, saved in snapshot:
        if not torch.isfinite(tensor).all() and torch.isfinite(saved).all():
            raise ValueError(
                f"iblm_: the regressions of layer {layer.weight_site!r} gave NaN or Inf for the guide's {name!r}; "
                "the guide is left as it was. Check the data's scale, or pass noise_variance/prior_variance floats."
            )


def _units(layer: BayesianLayer, chunk: int) -> Iterator[slice]:
    for start in range(0, layer.out_features, chunk):
        yield slice(start, min(start + chunk, layer.out_features))


@torch.no_grad()
def fit_layer(guide, layer, likelihood, stream, is_output, settings, bar) -> LayerGaussian:
    """The BLM posteriors of every output unit of ``layer`` (its inputs drawn with the current ``q``)."""
    batch = stream.batch_size
    x_probe, y_probe = stream.take(1)
    probe = patches(layer, capture_layer_inputs(guide, layer, x_probe, y_probe))
    like = probe
    rows, fan_in = batch * probe.shape[1], layer.fan_in
    if probe.shape[-1] != fan_in:
        raise RuntimeError(f"iblm_: layer {layer.weight_site!r} received {probe.shape[-1]} inputs, expected {fan_in}.")
    dim = fan_in + (layer.bias_site is not None)
    if rows < fan_in:
        warnings.warn(
            f"iblm_: layer {layer.weight_site!r} regresses {dim} coefficients on {rows} rows (batch {batch}); the "
            "BLM is then dominated by the prior. Use a batch_size of at least the layer's input width.",
            UserWarning,
            stacklevel=3,
        )
    w_loc, w_var = _normal_prior(layer.weight_prior, layer.weight_shape, layer.weight_site, settings["prior"], like)
    w_loc, w_var = w_loc.reshape(layer.out_features, -1), w_var.reshape(layer.out_features, -1)
    if layer.bias_site is not None:
        shape = torch.Size([layer.out_features])
        b_loc, b_var = _normal_prior(layer.bias_prior, shape, layer.bias_site, settings["prior"], like)
        w_loc, w_var = torch.cat([w_loc, b_loc[:, None]], -1), torch.cat([w_var, b_var[:, None]], -1)
    fixed_bias = layer.fixed_bias()
    chunk = max(1, MEMORY_BUDGET // (rows * dim + dim * dim))
    # Each row's full likelihood precision is kept only where a guide uses more than its diagonal: a WHVI site
    # of block size up to FULL_ROW_PRECISION_MAX_BLOCK (>= fan_in), or of one row (laid out as a vector, whose
    # mean is then projected). Kept whole, a 1024 x 1024 layer's would be out_features x dim^2: 4 GiB in float32.
    full_rows = fan_in <= FULL_ROW_PRECISION_MAX_BLOCK or layer.out_features == 1
    hidden = settings["diversify"] and not is_output
    hyper: tuple[Tensor | float, Tensor | float] | None = None  # (homoscedastic noise variance, prior factor)
    # The results go into tensors allocated once, before the chunks: small results kept between the chunks' large
    # temporaries would pin glibc's heap, which then grows instead of reusing them (4.4 GB above the start against
    # 0.64 GB on a 3 x 1024 network, benchmarks/results/iblm_memory/README.md).
    means, diagonals, data_rhs = (like.new_empty(layer.out_features, width) for width in (dim, dim, fan_in))
    data_precisions = like.new_empty((layer.out_features, dim, dim) if full_rows else (layer.out_features, dim))
    for units in _units(layer, chunk):
        count = units.stop - units.start
        x, y = stream.take(count)
        inputs = patches(layer, capture_layer_inputs(guide, layer, x, y, settings["samples"])).reshape(
            count, rows, fan_in
        )
        if layer.bias_site is not None:
            inputs = torch.cat([inputs, inputs.new_ones(count, rows, 1)], -1)
        targets, hetero = regression_targets(likelihood, y, settings["alpha"], like)
        device = targets.device
        if is_output:
            columns = torch.arange(units.start, units.stop, device=device)
        else:
            columns = torch.randint(0, targets.shape[-1], (count,), device=device)
        pick, repeat = torch.arange(count, device=device), probe.shape[1]
        t = targets.reshape(count, batch, -1)[pick, :, columns].repeat_interleave(repeat, -1)
        noise = None  # hidden units: a homoscedastic regression on the standardized label column
        if hidden:
            spread = t.std(-1, keepdim=True).clamp_min(1e-12)
            signs = (torch.randint(0, 2, (count, 1), device=t.device) * 2 - 1).to(t)
            t = (t - t.mean(-1, keepdim=True)) / spread * signs
        elif hetero is not None:
            noise = hetero.reshape(count, batch, -1)[pick, :, columns].repeat_interleave(repeat, -1)
        if fixed_bias is not None:
            t = t - fixed_bias[units].to(t).unsqueeze(-1)
        if hyper is None:
            hyper = _hyperparameters(inputs, t, noise, w_loc[units], w_var[units], settings, hidden)
        prior_var = hyper[1] * w_var[units]
        noise_variance = torch.as_tensor(hyper[0] if noise is None else noise, dtype=t.dtype, device=t.device)
        posterior = blm_posterior(inputs, t, noise_variance, prior_var, w_loc[units])
        likelihood_precision = posterior.precision - torch.diag_embed(1.0 / prior_var)
        rhs = (inputs.transpose(-1, -2) @ (t / noise_variance).unsqueeze(-1)).squeeze(-1)  # X^T L^-1 t
        mean = posterior.mean
        if hidden:
            # Rescale the unit's whole Gaussian (see "Scale" in the module docstring).
            norm = (mean.pow(2) / w_var[units]).mean(-1).sqrt()
            spread = (inputs @ mean.unsqueeze(-1)).squeeze(-1).std(-1)
            ok = (norm > 1e-8) & (spread > 1e-8)
            gain = torch.where(ok, (norm * spread).clamp_min(1e-30).rsqrt(), torch.ones_like(norm))
            mean, rhs = mean * gain[:, None], rhs / gain[:, None]
            likelihood_precision = likelihood_precision / gain[:, None, None].pow(2)
        means[units] = mean
        data_diagonal = likelihood_precision.diagonal(dim1=-2, dim2=-1)
        data_precisions[units] = likelihood_precision if full_rows else data_diagonal
        # q's variances use the model's own prior: a wider evidence prior helps the fit of the mean,
        # but would leave the directions the data do not pin down wider than the prior itself.
        diagonals[units] = data_diagonal + 1.0 / w_var[units]
        if layer.bias_site is not None:  # the weights' term given the bias at its posterior mean
            rhs = rhs[:, :fan_in] - likelihood_precision[:, :fan_in, fan_in] * mean[:, fan_in : fan_in + 1]
        data_rhs[units] = rhs
        bar.update(count)
    gaussian = LayerGaussian(
        weight_mean=means[:, :fan_in].reshape(layer.weight_shape),
        weight_precision=diagonals[:, :fan_in].reshape(layer.weight_shape),
        row_data_precision=(
            data_precisions[:, :fan_in, :fan_in]
            if full_rows
            else data_precisions[:, :fan_in].reshape(layer.weight_shape)
        ),
        row_data_rhs=data_rhs.reshape(layer.weight_shape),
    )
    if layer.bias_site is not None:
        gaussian.bias_mean, gaussian.bias_precision = means[:, -1], diagonals[:, -1]
        gaussian.bias_data_precision = data_precisions[:, -1, -1] if full_rows else data_precisions[:, -1]
    return gaussian
