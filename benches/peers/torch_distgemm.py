#!/usr/bin/env python3
"""distgemm's PyTorch ops against PyTorch's fused async-TP ops and NCCL + matmul, one torchrun
job, one process per GPU:

    torchrun --nproc-per-node 2 benches/peers/torch_distgemm.py [--presets a,b] \
        [--tokens 256,512,...,16384] [--ops ag,rs] [--dtype bf16] [--reps 30] [--rounds 3] \
        [--settle-ms 1000] [--out DIR]

For every preset, token count M and collective it times three contenders on the same tensors
(the shapes of benches/peers/torch_async_tp.py, weights in nn.Linear layout W, B = W.t()):

  all-gather (fc1-style):   distgemm    distgemm.all_gather_linear(A_shard, W_shard, out=out)
                            torch_fused torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, g)
                            nccl_matmul dist.all_gather_into_tensor(A, A_shard); torch.mm(A, B, out=out)
  reduce-scatter (fc2-style): distgemm  distgemm.linear_reduce_scatter(A, W_shard, out=out)
                            torch_fused torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, g)
                            nccl_matmul torch.mm(A, B, out=P); dist.reduce_scatter_tensor(out, P)

in --rounds interleaved rounds (the order reversed every other round); each block is settled
first (untimed calls until --settle-ms of GPU work ran: the GPUs are power-capped), then times
ceil(reps / rounds) calls with CUDA events. Every rank's samples are pooled per contender; the
reported time is the slowest rank's median (as distgemm's own bench reports). Also recorded for
distgemm: build_ms, the first call of a new token count (the collective build of the instance,
measured on the host to the end of that call's GPU work), and host_us, the median host time
of one call (checks, cache lookup, graph launch; no synchronisation) — the per-call path.

Writes <out>/torch-<date>-<commit>[-<options>].json (records) and .md (table), the commit
from DISTGEMM_COMMIT, a bundle's MANIFEST.txt or `git`, <out> = --out, $DISTGEMM_BENCH_RESULTS or benches/results.
Record keys: preset, tp, m, n, k, dtype, op, distgemm_ms, torch_fused_ms, nccl_matmul_ms,
build_ms, host_us, machine, commit (a contender that fails has null and an *_error key).
Needs one GPU per rank (NCCL backend). Standard library + torch + distgemm.
"""

import os

# Before torch is imported: no NVLink SHARP / multicast objects on these machines.
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse
import datetime
import json
import math
import sys
import time
import traceback
import warnings

from peer_common import commit_id, fmt, median, results_dir

