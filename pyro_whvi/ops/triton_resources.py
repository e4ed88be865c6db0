"""Static resources of the Triton kernels, without a GPU: registers, spills and shared memory from ``ptxas -v``
on the PTX that ``triton.compile`` emits for ``sm_<arch>`` (``benchmarks/gpu_kernels.py --static``)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from .triton_backend import _compute_type, kernels

__all__ = ["resource_usage"]

#: The kernel metadata entry that holds the ``ptxas -v`` report (kept in Triton's cache with the kernel).
_REPORT = "pyro_whvi_ptxas_report"


class _PtxasError(RuntimeError):
    """``ptxas`` failed on the PTX (its stderr is the message)."""


def _assembler() -> Path:
    """The ``ptxas`` Triton ships (``ptxas-blackwell`` where it has one: it assembles every architecture)."""
    import triton

    binaries = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return binaries / "ptxas-blackwell" if (binaries / "ptxas-blackwell").exists() else binaries / "ptxas"


@functools.cache
def _assembler_version(assembler: Path) -> str:
    result = subprocess.run([str(assembler), "--version"], capture_output=True, text=True)
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "unknown"


def _ptxas(ptx: str, arch: int, cubin: bool) -> tuple[str, bytes]:
    """``ptxas -arch=sm_<arch> -v`` on ``ptx``: its report (stderr) and, if ``cubin``, the assembled binary."""
    target = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as folder:
        source, binary = Path(folder) / "kernel.ptx", Path(folder) / "kernel.cubin"
        source.write_text(ptx)
        output = str(binary) if cubin else os.devnull
        report = subprocess.run(
            [str(_assembler()), f"-arch={target}", "-v", str(source), "-o", output], capture_output=True, text=True
        )
        if report.returncode:
            raise _PtxasError(report.stderr[-500:])
        return report.stderr, binary.read_bytes() if cubin else b""


def _compile_with_report(source, arch: int, warps: int):
    """``triton.compile`` for ``sm_<arch>`` and the ``ptxas -v`` report of its PTX, from one assembler run.

    Where Triton has ``knobs.runtime.add_stages_inspection_hook``, the compile's cubin stage is that ``ptxas -v``
    run (the binary it writes is the kernel's) and the report goes into the kernel's metadata: the pipeline's
    key changes with the hook, so Triton caches these kernels apart from its own, report included, and a cached
    kernel needs no assembler at all. Without the hook, ``ptxas -v`` runs again on the compiled PTX."""
    import triton
    from triton.backends.compiler import GPUTarget

    target, options = GPUTarget("cuda", arch, 32), {"num_warps": warps}
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "add_stages_inspection_hook"):
        compiled = triton.compile(source, target=target, options=options)
        return compiled, _ptxas(compiled.asm["ptx"], arch, cubin=False)[0]
    previous = runtime.add_stages_inspection_hook
    key = f"pyro_whvi:ptxas -v:{_assembler().name}:{_assembler_version(_assembler())}"

    def assemble(ptx: str, metadata: dict) -> bytes:
        report, binary = _ptxas(ptx, arch, cubin=True)
        metadata[_REPORT] = report
        return binary

    def hook(backend=None, stages=None, options=None, language=None, capability=None):
        if backend is None:  # the key of this pipeline (after any hook already installed)
            earlier = previous() if previous is not None else ("", "")
            full = earlier[0] + key
            return full, hashlib.sha256(full.encode()).hexdigest()
        if previous is not None:
            previous(backend, stages, options, language, capability)
        stages["cubin"] = assemble

    runtime.add_stages_inspection_hook = hook
    try:
        compiled = triton.compile(source, target=target, options=options)
    finally:
        runtime.add_stages_inspection_hook = previous
    report = getattr(compiled.metadata, _REPORT, None)
    return compiled, report if report is not None else _ptxas(compiled.asm["ptx"], arch, cubin=False)[0]


def resource_usage(kernel_name: str, size: int, dtype: torch.dtype, arch: int = 90) -> dict[str, int]:
    """Registers per thread and spill bytes of a kernel compiled ahead of time for ``sm_<arch>`` (no GPU needed).

    Compiles with ``triton.compile`` for a CUDA target and reads ``ptxas -v`` (the assembler Triton ships). The
    report is cached with the kernel in Triton's cache (see ``_compile_with_report``).

    :returns: ``{"registers": ..., "spill_bytes": ..., "shared_bytes": ..., "warps": ...}``.
    """
    from triton.compiler import ASTSource

    module = kernels()
    if module is None:
        raise RuntimeError("resource_usage needs Triton: pip install triton.")
    element = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}[dtype]
    function = getattr(module, kernel_name)
    constants = {
        "ROWS": module.rows_per_program(size, dtype == torch.float64),
        "D": size,
        "LOG_D": size.bit_length() - 1,
        "COMPUTE": _compute_type(dtype),
        "POWER": 1,
        "CHUNK": module.design_chunk(kernel_name, size, dtype == torch.float64),
    }
    constants = {name: value for name, value in constants.items() if name in function.arg_names}

    def kind(name: str) -> str:
        scalars = {"n_rows": "i32", "n_blocks": "i32"}
        if name in constants:
            return "constexpr"
        if name in scalars:
            return scalars[name]
        integer = name.endswith("_rows") or name in ("permutation_ptr", "inverse_ptr")  # index tables
        if name == "z_ptr":  # the design backward's scratch row, in the compute type
            return "*fp64" if dtype == torch.float64 else "*fp32"
        return "*i64" if integer else f"*{element}"

    signature = {name: kind(name) for name in function.arg_names}
    warps = module.num_warps(kernel_name, size) if "ROWS" in constants else module.design_warps(size)
    source = ASTSource(fn=function, signature=signature, constexprs=constants)
    try:
        compiled, report = _compile_with_report(source, arch, warps)
    except _PtxasError as error:
        raise RuntimeError(f"ptxas failed on {kernel_name} (D={size}, {dtype}, sm_{arch}): {error}") from None
    used = re.search(r"Used (\d+) registers", report)
    if used is None:
        raise RuntimeError(f"ptxas failed on {kernel_name} (D={size}, {dtype}, sm_{arch}): {report[-500:]}")
    spills = sum(int(count) for count in re.findall(r"(\d+) bytes spill", report))
    shared = int(getattr(compiled.metadata, "shared", 0))
    return {"registers": int(used.group(1)), "spill_bytes": spills, "shared_bytes": shared, "warps": warps}
