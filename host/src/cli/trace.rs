//! `distgemm trace`: runs the plan with a trace source and writes the timeline and its summary
//! ([`crate::trace`]) into a directory.
//!
//! On the GPUs (`--backend cuda`): CUPTI's activity collection starts, paused, before the
//! graphs exist; the plan is built on random inputs and run 5 times untraced; then
//! [`OVERHEAD_ROUNDS`] rounds of [`OVERHEAD_RUNS`] runs each with the collection paused and
//! on, alternately (host wall time per run, every run waited for), give the cost of tracing;
//! then `--iters` runs are traced, and their records become the node spans
//! ([`crate::trace::activity`]).
//!
//! With `--ranks N` (the per-rank mode, one process per GPU, or every rank on GPU 0 with
//! `--share-gpu`): this process starts the ranks ([`super::ranks::spawn_ranks`]); each joins,
//! starts its own collection, builds its `RankGemm` on the seeded random inputs' shard, runs
//! the warm-up and the `--iters` traced launches, and writes its nodes' intervals to
//! `rank-<r>.intervals.json` in `--out`; this process merges them (CUPTI's timestamps are the
//! host's clock in every process) and writes the outputs. No tracing-cost rounds there.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::CliError;
use super::args::{MAX_TRACE_ITERS, TraceArgs, TraceBackend};
use serde::{Deserialize, Serialize};

use super::cupti::{Activity, check_available, node_id};
use super::memory::{self, Executor};
use super::ranks::{RANK_ENV, check_rank_count, join_rank, launch_iters, own_shard, rank_args};
use super::run::{
    CPU_FLOP_CAP, fp8_host_shards, host_shards, load_modules, upload_shard, with_dist,
};
use crate::cpu::CpuExecutor;
use crate::cuda::DistGemm;
use crate::dtype::{Dtype, Element};
use crate::plan::{Fp8Inputs, GlobalInputs, Plan};
use crate::runtime::{DeviceCopy, Gpu};
use crate::timing::median;
use crate::trace::activity::{node_intervals, spans_from_activity, spans_from_intervals};
use crate::trace::{Interval, Summary, Trace, TraceSource};

/// Untraced runs before anything is measured.
const WARMUP_RUNS: usize = 5;
/// Rounds of the tracing-cost comparison (collection paused, then on, in each).
const OVERHEAD_ROUNDS: usize = 5;
/// Runs per block of that comparison.
const OVERHEAD_RUNS: usize = 20;

/// The files `trace` writes into `--out`.
const FILES: [&str; 4] = ["trace.json", "timeline.svg", "summary.txt", "summary.json"];

pub(super) fn trace(args: &TraceArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    if !(1..=MAX_TRACE_ITERS).contains(&args.iters) {
        return Err(CliError::Usage(format!(
            "--iters must be between 1 and {MAX_TRACE_ITERS}, got {}",
            args.iters
        )));
    }
    if args.timeout_ms == 0 {
        return Err(CliError::Usage(
            "--timeout-ms must be at least 1 (it bounds every wait)".into(),
        ));
    }
    let plan = args.problem.plan(problem)?;
    if args.backend == TraceBackend::Cuda {
        if let Ok(spec) = std::env::var(RANK_ENV) {
            return trace_rank(args, &spec);
        }
        if let Some(ranks) = args.ranks {
            return trace_ranks(args, plan, ranks, out);
        }
        return trace_on_gpus(args, plan, out);
    }
    if args.ranks.is_some() {
        return Err(CliError::Usage(
            "--ranks traces one process per GPU (the CUDA backend); use --backend cuda".into(),
        ));
    }
    if problem.flops() > CPU_FLOP_CAP {
        return Err(CliError::TooLarge(format!(
            "{problem} is above the CPU executor's cap of 2·M·N·K ≤ {CPU_FLOP_CAP:.3e} flop; \
             use smaller --m/--n/--k or --tokens"
        )));
    }
    memory::check_host(
        memory::host_bytes(&plan, Executor::Cpu, false),
        &format!("{problem} on the CPU executor"),
    )?;
    let trace = match problem.dtype {
        Dtype::Bf16 => trace_cpu::<half::bf16>(args, plan)?,
        Dtype::F16 => trace_cpu::<half::f16>(args, plan)?,
    };
    finish(args, &trace, "", out)
}

/// Writes the outputs and prints the summary, `more` (lines after it) and where the files
/// went.
fn finish(
    args: &TraceArgs,
    trace: &Trace,
    more: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let summary = write_outputs(&args.out, trace)?;
    write!(out, "{}{more}", summary.render_text())?;
    writeln!(
        out,
        "wrote {} into {} (open trace.json in ui.perfetto.dev)",
        FILES.join(", "),
        args.out.display()
    )?;
    Ok(())
}

