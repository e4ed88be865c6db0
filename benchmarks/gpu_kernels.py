"""Time the Triton GPU kernels of every op, forward and backward, against a copy, the reference and cuBLAS.

For D = 2^4 ... 2^15, float32, bfloat16 and float16, on one CUDA device, one run:

* the ops ``fwht``, ``whvi_matvec`` (one ``g`` per row, the local reparameterization's layout),
  ``fastfood`` (one block) and ``whvi_design`` (``D x D`` matrices; D <= 8192, the fused kernels' limit),
  each forward and forward + backward (``torch.autograd.grad`` with a random output gradient: the
  CUDA dispatch's backward kernels; ``fwht``'s gradient is ``fwht``, ``fastfood``'s ``fastfood_transpose``);
* the copy floor: ``torch.clone`` of the op's main input, timed in the same run. The bytes an op moves
  (each operand read once, each result written once, as the kernels are designed: ``fwht`` 2 N D elements
  forward and 4 forward + backward; ``whvi_matvec`` 3 and 10 (the backward writes four per-row products);
  ``fastfood`` 2 and 4; ``whvi_design`` n D^2 + n D and 3 n D^2 + 2 n D) over the copy's bandwidth give the
  op's floor; the table gives the op's GB/s and its time as a fraction of that floor (1.0: at the copy's speed);
* ``fwht_`` in place on a buffer of the same rows (the same bytes as the out-of-place call, no output allocated);
* the pure-PyTorch reference (``pyro_whvi.ops.reference``) on the same inputs, forward and forward + backward;
* a dense ``x @ W.T`` with a ``D x D`` weight (cuBLAS; D <= ``--dense-max-log2-d``, default 13: at 2^15 the
  weight alone is 4 GB and one step ~0.5 s), forward and forward + backward, beside the row ops;
* Dao-AILab's ``fast_hadamard_transform`` beside ``fwht`` when it is importable (a CUDA extension).

Every op is also checked against the float64 reference on fresh random inputs (64 rows, or 4 matrices), its
output and every gradient, with the tolerances of the interpreter checks (``tests/ops/test_triton_kernels.py``:
relative to max(1, max|reference|), 2e-6 in float32, 2e-3 in float16, 1.6e-2 in bfloat16; gradients of the half
types 5e-2); the first and last rows of the timed batch are checked too (the last program's partial tail). A NaN
fails. The table's ``ok`` column says which passed; ``--strict`` makes any failure the exit status 1.

Each main input holds ``--elements`` entries (default 2^26: 256 MB in float32, several times the L2 of an
H100 or H200, so no timing reads from the cache), so N = elements / D rows (n = elements / D^2 matrices).
Times are medians of ``torch.utils.benchmark`` blocked runs (its timer synchronizes CUDA), after a warm-up
call (Triton compiles there). The Triton kernels each op launched are recorded (``kernels``). Results go to
``--out`` as JSON, CSV and markdown (``gpu_kernels.*``).

``--device cpu`` rehearses the same code on the CPU (the compiled C++ kernels or the reference: no Triton,
no GPU), for small sizes: ``benchmarks/gpu_check.sh --rehearse`` runs it so that the GPU run does not fail on
a typo. Its times say nothing about a GPU.

    python benchmarks/gpu_kernels.py            # on a machine with a CUDA GPU (also: whvi bench fwht --device cuda)
    python benchmarks/gpu_kernels.py --static   # anywhere with Triton: registers, spills, shared memory, byte floors
    python benchmarks/gpu_kernels.py --device cpu --max-log2-d 7 --elements 4096 --min-run-time 0.01   # rehearsal
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

from pyro_whvi import ops
from pyro_whvi.ops import reference, triton_backend, triton_resources

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_tables

OPS = ("fwht", "whvi_matvec", "fastfood", "whvi_design")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The interpreter checks' tolerances (tests/ops/test_triton_kernels.py), relative to max(1, max|reference|).
TOLERANCE = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-2, torch.bfloat16: 5e-2}
DESIGN_MAX = 8192  # whvi_design's fused kernels stop here (the reference above)
CHECK_ROWS = 64


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(min_run_time: float, device: torch.device, fn: Callable[..., Any], *args: Any) -> float:
    """Milliseconds per ``fn(*args)``: the median of blocked runs after one warm-up call."""
    fn(*args)  # compile / warm up
    _synchronize(device)
    timer = benchmark.Timer(stmt="fn(*args)", globals={"fn": fn, "args": args})
    return float(timer.blocked_autorange(min_run_time=min_run_time).median) * 1e3


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def _forward_backward(op: Callable[..., torch.Tensor], leaves: list[torch.Tensor], grad: torch.Tensor, *inputs):
    """``op(*inputs)`` and the gradients of ``leaves`` for the output gradient ``grad`` (no accumulation)."""
    return torch.autograd.grad(op(*inputs), leaves, grad)


@contextlib.contextmanager
def _recording(device: torch.device) -> Iterator[list[str]]:
    """The names of the Triton kernels launched inside (none on the CPU)."""
    launched: list[str] = []
    module = triton_backend.kernels() if device.type == "cuda" else None
    if module is None:
        yield launched
        return
    saved = {name: getattr(module, name) for name in triton_backend.KERNELS}

    class Recorder:
        def __init__(self, kernel: Any, name: str):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid: Any) -> Any:
            launched.append(self.name)
            return self.kernel[grid]

    for name, kernel in saved.items():
        setattr(module, name, Recorder(kernel, name))
    try:
        yield launched
    finally:
        for name, kernel in saved.items():
            setattr(module, name, kernel)


class Case:
    """One op at one D and dtype: its inputs (``leaves`` are differentiated), its op and its reference."""

    def __init__(self, op: str, size: int, count: int, dtype: torch.dtype, device: torch.device, seed: int):
        generator = torch.Generator().manual_seed(seed)

        def draw(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device, dtype)

        self.op_name, self.size, self.count, self.dtype = op, size, count, dtype
        self.tables: list[torch.Tensor] = []  # inputs that are not differentiated
        self.fn: Callable[..., torch.Tensor]
        self.reference: Callable[..., torch.Tensor]
        self.floor_elements: tuple[int, int]
        if op == "fwht":
            self.fn, self.reference = ops.fwht, reference.fwht
            self.leaves = [draw(count, size)]
            self.floor_elements = (2 * count * size, 4 * count * size)
        elif op == "whvi_matvec":
            self.fn, self.reference = ops.whvi_matvec, reference.whvi_matvec
            self.leaves = [draw(count, size), draw(size), draw(count, size), draw(size)]
            self.floor_elements = (3 * count * size, 10 * count * size)
        elif op == "fastfood":
            self.fn, self.reference = ops.fastfood, reference.fastfood
            signs = (torch.randint(0, 2, (1, size), generator=generator) * 2 - 1).to(device, dtype)
            permutation = torch.argsort(torch.rand(1, size, generator=generator), dim=-1).to(device)
            self.leaves = [draw(count, size)]
            self.tables = [signs, permutation, draw(1, size), draw(1, size)]
            self.floor_elements = (2 * count * size, 4 * count * size)
        elif op == "whvi_design":
            self.fn, self.reference = ops.whvi_design, reference.whvi_design
            self.leaves = [draw(count, size, size), draw(size), draw(size)]
            matrices = count * size * size
            self.floor_elements = (matrices + count * size, 3 * matrices + 2 * count * size)
        else:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
        for leaf in self.leaves:
            leaf.requires_grad_(True)
        self.inputs = [*self.leaves, *self.tables]
        with torch.no_grad():
            output = self.forward()
        self.grad = draw(*output.shape)

    def forward(self, fn: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        return (fn or self.fn)(*self.inputs)

    def forward_backward(self, fn: Callable[..., torch.Tensor] | None = None):
        return _forward_backward(fn or self.fn, self.leaves, self.grad, *self.inputs)

    def double(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The leaves and tables in float64 (the permutation stays int64), leaves differentiable."""
        leaves = [leaf.detach().double().requires_grad_(True) for leaf in self.leaves]
        tables = [t if t.dtype == torch.int64 else t.double() for t in self.tables]
        return leaves, tables


