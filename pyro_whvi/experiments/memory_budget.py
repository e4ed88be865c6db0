"""How much memory a ``whvi`` command will need, checked before anything is allocated.

Every size that multiplies into memory (hidden units, layers, features, batch, posterior samples times test
rows, steps, rows of a written set, random features) enters one estimate per command; :func:`check_memory`
compares it with what the machine has free (:func:`available_memory`) and, when it does not fit, names the
flag that weighs most, the estimate, what is available and the largest value of that flag that fits.

The estimates are upper bounds calibrated on CPU runs (peak RSS with 2x256 to 2x2048 networks): training
holds up to :data:`TRAINING_VALUES` values per dense weight (a mean-field guide's locations and scales,
their gradients and Adam's two moments, the prior, the sampled weights; 74 for a full-covariance
``q(g)``; a deep ensemble trains its :data:`ENSEMBLE_SIZE` networks one at a time and keeps the finished ones'
``KEPT_VALUES``), and each posterior sample drawn by ``Predictive`` keeps up to :data:`SAMPLE_VALUES` values per
weight until the predictions are stacked. Prediction runs in chunks of samples
(:func:`prediction_chunk`), so only the stacked predictions grow with the number of samples.
"""

from __future__ import annotations

import itertools
import math
import resource
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = [
    "ENSEMBLE_SIZE",
    "MAX_SAMPLES",
    "MAX_STEPS",
    "available_memory",
    "check_memory",
    "dense_weights",
    "format_bytes",
    "mlp_bytes",
    "mlp_weights",
    "prediction_chunk",
]

