r"""Triton GPU kernels of the FWHT and the fused WHVI product (installed as ``pyro_whvi._triton.kernels``).

Every kernel transforms a block of ``ROWS`` rows of length ``D`` (a power of two, at most
:data:`MAX_FUSED_SIZE`) held in registers: one read and one write of the data, the ``log2 D``
butterfly stages of :func:`_hadamard` in between (each a reshape to ``(ROWS, D / 2h, 2, h)`` and a
sum and difference of the two halves). Half types load and store in their own type and compute in
float32, float64 in float64. Inputs are contiguous ``(rows, D)``; a broadcast operand is read through
a per-row offset table (``*_rows``) instead of being materialized.

The same source runs on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check it on machines
without a GPU) and compiles for a CUDA target without one (``triton.compile``).

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §2.1 (FWHT), §2.2–2.3 (eq. 3, 6), §3.4 and App. D.5.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: The largest ``D`` transformed in one program; longer rows are split into two passes (``H_{AB} = H_A \otimes H_B``).
MAX_FUSED_SIZE = 8192
#: Up to this ``P`` the Fastfood kernels permute in registers (``tl.gather``: about 3 s of ptxas at 1024,
#: not done within 5 minutes at 4096); longer rows go through their own slot of the output buffer.
GATHER_LIMIT = 1024


@triton.jit
def _hadamard(x, ROWS: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr):
    """The unnormalized Walsh–Hadamard transform of each row of ``x`` ``(ROWS, D)`` (Sylvester order)."""
    for stage in tl.static_range(LOG_D):
        pairs = tl.reshape(x, (ROWS, D // (2 << stage), 2, 1 << stage))
        top, bottom = tl.split(tl.permute(pairs, (0, 1, 3, 2)))
        x = tl.reshape(tl.permute(tl.join(top + bottom, top - bottom), (0, 1, 3, 2)), (ROWS, D))
    return x


@triton.jit
def _norm(D: tl.constexpr, POWER: tl.constexpr, COMPUTE: tl.constexpr):
    """``D^(-POWER / 2)`` in the compute type (``D^(-1/2)`` is not exact in float32 when ``log2 D`` is odd, so a
    float32 argument would cost float64 its precision)."""
    size = tl.full((1, 1), D, COMPUTE)
    if POWER == 0:
        return tl.full((1, 1), 1.0, COMPUTE)
    elif POWER == 1:
        return 1.0 / tl.sqrt(size)
    else:
        return 1.0 / size


@triton.jit
def _load_rows(ptr, row_offsets_ptr, rows, mask, D: tl.constexpr, COMPUTE: tl.constexpr):
    """Rows ``row_offsets[rows]`` of a contiguous ``(n, D)`` tensor, in the compute type."""
    offsets = tl.load(row_offsets_ptr + rows, mask=mask, other=0).to(tl.int64)
    columns = tl.arange(0, D)
    return tl.load(ptr + offsets[:, None] * D + columns[None, :], mask=mask[:, None], other=0.0).to(COMPUTE)


@triton.jit
def _load_own_rows(ptr, rows, mask, D: tl.constexpr, COMPUTE: tl.constexpr):
    """Rows ``rows`` of a contiguous ``(n, D)`` tensor, in the compute type."""
    columns = tl.arange(0, D)
    return tl.load(ptr + rows.to(tl.int64)[:, None] * D + columns[None, :], mask=mask[:, None], other=0.0).to(COMPUTE)


@triton.jit
def _store_rows(ptr, value, rows, mask, D: tl.constexpr):
    columns = tl.arange(0, D)
    tl.store(
        ptr + rows.to(tl.int64)[:, None] * D + columns[None, :], value.to(ptr.dtype.element_ty), mask=mask[:, None]
    )


@triton.jit
def fwht_kernel(
    x_ptr,
    y_ptr,
    n_rows,
    ROWS: tl.constexpr,
    D: tl.constexpr,
    LOG_D: tl.constexpr,
    COMPUTE: tl.constexpr,
    POWER: tl.constexpr,
):
    """``y = D^(-POWER/2) H x`` row by row (``POWER`` 1: orthonormal, 0: ``±1``); contiguous ``(n_rows, D)``."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = rows < n_rows
    x = _load_own_rows(x_ptr, rows, mask, D, COMPUTE)
    _store_rows(y_ptr, _hadamard(x, ROWS, D, LOG_D) * _norm(D, POWER, COMPUTE), rows, mask, D)


