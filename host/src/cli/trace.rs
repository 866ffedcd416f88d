//! `distgemm trace`: runs the plan with a trace source and writes the timeline and its summary
//! ([`crate::trace`]) into a directory.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::CliError;
use super::args::{MAX_TRACE_ITERS, TraceArgs, TraceBackend};
use super::memory::{self, Executor};
use super::run::CPU_FLOP_CAP;
use crate::cpu::CpuExecutor;
use crate::dtype::{Dtype, Element};
use crate::plan::{Fp8Inputs, GlobalInputs, Plan};
use crate::trace::{Summary, Trace};

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
        return Err(CliError::CudaUnavailable(
            "the GPU trace source is not built yet; use --backend cpu".into(),
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
    let summary = Summary::of(&trace);
    write_outputs(&args.out, &trace, &summary)?;
    write!(out, "{}", summary.render_text())?;
    writeln!(
        out,
        "wrote {} into {} (open trace.json in ui.perfetto.dev)",
        FILES.join(", "),
        args.out.display()
    )?;
    Ok(())
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

/// Writes [`FILES`] into `dir` (created if missing); an error names the file.
fn write_outputs(dir: &Path, trace: &Trace, summary: &Summary) -> Result<(), CliError> {
    let named = |path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| named(dir, e))?;
    let svg = trace.render_svg().map_err(std::io::Error::other)?;
    let contents = [
        serde_json::to_string(&trace.to_chrome_json())?,
        svg,
        summary.render_text(),
        serde_json::to_string_pretty(summary)? + "\n",
    ];
    for (name, text) in FILES.iter().zip(contents) {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| named(&path, e))?;
    }
    Ok(())
}
