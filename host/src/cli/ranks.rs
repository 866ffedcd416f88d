//! `distgemm run --ranks N`: the per-rank mode ([`crate::cuda::RankGemm`]) end to end, one
//! process per rank on this host.
//!
//! The command re-executes itself N times with [`RANK_ENV`] set to `<rank>,<socket>`; each
//! rank process joins a [`LocalRendezvous`] at the socket, opens its GPU (rank r on GPU r, or
//! every rank on GPU 0 with `--share-gpu`), builds its `RankGemm`, makes the same seeded random
//! inputs as `run` and uploads its own shards, runs `--iters` launches on one stream, and with
//! `--check` compares its block of D with the f64 reference (every element up to the CPU cap,
//! else the sampled elements that fall in its block). Each rank prints one line; the parent
//! waits for all of them (bounded) and exits with the worst status.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::args::{ProblemArgs, RunArgs};
use super::run::{
    CPU_FLOP_CAP, ScaleVectors, check_failed, e4m3_bytes, upload_row_scales, upload_shard,
};
use super::sample::{RANDOM_SAMPLES, sample_indices};
use super::{CliError, EXIT_RUN_FAILED};
use crate::cuda::rank::RankGemmBuilder;
use crate::cuda::{LocalRendezvous, RankArgs, RankGemm, Rendezvous};
use crate::dtype::{Dtype, Element};
use crate::plan::{Fp8Inputs, GlobalInputs, Plan};
use crate::reference::{
    CheckInputs, CheckReport, ScaledCheckInputs, check_sampled, check_scaled_sampled,
};
use crate::runtime::device::device_count;
use crate::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, RawStream};

/// Set in a rank process: `<rank>,<socket path>`.
pub(crate) const RANK_ENV: &str = "DISTGEMM_RUN_RANK";

/// How long the parent waits for the ranks beyond the runs' own bound: process start, PTX
/// JIT, input generation and upload.
const START_SLACK: Duration = Duration::from_secs(300);

/// The parent: starts one process per rank and waits for them.
pub(crate) fn launch(args: &RunArgs, ranks: usize, out: &mut dyn Write) -> Result<(), CliError> {
    let runs = Duration::from_millis(args.timeout_ms).saturating_mul(args.iters as u32 + 2);
    spawn_ranks(ranks, args.problem.tp, args.share_gpu, runs)?;
    writeln!(out, "all {ranks} rank processes passed")?;
    Ok(())
}

