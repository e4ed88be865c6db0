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
and raise an error naming its rank, and nothing here hangs on a dead peer. The processes :func:`launch` starts
die with it (Linux's parent-death signal, even when it is killed with ``SIGKILL``) and share its
:func:`~pyro_whvi.train.folder_lock.folder_lock`; Ctrl-C stops every one of them, and :func:`launch` raises
:class:`~pyro_whvi.train.stops.TrainingInterrupted` with the step, or a rank's
:class:`~pyro_whvi.train.stops.TrainingDiverged`, as one process would.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .folder_lock import held_lock, share_held_lock
from .stops import TrainingDiverged, TrainingInterrupted

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


_INTERRUPTED_EXIT = 130  # a rank stopped by Ctrl-C (128 + SIGINT, as a shell reports it)
_STOP_WAIT_S = 10.0  # how long interrupted ranks may take to stop before they are killed


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` (the launcher) dies, however it dies (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the signal was set
        os._exit(1)


def _stop_on_first_interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher forwards the Ctrl-C the group already got
    raise KeyboardInterrupt


def _worker(
    index: int,
    function: Callable[..., Any],
    args: tuple,
    nproc: int,
    port: int,
    device: str,
    timeout: float,
    threads: int,
    folder: str,
    parent: int,
    lock: str | None,
) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, _stop_on_first_interrupt)
    if lock is not None:
        share_held_lock(Path(lock))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(index), WORLD_SIZE=str(nproc))
    os.environ.update(LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(nproc))
    torch.set_num_threads(threads)
    try:
        if device == "cuda":
            torch.cuda.set_device(index % torch.cuda.device_count())
        dist.init_process_group(_backend(device), rank=index, world_size=nproc, timeout=timedelta(seconds=timeout))
        result = function(*args)
        if index == 0:  # a file, not a pipe: a pipe blocks a large result until the parent reads, after join
            torch.save(result, Path(folder) / "rank0.pt")
        dist.destroy_process_group()
    except BaseException as error:
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN or isinstance(error, KeyboardInterrupt):
            # Ctrl-C, however it surfaced here (a peer's exit can end a collective first): no traceback
            step = next((e.step for e in _chain(error) if isinstance(e, TrainingInterrupted)), "")
            (Path(folder) / f"rank{index}.interrupted").write_text(str(step))
            sys.exit(_INTERRUPTED_EXIT)  # not os._exit: the exit handlers release the rank's semaphores
        if isinstance(error, TrainingDiverged):  # handed to the caller as it was raised
            torch.save(error, Path(folder) / f"rank{index}.diverged")
        if dist.is_initialized():
            dist.destroy_process_group()
        raise


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


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
    lock = held_lock()
    with tempfile.TemporaryDirectory(prefix="pyro_whvi_launch_") as folder:
        shared = None if lock is None else str(lock)
        worker_args = (
            function,
            args,
            nproc,
            port,
            device,
            timeout.total_seconds(),
            threads,
            folder,
            os.getpid(),
            shared,
        )
        context = None
        try:
            context = mp.start_processes(_worker, args=worker_args, nprocs=nproc, join=False, start_method="spawn")
            while not context.join(grace_period=5.0):  # a failure stops the others: SIGTERM, SIGKILL 5 s later
                pass
        except KeyboardInterrupt:
            _stop_interrupted(context)
            raise _interruption(Path(folder), nproc) from None
        except mp.ProcessRaisedException as error:
            diverged = Path(folder) / f"rank{error.error_index}.diverged"
            if diverged.exists():
                raise torch.load(diverged, weights_only=False) from None  # our own rank's TrainingDiverged
            raise RuntimeError(f"rank {error.error_index} of {nproc} failed: {_last_error(str(error))}") from None
        except mp.ProcessExitedException as error:
            if error.exit_code == _INTERRUPTED_EXIT:  # Ctrl-C reached the ranks, not this process
                raise _interruption(Path(folder), nproc) from None
            how = f"was killed by {error.signal_name}" if error.signal_name else f"exited with status {error.exit_code}"
            raise RuntimeError(f"rank {error.error_index} of {nproc} {how}; the other ranks were stopped") from None
        return torch.load(Path(folder) / "rank0.pt", weights_only=False)  # written by our own rank 0 just now


def _stop_interrupted(context: mp.ProcessContext | None) -> None:
    """Pass Ctrl-C on to the ranks (a ``kill -INT`` may have reached this process alone), give them
    :data:`_STOP_WAIT_S` to stop, then kill the rest; a second Ctrl-C meanwhile is ignored."""
    if context is None:  # interrupted while starting them: the parent-death signal stops those started
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        processes = [process for process in context.processes if process.is_alive()]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + _STOP_WAIT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interruption(folder: Path, nproc: int) -> KeyboardInterrupt:
    """:class:`TrainingInterrupted` at the step rank 0 (or another rank) reached, if one was training."""
    for index in range(nproc):
        with contextlib.suppress(OSError, ValueError):
            return TrainingInterrupted(int((folder / f"rank{index}.interrupted").read_text()))
    return KeyboardInterrupt()


def _last_error(traceback: str) -> str:
    """The ``SomeError: message`` line of a child's traceback (the last one, if there are several)."""
    lines = traceback.strip().splitlines()
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b.*", line)]
    return (errors or lines)[-1]