#: The most optimizer steps a command takes: every step's loss is kept in memory and in each checkpoint, and
#: 10^7 steps are 200 times the WHVI paper's 50,500 (over a day at 10 ms a step).
MAX_STEPS = 10**7
#: The most posterior samples a command predicts with: the Monte-Carlo error of the predictive shrinks as
#: 1/sqrt(S), so 10^6 samples resolve it to 0.1% of one sample's spread, and each sample is one forward pass.
MAX_SAMPLES = 10**6
#: The networks of a deep ensemble (``--methods ensemble``), as Lakshminarayanan et al. (2017) use (§3.3).
ENSEMBLE_SIZE = 5
DEFAULT_TRAINING_VALUES = 32
KEPT_VALUES = 2  # values per dense weight of a trained point estimate kept for predicting: it and its last gradient
# Values per dense weight (of one network) while training; others: DEFAULT_TRAINING_VALUES. The ensemble: one
# member training, the others kept.
TRAINING_VALUES = {"whvi-full": 80, "ensemble": DEFAULT_TRAINING_VALUES + (ENSEMBLE_SIZE - 1) * KEPT_VALUES}
SAMPLE_VALUES = 6  # values per dense weight that one posterior sample keeps while predicting
ACTIVATION_VALUES = 16  # values per unit and example of a minibatch (forward, backward, the noise draws)
PREDICTION_COPIES = 5  # the stacked predictions and the metrics' temporaries of their size
LOSS_BYTES = 48  # one step's loss: a Python float in a list, and its copy in a checkpoint
MAX_CHUNK_SAMPLES = 1000  # more samples than this are drawn in chunks, with a progress bar
CHUNK_BYTES = 2 * 2**30  # the most one chunk of samples may hold
PROCESS_BYTES = 300 * 10**6  # a started process with PyTorch and Pyro imported (--nproc)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _cgroup_available() -> int | None:
    """What a cgroup v2 memory limit (a container's) leaves this process's group, if there is one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None


def _address_space_available() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) leaves this process, if it is set."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        used = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
    return limit - used


def available_memory() -> int | None:
    """Bytes this process can still allocate: ``MemAvailable`` of ``/proc/meminfo`` (psutil's figure where there
    is no ``/proc``), lowered by a cgroup memory limit or ``ulimit -v`` when one is set; ``None`` if unknown."""
    known = [bytes_ for bytes_ in (_meminfo_available(), _cgroup_available(), _address_space_available()) if bytes_]
    return max(0, min(known)) if known else None


def format_bytes(count: float) -> str:
    """``1.5 GB``, ``12 MB``, ``3.2 TB``: decimal units, two or three significant digits."""
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"


def _largest_fitting(estimate: Callable[[int], float], high: int, limit: float) -> int:
    """The largest value in ``[1, high]`` whose ``estimate`` is within ``limit`` (0 if none): a bisection,
    ``estimate`` being non-decreasing in the value."""
    if estimate(1) > limit:
        return 0
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if estimate(middle) <= limit else (low, middle - 1)
    return low


def check_memory(
    estimate: Callable[[Mapping[str, int]], float],
    sizes: Mapping[str, int],
    what: str,
    available: int | None = None,
) -> None:
    """Raise a one-line ``ValueError`` when ``estimate(sizes)`` bytes exceed the available memory.

    :param estimate: bytes needed for flag values ``sizes`` (non-decreasing in each).
    :param sizes: each size flag (``"--hidden"``) and its value.
    :param what: what the memory is for (``"training and predicting"``), for the message.
    :param available: bytes available (default :func:`available_memory`; unknown: nothing is checked).
    """
    available = available_memory() if available is None else available
    need = estimate(sizes)
    if available is None or need <= available:
        return
    # The flag whose reduction to 1 saves the most, and the largest value of it that fits.
    savings = {flag: need - estimate({**sizes, flag: 1}) for flag, value in sizes.items() if value > 1}
    if not savings:
        raise ValueError(
            f"{what} needs about {format_bytes(need)} of memory even at the smallest sizes, {format_bytes(available)} "
            "available; run on a machine with more memory"
        )
    flag = max(savings, key=lambda name: savings[name])
    largest = _largest_fitting(lambda value: estimate({**sizes, flag: value}), sizes[flag], available)
    fix = f"choose {flag} {largest} or less" if largest else f"lower {flag} and " + ", ".join(set(savings) - {flag})
    raise ValueError(
        f"{flag} {sizes[flag]}: {what} needs about {format_bytes(need)} of memory, {format_bytes(available)} "
        f"available; {fix} (or free memory)"
    )


def dense_weights(widths: list[int]) -> int:
    """Weights and biases of a dense network of layer ``widths`` (the Bayesian networks hold their priors and
    sample their weights at this size, whatever the guide)."""
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in itertools.pairwise(widths))


def mlp_weights(features: int, hidden: int, layers: int, outputs: int) -> int:
    """:func:`dense_weights` of ``[features, hidden x layers, outputs]``, in closed form (``layers`` may be huge)."""
    if layers == 0:
        return (features + 1) * outputs
    return (features + 1) * hidden + (layers - 1) * (hidden + 1) * hidden + (hidden + 1) * outputs


def mlp_bytes(
    methods: tuple[str, ...],
    weights: int,
    units: int,
    *,
    batch: int,
    samples: int,
    test_rows: int,
    outputs: int,
    steps: int,
    itemsize: int,
    processes: int = 1,
) -> float:
    """Bytes to train a Bayesian MLP of ``weights`` parameters (:func:`mlp_weights`, plus any flows' or
    Householder vectors') and ``units`` inputs, hidden units and outputs with the costliest of ``methods``, and
    to predict ``samples`` posterior samples of its ``outputs`` on ``test_rows`` rows.

    :param weights: one network's, for an ensemble (``"ensemble"``) one member's with its mean-variance head.
    :param batch: the examples of a minibatch (the whole training set for full batches).
    :param processes: processes that train a copy each (data-parallel ranks); one of them predicts.
    """
    per_weight = max(TRAINING_VALUES.get(method.split("+")[0], DEFAULT_TRAINING_VALUES) for method in methods)
    training = per_weight * weights + ACTIVATION_VALUES * batch * units
    losses = LOSS_BYTES * steps
    if "ensemble" in methods:  # its members' means and standard deviations are the predictions
        samples = max(samples, 2 * ENSEMBLE_SIZE)
        losses *= 2  # a member's losses and the members' running sum
    chunk = prediction_chunk(samples, weights, itemsize)
    predicting = chunk * SAMPLE_VALUES * weights + PREDICTION_COPIES * samples * test_rows * outputs
    return processes * (itemsize * training + losses) + itemsize * predicting


def prediction_chunk(samples: int, weights: int, itemsize: int) -> int:
    """How many posterior samples of a network of ``weights`` dense weights to draw at once: all of them when
    they fit in :data:`CHUNK_BYTES` (a quarter of the available memory if that is less) and number at most
    :data:`MAX_CHUNK_SAMPLES`."""
    per_sample = SAMPLE_VALUES * weights * itemsize
    budget = CHUNK_BYTES
    available = available_memory()
    if available is not None:
        budget = min(budget, available // 4)
    return max(1, min(samples, MAX_CHUNK_SAMPLES, math.floor(budget / max(per_sample, 1))))
