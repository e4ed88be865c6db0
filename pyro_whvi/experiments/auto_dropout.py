"""The rule by which ``whvi uci --dropout auto``, the command's default, sets MC dropout's rate: chosen per split on
held-out rows from Gal's grid under ``--protocol auto`` below :data:`~.uci_protocols.AUTO_WIDE_FROM_ROWS` training
rows, as the published MC dropout numbers are tuned, and the WHVI paper's fixed rate elsewhere, so that ``--protocol
table3`` reproduces the paper's peer. :class:`~.uci_config.UCIConfig` holds what it resolves to (``dropout``: one
rate, or the candidates as a tuple).

References:
    Y. Gal, Z. Ghahramani. *Dropout as a Bayesian Approximation*. ICML 2016, §5.3, and the updated UCI results of its
    code (``DropoutUncertaintyExps``): the rate chosen from 0.005, 0.01, 0.05 and 0.1 on 20% of each split's
    training rows.
"""

from __future__ import annotations

from typing import Any

from .uci_protocols import AUTO_PROTOCOL, _from_threshold

__all__ = ["AUTO_DROPOUT", "DROPOUT_GRID", "PAPER_DROPOUT", "auto_dropout", "dropout_fields"]

#: ``whvi uci --dropout auto``: :func:`auto_dropout` decides by the protocol, the rows and the processes.
AUTO_DROPOUT = "auto"
#: The rate of the WHVI paper's MC dropout runs (§3.2), the first of :data:`DROPOUT_GRID`: every other method is
#: fingerprinted with it, so choosing MC dropout's rate leaves their stored splits valid.
PAPER_DROPOUT = 0.005
#: Gal's grid of dropout rates (``DropoutUncertaintyExps``), the candidates :func:`auto_dropout` chooses from.
DROPOUT_GRID = (PAPER_DROPOUT, 0.01, 0.05, 0.1)


def auto_dropout(protocol: str, train_rows: int, nproc: int = 1) -> float | tuple[float, ...]:
    """MC dropout's rate under ``--dropout auto`` on ``train_rows`` training rows: the candidates
    :data:`DROPOUT_GRID`, chosen per split on held-out rows, under ``--protocol auto`` below
    :data:`~.uci_protocols.AUTO_WIDE_FROM_ROWS` training rows in one process (``nproc`` 1: the candidates are not
    trained data-parallel), else :data:`PAPER_DROPOUT`.

    Measured (``benchmarks/results/mcd_tuned/``, 5 splits each, MC dropout's test MNLL): below the threshold the
    choice moves it by tenths of a nat where the rate matters, yacht 0.828 → 0.707, Boston 2.630 → 2.563, concrete
    3.208 → 3.090, and keeps 0.005 on every split of energy (0.516), at about 4.5 times MC dropout's time a split;
    on two synthetic functions at 1,800 training rows it is 0.30 lower on both (4 of 4 splits).
    At 18,000 training rows (the synthetic bench, splits 0-2 of its four learnable functions, against the paper's
    rate trained on the same machine) the choice was lower on 10 of the 12 splits but by 0.001-0.010 nats on the
    functions' means, at 6 times the time, and WHVI's default stayed below both on all 12; so from the threshold MC
    dropout keeps the paper's rate (``--dropout 0.005,0.01,0.05,0.1`` chooses there too)."""
    small = not _from_threshold(train_rows, "auto_dropout")  # and the rows checked, as auto_protocol does
    return DROPOUT_GRID if protocol == AUTO_PROTOCOL and small and nproc == 1 else PAPER_DROPOUT


def dropout_fields(
    dropout: str | float | tuple[float, ...],
    protocol: str,
    train_rows: int | None,
    bases: tuple[str, ...],
    nproc: int = 1,
) -> dict[str, Any]:
    """The :class:`~.uci_config.UCIConfig` fields that ``whvi uci --dropout dropout`` gives a run of methods with the
    ``bases`` under ``protocol`` on ``train_rows`` training rows: a rate or rates as given, and
    :data:`AUTO_DROPOUT` by :func:`auto_dropout` where the run has MC dropout (``mcd``) under ``--protocol auto``,
    else :data:`PAPER_DROPOUT` (the rate no other method reads). The table's header names the rate or the
    candidates (:mod:`~pyro_whvi.experiments.uci_report`)."""
    if not isinstance(dropout, str):
        return {"dropout": dropout}
    if dropout != AUTO_DROPOUT:
        raise ValueError(f"--dropout: a rate below 1, several separated by commas, or {AUTO_DROPOUT}; got {dropout!r}")
    if "mcd" not in bases or protocol != AUTO_PROTOCOL:
        return {"dropout": PAPER_DROPOUT}
    if train_rows is None:
        raise TypeError(f"UCIConfig.from_protocol: dropout {AUTO_DROPOUT!r} needs train_rows")
    return {"dropout": auto_dropout(protocol, train_rows, nproc)}
