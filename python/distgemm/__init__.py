"""distgemm: tensor-parallel all-gather and reduce-scatter GEMMs for Hopper GPUs, on torch
tensors, one process per GPU.

The GEMM kernels, the pipelined schedules (communication hidden behind the stage GEMMs) and the
cross-process protocol are distgemm's Rust library; this package runs them on
``torch.cuda.current_stream()`` over a ``torch.distributed`` process group::

    import distgemm
    h = distgemm.all_gather_linear(x_shard, w1_shard)          # all_gather(x) @ w1_shard.T
    y = distgemm.linear_reduce_scatter(act, w2_shard)          # reduce_scatter(act @ w2_shard.T)

    # FP8 (float8_e4m3fn operands, tensor-wise scales, bf16 result):
    h = distgemm.all_gather_linear(x8_shard, w8_shard, scale_a=sx, scale_b=sw)

    # or, switching from PyTorch's async-TP ops by changing the import:
    A, [h] = distgemm.fused_all_gather_matmul(x_shard, [w1_shard.t()], 0, group.group_name)
    y = distgemm.fused_matmul_reduce_scatter(act, w2_shard.t(), "sum", 0, group.group_name)

Every op is collective over its group. ``import distgemm`` needs neither torch nor a GPU; the
ops import torch when called. Environment: ``DISTGEMM_TIMEOUT_S`` (bound of every cross-rank
wait), ``DISTGEMM_CACHE_SIZE`` (built instances kept, default 32),
``DISTGEMM_ALLOW_SHARED_GPU=1`` (tests only: ranks that share one GPU, with the gloo backend).
"""

import atexit as _atexit

from ._cache import clear_cache
from ._distgemm import DistGemmError, __version__
from ._ops import (
    all_gather_linear,
    fused_all_gather_matmul,
    fused_all_gather_scaled_matmul,
    fused_matmul_reduce_scatter,
    fused_scaled_matmul_reduce_scatter,
    linear_reduce_scatter,
    synchronize,
)

__all__ = [
    "DistGemmError",
    "__version__",
    "all_gather_linear",
    "clear_cache",
    "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
    "linear_reduce_scatter",
    "synchronize",
]


def _at_exit() -> None:
    from . import _cache

    collective = False
    if not _cache.exited_with_error():
        try:
            import sys

            dist = sys.modules.get("torch.distributed")
            collective = dist is not None and dist.is_available() and dist.is_initialized()
        except Exception:  # noqa: BLE001 - a half-torn-down torch: abandon, never hang
            collective = False
    try:
        _cache.close_at_exit(collective)
    except Exception as e:  # noqa: BLE001 - exiting: report, do not raise
        import sys

        print(f"distgemm: closing instances at exit failed: {e}", file=sys.stderr)


_atexit.register(_at_exit)
