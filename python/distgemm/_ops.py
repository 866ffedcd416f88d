"""The ops: distgemm's all-gather and reduce-scatter GEMMs on torch tensors.

Each call is collective over a torch.distributed group (every rank calls the same op with
matching shapes, in the same order). It checks the arguments, finds or builds the rank's
``RankGemm`` for (group, problem, dtype, schedule) in the cache, and enqueues one run on
``torch.cuda.current_stream()`` with the tensors' device addresses: no host synchronisation, and
the output comes from PyTorch's caching allocator (``torch.empty``) unless ``out=`` is given.

Why passing raw addresses is sound here: the tensors are checked (device, dtype, contiguity,
alignment, sizes against the instance's shard shapes, no overlap of output and inputs), and
PyTorch's caching allocator hands freed memory out again only to work ordered behind the
stream it was used on — the current stream, on which the run is enqueued. distgemm ends every
run with an end-of-run release (each peer tells a rank when it is done reading the rank's
shard), so a rank's stream order alone makes its inputs reusable. The same rule covers the
temporaries of row-wise FP8 (the gathered scales of A, the scales of B at this rank's rows):
allocated, filled and read on the current stream, they may be dropped right after the launch.

Errors of a run that failed on the GPU (e.g. a peer that never launched: a timeout naming rank,
stage and flag) are raised by the next launch of that instance (distgemm checks the finished
run's error word without waiting) or by :func:`synchronize`.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

from . import _checks
from ._cache import CACHE
from ._distgemm import RankGemm
from ._rendezvous import GroupRendezvous

_HOPPER = (9, 0)
_checked_devices: dict = {}
_warned_copies: set = set()
_lock = threading.Lock()


_torch_module = None


def _torch():
    """torch, or an ImportError that says why distgemm's ops need it (imported on first use)."""
    global _torch_module
    if _torch_module is not None:
        return _torch_module
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError(
            "distgemm's ops run on torch tensors: install PyTorch with CUDA support "
            f"(import failed: {e})"
        ) from e
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed, which distgemm's ops need")
    _torch_module = torch
    return torch


class _Context(NamedTuple):
    group: object
    group_key: tuple
    rank: int
    tp: int
    device: int


def _context(torch, group) -> _Context:
    """The calling rank's group, rank, group size and CUDA device (checked: Hopper)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group() "
            "(any backend; gloo lets ranks share a GPU) before distgemm's ops"
        )
    if group is None:
        group = dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    tp = dist.get_world_size(group)
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is available: distgemm runs on Hopper GPUs")
    device = torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "distgemm's ops cannot be captured into a CUDA graph yet (each call updates and "
            "launches distgemm's own graph and checks its error word): call them outside capture"
        )
    if device not in _checked_devices:
        cap = torch.cuda.get_device_capability(device)
        if tuple(cap) != _HOPPER:
            raise RuntimeError(
                f"cuda:{device} is a {torch.cuda.get_device_name(device)} (compute capability "
                f"{cap[0]}.{cap[1]}); distgemm's kernels need a Hopper GPU (9.0: H100, H200)"
            )
        _checked_devices[device] = True
    name = getattr(group, "group_name", None)
    group_key = (name, tuple(dist.get_process_group_ranks(group)))
    return _Context(group, group_key, rank, tp, device)


def _group_from_name(group_name):
    """The process group torch.ops.symm_mem's ops name by ``group_name``."""
    from torch.distributed import distributed_c10d as c10d

    if not isinstance(group_name, str):
        raise TypeError(
            f"group_name must be a str (a ProcessGroup's group_name), got {type(group_name).__name__}"
        )
    try:
        return c10d._resolve_process_group(group_name)
    except Exception as e:
        raise ValueError(
            f"group_name={group_name!r} names no process group of this process ({e})"
        ) from e


def _check_dropin_input(name, t, dim_name, dim):
    """A drop-in's left operand is a tensor and its gather/scatter dimension ``dim`` is 0
    (TypeError/ValueError naming the argument otherwise)."""
    if not hasattr(t, "dim"):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _checks.normalize_dim(dim_name, dim, t.dim())


