r"""Inference methods by name, and the WHVI paper's training schedule, on Pyro's own ``Trace_ELBO``.

One name per method, the same Pyro model for all of them (a :class:`~pyro_whvi.nn.networks.BayesianMLP`):

==================  ==========================================================================
``mfg``             Pyro's ``AutoNormal`` (mean-field Gaussian VI)
``mcd``             MC dropout: the network with dropout, a point estimate under the prior (``AutoDelta``)
``whvi``            :class:`~pyro_whvi.AutoWHVIGuide` (G-WHVI, local reparameterization): weights and
                    biases under WHVI (vectors on square blocks, §2.5), the last layer mean-field (§3.2)
``nf-whvi``         :class:`~pyro_whvi.AutoWHVIGuide` with planar flows over ``g``
``whvi-lowrank``    ``whvi`` with a low-rank-plus-diagonal ``q(g)`` per block (rank ``ceil(sqrt(D))``)
``whvi-full``       ``whvi`` with a full-covariance ``q(g)`` per block (:math:`O(D^2)` parameters)
``vsd``             :class:`~pyro_whvi.AutoVSDGuide` (Householder-structured dropout noise)
``ensemble``        deep ensembles: 5 networks with mean-variance heads, each a point estimate (``AutoDelta``)
                    trained on its own, predicting as their uniform mixture (:mod:`~pyro_whvi.experiments.ensemble`)
==================  ==========================================================================

Append ``+iblm`` (``whvi+iblm``, ``mfg+iblm``, ...) to start the guide from I-BLM
(:func:`~pyro_whvi.iblm_`) instead of its default initialization (the variational methods: not ``mcd`` or
``ensemble``).

:func:`fit` runs the WHVI paper's schedule (App. D.1) through :func:`pyro_whvi.train.engine.train`: Adam
with the learning rate :math:`\lambda_t = \lambda_0 (1 + \gamma t)^{-p}`, minibatches, and for
regression the noise scale held fixed for the first ``fixed_noise_steps``, in one process or
data-parallel; :func:`predictive_samples` (:func:`predictive_sites`) draws the Monte-Carlo predictive with
``Predictive``.

Shape letters: ``S`` posterior samples, ``N`` examples, ``D`` inputs, ``C`` classes.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, §3.2 and App. D.1.
    Y. Gal, Z. Ghahramani. *Dropout as a Bayesian Approximation*. ICML 2016.
    S. Nguyen et al. *Structured Dropout Variational Inference for Bayesian Neural Networks*. NeurIPS 2021.
    S. Rossi, P. Michiardi, M. Filippone. *Good Initializations of Variational Bayes for Deep Models*. ICML 2019.
    B. Lakshminarayanan, A. Pritzel, C. Blundell. *Simple and Scalable Predictive Uncertainty Estimation using
    Deep Ensembles*. NeurIPS 2017.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro.infer import Predictive
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_sample
from torch import Tensor
from tqdm.auto import tqdm

from ..infer import AutoVSDGuide, AutoWHVIGuide
from ..init import iblm_
from ..nn import BayesianMLP
from ..train.engine import Checkpoint, Schedule, train
from .ensemble import EnsembleGuide, build_ensemble, fit_members, member_predictions
from .memory_budget import dense_weights, prediction_chunk

__all__ = [
    "BASE_METHODS",
    "ENSEMBLE",
    "METHODS",
    "WHVI_COVARIANCES",
    "Checkpoint",
    "MethodSpec",
    "Schedule",
    "build_method",
    "fit",
    "make_guide",
    "parse_method",
    "predictive_samples",
    "predictive_sites",
]

#: The WHVI methods and the ``covariance`` of their ``q(g)`` (:class:`~pyro_whvi.AutoWHVIGuide`).
WHVI_COVARIANCES = {"whvi": "diagonal", "nf-whvi": "diagonal", "whvi-lowrank": "lowrank", "whvi-full": "full"}
BASE_METHODS = ("mfg", "mcd", *WHVI_COVARIANCES, "vsd")  # each a guide (make_guide) of one network
ENSEMBLE = "ensemble"  # deep ensembles: several networks, each with an AutoDelta guide (pyro_whvi.experiments.ensemble)
METHODS = (*BASE_METHODS, ENSEMBLE)
IBLM_SUFFIX = "+iblm"


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method name: the base method and whether I-BLM initializes it."""

    base: str
    iblm: bool = False

    @property
    def name(self) -> str:
        return self.base + (IBLM_SUFFIX if self.iblm else "")


