r"""Inference methods by name, and the WHVI paper's training schedule, on Pyro's own ``SVI``.

One name per method, the same Pyro model for all of them (a :class:`~pyro_whvi.models.BayesianMLP`):

=============  ==========================================================================
``mfg``        Pyro's ``AutoNormal`` (mean-field Gaussian VI)
``mcd``        MC dropout: the network with dropout, a point estimate under the prior (``AutoDelta``)
``whvi``       :class:`~pyro_whvi.AutoWHVIGuide` (G-WHVI, local reparameterization): weights and
               biases under WHVI (vectors on square blocks, §2.5), the last layer mean-field (§3.2)
``nf-whvi``    :class:`~pyro_whvi.AutoWHVIGuide` with planar flows over ``g``
``vsd``        :class:`~pyro_whvi.AutoVSDGuide` (Householder-structured dropout noise)
=============  ==========================================================================

Append ``+iblm`` (``whvi+iblm``, ``mfg+iblm``, ...) to start the guide from I-BLM
(:func:`~pyro_whvi.iblm_`) instead of its default initialization.

:func:`fit` runs the WHVI paper's schedule (App. D.1): Adam with the learning rate
:math:`\lambda_t = \lambda_0 (1 + \gamma t)^{-p}`, minibatches, and for regression the noise scale
held fixed for the first ``fixed_noise_steps`` (two phases); :func:`predictive_samples` draws the
Monte-Carlo predictive with ``Predictive``.

Shape letters: ``S`` posterior samples, ``N`` examples, ``D`` inputs, ``C`` classes.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, §3.2 and App. D.1.
    Y. Gal, Z. Ghahramani. *Dropout as a Bayesian Approximation*. ICML 2016.
    S. Nguyen et al. *Structured Dropout Variational Inference for Bayesian Neural Networks*. NeurIPS 2021.
    S. Rossi, P. Michiardi, M. Filippone. *Good Initializations of Variational Bayes for Deep Models*. ICML 2019.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_sample
from torch import Tensor
from tqdm.auto import tqdm

from .infer import AutoVSDGuide, AutoWHVIGuide
from .init import iblm_
from .models import BayesianMLP

__all__ = [
    "BASE_METHODS",
    "MethodSpec",
    "Schedule",
    "build_method",
    "fit",
    "make_guide",
    "parse_method",
    "predictive_samples",
]

BASE_METHODS = ("mfg", "mcd", "whvi", "nf-whvi", "vsd")
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
    if base not in BASE_METHODS:
        raise ValueError(
            f"unknown method {name!r}; choose from {', '.join(BASE_METHODS)}, each optionally with '{IBLM_SUFFIX}'"
        )
    if iblm and base == "mcd":
        raise ValueError("method 'mcd+iblm': I-BLM initializes variational guides; MC dropout has none")
    return MethodSpec(base, iblm)


@dataclass(frozen=True)
class Schedule:
    r"""The training schedule (defaults: the WHVI paper's, App. D.1, with fewer steps).

    :param steps: SVI steps in all, both phases.
    :param fixed_noise_steps: first steps with the Gaussian noise scale held at its initial value.
    :param batch_size: examples per step (``None`` or ``>= N``: full batch).
    :param lr: :math:`\lambda_0`, Adam's initial learning rate.
    :param lr_gamma: :math:`\gamma` in :math:`\lambda_t = \lambda_0 (1 + \gamma t)^{-p}`.
    :param lr_power: :math:`p` (0 keeps the learning rate constant).
    """

    steps: int = 20000
    fixed_noise_steps: int = 500
    batch_size: int | None = 64
    lr: float = 1e-3
    lr_gamma: float = 5e-4
    lr_power: float = 0.3

    def __post_init__(self) -> None:
        if self.steps < 1 or self.fixed_noise_steps < 0 or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError(f"Schedule: steps >= 1, fixed_noise_steps >= 0 and batch_size >= 1 expected, got {self}.")
        if self.lr <= 0 or self.lr_gamma < 0 or self.lr_power < 0:
            raise ValueError(f"Schedule: lr > 0, lr_gamma >= 0 and lr_power >= 0 expected, got {self}.")


def make_guide(base: str, model, *, flows: int = 3, reflections: int = 1, **whvi_options) -> Any:
    """The guide of base method ``base`` (a name in :data:`BASE_METHODS`) for ``model``.

    ``model`` itself then goes to ``SVI`` and ``Predictive`` for every method (the structured guides
    transform it in place). For ``mcd`` the model must have dropout: the guide is a point estimate.

    :param flows: planar flows over each site's ``g`` (``nf-whvi``).
    :param reflections: Householder reflections ``T`` of VSD's noise (``vsd``).
    :param whvi_options: passed to :class:`~pyro_whvi.AutoWHVIGuide` (``whvi``, ``nf-whvi``).
    """
    guide: Any
    if base == "mfg":
        guide = AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.01)
    elif base == "mcd":
        guide = AutoDelta(model, init_loc_fn=init_to_sample)
    elif base == "vsd":
        guide = AutoVSDGuide(model, reflections=reflections)
    elif base in ("whvi", "nf-whvi"):
        guide = AutoWHVIGuide(model, flows=flows if base == "nf-whvi" else 0, **whvi_options)
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
) -> tuple[BayesianMLP, Any]:
    """A fresh ``BayesianMLP`` with ``widths`` and its guide for the method.

    :param dropout: MC dropout's rate (``mcd`` only; the WHVI paper's UCI experiments use 0.005).
    :param flows: planar flows over each site's ``g`` (``nf-whvi``).
    :param reflections: Householder reflections ``T`` of VSD's noise (``vsd``).
    :returns: ``(model, guide)``.
    """
    spec = parse_method(spec) if isinstance(spec, str) else spec
    model = BayesianMLP(
        widths,
        activation=activation,
        noise_scale=noise_scale,
        likelihood=likelihood,
        dropout=dropout if spec.base == "mcd" else 0.0,
    )
    # WHVI as in the paper's set-up (§3.2, the "paper" preset): every layer but the last, which is
    # mean-field (weight and bias). Biases go on WHVI blocks too (§2.5): as mean-field sites their KL
    # outweighed the data on small UCI sets.
    guide = make_guide(spec.base, model, flows=flows, reflections=reflections, preset="paper")
    return model, guide


def _without_noise_parameter(model):
    """The model with its ``noise_scale`` parameter hidden from SVI, which then leaves it unchanged."""
    return pyro.poutine.block(model, hide_fn=lambda msg: msg["type"] == "param" and msg["name"] == "noise_scale")


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
) -> list[float]:
    """Train ``guide`` on ``(x, y)`` with Pyro's ``SVI`` and ``Trace_ELBO`` under ``schedule``.

    With ``+iblm`` the guide is first initialized by :func:`~pyro_whvi.iblm_` on the training data.
    Minibatches (drawn with replacement from a generator seeded by ``seed``) scale the likelihood
    to the whole training set through the model's ``num_data``. Pyro's argument validation is off
    during the steps, for speed; the shapes of x and y are checked here first.

    :param progress: show a progress bar (a string is its label).
    :returns: the ELBO loss (negative ELBO estimate) of every step.
    """
    spec = parse_method(spec) if isinstance(spec, str) else spec
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"fit: x has {x.shape[0]} rows but y has {y.shape[0]}.")
    num_data = x.shape[0]
    if spec.iblm:
        iblm_(guide, (x, y), batch_size=min(128, num_data), progress=False)
    optimizer = pyro.optim.LambdaLR(  # type: ignore[attr-defined]
        {
            "optimizer": torch.optim.Adam,
            "optim_args": {"lr": schedule.lr},
            "lr_lambda": lambda t: (1.0 + schedule.lr_gamma * t) ** -schedule.lr_power,
        }
    )
    has_noise = model.likelihood == "gaussian" and isinstance(model.noise_scale, torch.Tensor)
    fixed_phase = schedule.fixed_noise_steps if has_noise else 0
    phases = [
        SVI(_without_noise_parameter(model), guide, optimizer, Trace_ELBO()),
        SVI(model, guide, optimizer, Trace_ELBO()),
    ]
    generator = torch.Generator().manual_seed(seed)
    batch = schedule.batch_size
    full_batch = batch is None or batch >= num_data
    label = progress if isinstance(progress, str) else spec.name
    losses = []
    with pyro.validation_enabled(False):
        for step in tqdm(range(schedule.steps), desc=label, disable=not progress, leave=False, mininterval=1.0):
            svi = phases[0] if step < fixed_phase else phases[1]
            if full_batch:
                losses.append(svi.step(x, y))
            else:
                index = torch.randint(num_data, (int(batch),), generator=generator)  # type: ignore[arg-type]
                losses.append(svi.step(x[index], y[index], num_data=num_data))
            optimizer.step()
    return losses


def predictive_samples(model, guide, x: Tensor, num_samples: int = 64) -> Tensor:
    """Monte-Carlo samples of the network output ``f``: ``(S, N)`` for one output, else ``(S, N, C)``."""
    with torch.no_grad(), pyro.validation_enabled(False):
        f = Predictive(model, guide=guide, num_samples=num_samples, return_sites=["f"])(x)["f"]
    f = f.reshape(num_samples, x.shape[0], -1)
    return f[..., 0] if f.shape[-1] == 1 else f