def _reduce_alpha(reduce_op, tp) -> float:
    """The epilogue's alpha for a reduce-scatter drop-in's ``reduce_op``: 1 for "sum", 1/TP
    for "avg" (ValueError for another)."""
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"reduce_op={reduce_op!r}: distgemm supports 'sum' and 'avg'")
    return 1.0 if reduce_op == "sum" else 1.0 / tp


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _timeout_s() -> float | None:
    raw = os.environ.get("DISTGEMM_TIMEOUT_S", "")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"DISTGEMM_TIMEOUT_S={raw!r} is not a number of seconds") from None


def _instance(
    ctx: _Context,
    schedule: str,
    auto: bool,
    shapes,
    dtype: str,
    alpha: float,
    expect: dict,
    partials: str | None = None,
    fp8=None,
):
    """The cached instance for this call's key, built (collectively) on a miss; checks that its
    shard shapes are the tensors' (so every launch stays inside the tensors).

    ``fp8`` is an e4m3 problem's :class:`_checks.Fp8`. Its scale mode is part of the key
    (tensor-wise and row-wise are different builds); the scales are not: a new tensor-wise
    pair is the same GEMM with another alpha, so a cached instance whose scales differ gets
    ``set_fp8_scales``, which its next launch applies in stream order without a rebuild, and
    row-wise scales are device addresses passed with each launch."""
    mode = fp8.mode if fp8 is not None else None
    tensor_scales = fp8.scales if mode == "tensor" else None
    key = (
        ctx.group_key,
        ctx.device,
        schedule,
        auto,
        shapes.m,
        shapes.n,
        shapes.k,
        dtype,
        alpha,
        0.0,
        partials,
        mode,
    )

    def build():
        inst = RankGemm(
            GroupRendezvous.for_group(ctx.group),
            ctx.device,
            schedule,
            auto,
            shapes.m,
            shapes.n,
            shapes.k,
            dtype,
            alpha=alpha,
            beta=0.0,
            timeout_s=_timeout_s(),
            allow_shared_gpu=_env_flag("DISTGEMM_ALLOW_SHARED_GPU"),
            rs_partials=partials,
            fp8_scales=tensor_scales,
            scale_mode=mode,
        )
        for operand, shape in expect.items():
            got = inst.shard_shape(operand)
            if tuple(got) != shape:
                inst.close()
                raise RuntimeError(
                    f"internal error: distgemm's {inst.schedule} shard of {operand} is {tuple(got)}, "
                    f"the op expected {shape}"
                )
        return inst

    with _lock:
        inst = CACHE.get(key, build, group=ctx.group_key)
    if tensor_scales is not None and tuple(inst.fp8_scales) != tensor_scales:
        inst.set_fp8_scales(*tensor_scales)
    return inst


