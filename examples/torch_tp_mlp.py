#!/usr/bin/env python3
"""A Llama MLP block under tensor parallelism with distgemm, checked and timed.

    torchrun --nproc-per-node 2 examples/torch_tp_mlp.py [--tokens 2048] [--small] [--check]

The block is y = W_down( SiLU(W_gate x) * (W_up x) ) with Llama-3 70B's sizes by default
(hidden 8192, FFN 28672), sharded the usual way (sequence-parallel activations, Megatron-style
weights); each rank holds:

    x_shard   (T/P, H)        its block of token rows
    w1_shard  (2F/P, H)       its rows of W_gate and of W_up, stacked (fused gate+up, column-parallel)
    w2_shard  (H, F/P)        its columns of W_down (row-parallel)

    h   = distgemm.all_gather_linear(x_shard, w1_shard)     # (T, 2F/P): all_gather(x) @ w1_shard.T
    act = silu(h[:, :F/P]) * h[:, F/P:]                    # (T, F/P), in PyTorch
    y   = distgemm.linear_reduce_scatter(act, w2_shard)    # (T/P, H): reduce_scatter(act @ w2_shard.T)

Every rank also computes the unsharded block (whole x, whole weights) in PyTorch and in float64;
the check passes when distgemm's error against float64 is at most twice PyTorch's own plus
max(P, 2) roundings of the output (the reduce-scatter rounds its partial sums). The same block
written with PyTorch's fused async-TP ops (torch.ops.symm_mem.fused_all_gather_matmul /
fused_matmul_reduce_scatter) is timed beside it when those run here (they need one GPU per
rank). With fewer GPUs than ranks every rank shares GPU 0 (gloo backend; times then mean
nothing).
"""

import argparse
import datetime
import os
import sys
import zlib

import distgemm
import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=2048, help="T, tokens of the whole batch")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=28672)
    p.add_argument("--small", action="store_true", help="hidden 1024, FFN 3584 (a quick run)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--reps", type=int, default=20, help="timed calls per block")
    p.add_argument("--check", action="store_true", help="exit 1 when the check fails")
    a = p.parse_args()
    if a.small:
        a.hidden, a.ffn = 1024, 3584
    return a


def rand(shape, dtype, device, seed, scale=1.0):
    g = torch.Generator(device=device)
    g.manual_seed(zlib.crc32(repr(seed).encode()) & 0x7FFFFFFF)
    return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)


def mlp_distgemm(x_shard, w1_shard, w2_shard):
    h = distgemm.all_gather_linear(x_shard, w1_shard)
    gate, up = h.chunk(2, dim=1)
    return distgemm.linear_reduce_scatter(F.silu(gate) * up, w2_shard)


def mlp_torch_fused(x_shard, w1_shard, w2_shard, group_name):
    _, (h,) = torch.ops.symm_mem.fused_all_gather_matmul(
        x_shard, [w1_shard.t()], 0, group_name, return_A=False
    )
    gate, up = h.chunk(2, dim=1)
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(
        F.silu(gate) * up, w2_shard.t(), "sum", 0, group_name
    )


def mlp_unsharded(x, w1, w2):
    gate, up = (x @ w1.t()).chunk(2, dim=1)
    return (F.silu(gate) * up) @ w2.t()


def time_ms(fn, reps, group):
    """Median CUDA-event time per call on this rank, after a warm-up; every rank's median."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    medians = [None] * dist.get_world_size(group)
    dist.all_gather_object(medians, times[len(times) // 2], group=group)
    return medians


def main():
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    shared = torch.cuda.device_count() < world
    if shared:
        os.environ["DISTGEMM_ALLOW_SHARED_GPU"] = "1"
    device = torch.device("cuda", 0 if shared else local)
    torch.cuda.set_device(device)
    dist.init_process_group("gloo" if shared else "nccl", timeout=datetime.timedelta(seconds=300))
    group = dist.group.WORLD
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    t, hid, ffn = args.tokens, args.hidden, args.ffn
    if t % world or ffn % world:
        raise SystemExit(f"--tokens {t} and --ffn {ffn} must be divisible by {world} ranks")
    tl, fl = t // world, ffn // world

    # The unsharded tensors, alike on every rank (same seeds), scaled so values stay O(1).
    x = rand((t, hid), dtype, device, "x")
    w_gate = rand((ffn, hid), dtype, device, "gate", hid**-0.5)
    w_up = rand((ffn, hid), dtype, device, "up", hid**-0.5)
    w2 = rand((hid, ffn), dtype, device, "down", ffn**-0.5)
    # This rank's shards.
    x_shard = x[rank * tl : (rank + 1) * tl].contiguous()
    w1_shard = torch.cat(
        [w_gate[rank * fl : (rank + 1) * fl], w_up[rank * fl : (rank + 1) * fl]]
    ).contiguous()
    w2_shard = w2[:, rank * fl : (rank + 1) * fl].contiguous()

    y = mlp_distgemm(x_shard, w1_shard, w2_shard)
    torch.cuda.synchronize()
    distgemm.synchronize()
    # The unsharded reference, with W1 stacked as [gate; up] for the whole FFN.
    w1 = torch.cat([w_gate, w_up])
    rows = slice(rank * tl, (rank + 1) * tl)
    y_torch = mlp_unsharded(x, w1, w2)[rows]
    y64 = mlp_unsharded(x.double(), w1.double(), w2.double())[rows]
    scale = y64.abs().max().item()
    err_dg = (y.double() - y64).abs().max().item()
    err_torch = (y_torch.double() - y64).abs().max().item()
    u = 2.0**-8 if args.dtype == "bf16" else 2.0**-11
    ok = (
        y.shape == (tl, hid)
        and bool(torch.isfinite(y).all())
        and err_dg <= 2 * err_torch + max(world, 2) * u * scale
    )
    results = [None] * world
    dist.all_gather_object(results, (ok, err_dg, err_torch, scale))
    passed = all(r[0] for r in results)
    if rank == 0:
        print(
            f"torch_tp_mlp: T={t} H={hid} F={ffn} {args.dtype} TP={world}"
            f"{' (ranks share one GPU)' if shared else ''}; per rank max |y - y_f64| "
            f"distgemm / unsharded PyTorch: "
            + ", ".join(f"{r[1]:.3g} / {r[2]:.3g} (|y| <= {r[3]:.3g})" for r in results)
            + f" -> {'PASS' if passed else 'FAIL'}",
            flush=True,
        )

    blocks = {"distgemm": lambda: mlp_distgemm(x_shard, w1_shard, w2_shard)}
    if shared:
        if rank == 0:
            print("torch_tp_mlp: PyTorch's fused ops are not timed: they need one GPU per rank")
    else:
        try:
            mlp_torch_fused(x_shard, w1_shard, w2_shard, group.group_name)
            torch.cuda.synchronize()
            blocks["torch fused (async-TP)"] = lambda: mlp_torch_fused(
                x_shard, w1_shard, w2_shard, group.group_name
            )
        except Exception as e:  # noqa: BLE001 - report why it is not timed
            if rank == 0:
                print(
                    f"torch_tp_mlp: PyTorch's fused ops failed ({type(e).__name__}: {str(e)[:200]})"
                )
    dist.barrier(group)
    for name, fn in blocks.items():
        medians = time_ms(fn, args.reps, group)
        if rank == 0:
            print(
                f"torch_tp_mlp: {name:24s} {max(medians):8.3f} ms per block (slowest rank's median of {args.reps})"
            )
    distgemm.clear_cache()
    dist.destroy_process_group()
    return 0 if passed or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
