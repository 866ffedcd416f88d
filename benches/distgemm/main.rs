//! distgemm side by side with everything it should beat, measured in one run (issue 6, items 5
//! and 6).
//!
//! For every preset (Llama-3 70B/405B fc1/fc2, M = `--tokens`, default 16384) and every
//! schedule (the four pipelined ones, their single-stage variants, and `auto(<family>)`: what
//! distgemm's `Auto` rule picks within each family, reusing that schedule's measurement), on TP
//! GPUs:
//!
//! | column | what is timed | where |
//! |---|---|---|
//! | (a) | the full M×N×K GEMM on one GPU: our kernel and cuBLASLt | GPU 0 |
//! | (b) | the single-stage GEMM of the schedule's family without communication: every device's GEMM node(s) of the `*-single` schedule's plan (e.g. M×N/P×K for `ag-a`) on its own GPU, our kernel; the shape shown is device 0's | all TP GPUs |
//! | (c) | the P stage GEMMs of the family's pipelined plan, back to back with PDL, no communication, our kernel, every device's on its own GPU | all TP GPUs |
//! | (d) | distgemm itself (`host/src/cuda` `DistGemm`, graphs built once): one `run()` per repetition, `wait()` checked afterwards | all TP GPUs |
//! | (e) | NCCL collective + cuBLASLt GEMM in sequence on every GPU (all-gather of A for `ag-a*`, of B for `ag-b*`, GEMM then reduce-scatter of row blocks for `rs-*`) | all TP GPUs |
//! | (f) | PyTorch async TP: `torch.ops.symm_mem.fused_all_gather_matmul` (gathers A) for the all-gather families, `fused_matmul_reduce_scatter` (scatters rows) for the reduce-scatter ones, from `peers/torch_async_tp.py` (the same `--settle-ms`, and `--rounds` = `ROUNDS`: it settles and interleaves like our blocks, the fused op in turns with PyTorch's own local matmul) | all TP GPUs, separate processes |
//!
//! With `--diagnose`, also for the pipelined schedules, in the same rounds: for all-gather the
//! `DIAGNOSTICS`, variants of (c) and (d) that leave parts out ((c) as one CUDA graph per
//! device, alone or with one more node: a 4 KiB copy (local, pulled from the next GPU or
//! pushed into it over NVLink), a kernel reading 4 KiB or 16 B from the next GPU, or the barrier
//! kernel (alone, or with (d)'s rendezvous: remote atomics over NVLink); (d) with its copies
//! cut to `COPY_CAP` bytes after one full run, then also uncoupled and without flag waits); for
//! the pipelined reduce-scatter schedules the `SCATTER_DIAGNOSTICS` ((d) reading the
//! neighbour's partial from its own device); in the JSON's `diagnostics` and the section
//! "Where the overhead over (c) goes"; and for every
//! family, each contender's mean SM clock and board power per device over its blocks' timed
//! part (NVML, sampled every `POWER_SAMPLE_PERIOD` by a thread from `power_skip` after the
//! block starts until it ends; the power is NVML's one-second average), in the JSON's
//! `power` and the section "SM clock and board power per contender": under the power cap,
//! the same power at a lower clock means more energy per cycle, less power means idle time.
//!
//! Derived: TFLOP/s per GPU = 2·M·N·K / TP / (d); "% of (b)" = (b)/(d) and "% of (c)" =
//! (c)/(d) (how much of the no-communication GEMM speed distgemm keeps); % of 989 TFLOP/s
//! (dense bf16 peak of H100/H200 SXM); speed-up = (e)/(d) and (f)/(d).
//!
//! Method: operands filled with N(0,1)-like values on the GPU (`fill_normal`); every timed
//! block starts with ≥ 1 s of untimed runs (`SETTLE_MS`, or `--settle-ms`; the estimate is
//! from the FLOPs per GPU at `PLANNING_TFLOPS`: the GPUs are power-capped, and a block timed
//! before the limiter has converged on its load reads fast after idle and depends on what ran
//! before it), then ≥ 20 timed repetitions
//! bracketed by CUDA events (per device for the multi-GPU columns); the slowest device's median
//! repetition is reported (`distgemm::timing` explains why not the median of each
//! repetition's slowest device, which the JSON keeps for (d) as `distgemm_per_rep_max_ms`).
//! A family's (b), (c), its two (d) schedules and its (e) are prepared together and timed in
//! interleaved rounds on all TP GPUs (order reversed each round), so the ratios between them are not skewed by clock and power drift between
//! measurements taken minutes apart (the two reduce-scatter families measure the same (e),
//! each in its own rounds). No input rotation: every working set here is several times the
//! 50 MiB L2 (a warning is printed if one is not).
//! A column that cannot be measured is `null` in the JSON with the reason in `missing`.
//!
//! Usage (the bundle's runner passes a FILTER and `--bench`):
//! `distgemm [FILTER] [--bench] [--tp N] [--tokens M] [--dtype bf16|f16] [--reps N] [--quick]
//!  [--sweep] [--diagnose] [--no-torch] [--python PATH] [--torch-timeout S] [--settle-ms MS]`
//! - `--quick`: 70B presets only, 20 repetitions;
//! - `--settle-ms MS`: untimed work at the start of every block (default `SETTLE_MS`), for
//!   checking that the power limiter has settled;
//! - `--sweep`: instead of the table, the token sweep M ∈ {256, …, 16384} for 70B fc1/fc2: all
//!   eight schedules, judged in the preset's natural family (`ag-a` for fc1, `rs-a` for fc2):
//!   its pipelined vs its single-stage schedule vs (e), where pipelining stops paying and
//!   whether `Auto` follows; writes `distgemm-sweep-<date>-<commit>.{json,md}`.
//! - `--diagnose`: the table with the diagnostic variants (below) beside the pipelined
//!   all-gather schedules (three times as many blocks: with 1 s of settling each, use
//!   `--quick` or a FILTER to stay within a 10-minute call);
//! - FILTER keeps rows whose id `distgemm/<preset>/<schedule>` contains it.
//!
//! Writes `distgemm-<date>-<commit>[-<options>].{json,md}` (`results_stem`: a suffix for each
//! option that changes the measurement, so runs with different options keep their own files)
//! under `DISTGEMM_BENCH_RESULTS` or
//! `benches/results/`. The PyTorch script is found in `DISTGEMM_PEERS_DIR`, else
//! `<bench binary>/../peers/`, else `benches/peers/` of the source tree; the interpreter is

