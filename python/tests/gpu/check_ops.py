#!/usr/bin/env python3
"""GPU checks of the distgemm package, one process per rank under torchrun:

    torchrun --nproc-per-node 2 python/tests/gpu/check_ops.py [--quick] [--backend gloo]

With fewer GPUs than ranks every rank runs on GPU 0 (gloo backend, DISTGEMM_ALLOW_SHARED_GPU=1),
which is how one H200 tests TP=2; times mean nothing then, results do. For every op (the
linear-style ops and the torch.ops.symm_mem drop-ins), both dtypes, the four Llama-3 presets at
small token counts, ragged shapes and shapes drawn at random, it checks:

- FP8 (float8_e4m3fn operands, tensor-wise scales, bf16 out): every schedule the ops expose
  (auto, ag-a, ag-a-single; auto, rs-a read and push, rs-a-single) on a ragged, a 256-token
  and three randomly drawn shapes, random e4m3 inputs, the output poisoned with NaN, every
  element within the float64 bound of fp8_bound; a second call with new inputs and new scales
  on the same instance (no rebuild); fused_all_gather_scaled_matmul and
  fused_scaled_matmul_reduce_scatter (bitwise equal to all_gather_linear /
  linear_reduce_scatter); FP8 arguments that must raise;
- FP8 with row-wise scales (float32, random in [0.5, 2) per row): the same schedules and
  shapes, two calls per instance with new inputs and scales of torch's shapes, every element
  against the f64 reference of fp8_row_bound (all-gather: the gathered rows' scales times this
  rank's column scales; reduce-scatter: each rank's scales on its own K-slice, summed), the
  scale tensors overwritten with NaN right after each call; both scaled drop-ins with
  row-wise scales (bitwise equal to the linear-style ops);

- all-gather: bitwise equal to distgemm's own single-GPU GEMM (a one-rank group) on the gathered
  input (except at decode sizes, where split-K's k-ranges follow each launch's grid), and
  within the float64 bound of the unsharded product;
- reduce-scatter: within the float64 bound (r roundings: max(TP, 2));
- new input tensors on every call (new addresses: the graph-update path), the inputs
  overwritten on the stream right after the call (as PyTorch's allocator reuses memory), a
  3-D input, out=, return_gathered / return_A;
- bad inputs raise the documented exception (dtype, device, contiguity, divisibility, dims,
  reduce_op) and ranks that disagree on the shape raise instead of hanging.

The bound (host/src/reference.rs): |D - D_ref| <= 1.05 (r u + (K + P + 2) 2^-24) |alpha| (|A| |B|^T)
+ r s, with u the dtype's unit roundoff and s half its subnormal spacing.

Rank 0 prints one line per check and a summary; the exit status is 1 if any rank failed.
"""

import argparse
import datetime
import math
import os
import random
import sys
import time
import traceback
import zlib

PRESETS = {  # name: (N, K), as host/src/problem.rs (fc1: fused gate+up projection)
    "llama3-70b-fc1": (57344, 8192),
    "llama3-70b-fc2": (8192, 28672),
    "llama3-405b-fc1": (106496, 16384),
    "llama3-405b-fc2": (16384, 53248),
}
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "f16": 2.0**-11}
HALF_SUBNORMAL = {"bf16": 2.0**-134, "f16": 2.0**-25}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one token count, presets in bf16 only")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (gloo shares GPUs)")
    p.add_argument("--calls", type=int, default=3, help="calls per case, new inputs each")
    p.add_argument("--repeat", type=int, default=200, help="calls of the repeat cases")
    return p.parse_args()


def expected(exc):
    return " or ".join(e.__name__ for e in (exc if isinstance(exc, tuple) else (exc,)))


