"""Argument checks of the ops, on plain values and tensor-like objects (no torch import).

Everything a schedule cannot run is rejected here, before any collective starts, with the
exception type Python users expect: TypeError for a wrong kind of argument or dtype, ValueError
for a wrong value, shape or device. The shape rules mirror distgemm's
``host/src/schedule/constraints.rs`` for the two schedule families the ops use; the Rust
builder checks them again (a ValueError from there too).
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import NamedTuple

# torch dtype (as str(dtype), so no torch import is needed) -> distgemm's dtype name.
DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float8_e4m3fn": "e4m3"}
# Bytes per element of A and B.
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1}
# distgemm's dtype name of A and B -> the output dtypes its kernels write for them (the first
# is the default). FP8 GEMMs write bf16 only.
OUT_DTYPES = {"bf16": ("torch.bfloat16",), "f16": ("torch.float16",), "e4m3": ("torch.bfloat16",)}
# The smallest FP8 scale distgemm takes (2^-63, host/src/fp8.rs MIN_SCALE): every product
# sa·sb is then a normal f32.
MIN_SCALE = 2.0**-63

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

# Elements of a 16-bit type per 16 bytes: rows of every operand and every view offset must be
# 16-byte aligned (twice as many e4m3 elements).
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
        hint = (
            " (of the FP8 formats, distgemm takes e4m3 only)"
            if str(dtype).startswith("torch.float8")
            else ""
        )
        raise TypeError(
            f"{name} has dtype {dtype}; distgemm supports torch.bfloat16, torch.float16 and "
            f"torch.float8_e4m3fn (with scale_a and scale_b){hint}"
        )
    return got


def check_tensor(name: str, t: object, device_index: int) -> str:
    """Checks that ``t`` is a contiguous, 16-byte aligned bf16/f16/e4m3 CUDA tensor on this
    rank's device; returns distgemm's dtype name."""
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


def _is_tensor(value: object) -> bool:
    return all(hasattr(value, a) for a in ("numel", "item"))


def scale_value(name: str, value: object) -> float:
    """A tensor-wise FP8 scale as the f32 value the kernels use (a Python float holding it
    exactly): ``value`` is a real number or a one-element tensor, whose value is read on the
    host (``.item()``, which waits for a CUDA tensor's stream: a synchronisation). TypeError for
    another kind of value, ValueError for a tensor of several elements or a value that is not
    finite and at least 2^-63 in f32."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or _is_tensor(value)):
        raise TypeError(
            f"{name} must be a float or a one-element tensor (a tensor-wise scale), got "
            f"{type(value).__name__}"
        )
    if not isinstance(value, numbers.Real):
        if value.numel() != 1:
            raise ValueError(f"{name} has {value.numel()} elements: a tensor-wise scale has one")
        value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} holds {value!r}, not a real number")
    try:
        f32 = struct.unpack("f", struct.pack("f", float(value)))[0]
    except OverflowError:
        f32 = math.inf
    if not (math.isfinite(f32) and f32 >= MIN_SCALE):
        raise ValueError(
            f"{name}={float(value)!r}: FP8 scales must be finite and at least 2^-63 in f32 (so "
            "that every product scale_a·scale_b is a normal f32)"
        )
    return f32


def row_scale_shapes(lead: tuple[int, ...], rows: int, of_b: bool) -> tuple:
    """The shapes a row-wise scale tensor may have: for A (``of_b`` false) one float32 per
    row of an operand whose leading dimensions are ``lead`` (``rows`` their product):
    ``(rows,)``, ``(rows, 1)``, ``lead`` or ``(*lead, 1)`` (torch's ``_scaled_mm`` and
    ``symm_mem`` use ``(..., 1)``); for B one per row of the weight, i.e. per output column:
    ``(rows,)``, ``(1, rows)`` (torch's) or ``(rows, 1)``."""
    shapes = [(rows,), (1, rows), (rows, 1)] if of_b else [(rows,), (rows, 1), lead, (*lead, 1)]
    return tuple(dict.fromkeys(shapes))


