//! `distgemm run --ranks N`: the per-rank mode ([`crate::cuda::RankGemm`]) end to end, one
//! process per rank on this host.
//!
//! The command re-executes itself N times with [`RANK_ENV`] set to `<rank>,<socket>`; each
//! rank process joins a [`LocalRendezvous`] at the socket, opens its GPU (rank r on GPU r, or
//! every rank on GPU 0 with `--share-gpu`), builds its `RankGemm`, makes the same seeded random
//! inputs as `run` and uploads its own shards, runs `--iters` launches on one stream, and with
//! `--check` compares every element of its block of D with the f64 reference, computed on its
//! GPU from the rows of A and B the block needs. Each rank prints one line; the parent waits
//! for all of them (bounded) and exits with the worst status.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::args::{ProblemArgs, RunArgs};
use super::run::{ScaleVectors, check_failed, e4m3_bytes, upload_row_scales, upload_shard};
use super::{CliError, EXIT_RUN_FAILED};
use crate::cuda::rank::RankGemmBuilder;
use crate::cuda::{LocalRendezvous, RankArgs, RankGemm, Rendezvous};
use crate::dtype::{Dtype, Element};
use crate::fp8::Scales;
use crate::plan::SizeError;
use crate::plan::{Fp8Inputs, GlobalInputs, Plan};
use crate::problem::Problem;
use crate::reference::gpu::{ReferenceOperand, packed_products};
use crate::reference::{CheckReport, Products, check_products, check_scaled_products};
use crate::runtime::device::device_count;
use crate::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module, RawStream};
use crate::schedule::Block;

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
    // One module for the rank's runs and for its check's reference kernel.
    let module = Module::load(&gpu)?;
    let builder = builder.module(Arc::clone(&module));
    let problem = args.problem.problem()?;
    let m = &module;
    match (problem.fp8, problem.dtype) {
        (None, Dtype::Bf16) => run_rank::<half::bf16>(args, m, builder.build(rendezvous)?, out),
        (None, Dtype::F16) => run_rank::<half::f16>(args, m, builder.build(rendezvous)?, out),
        (Some(_), Dtype::Bf16) => run_rank_fp8::<half::bf16>(args, m, builder, rendezvous, out),
        (Some(_), Dtype::F16) => run_rank_fp8::<half::f16>(args, m, builder, rendezvous, out),
    }
}

/// One rank of `run --ranks N --dtype e4m3`: every rank draws the same global inputs from the
/// seed and builds with their tensor-wise scales (or launches with the full row-wise scale
/// vectors); then as [`run_rank`], with its block of D checked against
/// `reference::check_scaled_products`.
fn run_rank_fp8<T: Element + DeviceCopy>(
    args: &RunArgs,
    module: &Arc<Module>,
    builder: RankGemmBuilder,
    rendezvous: Arc<dyn Rendezvous>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    let inputs = Fp8Inputs::<T>::random(&problem, args.seed);
    let builder = match inputs.scales {
        Scales::Tensorwise { a, b } => builder.fp8_scales(a, b),
        Scales::Rowwise { .. } => builder,
    };
    let dg = builder.build(rendezvous)?;
    let plan = dg.plan().clone();
    let block = plan.devices[dg.rank()].shards.d;
    let shard = own_shard(plan.shard_fp8_inputs(&inputs)?, dg.rank())?;
    let host = (e4m3_bytes(&shard.a), e4m3_bytes(&shard.b), shard.c.clone());
    let check = |d: &[T]| {
        let scales = block_scales(&inputs.scales, block)?;
        let compare = |sub: &Problem, roundings, products: &Products| {
            check_scaled_products(
                sub,
                roundings,
                plan.tp,
                products,
                &scales,
                shard.c.as_deref(),
                d,
            )
        };
        check_block(module, &plan, block, (&inputs.a, &inputs.b), compare)
    };
    run_rank_shard(
        args,
        module.gpu(),
        dg,
        host,
        Some(&inputs.scales),
        check,
        out,
    )
}

