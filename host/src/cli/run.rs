//! `distgemm run`: random inputs, the CPU executor, timing and the optional check.

use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::CliError;
use super::args::{Backend, RunArgs};
use crate::cpu::CpuExecutor;
use crate::dtype::{Dtype, Element};
use crate::plan::{GlobalInputs, Plan};
use crate::problem::Problem;
use crate::reference::{CheckInputs, CheckReport, check};

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
    match args.backend {
        Backend::Cuda => return Err(CliError::CudaUnavailable),
        Backend::Auto => writeln!(
            err,
            "notice: CUDA backend not available yet; running on the CPU executor (cap: 2·M·N·K ≤ {CPU_FLOP_CAP:.3e} flop)"
        )?,
        Backend::Cpu => {}
    }
    if problem.flops() > CPU_FLOP_CAP {
        return Err(CliError::TooLargeForCpu(too_large(args, &problem)));
    }
    if args.iters == 0 {
        return Err(CliError::Usage("--iters must be at least 1".into()));
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

    let plan = exec.plan();
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
            &exec.gathered_output(),
        )
    });
    let summary = RunReport {
        schedule: plan.schedule.cli_name(),
        tp: plan.tp,
        problem: &problem,
        backend: "cpu",
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
            "{} TP={} {} on cpu: {} iteration(s), {:.3} ms/iteration, {:.3} GFLOP/s",
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