/// `trace --backend cuda`: the GPU checks of `run`, then [`trace_cuda`], the outputs, the
/// summary and the cost of tracing.
fn trace_on_gpus(args: &TraceArgs, plan: Plan, out: &mut dyn Write) -> Result<(), CliError> {
    super::check_ptx_file()?;
    let gpus = super::cuda_devices(plan.tp)
        .map_err(|reason| CliError::CudaUnavailable(format!("{reason}; use --backend cpu")))?;
    memory::check_devices(&plan, &gpus)?;
    let (trace, cost) = match plan.problem.dtype {
        Dtype::Bf16 => trace_cuda::<half::bf16>(args, &plan, gpus)?,
        Dtype::F16 => trace_cuda::<half::f16>(args, &plan, gpus)?,
    };
    let cost = format!(
        "cost of tracing (host wall time per run, median of {OVERHEAD_ROUNDS} rounds of \
         {OVERHEAD_RUNS} runs): {:.4} ms with CUPTI's collection paused, {:.4} ms on ({:+.2} %); \
         without `trace`, CUPTI is not loaded and the kernels are the same\n",
        cost.off_ms,
        cost.on_ms,
        (cost.on_ms / cost.off_ms - 1.0) * 100.0
    );
    finish(args, &trace, &cost, out)
}

/// Median wall time per run with the collection paused and on.
struct TracingCost {
    off_ms: f64,
    on_ms: f64,
}

/// The plan on random inputs on `gpus`, traced by CUPTI (see the module documentation).
fn trace_cuda<T: Element + DeviceCopy>(
    args: &TraceArgs,
    plan: &Plan,
    gpus: Vec<Gpu>,
) -> Result<(Trace, TracingCost), CliError> {
    // Before any graph exists, so that CUPTI knows every node the records will name.
    let activity = Activity::start()?;
    activity.pause()?;
    let modules = load_modules(&gpus)?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let drive = |dist: &mut DistGemm<'_>| traced_runs(args.iters, plan, &activity, dist);
    let (traced, _) = if plan.problem.fp8.is_some() {
        let inputs = Fp8Inputs::<T>::random(&plan.problem, args.seed);
        let shards = fp8_host_shards(plan, &inputs)?;
        with_dist(
            timeout,
            plan,
            gpus,
            modules,
            shards,
            Some(&inputs.scales),
            drive,
        )?
    } else {
        let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
        let shards = host_shards(plan, &inputs)?;
        with_dist(timeout, plan, gpus, modules, shards, None, drive)?
    };
    Ok(traced)
}

/// Warm-up, the tracing-cost rounds, then `iters` traced runs turned into the trace.
fn traced_runs(
    iters: usize,
    plan: &Plan,
    activity: &Activity,
    dist: &mut DistGemm<'_>,
) -> Result<(Trace, TracingCost), CliError> {
    let block = |dist: &mut DistGemm<'_>, runs: usize| -> Result<f64, CliError> {
        let start = Instant::now();
        for _ in 0..runs {
            dist.run()?;
        }
        dist.wait()?;
        Ok(start.elapsed().as_secs_f64() * 1e3 / runs as f64)
    };
    block(dist, WARMUP_RUNS)?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..OVERHEAD_ROUNDS {
        off.push(block(dist, OVERHEAD_RUNS)?);
        activity.resume()?;
        on.push(block(dist, OVERHEAD_RUNS)?);
        activity.pause()?;
    }
    activity.take()?;
    activity.resume()?;
    block(dist, iters)?;
    activity.pause()?;
    let records = activity.take()?;
    let node_ids = (0..plan.tp)
        .map(|rank| {
            dist.graph_nodes(rank)?
                .iter()
                .map(|&n| node_id(n))
                .collect()
        })
        .collect::<Result<Vec<Vec<u64>>, CliError>>()?;
    let known: std::collections::HashSet<u64> = node_ids.iter().flatten().copied().collect();
    let matched = records
        .iter()
        .filter(|r| known.contains(&r.graph_node_id))
        .count();
    if matched == 0 {
        return Err(CliError::CudaUnavailable(format!(
            "CUPTI reported {} kernel and copy records, none from distgemm's graph nodes (is \
             another profiler attached?)",
            records.len()
        )));
    }
    let spans = spans_from_activity(plan, &node_ids, &records, iters)?;
    let cost = TracingCost {
        off_ms: median(&off),
        on_ms: median(&on),
    };
    Ok((Trace::new(plan, TraceSource::Cupti, &spans)?, cost))
}

/// `--iters` runs on the CPU executor on random inputs (FP8 ones for an FP8 problem), traced.
fn trace_cpu<T: Element>(args: &TraceArgs, plan: Plan) -> Result<Trace, CliError> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let exec = if plan.problem.fp8.is_some() {
        let inputs = Fp8Inputs::<T>::random(&plan.problem, args.seed);
        let shards = plan.shard_fp8_inputs(&inputs)?;
        let mut exec = CpuExecutor::new(plan)?.with_timeout(timeout);
        exec.load_fp8_inputs(&shards)?;
        exec
    } else {
        let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
        let shards = plan.shard_inputs(&inputs)?;
        let mut exec = CpuExecutor::new(plan)?.with_timeout(timeout);
        exec.load_inputs(&shards)?;
        exec
    };
    Ok(exec.run_traced(args.iters)?)
}

