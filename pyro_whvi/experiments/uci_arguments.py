"""``whvi uci``'s argument types, and the :class:`~pyro_whvi.experiments.uci_config.UCIConfig` its arguments
describe (:mod:`~pyro_whvi.experiments.uci_command` adds the command)."""

from __future__ import annotations

import argparse
import sys

__all__ = [
    "PROTOCOL_ARGUMENTS",
    "config_from_arguments",
    "dropout_rates",
    "method_names",
    "protocol_names",
    "split_numbers",
]


def method_names(text: str) -> tuple[str, ...]:
    from .methods import parse_method

    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    if not methods:
        raise argparse.ArgumentTypeError("expected comma-separated methods, e.g. mfg,mcd,whvi")
    try:
        return tuple(dict.fromkeys(parse_method(m).name for m in methods))  # each method once, as --splits
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def split_numbers(text: str) -> tuple[int, ...]:
    from .uci import parse_splits

    try:
        return parse_splits(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def protocol_names(text: str) -> tuple[str, ...]:
    from .uci_config import AUTO_PROTOCOL, UCI_PROTOCOLS

    names = tuple(dict.fromkeys(part.strip() for part in text.split(",")))
    unknown = [name for name in names if name not in (*UCI_PROTOCOLS, AUTO_PROTOCOL)]
    if unknown or not names or (AUTO_PROTOCOL in names and len(names) > 1):
        raise argparse.ArgumentTypeError(
            f"{AUTO_PROTOCOL} alone, or one of {', '.join(UCI_PROTOCOLS)}, or several of them separated by commas "
            f"(e.g. table3,wide), got {text!r}"
        )
    return names


def dropout_rates(text: str) -> str | float | tuple[float, ...]:
    """``--dropout``: :data:`~pyro_whvi.experiments.auto_dropout.AUTO_DROPOUT`, or one rate below 1 or several
    (candidates, as a tuple)."""
    from .arguments import rates
    from .auto_dropout import AUTO_DROPOUT

    if text.strip() == AUTO_DROPOUT:
        return AUTO_DROPOUT
    if AUTO_DROPOUT in (part.strip() for part in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"{AUTO_DROPOUT} alone, or one rate below 1 or several separated by commas (e.g. 0.005,0.01,0.05,0.1), "
            f"got {text!r}"
        )
    return rates(text)


#: Arguments that set the protocol's network and schedule (UCIConfig.from_protocol's keywords).
PROTOCOL_ARGUMENTS = ("hidden", "layers", "steps", "lr", "fixed_noise_steps", "batch_size", "cooldown")


def config_from_arguments(args: argparse.Namespace, dataset: str, train_rows: int):
    """The :class:`~pyro_whvi.experiments.uci_config.UCIConfig` the arguments describe on ``dataset`` with
    ``train_rows`` training rows: every argument named as a field goes to it, the protocol's through
    :meth:`~pyro_whvi.experiments.uci_config.UCIConfig.from_protocol`."""
    from dataclasses import fields

    from .uci_config import AUTO_PROTOCOL, UCIConfig

    if args.preset is not None:
        print(
            "whvi uci: --preset is now --protocol (the same choices); --preset goes in the next release",
            file=sys.stderr,
        )
    values = dict(vars(args))
    values["standardize_targets"] = not values.pop("raw_targets")  # the one argument named for its opposite
    values["samples"] = max(2, args.samples)
    if values.get("choose_by") is None:  # not given: UCIConfig's, or --protocol auto's own
        values.pop("choose_by", None)
    names = {field.name for field in fields(UCIConfig)} - {"schedule", "hidden", "layers", "progress", "protocol"}
    settings = {name: value for name, value in values.items() if name in names}
    protocol = args.protocol or ((args.preset,) if args.preset else (AUTO_PROTOCOL,))
    return UCIConfig.from_protocol(
        protocol, dataset, train_rows=train_rows, **{name: values[name] for name in PROTOCOL_ARGUMENTS}, **settings
    )
