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
  default with its variance scaled by the factor in :data:`~pyro_whvi.init.layer_fit.PRIOR_FACTORS` the
  marginal likelihood prefers (for hidden layers too); ``q``'s variances use the unscaled prior (see
  :func:`~pyro_whvi.init.layer_fit.fit_layer`).
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

import torch
from pyro import poutine
from torch import Tensor
from tqdm.auto import tqdm

from ..ops._checks import check_finite
from .assign import assign_layer
from .batches import BatchStream
from .guide_protocol import site_initializer
from .layer_fit import check_written, fit_layer, regression_targets, restore, snapshot
from .layers import (
    find_layers,
    find_likelihood,
    untransformed_model,
)

__all__ = ["DEFAULT_BATCH_SIZE", "iblm_"]

DEFAULT_BATCH_SIZE = 128  #: examples per regression where every layer has at most this many inputs (§4.5)


def iblm_(
    guide,
    data,
    *,
    batch_size: int | None = None,
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
    :param batch_size: examples per regression, for tensor data. ``None`` (the default): 128, which suffices for
        the paper's networks (§4.5), or the widest fully connected layer's input width where that is larger, so
        that no regression of a wide network has fewer rows than inputs and is left to the prior (a
        convolution's rows are its patches, several per example).
    :param noise_variance: the regression noise variance for Gaussian likelihoods: a float, or
        ``"evidence"`` to maximize the marginal likelihood per layer (App. C).
    :param prior_variance: the regressions' prior: ``"model"``, each weight's and bias's own prior (a
        Normal); ``"evidence"``, the model's prior with its variance scaled by a factor in
        :data:`~pyro_whvi.init.layer_fit.PRIOR_FACTORS` chosen per layer by the marginal likelihood; or a float for
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
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"iblm_: batch_size must be a positive int or None, got {batch_size!r}.")
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
    stream = BatchStream(data, DEFAULT_BATCH_SIZE if batch_size is None else batch_size)
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
    if batch_size is None and stream.tensors is not None:
        widest = max((layer.fan_in for layer in layers if not layer.is_conv), default=0)
        stream.batch_size = min(max(DEFAULT_BATCH_SIZE, widest), stream.tensors[0].shape[0])
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
    targets = regression_targets(likelihood, labels, label_alpha, as_double)[0]
    check_finite("iblm_", "the regression targets from y", targets)
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
    saved = snapshot(guide)
    try:
        with tqdm(total=total, desc="I-BLM", unit="unit", disable=None if progress is None else not progress) as bar:
            for index, layer in enumerate(layers):
                bar.set_postfix_str(layer.weight_site)
                gaussian = fit_layer(guide, layer, likelihood, stream, index == len(layers) - 1, settings, bar)
                assign_layer(initializer, layer.weight_site, layer.bias_site, gaussian)
                check_written(saved, layer)
    except BaseException:
        restore(saved)
        raise
    return guide
