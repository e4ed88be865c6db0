r"""I-BLM: initialize a variational guide layer by layer with Bayesian linear regressions (I-BLM paper §4).

For each layer in forward order, each output unit ``j`` gets its own minibatch (Algorithm 1): the
minibatch is propagated through the already-initialized layers with latents drawn from ``q``, the
layer's inputs (unfolded patches for a convolution, §4.4, with a column of ones for a latent bias)
are regressed on a target column of the labels, and ``q`` is set to the best approximation of the
regression's posterior (§4.2, App. D; see :mod:`pyro_whvi.init.assign` for each guide).

* **Output layer** (unit ``j`` regresses on target column ``j``). Regression: a homoscedastic BLM
  (App. B), its noise variance chosen by the marginal likelihood (App. C) unless given.
  Classification: the labels go through the Dirichlet transform (§4.3) and a heteroscedastic BLM
  (App. C) with the per-point variances the transform gives. Prior: the model's own (a Normal), by
  default with its variance scaled by the factor in :data:`PRIOR_FACTORS` the marginal likelihood prefers
  (for hidden layers too); ``q``'s variances use the unscaled prior (see ``_fit_layer``).
* **Hidden layers** (unit ``j`` regresses on a random target column). Where the paper's recipe is
  silent or breaks, these are our choices (``diversify=True``; ``False`` reproduces Algorithm 1):

  - *Centred, standardized, random sign.* On the raw targets every hidden unit of a regression network
    fits the same function (they differ by minibatch noise only) and a ReLU keeps only where it is
    positive, so each layer throws half of it away; the Dirichlet-transformed labels are all negative,
    so every ReLU unit starts dead. With the target column standardized on the unit's minibatch and
    multiplied by a random sign, half the units carry ``relu(f)`` and half ``relu(-f)``, and the next
    layer can rebuild ``f``.
  - *Homoscedastic, fixed noise.* The target is a proxy (what the unit should
    compute is not known), so how well a unit can predict it says little about how sure the network
    can be of that unit: the marginal likelihood would call a weak proxy fit "mostly noise" and leave
    ``q`` as wide as the prior, and a network sampled from such ``q`` forgets what the next layers were
    fitted to. ``hidden_noise_variance`` (0.01 of the standardized target) fixes that trust instead.
  - *Scale.* A hidden unit's scale is arbitrary (the next layer absorbs it), so its whole Gaussian is
    rescaled by the geometric mean of two natural gains: the one giving its pre-activations unit
    variance on its minibatch (signal propagation) and the one giving its mean the norm of a prior draw
    (a KL to the prior like that of a prior-draw init). Each alone trades one for the other, measured
    with ``benchmarks/iblm_init.py`` on the digits CNN with ``AutoWHVIGuide``: unit variance alone left
    weights up to 8 prior standard deviations large, a KL some 300 times the likelihood term that SVI
    then spent its steps undoing (test NLL 0.41 after 1,000 steps, 3 seeds, against 0.32 from the
    guide's default init); the prior norm alone shrinks the activations layer after layer until the
    output layer cannot fit (test NLL 2.26 at step 0, 2 seeds, chance being 2.30); the geometric mean
    gives 1.86 at step 0 and 0.21 after 1,000 steps (3 seeds).

  On the regression problem of ``tests/init/test_iblm.py`` and the digits networks this is the difference
  between an init worse than predicting the mean (Algorithm 1's targets) and one close to a trained fit.

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
from pyro import poutine
from torch import Tensor
from tqdm.auto import tqdm

from ..distributions.whvi_matrix import base_distribution
from ..ops._checks import check_finite
from .assign import LayerGaussian, assign_layer
from .batches import BatchStream
from .blm import blm_posterior, dirichlet_label_transform, evidence_hyperparameters
from .guide_protocol import site_initializer
from .layers import (
    BayesianLayer,
    Likelihood,
    capture_layer_inputs,
    find_layers,
    find_likelihood,
    patches,
    untransformed_model,
)

__all__ = ["iblm_"]

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


def _targets(likelihood: Likelihood, y: Tensor, alpha: float, like: Tensor) -> tuple[Tensor, Tensor | None]:
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


def _snapshot(guide) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, tensor, copy)`` of every tensor ``iblm_`` may write: the guide's parameters and their
    param-store entries (the guides write both when they are distinct tensors)."""
    tensors = dict(guide.named_parameters())
    prefix = guide._pyro_name + "."
    tensors.update((name, t) for name, t in pyro.get_param_store().named_parameters() if name.startswith(prefix))
    return [(name, t, t.detach().clone()) for name, t in tensors.items()]


@torch.no_grad()
def _restore(snapshot: list[tuple[str, Tensor, Tensor]]) -> None:
    for _, tensor, saved in snapshot:
        tensor.copy_(saved)


