//! `distgemm run`: random inputs, the CPU executor or the CUDA backend (`DistGemm`), timing
//! and the optional check.

use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::args::{Backend, RunArgs};
use super::{CliError, cuda_devices};
use crate::cpu::CpuExecutor;
use crate::cuda::{DeviceArgs, DistGemm};
use crate::dtype::{Dtype, Element};
use crate::plan::{GlobalInputs, Plan};
use crate::problem::Problem;
use crate::reference::{CheckInputs, CheckReport, check};
use crate::runtime::{DeviceBuffer, DeviceCopy, Gpu};
use crate::schedule::BufferKind;

/// The CPU executor's cap on `2·M·N·K` per iteration (≈4.3 GFLOP: seconds, not hours, on a
/// laptop; the presets are ~10^4 times larger).
pub const CPU_FLOP_CAP: f64 = 4_294_967_296.0;

/// What `run --json` prints.
#[derive(Debug, Serialize)]
struct RunReport<'a> {
    schedule: &'static str,
    tp: usize,
    problem: &'a Problem,
    backend: &'static str,
    iters: usize,
    seconds_per_iter: f64,
    gflops: f64,
    check: Option<CheckReport>,
}

pub(super) fn run(
    args: &RunArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    let plan = Plan::build(args.problem.schedule, problem, args.problem.tp)?;
    if args.iters == 0 {
        return Err(CliError::Usage("--iters must be at least 1".into()));
    }
    let gpus = match args.backend {
        Backend::Cpu => None,
        Backend::Cuda => Some(cuda_devices(plan.tp).map_err(|reason| {
            CliError::CudaUnavailable(format!(
                "{reason}; use --backend cpu (or auto, which falls back to the CPU)"
            ))
        })?),
        Backend::Auto => match cuda_devices(plan.tp) {
            Ok(gpus) => Some(gpus),
            Err(reason) => {
                writeln!(
                    err,
                    "notice: {reason}; running on the CPU executor (cap: 2·M·N·K ≤ {CPU_FLOP_CAP:.3e} flop)"
                )?;
                None
            }
        },
    };
    if let Some(gpus) = gpus {
        if args.check && problem.flops() > CPU_FLOP_CAP {
            return Err(CliError::TooLargeForCpu(format!(
                "--check computes an f64 reference on the CPU: {}; drop --check",
                too_large(args, &problem)
            )));
        }
        return match problem.dtype {
            Dtype::Bf16 => run_cuda::<half::bf16>(args, plan, gpus, out),
            Dtype::F16 => run_cuda::<half::f16>(args, plan, gpus, out),
        };
    }
    if problem.flops() > CPU_FLOP_CAP {
        return Err(CliError::TooLargeForCpu(too_large(args, &problem)));
    }
    match problem.dtype {
        Dtype::Bf16 => run_typed::<half::bf16>(args, plan, out),
        Dtype::F16 => run_typed::<half::f16>(args, plan, out),
    }
}

fn too_large(args: &RunArgs, problem: &Problem) -> String {
    let head = format!(
        "{problem} needs {:.3e} flop per iteration, above the CPU executor's cap of {CPU_FLOP_CAP:.3e}",
        problem.flops()
    );
    match args.problem.preset {
        Some(preset) => {
            let per_token = 2.0 * problem.n as f64 * problem.k as f64;
            let max = (CPU_FLOP_CAP / per_token).floor();
            if max >= 1.0 {
                format!("{head}: pass --tokens {max} or fewer for {preset}")
            } else {
                format!(
                    "{head}: {preset} is too large for the CPU even at 1 token; use a GPU backend"
                )
            }
        }
        None => format!("{head}: use smaller --m/--n/--k"),
    }
}

fn run_typed<T: Element>(args: &RunArgs, plan: Plan, out: &mut dyn Write) -> Result<(), CliError> {
    let problem = plan.problem;
    let inputs = GlobalInputs::<T>::random(&problem, args.seed);
    let shards = plan.shard_inputs(&inputs);
    let mut exec = CpuExecutor::new(plan)?.with_timeout(Duration::from_millis(args.timeout_ms));
    exec.load_inputs(&shards)?;
    exec.poison();

    let bar = if args.json || args.iters < 2 {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(args.iters as u64)
    };
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} iterations ({elapsed})") {
        bar.set_style(style);
    }
    let start = Instant::now();
    let result = exec.run_with_progress(args.iters, &|i| bar.set_position(i as u64));
    bar.finish_and_clear();
    result?;
    let seconds_per_iter = start.elapsed().as_secs_f64() / args.iters as f64;
    let d = exec.gathered_output();
    report(args, exec.plan(), "cpu", &inputs, &d, seconds_per_iter, out)
}