def seed_of(*parts):
    """A seed every rank derives alike (Python's hash() of a str differs between processes)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.passed = 0
        self.failures = []

    def ok(self, name, cond, detail=""):
        if cond:
            self.passed += 1
        else:
            self.failures.append(f"rank {self.rank}: {name}: {detail}")
        if self.rank == 0:
            print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}", flush=True)

    def raises(self, name, exc, fn, words=()):
        try:
            fn()
        except exc as e:  # exc: an exception class or a tuple of them
            msg = str(e)
            missing = [w for w in words if w not in msg]
            self.ok(name, not missing, f"({type(e).__name__}: {msg[:150]})")
        except Exception as e:  # noqa: BLE001 - the wrong exception is a failure
            self.ok(name, False, f"raised {type(e).__name__}: {e}, expected {expected(exc)}")
        else:
            self.ok(name, False, f"did not raise {expected(exc)}")


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    import distgemm

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    gpus = torch.cuda.device_count()
    shared = gpus < world
    device = 0 if shared else local
    if shared:
        if args.backend != "gloo":
            raise SystemExit("ranks sharing one GPU need --backend gloo (NCCL refuses them)")
        os.environ["DISTGEMM_ALLOW_SHARED_GPU"] = "1"
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=300))
    dev = torch.device("cuda", device)
    check = Checker(rank)
    if rank == 0:
        print(
            f"check_ops: torch {torch.__version__}, {world} ranks on "
            f"{'one GPU (shared)' if shared else f'{world} GPUs'}: {torch.cuda.get_device_name(dev)}, "
            f"backend {args.backend}, distgemm {distgemm.__version__} "
            f"(PTX {distgemm._distgemm.embedded_ptx_bytes} bytes)",
            flush=True,
        )
    check.ok("wheel carries the kernels' PTX", distgemm._distgemm.embedded_ptx_bytes > 0)
    # One-rank groups: distgemm's single-GPU GEMM, the bitwise reference of all-gather.
    solos = [dist.new_group([r]) for r in range(world)]
    solo = solos[rank]
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}

    def random_shapes(seed, count, k_unit):
        """``count`` shapes drawn from ``seed`` (every rank draws the same): M = TP·[1, 512],
        N = 8·TP·[1, 512] and K = k_unit·TP·[1, 512], each factor log-uniform."""
        draw = random.Random(seed)

        def log_uniform(lo, hi):
            return min(hi, max(lo, round(math.exp(draw.uniform(math.log(lo), math.log(hi))))))

        return [
            (world * log_uniform(1, 512), 8 * world * log_uniform(1, 512),
             k_unit * world * log_uniform(1, 512))
            for _ in range(count)
        ]

    def rand(shape, dtype, seed):
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        return torch.randn(shape, generator=g, dtype=torch.float32, device=dev).to(dtype)

    def within_bound(name, got, a_full, b_rows, dtype_name, r, k, alpha=1.0):
        """got vs alpha * a_full @ b_rows.T in f64, with the bound of reference.rs."""
        a64, b64 = a_full.double(), b_rows.double()
        ref = alpha * (a64 @ b64.T)
        mag = abs(alpha) * (a64.abs() @ b64.abs().T)
        bound = (
            1.05 * (r * UNIT_ROUNDOFF[dtype_name] + (k + world + 2) * 2.0**-24) * mag
            + r * HALF_SUBNORMAL[dtype_name]
        )
        err = (got.double().reshape(ref.shape) - ref).abs()
        bad = int((err > bound).sum())
        finite = bool(torch.isfinite(got).all())
        check.ok(
            name,
            bad == 0 and finite,
            f"max err {err.max().item():.3g}, max bound {bound.max().item():.3g}, {bad} outside",
        )

    def ag_case(tag, dtype_name, m, n, k, calls, shape3=None, schedule="auto", bitwise=True):
        """bitwise=False where the stage GEMMs may split K (decode): a split's k-ranges follow
        the launch's shape and grid, which differ between the stages (and two ranks sharing a
        GPU cap theirs) and the one-rank group's GEMM, so only the f64 bound holds there."""
        dtype = dtypes[dtype_name]
        ml, nl = m // world, n // world
        for call in range(calls):
            seed = seed_of(tag, dtype_name, call)
            a_full = rand((m, k), dtype, seed)  # every rank: the same full input
            w_full_d = rand((nl, k), dtype, seed + 1 + rank)  # this rank's weight shard
            x = a_full[rank * ml : (rank + 1) * ml].clone()  # new tensors, new addresses
            w = w_full_d.clone()
            if shape3 is not None:
                x = x.view(shape3[0] // world, shape3[1], k)
            out = distgemm.all_gather_linear(x, w, schedule=schedule)
            # The inputs overwritten right after the call, on its stream.
            x.fill_(float("nan"))
            w.fill_(float("nan"))
            single = distgemm.all_gather_linear(a_full, w_full_d, group=solo)
            torch.cuda.synchronize()
            out2 = out.reshape(m, nl)
            if bitwise:
                check.ok(
                    f"{tag} {dtype_name} ag call {call}: bitwise = single-GPU GEMM",
                    torch.equal(out2, single),
                )
            within_bound(
                f"{tag} {dtype_name} ag call {call}: f64 bound",
                out2,
                a_full,
                w_full_d,
                dtype_name,
                1,
                k,
            )
        distgemm.synchronize()

    def rs_case(
        tag, dtype_name, m, n, k, calls, op="linear", reduce_op="sum", schedule="auto",
        partials=None,
    ):
        dtype = dtypes[dtype_name]
        kl, ml = k // world, m // world
        for call in range(calls):
            seed = seed_of(tag, dtype_name, call, op, reduce_op)
            a_full = rand((m, k), dtype, seed)
            w_full = rand((n, k), dtype, seed + 1)
            x = a_full[:, rank * kl : (rank + 1) * kl].contiguous()
            w = w_full[:, rank * kl : (rank + 1) * kl].contiguous()
            if op == "linear":
                out = distgemm.linear_reduce_scatter(x, w, schedule=schedule, partials=partials)
            else:
                out = distgemm.fused_matmul_reduce_scatter(
                    x, w.t(), reduce_op, 0, dist.group.WORLD.group_name
                )
            x.fill_(float("nan"))
            w.fill_(float("nan"))
            torch.cuda.synchronize()
            check.ok(
                f"{tag} {dtype_name} rs {op} call {call}: shape",
                tuple(out.shape) == (ml, n),
                str(tuple(out.shape)),
            )
            alpha = 1.0 / world if reduce_op == "avg" else 1.0
            within_bound(
                f"{tag} {dtype_name} rs {op} {reduce_op} call {call}: f64 bound",
                out,
                a_full[rank * ml : (rank + 1) * ml],
                w_full,
                dtype_name,
                max(world, 2),
                k,
                alpha,
            )
        distgemm.synchronize()

    def dropin_ag(tag, dtype_name, m, n, k):
        dtype = dtypes[dtype_name]
        ml, nl = m // world, n // world
        seed = seed_of(tag, "dropin")
        a_full = rand((m, k), dtype, seed)
        w1 = rand((nl, k), dtype, seed + 1 + rank)
        w2 = rand((nl // 2 if nl % 16 == 0 else nl, k), dtype, seed + 11 + rank)
        x = a_full[rank * ml : (rank + 1) * ml].clone()
        gathered, (o1, o2) = distgemm.fused_all_gather_matmul(
            x, [w1.t(), w2.t()], 0, dist.group.WORLD.group_name
        )
        _, (p1,) = distgemm.fused_all_gather_matmul(
            x, [w1.t()], 0, dist.group.WORLD.group_name, return_A=False
        )
        s1 = distgemm.all_gather_linear(a_full, w1, group=solo)
        s2 = distgemm.all_gather_linear(a_full, w2, group=solo)
        torch.cuda.synchronize()
        check.ok(
            f"{tag} {dtype_name} fused_all_gather_matmul: A returned", torch.equal(gathered, a_full)
        )
        check.ok(
            f"{tag} {dtype_name} fused_all_gather_matmul: Bs[0], Bs[1] bitwise",
            torch.equal(o1, s1) and torch.equal(o2, s2),
        )
        check.ok(f"{tag} {dtype_name} fused_all_gather_matmul(return_A=False)", torch.equal(p1, s1))
        distgemm.synchronize()

    def repeat_case(dtype_name, m, n, k, calls):
        """Many calls on one instance per op, each with new inputs that are overwritten right
        after the call; all-gather bitwise against the one-rank GEMM, reduce-scatter against
        the f64 bound, every call (one line per op)."""
        dtype = dtypes[dtype_name]
        ml, kl = m // world, k // world
        bad_ag, bad_rs = [], []
        for call in range(calls):
            seed = seed_of("repeat", dtype_name, call)
            a_full = rand((m, k), dtype, seed)
            w_d = rand((n // world, k), dtype, seed + 1 + rank)
            x = a_full[rank * ml : (rank + 1) * ml].clone()
            w = w_d.clone()
            out = distgemm.all_gather_linear(x, w)
            x.normal_()  # overwritten on the stream right after the call
            w.normal_()
            single = distgemm.all_gather_linear(a_full, w_d, group=solo)
            w_full = rand((n, k), dtype, seed + 2)
            xr = a_full[:, rank * kl : (rank + 1) * kl].contiguous()
            wr = w_full[:, rank * kl : (rank + 1) * kl].contiguous()
            out_rs = distgemm.linear_reduce_scatter(xr, wr)
            xr.normal_()
            wr.normal_()
            torch.cuda.synchronize()
            if not torch.equal(out, single):
                bad_ag.append(call)
            a64, b64 = a_full[rank * ml : (rank + 1) * ml].double(), w_full.double()
            err = (out_rs.double() - a64 @ b64.T).abs()
            bound = (
                1.05
                * (max(world, 2) * UNIT_ROUNDOFF[dtype_name] + (k + world + 2) * 2.0**-24)
                * (a64.abs() @ b64.abs().T)
                + max(world, 2) * HALF_SUBNORMAL[dtype_name]
            )
            if not bool((err <= bound).all()):
                bad_rs.append(call)
        distgemm.synchronize()
        check.ok(
            f"repeat {calls} calls ag {dtype_name}: bitwise every call",
            not bad_ag,
            f"bad calls {bad_ag[:10]}",
        )
        check.ok(
            f"repeat {calls} calls rs {dtype_name}: f64 bound every call",
            not bad_rs,
            f"bad calls {bad_rs[:10]}",
        )

    def f32(v):
        """The f32 value the kernels use for a scale given as a Python float."""
        return torch.tensor(v, dtype=torch.float32).item()

    def rand_e4m3(shape, seed):
        """Random e4m3 codes: N(0, 1) rounded to e4m3 (mostly nonzero, up to about ±4)."""
        return rand(shape, torch.float32, seed).to(torch.float8_e4m3fn)

    def fp8_bound(name, got, a_rows, b_rows, scales, r, k):
        """got (bf16) vs sa·sb·a_rows @ b_rows.T in f64 (e4m3 values and f32 scales are exact
        there), every element.

        Bound: |D − D_ref| ≤ 1.05·(r·2^-8 + (K + P + 4)·2^-22)·sa·sb·Σ_k|a||b| + r·2^-134
        + 5·2^-150. It is host/src/reference's ErrorBound::scaled for bf16 output with the f32
        unit roundoff 2^-24 of the accumulation terms widened to 2^-22: r bf16 roundings (the
        output store, and on reduce-scatter one per hop of a partial sum, r = max(TP, 2)),
        each at most 2^-8 of a value that is at most sa·sb·Σ|a||b| (every partial sum of a row
        is bounded by the sum of the absolute products); the K − 1 accumulation additions,
        P hop additions and 4 epilogue operations (sa·sb, its product with the accumulator,
        alpha, beta·C) in f32; the absolute terms cover bf16 subnormal rounding and f32
        underflow. The factor 4 on the f32 terms covers the tensor cores' FP8 accumulation,
        which keeps fewer bits than f32 between steps (the library measured its FP8 kernel at
        at most 0.30 of the 2^-24 bound for K ≤ 4096, kernels-gpu/NOTES.md step 35); the cases
        below keep K ≤ 2048."""
        sa, sb = scales
        a64, b64 = a_rows.float().double(), b_rows.float().double()
        ref = sa * sb * (a64 @ b64.T)
        mag = sa * sb * (a64.abs() @ b64.abs().T)
        bound = (
            1.05 * (r * 2.0**-8 + (k + world + 4) * 2.0**-22) * mag
            + r * 2.0**-134
            + 5 * 2.0**-150
        )
        err = (got.double().reshape(ref.shape) - ref).abs()
        bad = int((err > bound).sum())  # NaN (the poison left unwritten) is never <= bound
        finite = bool(torch.isfinite(got).all())
        check.ok(
            name,
            bad == 0 and finite and got.dtype == torch.bfloat16,
            f"max err {err.max().item():.3g}, max bound {bound.max().item():.3g}, {bad} outside, "
            f"{got.dtype}",
        )

    # The scales of the two calls of each FP8 case: the first a float and a one-element CUDA
    # tensor (read on the host), the second changed (the cached instance's set_fp8_scales).
    fp8_scales = [
        (0.3, torch.tensor(0.125, device=dev)),
        (torch.tensor(1.5, device=dev), 0.0390625),
    ]

    def scale_of(s):
        return s.item() if hasattr(s, "item") else f32(s)

    def fp8_ag_case(tag, m, n, k, schedule):
        """FP8 all_gather_linear, two calls on one instance with new inputs and new scales,
        the output poisoned with NaN, every element against the f64 reference."""
        ml, nl = m // world, n // world
        built = len(distgemm._ops.CACHE)
        for call, (sa, sb) in enumerate(fp8_scales):
            seed = seed_of(tag, "fp8", call)
            a_full = rand_e4m3((m, k), seed)
            w = rand_e4m3((nl, k), seed + 1 + rank)
            x = a_full[rank * ml : (rank + 1) * ml].clone()
            out = torch.full((m, nl), float("nan"), dtype=torch.bfloat16, device=dev)
            res = distgemm.all_gather_linear(
                x, w.clone(), schedule=schedule, out=out, scale_a=sa, scale_b=sb
            )
            x.view(torch.uint8).fill_(0x7F)  # overwritten (e4m3 NaN) right after the call
            torch.cuda.synchronize()
            scales = (scale_of(sa), scale_of(sb))
            fp8_bound(
                f"{tag} e4m3 ag {schedule} call {call} scales {scales}: f64 bound",
                res,
                a_full,
                w,
                scales,
                1,
                k,
            )
        check.ok(
            f"{tag} e4m3 ag {schedule}: new scales reused the instance",
            len(distgemm._ops.CACHE) == built + 1,
            f"{len(distgemm._ops.CACHE) - built} instances built",
        )
        distgemm.synchronize()

    def fp8_rs_case(tag, m, n, k, schedule, partials="read"):
        """FP8 linear_reduce_scatter, as fp8_ag_case (r = max(TP, 2) bf16 roundings)."""
        kl, ml = k // world, m // world
        built = len(distgemm._ops.CACHE)
        for call, (sa, sb) in enumerate(fp8_scales):
            seed = seed_of(tag, "fp8", call, partials)
            a32 = rand((m, k), torch.float32, seed)
            w32 = rand((n, k), torch.float32, seed + 1)
            a_full, w_full = a32.to(torch.float8_e4m3fn), w32.to(torch.float8_e4m3fn)
            x = a32[:, rank * kl : (rank + 1) * kl].contiguous().to(torch.float8_e4m3fn)
            w = w32[:, rank * kl : (rank + 1) * kl].contiguous().to(torch.float8_e4m3fn)
            out = torch.full((ml, n), float("nan"), dtype=torch.bfloat16, device=dev)
            res = distgemm.linear_reduce_scatter(
                x, w, schedule=schedule, out=out, partials=partials, scale_a=sa, scale_b=sb
            )
            x.view(torch.uint8).fill_(0x7F)
            w.view(torch.uint8).fill_(0x7F)
            torch.cuda.synchronize()
            scales = (scale_of(sa), scale_of(sb))
            fp8_bound(
                f"{tag} e4m3 rs {schedule} {partials} call {call} scales {scales}: f64 bound",
                res,
                a_full[rank * ml : (rank + 1) * ml],
                w_full,
                scales,
                max(world, 2),
                k,
            )
        check.ok(
            f"{tag} e4m3 rs {schedule} {partials}: new scales reused the instance",
            len(distgemm._ops.CACHE) == built + 1,
            f"{len(distgemm._ops.CACHE) - built} instances built",
        )
        distgemm.synchronize()

    def rand_scales(shape, seed):
        """Random float32 scales in [0.5, 2), one per row (never constant)."""
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        return torch.rand(shape, generator=g, dtype=torch.float32, device=dev) * 1.5 + 0.5

    def fp8_row_bound(name, got, terms, r, k):
        """got (bf16) vs Σ diag(sa)·a_rows·b_rowsᵀ·diag(sb) over ``terms`` (a_rows, b_rows,
        sa, sb), in f64 (e4m3 values and f32 scales are exact there), every element, with
        fp8_bound's bound on Σ diag(sa)·|a_rows|·|b_rows|ᵀ·diag(sb) (each product sa_i·sb_j
        takes the place of sa·sb)."""
        ref, mag = 0.0, 0.0
        for a_rows, b_rows, sa, sb in terms:
            a64, b64 = a_rows.float().double(), b_rows.float().double()
            outer = sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
            ref = ref + outer * (a64 @ b64.T)
            mag = mag + outer * (a64.abs() @ b64.abs().T)
        bound = (
            1.05 * (r * 2.0**-8 + (k + world + 4) * 2.0**-22) * mag
            + r * 2.0**-134
            + 5 * 2.0**-150
        )
        err = (got.double().reshape(ref.shape) - ref).abs()
        bad = int((err > bound).sum())  # NaN (poison, or a scale read at a wrong row) fails
        finite = bool(torch.isfinite(got).all())
        check.ok(
            name,
            bad == 0 and finite and got.dtype == torch.bfloat16,
            f"max err {err.max().item():.3g}, max bound {bound.max().item():.3g}, {bad} outside, "
            f"{got.dtype}",
        )

    def fp8_row_ag_case(tag, m, n, k, schedule):
        """Row-wise FP8 all_gather_linear: each rank's scale_a (its token rows) and scale_b
        (its weight rows, i.e. output columns), two calls of torch's shapes on one instance,
        the output poisoned with NaN and the inputs and scales overwritten after each call."""
        ml, nl = m // world, n // world
        built = len(distgemm._ops.CACHE)
        for call in range(2):
            seed = seed_of(tag, "fp8 row", call)
            a_full = rand_e4m3((m, k), seed)
            sa_full = rand_scales((m,), seed + 2)  # every rank: the scales of every row
            w = rand_e4m3((nl, k), seed + 3 + rank)
            sb = rand_scales((nl,), seed + 3 + world + rank)
            x = a_full[rank * ml : (rank + 1) * ml].clone()
            sa = sa_full[rank * ml : (rank + 1) * ml].clone()
            # torch's shapes on the first call, flat vectors on the second.
            sa = sa.reshape(ml, 1) if call == 0 else sa
            sb_arg = sb.reshape(1, nl).clone() if call == 0 else sb.clone()
            out = torch.full((m, nl), float("nan"), dtype=torch.bfloat16, device=dev)
            res = distgemm.all_gather_linear(
                x, w.clone(), schedule=schedule, out=out, scale_a=sa, scale_b=sb_arg
            )
            x.view(torch.uint8).fill_(0x7F)
            sa.fill_(float("nan"))
            sb_arg.fill_(float("nan"))
            torch.cuda.synchronize()
            fp8_row_bound(
                f"{tag} e4m3 row-wise ag {schedule} call {call}: f64 bound",
                res,
                [(a_full, w, sa_full, sb)],
                1,
                k,
            )
        check.ok(
            f"{tag} e4m3 row-wise ag {schedule}: new scales reused the instance",
            len(distgemm._ops.CACHE) == built + 1,
            f"{len(distgemm._ops.CACHE) - built} instances built",
        )
        distgemm.synchronize()

    def fp8_row_rs_case(tag, m, n, k, schedule, partials="read"):
        """Row-wise FP8 linear_reduce_scatter: every rank its own (M) and (N) scales, which
        scale its K-slice's products; the reference sums every rank's term."""
        kl, ml = k // world, m // world
        built = len(distgemm._ops.CACHE)
        for call in range(2):
            seed = seed_of(tag, "fp8 row", call, partials)
            a_full = rand_e4m3((m, k), seed)
            w_full = rand_e4m3((n, k), seed + 1)
            sas = [rand_scales((m,), seed_of(seed, "sa", r)) for r in range(world)]
            sbs = [rand_scales((n,), seed_of(seed, "sb", r)) for r in range(world)]
            x = a_full[:, rank * kl : (rank + 1) * kl].contiguous()
            w = w_full[:, rank * kl : (rank + 1) * kl].contiguous()
            sa = sas[rank].reshape(m, 1).clone() if call == 0 else sas[rank].clone()
            sb = sbs[rank].reshape(1, n).clone() if call == 0 else sbs[rank].reshape(n, 1).clone()
            out = torch.full((ml, n), float("nan"), dtype=torch.bfloat16, device=dev)
            res = distgemm.linear_reduce_scatter(
                x, w, schedule=schedule, out=out, partials=partials, scale_a=sa, scale_b=sb
            )
            x.view(torch.uint8).fill_(0x7F)
            w.view(torch.uint8).fill_(0x7F)
            sa.fill_(float("nan"))
            sb.fill_(float("nan"))
            torch.cuda.synchronize()
            rows = slice(rank * ml, (rank + 1) * ml)
            terms = [
                (
                    a_full[rows, r * kl : (r + 1) * kl],
                    w_full[:, r * kl : (r + 1) * kl],
                    sas[r][rows],
                    sbs[r],
                )
                for r in range(world)
            ]
            fp8_row_bound(
                f"{tag} e4m3 row-wise rs {schedule} {partials} call {call}: f64 bound",
                res,
                terms,
                max(world, 2),
                k,
            )
        check.ok(
            f"{tag} e4m3 row-wise rs {schedule} {partials}: new scales reused the instance",
            len(distgemm._ops.CACHE) == built + 1,
            f"{len(distgemm._ops.CACHE) - built} instances built",
        )
        distgemm.synchronize()

    def fp8_schedule_cases(ag_case, rs_case):
        """The FP8 shapes (one ragged, and three drawn at random: random_shapes with K a
        multiple of 16·TP) through every schedule the ops expose, with the pipelined
        reduce-scatter's partials read and pushed."""
        shapes = [(world * 37, world * 8 * 13, 16 * world * 29), (256, world * 256, 2048)]
        shapes += random_shapes(0xF8, 1 if args.quick else 3, 16)
        for m, n, k in shapes:
            tag = f"fp8 M={m} N={n} K={k}"
            for schedule in ("auto", "ag-a", "ag-a-single"):
                ag_case(tag, m, n, k, schedule)
            for schedule, partials in (
                ("auto", "read"),
                ("rs-a", "read"),
                ("rs-a", "push"),
                ("rs-a-single", "read"),
            ):
                rs_case(tag, m, n, k, schedule, partials)

    def fp8_row_checks():
        """Row-wise FP8 through every schedule the ops expose and both scaled drop-ins."""
        fp8_schedule_cases(fp8_row_ag_case, fp8_row_rs_case)
        # The all-gather drop-in with torch's sharded row-wise A_scale (T/TP, 1) and B_scale
        # (1, N/TP): all_gather_linear's GEMM bit for bit.
        m, n, k = world * 20, world * 64, 256
        ml, nl = m // world, n // world
        a_full = rand_e4m3((m, k), seed_of("fp8 row drop-in"))
        sa_full = rand_scales((m,), seed_of("fp8 row drop-in sa"))
        w = rand_e4m3((nl, k), seed_of("fp8 row drop-in w", rank))
        sb = rand_scales((1, nl), seed_of("fp8 row drop-in sb", rank))
        x = a_full[rank * ml : (rank + 1) * ml].clone()
        sa = sa_full[rank * ml : (rank + 1) * ml].reshape(ml, 1).clone()
        group_name = dist.group.WORLD.group_name
        gathered, (o1,) = distgemm.fused_all_gather_scaled_matmul(
            x, [w.t()], sa, [sb], 0, group_name, [None], [None], [torch.bfloat16], [True]
        )
        direct = distgemm.all_gather_linear(x, w, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        check.ok(
            "fp8 row-wise fused_all_gather_scaled_matmul: A returned",
            torch.equal(gathered.view(torch.uint8), a_full.view(torch.uint8)),
        )
        check.ok(
            "fp8 row-wise fused_all_gather_scaled_matmul = all_gather_linear",
            torch.equal(o1, direct),
        )
        name = "fp8 row-wise fused_all_gather_scaled_matmul: f64 bound"
        fp8_row_bound(name, o1, [(a_full, w, sa_full, sb)], 1, k)
        distgemm.synchronize()
        # The reduce-scatter drop-in with torch's A_scale (*A.shape[:-1], 1) and B_scale (1, N),
        # each rank its own: linear_reduce_scatter's GEMM bit for bit.
        m, n, k = world * 24, 256, world * 128
        kl, ml = k // world, m // world
        ar_full = rand_e4m3((m, k), seed_of("fp8 row rs drop-in"))
        wr_full = rand_e4m3((n, k), seed_of("fp8 row rs drop-in w"))
        sas = [rand_scales((m, 1), seed_of("fp8 row rs drop-in sa", r)) for r in range(world)]
        sbs = [rand_scales((1, n), seed_of("fp8 row rs drop-in sb", r)) for r in range(world)]
        xr = ar_full[:, rank * kl : (rank + 1) * kl].contiguous()
        wr = wr_full[:, rank * kl : (rank + 1) * kl].contiguous()
        summed = distgemm.fused_scaled_matmul_reduce_scatter(
            xr,
            wr.t(),
            sas[rank],
            sbs[rank],
            "sum",
            0,
            0,
            group_name,
            [m, n],
            out_dtype=torch.bfloat16,
        )
        direct = distgemm.linear_reduce_scatter(xr, wr, scale_a=sas[rank], scale_b=sbs[rank])
        torch.cuda.synchronize()
        check.ok(
            "fp8 row-wise fused_scaled_matmul_reduce_scatter = linear_reduce_scatter",
            torch.equal(summed, direct),
        )
        rows = slice(rank * ml, (rank + 1) * ml)
        terms = [
            (
                ar_full[rows, r * kl : (r + 1) * kl],
                wr_full[:, r * kl : (r + 1) * kl],
                sas[r][rows],
                sbs[r],
            )
            for r in range(world)
        ]
        name = "fp8 row-wise fused_scaled_matmul_reduce_scatter: f64 bound"
        fp8_row_bound(name, summed, terms, max(world, 2), k)
        distgemm.synchronize()
        check.raises(
            "bad input: row-wise scale_a in float16",
            TypeError,
            lambda: distgemm.all_gather_linear(x, w, scale_a=sa.half(), scale_b=sb),
            ["float32"],
        )

    def fp8_checks():
        """FP8 (tensor-wise) through every schedule the ops expose, the scaled drop-in, and
        FP8 arguments that must be refused."""
        fp8_schedule_cases(fp8_ag_case, fp8_rs_case)
        # The drop-in: the same GEMM as all_gather_linear with the same scales, and A.
        m, n, k = world * 20, world * 64, 256
        a_full = rand_e4m3((m, k), seed_of("fp8 drop-in"))
        w = rand_e4m3((n // world, k), seed_of("fp8 drop-in w", rank))
        x = a_full[rank * 20 : (rank + 1) * 20].clone()
        sa, sb = torch.tensor(0.5, device=dev), torch.tensor(0.25, device=dev)
        gathered, (o1,) = distgemm.fused_all_gather_scaled_matmul(
            x,
            [w.t()],
            sa,
            [sb],
            0,
            dist.group.WORLD.group_name,
            [None],
            [None],
            [torch.bfloat16],
            [True],
        )
        direct = distgemm.all_gather_linear(x, w, scale_a=0.5, scale_b=0.25)
        torch.cuda.synchronize()
        check.ok(
            "fp8 fused_all_gather_scaled_matmul: A returned",
            torch.equal(gathered.view(torch.uint8), a_full.view(torch.uint8)),
        )
        check.ok(
            "fp8 fused_all_gather_scaled_matmul = all_gather_linear", torch.equal(o1, direct)
        )
        name = "fp8 fused_all_gather_scaled_matmul: f64 bound"
        fp8_bound(name, o1, a_full, w, (0.5, 0.25), 1, k)
        distgemm.synchronize()
        # The reduce-scatter drop-in: linear_reduce_scatter's GEMM with the same scales (bit for
        # bit), A's rows regrouped by a 3-D output_shape; "avg" is the sum times 1/TP, exact
        # (the same bits) when TP is a power of two.
        m, n, k = world * 24, 256, world * 128
        kl, ml = k // world, m // world
        ar_full = rand_e4m3((m, k), seed_of("fp8 rs drop-in"))
        wr_full = rand_e4m3((n, k), seed_of("fp8 rs drop-in w"))
        xr = ar_full[:, rank * kl : (rank + 1) * kl].contiguous()
        wr = wr_full[:, rank * kl : (rank + 1) * kl].contiguous()
        group_name = dist.group.WORLD.group_name
        summed = distgemm.fused_scaled_matmul_reduce_scatter(
            xr,
            wr.t(),
            sa,
            sb,
            "sum",
            0,
            0,
            group_name,
            [m // 6, 6, n],
            None,
            None,
            torch.bfloat16,
            True,
        )
        avg = distgemm.fused_scaled_matmul_reduce_scatter(
            xr, wr.t(), 0.5, 0.25, "avg", 0, 0, group_name, [m, n], out_dtype=torch.bfloat16
        )
        direct = distgemm.linear_reduce_scatter(xr, wr, scale_a=0.5, scale_b=0.25)
        torch.cuda.synchronize()
        check.ok(
            "fp8 fused_scaled_matmul_reduce_scatter: shape and dtype",
            tuple(summed.shape) == (ml // 6, 6, n) and summed.dtype == torch.bfloat16,
            f"{tuple(summed.shape)} {summed.dtype}",
        )
        check.ok(
            "fp8 fused_scaled_matmul_reduce_scatter = linear_reduce_scatter",
            torch.equal(summed.reshape(direct.shape), direct),
        )
        if world & (world - 1) == 0:
            check.ok(
                "fp8 fused_scaled_matmul_reduce_scatter avg = sum / TP",
                torch.equal(avg, direct * (1.0 / world)),
            )
        name = "fp8 fused_scaled_matmul_reduce_scatter: f64 bound"
        a_rows = ar_full[rank * ml : (rank + 1) * ml]
        fp8_bound(name, summed, a_rows, wr_full, (0.5, 0.25), max(world, 2), k)
        distgemm.synchronize()

        def scaled_rs(**override):
            kwargs = dict(
                A=xr,
                B=wr.t(),
                A_scale=0.5,
                B_scale=0.25,
                reduce_op="sum",
                orig_scatter_dim=0,
                scatter_dim_after_maybe_reshape=0,
                group_name=group_name,
                output_shape=[m, n],
                out_dtype=torch.bfloat16,
            )
            kwargs.update(override)
            return distgemm.fused_scaled_matmul_reduce_scatter(**kwargs)

        xb = x.float().to(torch.bfloat16)
        bad = [
            (
                "e4m3 without scales",
                TypeError,
                lambda: distgemm.all_gather_linear(x, w),
                ["scale_a"],
            ),
            (
                "e4m3 A with bf16 weight",
                TypeError,
                lambda: distgemm.all_gather_linear(
                    x, w.float().to(torch.bfloat16), scale_a=1.0, scale_b=1.0
                ),
                ["e4m3", "bf16"],
            ),
            (
                "float8_e5m2",
                TypeError,
                lambda: distgemm.all_gather_linear(
                    x.float().to(torch.float8_e5m2),
                    w.float().to(torch.float8_e5m2),
                    scale_a=1.0,
                    scale_b=1.0,
                ),
                ["float8_e5m2"],
            ),
            (
                "scales with bf16 inputs",
                TypeError,
                lambda: distgemm.all_gather_linear(
                    xb, w.float().to(torch.bfloat16), scale_a=1.0, scale_b=1.0
                ),
                ["scale_a", "bf16"],
            ),
            (
                "e4m3 with out_dtype f16",
                TypeError,
                lambda: distgemm.all_gather_linear(
                    x, w, scale_a=1.0, scale_b=1.0, out_dtype=torch.float16
                ),
                ["out_dtype", "bfloat16"],
            ),
            (
                "zero scale",
                ValueError,
                lambda: distgemm.all_gather_linear(x, w, scale_a=0.0, scale_b=1.0),
                ["scale_a"],
            ),
            (
                "row-wise scale_a with a tensor-wise scale_b",
                ValueError,
                lambda: distgemm.all_gather_linear(
                    x, w, scale_a=torch.ones(20, 1, device=dev), scale_b=1.0
                ),
                ["row-wise"],
            ),
            (
                "scaled reduce-scatter drop-in: row-wise A_scale, tensor-wise B_scale",
                ValueError,
                lambda: scaled_rs(A_scale=torch.ones(m, 1, device=dev)),
                ["row-wise"],
            ),
            (
                "scaled reduce-scatter drop-in: bias",
                ValueError,
                lambda: scaled_rs(bias=torch.zeros(n, dtype=torch.bfloat16, device=dev)),
                ["bias"],
            ),
            (
                "scaled reduce-scatter drop-in: out_dtype None (e4m3 result)",
                TypeError,
                lambda: scaled_rs(out_dtype=None),
                ["out_dtype", "bfloat16"],
            ),
            (
                "scaled reduce-scatter drop-in: orig_scatter_dim 1",
                ValueError,
                lambda: scaled_rs(orig_scatter_dim=1),
                ["orig_scatter_dim"],
            ),
        ]
        for name, exc, fn, words in bad:
            check.raises(f"bad input: {name}", exc, fn, words)

    try:
        fp8_checks()
    except Exception:  # noqa: BLE001 - report, then run the 16-bit checks
        check.failures.append(f"rank {rank}: FP8 checks: {traceback.format_exc()}")
        print(check.failures[-1], file=sys.stderr, flush=True)
    try:
        fp8_row_checks()
    except Exception:  # noqa: BLE001 - report, then run the 16-bit checks
        check.failures.append(f"rank {rank}: row-wise FP8 checks: {traceback.format_exc()}")
        print(check.failures[-1], file=sys.stderr, flush=True)
    try:
        # 37 * TP: ragged per rank; 7 * TP: decode (at most 16 rows a stage GEMM, which may
        # split K: compared with the f64 bound only, see ag_case).
        tokens = [256] if args.quick else [256, 37 * world, 7 * world]
        for preset, (n, k) in PRESETS.items():
            for dtype_name in ["bf16"] if args.quick else ["bf16", "f16"]:
                for m in tokens:
                    tag = f"{preset} M={m}"
                    if preset.endswith("fc1"):
                        ag_case(tag, dtype_name, m, n, k, args.calls, bitwise=m > 16 * world)
                    else:
                        rs_case(tag, dtype_name, m, n, k, args.calls)
        repeat_case("bf16", world * 37, world * 8 * 13, 8 * world * 29, args.repeat)
        # Ragged problems (not multiples of any tile) and the other spellings.
        for dtype_name in ["bf16", "f16"]:
            n, k = world * 8 * 13, 8 * world * 29
            for schedule in ("ag-a", "ag-a-single"):
                tag = f"ragged {schedule} M={world * 37} N={n} K={k}"
                ag_case(tag, dtype_name, world * 37, n, k, args.calls, schedule=schedule)
            ag_case(
                f"3-D input M={world * 6}x5", dtype_name, world * 30, n, k, 1, shape3=(world * 6, 5)
            )
            for schedule in ("rs-a", "rs-a-single"):
                tag = f"ragged {schedule} M={world * 37} N={n} K={k}"
                rs_case(tag, dtype_name, world * 37, n, k, args.calls, schedule=schedule)
            tag = f"ragged rs-a pushed M={world * 37} N={n} K={k}"
            rs_case(tag, dtype_name, world * 37, n, k, args.calls, schedule="rs-a", partials="push")
            rs_case(
                f"drop-in M={world * 20}",
                dtype_name,
                world * 20,
                n,
                k,
                1,
                op="fused",
                reduce_op="sum",
            )
            rs_case(
                f"drop-in M={world * 20}",
                dtype_name,
                world * 20,
                n,
                k,
                1,
                op="fused",
                reduce_op="avg",
            )
            dropin_ag(f"drop-in M={world * 20} N={2 * n} K={k}", dtype_name, world * 20, 2 * n, k)

        # Shapes nobody listed (random_shapes): both ops, bf16 and f16 alternately; the f64
        # bound only (a stage may split K where the one-rank GEMM does not).
        for i, (m, n, k) in enumerate(random_shapes(0x5EED, 4 if args.quick else 12, 8)):
            dtype_name = ("bf16", "f16")[i % 2]
            tag = f"random M={m} N={n} K={k}"
            ag_case(tag, dtype_name, m, n, k, 1, bitwise=False)
            rs_case(tag, dtype_name, m, n, k, 1)

        # What a call costs on the host (informational; GPU times mean nothing on a shared
        # GPU): the first call of a new token count builds the instance (collective), a
        # repeated call is the per-call path (checks, cache lookup, launch; no synchronisation).
        for preset in ("llama3-70b-fc1", "llama3-70b-fc2"):
            n, k = PRESETS[preset]
            m = 256
            if preset.endswith("fc1"):
                x = rand((m // world, k), torch.bfloat16, 1 + rank)
                w = rand((n // world, k), torch.bfloat16, 2 + rank)

                def call(x=x, w=w):
                    return distgemm.all_gather_linear(x, w)
            else:
                x = rand((m, k // world), torch.bfloat16, 1 + rank)
                w = rand((n, k // world), torch.bfloat16, 2 + rank)

                def call(x=x, w=w):
                    return distgemm.linear_reduce_scatter(x, w)

            distgemm.clear_cache()
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            build_ms = (time.perf_counter() - t0) * 1e3
            host_us = []
            for _ in range(50):
                t0 = time.perf_counter()
                call()
                host_us.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            distgemm.synchronize()
            if rank == 0:
                print(
                    f"info {preset} M={m}: first call (build) {build_ms:.1f} ms, repeated call "
                    f"{sorted(host_us)[len(host_us) // 2]:.1f} us on the host (median of 50)",
                    flush=True,
                )

        # out= and return_gathered.
        x = rand((64, 256), torch.bfloat16, 5 + rank)
        w = rand((128, 256), torch.bfloat16, 7 + rank)
        out = torch.empty((64 * world, 128), dtype=torch.bfloat16, device=dev)
        res, gathered = distgemm.all_gather_linear(x, w, out=out, return_gathered=True)
        torch.cuda.synchronize()
        check.ok("out= is the result", res is out)
        check.ok("return_gathered", torch.equal(gathered[rank * 64 : (rank + 1) * 64], x))

        # Bad inputs: each raises before any collective starts.
        bad = [
            (
                "float32 input",
                TypeError,
                lambda: distgemm.all_gather_linear(x.float(), w),
                ["x_shard", "float32"],
            ),
            (
                "CPU weight",
                ValueError,
                lambda: distgemm.all_gather_linear(x, w.cpu()),
                ["weight", "cpu"],
            ),
            (
                "non-contiguous weight",
                ValueError,
                lambda: distgemm.linear_reduce_scatter(x, w.t().contiguous().t()),
                ["weight", "contiguous"],
            ),
            (
                "N/TP not a multiple of 8",
                ValueError,
                lambda: distgemm.all_gather_linear(x, w[:12]),
                ["N/TP=12"],
            ),
            (
                "tokens not divisible",
                ValueError,
                lambda: distgemm.linear_reduce_scatter(x[: 2 * world + 1], w),
                ["divisible"],
            ),
            (
                "gather_dim=1",
                ValueError,
                lambda: distgemm.fused_all_gather_matmul(
                    x, [w.t()], 1, dist.group.WORLD.group_name
                ),
                ["gather_dim"],
            ),
            (
                "reduce_op=max",
                ValueError,
                lambda: distgemm.fused_matmul_reduce_scatter(
                    x, w.t(), "max", 0, dist.group.WORLD.group_name
                ),
                ["reduce_op"],
            ),
            (
                "mixed dtypes",
                TypeError,
                lambda: distgemm.all_gather_linear(x, w.half()),
                ["bf16", "f16"],
            ),
            (
                "weight requiring grad",
                RuntimeError,
                lambda: distgemm.all_gather_linear(x, w.clone().requires_grad_()),
                ["requires grad"],
            ),
            (
                "unknown schedule",
                ValueError,
                lambda: distgemm.all_gather_linear(x, w, schedule="ag-b"),
                ["schedule"],
            ),
        ]
        for name, exc, fn, words in bad:
            check.raises(f"bad input: {name}", exc, fn, words)
        # Ranks that disagree on the problem of their first call of it: the build's hello
        # exchange finds it, an error on every rank, never a hang. (K = 384 is used nowhere
        # else, so neither rank has this instance cached: a rank that has it launches without
        # a rendezvous, and then the mismatch surfaces as the flag timeout.)
        xr = rand((64 + 8 * rank, 384), torch.bfloat16, 9)
        wr = rand((128, 384), torch.bfloat16, 10)
        check.raises(
            "ranks with different token counts",
            (distgemm.DistGemmError, ValueError),
            lambda: distgemm.all_gather_linear(xr, wr),
        )
        distgemm.clear_cache()
    except Exception:  # noqa: BLE001 - report, then let every rank learn of it
        check.failures.append(f"rank {rank}: {traceback.format_exc()}")
        print(check.failures[-1], file=sys.stderr, flush=True)

    results = [None] * world
    dist.all_gather_object(results, (check.passed, check.failures))
    failed = [f for _, fs in results for f in fs]
    if rank == 0:
        for f in failed:
            print(f"FAIL {f}")
        total = sum(p for p, _ in results)
        print(f"check_ops: {total} checks passed, {len(failed)} failed ({world} ranks)", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