mod contenders;
mod diagnose;
mod family;
mod sweep;
mod table;

use contenders::Ctx;
use distgemm::dtype::Dtype;
use distgemm::gemm::GemmKernel;
use distgemm::problem::Preset;
use distgemm::runtime::{Gpu, Module, hopper_gpus};
use distgemm_benches::distgemm_report::{
    Options, TorchResults, all_rows, find_peer_script, parse_args, presets, row_id,
    run_peer_command,
};
use distgemm_benches::{BenchError, Provenance, ROUNDS};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the PyTorch script once; never fails (a failure is recorded in the result).
fn run_torch(o: &Options, presets: &[Preset], tokens: &[usize], tp: usize) -> TorchResults {
    let script = match find_peer_script() {
        Ok(s) => s,
        Err(e) => return TorchResults::failed(e),
    };
    let python = o
        .python
        .clone()
        .or_else(|| {
            std::env::var("DISTGEMM_PYTHON")
                .ok()
                .filter(|p| !p.is_empty())
        })
        .unwrap_or_else(|| "python3".into());
    let join = |v: Vec<String>| v.join(",");
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--presets")
        .arg(join(presets.iter().map(|p| p.name().to_owned()).collect()))
        .arg("--tokens")
        .arg(join(tokens.iter().map(|t| t.to_string()).collect()))
        .arg("--tp")
        .arg(tp.to_string())
        .arg("--dtype")
        .arg(o.dtype.name())
        .arg("--reps")
        .arg(o.reps.unwrap_or(30).to_string())
        .arg("--rounds")
        .arg(ROUNDS.to_string())
        .arg("--settle-ms")
        .arg(o.settle_ms.to_string())
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NCCL_NVLS_ENABLE", "0")
        .env("NVSHMEM_DISABLE_NVLS", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    println!("== PyTorch peer: {python} {}", script.display());
    run_peer_command(
        cmd,
        Duration::from_secs(o.torch_timeout_s),
        "--torch-timeout",
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A bad option prints clap's message and exits with 2; `--help` prints the options.
    let opts = parse_args(&args).unwrap_or_else(|e| e.exit());
    if opts.runner.listed("distgemm") {
        return;
    }
    if let Err(e) = run(opts) {
        eprintln!("distgemm bench: {e}");
        std::process::exit(1);
    }
}

fn run(opts: Options) -> Result<(), BenchError> {
    let started = Instant::now();
    // How many GPUs, without creating contexts (PyTorch should find the GPUs untouched).
    let count = distgemm::runtime::device::device_count()?;
    let tp = opts.tp.unwrap_or(count);
    if tp == 0 || tp > count {
        return Err(BenchError::Config(format!(
            "--tp {tp} but the driver sees {count} GPU(s)"
        )));
    }
    // The PyTorch peer first, alone on the GPUs, before this process allocates anything.
    let torch = if opts.sweep {
        TorchResults::failed("not run for the sweep".into())
    } else if !opts.torch {
        TorchResults::failed("--no-torch".into())
    } else {
        // Only the presets that have a row selected by FILTER.
        let selected: Vec<Preset> = presets(opts.quick)
            .into_iter()
            .filter(|&p| {
                opts.filter.as_ref().is_none_or(|f| {
                    all_rows()
                        .into_iter()
                        .any(|s| row_id(p, s).contains(f.as_str()))
                })
            })
            .collect();
        if selected.is_empty() {
            TorchResults::failed("no preset selected".into())
        } else {
            run_torch(&opts, &selected, &[opts.tokens], tp)
        }
    };
    let gpus: Vec<Gpu> = hopper_gpus()?.into_iter().take(tp).collect();
    let modules = gpus
        .iter()
        .map(Module::load)
        .collect::<Result<Vec<_>, _>>()?;
    let kernels = modules
        .iter()
        .map(GemmKernel::new)
        .collect::<Result<Vec<_>, _>>()?;
    let prov = Provenance::collect(&gpus[0]);
    let ctx = Ctx {
        l2_bytes: u64::from(gpus[0].l2_cache_bytes()),
        gpus,
        modules,
        kernels,
        opts,
    };
    println!(
        "distgemm bench: {} × {tp}, {}, commit {}, {}{}",
        prov.gpu,
        prov.driver,
        prov.commit,
        ctx.opts.dtype.name(),
        if ctx.opts.quick { ", --quick" } else { "" }
    );
    let result = match (ctx.opts.sweep, ctx.opts.dtype) {
        (false, Dtype::Bf16) => table::table::<half::bf16>(&ctx, tp, &torch, &prov),
        (false, Dtype::F16) => table::table::<half::f16>(&ctx, tp, &torch, &prov),
        (true, Dtype::Bf16) => sweep::sweep::<half::bf16>(&ctx, tp, &prov),
        (true, Dtype::F16) => sweep::sweep::<half::f16>(&ctx, tp, &prov),
    };
    println!(
        "distgemm bench: finished in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    result
}