/// Re-executes this command once per rank (with [`RANK_ENV`]) and waits for every rank, at
/// most [`START_SLACK`] plus `runs`; an error names the ranks that failed.
pub(crate) fn spawn_ranks(
    ranks: usize,
    tp: usize,
    share_gpu: bool,
    runs: Duration,
) -> Result<(), CliError> {
    check_rank_count(ranks, tp)?;
    let gpus = device_count().map_err(|e| CliError::CudaUnavailable(e.to_string()))?;
    if !share_gpu && gpus < ranks {
        return Err(CliError::CudaUnavailable(format!(
            "--ranks {ranks} needs {ranks} GPUs, this machine has {gpus} (add --share-gpu to \
             test the protocol with every rank on GPU 0)"
        )));
    }
    let exe = std::env::current_exe()?;
    let socket = std::env::temp_dir().join(format!("distgemm-run-{}.sock", std::process::id()));
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let mut children: Vec<Child> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let child = Command::new(&exe)
            .args(&arguments)
            .env(RANK_ENV, format!("{rank},{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                }
                return Err(e.into());
            }
        }
    }
    let limit = START_SLACK + runs;
    let start = Instant::now();
    let mut codes: Vec<Option<i32>> = vec![None; ranks];
    while codes.iter().any(Option::is_none) {
        for (rank, child) in children.iter_mut().enumerate() {
            if codes[rank].is_none()
                && let Some(status) = child.try_wait()?
            {
                codes[rank] = Some(status.code().unwrap_or(i32::from(EXIT_RUN_FAILED)));
            }
        }
        if start.elapsed() > limit {
            for child in &mut children {
                let _ = child.kill();
            }
            return Err(CliError::RankProcesses(format!(
                "the rank processes did not finish within {limit:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let worst = codes.iter().flatten().copied().max().unwrap_or(0);
    if worst != 0 {
        let failed: Vec<String> = codes
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != Some(0))
            .map(|(r, c)| format!("rank {r} (exit {})", c.unwrap_or(-1)))
            .collect();
        return Err(CliError::RankFailed {
            code: u8::try_from(worst).unwrap_or(EXIT_RUN_FAILED),
            message: format!("{} failed", failed.join(", ")),
        });
    }
    Ok(())
}

/// `--ranks` must equal `--tp`: one process per rank.
pub(crate) fn check_rank_count(ranks: usize, tp: usize) -> Result<(), CliError> {
    if ranks != tp {
        return Err(CliError::Usage(format!(
            "--ranks {ranks} must equal --tp {tp} (one process per rank)"
        )));
    }
    Ok(())
}

/// A rank process's side of [`spawn_ranks`]: its rank (from `spec`, [`RANK_ENV`]'s value),
/// the joined rendezvous, its GPU (rank r's, or GPU 0 with `share_gpu`), and the builder of
/// its `RankGemm` for `problem`.
pub(crate) fn join_rank(
    spec: &str,
    problem: &ProblemArgs,
    timeout_ms: u64,
    share_gpu: bool,
) -> Result<(usize, Arc<dyn Rendezvous>, Gpu, RankGemmBuilder), CliError> {
    let (rank, socket) = spec
        .split_once(',')
        .and_then(|(r, s)| Some((r.parse::<usize>().ok()?, PathBuf::from(s))))
        .ok_or_else(|| CliError::Usage(format!("{RANK_ENV}={spec} is not <rank>,<socket>")))?;
    let rendezvous: Arc<dyn Rendezvous> = Arc::new(
        LocalRendezvous::join(&socket, rank, problem.tp, START_SLACK)
            .map_err(|e| CliError::RankProcesses(e.to_string()))?,
    );
    let gpu = Gpu::open(if share_gpu { 0 } else { rank })?;
    let builder = RankGemm::builder()
        .gpu(gpu.clone())
        .schedule(problem.schedule)
        .rs_partials(problem.plan_options().rs_partials)
        .problem(problem.problem()?)
        .timeout(Duration::from_millis(timeout_ms))
        .allow_shared_gpu(share_gpu);
    Ok((rank, rendezvous, gpu, builder))
}

/// A rank process of `run --ranks` (`spec` is [`RANK_ENV`]'s value).
pub(crate) fn rank_main(args: &RunArgs, spec: &str, out: &mut dyn Write) -> Result<(), CliError> {
    let (_, rendezvous, gpu, builder) =
        join_rank(spec, &args.problem, args.timeout_ms, args.share_gpu)?;
    let problem = args.problem.problem()?;
    match (problem.fp8, problem.dtype) {
        (None, Dtype::Bf16) => run_rank::<half::bf16>(args, &gpu, builder.build(rendezvous)?, out),
        (None, Dtype::F16) => run_rank::<half::f16>(args, &gpu, builder.build(rendezvous)?, out),
        (Some(_), Dtype::Bf16) => run_rank_fp8::<half::bf16>(args, &gpu, builder, rendezvous, out),
        (Some(_), Dtype::F16) => run_rank_fp8::<half::f16>(args, &gpu, builder, rendezvous, out),
    }
}

/// One rank of `run --ranks N --dtype e4m3`: every rank draws the same global inputs from the
/// seed and builds with their tensor-wise scales (or launches with the full row-wise scale
/// vectors); then as [`run_rank`], with D checked against `reference::check_scaled`.
fn run_rank_fp8<T: Element + DeviceCopy>(
    args: &RunArgs,
    gpu: &Gpu,
    builder: RankGemmBuilder,
    rendezvous: Arc<dyn Rendezvous>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    let inputs = Fp8Inputs::<T>::random(&problem, args.seed);
    let builder = match inputs.scales {
        crate::fp8::Scales::Tensorwise { a, b } => builder.fp8_scales(a, b),
        crate::fp8::Scales::Rowwise { .. } => builder,
    };
    let dg = builder.build(rendezvous)?;
    let plan = dg.plan().clone();
    let shard = own_shard(plan.shard_fp8_inputs(&inputs)?, dg.rank())?;
    let host = (e4m3_bytes(&shard.a), e4m3_bytes(&shard.b), shard.c);
    let check = |d: &[T], indices: &[usize]| {
        let inputs = ScaledCheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            scales: &inputs.scales,
            c: inputs.c.as_deref(),
        };
        let roundings = plan.schedule.roundings(plan.tp);
        check_scaled_sampled(&plan.problem, roundings, plan.tp, inputs, d, indices)
    };
    run_rank_shard(args, gpu, dg, host, Some(&inputs.scales), check, out)
}

/// One rank of `run --ranks N` in bf16 or f16: the global inputs from the seed, this rank's
/// shard, then as [`run_rank_shard`], with D checked against `reference::check`.
fn run_rank<T: Element + DeviceCopy>(
    args: &RunArgs,
    gpu: &Gpu,
    dg: RankGemm,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let plan = dg.plan().clone();
    let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
    let shard = own_shard(plan.shard_inputs(&inputs)?, dg.rank())?;
    let check = |d: &[T], indices: &[usize]| {
        let inputs = CheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            c: inputs.c.as_deref(),
        };
        let roundings = plan.schedule.roundings(plan.tp);
        check_sampled(&plan.problem, roundings, plan.tp, inputs, d, indices)
    };
    run_rank_shard(args, gpu, dg, (shard.a, shard.b, shard.c), None, check, out)
}

/// Rank `rank`'s element of every device's `shards`.
pub(crate) fn own_shard<S>(shards: Vec<S>, rank: usize) -> Result<S, CliError> {
    shards
        .into_iter()
        .nth(rank)
        .ok_or_else(|| CliError::Usage(format!("no shard for rank {rank}")))
}

/// Uploads this rank's operands `(a, b, c)` (A and B as `O`: the element type, or e4m3
/// bytes) and an FP8 problem's row-wise scale vectors, launches `args.iters` runs, and with
/// `--check` compares its block of D with `check(global D, indices)` ([`own_block`]);
/// prints the rank's line.
fn run_rank_shard<O: DeviceCopy, T: Element + DeviceCopy, E>(
    args: &RunArgs,
    gpu: &Gpu,
    mut dg: RankGemm,
    (a, b, c): (Vec<O>, Vec<O>, Option<Vec<T>>),
    scales: Option<&crate::fp8::Scales>,
    check: impl FnOnce(&[T], &[usize]) -> Result<CheckReport, E>,
    out: &mut dyn Write,
) -> Result<(), CliError>
where
    CliError: From<E>,
{
    let plan = dg.plan().clone();
    let rank = dg.rank();
    let stream = gpu.new_stream()?;
    let block = plan.devices[rank].shards.d;
    let (a, b, c, d) = upload_shard(gpu, &stream, (&a, &b, c.as_deref()), block.elements())?;
    let rows = upload_row_scales(gpu, &stream, scales)?;
    let launch = rank_args(&a, &b, c.as_ref(), &d, rows.as_ref());
    let ms = launch_iters(args.iters, &mut dg, &stream, launch)?;
    let verdict = if args.check {
        let (global, indices) = own_block(args, &plan, rank, &d.download(&stream)?);
        let report = check(&global, &indices)?;
        if !report.passed() {
            return Err(check_failed(&report, plan.problem.n));
        }
        format!(", check ok ({} elements of its block)", report.elements)
    } else {
        String::new()
    };
    print_rank_line(args, &plan, rank, gpu, ms, &verdict, out)
}

/// The launch arguments of this rank's uploaded buffers (and row-wise scale vectors).
pub(crate) fn rank_args<O: DeviceCopy, T: DeviceCopy>(
    a: &DeviceBuffer<O>,
    b: &DeviceBuffer<O>,
    c: Option<&DeviceBuffer<T>>,
    d: &DeviceBuffer<T>,
    rows: Option<&ScaleVectors>,
) -> RankArgs {
    RankArgs {
        a: a.device_ptr(),
        b: b.device_ptr(),
        c: c.map_or(0, DeviceBuffer::device_ptr),
        d: d.device_ptr(),
        a_scales: rows.map_or(0, |(sa, _)| sa.device_ptr()),
        b_scales: rows.map_or(0, |(_, sb)| sb.device_ptr()),
    }
}

/// Launches `iters` runs on `stream` and waits; returns the milliseconds per run.
pub(crate) fn launch_iters(
    iters: usize,
    dg: &mut RankGemm,
    stream: &CudaStream,
    launch: RankArgs,
) -> Result<f64, CliError> {
    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY: the caller's buffers are this GPU's, sized by the plan, and outlive the runs
        // (the synchronisation below comes before they drop); nothing else writes them.
        unsafe { dg.launch_raw(RawStream::of(stream), launch)? };
    }
    dg.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / iters as f64)
}