def _output(torch, out, shape, dtype, like, name="out"):
    """``out`` checked against the result's shape and ``dtype`` (on ``like``'s device), or a
    new tensor from torch."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    _checks.check_tensor(name, out, like.device.index)
    if out.dtype != dtype:
        raise TypeError(f"{name} has dtype {out.dtype}; the result is {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(out.shape)}; the result is {tuple(shape)}")
    return out


def _extent(t):
    return (t.data_ptr(), t.numel() * t.element_size())


def _check_no_overlap(out, inputs):
    for name, t in inputs:
        if _checks.overlaps(_extent(out), _extent(t)):
            raise ValueError(
                f"the output overlaps {name}: distgemm writes its result to separate memory"
            )


def _weight_from_b(torch, B, name):
    """nn.Linear's layout (N×K, K-contiguous) of a ``K×N`` right operand B of torch's ops.

    ``W.t()`` is that layout already (a free view); a row-major B is copied once per call,
    with a one-time warning, since it costs a weight-sized copy every call.
    """
    if not hasattr(B, "dim") or B.dim() != 2:
        raise ValueError(
            f"{name} must be a matrix (K × N), got shape {tuple(getattr(B, 'shape', ()))}"
        )
    w = B.t()
    if not w.is_contiguous():
        if name not in _warned_copies:
            _warned_copies.add(name)
            warnings.warn(
                f"distgemm: {name} is not the transpose of a contiguous (N × K) weight, so it is "
                "copied to that layout on every call; pass weight.t() of an nn.Linear-style weight "
                "to avoid the copy",
                stacklevel=3,
            )
        w = w.contiguous()
    return w


def _all_gather_into(ctx, dst, src):
    """all_gather(src, dim 0) into ``dst`` through torch.distributed, synchronous as torch's
    collectives are by default: ordered after the current stream's earlier work, and the
    current stream's later work after it (NCCL: all_gather_into_tensor; other backends:
    all_gather into views of ``dst``)."""
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend(ctx.group)).lower():
        dist.all_gather_into_tensor(dst, src, group=ctx.group)
    else:
        dist.all_gather(list(dst.chunk(ctx.tp)), src, group=ctx.group)


def _gather_rows(torch, ctx, x, tp):
    """all_gather(x, dim 0) through torch.distributed: the op's optional gathered input.

    distgemm's own all-gather lands in its workspace, which is overwritten by the next run, so
    returning the gathered input costs this extra collective of M×K elements."""
    gathered = torch.empty((tp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    src, dst = x, gathered
    if x.element_size() == 1:  # e4m3: gathered as bytes (not every backend knows float8)
        src, dst = x.view(torch.uint8), gathered.view(torch.uint8)
    _all_gather_into(ctx, dst, src)
    return gathered


def _launch(torch, ctx, inst, x, weight, out, scale_ptrs):
    """Enqueues one run of ``inst`` on the current stream with the tensors' addresses (no C)
    and, row-wise, the scale vectors' (``(0, 0)`` otherwise)."""
    stream = torch.cuda.current_stream(ctx.device).cuda_stream
    inst.launch(
        stream,
        x.data_ptr(),
        weight.data_ptr(),
        None,
        out.data_ptr(),
        a_scales=scale_ptrs[0],
        b_scales=scale_ptrs[1],
    )


def _all_gather_row_scales(torch, ctx, scale_a, scale_b, m, n):
    """The full scale vectors distgemm's row-wise all-gather reads, from this rank's own:
    ``scale_a`` (one float32 per row of this rank's token shard) all-gathered into the M
    scales of the gathered rows (one small collective of 4·M bytes), and an N-long vector
    holding ``scale_b`` (this rank's weight rows) at this rank's output columns
    ``[rank·N/TP, +N/TP)``, the only ones its stage GEMMs read; the rest is NaN, so that a
    wrong offset would show in the result. Both are allocated and filled on the current
    stream, the launch's."""
    gathered = torch.empty((m,), dtype=torch.float32, device=scale_a.device)
    _all_gather_into(ctx, gathered, scale_a.reshape(-1))
    n_local = n // ctx.tp
    b_full = torch.full((n,), float("nan"), dtype=torch.float32, device=scale_b.device)
    b_full.narrow(0, ctx.rank * n_local, n_local).copy_(scale_b.reshape(-1))
    return gathered, b_full


class _Operands(NamedTuple):
    dtype: str  # distgemm's name of A's and B's type: bf16, f16 or e4m3
    out_dtype: object  # the result's torch dtype
    fp8: object  # e4m3: the scales' mode and values (_checks.Fp8); else None


def _operands(torch, ctx, x, weight, names, scale_a, scale_b, out_dtype, shapes_of):
    """The checked dtypes of one op call's operands (both bf16, both f16, or both e4m3 with
    their scales: a one-element tensor's value is read on the host, a synchronisation;
    row-wise scale tensors are not read) and the call's shapes (``shapes_of``)."""
    xn, wn = names
    dtypes = (_checks.check_tensor(xn, x, ctx.device), _checks.check_tensor(wn, weight, ctx.device))
    _checks.same_dtype(names, dtypes)
    _checks.check_no_grad(((xn, x), (wn, weight)), torch.is_grad_enabled())
    shapes = shapes_of(tuple(x.shape), tuple(weight.shape), ctx.tp, names)
    fp8 = _checks.fp8_arguments(
        names,
        dtypes[0],
        scale_a,
        scale_b,
        out_dtype,
        tuple(x.shape[:-1]),
        weight.shape[0],
        ctx.device,
    )
    result = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16}[fp8.out_dtype]
    return _Operands(dtypes[0], result, fp8 if fp8.mode else None), shapes


