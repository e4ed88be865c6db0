r"""Processes for data-parallel training on ``torch.distributed``: start them, join them, fail cleanly.

Two ways to get a process group, and :mod:`pyro_whvi.train.engine` trains in either:

* :func:`launch` starts ``nproc`` processes on this machine (``torch.multiprocessing``, spawned) on a
  loopback rendezvous, each with ``gloo`` (CPU) or ``nccl`` (one GPU per process), and returns rank 0's
  result. ``whvi uci --nproc N`` uses it.
* Under ``torchrun`` (several machines, or GPUs managed by the launcher) :func:`init_from_environment`
  joins the group that ``torchrun`` describes in ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``::

      torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
          -m pyro_whvi uci --data-dir DIR ...

Every collective has a timeout (``timeout``), a process that dies makes :func:`launch` stop the others
and raise an error naming its rank, and nothing here hangs on a dead peer.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["DEFAULT_TIMEOUT", "free_port", "init_from_environment", "launch", "rank", "world_size"]

DEFAULT_TIMEOUT = timedelta(minutes=10)


def world_size() -> int:
    """Processes in the default group (1 when there is none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 when there is none)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """A ``ValueError`` naming ``port`` when it is out of range or already in use on ``host``."""
    if not 0 < port < 65536:
        raise ValueError(f"master port must be in 1-65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"master port {port} on {host} is in use ({error.strerror}); choose another one, or leave it out to "
                "get a free port"
            ) from None


def _backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def init_from_environment(device: str = "cpu", timeout: timedelta = DEFAULT_TIMEOUT) -> bool:
    """Join the process group ``torchrun`` describes in the environment; ``False`` if there is none.

    :param device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl, the GPU ``LOCAL_RANK`` becomes current).
    """
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(_backend(device), timeout=timeout)
    return True


def _worker(
    index: int,
    function: Callable[..., Any],
    args: tuple,
    nproc: int,
    port: int,
    device: str,
    timeout: float,
    threads: int,
    results: str,
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(index), WORLD_SIZE=str(nproc))
    os.environ.update(LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(nproc))
    torch.set_num_threads(threads)
    if device == "cuda":
        torch.cuda.set_device(index % torch.cuda.device_count())
    dist.init_process_group(_backend(device), rank=index, world_size=nproc, timeout=timedelta(seconds=timeout))
    try:
        result = function(*args)
        if index == 0:  # a file, not a pipe: a pipe blocks a large result until the parent reads, after join
            torch.save(result, results)
    finally:
        dist.destroy_process_group()


def launch(
    function: Callable[..., Any],
    nproc: int,
    *args: Any,
    device: str = "cpu",
    port: int | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    threads: int | None = None,
) -> Any:
    """Run ``function(*args)`` in ``nproc`` new processes joined in one process group; rank 0's result.

    The processes are spawned (``function`` and ``args`` must be picklable: a module-level function).
    ``nproc == 1`` runs ``function`` here, without a group.

    :param device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl, process ``i`` on GPU ``i``).
    :param port: the rendezvous port on 127.0.0.1 (default: a free one).
    :param timeout: the longest any collective (and the rendezvous) may wait for the other ranks.
    :param threads: torch threads per process (default: the cores divided among the processes).
    :raises RuntimeError: naming the rank when a process fails or dies; the others are stopped.
    """
    if nproc < 1:
        raise ValueError(f"launch: nproc >= 1 expected, got {nproc}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"launch: device 'cpu' or 'cuda' expected, got {device!r}")
    if device == "cuda" and torch.cuda.device_count() < nproc:
        raise ValueError(f"launch: {nproc} processes need {nproc} GPUs, this machine has {torch.cuda.device_count()}")
    if nproc == 1:
        return function(*args)
    if port is None:
        port = free_port()
    else:
        check_port(port)
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    with tempfile.TemporaryDirectory(prefix="pyro_whvi_launch_") as folder:
        results = Path(folder) / "rank0.pt"
        worker_args = (function, args, nproc, port, device, timeout.total_seconds(), threads, str(results))
        try:
            context = mp.start_processes(_worker, args=worker_args, nprocs=nproc, join=False, start_method="spawn")
            while not context.join(grace_period=5.0):  # a failure stops the others: SIGTERM, SIGKILL 5 s later
                pass
        except mp.ProcessRaisedException as error:
            raise RuntimeError(f"rank {error.error_index} of {nproc} failed: {_last_error(str(error))}") from None
        except mp.ProcessExitedException as error:
            how = f"was killed by {error.signal_name}" if error.signal_name else f"exited with status {error.exit_code}"
            raise RuntimeError(f"rank {error.error_index} of {nproc} {how}; the other ranks were stopped") from None
        return torch.load(results, weights_only=False)  # written by our own rank 0 just now


def _last_error(traceback: str) -> str:
    """The ``SomeError: message`` line of a child's traceback (the last one, if there are several)."""
    lines = traceback.strip().splitlines()
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*", line)]
    return (errors or lines)[-1]