def parse_method(name: str) -> MethodSpec:
    """``"whvi+iblm"`` -> ``MethodSpec("whvi", iblm=True)``; a ``ValueError`` naming the choices otherwise."""
    base, iblm = (name[: -len(IBLM_SUFFIX)], True) if name.endswith(IBLM_SUFFIX) else (name, False)
    if base not in METHODS:
        raise ValueError(
            f"unknown method {name!r}; choose from {', '.join(METHODS)}, each but mcd and {ENSEMBLE} optionally with "
            f"'{IBLM_SUFFIX}'"
        )
    if iblm and base == "mcd":
        raise ValueError("method 'mcd+iblm': I-BLM initializes variational guides; MC dropout has none")
    if iblm and base == ENSEMBLE:
        raise ValueError(
            f"method '{name}': I-BLM initializes variational guides; a deep ensemble's networks are point estimates "
            f"started from different random initializations; use '{ENSEMBLE}'"
        )
    return MethodSpec(base, iblm)


def make_guide(base: str, model, *, flows: int = 3, reflections: int = 1, **whvi_options) -> Any:
    """The guide of base method ``base`` (a name in :data:`BASE_METHODS`) for ``model``.

    ``model`` itself then goes to ``SVI`` and ``Predictive`` for every method (the structured guides
    transform it in place). For ``mcd`` the model must have dropout: the guide is a point estimate.

    :param flows: planar flows over each site's ``g`` (``nf-whvi``).
    :param reflections: Householder reflections ``T`` of VSD's noise (``vsd``).
    :param whvi_options: passed to :class:`~pyro_whvi.AutoWHVIGuide` (the :data:`WHVI_COVARIANCES` methods).
    """
    guide: Any
    if base == "mfg":
        guide = AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.01)
    elif base == "mcd":
        guide = AutoDelta(model, init_loc_fn=init_to_sample)
    elif base == "vsd":
        guide = AutoVSDGuide(model, reflections=reflections)
    elif base in WHVI_COVARIANCES:
        guide = AutoWHVIGuide(
            model, covariance=WHVI_COVARIANCES[base], flows=flows if base == "nf-whvi" else 0, **whvi_options
        )
    else:
        raise ValueError(f"unknown method {base!r}; choose from {', '.join(BASE_METHODS)}")
    return guide


def build_method(
    spec: MethodSpec | str,
    widths: list[int],
    *,
    likelihood: str = "gaussian",
    activation=torch.relu,
    noise_scale: float = 0.1,
    dropout: float = 0.005,
    flows: int = 3,
    reflections: int = 1,
) -> tuple[Any, Any]:
    """A fresh ``BayesianMLP`` with ``widths`` and its guide for the method; for ``ensemble`` its networks (in
    a ``PyroModule`` list, with mean-variance heads for regression) and their guides, an
    :class:`~pyro_whvi.experiments.ensemble.EnsembleGuide` (:func:`~pyro_whvi.experiments.ensemble.build_ensemble`).

    :param noise_scale: the Gaussian noise scale's initial value (not ``ensemble``'s: its heads predict it).
    :param dropout: MC dropout's rate (``mcd`` only; the WHVI paper's UCI experiments use 0.005).
    :param flows: planar flows over each site's ``g`` (``nf-whvi``).
    :param reflections: Householder reflections ``T`` of VSD's noise (``vsd``).
    :returns: ``(model, guide)``.
    """
    spec = parse_method(spec) if isinstance(spec, str) else spec
    if spec.base == ENSEMBLE:  # each network a point estimate: mcd's guide, without dropout
        return build_ensemble(
            widths, lambda member: make_guide("mcd", member), likelihood=likelihood, activation=activation
        )
    model = BayesianMLP(
        widths,
        activation=activation,
        noise_scale=noise_scale,
        likelihood=likelihood,
        dropout=dropout if spec.base == "mcd" else 0.0,
    )
    # WHVI as in the paper's set-up (§3.2, the "paper" sites): every layer but the last, which is
    # mean-field (weight and bias). Biases go on WHVI blocks too (§2.5): as mean-field sites their KL
    # outweighed the data on small UCI sets.
    guide = make_guide(spec.base, model, flows=flows, reflections=reflections, sites="paper")
    return model, guide


