#!/usr/bin/env python3
"""PyTorch peers of distgemm on one node: async tensor parallelism (symmetric memory) and the
plain NCCL collective + matmul sequence, on the Llama-3 MLP presets.

Spawns one process per GPU itself (torch.multiprocessing, NCCL backend). For every preset,
token count and collective it measures, with CUDA events on the current stream of each rank:

  all-gather family (fc1-style: A row-sharded M/P x K, W row-sharded N/P x K, B = W^T):
    fused_all_gather_matmul     torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, group)
    nccl_all_gather+matmul      dist.all_gather_into_tensor(A_full, A) ; torch.mm(A_full, B)
    matmul_ag_local             torch.mm(A_full, B) alone (M x N/P x K, no communication)
    matmul_ag_split             the same in P row chunks, back to back (the fused op's GEMMs)
    matmul_ag_split+peer_pull   the chunks plus a 4 KiB copy from the next GPU per call
  reduce-scatter family (fc2-style: A K-sharded M x K/P, W K-sharded N x K/P, B = W^T):
    fused_matmul_reduce_scatter torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group)
    matmul+nccl_reduce_scatter  torch.mm(A, B) ; dist.reduce_scatter_tensor(out, partial)
    matmul_rs_local             torch.mm(A, B) alone (M x N x K/P, no communication)
    matmul_rs_split             the same in P row chunks, back to back
    matmul_rs_split+peer_pull   the chunks plus a 4 KiB copy from the next GPU per call
The split ops (kinds "split" and "link", not run by default) say what the stage split and
NVLink in use cost cuBLAS: any traffic keeps the links at high speed, whose power the SMs lose
under the board's power cap (kernels-gpu/NOTES.md, steps 21-22).

Each measurement: --warmup calls, then untimed calls until at least --settle-ms of GPU work
has run (the GPUs are power-capped and the limiter takes up to a second to converge on a new
load, so a block timed straight away reads fast; distgemm's bench settles every block the
same way and passes its own --settle-ms): one call is timed on the wall clock between two
synchronizes, and ceil(settle_ms / t) more calls follow, t being the fastest rank's time so that every rank makes
the same number of calls (the collectives need that) and each at least --settle-ms of work;
then --reps timed calls, each bracketed by CUDA events. With --rounds R the ops of one
preset and token count take turns: R blocks each (the order reversed every other round), each
block settled as above and timing ceil(reps / R) calls, the samples pooled; ops timed in the
same rounds see the same drift of clocks and power. The reported "ms" is the slowest
rank's median call, as distgemm's bench reports every contender (distgemm::timing: ranks that
meet in a collective every call make each other wait, so the per-call maximum counts a slow
rank's excess twice); "ms_per_call_max" is the median of the per-call maxima, and
"min_ms"/"max_ms" the extremes of those.
Rank 0 prints one JSON object per measurement on stdout:
  {"preset","tp","m","n","k","dtype","op","collective","ms","ms_per_call_max","min_ms","max_ms",
   "reps"}
or, when an op is unavailable or fails, the same keys with "error" instead of the times.
A first line {"op": "info", ...} gives the PyTorch / NCCL / GPU versions. Diagnostics go to
stderr. Standard library + torch only.

Usage: torch_async_tp.py [--presets a,b] [--tokens 16384[,8192,...]] [--tp N] [--dtype bf16]
                         [--reps 20] [--rounds 1] [--warmup 3] [--settle-ms 1000]
                         [--collectives ag,rs] [--ops async,nccl,local[,split,link]]
"""

import os

# Before torch is imported: no NVLink SHARP / multicast objects on these machines.
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

from peer_common import median  # noqa: E402

PRESETS = {
    # name: (N, K) -- as host/src/problem.rs (fc1: fused gate+up projection).
    "llama3-70b-fc1": (57344, 8192),
    "llama3-70b-fc2": (8192, 28672),
    "llama3-405b-fc1": (106496, 16384),
    "llama3-405b-fc2": (16384, 53248),
}