@triton.jit
def whvi_matvec_kernel(
    x_ptr, x_rows, s1_ptr, s1_rows, g_ptr, g_rows, s2_ptr, s2_rows, y_ptr, n_rows,
    ROWS: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    r"""``y = s1 * H(g * H(s2 * x))`` with the orthonormal ``H`` (``1 / D`` in all): both transforms and the
    three diagonal scalings in one pass over the data."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = rows < n_rows
    x = _load_rows(x_ptr, x_rows, rows, mask, D, COMPUTE)
    u = _hadamard(_load_rows(s2_ptr, s2_rows, rows, mask, D, COMPUTE) * x, ROWS, D, LOG_D)
    v = _hadamard(_load_rows(g_ptr, g_rows, rows, mask, D, COMPUTE) * u, ROWS, D, LOG_D)
    s1 = _load_rows(s1_ptr, s1_rows, rows, mask, D, COMPUTE)
    _store_rows(y_ptr, s1 * v * _norm(D, 2, COMPUTE), rows, mask, D)


@triton.jit
def whvi_matvec_backward_kernel(
    grad_ptr, x_ptr, x_rows, s1_ptr, s1_rows, g_ptr, g_rows, s2_ptr, s2_rows,
    grad_x_ptr, grad_s1_ptr, grad_g_ptr, grad_s2_ptr, n_rows,
    ROWS: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    r"""Per-row vector-Jacobian products of :func:`whvi_matvec_kernel` (the host sums broadcast rows).

    With :math:`u = H(s_2 x)`, :math:`v = H(g u)`, :math:`w = H(s_1 \bar y)`, :math:`z = H(g w)`
    (orthonormal ``H``): :math:`\bar x = s_2 z`, :math:`\bar s_1 = \bar y v`, :math:`\bar g = w u`,
    :math:`\bar s_2 = x z`. Four transforms, one read of each operand, one write of each product.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = rows < n_rows
    root = _norm(D, 1, COMPUTE)  # D^(-1/2): one orthonormal transform
    # Ordered so that at most three rows are live at a time (x and s2 are read twice rather than kept):
    # at D = 8192 keeping all nine spilled registers.
    x = _load_rows(x_ptr, x_rows, rows, mask, D, COMPUTE)
    u = _hadamard(_load_rows(s2_ptr, s2_rows, rows, mask, D, COMPUTE) * x, ROWS, D, LOG_D) * root
    g = _load_rows(g_ptr, g_rows, rows, mask, D, COMPUTE)
    v = _hadamard(g * u, ROWS, D, LOG_D) * root
    grad = _load_own_rows(grad_ptr, rows, mask, D, COMPUTE)
    _store_rows(grad_s1_ptr, grad * v, rows, mask, D)
    w = _hadamard(_load_rows(s1_ptr, s1_rows, rows, mask, D, COMPUTE) * grad, ROWS, D, LOG_D) * root
    _store_rows(grad_g_ptr, w * u, rows, mask, D)
    z = _hadamard(g * w, ROWS, D, LOG_D) * root
    _store_rows(grad_x_ptr, _load_rows(s2_ptr, s2_rows, rows, mask, D, COMPUTE) * z, rows, mask, D)
    _store_rows(grad_s2_ptr, _load_rows(x_ptr, x_rows, rows, mask, D, COMPUTE) * z, rows, mask, D)


@triton.jit
def _permute(value, index, scratch_ptr, rows, mask, D: tl.constexpr, COMPUTE: tl.constexpr):
    """``value[r, index[r, i]]`` for every row: a register gather up to :data:`GATHER_LIMIT`, else through
    the rows' own slots of ``scratch_ptr`` (store, barrier, gathered load, barrier: L2 traffic, no extra
    kernel). The second barrier keeps the slots from being overwritten before every thread has read."""
    if D <= 1024:  # GATHER_LIMIT (a constexpr comparison: one branch is compiled)
        return tl.gather(value, index.to(tl.int32), 1)
    base = rows.to(tl.int64)[:, None] * D
    tl.store(scratch_ptr + base + tl.arange(0, D)[None, :], value.to(scratch_ptr.dtype.element_ty), mask=mask)
    tl.debug_barrier()
    permuted = tl.load(scratch_ptr + base + index, mask=mask, other=0.0).to(COMPUTE)
    tl.debug_barrier()
    return permuted


@triton.jit
def fastfood_kernel(
    x_ptr, signs_ptr, permutation_ptr, gaussian_ptr, scale_ptr, y_ptr, n_blocks, n_rows,
    ROWS: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Row ``r = n * B + b`` of ``y``: ``scale_b * H(gaussian_b * Pi_b H(signs_b * x_n))`` (orthonormal ``H``)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = rows < n_rows
    columns = tl.arange(0, D)
    example = (rows // n_blocks).to(tl.int64)
    block = (rows % n_blocks).to(tl.int64)
    m2 = mask[:, None]
    x = tl.load(x_ptr + example[:, None] * D + columns[None, :], mask=m2, other=0.0).to(COMPUTE)
    signs = tl.load(signs_ptr + block[:, None] * D + columns[None, :], mask=m2, other=0.0).to(COMPUTE)
    norm = _norm(D, 1, COMPUTE)
    h = _hadamard(x * signs, ROWS, D, LOG_D) * norm
    permutation = tl.load(permutation_ptr + block[:, None] * D + columns[None, :], mask=m2, other=0)
    h = _permute(h, permutation, y_ptr, rows, m2, D, COMPUTE)
    gaussian = tl.load(gaussian_ptr + block[:, None] * D + columns[None, :], mask=m2, other=0.0).to(COMPUTE)
    scale = tl.load(scale_ptr + block[:, None] * D + columns[None, :], mask=m2, other=0.0).to(COMPUTE)
    y = _hadamard(h * gaussian, ROWS, D, LOG_D) * norm * scale
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + columns[None, :], y.to(y_ptr.dtype.element_ty), mask=m2)


@triton.jit
def fastfood_transpose_kernel(
    grad_ptr, signs_ptr, inverse_ptr, gaussian_ptr, scale_ptr, y_ptr, n_blocks, n_rows,
    ROWS: tl.constexpr, D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr,
):  # fmt: skip
    """Row ``r = n * B + b``: ``signs_b * H(Pi_b^T (gaussian_b * H(scale_b * grad_nb)))``; the host sums over ``b``."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    mask = rows < n_rows
    m2 = mask[:, None]
    columns = tl.arange(0, D)
    block = (rows % n_blocks).to(tl.int64)
    own = rows.to(tl.int64)[:, None] * D + columns[None, :]
    per_block = block[:, None] * D + columns[None, :]
    grad = tl.load(grad_ptr + own, mask=m2, other=0.0).to(COMPUTE)
    scale = tl.load(scale_ptr + per_block, mask=m2, other=0.0).to(COMPUTE)
    gaussian = tl.load(gaussian_ptr + per_block, mask=m2, other=0.0).to(COMPUTE)
    norm = _norm(D, 1, COMPUTE)
    t = _hadamard(grad * scale, ROWS, D, LOG_D) * norm * gaussian
    inverse = tl.load(inverse_ptr + per_block, mask=m2, other=0)
    u = _permute(t, inverse, y_ptr, rows, m2, D, COMPUTE)  # the transpose of a permutation is its inverse
    signs = tl.load(signs_ptr + per_block, mask=m2, other=0.0).to(COMPUTE)
    tl.store(y_ptr + own, (_hadamard(u, ROWS, D, LOG_D) * norm * signs).to(y_ptr.dtype.element_ty), mask=m2)


@triton.jit
def whvi_design_kernel(
    x_ptr, s1_ptr, s2_ptr, y_ptr, D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr
):
    """Matrix ``m``: ``y = D^(-1) H c`` (unnormalized ``H``), ``c_l = sum_i s1_i s2_(i^l) X_(i, i^l)``.

    ``c`` is accumulated over chunks of ``CHUNK`` values of ``i`` (a ``D x CHUNK`` tile read along
    ``i ^ l``), then transformed once."""
    matrix = tl.program_id(0).to(tl.int64)
    output = tl.arange(0, D)[:, None]  # l
    c = tl.zeros((D,), COMPUTE)
    for start in range(0, D, CHUNK):
        i = start + tl.arange(0, CHUNK)[None, :]
        column = i ^ output
        x = tl.load(x_ptr + matrix * D * D + i * D + column).to(COMPUTE)
        s1 = tl.load(s1_ptr + i).to(COMPUTE)
        s2 = tl.load(s2_ptr + column).to(COMPUTE)
        c += tl.sum(x * s1 * s2, axis=1)
    y = _hadamard(tl.reshape(c, (1, D)), 1, D, LOG_D) * _norm(D, 2, COMPUTE)
    tl.store(y_ptr + matrix * D + tl.arange(0, D)[None, :], y.to(y_ptr.dtype.element_ty))


@triton.jit
def whvi_design_backward_kernel(
    grad_ptr, x_ptr, s1_ptr, s2_ptr, z_ptr, grad_x_ptr, q_ptr,
    D: tl.constexpr, LOG_D: tl.constexpr, COMPUTE: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Matrix ``m``: ``z = D^(-1) H grad_m`` (unnormalized ``H``), ``grad_X_ij = s1_i s2_j z_(i^j)`` and
    ``Q_m = X_m * z_(i^j)`` (the host sums ``Q`` over the matrices: ``grad_s1 = Q s2``, ``grad_s2 = Q^T s1``).

    ``z`` goes through its row of ``z_ptr`` (store, barrier) so that chunks of ``CHUNK`` rows ``i`` read
    ``z_(i^j)`` with a gathered load."""
    matrix = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, D)[None, :]
    grad = tl.load(grad_ptr + matrix * D + columns).to(COMPUTE)
    z = _hadamard(grad, 1, D, LOG_D) * _norm(D, 2, COMPUTE)  # (1, D)
    tl.store(z_ptr + matrix * D + columns, z.to(z_ptr.dtype.element_ty))
    tl.debug_barrier()
    s2 = tl.load(s2_ptr + columns).to(COMPUTE)
    for start in range(0, D, CHUNK):
        i = start + tl.arange(0, CHUNK)[:, None]
        shifted = tl.load(z_ptr + matrix * D + (i ^ columns)).to(COMPUTE)  # z[i ^ j]
        s1 = tl.load(s1_ptr + i).to(COMPUTE)
        offsets = matrix * D * D + i * D + columns
        x = tl.load(x_ptr + offsets).to(COMPUTE)
        tl.store(grad_x_ptr + offsets, (s1 * s2 * shifted).to(grad_x_ptr.dtype.element_ty))
        tl.store(q_ptr + offsets, (x * shifted).to(q_ptr.dtype.element_ty))


def design_warps(size: int) -> int:
    """Warps of the design kernels: the float64 transform of an 8192-long row spills with 8 warps."""
    return 4 if size <= 2048 else (8 if size <= 4096 else 16)


def design_chunk(kernel_name: str, size: int, double: bool) -> int:
    """Values of ``i`` per step of the design kernels: tiles of about 4096 elements (2048 for the float64
    backward, which spilled with 4096 at D = 128; the forward spills with 2048 there on sm_80)."""
    elements = 2048 if double and kernel_name == "whvi_design_backward_kernel" else 4096
    return max(1, min(size, elements // size))


def rows_per_program(size: int, double: bool = False) -> int:
    """Rows of length ``size`` a program transforms: about 2048 elements (1024 in float64), at most 16 rows."""
    return max(1, min(16, (1024 if double else 2048) // size))


def num_warps(kernel_name: str, size: int) -> int:
    """Warps per program: enough threads that a program's rows fit in registers without spilling
    (checked with ``ptxas -v`` for sm_80 and sm_90, :func:`pyro_whvi.ops.triton_resources.resource_usage`)."""
    limit = 1024 if kernel_name == "whvi_matvec_backward_kernel" else 2048
    return 4 if size <= limit else 8


def max_fused_size(kernel_name: str, double: bool) -> int:
    """The largest ``D`` the kernel takes in one program: the float64 backward kernels spill at 8192
    (``ptxas -v``), so they stop at 4096 (longer rows: the unfused composition, or the reference)."""
    backward = kernel_name in ("whvi_matvec_backward_kernel", "whvi_design_backward_kernel")
    return MAX_FUSED_SIZE // 2 if double and backward else MAX_FUSED_SIZE
