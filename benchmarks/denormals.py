"""What subnormal floats cost a MAP step of a wide network on the CPU, and what flushing them to zero gives back.

MC dropout (``whvi uci --methods mcd``: a ``BayesianMLP`` with dropout 0.005, Pyro's ``AutoDelta``, the weights'
``N(0, 1/fan_in)`` prior as weight decay) at the ``wide`` protocol (2 x 1024, Adam 3e-3, a mean-variance head) on
the synthetic robot arm (``whvi synthetic``'s function, 20,000 rows, 90% to train). Plain Pyro ``SVI`` trains it
``--pretrain-steps`` steps with the CPU's default (subnormals kept), which lets the weights into dead ReLU units
decay into the subnormal range; the script reports how many are there. From that same state (the guide's and
Adam's state restored before every round) it then times ``--timed-steps`` steps with subnormals kept and with them
flushed (:func:`pyro_whvi.train.denormals.flush_denormals`, what ``pyro_whvi.train`` trains under), alternating,
``--rounds`` times, and reports the median milliseconds a step and their ratio. Usage::

    python benchmarks/denormals.py --threads 1 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyro
import torch
from _results import environment, save_tables
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import PyroOptim
from tqdm import tqdm

from pyro_whvi.experiments.methods import build_method
from pyro_whvi.experiments.noisy_sets import write_noisy_set
from pyro_whvi.experiments.uci_data import load_dataset_split
from pyro_whvi.train.denormals import flush_denormals

WIDTHS = [8, 1024, 1024, 1]  # the robot arm's 8 inputs, the wide protocol's network
SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def subnormal_fraction(tensors: list[torch.Tensor]) -> float:
    count = sum(int(((t != 0) & (t.abs() < SMALLEST_NORMAL)).sum()) for t in tensors)
    return count / sum(t.numel() for t in tensors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-steps", type=int, default=2000)
    parser.add_argument("--timed-steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if min(args.pretrain_steps + 1, args.timed_steps, args.rounds) < 1:
        parser.error("--timed-steps and --rounds expected >= 1, --pretrain-steps >= 0")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(False)  # the CPU's default: subnormals kept
    pyro.set_rng_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        write_noisy_set("robot", Path(folder) / "robot", num_points=20_000, splits=1, seed=0)
        data = load_dataset_split(Path(folder) / "robot", 0)
    x, y = data.x_train.float(), data.y_train.float()
    model, guide = build_method("mcd", WIDTHS, likelihood="heteroscedastic")
    svi = SVI(model, guide, PyroOptim(torch.optim.Adam, {"lr": 3e-3}), Trace_ELBO())
    generator = torch.Generator().manual_seed(0)

    def steps(count: int, label: str) -> float:
        start = time.perf_counter()
        for _ in tqdm(range(count), desc=label, leave=False):
            batch = torch.randint(len(x), (64,), generator=generator)
            svi.step(x[batch], y[batch], num_data=len(x))
        return (time.perf_counter() - start) / count * 1e3

    steps(args.pretrain_steps, "pretraining, subnormals kept")
    weights = [p.detach() for p in guide.parameters()]
    fraction = subnormal_fraction(weights)
    state = copy.deepcopy((guide.state_dict(), svi.optim.get_state()))
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for flush in (False, True):
            guide.load_state_dict(state[0])
            svi.optim.set_state(copy.deepcopy(state[1]))
            label = f"round {round_}, subnormals {'flushed' if flush else 'kept'}"
            with flush_denormals() if flush else contextlib.nullcontext():
                times[flush].append(steps(args.timed_steps, label))
    kept, flushed = statistics.median(times[False]), statistics.median(times[True])
    rows: list[dict[str, Any]] = [
        {"subnormals": "kept", "ms_per_step": kept, "rounds_ms": times[False], "ratio_to_flushed": kept / flushed},
        {"subnormals": "flushed", "ms_per_step": flushed, "rounds_ms": times[True], "ratio_to_flushed": 1.0},
    ]
    text = "\n".join(
        [
            f"MC dropout, {WIDTHS} ReLU with a mean-variance head, the robot arm, after {args.pretrain_steps:,} Adam "
            f"(3e-3) steps of plain Pyro SVI with subnormals kept: {fraction:.1%} of the guide's weights are "
            f"subnormal. Median of {args.rounds} rounds of {args.timed_steps} steps from that state, "
            f"{torch.get_num_threads()} thread(s):",
            "",
            "| subnormals | ms a step | rounds (ms) | ratio to flushed |",
            "|---|---|---|---|",
            *(
                f"| {r['subnormals']} | {r['ms_per_step']:.1f} | {', '.join(f'{t:.1f}' for t in r['rounds_ms'])}"
                f" | {r['ratio_to_flushed']:.2f}x |"
                for r in rows
            ),
        ]
    )
    save_tables(
        args.out,
        "denormals",
        environment(subnormal_fraction=fraction, **vars(args) | {"out": str(args.out)}),
        rows,
        text,
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