OPS = {
    "ag": {
        "async": "fused_all_gather_matmul",
        "nccl": "nccl_all_gather+matmul",
        "local": "matmul_ag_local",
        "split": "matmul_ag_split",
        "link": "matmul_ag_split+peer_pull",
    },
    "rs": {
        "async": "fused_matmul_reduce_scatter",
        "nccl": "matmul+nccl_reduce_scatter",
        "local": "matmul_rs_local",
        "split": "matmul_rs_split",
        "link": "matmul_rs_split+peer_pull",
    },
}

# Bytes the "link" op pulls from the next GPU per call: enough to wake most NVLink links.
PEER_PULL_BYTES = 4096


def emit(record):
    print(json.dumps(record, sort_keys=True), flush=True)


def log(msg):
    print(f"torch_async_tp: {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default="16384", help="comma-separated M values")
    p.add_argument("--tp", type=int, default=0, help="GPUs (default: all visible)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--rounds", type=int, default=1, help="interleaved blocks per op (reps split among them)"
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--settle-ms",
        type=float,
        default=1000.0,
        help="untimed GPU work after the warm-up, before the timed calls (0: none)",
    )
    p.add_argument("--collectives", default="ag,rs")
    p.add_argument("--ops", default="async,nccl,local")
    p.add_argument("--timeout-s", type=int, default=300, help="process-group timeout")
    a = p.parse_args(argv)
    a.presets = [x for x in a.presets.split(",") if x]
    a.tokens = [int(x) for x in a.tokens.split(",") if x]
    a.collectives = [x for x in a.collectives.split(",") if x]
    a.ops = [x for x in a.ops.split(",") if x]
    bad = [x for x in a.presets if x not in PRESETS]
    if bad:
        p.error(f"unknown preset(s) {bad}; known: {list(PRESETS)}")
    bad = [x for x in a.collectives if x not in OPS]
    if bad:
        p.error(f"unknown collective(s) {bad}; known: ag, rs")
    bad = [x for x in a.ops if x not in OPS["ag"]]
    if bad:
        p.error(f"unknown op kind(s) {bad}; known: {', '.join(OPS['ag'])}")
    if a.reps < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--reps and --rounds must be >= 1 and --warmup >= 0")
    if not math.isfinite(a.settle_ms) or a.settle_ms < 0:
        p.error("--settle-ms must be a finite number >= 0")
    return a


def shapes(preset, m, tp, collective):
    """Per-rank operand shapes: (A, W, out, gathered-or-partial), all row-major; B = W^T."""
    n, k = PRESETS[preset]
    if collective == "ag":
        if m % tp or n % tp:
            raise ValueError(f"M={m} and N={n} must divide by TP={tp}")
        return (m // tp, k), (n // tp, k), (m, n // tp), (m, k)
    if m % tp or k % tp:
        raise ValueError(f"M={m} and K={k} must divide by TP={tp}")
    return (m, k // tp), (n, k // tp), (m // tp, n), (m, n)


def worker(rank, args, port):
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    kwargs = dict(
        backend="nccl",
        rank=rank,
        world_size=args.tp,
        timeout=datetime.timedelta(seconds=args.timeout_s),
    )
    try:
        dist.init_process_group(device_id=device, **kwargs)
    except TypeError:  # older PyTorch without device_id
        dist.init_process_group(**kwargs)
    group = dist.group.WORLD
    group_name = group.group_name
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    lead = rank == 0

    symm = None
    symm_note = ""
    try:
        import torch.distributed._symmetric_memory as symm

        if hasattr(symm, "enable_symm_mem_for_group"):
            # Required up to ~2.9, deprecated (harmless) later.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm.enable_symm_mem_for_group(group_name)
    except Exception as e:  # noqa: BLE001 - report, keep measuring the NCCL path
        symm_note = f"symmetric memory setup failed: {type(e).__name__}: {e}"
        log(f"rank {rank}: {symm_note}")

    if lead:
        info = {
            "op": "info",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "tp": args.tp,
            "gpus": [torch.cuda.get_device_name(i) for i in range(args.tp)],
            "env": {
                k: os.environ.get(k)
                for k in (
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                    "NCCL_NVLS_ENABLE",
                    "NVSHMEM_DISABLE_NVLS",
                )
            },
        }
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        if symm_note:
            info["symm_mem_note"] = symm_note
        emit(info)

    def symm_alloc(shape):
        """A tensor in symmetric memory (for PyTorch versions whose fused ops want one)."""
        t = symm.empty(shape, dtype=dtype, device=device)
        symm.rendezvous(t, group_name)
        return t

    def settle(fn):
        """Untimed calls of fn until at least --settle-ms of GPU work has run on every rank.

        One call is timed on the wall clock between two synchronizes; the fastest rank's time
        t sets ceil(settle_ms / t) more calls, the same count on every rank (collective ops
        must be called equally often everywhere), at least settle_ms of work on each.
        """
        if args.settle_ms <= 0:
            return
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t_ms = torch.tensor([(time.perf_counter() - start) * 1e3], device=device)
        dist.all_reduce(t_ms, op=dist.ReduceOp.MIN)
        for _ in range(math.ceil(args.settle_ms / max(t_ms.item(), 1e-6))):
            fn()

    def timed(fn, reps):
        """Warm-up and settle, then per-call event times; returns every rank's times."""
        stream = torch.cuda.current_stream()
        for _ in range(args.warmup):
            fn()
        settle(fn)
        torch.cuda.synchronize()
        dist.barrier()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for start, end in events:
            start.record(stream)
            fn()
            end.record(stream)
        torch.cuda.synchronize()
        times = torch.tensor([s.elapsed_time(e) for s, e in events], device=device)
        gathered = [torch.empty_like(times) for _ in range(args.tp)]
        dist.all_gather(gathered, times)
        return [g.tolist() for g in gathered]

    # A small tensor on the next GPU, which the "link" ops pull from (this process's own
    # allocation there: the bytes, not their owner, wake the links).
    peer_src = None
    if "link" in args.ops and args.tp > 1:
        peer = torch.device("cuda", (rank + 1) % args.tp)
        peer_src = torch.randn(PEER_PULL_BYTES // 2, dtype=dtype, device=peer)
        peer_dst = torch.empty_like(peer_src, device=device)

    def pull_from_peer():
        peer_dst.copy_(peer_src, non_blocking=True)

    per_round = math.ceil(args.reps / args.rounds)
    for preset in args.presets:
        n, k = PRESETS[preset]
        for m in args.tokens:
            for coll in args.collectives:
                base = {
                    "preset": preset,
                    "tp": args.tp,
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": args.dtype,
                    "collective": coll,
                }
                try:
                    a_shape, w_shape, out_shape, big_shape = shapes(preset, m, args.tp, coll)
                except ValueError as e:
                    if lead:
                        for kind in args.ops:
                            emit({**base, "op": OPS[coll][kind], "error": str(e)})
                    continue
                gen = torch.Generator(device=device)
                gen.manual_seed(1000 * rank + m)
                a = torch.randn(a_shape, generator=gen, dtype=dtype, device=device)
                w = torch.randn(w_shape, generator=gen, dtype=dtype, device=device)
                b = w.t()  # K x N_local (column-major view): the "TN" GEMM of distgemm
                out = torch.empty(out_shape, dtype=dtype, device=device)
                # The gathered A (all-gather) is random too, so the local-only matmul never
                # multiplies uninitialised memory; the partial (reduce-scatter) is overwritten.
                if coll == "ag":
                    big = torch.randn(big_shape, generator=gen, dtype=dtype, device=device)
                else:
                    big = torch.empty(big_shape, dtype=dtype, device=device)
                extra = pull_from_peer if peer_src is not None else None
                fns, samples, failed = {}, {}, {}
                for rnd in range(args.rounds):
                    for kind in args.ops if rnd % 2 == 0 else args.ops[::-1]:
                        if kind in failed:
                            continue
                        op = OPS[coll][kind]
                        try:
                            if kind not in fns:
                                fns[kind] = make_op(
                                    coll, kind, a, b, out, big, group, group_name, args.tp, extra
                                )
                            try:
                                got = timed(fns[kind], per_round)
                            except Exception as first:  # noqa: BLE001
                                if kind != "async" or symm is None or not hasattr(symm, "empty"):
                                    raise
                                # Some versions want the sharded input in symmetric memory.
                                log(
                                    f"rank {rank}: {op} on a regular tensor failed "
                                    f"({type(first).__name__}: {first}); retrying with the "
                                    "input in symmetric memory"
                                )
                                a_symm = symm_alloc(a_shape)
                                a_symm.copy_(a)
                                fns[kind] = make_op(
                                    coll, kind, a_symm, b, out, big, group, group_name, args.tp
                                )
                                got = timed(fns[kind], per_round)
                            for r, times in enumerate(got):
                                samples.setdefault(kind, [[] for _ in got])[r].extend(times)
                        except Exception as e:  # noqa: BLE001 - one failing op must not end the run
                            log(f"rank {rank}: {op} {preset} M={m}: {traceback.format_exc()}")
                            failed[kind] = f"{type(e).__name__}: {e}"
                            torch.cuda.synchronize()
                        # Keep the ranks in step between measurements.
                        dist.barrier()
                if lead:
                    for kind in args.ops:
                        op = OPS[coll][kind]
                        if kind in failed:
                            emit({**base, "op": op, "error": failed[kind]})
                            continue
                        per_rank = samples[kind]
                        per_call_max = [max(call) for call in zip(*per_rank)]
                        emit(
                            {
                                **base,
                                "op": op,
                                "ms": max(median(r) for r in per_rank),
                                "ms_per_call_max": median(per_call_max),
                                "min_ms": min(per_call_max),
                                "max_ms": max(per_call_max),
                                "reps": len(per_call_max),
                                "rounds": args.rounds,
                            }
                        )
                del a, w, b, out, big, fns
                torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()


def make_op(coll, kind, a, b, out, big, group, group_name, tp, extra=None):
    """The call that op `kind` of collective `coll` times; `extra` (the "link" ops) runs first."""
    import torch
    import torch.distributed as dist

    if kind in ("split", "link"):
        if kind == "link" and extra is None:
            raise ValueError("the peer pull needs TP >= 2")
        # The local matmul of the family, its left operand and output cut into tp row chunks.
        lhs, res = (big, out) if coll == "ag" else (a, big)
        rows = lhs.shape[0] // tp
        chunks = [(lhs[i * rows : (i + 1) * rows], res[i * rows : (i + 1) * rows]) for i in range(tp)]

        def split():
            if kind == "link":
                extra()
            for x, y in chunks:
                torch.mm(x, b, out=y)

        return split

    if coll == "ag":
        if kind == "async":
            op = torch.ops.symm_mem.fused_all_gather_matmul
            state = {"return_A": False}

            def fused_ag():
                if state["return_A"] is False:
                    try:
                        return op(a, [b], 0, group_name, return_A=False)
                    except (TypeError, RuntimeError) as e:
                        if "return_A" not in str(e):
                            raise
                        state["return_A"] = None  # older schema without the keyword
                return op(a, [b], 0, group_name)

            return fused_ag
        if kind == "nccl":

            def ag_mm():
                dist.all_gather_into_tensor(big, a, group=group)
                torch.mm(big, b, out=out)

            return ag_mm

        def mm_ag_local():
            torch.mm(big, b, out=out)

        return mm_ag_local

    if kind == "async":
        op = torch.ops.symm_mem.fused_matmul_reduce_scatter

        def fused_rs():
            return op(a, b, "sum", 0, group_name)

        return fused_rs
    if kind == "nccl":

        def mm_rs():
            torch.mm(a, b, out=big)
            dist.reduce_scatter_tensor(out, big, group=group)

        return mm_rs

    def mm_rs_local():
        torch.mm(a, b, out=big)

    return mm_rs_local


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001
        emit({"op": "setup", "error": f"cannot import torch: {type(e).__name__}: {e}"})
        return 1
    if not torch.cuda.is_available():
        emit({"op": "setup", "error": "torch.cuda.is_available() is False"})
        return 1
    count = torch.cuda.device_count()
    if args.tp == 0:
        args.tp = count
    if args.tp < 1 or args.tp > count:
        emit({"op": "setup", "error": f"--tp {args.tp} but {count} GPU(s) are visible"})
        return 1
    try:
        mp.spawn(worker, args=(args, free_port()), nprocs=args.tp, join=True)
    except Exception as e:  # noqa: BLE001 - a worker died; what rank 0 printed stands
        emit({"op": "setup", "error": f"a worker process failed: {type(e).__name__}: {e}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