/// One rank of `run --ranks N` in bf16 or f16: the global inputs from the seed, this rank's
/// shard, then as [`run_rank_shard`], with its block of D checked against
/// `reference::check_products`.
fn run_rank<T: Element + ReferenceOperand>(
    args: &RunArgs,
    module: &Arc<Module>,
    dg: RankGemm,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let plan = dg.plan().clone();
    let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
    let block = plan.devices[dg.rank()].shards.d;
    let shard = own_shard(plan.shard_inputs(&inputs)?, dg.rank())?;
    let c = shard.c.clone();
    let check = |d: &[T]| {
        let compare = |sub: &Problem, roundings, products: &Products| {
            check_products(sub, roundings, plan.tp, products, c.as_deref(), d)
        };
        check_block(module, &plan, block, (&inputs.a, &inputs.b), compare)
    };
    let host = (shard.a, shard.b, shard.c);
    run_rank_shard(args, module.gpu(), dg, host, None, check, out)
}

/// `--check` of a rank's `block` of D: every element, against the f64 sums computed on the
/// rank's GPU (`module`) from the block's rows of A and of B (`a`, `b`: the global M×K and
/// N×K). `compare` checks the packed block as a problem of its own (its rows and columns, the
/// same K, scalars and dtype, so the same bound) given the schedule's output roundings; the
/// worst element is reported at its position in the global D.
fn check_block<O: ReferenceOperand>(
    module: &Arc<Module>,
    plan: &Plan,
    block: Block,
    (a, b): (&[O], &[O]),
    compare: impl FnOnce(&Problem, usize, &Products) -> Result<CheckReport, SizeError>,
) -> Result<CheckReport, CliError> {
    let p = plan.problem;
    // Past the end (a plan at odds with the inputs) is an empty operand: a size error below.
    let a = a.get(block.row0 * p.k..).unwrap_or_default();
    let b = b.get(block.col0 * p.k..).unwrap_or_default();
    let products = packed_products(module, a, b, (block.rows, block.cols, p.k))?;
    let sub = Problem {
        m: block.rows,
        n: block.cols,
        ..p
    };
    let mut report = compare(&sub, plan.schedule.roundings(plan.tp), &products)?;
    let cols = block.cols.max(1);
    let (i, j) = (report.worst_index / cols, report.worst_index % cols);
    report.worst_index = (block.row0 + i) * p.n + block.col0 + j;
    Ok(report)
}

/// The FP8 scales of `block` of D: the same pair tensor-wise; row-wise, the block's rows of
/// A's vector and its columns of B's.
fn block_scales(scales: &Scales, block: Block) -> Result<Scales, SizeError> {
    match scales {
        Scales::Tensorwise { .. } => Ok(scales.clone()),
        Scales::Rowwise { a, b } => {
            let part = |v: &[f32], start: usize, len: usize, matrix: &str| {
                v.get(start..start + len)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| SizeError::Elements {
                        matrix: matrix.to_owned(),
                        got: v.len(),
                        expected: start + len,
                    })
            };
            Ok(Scales::Rowwise {
                a: part(a, block.row0, block.rows, "A's row-wise scales")?,
                b: part(b, block.col0, block.cols, "B's row-wise scales")?,
            })
        }
    }
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
/// `--check` compares its block of D (packed) with `check`; prints the rank's line.
fn run_rank_shard<O: DeviceCopy, T: Element + DeviceCopy>(
    args: &RunArgs,
    gpu: &Gpu,
    mut dg: RankGemm,
    (a, b, c): (Vec<O>, Vec<O>, Option<Vec<T>>),
    scales: Option<&Scales>,
    check: impl FnOnce(&[T]) -> Result<CheckReport, CliError>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let plan = dg.plan().clone();
    let rank = dg.rank();
    let stream = gpu.new_stream()?;
    let block = plan.devices[rank].shards.d;
    let (a, b, c, d) = upload_shard(gpu, &stream, (&a, &b, c.as_deref()), block.elements())?;
    let rows = upload_row_scales(gpu, &stream, scales)?;
    let launch = rank_args(&a, &b, c.as_ref(), &d, rows.as_ref());
    let ms = launch_iters(args.iters, &mut dg, &stream, launch)?;
    let verdict = if args.check {
        let report = check(&d.download(&stream)?)?;
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