def _all_gather_linear(
    torch, ctx, x, weight, schedule, out, names, scale_a=None, scale_b=None, out_dtype=None
):
    sched, auto = _checks.resolve_schedule("all_gather", schedule)
    ops, shapes = _operands(
        torch, ctx, x, weight, names, scale_a, scale_b, out_dtype, _checks.all_gather_shapes
    )
    _checks.check_problem(
        sched, shapes.m, shapes.n, shapes.k, ctx.tp, _checks.ELEMENT_BYTES[ops.dtype]
    )
    m_local, n_local = shapes.m // ctx.tp, shapes.n // ctx.tp
    inst = _instance(
        ctx,
        sched,
        auto,
        shapes,
        ops.dtype,
        1.0,
        {"A": (m_local, shapes.k), "B": (n_local, shapes.k), "D": (shapes.m, n_local)},
        fp8=ops.fp8,
    )
    xn, wn = names
    given = out is not None
    out = _output(torch, out, shapes.out, ops.out_dtype, x)
    if given:  # a new tensor cannot overlap the inputs
        _check_no_overlap(out, ((xn, x), (wn, weight)))
    scale_ptrs = (0, 0)
    if ops.fp8 is not None and ops.fp8.mode == "row":
        # Kept alive until the launch is enqueued; afterwards the allocator's stream rule.
        vectors = _all_gather_row_scales(torch, ctx, *ops.fp8.scales, shapes.m, shapes.n)
        scale_ptrs = tuple(v.data_ptr() for v in vectors)
    _launch(torch, ctx, inst, x, weight, out, scale_ptrs)
    return out