def _error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|actual - expected| / max(1, max|expected|); NaN or inf anywhere: inf."""
    actual, expected = actual.double(), expected.double()
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    if actual.numel() == 0:
        return 0.0
    scale = max(1.0, expected.abs().max().item())
    return (actual - expected).abs().max().item() / scale


def check(case: Case) -> dict[str, float]:
    """Relative errors of the op (output, then each leaf's gradient) against the float64 reference."""
    leaves, tables = case.double()
    expected = case.reference(*leaves, *tables)
    expected_grads = torch.autograd.grad(expected, leaves, case.grad.double())
    output = case.forward()
    grads = case.forward_backward()
    errors = {"output": _error(output, expected.detach())}
    errors.update({f"grad{i}": _error(got, want) for i, (got, want) in enumerate(zip(grads, expected_grads))})
    return errors


def _passes(errors: dict[str, float], dtype: torch.dtype) -> bool:
    return all(
        error <= (TOLERANCE[dtype] if part == "output" else GRAD_TOLERANCE[dtype]) for part, error in errors.items()
    )


def _edge_rows_error(case: Case, output: torch.Tensor) -> float:
    """The timed batch's first and last rows (matrices) against the float64 reference of those rows."""
    pick = torch.tensor([0, case.count - 1], device=output.device)
    leaves, tables = case.double()
    if case.op_name == "whvi_matvec":
        x, s1, g, s2 = leaves
        expected = case.reference(x[pick], s1, g[pick], s2)
    else:
        expected = case.reference(leaves[0][pick], *leaves[1:], *tables)
    return _error(output[pick], expected.detach())


def _count(op: str, size: int, elements: int) -> int:
    return max(1, elements // (size * size if op == "whvi_design" else size))


def measure(
    sizes: list[int],
    dtypes: list[torch.dtype],
    chosen_ops: list[str],
    device: torch.device,
    elements: int,
    min_run_time: float,
    dense_max: int,
) -> list[dict[str, Any]]:
    """One row per (op, D, dtype)."""
    try:
        from fast_hadamard_transform import hadamard_transform  # Dao's CUDA kernel, if installed
    except ImportError:
        hadamard_transform = None
    if device.type != "cuda":
        hadamard_transform = None
    results = []
    seed = 0
    for dtype in dtypes:
        for size in sizes:
            for op in chosen_ops:
                if op == "whvi_design" and size > DESIGN_MAX:
                    continue
                seed += 1
                start = time.perf_counter()
                count = _count(op, size, elements)
                row: dict[str, Any] = {"op": op, "D": size, "dtype": str(dtype).removeprefix("torch."), "N": count}
                small = Case(op, size, min(count, 4 if op == "whvi_design" else CHECK_ROWS), dtype, device, seed)
                errors = check(small)
                row.update({f"error_{part}": error for part, error in errors.items()})
                del small
                case = Case(op, size, count, dtype, device, 1000 + seed)
                with _recording(device) as launched:
                    output = case.forward()
                    case.forward_backward()
                row["kernels"] = ",".join(dict.fromkeys(launched))
                row["error_edge_rows"] = _edge_rows_error(case, output.detach())
                row["ok"] = _passes(errors, dtype) and row["error_edge_rows"] <= TOLERANCE[dtype]
                del output
                element = case.leaves[0].element_size()
                row["copy_ms"] = _time(min_run_time, device, _copy, case.leaves[0].detach())
                copy_bytes = 2 * case.leaves[0].numel() * element
                row["copy_GBps"] = copy_bytes / row["copy_ms"] / 1e6
                for part, fn in (("fwd", case.forward), ("fwdbwd", case.forward_backward)):
                    moved = case.floor_elements[part == "fwdbwd"] * element
                    milliseconds = _time(min_run_time, device, fn)
                    row[f"{part}_ms"] = milliseconds
                    row[f"{part}_GBps"] = moved / milliseconds / 1e6
                    row[f"{part}_of_copy_floor"] = (moved / (row["copy_GBps"] * 1e6)) / milliseconds
                    row[f"reference_{part}_ms"] = _time(min_run_time, device, fn, case.reference)
                if op == "fwht":  # in place on the same buffer: orthonormal, so its values stay of one scale
                    buffer = case.leaves[0].detach().clone()
                    row["inplace_ms"] = _time(min_run_time, device, ops.fwht_, buffer)
                    row["inplace_of_copy_floor"] = row["copy_ms"] / row["inplace_ms"]
                    del buffer
                if op in ("fwht", "whvi_matvec") and size <= dense_max:
                    x = case.leaves[0].detach().requires_grad_(True)
                    weight = torch.randn(size, size, device=device, dtype=dtype, requires_grad=True)
                    grad = torch.randn(count, size, device=device, dtype=dtype)
                    linear = torch.nn.functional.linear
                    row["dense_fwd_ms"] = _time(min_run_time, device, linear, x, weight)
                    dense = (linear, [x, weight], grad, x, weight)
                    row["dense_fwdbwd_ms"] = _time(min_run_time, device, _forward_backward, *dense)
                    del x, weight, grad
                if op == "fwht" and hadamard_transform is not None:
                    x = case.leaves[0].detach().requires_grad_(True)

                    def dao(x: torch.Tensor, size: int = size) -> torch.Tensor:
                        return hadamard_transform(x, scale=size**-0.5)

                    row["dao_fwd_ms"] = _time(min_run_time, device, dao, x)
                    row["dao_fwdbwd_ms"] = _time(min_run_time, device, _forward_backward, dao, [x], case.grad, x)
                    del x
                row["seconds"] = time.perf_counter() - start
                del case
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                results.append(row)
                print({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return results


def markdown(rows: list[dict[str, Any]], where: str) -> str:
    """One line per (op, D, dtype): ms, GB/s and fraction of the copy floor, baselines, errors."""
    nan = float("nan")
    lines = [
        f"### The ops on {where}: ms per call (forward; forward + backward), GB/s and the fraction of the copy "
        "floor (1.0: the copy's speed)",
        "",
        "| op | D | dtype | N | ok | max error | copy ms (GB/s) | fwd ms (GB/s, of floor) "
        "| fwd+bwd ms (GB/s, of floor) | in place ms (of floor) | reference fwd / fwd+bwd | dense fwd / fwd+bwd "
        "| Dao fwd / fwd+bwd | kernels |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        error = max(v for k, v in r.items() if k.startswith("error_"))
        lines.append(
            f"| {r['op']} | {r['D']} | {r['dtype']} | {r['N']} | {'yes' if r['ok'] else '**no**'} | {error:.2g} | "
            f"{r['copy_ms']:.4f} ({r['copy_GBps']:.0f}) | "
            f"{r['fwd_ms']:.4f} ({r['fwd_GBps']:.0f}, {r['fwd_of_copy_floor']:.2f}) | "
            f"{r['fwdbwd_ms']:.4f} ({r['fwdbwd_GBps']:.0f}, {r['fwdbwd_of_copy_floor']:.2f}) | "
            f"{r.get('inplace_ms', nan):.4f} ({r.get('inplace_of_copy_floor', nan):.2f}) | "
            f"{r['reference_fwd_ms']:.4f} / {r['reference_fwdbwd_ms']:.4f} | "
            f"{r.get('dense_fwd_ms', nan):.4f} / {r.get('dense_fwdbwd_ms', nan):.4f} | "
            f"{r.get('dao_fwd_ms', nan):.4f} / {r.get('dao_fwdbwd_ms', nan):.4f} | {r['kernels'] or '-'} |"
        )
    return "\n".join(lines)


def static_table(sizes: list[int]) -> str:
    """Registers, spills and shared memory of every kernel compiled ahead of time (no GPU needed)."""
    module = triton_backend.kernels()
    if module is None:
        raise RuntimeError("static_table needs Triton: pip install triton.")
    lines = ["| kernel | D | dtype | sm_80 registers / spill B / shared B | sm_90 registers / spill B / shared B |"]
    lines.append("|---|---|---|---|---|")
    for kernel in triton_backend.KERNELS:
        for size in sizes:
            for dtype in (torch.float32, torch.bfloat16, torch.float64):
                fused = module.max_fused_size(kernel, dtype == torch.float64)
                if size > fused:
                    continue
                cells = []
                for arch in (80, 90):
                    usage = triton_resources.resource_usage(kernel, size, dtype, arch)
                    cells.append(f"{usage['registers']} / {usage['spill_bytes']} / {usage['shared_bytes']}")
                name = str(dtype).removeprefix("torch.")
                lines.append(f"| {kernel} | {size} | {name} | {cells[0]} | {cells[1]} |")
                print(lines[-1], flush=True)
    return "\n".join(lines)


def floor_table(sizes: list[int], rows: int, bandwidth: float = 3.0e12) -> str:
    """Bytes each call moves (read once, written once) and the time they take at ``bandwidth`` bytes/s."""
    lines = ["| D | fwht bytes (fp32) | floor at 3 TB/s | whvi_matvec fwd+bwd bytes | floor |", "|---|---|---|---|---|"]
    for size in sizes:
        fwht_bytes = 2 * rows * size * 4  # read x, write y
        matvec_bytes = 10 * rows * size * 4  # forward: x, g, y; backward: grad, x, g, and four products
        lines.append(
            f"| {size} | {fwht_bytes / 1e6:.1f} MB | {fwht_bytes / bandwidth * 1e6:.1f} us | "
            f"{matvec_bytes / 1e6:.1f} MB | {matvec_bytes / bandwidth * 1e6:.1f} us |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a rehearsal (no GPU)")
    parser.add_argument("--min-log2-d", type=int, default=4)
    parser.add_argument("--max-log2-d", type=int, default=15)
    parser.add_argument("--dense-max-log2-d", type=int, default=13, help="largest D of the dense baseline")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16", help="comma-separated, of " + ",".join(DTYPES))
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, of " + ",".join(OPS))
    parser.add_argument("--elements", type=int, default=2**26, help="entries of each main input (default 2^26)")
    parser.add_argument("--rows", type=int, help="for --static's floor table: rows (default 4096)")
    parser.add_argument("--min-run-time", type=float, default=0.05, help="seconds per timing (default 0.05)")
    parser.add_argument("--strict", action="store_true", help="exit status 1 when any op fails its check")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--static", action="store_true", help="print the kernels' static resources and byte floors")
    args = parser.parse_args(argv)
    if not 1 <= args.min_log2_d <= args.max_log2_d <= 15:
        parser.error("expected 1 <= --min-log2-d <= --max-log2-d <= 15")
    if args.elements < 1 or args.min_run_time <= 0:
        parser.error("--elements and --min-run-time must be positive")
    try:
        dtypes = [DTYPES[name.strip()] for name in args.dtypes.split(",") if name.strip()]
    except KeyError as error:
        parser.error(f"--dtypes: unknown {error}; choose from {','.join(DTYPES)}")
    chosen_ops = [name.strip() for name in args.ops.split(",") if name.strip()]
    if not dtypes or not chosen_ops or set(chosen_ops) - set(OPS):
        parser.error(f"--dtypes and --ops: choose from {','.join(DTYPES)} and {','.join(OPS)}")
    if args.static:
        sizes = [2**k for k in range(7, args.max_log2_d + 1)]
        if not triton_backend.triton_available():
            print("gpu_kernels.py --static: needs Triton (pip install triton).", file=sys.stderr)
            return 2
        print(floor_table(sizes, args.rows or 4096))
        print(static_table([2, 16, 64, 128, 1024, 8192]))
        return 0
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print(
                "gpu_kernels.py: needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu rehearses it.",
                file=sys.stderr,
            )
            return 2
        if not triton_backend.triton_available():
            print("gpu_kernels.py: needs Triton (pip install triton).", file=sys.stderr)
            return 2
        where = torch.cuda.get_device_name()
    else:
        where = f"the CPU (a rehearsal: {'compiled' if ops.compiled_available() else 'reference'} kernels)"
    sizes = [2**k for k in range(args.min_log2_d, args.max_log2_d + 1)]
    device = torch.device(args.device)
    chosen = [op for op in OPS if op in chosen_ops]
    rows = measure(sizes, dtypes, chosen, device, args.elements, args.min_run_time, 2**args.dense_max_log2_d)
    text = markdown(rows, where)
    failed = [f"{r['op']} D={r['D']} {r['dtype']}" for r in rows if not r["ok"]]
    text += "\n\n" + (f"Failed the check: {'; '.join(failed)}." if failed else "Every op passed its check.")
    print(text)
    stem = "gpu_kernels" if args.device == "cuda" else f"gpu_kernels_{args.device}"
    try:
        import fast_hadamard_transform  # noqa: F401

        dao = True
    except ImportError:
        dao = False
    meta = environment(
        device=where,
        elements=args.elements,
        min_run_time=args.min_run_time,
        triton=_version("triton"),
        fast_hadamard_transform=dao,
        failed=failed,
    )
    columns = list(dict.fromkeys(key for row in rows for key in row))  # every row has every column (CSV)
    rows = [{key: row.get(key) for key in columns} for row in rows]
    save_tables(args.out, stem, meta, rows, text)
    report_saved(args.out, stem, False)
    return 1 if failed and args.strict else 0


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