def fit(
    spec: MethodSpec | str,
    model: BayesianMLP,
    guide,
    x: Tensor,
    y: Tensor,
    schedule: Schedule = Schedule(),
    *,
    seed: int = 0,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
    kl_weight: float = 1.0,
    jit: bool = False,
) -> list[float]:
    """Train ``guide`` on ``(x, y)`` with :func:`~pyro_whvi.train.engine.train` (``Trace_ELBO``, or the compiled
    ``JitTrace_ELBO`` with ``jit``; Adam, ``schedule``); an ensemble's networks one after the other
    (:func:`~pyro_whvi.experiments.ensemble.fit_members`).

    With ``+iblm`` the guide is first initialized by :func:`~pyro_whvi.iblm_` on the training data
    (not when a checkpoint is resumed). Minibatches (drawn with replacement from a generator seeded by
    ``seed``) scale the likelihood to the whole training set through the model's ``num_data``. Called in
    every rank of a ``torch.distributed`` group, it trains data-parallel.

    :param progress: show a progress bar (a string is its label).
    :param checkpoint: save and resume the run here (:class:`~pyro_whvi.train.engine.Checkpoint`).
    :param noise: ``"per_rank"`` or ``"per_example"`` (see :mod:`pyro_whvi.train.engine`).
    :param kl_weight: the KL term's weight (:class:`~pyro_whvi.infer.KLAnnealing`); 1 is the ELBO.
    :param jit: train on :class:`~pyro_whvi.infer.JitTrace_ELBO` (``torch.jit.trace``): the same loss and gradients
        (tested for every guide), about twice as fast on the UCI networks, other random numbers.
    :returns: the ELBO loss (negative ELBO estimate) of every step; for an ensemble its networks' mean.
    """
    spec = parse_method(spec) if isinstance(spec, str) else spec
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"fit: x has {x.shape[0]} rows but y has {y.shape[0]}.")
    label = progress if isinstance(progress, str) else spec.name
    if spec.base == ENSEMBLE:
        if not isinstance(guide, EnsembleGuide):
            raise TypeError(
                f"fit: method {ENSEMBLE!r} trains an EnsembleGuide, got a {type(guide).__name__}; build the model "
                f"and guide with build_method('{ENSEMBLE}', ...)"
            )
        return fit_members(
            model,
            guide,
            x,
            y,
            schedule,
            seed=seed,
            kl_weight=kl_weight,
            progress=label if progress else False,
            checkpoint=checkpoint,
            noise=noise,
            jit=jit,
        )
    initialize = None
    if spec.iblm:

        def initialize() -> None:
            iblm_(guide, (x, y), progress=False)  # 128 rows a regression, the widest layer's width if more

    return train(
        model,
        guide,
        x,
        y,
        schedule,
        seed=seed,
        initialize=initialize,
        progress=label if progress else False,
        checkpoint=checkpoint,
        noise=noise,
        kl_weight=kl_weight,
        jit=jit,
    )


def predictive_samples(model, guide, x: Tensor, num_samples: int = 64, progress: bool | str = False) -> Tensor:
    """Monte-Carlo samples of the network output ``f``: ``(S, N)`` for one output, else ``(S, N, C)``
    (:func:`predictive_sites` of ``f`` alone)."""
    return predictive_sites(model, guide, x, num_samples, progress)["f"]


def predictive_sites(
    model, guide, x: Tensor, num_samples: int = 64, progress: bool | str = False, sites: tuple[str, ...] = ("f",)
) -> dict[str, Tensor]:
    """Monte-Carlo samples of the model's deterministic ``sites``, each from the same posterior draws: ``f``, and
    for a mean-variance head (``BayesianMLP(likelihood="heteroscedastic")``) ``noise``, the standard deviation it
    predicts; each ``(S, N)`` for one output, else ``(S, N, C)``.

    ``Predictive`` keeps every posterior sample of the weights until it stacks the outputs, so the samples
    are drawn in chunks (:func:`~pyro_whvi.experiments.memory_budget.prediction_chunk`: one when they fit,
    as for the defaults); with several chunks ``progress`` (a label) shows a progress bar. For an ensemble
    (an :class:`~pyro_whvi.experiments.ensemble.EnsembleGuide`) its networks' means (logits) and heads' standard
    deviations, one row each, whatever ``num_samples`` (:func:`~pyro_whvi.experiments.ensemble.member_predictions`).
    """
    if isinstance(guide, EnsembleGuide):
        means, scales = member_predictions(model, guide, x)
        return {"f": means} if scales is None else {"f": means, "noise": scales}
    if isinstance(model, BayesianMLP):
        weights = dense_weights(model.widths)
    else:
        weights = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    chunk = prediction_chunk(num_samples, weights, x.element_size())
    parts: dict[str, list[Tensor]] = {site: [] for site in sites}
    label = progress if isinstance(progress, str) else "predicting"
    with (
        torch.no_grad(),
        pyro.validation_enabled(False),
        tqdm(total=num_samples, desc=label, disable=not progress or chunk >= num_samples, leave=False) as bar,
    ):
        for first in range(0, num_samples, chunk):
            size = min(chunk, num_samples - first)
            drawn = Predictive(model, guide=guide, num_samples=size, return_sites=list(sites))(x)
            missing = [site for site in sites if site not in drawn]
            if missing:
                recorded = sorted(drawn)
                raise ValueError(f"predictive_sites: the model records no site {missing[0]!r}; it records {recorded}")
            for site in sites:
                parts[site].append(drawn[site].reshape(size, x.shape[0], -1))
            bar.update(size)
    result = {}
    for site, values in parts.items():
        value = values[0] if len(values) == 1 else torch.cat(values)
        result[site] = value[..., 0] if value.shape[-1] == 1 else value
    return result