/// `run` on the GPUs: shards uploaded from host-generated inputs, one `DistGemm`, `iters`
/// runs queued back to back, timed from the first launch to the end of the last.
fn run_cuda<T: Element + DeviceCopy>(
    args: &RunArgs,
    plan: Plan,
    gpus: Vec<Gpu>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = plan.problem;
    let inputs = GlobalInputs::<T>::random(&problem, args.seed);
    let mut shards = Vec::with_capacity(plan.tp);
    for ((shard, gpu), dev) in plan
        .shard_inputs(&inputs)
        .into_iter()
        .zip(&gpus)
        .zip(&plan.devices)
    {
        let stream = gpu.new_stream()?;
        let a = DeviceBuffer::from_host(gpu, &stream, &shard.a)?;
        let b = DeviceBuffer::from_host(gpu, &stream, &shard.b)?;
        let c = match &shard.c {
            Some(c) => Some(DeviceBuffer::from_host(gpu, &stream, c)?),
            None => None,
        };
        let mut d = DeviceBuffer::<T>::alloc(gpu, dev.buffer_elements(BufferKind::D))?;
        d.fill_bytes(&stream, 0xFF)?;
        crate::runtime::stream::synchronize(&stream)?;
        shards.push((a, b, c, d, stream));
    }
    let device_args = shards
        .iter()
        .map(|(a, b, c, d, _)| DeviceArgs {
            a: a.into(),
            b: b.into(),
            c: c.as_ref().map(Into::into),
            d: d.into(),
        })
        .collect();
    let mut dist = DistGemm::builder()
        .devices(gpus)
        .schedule(plan.schedule)
        .problem(problem)
        .timeout(Duration::from_millis(args.timeout_ms))
        .args(device_args)
        .build()?;
    let start = Instant::now();
    for _ in 0..args.iters {
        dist.run()?;
    }
    dist.wait()?;
    let seconds_per_iter = start.elapsed().as_secs_f64() / args.iters as f64;
    let mut outputs = Vec::with_capacity(shards.len());
    for (_, _, _, d, stream) in &shards {
        outputs.push(d.download(stream)?);
    }
    let d = plan.gather_output(&outputs);
    report(args, &plan, "cuda", &inputs, &d, seconds_per_iter, out)
}

/// Prints the run's summary (and check) and turns a failed check into an error.
fn report<T: Element>(
    args: &RunArgs,
    plan: &Plan,
    backend: &'static str,
    inputs: &GlobalInputs<T>,
    d: &[T],
    seconds_per_iter: f64,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = plan.problem;
    let report = args.check.then(|| {
        let inputs = CheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            c: inputs.c.as_deref(),
        };
        check(
            &problem,
            plan.schedule.roundings(plan.tp),
            plan.tp,
            inputs,
            d,
        )
    });
    let summary = RunReport {
        schedule: plan.schedule.cli_name(),
        tp: plan.tp,
        problem: &problem,
        backend,
        iters: args.iters,
        seconds_per_iter,
        gflops: problem.flops() / seconds_per_iter / 1e9,
        check: report,
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(
            out,
            "{} TP={} {} on {backend}: {} iteration(s), {:.3} ms/iteration, {:.3} GFLOP/s",
            summary.schedule,
            summary.tp,
            problem,
            summary.iters,
            seconds_per_iter * 1e3,
            summary.gflops
        )?;
        if let Some(r) = &report {
            writeln!(
                out,
                "check: {} — {} elements, |D − D_ref| ≤ {:.3e}·(|alpha|·Σ|a·b| + |beta·c|) + {:.1e}; worst {:.3} of the bound, max abs error {:.3e}",
                if r.passed() { "passed" } else { "FAILED" },
                r.elements,
                r.bound.relative,
                r.bound.absolute,
                r.worst_ratio,
                r.max_abs_error
            )?;
        }
    }
    match report {
        Some(r) if !r.passed() => Err(CliError::CheckFailed {
            mismatches: r.mismatches,
            elements: r.elements,
            row: r.worst_index / problem.n,
            col: r.worst_index % problem.n,
            ratio: r.worst_ratio,
        }),
        _ => Ok(()),
    }
}
