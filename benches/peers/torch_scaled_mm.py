#!/usr/bin/env python3
"""PyTorch's FP8 GEMM, torch._scaled_mm, with row-wise and tensor-wise scales on one GPU: the
peer of `benches/gemm --fp8 --quick` (issue 24).

    python3 benches/peers/torch_scaled_mm.py [--shapes-from gemm-fp8-<date>-<commit>.json] \
        [--filter SUBSTRING] [--accum fast,precise] [--reps 30] [--rounds 3] [--warmup 3] \
        [--settle-ms 1000] [--min-block-ms 100] [--check-rows 16] [--out DIR] [--list]

Shapes: those of `benches/gemm --fp8 --quick` (benches/gemm.rs `shapes()` with `--quick`):
8192^3 and the TP=2 / TP=8 stage GEMMs of the four Llama-3 presets at M = 16384 tokens
(all-gather fc1: (M/P) x (N/P) x K; reduce-scatter fc2: (M/P) x N x (K/P)), built here by the
same rule from the same presets (host/src/problem.rs). With --shapes-from, the shapes of a
`benches/gemm --fp8` JSON instead, in its order, and its numbers (our kernel's TFLOP/s,
tensor-wise and row-wise, and cuBLASLt's) go beside torch's with the ratios ours/torch.
--filter keeps shapes whose name contains SUBSTRING; --list prints the shapes and exits
(no GPU needed).

Every shape: A is M x K row-major e4m3 (torch.float8_e4m3fn), W is N x K row-major e4m3 and
B = W.t() (a K x N column-major view: the TN layout _scaled_mm requires, distgemm's A.B^T);
D = A.B in bf16. Codes are uniformly random over every e4m3 code but the two NaNs (as
benches/gemm.rs `e4m3_codes`), scales uniformly random in [0.5, 2). Contenders, for each
--accum mode (fast: use_fast_accum=True, the tensor cores' own accumulation, which is what
distgemm's kernel does; precise: use_fast_accum=False, cuBLASLt's default and benches/gemm's
cuBLASLt baseline):

  row-wise     torch._scaled_mm(A, B, scale_a=(M, 1) f32, scale_b=(1, N) f32, out_dtype=bf16)
  tensor-wise  torch._scaled_mm(A, B, scale_a=() f32, scale_b=() f32, out_dtype=bf16)

Timing (the peer scripts' method, benches/peers/torch_async_tp.py): enough input sets
rotate that together they exceed 3x L2 (as benches/gemm's RotatingInputs; one call per set
in turn). The contenders of a shape take turns in --rounds interleaved rounds (the order
reversed every other round); each block runs --warmup calls, then untimed calls until at
least --settle-ms of GPU work has run (the GPUs are power-capped), then
max(ceil(reps / rounds), ceil(min_block_ms / t)) calls (t: one call on the wall clock, as
benches/gemm's blocks of at least --min-block-ms), each bracketed by CUDA events with no host
wait between calls. ms = median of the pooled samples; TFLOP/s = 2MNK / ms; % of the dense
FP8 peak 1979 TFLOP/s; row/tensor = row-wise TFLOP/s over tensor-wise (below 1: row-wise is
slower); ours/torch = our TFLOP/s over torch's (above 1: ours is faster; the convention of
benches/gemm's ours/cuBLAS).

Correctness (before the timing, on the first input set): for --check-rows rows of A (the
first, the last and random ones) and every column, D is compared with an f64 reference
s_ij.sum_k(a_ik.b_kj), s_ij = sa_i.sb_j (row-wise) or sa.sb (tensor-wise); the sums are exact
in f64 (products of e4m3 values are multiples of 2^-18 below 2^18, so while K < 2^17 every
partial sum is a multiple of 2^-18 below 2^35). The bound is distgemm's own for its FP8
kernel (host/src/reference `ErrorBound::scaled(bf16, 1 rounding, K, 1 device)`):
|D - ref| <= 1.05.(2^-8 + (K + 5).2^-24).s_ij.sum_k|a_ik.b_kj| + 2^-134 + 5.2^-150, i.e. one
bf16 rounding of the output plus f32 accumulation and epilogue roundings. A NaN fails. The
worst |D - ref| / bound is reported per contender; a check that fails is reported, the
timing still runs, and the exit status is 1.

Writes <out>/torch-scaled-mm-<date>-<commit>[-<options>].json (machine, driver, torch, CUDA,
commit, date, args and the records) and .md (the table and the geometric means), the commit
from DISTGEMM_COMMIT, else the bundle's MANIFEST.txt, else `git`; <out> = --out,
$DISTGEMM_BENCH_RESULTS or benches/results. One record per shape and accumulation mode:
shape, m, n, k, accum, rowwise_ms, tensorwise_ms, rowwise_tflops, tensorwise_tflops,
rowwise_pct_of_peak, tensorwise_pct_of_peak, row_over_tensor, rowwise_check,
tensorwise_check, input_sets, reps, rounds, and with --shapes-from ours_tensorwise_tflops,
ours_rowwise_tflops, ours_cublas_tflops, ours_over_torch_tensorwise, ours_over_torch_rowwise
(a contender that fails has null times and a *_error key).

Without a CUDA GPU of compute capability 8.9 or later, or a PyTorch without FP8, it prints
"torch_scaled_mm: SKIPPED: <reason>" and exits 0, or 1 when DISTGEMM_REQUIRE_GPU=1 (as the
bundle's gpu-env.sh sets it). Standard library + torch only.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

from peer_common import commit_id, fmt, median, results_dir

PRESETS = {  # name: (N, K), as host/src/problem.rs `Preset::n_k` (fc1: fused gate+up)
    "llama3-70b-fc1": (57344, 8192),
    "llama3-70b-fc2": (8192, 28672),
    "llama3-405b-fc1": (106496, 16384),
    "llama3-405b-fc2": (16384, 53248),
}
TOKENS = 16384  # benches/gemm.rs `shapes()`: M of the preset shapes
STAGE_TPS = (2, 8)
PEAK_FP8_TFLOPS = 1979.0  # dense FP8 peak of an H100/H200 SXM, as benches/gemm.rs
L2_MULTIPLE = 3  # input sets rotate until they exceed 3x L2 (benches/support L2_MULTIPLE)
ACCUM_MODES = ("fast", "precise")
SCALE_MODES = ("rowwise", "tensorwise")
DEFAULT_SETTLE_MS = 1000.0


def log(msg):
    print(f"torch_scaled_mm: {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes-from",
        metavar="JSON",
        default=None,
        help="a benches/gemm --fp8 result: time its shapes, print ours/torch",
    )
    p.add_argument("--filter", default=None, help="keep shapes whose name contains this")
    p.add_argument("--accum", default=",".join(ACCUM_MODES), help="fast, precise (comma list)")
    p.add_argument("--reps", type=int, default=30, help="timed calls per contender (all rounds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--settle-ms",
        type=float,
        default=DEFAULT_SETTLE_MS,
        help="untimed GPU work after the warm-up of each block (0: none)",
    )
    p.add_argument(
        "--min-block-ms", type=float, default=100.0, help="shortest timed block, ms"
    )
    p.add_argument("--check-rows", type=int, default=16, help="rows of D checked per shape")
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--out", default=None, help="results folder")
    p.add_argument("--list", action="store_true", help="print the shapes and exit")
    a = p.parse_args(argv)
    a.accum = [x for x in a.accum.split(",") if x]
    bad = [x for x in a.accum if x not in ACCUM_MODES]
    if bad or not a.accum:
        p.error(f"unknown accumulation mode(s) {bad}; known: {', '.join(ACCUM_MODES)}")
    if a.reps < 1 or a.rounds < 1 or a.warmup < 0 or a.check_rows < 1:
        p.error("--reps, --rounds and --check-rows must be >= 1 and --warmup >= 0")
    for name in ("settle_ms", "min_block_ms"):
        v = getattr(a, name)
        if not math.isfinite(v) or v < 0:
            p.error(f"--{name.replace('_', '-')} must be a finite number >= 0")
    return a


def quick_shapes():
    """benches/gemm.rs `shapes()` filtered as by `--quick`: 8192^3 and the stage shapes."""
    v = [{"shape": "square 8192", "m": 8192, "n": 8192, "k": 8192}]
    for name, (n, k) in PRESETS.items():
        for tp in STAGE_TPS:
            if name.endswith("fc1"):  # all-gather of A: stage (M/P) x (N/P) x K
                m_, n_, k_ = TOKENS // tp, n // tp, k
            else:  # reduce-scatter: stage (M/P) x N x (K/P)
                m_, n_, k_ = TOKENS // tp, n, k // tp
            v.append({"shape": f"{name} TP{tp} stage", "m": m_, "n": n_, "k": k_})
    return v


def shapes_from(path):
    """The shapes of a benches/gemm --fp8 JSON (a list of records), with our numbers.

    Our tensor-wise figure is the record's `ours_tflops` (the rule's configuration `tile`),
    the row-wise one `variant_tflops["<tile> row-wise"]` (the same configuration with
    row-wise scales, which `--fp8` always times), cuBLASLt's `cublas_tflops`. Records of
    another dtype give their shape only.
    """
    with open(path) as f:
        records = json.load(f)
    if isinstance(records, dict):
        records = records.get("records", [])
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a list of benches/gemm records")
    v, seen = [], set()
    for r in records:
        try:
            shape = {"shape": str(r["shape"]), "m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"])}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: a record without shape, m, n and k ({e})") from e
        key = (shape["shape"], shape["m"], shape["n"], shape["k"])
        if key in seen:
            continue
        seen.add(key)
        if r.get("dtype") == "e4m3":
            tile = r.get("tile")
            shape["ours"] = {
                "tensorwise_tflops": r.get("ours_tflops"),
                "rowwise_tflops": (r.get("variant_tflops") or {}).get(f"{tile} row-wise"),
                "cublas_tflops": r.get("cublas_tflops"),
                "tile": tile,
                "commit": r.get("commit"),
                "date": r.get("date"),
            }
        v.append(shape)
    return v


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def geo_mean_and_min(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)), min(xs)


def bound_factors(k):
    """distgemm's ErrorBound::scaled(bf16, 1, k, 1): (relative, absolute)."""
    relative = 1.05 * (2.0**-8 + (k + 1 + 4) * 2.0**-24)
    absolute = 2.0**-134 + 5 * 2.0**-150
    return relative, absolute