def _check_written(snapshot: list[tuple[str, Tensor, Tensor]], layer: BayesianLayer) -> None:
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
def _fit_layer(guide, layer, likelihood, stream, is_output, settings, bar) -> LayerGaussian:
    """The BLM posteriors of every output unit of ``layer`` (its inputs drawn with the current ``q``)."""
    batch = stream.batch_size
    x_probe, y_probe = stream.take(1)
    probe = patches(layer, capture_layer_inputs(guide, layer, x_probe, y_probe))
    like = probe
    rows, fan_in = batch * probe.shape[1], layer.fan_in
    if probe.shape[-1] != fan_in:
        raise RuntimeError(f"iblm_: layer {layer.weight_site!r} received {probe.shape[-1]} inputs, expected {fan_in}.")
    dim = fan_in + (layer.bias_site is not None)
    if rows < dim:
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
    hidden = settings["diversify"] and not is_output
    hyper: tuple[Tensor | float, Tensor | float] | None = None  # (homoscedastic noise variance, prior factor)
    means, precisions, data_precisions, data_rhs = [], [], [], []
    for units in _units(layer, chunk):
        count = units.stop - units.start
        x, y = stream.take(count)
        inputs = patches(layer, capture_layer_inputs(guide, layer, x, y, settings["samples"])).reshape(
            count, rows, fan_in
        )
        if layer.bias_site is not None:
            inputs = torch.cat([inputs, inputs.new_ones(count, rows, 1)], -1)
        targets, hetero = _targets(likelihood, y, settings["alpha"], like)
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
        means.append(mean)
        data_precisions.append(likelihood_precision)
        # q's variances use the model's own prior: a wider evidence prior helps the fit of the mean,
        # but would leave the directions the data do not pin down wider than the prior itself.
        precisions.append(likelihood_precision.diagonal(dim1=-2, dim2=-1) + 1.0 / w_var[units])
        if layer.bias_site is not None:  # the weights' term given the bias at its posterior mean
            rhs = rhs[:, :fan_in] - likelihood_precision[:, :fan_in, fan_in] * mean[:, fan_in : fan_in + 1]
        data_rhs.append(rhs)
        bar.update(count)
    mean, diag, data_precision = torch.cat(means), torch.cat(precisions), torch.cat(data_precisions)
    gaussian = LayerGaussian(
        weight_mean=mean[:, :fan_in].reshape(layer.weight_shape),
        weight_precision=diag[:, :fan_in].reshape(layer.weight_shape),
        row_data_precision=data_precision[:, :fan_in, :fan_in],
        row_data_rhs=torch.cat(data_rhs).reshape(layer.weight_shape),
    )
    if layer.bias_site is not None:
        gaussian.bias_mean, gaussian.bias_precision = mean[:, -1], diag[:, -1]
        gaussian.bias_data_precision = data_precision[:, -1, -1]
    return gaussian


