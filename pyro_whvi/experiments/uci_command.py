"""``whvi uci``: its arguments and what runs them (:func:`pyro_whvi.experiments.uci.run_uci`)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from .arguments import (
    at_most,
    check_device,
    float_in,
    nonnegative,
    positive,
    positive_float,
    positive_numbers,
    samples,
    steps,
)
from .memory_budget import MAX_STEPS
from .uci_arguments import config_from_arguments, dropout_rates, method_names, protocol_names, split_numbers

__all__ = ["add_uci_command", "run_uci_command"]


def add_uci_command(commands) -> None:
    from .auto_calibration import CALIBRATION_CHOICES, SPREAD_SHARE_THRESHOLD
    from .auto_dropout import AUTO_DROPOUT, PAPER_DROPOUT
    from .auto_narrow import CHOICE_RULES
    from .likelihood_choice import NOISE_GAIN_THRESHOLD
    from .methods import BASE_METHODS, ENSEMBLE, METHODS, Schedule
    from .uci import BUNDLED_DATASETS, UCIConfig
    from .uci_config import AUTO_DEEP_FROM_ROWS, AUTO_PROTOCOL, AUTO_WIDE_FROM_ROWS, DEVICES, UCI_PROTOCOLS
    from .uci_protocols import AUTO_LIKELIHOOD, LIKELIHOOD_CHOICES

    uci = commands.add_parser(
        "uci",
        help="Bayesian MLPs on UCI-format regression splits or bundled scikit-learn sets; resumable",
        description=(
            "Train a Bayesian MLP with each method on each split and report test RMSE/MNLL (regression, original "
            "units) or error/NLL/ECE/entropy (classification), mean ± standard error over splits. Finished splits "
            "are read back from OUT/runs instead of being trained again. Methods: "
            + ", ".join(BASE_METHODS)
            + ", each but mcd optionally with +iblm (I-BLM initialization), and "
            + ENSEMBLE
            + " (deep ensembles: 5 networks with mean-variance heads, each trained on its own under the same schedule, "
            "predicting as their mixture; Lakshminarayanan et al. 2017). The schedule is the WHVI paper's (App. D.1: "
            "50,500 steps, batch 64, Adam decayed, noise fixed for 500 steps); the network by default (--protocol "
            f"auto) its Table 3's 2x128 ReLU at lr 1e-3 below {AUTO_WIDE_FROM_ROWS:,} training rows, for whvi 2x1024 "
            "at lr 3e-3 from them, with one noise scale or a mean-variance head chosen per split on the training "
            f"residuals (--likelihood auto), 3x1024 cooled down over the last 20% of the steps from "
            f"{AUTO_DEEP_FROM_ROWS:,}."
        ),
    )
    source = uci.add_mutually_exclusive_group()
    source.add_argument("--data-dir", type=Path, help="a dataset directory in the UCI split format")
    source.add_argument("--dataset", choices=BUNDLED_DATASETS, help="a bundled scikit-learn set (default diabetes)")
    defaults, schedule = UCIConfig(), Schedule()
    uci.add_argument(
        "--methods",
        type=method_names,
        default=defaults.methods,
        help=f"comma-separated, from {','.join(METHODS)} (+iblm on the variational ones; default mfg,mcd,whvi)",
    )
    uci.add_argument("--splits", type=split_numbers, default=defaults.splits, help="e.g. 0-4 or 0,3,7 (default 0-4)")
    uci.add_argument("--steps", type=steps, help="SVI steps (default: the protocol's, 50,500)")
    uci.add_argument(
        "--fixed-noise-steps",
        type=at_most(MAX_STEPS, "the most --steps there can be", minimum=0),
        default=schedule.fixed_noise_steps,
        help=f"first steps with the noise scale fixed (default {schedule.fixed_noise_steps})",
    )
    uci.add_argument("--batch-size", type=positive, default=schedule.batch_size, help="minibatch size (default 64)")
    uci.add_argument("--lr", type=positive_float, help="Adam's initial learning rate (default: the protocol's)")
    uci.add_argument(
        "--cooldown",
        type=float,
        help="last fraction of the steps over which the learning rate is also scaled linearly down towards 0, "
        "e.g. 0.2 (default: the protocol's, 0.2 for deep, else 0: none, the paper's schedule)",
    )
    protocol = uci.add_mutually_exclusive_group()
    protocol.add_argument(
        "--protocol",
        type=protocol_names,
        metavar="{" + ",".join((AUTO_PROTOCOL, *UCI_PROTOCOLS)) + "}[,...]",
        help=f"{AUTO_PROTOCOL} (the default): table3 below {AUTO_WIDE_FROM_ROWS:,} training rows (with --choose-by "
        "noise-factor for whvi with its noise calibrated narrow where its held-out noise factor is at most 1, else "
        "table3), from it wide for "
        f"whvi, nf-whvi and whvi-lowrank, deep for whvi from {AUTO_DEEP_FROM_ROWS:,} (table3 for the others, chosen "
        "per method); "
        "table3: the WHVI paper's Table 3, 2x128, lr 1e-3, 50,500 steps; table6: its Table 6 / "
        "App. D.2, 1x50 (1x100 for protein), the same schedule; narrow: 2x128, lr 3e-3, 50,500 steps; wide: 2x1024, "
        "lr 3e-3, 50,500 steps; deep: 3x1024, "
        "lr 3e-3, 50,500 steps, --cooldown 0.2. --hidden, --layers, --steps, --lr and --cooldown override the "
        "protocol. Several, e.g. table3,wide: each split chooses one on a --val-fraction of its training rows "
        "(every candidate trained there, with every --kl-weight), then trains with it; the table names the choices",
    )
    uci.add_argument(
        "--choose-by",
        choices=CHOICE_RULES,
        help="how each split chooses among several --protocol on its held-out rows: score (the default), the lowest "
        "validation MNLL, every candidate trained; noise-factor: in the order given, the first whose calibrated noise "
        "factor there is at most 1, else the last (needs --calibrate-noise on; with --protocol auto, whvi's "
        f"narrow,table3 below {AUTO_WIDE_FROM_ROWS:,} training rows, not the default)",
    )
    # The name of earlier releases, kept for one release: the same choices, with a notice on stderr.
    protocol.add_argument("--preset", choices=tuple(UCI_PROTOCOLS), dest="preset", help=argparse.SUPPRESS)
    uci.add_argument("--hidden", type=positive, help="hidden units per layer (default: the protocol's)")
    uci.add_argument("--layers", type=nonnegative, help="hidden layers (default: the protocol's)")
    uci.add_argument(
        "--noise-scale",
        type=positive_float,
        default=defaults.noise_scale,
        help=f"the Gaussian noise scale's initial value, held for --fixed-noise-steps, in the targets' training units "
        f"(default {defaults.noise_scale}: a tenth of the standardized targets' scale)",
    )
    uci.add_argument(
        "--likelihood",
        choices=(AUTO_LIKELIHOOD, *LIKELIHOOD_CHOICES),
        default=AUTO_LIKELIHOOD,
        help=f"regression: gaussian, the papers' one learned noise scale; heteroscedastic, a mean-variance head (the "
        "last layer also predicts each row's noise, under the method's posterior; not with +iblm); by-residuals: "
        "gaussian, then the head where a variance model of the inputs gains "
        f"{NOISE_GAIN_THRESHOLD} nats a row on its training residuals, per split; auto (the default): under "
        f"--protocol auto from {AUTO_WIDE_FROM_ROWS:,} training rows by-residuals for whvi and the head for nf-whvi "
        "and mcd, else gaussian, chosen per method. ensemble has the head either way",
    )
    uci.add_argument(
        "--raw-targets",
        action="store_true",
        help="train on regression targets in their original units, as the WHVI paper does (default: standardized "
        "with the training statistics; metrics are in the original units either way)",
    )
    uci.add_argument(
        "--kl-weight",
        type=positive_numbers,
        default=defaults.kl_weight,
        help="weight of the KL term for every method (default 1: the ELBO, as in the papers); below 1 a tempered "
        "posterior, to measure what the KL costs; the table says so. Several, e.g. 1,0.3,0.1: each split chooses "
        "one on a --val-fraction of its training rows (every candidate trained there), then trains with it",
    )
    uci.add_argument(
        "--val-fraction",
        type=positive_float,
        default=defaults.val_fraction,
        help=f"part of each split's training rows held out to choose among several --kl-weight or --protocol, or to "
        f"--calibrate-noise (default {defaults.val_fraction})",
    )
    uci.add_argument(
        "--calibrate-noise",
        nargs="?",
        const="on",
        default="auto",
        choices=CALIBRATION_CHOICES,
        help="regression: train on all but a --val-fraction of each split's training rows, choose the noise's factor "
        "that gives those rows the lowest MNLL; the fit on all rows then predicts with its noise times it, keeping a "
        "weight 1/(held-out rows + 2) on its learned noise (1.8x the training, nothing more where candidates are "
        "chosen on those rows: the chosen one's fit is reused; the table names each factor). on (the flag alone): "
        "every method; under --likelihood by-residuals where a split chooses the head or keeps one noise scale with a "
        f"spread share of {SPREAD_SHARE_THRESHOLD} or more; auto: whvi and mcd "
        f"under --protocol auto below {AUTO_WIDE_FROM_ROWS:,} training rows, whvi from there under by-residuals, in "
        "one process (the default); off: none",
    )
    uci.add_argument("--samples", type=samples, default=defaults.samples, help="test-time posterior samples")
    uci.add_argument(
        "--dropout",
        type=dropout_rates,
        default=AUTO_DROPOUT,
        help=f"MC dropout rate. Several, e.g. 0.005,0.01,0.05,0.1 (Gal's grid): each split chooses mcd's on a "
        f"--val-fraction of its training rows, as --kl-weight does; auto (the default): that grid under --protocol "
        f"auto below {AUTO_WIDE_FROM_ROWS:,} training rows in one process on regression, else {PAPER_DROPOUT} (the "
        "WHVI paper's)",
    )
    uci.add_argument("--flows", type=positive, default=defaults.flows, help="planar flows of nf-whvi (default 3)")
    uci.add_argument("--reflections", type=nonnegative, default=defaults.reflections, help="VSD's Householder T")
    uci.add_argument("--seed", type=nonnegative, default=defaults.seed)
    uci.add_argument("--threads", type=positive, help="torch threads per process (default: torch's choice)")
    uci.add_argument(
        "--device",
        choices=DEVICES,
        default=defaults.device,
        help="where the model, data and training go (default cpu); cuda: the first CUDA GPU, one process (the "
        "predictions and metrics come back to the CPU). A CUDA run does not reuse a CPU run's stored splits",
    )
    uci.add_argument(
        "--eager",
        dest="jit",
        action="store_false",
        help="train on Pyro's Trace_ELBO instead of the compiled JitTrace_ELBO (the default: the same loss and "
        "gradients, about twice as fast, other random numbers)",
    )
    uci.add_argument("--out", type=Path, default=Path("whvi_uci"), help="output folder (default ./whvi_uci)")
    parallel = uci.add_argument_group(
        "data-parallel training",
        "--nproc N starts N processes here (gloo on loopback); the batch is split over them. On several machines "
        "or GPUs launch with torchrun instead: torchrun --nnodes M --nproc-per-node N -m pyro_whvi uci ... "
        "(the processes torchrun starts are used, --nproc is not needed).",
    )
    parallel.add_argument("--nproc", type=positive, default=1, help="processes on this machine (default 1)")
    parallel.add_argument("--master-port", type=positive, help="their rendezvous port (default: a free one)")
    parallel.add_argument(
        "--timeout",
        type=float_in(1e-3, 1e7, "seconds, up to about four months"),
        default=600.0,
        help="seconds a process waits for the others (default 600)",
    )
    parallel.add_argument(
        "--checkpoint-every",
        type=positive,
        default=defaults.checkpoint_every,
        help=f"steps between checkpoints of a split's training, resumed by a rerun (default "
        f"{defaults.checkpoint_every})",
    )
    uci.set_defaults(subparser=uci)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from tqdm.auto import tqdm

    tqdm.write(f"whvi uci: warning: {' '.join(str(message).splitlines())}", file=sys.stderr)


def run_uci_command(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch

    from ..train import distributed
    from ..train.engine import TrainingDiverged
    from ..train.folder_lock import FolderLocked
    from .auto_dropout import AUTO_DROPOUT, PAPER_DROPOUT
    from .memory_checks import check_uci_memory
    from .reporting import check_writable
    from .uci import check_source, check_validation, dataset_name, run_uci
    from .uci_protocols import BY_RESIDUALS

    source = args.data_dir if args.data_dir is not None else (args.dataset or "diabetes")
    timeout = timedelta(seconds=args.timeout)
    try:
        if distributed.init_from_environment(timeout=timeout):  # started by torchrun: its processes
            args.nproc = distributed.world_size()
        elif args.master_port is not None:
            distributed.check_port(args.master_port)
        check_device(args.device)
        if args.device != "cpu" and args.nproc > 1:
            raise ValueError(f"--device {args.device} trains in one process: drop --nproc {args.nproc} (or use cpu)")
        if args.threads and args.threads > (os.cpu_count() or 1):
            raise ValueError(f"--threads: at most {os.cpu_count()} (the cores here) expected, got {args.threads}")
        if args.cooldown is not None and not 0 <= args.cooldown < 1:
            raise ValueError(f"--cooldown: a fraction of the steps in [0, 1) expected (0: none), got {args.cooldown}")
        sizes = check_source(source, tuple(dict.fromkeys(args.splits)))
        if args.likelihood in ("heteroscedastic", BY_RESIDUALS) and sizes.outputs > 1:
            raise ValueError(f"--likelihood {args.likelihood} is for regression; {source} is a classification set")
        if sizes.outputs > 1:  # classification: the likelihood is categorical, whatever --likelihood
            args.likelihood, args.calibrate_noise = "gaussian", args.calibrate_noise.replace("auto", "off")
            args.dropout = PAPER_DROPOUT if args.dropout == AUTO_DROPOUT else args.dropout
        config = config_from_arguments(args, Path(source).name, sizes.train)
        check_uci_memory(config, sizes)
        check_validation(source, config, sizes)
        check_writable(args.out)
    except (ValueError, OSError) as error:
        args.subparser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            _, text = run_uci(
                source, config, args.out, port=args.master_port, timeout=timeout, threads=args.threads, check=False
            )
        except FolderLocked as error:  # another run is using --out: one line, nothing was touched
            print(f"whvi uci: error: {error}", file=sys.stderr)
            return 1
        except RuntimeError as error:  # a process failed or died: one line, the others are stopped
            if config.nproc == 1 or isinstance(error, TrainingDiverged):  # main reports it
                raise
            print(
                f"whvi uci: error: {error}; rerun the same command to resume from the last checkpoint", file=sys.stderr
            )
            return 1
    if distributed.rank() == 0:
        print("\n" + text)
        print(f"\nwrote {args.out}/uci_{dataset_name(source)}.{{json,csv,md}}")
    return 0