PRESETS = {  # name: (N, K), as host/src/problem.rs (fc1: fused gate+up projection)
    "llama3-70b-fc1": (57344, 8192),
    "llama3-70b-fc2": (8192, 28672),
    "llama3-405b-fc1": (106496, 16384),
    "llama3-405b-fc2": (16384, 53248),
}
CONTENDERS = ("distgemm", "torch_fused", "nccl_matmul")
OP_NAMES = {"ag": "all_gather", "rs": "reduce_scatter"}
DEFAULT_TOKENS = "256,512,1024,2048,4096,8192,16384"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help="comma-separated M values")
    p.add_argument("--ops", default="ag,rs", help="collectives: ag, rs")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--reps", type=int, default=30, help="timed calls per contender (all rounds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--settle-ms", type=float, default=1000.0)
    p.add_argument("--host-calls", type=int, default=50, help="calls timed for host_us")
    p.add_argument("--out", default=None, help="results folder")
    a = p.parse_args(argv)
    a.presets = [x for x in a.presets.split(",") if x]
    a.tokens = [int(x) for x in a.tokens.split(",") if x]
    a.ops = [x for x in a.ops.split(",") if x]
    for name, values, known in (("preset", a.presets, PRESETS), ("op", a.ops, OP_NAMES)):
        bad = [x for x in values if x not in known]
        if bad:
            p.error(f"unknown {name}(s) {bad}; known: {', '.join(known)}")
    if a.reps < 1 or a.rounds < 1 or a.warmup < 0 or not a.settle_ms >= 0:
        p.error("--reps and --rounds must be >= 1, --warmup and --settle-ms >= 0")
    return a


def shapes(collective, m, n, k, tp):
    """Per-rank (A, W, out, gathered-or-partial) shapes; None when TP does not divide."""
    if collective == "ag":
        if m % tp or n % tp:
            return None
        return (m // tp, k), (n // tp, k), (m, n // tp), (m, k)
    if m % tp or k % tp:
        return None
    return (m, k // tp), (n, k // tp), (m // tp, n), (m, n)


def main(argv=None):
    args = parse_args(argv)
    import distgemm
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.device_count() < world:
        print(
            f"torch_distgemm: {world} ranks need {world} GPUs ({torch.cuda.device_count()} visible)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=600))
    group = dist.group.WORLD
    gname = group.group_name
    lead = rank == 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    try:
        import torch.distributed._symmetric_memory as symm

        if hasattr(symm, "enable_symm_mem_for_group"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm.enable_symm_mem_for_group(gname)
    except Exception as e:  # noqa: BLE001 - the fused contender then reports its error
        if lead:
            print(f"torch_distgemm: symmetric memory setup failed: {e}", file=sys.stderr)

    names = [None] * world
    dist.all_gather_object(names, torch.cuda.get_device_name(device))
    machine = f"{world} x {names[0]}" if len(set(names)) == 1 else " + ".join(names)
    commit = commit_id(__file__)

    def settle(fn):
        if args.settle_ms <= 0:
            return
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - start) * 1e3], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        for _ in range(math.ceil(args.settle_ms / max(t.item(), 1e-6))):
            fn()

    def timed(fn, reps):
        for _ in range(args.warmup):
            fn()
        settle(fn)
        torch.cuda.synchronize()
        dist.barrier()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        stream = torch.cuda.current_stream()
        for start, end in events:
            start.record(stream)
            fn()
            end.record(stream)
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in events]

    records = []
    per_round = math.ceil(args.reps / args.rounds)
    for preset in args.presets:
        n, k = PRESETS[preset]
        for m in args.tokens:
            for coll in args.ops:
                rec = {
                    "preset": preset,
                    "tp": world,
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": args.dtype,
                    "op": OP_NAMES[coll],
                    "machine": machine,
                    "commit": commit,
                }
                shp = shapes(coll, m, n, k, world)
                if shp is None:
                    for c in CONTENDERS:
                        rec[f"{c}_ms"], rec[f"{c}_error"] = (
                            None,
                            f"M={m} (and N or K) must divide by TP={world}",
                        )
                    records.append(rec)
                    continue
                a_shape, w_shape, out_shape, big_shape = shp
                gen = torch.Generator(device=device)
                gen.manual_seed(1000 * rank + m)
                a = torch.randn(a_shape, generator=gen, device=device).to(dtype)
                w = torch.randn(w_shape, generator=gen, device=device).to(dtype)
                out = torch.empty(out_shape, dtype=dtype, device=device)
                big = torch.empty(big_shape, dtype=dtype, device=device)
                fns = contenders(coll, a, w, out, big, group)
                run_distgemm = fns["distgemm"]
                # distgemm's build (first call of this shape) and per-call host cost.
                try:
                    distgemm.clear_cache()
                    torch.cuda.synchronize()
                    dist.barrier()
                    t0 = time.perf_counter()
                    run_distgemm()
                    torch.cuda.synchronize()
                    build = (time.perf_counter() - t0) * 1e3
                    host = []
                    for _ in range(args.host_calls):
                        t0 = time.perf_counter()
                        run_distgemm()
                        host.append((time.perf_counter() - t0) * 1e6)
                    torch.cuda.synchronize()
                    costs = [None] * world
                    dist.all_gather_object(costs, (build, median(host)))
                    rec["build_ms"] = max(c[0] for c in costs)
                    rec["host_us"] = max(c[1] for c in costs)
                except Exception as e:  # noqa: BLE001 - recorded; distgemm is then skipped
                    rec["build_ms"] = rec["host_us"] = None
                    rec["distgemm_error"] = f"{type(e).__name__}: {e}"
                    torch.cuda.synchronize()
                samples = {c: [] for c in CONTENDERS}
                failed = {c: rec[f"{c}_error"] for c in CONTENDERS if f"{c}_error" in rec}
                for rnd in range(args.rounds):
                    for c in CONTENDERS if rnd % 2 == 0 else CONTENDERS[::-1]:
                        if c in failed:
                            continue
                        try:
                            samples[c].append(timed(fns[c], per_round))
                        except Exception as e:  # noqa: BLE001 - one failing contender must not end the run
                            failed[c] = f"{type(e).__name__}: {str(e)[:300]}"
                            print(
                                f"torch_distgemm: rank {rank}: {c} {preset} M={m}: {traceback.format_exc()}",
                                file=sys.stderr,
                            )
                            torch.cuda.synchronize()
                        dist.barrier()
                for c in CONTENDERS:
                    mine = [t for block in samples[c] for t in block]
                    per_rank = [None] * world
                    dist.all_gather_object(per_rank, (mine, failed.get(c)))
                    errors = [e for _, e in per_rank if e]
                    if errors or not all(s for s, _ in per_rank):
                        rec[f"{c}_ms"], rec[f"{c}_error"] = (
                            None,
                            errors[0] if errors else "no samples",
                        )
                    else:
                        rec[f"{c}_ms"] = max(median(s) for s, _ in per_rank)
                        rec.pop(f"{c}_error", None)
                rec["reps"], rec["rounds"] = per_round * args.rounds, args.rounds
                records.append(rec)
                if lead:
                    print(json.dumps(rec, sort_keys=True), flush=True)
                del a, w, out, big, fns, run_distgemm
                distgemm.clear_cache()
                torch.cuda.empty_cache()

    if lead:
        write_results(args, records, machine, commit, torch.__version__)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def contenders(coll, a, w, out, big, group):
    """The three calls timed for collective `coll` on this rank's tensors (B = W.t())."""
    import distgemm
    import torch
    import torch.distributed as dist

    b, gname = w.t(), group.group_name
    if coll == "ag":

        def run_distgemm():
            distgemm.all_gather_linear(a, w, out=out)

        def run_fused():
            torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, gname, return_A=False)

        def run_nccl():
            dist.all_gather_into_tensor(big, a, group=group)
            torch.mm(big, b, out=out)

    else:

        def run_distgemm():
            distgemm.linear_reduce_scatter(a, w, out=out)

        def run_fused():
            torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, gname)

        def run_nccl():
            torch.mm(a, b, out=big)
            dist.reduce_scatter_tensor(out, big, group=group)

    return {"distgemm": run_distgemm, "torch_fused": run_fused, "nccl_matmul": run_nccl}