def _scale_kind(name: str, value: object, accepted: tuple) -> str:
    """``"tensor"`` (a real number, or a one-element tensor not of a row-wise shape), ``"row"``
    (a tensor of a row-wise shape with several elements) or ``"either"`` (a one-element
    tensor of a row-wise shape: the operand has one row, so both readings are the same)."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or _is_tensor(value)):
        raise TypeError(
            f"{name} must be a float or a one-element tensor (a tensor-wise scale) or a float32 "
            f"tensor of one scale per row (row-wise), got {type(value).__name__}"
        )
    if isinstance(value, numbers.Real):
        return "tensor"
    shape = tuple(getattr(value, "shape", ()))
    if shape in accepted:
        return "either" if value.numel() == 1 else "row"
    if value.numel() == 1:
        return "tensor"
    raise ValueError(
        f"{name} has shape {shape}: a row-wise scale (one float32 per row) has one of the shapes "
        f"{', '.join(str(s) for s in accepted)} here; a tensor-wise scale has one element"
    )


def check_row_scale(name: str, t: object, device_index: int) -> None:
    """A row-wise scale tensor is float32, contiguous and on this rank's CUDA device
    (TypeError/ValueError). Its values are not checked: they must be finite and at least
    2^-63 (as tensor-wise scales), but reading them would synchronise with the GPU, so that is
    the caller's to keep; the kernels use them as they are."""
    if str(t.dtype) != "torch.float32":
        raise TypeError(f"{name} has dtype {t.dtype}; row-wise FP8 scales are torch.float32")
    dev = t.device
    if dev.type != "cuda" or dev.index != device_index:
        raise ValueError(
            f"{name} is on {dev}, but this rank's current CUDA device is cuda:{device_index}: "
            "row-wise scales live on the GPU with the operands"
        )
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass {name}.contiguous()")


class Fp8(NamedTuple):
    """The checked output type and FP8 scales of one op call."""

    out_dtype: str  # str(torch dtype) of the result
    mode: str | None  # "tensor", "row", or None for bf16/f16
    # "tensor": (sa, sb) as the f32 values the kernels use; "row": the (scale_a, scale_b)
    # tensors as given, checked (shape, dtype, device, contiguity); None for bf16/f16.
    scales: tuple | None


def fp8_arguments(
    names,
    dtype: str,
    scale_a,
    scale_b,
    out_dtype,
    a_lead: tuple[int, ...] = (),
    b_rows: int = 0,
    device_index: int = 0,
) -> Fp8:
    """The output dtype and FP8 scales of an op whose A and B are ``dtype``: e4m3 needs both
    scales and writes bf16; bf16/f16 take no scales and write their own dtype (TypeError
    otherwise).

    The scales are both tensor-wise (each a real number or a one-element tensor; values as
    :func:`scale_value`) or both row-wise (tensors of :func:`row_scale_shapes` for A, whose
    leading dimensions are ``a_lead``, and for B, of ``b_rows`` rows; checked by
    :func:`check_row_scale`, their values not read). One of each is a ValueError. A
    one-element tensor of a row-wise shape (an operand of one row) takes its partner's mode."""
    allowed = OUT_DTYPES[dtype]
    if out_dtype is not None and str(out_dtype) not in allowed:
        raise TypeError(
            f"out_dtype={out_dtype}: distgemm's GEMM of {dtype} operands writes {allowed[0]}"
            + (" (the only output of its FP8 kernels)" if dtype == "e4m3" else "")
        )
    given = [n for n, s in (("scale_a", scale_a), ("scale_b", scale_b)) if s is not None]
    if dtype != "e4m3":
        if given:
            raise TypeError(
                f"{' and '.join(given)} given, but {names[0]} and {names[1]} are {dtype}: scales "
                "apply to torch.float8_e4m3fn inputs only"
            )
        return Fp8(allowed[0], None, None)
    if len(given) != 2:
        raise TypeError(
            f"{names[0]} and {names[1]} are float8_e4m3fn: pass both scale_a and scale_b (the "
            "dequantisation factors, tensor-wise D = (scale_a·A)·(scale_b·B)ᵀ, or row-wise)"
        )
    a_shapes = row_scale_shapes(a_lead, math.prod(a_lead), of_b=False)
    b_shapes = row_scale_shapes((b_rows,), b_rows, of_b=True)
    kinds = (_scale_kind("scale_a", scale_a, a_shapes), _scale_kind("scale_b", scale_b, b_shapes))
    if "row" in kinds:
        if "tensor" in kinds:
            row, tensor = ("scale_a", "scale_b") if kinds[0] == "row" else ("scale_b", "scale_a")
            raise ValueError(
                f"{row} is row-wise but {tensor} is tensor-wise: give both row-wise (scale_a one "
                f"float32 per row of {names[0]}, {a_shapes[0]} or {a_shapes[1]}; scale_b one per "
                f"row of {names[1]}, {b_shapes[0]} or {b_shapes[1]}) or both tensor-wise"
            )
        for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
            check_row_scale(name, t, device_index)
        return Fp8(allowed[0], "row", (scale_a, scale_b))
    return Fp8(
        allowed[0], "tensor", (scale_value("scale_a", scale_a), scale_value("scale_b", scale_b))
    )