def iblm_(
    guide,
    data,
    *,
    batch_size: int = 128,
    noise_variance: float | str = "evidence",
    prior_variance: float | str = "evidence",
    label_alpha: float = 0.01,
    diversify: bool = True,
    samples: int = 1,
    hidden_noise_variance: float | str = 0.01,
    progress: bool | None = None,
):
    r"""Initialize ``guide`` in place with I-BLM, layer by layer; returns the guide.

    The model is called as ``model(x, y)`` on minibatches. Use :func:`pyro.set_rng_seed` for
    reproducible minibatches and draws. On any error (bad data, a non-finite fit) the guide is left
    as it was.

    :param guide: an :class:`~pyro_whvi.AutoWHVIGuide`, :class:`~pyro_whvi.AutoVSDGuide`, Pyro's ``AutoNormal``
        or a :class:`~pyro_whvi.init.guide_protocol.SiteInitializer`, over a ``PyroModule`` model with ``nn.Linear``/
        ``nn.Conv1d``/``nn.Conv2d`` layers whose weights are latent ``PyroSample`` sites and one observed Normal or
        Categorical site.
    :param data: ``(x, y)`` tensors, or an iterable of ``(x, y)`` batches such as a ``DataLoader``
        (its batch size is then used; a shorter last batch is skipped); at least 2 examples per batch.
        Class labels are ``(N,)`` or ``(N, 1)`` indices, or ``(N, k)`` one-hot rows.
    :param batch_size: examples per regression, for tensor data (64–128 suffice, §4.5).
    :param noise_variance: the regression noise variance for Gaussian likelihoods: a float, or
        ``"evidence"`` to maximize the marginal likelihood per layer (App. C).
    :param prior_variance: the regressions' prior: ``"model"``, each weight's and bias's own prior (a
        Normal); ``"evidence"``, the model's prior with its variance scaled by a factor in
        :data:`PRIOR_FACTORS` chosen per layer by the marginal likelihood; or a float for
        :math:`\mathcal{N}(0, \text{prior\_variance})` (the paper's choice is 1).
    :param label_alpha: :math:`\alpha` of the Dirichlet transform of the labels (§4.3).
    :param diversify: the hidden-layer choices of the module docstring (standardized, randomly signed
        targets, fixed noise, unit-variance outputs); ``False`` treats hidden layers
        as the output layer, with the targets as they are, as Algorithm 1 does.
    :param samples: draws from ``q`` per propagation; the layer's inputs are averaged over them (the
        reference implementation averages Monte-Carlo draws), ``0`` propagates through ``q``'s medians.
    :param hidden_noise_variance: the noise variance of the hidden units' regressions, relative to their
        standardized targets (a float, or ``"evidence"``).
    :param progress: show a progress bar (``None``: only on a terminal).

    References:
        I-BLM paper (Rossi et al., ICML 2019): §4.1–4.5, Algorithm 1, App. B–D.
    """
    initializer = site_initializer(guide, "iblm_")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"iblm_: batch_size must be a positive int, got {batch_size!r}.")
    if not (noise_variance == "evidence" or (isinstance(noise_variance, (int, float)) and noise_variance > 0)):
        raise ValueError(f"iblm_: noise_variance must be 'evidence' or a float > 0, got {noise_variance!r}.")
    if not (
        prior_variance in ("evidence", "model") or (isinstance(prior_variance, (int, float)) and prior_variance > 0)
    ):
        raise ValueError(f"iblm_: prior_variance must be 'evidence', 'model' or a float > 0, got {prior_variance!r}.")
    if not label_alpha > 0:
        raise ValueError(f"iblm_: label_alpha must be > 0, got {label_alpha!r}.")
    if isinstance(data, (tuple, list)) and len(data) == 2:
        for name, value in zip(("x", "y"), data):
            if isinstance(value, Tensor):
                check_finite("iblm_", f"the data's {name}", value)
    stream = BatchStream(data, batch_size)
    if stream.batch_size < 2:
        raise ValueError(
            f"iblm_: each regression needs a minibatch of at least 2 examples, got {stream.batch_size} (the rows "
            "of (x, y), batch_size, or the DataLoader's batch size); with one example the hidden units' "
            "standardized targets are undefined."
        )
    x, y = stream.take(1)
    with torch.no_grad():
        if guide.prototype_trace is None:
            guide(x, y)
        with untransformed_model(guide) as model:
            trace = poutine.trace(model).get_trace(x, y)
    likelihood = find_likelihood(trace)
    layers = find_layers(model, trace)
    if layers[-1].out_features != likelihood.outputs:
        raise ValueError(
            f"iblm_: the last layer {layers[-1].weight_site!r} has {layers[-1].out_features} outputs but the "
            f"likelihood {likelihood.site!r} has {likelihood.outputs}; I-BLM needs the last layer to produce them."
        )
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"iblm_: samples must be an int >= 0 (0: propagate through q's medians), got {samples!r}.")
    if not (
        hidden_noise_variance == "evidence" or (isinstance(hidden_noise_variance, float) and hidden_noise_variance > 0)
    ):
        raise ValueError(
            f"iblm_: hidden_noise_variance must be a float > 0 or 'evidence', got {hidden_noise_variance!r}."
        )
    # Every layer's targets, checked before anything is written (a DataLoader's later batches at their turn).
    labels = y if stream.tensors is None else stream.tensors[1]
    as_double = torch.empty((), dtype=torch.float64, device=labels.device)
    check_finite("iblm_", "the regression targets from y", _targets(likelihood, labels, label_alpha, as_double)[0])
    settings = {
        "noise": noise_variance,
        "prior": prior_variance,
        "alpha": float(label_alpha),
        "diversify": diversify,
        "samples": samples,
        "hidden_noise": hidden_noise_variance,
    }
    total = sum(layer.out_features for layer in layers)
    # Each layer's inputs are drawn from q with the earlier layers already set, so the layers are written
    # one by one; any failure (a later DataLoader batch, a non-finite fit, an interrupt) restores them all.
    snapshot = _snapshot(guide)
    try:
        with tqdm(total=total, desc="I-BLM", unit="unit", disable=None if progress is None else not progress) as bar:
            for index, layer in enumerate(layers):
                bar.set_postfix_str(layer.weight_site)
                gaussian = _fit_layer(guide, layer, likelihood, stream, index == len(layers) - 1, settings, bar)
                assign_layer(initializer, layer.weight_site, layer.bias_site, gaussian)
                _check_written(snapshot, layer)
    except BaseException:
        _restore(snapshot)
        raise
    return guide