def write_results(args, records, machine, commit, torch_version):
    date = datetime.date.today().isoformat()
    options = []
    if args.tokens != [int(x) for x in DEFAULT_TOKENS.split(",")]:
        options.append("tokens")
    if args.presets != list(PRESETS) or args.ops != list(OP_NAMES):
        options.append("filter")
    if args.settle_ms != 1000.0:
        options.append(f"settle{int(args.settle_ms)}")
    stem = "-".join([f"torch-{date}-{commit}", *options])
    folder = results_dir(args.out, __file__)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, stem + ".json"), "w") as f:
        json.dump(
            {
                "machine": machine,
                "commit": commit,
                "torch": torch_version,
                "args": vars(args),
                "records": records,
            },
            f,
            indent=1,
            sort_keys=True,
        )
    lines = [
        f"# distgemm's PyTorch ops vs PyTorch's fused ops and NCCL + matmul ({date}, {commit})",
        "",
        (f"{machine}, torch {torch_version}, {args.dtype}, TP = {records[0]['tp'] if records else '?'}; "
        f"{args.rounds} interleaved rounds, {args.reps} timed calls per contender, "
        f"{args.settle_ms:g} ms settling per block; ms = the slowest rank's median. "
        "build = first call of a new token count (collective build), host = one call's host time "
        "(benches/peers/torch_distgemm.py)."),
        "",
        "| preset | op | M | distgemm ms | torch fused ms | NCCL+matmul ms | distgemm / fused | build ms | host µs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        ratio = (
            (r["distgemm_ms"] / r["torch_fused_ms"])
            if r.get("distgemm_ms") and r.get("torch_fused_ms")
            else None
        )
        lines.append(
            f"| {r['preset']} | {r['op']} | {r['m']} | {fmt(r.get('distgemm_ms'))} | {fmt(r.get('torch_fused_ms'))} "
            f"| {fmt(r.get('nccl_matmul_ms'))} | {fmt(ratio)} | {fmt(r.get('build_ms'), 1)} | {fmt(r.get('host_us'), 1)} |"
        )
    errors = [(r, c) for r in records for c in CONTENDERS if r.get(f"{c}_error")]
    if errors:
        lines += ["", "Errors:", ""]
        lines += [f"- {r['preset']} {r['op']} M={r['m']} {c}: {r[f'{c}_error']}" for r, c in errors]
    with open(os.path.join(folder, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"torch_distgemm: wrote {os.path.join(folder, stem)}.{{json,md}}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
