r"""KL annealing for any guide: the ELBO with its KL part weighted by :math:`\lambda` (VSD paper App. I.1).

.. math:: \mathbb{E}_q \log p(\mathcal{D} \mid W) - \lambda\, \mathrm{KL}(q(W) \Vert p(W)) \qquad (27)

Wrap both the model and the guide; every latent site's log-density term (model and guide alike,
so Monte-Carlo and analytic KLs both) is scaled by ``annealing.factor``, observations are not::

    annealing = KLAnnealing(0.1)
    svi = SVI(annealing(guide.model), annealing(guide), optim, Trace_ELBO())
    for step in range(steps):
        annealing.factor = min(1.0, 0.1 + step / warmup)   # any schedule
        svi.step(x, y)

or scale a whole loss evaluation, e.g. Pyro's ``ELBOModule``: ``with annealing.scope(): loss = elbo(x, y)``.

``lambda < 1`` is a tempered posterior (``p(D|W)^{1/lambda}``, App. I.1); with ``lambda = 1`` the
ELBO is unchanged.

References:
    VSD paper (Nguyen et al., NeurIPS 2021), App. I.1 (eq. 27) and I.2 (the values used).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK

from .tracing import recording

__all__ = ["KLAnnealing"]


class _ScaleLatents(Messenger):
    def __init__(self, annealing: KLAnnealing, frozen_under_jit: bool = True):
        super().__init__()
        self.annealing = annealing
        # False where the compiled ELBO keys its graphs by the factor (a scope around a JitTrace_ELBO call)
        self.frozen_under_jit = frozen_under_jit

    def _pyro_sample(self, msg):
        if not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.annealing.factor
            if self.frozen_under_jit and recording():
                warnings.warn(
                    f"KLAnnealing under the JIT (JitTrace_ELBO and kin): the compiled loss keeps factor="
                    f"{self.annealing.factor} and ignores later changes; train a schedule with Trace_ELBO.",
                    UserWarning,
                    stacklevel=2,
                )


class KLAnnealing:
    """Weight of the KL term, shared by the model and guide it wraps; change ``factor`` at any time.

    :param factor: :math:`\\lambda \\ge 0` (the paper uses 0.1–0.5 for classification and
        1e-5–1e-2 for small regression sets, App. I.2).
    """

    def __init__(self, factor: float = 1.0):
        self.factor = factor

    @property
    def factor(self) -> float:
        return self._factor

    @factor.setter
    def factor(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"KLAnnealing: factor must be >= 0, got {value!r}.")
        self._factor = float(value)

    def __call__(self, fn: Callable) -> Callable:
        """``fn`` (a model or a guide) with its latent sites' log densities scaled by ``factor``."""
        return _ScaleLatents(self)(fn)

    def scope(self) -> Messenger:
        """A context in which every latent site's log density is scaled by ``factor``: around a whole ELBO
        evaluation (``with annealing.scope(): loss = elbo(x, y)``) it weights the model's and the guide's alike."""
        return _ScaleLatents(self)

    def __repr__(self) -> str:
        return f"KLAnnealing(factor={self.factor})"


def active_annealing_factors() -> tuple[float, ...]:
    """The factors of the :meth:`KLAnnealing.scope` s active now, outermost first."""
    return tuple(m.annealing.factor for m in _PYRO_STACK if isinstance(m, _ScaleLatents))


def scale_latents(fn: Callable, factors: tuple[float, ...]) -> Callable:
    """``fn`` with its latent sites' log densities scaled by each factor (a compiled ELBO's view of the
    :meth:`KLAnnealing.scope` s around its call, whose graphs it keys by these factors)."""
    for factor in factors:
        fn = _ScaleLatents(KLAnnealing(factor), frozen_under_jit=False)(fn)
    return fn
