"""Argument checks of the ops, on plain values and tensor-like objects (no torch import).

Everything a schedule cannot run is rejected here, before any collective starts, with the
exception type Python users expect: TypeError for a wrong kind of argument or dtype, ValueError
for a wrong value, shape or device. The shape rules mirror distgemm's
``host/src/schedule/constraints.rs`` for the two schedule families the ops use; the Rust
builder checks them again (a ValueError from there too).
"""

from __future__ import annotations

import math
from typing import NamedTuple

# torch dtype (as str(dtype), so no torch import is needed) -> distgemm's dtype name.
DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16"}

# Per op: accepted schedule names -> (distgemm schedule, let distgemm pick within the family).
# Only the schedules whose shard layouts are the op's: all-gather "A" (A and W row-sharded,
# output column block d of x @ W.T) and reduce-scatter "A" (K-sharded, output row block d).
SCHEDULES = {
    "all_gather": {
        "auto": ("ag-a", True),
        "ag-a": ("ag-a", False),
        "ag-a-single": ("ag-a-single", False),
    },
    "reduce_scatter": {
        "auto": ("rs-a", True),
        "rs-a": ("rs-a", False),
        "rs-a-single": ("rs-a-single", False),
    },
}

# Elements per 16 bytes: rows of every operand and every view offset must be 16-byte aligned.
ALIGN_ELEMENTS = 8
MAX_TP = 8
MAX_DIMENSION = 1 << 31
ALIGN_BYTES = 16


def resolve_schedule(family: str, schedule: object) -> tuple[str, bool]:
    """``(distgemm schedule name, auto)`` for the op family's ``schedule`` argument."""
    known = SCHEDULES[family]
    if not isinstance(schedule, str):
        raise TypeError(
            f"schedule must be a str (one of {', '.join(known)}), got {type(schedule).__name__}"
        )
    if schedule not in known:
        raise ValueError(
            f"schedule={schedule!r} is not supported by this op; use one of {', '.join(known)}"
            + (
                " (the other distgemm schedules shard the operands differently)"
                if schedule in ("ag-b", "ag-b-single", "rs-b", "rs-b-single")
                else ""
            )
        )
    return known[schedule]


def dtype_name(name: str, dtype: object) -> str:
    """distgemm's name of a torch dtype, or TypeError naming the argument."""
    got = DTYPES.get(str(dtype))
    if got is None:
        raise TypeError(
            f"{name} has dtype {dtype}; distgemm supports torch.bfloat16 and torch.float16"
        )
    return got


def check_tensor(name: str, t: object, device_index: int) -> str:
    """Checks that ``t`` is a contiguous, 16-byte aligned bf16/f16 CUDA tensor on this rank's
    device; returns distgemm's dtype name."""
    if not all(hasattr(t, a) for a in ("dtype", "device", "shape", "is_contiguous", "data_ptr")):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = dtype_name(name, t.dtype)
    dev = t.device
    if dev.type != "cuda" or dev.index != device_index:
        raise ValueError(
            f"{name} is on {dev}, but this rank's current CUDA device is cuda:{device_index} "
            "(torch.cuda.set_device(...) before the call, and keep every operand there)"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{name} is not contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); pass {name}.contiguous()"
        )
    if t.data_ptr() % ALIGN_BYTES:
        raise ValueError(
            f"{name}'s data is not 16-byte aligned (address {t.data_ptr():#x}, a view at an odd "
            f"offset?); pass {name}.clone()"
        )
    return dtype


def check_no_grad(tensors, grad_enabled: bool) -> None:
    """The ops have no backward: with autograd recording, an input that requires grad would
    give an output silently cut off from the graph, so that is an error."""
    if not grad_enabled:
        return
    for name, t in tensors:
        if getattr(t, "requires_grad", False):
            raise RuntimeError(
                f"{name} requires grad, but distgemm's ops have no backward yet: call them under "
                "torch.no_grad() or torch.inference_mode(), or detach the tensor"
            )


def same_dtype(names: tuple[str, str], dtypes: tuple[str, str]) -> None:
    if dtypes[0] != dtypes[1]:
        raise TypeError(
            f"{names[0]} is {dtypes[0]} but {names[1]} is {dtypes[1]}: both must have the same dtype"
        )


class Shapes(NamedTuple):
    """The global problem (M×N×K, D = A·Bᵀ) of one op call and its output's shape."""

    m: int
    n: int
    k: int
    out: tuple[int, ...]


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])