def check_problem(
    schedule: str, m: int, n: int, k: int, tp: int, operand_bytes: int = 2
) -> None:
    """The schedule's divisibility and alignment rules for the global problem (ValueError);
    ``operand_bytes`` is the size of A's and B's elements (1 for e4m3: rows of 16)."""
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
    operand = ALIGN_BYTES // operand_bytes
    if k % operand:
        raise ValueError(
            f"K={k} is not a multiple of {operand}: rows of the operands must be 16-byte aligned"
        )
    # (quantity, value, elements per 16 bytes): K/TP counts A and B elements, N the output's.
    aligned = (
        (("N/TP", n // tp, ALIGN_ELEMENTS),)
        if schedule.startswith("ag-")
        else (("K/TP", k // tp, operand), ("N", n, ALIGN_ELEMENTS))
    )
    for what, value, multiple in aligned:
        if value % multiple:
            raise ValueError(
                f"{what}={value} is not a multiple of {multiple} for schedule {schedule}: rows "
                "must be 16-byte aligned"
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


def scattered_output_shape(
    output_shape: object, scatter_dim: object, x: tuple[int, ...], n: int, tp: int
) -> tuple[int, ...]:
    """This rank's result shape for torch's ``output_shape`` and ``orig_scatter_dim`` of
    ``fused_scaled_matmul_reduce_scatter``: ``output_shape`` is the unreduced product
    ``A @ B``'s shape, A's token rows possibly regrouped (A = ``x``, (..., K/TP), may have been
    flattened to a matrix before the call), so its last dimension is N and the others hold
    A's rows; the result is ``output_shape`` with dimension 0 divided by ``tp``. Only the
    scatter dimension 0 keeps a rank's result one block of A's rows, the block distgemm's
    reduce-scatter writes (TypeError/ValueError otherwise)."""
    if not isinstance(output_shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in output_shape
    ):
        raise TypeError(
            "output_shape must be a list of ints (the shape of the unreduced product A @ B), "
            f"got {output_shape!r}"
        )
    shape = tuple(output_shape)
    normalize_dim("orig_scatter_dim", scatter_dim, len(shape))
    if len(shape) < 2 or shape[-1] != n or _rows(shape) != _rows(x):
        raise ValueError(
            f"output_shape={list(shape)} is not the shape of A @ B for A of shape {x} and "
            f"N={n}: its last dimension must be N and the others must hold A's {_rows(x)} rows"
        )
    if shape[0] % tp:
        raise ValueError(
            f"output_shape[0]={shape[0]} is not divisible by the group size {tp}: the result is "
            "scattered along dim 0"
        )
    return (shape[0] // tp, *shape[1:])


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the byte ranges ``[start, start + size)`` a and b intersect."""
    return a[1] > 0 and b[1] > 0 and a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def check_partials(partials):
    """``partials`` is ``None``, ``"read"`` or ``"push"`` (``ValueError`` otherwise)."""
    if partials not in (None, "read", "push"):
        raise ValueError(
            f"partials={partials!r}: use 'read' (the epilogue reads the neighbour's partial "
            "sum), 'push' (the neighbour pushes it first) or None (a tuning table's choice "
            "under schedule='auto', else 'read')"
        )
