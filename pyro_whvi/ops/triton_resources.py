"""Static resources of the Triton kernels, without a GPU: registers, spills and shared memory from ``ptxas -v``
on the PTX that ``triton.compile`` emits for ``sm_<arch>`` (``benchmarks/gpu_kernels.py --static``)."""

from __future__ import annotations

from pathlib import Path

import torch

from .triton_backend import _compute_type, kernels

__all__ = ["resource_usage"]


def resource_usage(kernel_name: str, size: int, dtype: torch.dtype, arch: int = 90) -> dict[str, int]:
    """Registers per thread and spill bytes of a kernel compiled ahead of time for ``sm_<arch>`` (no GPU needed).

    Compiles with ``triton.compile`` for a CUDA target and reads ``ptxas -v`` (the assembler Triton ships).

    :returns: ``{"registers": ..., "spill_bytes": ..., "shared_bytes": ..., "warps": ...}``.
    """
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
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
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    binaries = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    assembler = binaries / "ptxas-blackwell" if (binaries / "ptxas-blackwell").exists() else binaries / "ptxas"
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        target = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        report = subprocess.run(
            [str(assembler), f"-arch={target}", "-v", str(ptx), "-o", os.devnull], capture_output=True, text=True
        )
    used = re.search(r"Used (\d+) registers", report.stderr)
    if report.returncode or used is None:
        raise RuntimeError(f"ptxas failed on {kernel_name} (D={size}, {dtype}, sm_{arch}): {report.stderr[-500:]}")
    spills = sum(int(count) for count in re.findall(r"(\d+) bytes spill", report.stderr))
    shared = int(getattr(compiled.metadata, "shared", 0))
    return {"registers": int(used.group(1)), "spill_bytes": spills, "shared_bytes": shared, "warps": warps}