def all_gather_shapes(
    x: tuple[int, ...], w: tuple[int, ...], tp: int, names=("x_shard", "weight")
) -> Shapes:
    """Shapes of ``all_gather(x, dim 0) @ w.T``: x is this rank's (..., K) token shard, w its
    (N/P, K) weight shard; the output is (P·x.shape[0], ..., N/P)."""
    xn, wn = names
    if len(x) < 2:
        raise ValueError(f"{xn} must have at least 2 dimensions (tokens..., K), got shape {x}")
    if len(w) != 2:
        raise ValueError(f"{wn} must be a matrix (N/TP, K), got shape {w}")
    if x[-1] != w[1]:
        raise ValueError(
            f"{xn}.shape[-1]={x[-1]} must equal {wn}.shape[1]={w[1]} (the K dimension)"
        )
    return Shapes(m=tp * _rows(x), n=tp * w[0], k=x[-1], out=(tp * x[0], *x[1:-1], w[0]))


def reduce_scatter_shapes(
    x: tuple[int, ...], w: tuple[int, ...], tp: int, names=("x", "weight")
) -> Shapes:
    """Shapes of ``reduce_scatter(x @ w.T, dim 0)``: x is this rank's (..., K/P) activation
    (all tokens), w its (N, K/P) weight shard; the output is (x.shape[0]/P, ..., N)."""
    xn, wn = names
    if len(x) < 2:
        raise ValueError(f"{xn} must have at least 2 dimensions (tokens..., K/TP), got shape {x}")
    if len(w) != 2:
        raise ValueError(f"{wn} must be a matrix (N, K/TP), got shape {w}")
    if x[-1] != w[1]:
        raise ValueError(
            f"{xn}.shape[-1]={x[-1]} must equal {wn}.shape[1]={w[1]} (this rank's K/TP)"
        )
    if x[0] % tp:
        raise ValueError(
            f"{xn}.shape[0]={x[0]} is not divisible by the group size {tp}: the output is scattered along dim 0"
        )
    return Shapes(m=_rows(x), n=w[0], k=tp * x[-1], out=(x[0] // tp, *x[1:-1], w[0]))


def check_problem(schedule: str, m: int, n: int, k: int, tp: int) -> None:
    """The schedule's divisibility and alignment rules for the global problem (ValueError)."""
    if not 1 <= tp <= MAX_TP:
        raise ValueError(f"the group has {tp} ranks; distgemm runs TP from 1 to {MAX_TP}")
    for dim, value in (("M (tokens)", m), ("N", n), ("K", k)):
        if value < 1:
            raise ValueError(f"{dim}={value}: every dimension must be at least 1")
        if value >= MAX_DIMENSION:
            raise ValueError(f"{dim}={value} is too large: every dimension must be below 2^31")
    split = (
        (("M (tokens)", m), ("N", n))
        if schedule.startswith("ag-")
        else (("M (tokens)", m), ("K", k))
    )
    for dim, value in split:
        if value % tp:
            raise ValueError(
                f"{dim}={value} is not divisible by the group size {tp} for schedule {schedule}"
            )
    if k % ALIGN_ELEMENTS:
        raise ValueError(
            f"K={k} is not a multiple of 8: rows of the operands must be 16-byte aligned"
        )
    aligned = (("N/TP", n // tp),) if schedule.startswith("ag-") else (("K/TP", k // tp), ("N", n))
    for what, value in aligned:
        if value % ALIGN_ELEMENTS:
            raise ValueError(
                f"{what}={value} is not a multiple of 8 for schedule {schedule}: rows must be 16-byte aligned"
            )


def normalize_dim(name: str, dim: object, ndim: int) -> int:
    """``dim`` as a non-negative index of an ``ndim``-dimensional tensor; only 0 is supported."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a {ndim}-dimensional tensor")
    if dim % ndim != 0:
        raise ValueError(f"{name}={dim}: distgemm supports {name}=0 only (the token dimension)")
    return 0


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the byte ranges ``[start, start + size)`` a and b intersect."""
    return a[1] > 0 and b[1] > 0 and a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def check_partials(partials):
    """``partials`` is ``"read"`` or ``"push"`` (``ValueError`` otherwise)."""
    if partials not in ("read", "push"):
        raise ValueError(
            f"partials={partials!r}: use 'read' (the epilogue reads the neighbour's partial "
            "sum) or 'push' (the neighbour pushes it first)"
        )
