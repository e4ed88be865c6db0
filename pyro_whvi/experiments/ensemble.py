r"""Deep ensembles (``whvi uci --methods ensemble``): :data:`~pyro_whvi.experiments.memory_budget.ENSEMBLE_SIZE`
networks (5) with mean-variance heads, each a point estimate trained on its own through the one training loop,
predicting as the uniform mixture.

Each member is a :class:`~pyro_whvi.nn.networks.BayesianMLP` with the ``"heteroscedastic"`` likelihood (for
regression: a mean :math:`\mu_m(x)` and a variance :math:`\sigma_m^2(x) = \operatorname{softplus}(\cdot) +
10^{-6}`, §2.2.1; for classification the plain softmax) and an ``AutoDelta`` guide, the ``mcd`` guide without
dropout. :func:`fit_members` trains the members one after the other with
:func:`pyro_whvi.train.engine.train`, each from its own initialization and on its own minibatches (seed
``seed * M + m`` for both), by minimizing the Gaussian NLL, a proper scoring rule (§2.2), with Adam; the
members share nothing, so this is the paper's independent training (§2.4). The prediction is the uniform
mixture of the members' Gaussians (§2.4): :func:`member_predictions` gives each member's mean and standard
deviation, and :func:`~pyro_whvi.metrics.rmse` and :func:`~pyro_whvi.metrics.gaussian_mnll`, which treat the
``M`` rows as the mixture's components, give the RMSE of the mixture mean and the mixture's MNLL.

Choices against the paper, for a comparison at equal budget in the harness:

* **Schedule**: each member trains under the harness's schedule of the other methods (``--steps``,
  ``--batch-size``, ``--lr``: by default the WHVI paper's 50,500 steps of 64 at Adam 1e-3, decayed), not the
  paper's 40 epochs of 100 at Adam 0.1 (§3.3), so that each network gets the budget a WHVI or MC dropout
  network gets; the ensemble costs ``M`` times that. The variance head learns from the first step (no
  fixed-noise phase: there is no ``noise_scale`` to hold).
* **Weight decay**: the paper minimizes the plain NLL. Over the harness's 50,500 steps (thousands of epochs on
  a few hundred rows) a network with a free variance head fits the training rows' noise, so each member is the
  MAP under the network's :math:`\mathcal{N}(0, 1/\text{fan\_in})` prior, the weight decay ``mcd`` trains
  with, weighted by ``--kl-weight`` as for ``mcd`` (default 1; a small weight, e.g. ``1e-6``, is the plain NLL,
  and several weights are chosen from on validation rows as for every method). On the bundled diabetes set
  (split 0, 2x128, 5,000 steps) the ensemble's test MNLL is 5.42 with the prior and 37.1 at ``1e-6``.
* **Adversarial training** (§2.3) is optional in the paper and is not done here.

Checkpoints: member ``m`` of a run checkpointed at ``split0.ckpt`` is checkpointed at ``split0.member<m>.ckpt``
(:func:`member_checkpoint`) and kept until the whole ensemble is done (:func:`remove_checkpoints`), so an
interrupted run resumes every member from its last checkpoint and ends where an uninterrupted run ends.

References:
    B. Lakshminarayanan, A. Pritzel, C. Blundell. *Simple and Scalable Predictive Uncertainty Estimation using
    Deep Ensembles*. NeurIPS 2017, §2.2–2.4, §3.3 and Table 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import pyro
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule
from torch import Tensor, nn

from ..nn import BayesianMLP
from ..train.checkpoints import resumed_seconds
from ..train.engine import Checkpoint, Schedule, train
from .memory_budget import ENSEMBLE_SIZE

__all__ = [
    "ENSEMBLE_SIZE",
    "EnsembleGuide",
    "build_ensemble",
    "fit_members",
    "member_checkpoint",
    "member_predictions",
    "remove_checkpoints",
    "resumed_member_seconds",
]

#: Each task's member likelihood: regression (either Gaussian likelihood) gets the mean-variance head.
MEMBER_LIKELIHOODS = {"gaussian": "heteroscedastic", "heteroscedastic": "heteroscedastic", "categorical": "categorical"}


class EnsembleGuide(nn.ModuleList):
    """The members' guides, one per member of the ensemble's model (a ``PyroModule`` list of networks, so that
    member ``m``'s sites are named ``m.layers...``: the guides' parameters do not meet in Pyro's parameter store)."""


def build_ensemble(
    widths: list[int],
    guide: Callable[[BayesianMLP], nn.Module],
    *,
    likelihood: str = "gaussian",
    activation: Callable[[Tensor], Tensor] = torch.relu,
    size: int = ENSEMBLE_SIZE,
) -> tuple[nn.Module, EnsembleGuide]:
    """``size`` networks of ``widths`` (the targets' count last) and their guides ``guide(member)``.

    :param likelihood: the task, ``"gaussian"`` (each member gets a mean-variance head) or ``"categorical"``.
    :returns: ``(members, guides)``: the members in a ``PyroModule`` list and an :class:`EnsembleGuide`.
    """
    if likelihood not in MEMBER_LIKELIHOODS:
        raise ValueError(f"ensemble: likelihood must be one of {tuple(MEMBER_LIKELIHOODS)}, got {likelihood!r}.")
    if size < 1:
        raise ValueError(f"ensemble: at least one member expected, got size {size}.")
    networks = [
        BayesianMLP(widths, activation=activation, likelihood=MEMBER_LIKELIHOODS[likelihood]) for _ in range(size)
    ]
    members = PyroModule[nn.ModuleList](networks)  # type: ignore[arg-type]
    return members, EnsembleGuide(guide(network) for network in networks)


def fit_members(
    members: Iterable[BayesianMLP],
    guides: EnsembleGuide,
    x: Tensor,
    y: Tensor,
    schedule: Schedule = Schedule(),
    *,
    seed: int = 0,
    kl_weight: float = 1.0,
    progress: bool | str = True,
    checkpoint: Checkpoint | None = None,
    noise: str = "per_rank",
    jit: bool = False,
) -> list[float]:
    """Train each member with :func:`~pyro_whvi.train.engine.train`, one after the other: member ``m`` is
    initialized (its guide's ``init_to_sample``) and draws its minibatches from seed ``seed * M + m``.

    :param progress: show a progress bar per member (a string is its label, followed by the member).
    :param checkpoint: the ensemble's; each member saves and resumes at :func:`member_checkpoint`.
    :param jit: train each member on the compiled ELBO (see :func:`~pyro_whvi.experiments.methods.fit`).
    :returns: the members' mean loss at every step.
    """
    size = len(guides)
    label = progress if isinstance(progress, str) else "ensemble"
    total: list[float] = []
    for m, (member, guide) in enumerate(zip(members, guides, strict=True)):
        member_seed = (seed * size + m) % 2**32
        pyro.set_rng_seed(member_seed)  # the member's initialization, whatever the members before it drew
        losses = train(
            member,
            guide,
            x,
            y,
            schedule,
            seed=member_seed,
            kl_weight=kl_weight,
            progress=f"{label} member {m + 1}/{size}" if progress else False,
            checkpoint=member_checkpoint(checkpoint, m),
            noise=noise,
            jit=jit,
        )
        total = losses if not total else [a + b for a, b in zip(total, losses, strict=True)]
    return [value / size for value in total]


def member_predictions(members: Iterable[nn.Module], guides: EnsembleGuide, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """Each member's output on ``x``: the means ``(M, N)`` (logits ``(M, N, C)`` for classification) and, for
    mean-variance heads, the standard deviations ``(M, N)`` (else ``None``): the uniform mixture's components."""
    means, scales = [], []
    with torch.no_grad(), pyro.validation_enabled(False):
        for member, guide in zip(members, guides, strict=True):
            sites = Predictive(member, guide=guide, num_samples=1, return_sites=["f", "noise"])(x)
            means.append(_one_row(sites["f"], x.shape[0]))
            if "noise" in sites:
                scales.append(_one_row(sites["noise"], x.shape[0]))
    return torch.stack(means), torch.stack(scales) if scales else None


def _one_row(site: Tensor, rows: int) -> Tensor:
    """One ``Predictive`` draw of a site of ``rows`` examples as ``(N,)`` for one output, else ``(N, C)``."""
    value = site.reshape(rows, -1)
    return value[:, 0] if value.shape[-1] == 1 else value


def member_checkpoint(checkpoint: Checkpoint | None, member: int) -> Checkpoint | None:
    """Member ``member``'s checkpoint: ``split0.member<m>.ckpt`` next to the ensemble's ``split0.ckpt``, its key
    the ensemble's and the member's."""
    if checkpoint is None:
        return None
    path = checkpoint.path
    return replace(
        checkpoint, path=path.with_name(f"{path.stem}.member{member}{path.suffix}"), key=f"{checkpoint.key}:m{member}"
    )


def resumed_member_seconds(checkpoint: Checkpoint | None, size: int = ENSEMBLE_SIZE) -> float:
    """The seconds of training the members' resumed checkpoints had behind them
    (:func:`~pyro_whvi.train.checkpoints.resumed_seconds` of each)."""
    return sum(resumed_seconds(member_checkpoint(checkpoint, m)) for m in range(size))


def remove_checkpoints(path: Path, size: int = ENSEMBLE_SIZE) -> None:
    """Remove the checkpoint ``path`` and its members' (:func:`member_checkpoint`), those that exist."""
    path.unlink(missing_ok=True)
    for m in range(size):
        member = member_checkpoint(Checkpoint(path), m)
        assert member is not None
        member.path.unlink(missing_ok=True)