/// Rank `rank`'s block of D (`mine`) placed in a global M×N matrix of NaN, and the indices
/// `--check` compares there: every element of the block up to [`CPU_FLOP_CAP`] per rank,
/// else the run's sample restricted to the block.
fn own_block<T: Element>(
    args: &RunArgs,
    plan: &Plan,
    rank: usize,
    mine: &[T],
) -> (Vec<T>, Vec<usize>) {
    let (p, block) = (&plan.problem, plan.devices[rank].shards.d);
    let mut global = vec![T::nan(); p.m * p.n];
    block.insert(mine, &mut global, p.n);
    let inside = |idx: &usize| {
        let (i, j) = (idx / p.n, idx % p.n);
        (block.row0..block.row0 + block.rows).contains(&i)
            && (block.col0..block.col0 + block.cols).contains(&j)
    };
    let indices: Vec<usize> = if p.flops() / plan.tp as f64 <= CPU_FLOP_CAP {
        (0..global.len()).filter(inside).collect()
    } else {
        sample_indices(plan, RANDOM_SAMPLES, args.seed)
            .into_iter()
            .filter(inside)
            .collect()
    };
    (global, indices)
}

/// The rank's one-line summary.
fn print_rank_line(
    args: &RunArgs,
    plan: &Plan,
    rank: usize,
    gpu: &Gpu,
    ms: f64,
    verdict: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    writeln!(
        out,
        "rank {rank}/{} {} {} on GPU {}: {} iteration(s), {ms:.3} ms/iteration{verdict}",
        plan.tp,
        plan.schedule.cli_name(),
        plan.problem,
        gpu.ordinal(),
        args.iters
    )?;
    Ok(())
}