def driver_version():
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def skipped(reason):
    """No GPU or no FP8: a visible SKIPPED line; a failure where DISTGEMM_REQUIRE_GPU=1."""
    log(f"SKIPPED: {reason}")
    return 1 if os.environ.get("DISTGEMM_REQUIRE_GPU") == "1" else 0


def main(argv=None):
    args = parse_args(argv)
    try:
        shapes = shapes_from(args.shapes_from) if args.shapes_from else quick_shapes()
    except (OSError, ValueError) as e:
        log(f"cannot read --shapes-from: {e}")
        return 2
    if args.filter:
        shapes = [s for s in shapes if args.filter in s["shape"]]
    if not shapes:
        log("no shape to measure")
        return 2
    if args.list:
        for s in shapes:
            print(json.dumps(s, sort_keys=True))
        return 0

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means no peer to measure
        return skipped(f"cannot import torch ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        return skipped("no CUDA GPU (torch.cuda.is_available() is False)")
    cap = torch.cuda.get_device_capability(0)
    if cap < (8, 9):
        return skipped(f"no FP8 tensor cores (compute capability {cap[0]}.{cap[1]} < 8.9)")
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return skipped(f"PyTorch {torch.__version__} has no float8_e4m3fn / _scaled_mm")

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    scaled_mm, with_out = scaled_mm_call(torch, device)
    if scaled_mm is None:
        return skipped(f"torch._scaled_mm fails on this GPU: {with_out}")
    info = {
        "machine": torch.cuda.get_device_name(device),
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": commit_id(__file__),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "out_param": with_out,
        "l2_bytes": l2_bytes,
    }
    print(json.dumps({"op": "info", **info}, sort_keys=True), flush=True)

    records, failed_checks = [], 0
    for s in shapes:
        recs = bench_shape(torch, args, device, s, scaled_mm, l2_bytes)
        for r in recs:
            failed_checks += sum(
                1 for c in SCALE_MODES if r.get(f"{c}_check") and not r[f"{c}_check"]["passed"]
            )
            print(json.dumps(r, sort_keys=True), flush=True)
        records.extend(recs)
        torch.cuda.empty_cache()
    write_results(args, records, info)
    errors = sum(1 for r in records for c in SCALE_MODES if r.get(f"{c}_error"))
    if failed_checks or errors:
        log(f"{failed_checks} failed check(s), {errors} failed contender(s): see the table")
        return 1
    return 0


def scaled_mm_call(torch, device):
    """The _scaled_mm call timed, `(call, with_out)`: into a preallocated D where this PyTorch
    takes `out=`, else returning a new D. `(None, reason)` when a tiny tensor-wise FP8 GEMM
    fails (no FP8 support in this build or on this GPU).
    """

    def with_out(a, b, sa, sb, fast, out):
        return torch._scaled_mm(
            a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast, out=out
        )

    def without_out(a, b, sa, sb, fast, out):
        r = torch._scaled_mm(
            a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
        )
        return r[0] if isinstance(r, tuple) else r  # PyTorch < 2.4 also returned amax

    a = torch.ones((16, 32), device=device).to(torch.float8_e4m3fn)
    w = torch.ones((16, 32), device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    out = torch.empty((16, 16), dtype=torch.bfloat16, device=device)
    try:
        with_out(a, w.t(), one, one, False, out)
        torch.cuda.synchronize()
        if torch.all(out == 32):
            return with_out, True
    except (TypeError, RuntimeError) as e:
        log(f"_scaled_mm(out=...) unavailable ({type(e).__name__}: {str(e)[:200]}); D per call")
    try:
        d = without_out(a, w.t(), one, one, False, None)
        torch.cuda.synchronize()
        if not torch.all(d == 32):
            return None, "a 16x16x32 GEMM of ones did not give 32"
        return without_out, False
    except (TypeError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def e4m3_codes(torch, shape, gen, device):
    """Uniformly random e4m3 codes but the NaNs (0x7F, 0xFF -> 0x7E, 0xFE), as
    benches/gemm.rs `e4m3_codes`."""
    c = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8, device=device)
    c = torch.where((c & 0x7F) == 0x7F, c ^ 1, c)
    return c.view(torch.float8_e4m3fn)


def make_set(torch, device, m, n, k, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def scales(shape):
        return torch.rand(shape, generator=gen, device=device) * 1.5 + 0.5

    w = e4m3_codes(torch, (n, k), gen, device)
    return {
        "a": e4m3_codes(torch, (m, k), gen, device),
        "w": w,
        "b": w.t(),  # K x N column-major: the TN layout _scaled_mm requires
        "rowwise": (scales((m, 1)), scales((1, n))),
        "tensorwise": (scales(()), scales(())),
        "out": torch.empty((m, n), dtype=torch.bfloat16, device=device),
    }


def check(torch, s, d, k, rows, scale_mode):
    """D's rows `rows` against the f64 reference, as the module documentation states."""
    # Rows gathered as bytes (indexing float8 tensors is not supported everywhere).
    a = s["a"].view(torch.uint8)[rows].view(torch.float8_e4m3fn).float().double()
    acc, mag = [], []
    chunk = max(1, (1 << 28) // (8 * k))  # columns of W per f64 block (~256 MiB)
    for j in range(0, s["w"].shape[0], chunk):
        wj = s["w"][j : j + chunk].float().double()
        acc.append(a @ wj.t())
        mag.append(a.abs() @ wj.abs().t())
        del wj
    acc, mag = torch.cat(acc, dim=1), torch.cat(mag, dim=1)
    sa, sb = s[scale_mode]
    if scale_mode == "rowwise":
        scale = sa[rows].double() * sb.double()
    else:
        scale = (sa.double() * sb.double()).reshape(1, 1)
    ref = scale * acc
    relative, absolute = bound_factors(k)
    bound = relative * scale * mag + absolute
    got = d[rows].double()
    ratio = (got - ref).abs() / bound
    ratio = torch.where(torch.isnan(got), torch.full_like(ratio, math.inf), ratio)
    worst = ratio.max().item()
    return {
        "rows": len(rows),
        "elements": ratio.numel(),
        "mismatches": int((ratio > 1).sum().item()),
        "worst_ratio": worst,
        "max_abs_error": (got - ref).abs().nan_to_num(nan=math.inf).max().item(),
        "bound_relative": relative,
        "bound_absolute": absolute,
        "passed": worst <= 1.0,
    }


def bench_shape(torch, args, device, shape, scaled_mm, l2_bytes):
    """One record per accumulation mode: both scale modes, timed in the same rounds."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    base = {"shape": shape["shape"], "m": m, "n": n, "k": k, "dtype": "e4m3", "out": "bf16"}
    bytes_per_set = m * k + n * k + 2 * m * n  # as benches/gemm.rs bench_fp8_shape
    count = max(2, L2_MULTIPLE * l2_bytes // bytes_per_set + 1)
    try:
        sets = [make_set(torch, device, m, n, k, args.seed + 1000 * i + m) for i in range(count)]
    except RuntimeError as e:  # e.g. out of memory
        log(f"{shape['shape']}: cannot make the inputs: {traceback.format_exc()}")
        error = f"inputs: {type(e).__name__}: {str(e)[:300]}"
        records = []
        for acc in args.accum:
            r = {**base, "accum": acc, "row_over_tensor": None}
            for c in SCALE_MODES:
                r[f"{c}_ms"] = r[f"{c}_tflops"] = r[f"{c}_pct_of_peak"] = None
                r[f"{c}_error"] = error
            records.append(r)
        return records
    torch.cuda.synchronize()

    def call(scale_mode, fast):
        def run(i):
            s = sets[i % len(sets)]
            sa, sb = s[scale_mode]
            return scaled_mm(s["a"], s["b"], sa, sb, fast, s["out"])

        return run

    contenders = [(c, acc) for acc in args.accum for c in SCALE_MODES]
    fns = {(c, acc): call(c, acc == "fast") for c, acc in contenders}
    failed, checks = {}, {}

    # The check, on set 0: the first and last rows and random ones.
    gen = torch.Generator()
    gen.manual_seed(args.seed + m + n + k)
    want = min(m, args.check_rows)
    rows = {0, m - 1}
    rows.update(torch.randperm(m, generator=gen)[: max(0, want - len(rows))].tolist())
    rows = torch.tensor(sorted(rows), device=device)
    for key in contenders:
        try:
            d = fns[key](0)
            torch.cuda.synchronize()
            checks[key] = check(torch, sets[0], d, k, rows, key[0])
            if not checks[key]["passed"]:
                log(f"{shape['shape']} {key[0]} {key[1]}: CHECK FAILED {checks[key]}")
        except Exception as e:  # noqa: BLE001 - one failing contender must not end the run
            log(f"{shape['shape']} {key[0]} {key[1]}: {traceback.format_exc()}")
            failed[key] = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.synchronize()
    torch.cuda.empty_cache()

    per_round = math.ceil(args.reps / args.rounds)
    samples = {key: [] for key in contenders}
    for rnd in range(args.rounds):
        for key in contenders if rnd % 2 == 0 else contenders[::-1]:
            if key in failed:
                continue
            try:
                samples[key].extend(timed(torch, args, fns[key], per_round))
            except Exception as e:  # noqa: BLE001 - one failing contender must not end the run
                log(f"{shape['shape']} {key[0]} {key[1]}: {traceback.format_exc()}")
                failed[key] = f"{type(e).__name__}: {str(e)[:300]}"
                torch.cuda.synchronize()

    ours = shape.get("ours")
    records = []
    for acc in args.accum:
        r = {**base, "accum": acc, "input_sets": count, "rounds": args.rounds}
        for c in SCALE_MODES:
            key = (c, acc)
            if key in checks:
                r[f"{c}_check"] = checks[key]
            if key in failed or not samples[key]:
                r[f"{c}_ms"] = r[f"{c}_tflops"] = r[f"{c}_pct_of_peak"] = None
                r[f"{c}_error"] = failed.get(key, "no samples")
                continue
            ms = median(samples[key])
            r[f"{c}_ms"] = ms
            r[f"{c}_tflops"] = tflops(m, n, k, ms)
            r[f"{c}_pct_of_peak"] = 100.0 * r[f"{c}_tflops"] / PEAK_FP8_TFLOPS
            r["reps"] = len(samples[key])
        r["row_over_tensor"] = (
            r["rowwise_tflops"] / r["tensorwise_tflops"]
            if r["rowwise_tflops"] and r["tensorwise_tflops"]
            else None
        )
        if ours:
            r["ours_tile"] = ours["tile"]
            r["ours_commit"] = ours["commit"]
            r["ours_cublas_tflops"] = ours["cublas_tflops"]
            for c in SCALE_MODES:
                mine = ours[f"{c}_tflops"]
                r[f"ours_{c}_tflops"] = mine
                theirs = r[f"{c}_tflops"]
                r[f"ours_over_torch_{c}"] = mine / theirs if mine and theirs else None
        records.append(r)
    del sets, fns
    return records


def timed(torch, args, fn, per_round):
    """One block: warm-up, settle, then per-call CUDA-event times (ms)."""
    for i in range(args.warmup):
        fn(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(args.warmup)
    torch.cuda.synchronize()
    t_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    i = args.warmup + 1
    if args.settle_ms > 0:
        for _ in range(math.ceil(args.settle_ms / t_ms)):
            fn(i)
            i += 1
    calls = max(per_round, math.ceil(args.min_block_ms / t_ms))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(calls)
    ]
    stream = torch.cuda.current_stream()
    for start_ev, end_ev in events:
        start_ev.record(stream)
        fn(i)
        end_ev.record(stream)
        i += 1
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def check_cell(chk):
    if not chk:
        return "—"
    verdict = "ok" if chk["passed"] else f"FAIL {chk['mismatches']}/{chk['elements']}"
    return f"{verdict} {chk['worst_ratio']:.2f}"


def write_results(args, records, info):
    date = info["date"][:10]
    options = []
    if args.filter:
        options.append("".join(ch if ch.isalnum() else "-" for ch in args.filter))
    if args.accum != list(ACCUM_MODES):
        options.append("-".join(args.accum))
    if args.settle_ms != DEFAULT_SETTLE_MS:
        options.append(f"settle{int(args.settle_ms)}")
    stem = "-".join([f"torch-scaled-mm-{date}-{info['commit']}", *options])
    folder = results_dir(args.out, __file__)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, stem + ".json"), "w") as f:
        json.dump({**info, "args": vars(args), "records": records}, f, indent=1, sort_keys=True)

    with_ours = any("ours_tensorwise_tflops" in r for r in records)
    ours_commit = next((r["ours_commit"] for r in records if r.get("ours_commit")), None)
    lines = [
        "# `benches/peers/torch_scaled_mm.py`: PyTorch's FP8 GEMM (`torch._scaled_mm`), "
        "row-wise and tensor-wise scales",
        "",
        f"{info['machine']}, driver {info['driver']}, torch {info['torch']} (CUDA {info['cuda']}), "
        f"commit {info['commit']}, {info['date']}; e4m3 A (M×K) and B = Wᵀ (W N×K), bf16 D; "
        f"median of {args.rounds} interleaved rounds per contender, {args.settle_ms:g} ms "
        f"settling and at least {args.min_block_ms:g} ms per timed block. "
        "fast/precise: `use_fast_accum` True/False. row/tensor: row-wise TFLOP/s over "
        "tensor-wise. check: worst |D − ref| / bound on sampled rows (≤ 1 passes; "
        "ErrorBound::scaled of bf16).",
    ]
    if with_ours:
        lines[-1] += (
            f" ours: `benches/gemm --fp8` ({os.path.basename(args.shapes_from)}, commit {ours_commit}), our "
            "kernel's TFLOP/s with the rule's configuration, tensor-wise and row-wise, and "
            "cuBLASLt's FP8 (tensor-wise, precise) from the same run; ours/torch = our "
            "TFLOP/s over torch's (> 1: ours is faster)."
        )
    header = (
        "| shape | M | N | K | accum | row-wise ms | tensor-wise ms | row-wise TFLOP/s "
        "| tensor-wise TFLOP/s | row-wise % of 1979 | tensor-wise % of 1979 | row/tensor "
        "| check row-wise | check tensor-wise |"
    )
    rule = "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
    if with_ours:
        header += (
            " ours tensor-wise TFLOP/s | ours row-wise TFLOP/s | cuBLASLt TFLOP/s (ours' run) "
            "| ours/torch tensor-wise | ours/torch row-wise |"
        )
        rule += "---:|---:|---:|---:|---:|"
    lines += ["", header, rule]
    for r in records:
        row = (
            f"| {r['shape']} | {r['m']} | {r['n']} | {r['k']} | {r['accum']} "
            f"| {fmt(r.get('rowwise_ms'), 4)} | {fmt(r.get('tensorwise_ms'), 4)} "
            f"| {fmt(r.get('rowwise_tflops'), 0)} | {fmt(r.get('tensorwise_tflops'), 0)} "
            f"| {fmt(r.get('rowwise_pct_of_peak'), 1)} | {fmt(r.get('tensorwise_pct_of_peak'), 1)} "
            f"| {fmt(r.get('row_over_tensor'))} | {check_cell(r.get('rowwise_check'))} "
            f"| {check_cell(r.get('tensorwise_check'))} |"
        )
        if with_ours:
            row += (
                f" {fmt(r.get('ours_tensorwise_tflops'), 0)} | {fmt(r.get('ours_rowwise_tflops'), 0)} "
                f"| {fmt(r.get('ours_cublas_tflops'), 0)} | {fmt(r.get('ours_over_torch_tensorwise'))} "
                f"| {fmt(r.get('ours_over_torch_rowwise'))} |"
            )
        lines.append(row)
    lines.append("")
    for acc in args.accum:
        mine = [r for r in records if r["accum"] == acc]
        parts = []
        for label, key in (
            ("row/tensor", "row_over_tensor"),
            ("ours/torch tensor-wise", "ours_over_torch_tensorwise"),
            ("ours/torch row-wise", "ours_over_torch_rowwise"),
        ):
            xs = [r[key] for r in mine if r.get(key)]
            if xs:
                geo, lowest = geo_mean_and_min(xs)
                parts.append(f"{label} {geo:.3f} (lowest {lowest:.3f})")
        if parts:
            lines.append(f"geometric mean, {acc} accumulation: {', '.join(parts)}")
    errors = [(r, c) for r in records for c in SCALE_MODES if r.get(f"{c}_error")]
    if errors:
        lines += ["", "Errors:", ""]
        lines += [
            f"- {r['shape']} {c} {r['accum']}: {r[f'{c}_error']}" for r, c in errors
        ]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(folder, stem + ".md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    print(f"torch_scaled_mm: wrote {os.path.join(folder, stem)}.{{json,md}}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