/// Writes [`FILES`] into `dir` (created if missing; an error names the file) and returns
/// the trace's summary.
fn write_outputs(dir: &Path, trace: &Trace) -> Result<Summary, CliError> {
    let summary = Summary::of(trace);
    let named = |path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| named(dir, e))?;
    let svg = trace.render_svg().map_err(std::io::Error::other)?;
    let contents = [
        serde_json::to_string(&trace.to_chrome_json())?,
        svg,
        summary.render_text(),
        serde_json::to_string_pretty(&summary)? + "\n",
    ];
    for (name, text) in FILES.iter().zip(contents) {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| named(&path, e))?;
    }
    Ok(summary)
}

/// What a rank process of `trace --ranks` hands to the parent.
#[derive(Debug, Serialize, Deserialize)]
struct RankIntervals {
    /// The rank.
    rank: usize,
    /// Per node of the rank's plan: the intervals of its traced runs, sorted by start.
    nodes: Vec<Vec<Interval>>,
}

/// The file a rank process writes into `--out`.
fn rank_file(dir: &Path, rank: usize) -> std::path::PathBuf {
    dir.join(format!("rank-{rank}.intervals.json"))
}

/// `trace --backend cuda --ranks N`: starts the rank processes, merges their intervals into
/// the trace and writes the outputs.
fn trace_ranks(
    args: &TraceArgs,
    plan: Plan,
    ranks: usize,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if plan.problem.fp8.is_some() {
        return Err(CliError::Usage(
            "trace --ranks takes bf16 and f16 for now; trace FP8 in one process (no --ranks)"
                .into(),
        ));
    }
    super::check_ptx_file()?;
    check_rank_count(ranks, plan.tp)?;
    // A rank without CUPTI would fail only after its peers had joined and started waiting.
    check_available()?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", args.out.display())))?;
    let remove_rank_files = || {
        for rank in 0..ranks {
            let _ = std::fs::remove_file(rank_file(&args.out, rank));
        }
    };
    remove_rank_files();
    let runs = (WARMUP_RUNS + args.iters + 2) as u32;
    let bound = Duration::from_millis(args.timeout_ms).saturating_mul(runs);
    // A failed group leaves no rank's file behind.
    super::ranks::spawn_ranks(ranks, plan.tp, args.share_gpu, bound)
        .inspect_err(|_| remove_rank_files())?;
    let mut timed = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let path = rank_file(&args.out, rank);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let got: RankIntervals = serde_json::from_str(&text)?;
        if got.rank != rank {
            return Err(CliError::RankProcesses(format!(
                "{} holds rank {}'s intervals",
                path.display(),
                got.rank
            )));
        }
        timed.push(got.nodes);
        std::fs::remove_file(&path)?;
    }
    let spans = spans_from_intervals(&plan, timed, args.iters)?;
    let trace = Trace::new(&plan, TraceSource::Cupti, &spans)?;
    finish(
        args,
        &trace,
        &format!("traced as {ranks} rank processes\n"),
        out,
    )
}

/// A rank process of `trace --ranks` (`spec` is [`RANK_ENV`]'s value).
fn trace_rank(args: &TraceArgs, spec: &str) -> Result<(), CliError> {
    match args.problem.problem()?.dtype {
        Dtype::Bf16 => trace_rank_typed::<half::bf16>(args, spec),
        Dtype::F16 => trace_rank_typed::<half::f16>(args, spec),
    }
}

/// See [`trace_rank`]: the collection starts once the rank has joined, before its graph is
/// built.
fn trace_rank_typed<T: Element + DeviceCopy>(args: &TraceArgs, spec: &str) -> Result<(), CliError> {
    let (rank, rendezvous, gpu, builder) =
        join_rank(spec, &args.problem, args.timeout_ms, args.share_gpu)?;
    // After joining (a failure here reaches the peers through the rendezvous), before the
    // graph is built.
    let activity = Activity::start()?;
    activity.pause()?;
    let mut dg = builder.build(rendezvous)?;
    let plan = dg.plan().clone();
    let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
    let shard = own_shard(plan.shard_inputs(&inputs)?, rank)?;
    let stream = gpu.new_stream()?;
    let block = plan.devices[rank].shards.d;
    let operands = (&shard.a[..], &shard.b[..], shard.c.as_deref());
    let (a, b, c, d) = upload_shard(&gpu, &stream, operands, block.elements())?;
    let launch = rank_args(&a, &b, c.as_ref(), &d, None);
    launch_iters(WARMUP_RUNS, &mut dg, &stream, launch)?;
    activity.take()?;
    activity.resume()?;
    launch_iters(args.iters, &mut dg, &stream, launch)?;
    activity.pause()?;
    let records = activity.take()?;
    let ids = dg
        .graph_nodes()
        .iter()
        .map(|&n| node_id(n))
        .collect::<Result<Vec<u64>, CliError>>()?;
    let intervals = RankIntervals {
        rank,
        nodes: node_intervals(&ids, &records),
    };
    let path = rank_file(&args.out, rank);
    std::fs::write(&path, serde_json::to_string(&intervals)?)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok(())
}