def _linear_reduce_scatter(
    torch,
    ctx,
    x,
    weight,
    schedule,
    out,
    alpha,
    names,
    partials=None,
    scale_a=None,
    scale_b=None,
    out_dtype=None,
):
    sched, auto = _checks.resolve_schedule("reduce_scatter", schedule)
    _checks.check_partials(partials)
    ops, shapes = _operands(
        torch, ctx, x, weight, names, scale_a, scale_b, out_dtype, _checks.reduce_scatter_shapes
    )
    _checks.check_problem(
        sched, shapes.m, shapes.n, shapes.k, ctx.tp, _checks.ELEMENT_BYTES[ops.dtype]
    )
    k_local = shapes.k // ctx.tp
    inst = _instance(
        ctx,
        sched,
        auto,
        shapes,
        ops.dtype,
        alpha,
        {"A": (shapes.m, k_local), "B": (shapes.n, k_local), "D": (shapes.m // ctx.tp, shapes.n)},
        partials,
        ops.fp8,
    )
    xn, wn = names
    given = out is not None
    out = _output(torch, out, shapes.out, ops.out_dtype, x)
    if given:  # a new tensor cannot overlap the inputs
        _check_no_overlap(out, ((xn, x), (wn, weight)))
    # Row-wise: this rank's scale_a (M) and scale_b (N) are the full vectors already.
    scale_ptrs = (0, 0)
    if ops.fp8 is not None and ops.fp8.mode == "row":
        scale_ptrs = tuple(s.data_ptr() for s in ops.fp8.scales)
    _launch(torch, ctx, inst, x, weight, out, scale_ptrs)
    return out


def all_gather_linear(
    x_shard,
    weight,
    group=None,
    schedule="auto",
    return_gathered=False,
    out=None,
    *,
    scale_a=None,
    scale_b=None,
    out_dtype=None,
):
    """``all_gather(x_shard, dim=0) @ weight.T`` in one fused, pipelined op (column-parallel
    linear layer, e.g. a Llama MLP's fused gate+up projection under tensor parallelism).

    Args:
        x_shard: this rank's tokens, ``(T, ..., K)``, bf16, f16 or float8_e4m3fn (K a multiple
            of 16 then), contiguous, on this rank's current CUDA device; the group's shards in
            rank order are the whole input.
        weight: this rank's weight shard as ``nn.Linear`` stores it, ``(N/TP, K)``, contiguous,
            the dtype of ``x_shard``.
        group: the torch.distributed process group (default: the world).
        schedule: ``"auto"`` (distgemm picks pipelined or single-stage by its cost model),
            ``"ag-a"`` (pipelined) or ``"ag-a-single"``.
        return_gathered: also return the gathered input ``(TP·T, ..., K)`` (an extra
            all-gather through torch.distributed).
        out: optional output ``(TP·T, ..., N/TP)``; a new tensor otherwise.
        scale_a, scale_b: with ``torch.float8_e4m3fn`` operands (both e4m3, then both
            required) the dequantisation factors, both tensor-wise or both row-wise.
            Tensor-wise, the result is ``(scale_a·x) @ (scale_b·weight).T``; each a Python
            float or a one-element tensor, finite and at least 2^-63, the same on every rank.
            A tensor's value is read on the host (``.item()``), which synchronises with its
            stream: pass floats to avoid that. New scales need no rebuild (the cached
            instance's next launch applies them). Row-wise, ``scale_a`` is one float32 per
            row of ``x_shard`` (``(T, 1)``, ``(T,)``, or ``(T, ..., 1)`` for a 3-D input) and
            ``scale_b`` one per row of ``weight`` (``(N/TP,)``, ``(1, N/TP)`` or
            ``(N/TP, 1)``), contiguous, on this rank's device: the result's row ``i``, column
            ``j`` is ``scale_a[i]·scale_b[j]·(x @ weight.T)[i, j]`` over the gathered rows.
            Each call all-gathers ``scale_a`` through torch.distributed (one small collective
            of 4·TP·T bytes, on the current stream's order) into the scales of the gathered
            rows. Their values are not read (that would synchronise): keep them finite and at
            least 2^-63.
        out_dtype: the result's dtype: ``torch.bfloat16`` for e4m3 operands (the only one
            distgemm's FP8 kernels write; the default), the operands' dtype for bf16/f16.

    Returns:
        ``out``, or ``(out, gathered)`` with ``return_gathered``.
    """
    torch = _torch()
    ctx = _context(torch, group)
    result = _all_gather_linear(
        torch,
        ctx,
        x_shard,
        weight,
        schedule,
        out,
        ("x_shard", "weight"),
        scale_a,
        scale_b,
        out_dtype,
    )
    if return_gathered:
        return result, _gather_rows(torch, ctx, x_shard, ctx.tp)
    return result


def linear_reduce_scatter(
    x,
    weight,
    group=None,
    schedule="auto",
    out=None,
    partials=None,
    *,
    scale_a=None,
    scale_b=None,
    out_dtype=None,
):
    """``reduce_scatter(x @ weight.T, dim=0)`` (sum) in one fused, pipelined op (row-parallel
    linear layer, e.g. a Llama MLP's down projection under tensor parallelism).

    Args:
        x: this rank's activation, ``(T, ..., K/TP)`` (all T tokens, this rank's K-slice),
            bf16, f16 or float8_e4m3fn (K/TP a multiple of 16 then), contiguous, on this
            rank's current CUDA device; T divisible by TP.
        weight: this rank's weight shard as ``nn.Linear`` stores it, ``(N, K/TP)``, contiguous,
            the dtype of ``x``.
        group: the torch.distributed process group (default: the world).
        schedule: ``"auto"``, ``"rs-a"`` (pipelined) or ``"rs-a-single"``.
        out: optional output ``(T/TP, ..., N)``; a new tensor otherwise.
        partials: how a pipelined stage gets its neighbour's partial sum: ``"read"`` (its
            epilogue reads the neighbour's memory) or ``"push"`` (the neighbour's copy engine
            pushes it into this rank's memory first; more workspace). ``None`` (the default):
            with ``schedule="auto"``, what a tuning table (``DISTGEMM_TUNING``, written by
            ``distgemm tune``) measured faster for this problem, else ``"read"``. Ignored by
            the single-stage schedule.
        scale_a, scale_b: with ``torch.float8_e4m3fn`` operands (both e4m3, then both
            required) the dequantisation factors, both tensor-wise or both row-wise.
            Tensor-wise, the result is ``(scale_a·x) @ (scale_b·weight).T``; each a Python
            float or a one-element tensor, finite and at least 2^-63, the same on every rank.
            A tensor's value is read on the host (``.item()``), which synchronises with its
            stream: pass floats to avoid that. New scales need no rebuild (the cached
            instance's next launch applies them). Row-wise, ``scale_a`` is one float32 per
            row of ``x`` (all T tokens: ``(T, 1)``, ``(T,)``, or ``(T, ..., 1)`` for a 3-D
            input) and ``scale_b`` one per row of ``weight`` (``(N,)``, ``(1, N)`` or
            ``(N, 1)``), contiguous, on this rank's device, each rank its own: the result is
            ``Σ_r diag(scale_a_r)·x_r·weight_rᵀ·diag(scale_b_r)`` over the ranks r (each
            rank's scales apply to its own K-slice, as when every rank quantises its own
            shards). No collective; their values are not read (that would synchronise): keep
            them finite and at least 2^-63.
        out_dtype: the result's dtype: ``torch.bfloat16`` for e4m3 operands (the only one
            distgemm's FP8 kernels write; the default), the operands' dtype for bf16/f16.

    Returns:
        This rank's block of token rows of the summed product, ``(T/TP, ..., N)`` (with e4m3
        operands, each rank's partial sum is rounded to bf16 at every reduce-scatter hop).
    """
    torch = _torch()
    ctx = _context(torch, group)
    return _linear_reduce_scatter(
        torch,
        ctx,
        x,
        weight,
        schedule,
        out,
        1.0,
        ("x", "weight"),
        partials,
        scale_a,
        scale_b,
        out_dtype,
    )


def fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    """Drop-in for ``torch.ops.symm_mem.fused_all_gather_matmul`` (same arguments and results)
    for ``gather_dim=0`` and bf16/f16: returns ``(A or None, [all_gather(A_shard) @ B for B in
    Bs])``.

    Each ``B`` is ``K × N/TP``; ``W.t()`` of a contiguous ``(N/TP, K)`` weight is used as is,
    any other layout is copied per call (with a one-time warning). Each B is one distgemm run
    (the gather is repeated per B). ``return_A=True`` (torch's default) costs an extra
    all-gather through torch.distributed; pass ``return_A=False`` when A is not needed.
    """
    torch = _torch()
    group = _group_from_name(group_name)
    ctx = _context(torch, group)
    _check_dropin_input("A_shard", A_shard, "gather_dim", gather_dim)
    if not isinstance(Bs, (list, tuple)) or not Bs:
        raise ValueError("Bs must be a non-empty list of matrices (K × N/TP)")
    outs = []
    for i, B in enumerate(Bs):
        weight = _weight_from_b(torch, B, f"Bs[{i}]")
        outs.append(
            _all_gather_linear(torch, ctx, A_shard, weight, "auto", None, ("A_shard", f"Bs[{i}]"))
        )
    gathered = _gather_rows(torch, ctx, A_shard, ctx.tp) if return_A else None
    return gathered, outs


def fused_all_gather_scaled_matmul(
    A_shard,
    Bs,
    A_scale,
    B_scales,
    gather_dim,
    group_name,
    biases=None,
    result_scales=None,
    out_dtypes=None,
    use_fast_accum=None,
    *,
    return_A=True,
):
    """Drop-in for ``torch.ops.symm_mem.fused_all_gather_scaled_matmul`` (same arguments and
    results) for ``gather_dim=0`` and ``float8_e4m3fn`` operands: returns ``(A or None,
    [(A_scale·all_gather(A_shard)) @ (B_scale·B) for B, B_scale in zip(Bs, B_scales)])`` in
    bf16.

    Tensor-wise, ``A_scale`` and each of ``B_scales`` are one-element tensors (read on the
    host: a synchronisation) or floats. Row-wise (torch's sharded row-wise mode),
    ``A_scale`` is ``(*A_shard.shape[:-1], 1)`` float32 (this rank's rows; all-gathered, one
    small collective per B) and each of ``B_scales`` ``(1, N/TP)`` float32 (per output
    column); torch's replicated row-wise ``A_scale`` (the gathered rows' scales on every rank)
    is refused. Mixing a row-wise with a tensor-wise scale raises ``ValueError``. Each ``B`` is
    ``K × N/TP``, ``W.t()`` of a contiguous e4m3 ``(N/TP, K)`` weight (the layout torch's
    ``_scaled_mm`` wants; any other is copied per call, with a one-time warning). ``biases`` and
    ``result_scales`` must be None or lists of None; ``out_dtypes`` None (bf16) or a list of
    ``torch.bfloat16``. ``use_fast_accum`` is accepted and ignored: distgemm's FP8 GEMM always
    accumulates in the tensor cores' own precision, without promotion (what
    ``use_fast_accum=True`` selects in torch). ``return_A`` as in
    :func:`fused_all_gather_matmul` (torch's op always returns A).
    """
    torch = _torch()
    group = _group_from_name(group_name)
    ctx = _context(torch, group)
    _check_dropin_input("A_shard", A_shard, "gather_dim", gather_dim)
    if not isinstance(Bs, (list, tuple)) or not Bs:
        raise ValueError("Bs must be a non-empty list of matrices (K × N/TP)")
    count = len(Bs)
    if not isinstance(B_scales, (list, tuple)) or len(B_scales) != count:
        raise ValueError(f"B_scales must be a list of {count} scales, one per B")
    for name, values in (("biases", biases), ("result_scales", result_scales)):
        if values is not None and any(v is not None for v in values):
            raise ValueError(f"{name}: distgemm's scaled all-gather GEMM takes no {name} yet")
    if out_dtypes is None:
        out_dtypes = [torch.bfloat16] * count
    if not isinstance(out_dtypes, (list, tuple)) or len(out_dtypes) != count:
        raise ValueError(f"out_dtypes must be a list of {count} dtypes, one per B")
    outs = []
    for i, (B, b_scale, dtype) in enumerate(zip(Bs, B_scales, out_dtypes)):
        if dtype is None:
            raise TypeError(
                f"out_dtypes[{i}]=None asks for e4m3 results; distgemm's FP8 GEMMs write "
                "torch.bfloat16"
            )
        weight = _weight_from_b(torch, B, f"Bs[{i}]")
        outs.append(
            _all_gather_linear(
                torch,
                ctx,
                A_shard,
                weight,
                "auto",
                None,
                ("A_shard", f"Bs[{i}]"),
                A_scale,
                b_scale,
                dtype,
            )
        )
    gathered = _gather_rows(torch, ctx, A_shard, ctx.tp) if return_A else None
    return gathered, outs


def fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    """Drop-in for ``torch.ops.symm_mem.fused_matmul_reduce_scatter`` (same arguments and
    result) for ``scatter_dim=0``, bf16/f16 and ``reduce_op`` "sum" or "avg": this rank's row
    block of ``reduce(A @ B)`` over the group.

    ``B`` is ``K/TP × N``; ``W.t()`` of a contiguous ``(N, K/TP)`` weight is used as is, any other
    layout is copied per call (with a one-time warning). "avg" scales by 1/TP in the epilogue.
    """
    torch = _torch()
    group = _group_from_name(group_name)
    ctx = _context(torch, group)
    alpha = _reduce_alpha(reduce_op, ctx.tp)
    _check_dropin_input("A", A, "scatter_dim", scatter_dim)
    weight = _weight_from_b(torch, B, "B")
    return _linear_reduce_scatter(torch, ctx, A, weight, "auto", None, alpha, ("A", "B"))


def fused_scaled_matmul_reduce_scatter(
    A,
    B,
    A_scale,
    B_scale,
    reduce_op,
    orig_scatter_dim,
    scatter_dim_after_maybe_reshape,
    group_name,
    output_shape,
    bias=None,
    result_scale=None,
    out_dtype=None,
    use_fast_accum=False,
):
    """Drop-in for ``torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter`` (same arguments
    and result) for scatter dimension 0, ``float8_e4m3fn`` operands and a bf16 result: this
    rank's row block of ``reduce((A_scale·A) @ (B_scale·B))`` over the group, shaped as
    ``output_shape`` with dimension 0 divided by TP.

    ``A`` is this rank's ``(..., K/TP)`` activation; ``output_shape`` the unreduced product's
    shape (``[*A.shape[:-1], N]``, or A's rows regrouped when A was flattened to a matrix, as
    torch's async-TP pass does), whose dimension 0 TP divides; ``orig_scatter_dim`` (a
    dimension of ``output_shape``) and ``scatter_dim_after_maybe_reshape`` (of ``A``) must be 0.
    ``B`` is ``K/TP × N``, ``W.t()`` of a contiguous e4m3 ``(N, K/TP)`` weight (the layout
    torch's ``_scaled_mm`` wants; any other is copied per call, with a one-time warning).
    ``A_scale`` and ``B_scale`` are tensor-wise (one-element tensors, read on the host: a
    synchronisation, or floats) or row-wise as torch's ``_scaled_mm`` takes them:
    ``A_scale`` ``(*A.shape[:-1], 1)`` float32 (one per row of A, every token) and
    ``B_scale`` ``(1, N)`` float32 (one per output column), this rank's own (they scale its
    K-slice's products, as :func:`linear_reduce_scatter`). ``reduce_op`` "sum" or "avg" (1/TP folded
    into the epilogue's alpha). ``bias`` and ``result_scale`` must be None (``ValueError``).
    ``out_dtype`` must be ``torch.bfloat16``: torch's default None means an e4m3 result, which
    distgemm's FP8 kernels do not write (``TypeError``). ``use_fast_accum`` is accepted and
    ignored: distgemm's FP8 GEMM does not promote, it always accumulates in the tensor cores'
    own precision (what ``use_fast_accum=True`` selects in torch). Each rank's partial sum is
    rounded to bf16 at every reduce-scatter hop, as in :func:`linear_reduce_scatter`.
    """
    torch = _torch()
    group = _group_from_name(group_name)
    ctx = _context(torch, group)
    alpha = _reduce_alpha(reduce_op, ctx.tp)
    _check_dropin_input("A", A, "scatter_dim_after_maybe_reshape", scatter_dim_after_maybe_reshape)
    for name, value in (("bias", bias), ("result_scale", result_scale)):
        if value is not None:
            raise ValueError(f"{name}: distgemm's scaled reduce-scatter GEMM takes no {name} yet")
    if out_dtype is None:
        raise TypeError(
            "out_dtype=None asks for a float8_e4m3fn result (torch's default: A's dtype); "
            "distgemm's FP8 GEMMs write torch.bfloat16: pass out_dtype=torch.bfloat16"
        )
    weight = _weight_from_b(torch, B, "B")
    shape = _checks.scattered_output_shape(
        output_shape, orig_scatter_dim, tuple(A.shape), weight.shape[0], ctx.tp
    )
    out = _linear_reduce_scatter(
        torch,
        ctx,
        A,
        weight,
        "auto",
        None,
        alpha,
        ("A", "B"),
        None,
        A_scale,
        B_scale,
        out_dtype,
    )
    return out.view(shape)


def synchronize():
    """Waits for every cached instance's last run (this rank) and raises its error, if any."""
    for inst in CACHE.values():
        inst.synchronize()
