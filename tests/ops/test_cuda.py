"""The ops on CUDA tensors agree with the CPU (skipped without a GPU; see conftest).

``PYRO_WHVI_TEST_DEVICE=cpu`` runs the same tests on CPU tensors instead (then nothing is skipped): the
rehearsal of ``benchmarks/gpu_check.sh`` (``--rehearse``), which proves the file has no typo where no GPU is.
"""

from __future__ import annotations

import os

import pytest
import torch

from pyro_whvi import ops
from pyro_whvi.ops import reference

DEVICE = os.environ.get("PYRO_WHVI_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.cuda if DEVICE == "cuda" else []


@pytest.mark.parametrize("size", [1, 2, 32, 1024, 2**15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fwht_cuda_matches_cpu(size, dtype):
    x = torch.randn(64, size, dtype=dtype)
    expected = ops.fwht(x)
    actual = ops.fwht(x.to(DEVICE)).cpu()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("per_example", [False, True])
def test_whvi_matvec_cuda_matches_cpu(per_example):
    x = torch.randn(16, 256)
    s1, s2 = torch.randn(2, 256).unbind(0)
    g = torch.randn(16, 256) if per_example else torch.randn(256)
    expected = ops.whvi_matvec(x, s1, g, s2)
    actual = ops.whvi_matvec(*(t.to(DEVICE) for t in (x, s1, g, s2))).cpu()
    torch.testing.assert_close(actual, expected)


def test_gradcheck_cuda():
    x = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    s1, g, s2 = (torch.randn(16, device=DEVICE, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(ops.whvi_matvec, (x, s1, g, s2))
    assert torch.autograd.gradcheck(ops.fwht, (x,))


def test_structured_ops_cuda_match_cpu():
    x, s1, s2 = torch.randn(4, 32, 32), torch.randn(32), torch.randn(32)
    expected = ops.whvi_design(x, s1, s2)
    torch.testing.assert_close(ops.whvi_design(x.to(DEVICE), s1.to(DEVICE), s2.to(DEVICE)).cpu(), expected)
    signs = torch.randint(0, 2, (3, 64)).double() * 2 - 1
    permutation = torch.argsort(torch.rand(3, 64), dim=-1)
    gaussian, scale = torch.randn(2, 3, 64).unbind(0)
    inputs = torch.randn(5, 64)
    expected = ops.fastfood(inputs, signs, permutation, gaussian, scale)
    actual = ops.fastfood(*(t.to(DEVICE) for t in (inputs, signs, permutation, gaussian, scale))).cpu()
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_the_triton_kernels_match_float64(dtype):
    from pyro_whvi.ops import triton_backend

    if DEVICE == "cuda":
        assert triton_backend.triton_available(), "CUDA tensors need Triton for the GPU kernels"
    x, s1, g, s2 = (torch.randn(shape, dtype=torch.float64) for shape in ((8, 1, 512), (2, 512), (8, 2, 512), (2, 512)))
    expected = ops.whvi_matvec(x, s1, g, s2)
    actual = ops.whvi_matvec(*(t.to(DEVICE, dtype) for t in (x, s1, g, s2))).double().cpu()
    tolerance = 1e-2 if dtype == torch.float16 else 5e-2  # rounding of the inputs and the output
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


def test_compiled_whvi_layers_on_cuda_match_eager():
    from torch import nn

    from pyro_whvi.nn import bayesian_, kl_divergence

    network = bayesian_(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)), sites="paper").to(DEVICE)
    x = torch.randn(32, 16, device=DEVICE)

    def loss_fn(x):
        return network(x).square().sum() + kl_divergence(network)

    compiled = torch.compile(loss_fn, fullgraph=True, options={"fallback_random": True})
    torch.manual_seed(0)
    eager = loss_fn(x)
    torch.manual_seed(0)
    torch.testing.assert_close(compiled(x), eager)
    compiled(x).backward()
    assert all(p.grad is not None and p.grad.device.type == DEVICE for p in network.parameters())


# Every op, forward and gradient, on the device against the float64 reference on the CPU, with the tolerances of
# the interpreter checks (tests/ops/test_triton_kernels.py), relative to max(1, max|reference|). The sizes cover each
# dispatcher path: one program's rows (1, 16, 256), the float64 backward kernels' limit (4096), the fused limit
# (8192) and the two-pass transform (2^15).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
GRAD_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-2, torch.bfloat16: 5e-2}
SWEEP_SIZES = (1, 16, 256, 4096, 8192, 2**15)
SWEEP_OPS = ("fwht", "fwht_pm1", "whvi_matvec[shared]", "whvi_matvec[per_example]", "whvi_matvec[stacked]", "fastfood")


def _sweep_inputs(op: str, size: int, generator: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(differentiated inputs, fixed tables) in float64 on the CPU."""
    rows = 5 if size <= 8192 else 2

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    if op.startswith("fwht"):
        return [draw(rows, size)], []
    if op == "whvi_matvec[shared]":
        return [draw(rows, size), draw(size), draw(size), draw(size)], []
    if op == "whvi_matvec[per_example]":
        return [draw(rows, size), draw(size), draw(rows, size), draw(size)], []
    if op == "whvi_matvec[stacked]":
        return [draw(rows, 1, size), draw(3, size), draw(rows, 3, size), draw(3, size)], []
    if op == "fastfood":
        signs = (torch.randint(0, 2, (2, size), generator=generator) * 2 - 1).double()
        permutation = torch.argsort(torch.rand(2, size, generator=generator), dim=-1)
        return [draw(rows, size)], [signs, permutation, draw(2, size), draw(2, size)]
    matrices = 3 if size <= 256 else 1
    return [draw(matrices, size, size), draw(size), draw(size)], []


def _sweep_functions(op: str):
    if op == "fwht_pm1":
        return (lambda x: ops.fwht(x, normalized=False)), (lambda x: reference.fwht(x, normalized=False))
    name = op.split("[")[0]
    return getattr(ops, name), getattr(reference, name)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach().double().cpu(), expected.detach().double()
    assert torch.isfinite(actual).all(), "non-finite output"
    return (actual - expected).abs().max().item() / max(1.0, expected.abs().max().item()) if actual.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", SWEEP_SIZES)
@pytest.mark.parametrize("op", [*SWEEP_OPS, "whvi_design"])
def test_every_op_on_the_device_matches_the_float64_reference(op, size, dtype):
    if op == "whvi_design" and size > 1024:
        pytest.skip("whvi_design: D x D matrices; D <= 1024 here (benchmarks/gpu_kernels.py times it to 8192)")
    generator = torch.Generator().manual_seed(size)
    leaves, tables = _sweep_inputs(op, size, generator)
    tables = [t if t.dtype == torch.int64 else t.to(dtype).double() for t in tables]  # the values the device sees
    leaves = [leaf.to(dtype).double().requires_grad_(True) for leaf in leaves]
    fn, ref = _sweep_functions(op)
    expected = ref(*leaves, *tables)
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(dtype).double()
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    device_leaves = [leaf.detach().to(DEVICE, dtype).requires_grad_(True) for leaf in leaves]
    device_tables = [t.to(DEVICE) if t.dtype == torch.int64 else t.to(DEVICE, dtype) for t in tables]
    actual = fn(*device_leaves, *device_tables)
    assert actual.device.type == DEVICE and actual.dtype == dtype and actual.shape == expected.shape
    error = _relative_error(actual, expected)
    assert error <= TOLERANCE[dtype], (op, size, dtype, "output", error)
    grads = torch.autograd.grad(actual, device_leaves, grad.to(DEVICE, dtype))
    for index, (got, want) in enumerate(zip(grads, expected_grads)):
        assert got.device.type == DEVICE and got.shape == want.shape
        error = _relative_error(got, want)
        assert error <= GRAD_TOLERANCE[dtype], (op, size, dtype, f"gradient {index}", error)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", SWEEP_SIZES)
@pytest.mark.parametrize("normalized", [True, False])
def test_fwht_in_place_and_into_out_on_the_device_match_the_float64_reference(normalized, size, dtype):
    generator = torch.Generator().manual_seed(size)
    x = torch.randn(5, 2 * size, generator=generator, dtype=torch.float64).to(dtype)
    expected = reference.fwht(x[:, ::2].double(), normalized)  # a strided view: the in-place path's copy
    tolerance = TOLERANCE[dtype] * (1 if normalized else size**0.5)
    device_x = x.to(DEVICE)

    out = torch.full((5, size), float("nan"), device=DEVICE, dtype=dtype)  # poisoned: every entry must be written
    returned = ops.fwht(device_x[:, ::2], normalized, out=out)
    assert returned is out
    assert _relative_error(out, expected) <= tolerance, ("out=", size, dtype)

    contiguous = device_x[:, ::2].contiguous()
    pointer = contiguous.data_ptr()
    assert ops.fwht_(contiguous, normalized) is contiguous and contiguous.data_ptr() == pointer
    assert _relative_error(contiguous, expected) <= tolerance, ("fwht_", size, dtype)
    strided = device_x[:, ::2]
    ops.fwht_(strided, normalized)
    assert _relative_error(device_x[:, ::2], expected) <= tolerance, ("fwht_ on a strided view", size, dtype)
    assert torch.equal(device_x[:, 1::2], x[:, 1::2].to(DEVICE)), "fwht_ wrote outside its view"


def test_fwht_in_place_autograd_on_the_device_follows_torch():
    leaf = torch.randn(3, 64, device=DEVICE, dtype=torch.float64, requires_grad=True)
    intermediate = leaf * 2
    ops.fwht_(intermediate)
    grad = torch.randn(3, 64, device=DEVICE, dtype=torch.float64)
    (actual,) = torch.autograd.grad(intermediate, leaf, grad)
    torch.testing.assert_close(actual.cpu(), 2 * reference.fwht(grad.cpu()), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="leaf"):
        ops.fwht_(leaf)
    with torch.no_grad():
        ops.fwht_(leaf)
