"""Per-epoch training time of VSD relative to the deterministic network (VSD paper Table 2).

Every method trains the same Pyro model with Pyro's SVI on digits (1,258 training images, batches
of 100): the deterministic network is a point estimate (``AutoDelta``), VSD is ``AutoVSDGuide``
with T = 0 (Gaussian dropout with the empirical-Bayes KL), 1 and 2, and ``AutoNormal`` is shown for
context. Epochs are timed interleaved across methods, best of ``--repeats``; the ratio to the
deterministic network in the same run is the result (the paper: 1.25x-1.5x for T = 1-2 on
LeNet/AlexNet on a GPU).

    python benchmarks/vsd_speed.py

Writes ``vsd_speed.{json,csv,md}`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_sample
from pyro.optim import PyroOptim
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, save_tables

from pyro_whvi import AutoVSDGuide
from pyro_whvi.data import load_digits_split
from pyro_whvi.nn import BayesianCNN, BayesianMLP
from pyro_whvi.train.engine import Minibatches

METHODS = {
    "deterministic": lambda m: AutoDelta(m, init_loc_fn=init_to_sample),
    "vsd T=0": lambda m: AutoVSDGuide(m, reflections=0),
    "vsd T=1": lambda m: AutoVSDGuide(m, reflections=1),
    "vsd T=2": lambda m: AutoVSDGuide(m, reflections=2),
    "mean-field": lambda m: AutoNormal(m, init_loc_fn=init_to_sample),
}
NETWORKS = {
    "cnn 32-64-128": (lambda: BayesianCNN(channels=(32, 64), hidden=128), True),
    "mlp 400x2": (lambda: BayesianMLP([64, 400, 400, 10], likelihood="categorical"), False),
}


def epoch_timer(network: str, method: str, data, batch_size: int):
    make_model, _ = NETWORKS[network]
    pyro.set_rng_seed(0)
    model = make_model()
    guide = METHODS[method](model)
    # Each method keeps its own parameters: a private param store, swapped in while it runs.
    store = pyro.poutine.runtime._PYRO_PARAM_STORE
    state: Any = {"params": {}, "constraints": {}}
    store.set_state(state)
    svi = SVI(model, guide, PyroOptim(torch.optim.Adam, {"lr": 1e-3}), Trace_ELBO())
    num = len(data.y_train)
    batches = Minibatches(num, batch_size, seed=None, replacement=False, drop_last=False)
    per_epoch = -(-num // batch_size)

    def run_epoch() -> float:
        store.set_state(state)
        start = time.perf_counter()
        for _ in range(per_epoch):
            batch = next(batches)
            svi.step(data.x_train[batch], data.y_train[batch], num_data=num)
        seconds = time.perf_counter() - start
        state.update(store.get_state())
        return seconds

    run_epoch()  # warm-up: set-up, first-call costs
    return run_epoch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed epochs per method (best is kept)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--networks", default=",".join(NETWORKS), help=f"comma separated, from {list(NETWORKS)}")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float32)
    rows = []
    for network in [n for n in args.networks.split(",") if n]:
        data = load_digits_split(images=NETWORKS[network][1], dtype=torch.float32)
        timers = {method: epoch_timer(network, method, data, args.batch_size) for method in METHODS}
        best = {method: float("inf") for method in METHODS}
        for _ in tqdm(range(args.repeats), desc=network):
            for method, timer in timers.items():
                best[method] = min(best[method], timer())
        for method in METHODS:
            ratio = best[method] / best["deterministic"]
            rows.append({"network": network, "method": method, "epoch_seconds": best[method], "ratio": ratio})
    lines = [
        "| network | method | epoch (s) | × deterministic |",
        "|---|---|---|---|",
        *(f"| {r['network']} | {r['method']} | {r['epoch_seconds']:.3f} | {r['ratio']:.2f} |" for r in rows),
    ]
    text = "\n".join(lines)
    save_tables(args.out, "vsd_speed", environment(), rows, text)
    print(text)


if __name__ == "__main__":
    main()
