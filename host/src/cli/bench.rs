//! `distgemm bench`: times the CUDA backend on one problem.
//!
//! Per device, A, B (and C when beta ≠ 0) shards sized by the plan are filled on the GPU
//! ([`random_operands`]: presets are far too large to generate on the host) and D is poisoned
//! once (0xFF bytes: NaN). One [`DistGemm`] is built (graphs instantiated once), `--warmup` runs are
//! launched untimed, then `--reps` runs are each bracketed by CUDA events on every GPU's
//! stream ([`time_on_streams`]; the host does not wait between runs, and the reported time is
//! the slowest GPU's median run). A final [`DistGemm::wait`] turns a timed-out GPU wait into an error instead
//! of a number.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::args::{BenchArgs, MAX_BENCH_REPS, MIN_BENCH_REPS};
use super::{CliError, check_ptx_file, cuda_devices, memory};
use crate::cuda::{DistGemm, DistGemmError};
use crate::dtype::{Dtype, Element};
use crate::problem::Problem;
use crate::runtime::{DeviceCopy, Gpu, Module};
use crate::testdata::random_operands;
use crate::timing::{Timing, TimingConfig, time_on_streams};

/// What `bench` reports (`--json` prints it as one object).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct BenchReport {
    /// The schedule that ran (with `--auto`, the one the rule chose).
    schedule: &'static str,
    /// `--schedule` as given.
    requested_schedule: &'static str,
    /// Whether `--auto` chose the schedule.
    auto: bool,
    /// What decided the schedule: `fixed`, `rule`, or the tuning table that did.
    schedule_source: String,
    /// How reduce-scatter partials reach their stage (`read` or `push`; `read` for
    /// all-gather schedules).
    rs_partials: &'static str,
    tp: usize,
    /// Name of GPU 0.
    gpu: String,
    problem: Problem,
    dtype: &'static str,
    /// The slowest GPU's median repetition ([`Timing::median_ms`]).
    median_ms: f64,
    /// Median over repetitions of each repetition's slowest GPU.
    per_rep_max_median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    /// 2·M·N·K / TP / median.
    tflops_per_gpu: f64,
    /// `DistGemm::workspace_bytes(rank)`, index = rank.
    workspace_bytes_per_gpu: Vec<usize>,
    warmup: usize,
    reps: usize,
    timeout_ms: u64,
    /// Every repetition (slowest GPU), in launch order.
    samples_ms: Vec<f64>,
}

pub(super) fn bench(args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    check_counts(args)?;
    // The shapes are checked without a GPU, so bad input is exit 2 everywhere.
    let plan = args.problem.plan(problem)?;
    // The PTX file too: an unusable DISTGEMM_PTX is bad input on every machine.
    check_ptx_file()?;
    let gpus = cuda_devices(plan.tp).map_err(|reason| {
        CliError::CudaUnavailable(format!(
            "{reason}; distgemm bench times the CUDA backend only (no CPU fallback; \
             `distgemm run --backend cpu` runs the CPU executor)"
        ))
    })?;
    memory::check_devices(&plan, &gpus)?;
    let report = match problem.dtype {
        Dtype::Bf16 => bench_typed::<half::bf16>(args, problem, gpus)?,
        Dtype::F16 => bench_typed::<half::f16>(args, problem, gpus)?,
    };
    if args.report.json() {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        write!(out, "{}", render_text(&report))?;
    }
    Ok(())
}

/// `--reps`, `--warmup` and `--timeout-ms` within their ranges.
fn check_counts(args: &BenchArgs) -> Result<(), CliError> {
    if !(MIN_BENCH_REPS..=MAX_BENCH_REPS).contains(&args.reps) {
        return Err(CliError::Usage(format!(
            "--reps must be between {MIN_BENCH_REPS} and {MAX_BENCH_REPS}, got {}",
            args.reps
        )));
    }
    if args.warmup > MAX_BENCH_REPS {
        return Err(CliError::Usage(format!(
            "--warmup must be at most {MAX_BENCH_REPS}, got {}",
            args.warmup
        )));
    }
    if args.timeout_ms == 0 {
        return Err(CliError::Usage(
            "--timeout-ms must be at least 1 (it bounds every GPU wait)".into(),
        ));
    }
    Ok(())
}

/// TFLOP/s per GPU of `problem` split over `tp` GPUs taking `median_ms`.
fn tflops_per_gpu(problem: &Problem, tp: usize, median_ms: f64) -> f64 {
    problem.flops() / tp.max(1) as f64 / (median_ms * 1e-3) / 1e12
}

fn bench_typed<T: Element + DeviceCopy>(
    args: &BenchArgs,
    problem: Problem,
    gpus: Vec<Gpu>,
) -> Result<BenchReport, CliError> {
    let tp = args.problem.tp;
    let requested = args.problem.schedule;
    let modules = gpus
        .iter()
        .map(Module::load)
        .collect::<Result<Vec<Arc<Module>>, _>>()?;
    let builder = DistGemm::builder()
        .devices(gpus.clone())
        .tp(tp)
        .problem(problem)
        .dtype(T::DTYPE)
        .timeout(Duration::from_millis(args.timeout_ms))
        .modules(modules.clone());
    let builder = match args.problem.rs_partials {
        Some(p) => builder.rs_partials(p),
        None => builder,
    };
    let builder = if args.auto {
        builder.auto_schedule(requested)
    } else {
        builder.schedule(requested)
    };
    // The plan that will run (with --auto, of the chosen schedule): it sizes the shards.
    let to_cli = |e| match e {
        DistGemmError::Plan(e) => CliError::Plan(e),
        e => CliError::Cuda(e),
    };
    let plan = builder.plan().map_err(to_cli)?;
    let schedule_source = builder.resolution().map_err(to_cli)?.source.to_string();
    // The shards must outlive the DistGemm (locals drop in reverse order).
    let operands = random_operands::<T>(&plan, &gpus, &modules, 1)?;
    let builder = match operands.tensor_scales() {
        Some((sa, sb)) => builder.fp8_scales(sa, sb),
        None => builder,
    };
    let mut dist = builder.args(operands.device_args()).build()?;
    let streams = dist.streams();
    let config = TimingConfig {
        warmup: args.warmup,
        reps: args.reps,
    };
    let measured: Result<Timing, CliError> =
        time_on_streams(&gpus, &streams, config, |_| Ok(dist.run()?));
    // Always wait (it reads every GPU's error word), also after a failed launch.
    let waited = dist.wait();
    let timing = measured?;
    waited?;
    Ok(BenchReport {
        schedule: dist.schedule().cli_name(),
        requested_schedule: requested.cli_name(),
        auto: args.auto,
        schedule_source,
        rs_partials: plan.rs_partials.cli_name(),
        tp,
        gpu: gpus[0].name().to_owned(),
        problem,
        dtype: problem.dtype.name(),
        median_ms: timing.median_ms,
        per_rep_max_median_ms: timing.per_rep_max_median_ms,
        min_ms: timing.min_ms,
        max_ms: timing.max_ms,
        tflops_per_gpu: tflops_per_gpu(&problem, tp, timing.median_ms),
        workspace_bytes_per_gpu: (0..tp).map(|r| dist.workspace_bytes(r)).collect(),
        warmup: args.warmup,
        reps: timing.samples_ms.len(),
        timeout_ms: args.timeout_ms,
        samples_ms: timing.samples_ms,
    })
}

/// The text report: the measurement line and the workspace line.
fn render_text(r: &BenchReport) -> String {
    let mut schedule = if r.auto {
        format!(
            "{} (auto within {}, {})",
            r.schedule, r.requested_schedule, r.schedule_source
        )
    } else {
        r.schedule.to_owned()
    };
    if r.rs_partials != "read" {
        schedule.push_str(&format!(" with {} partials", r.rs_partials));
    }
    let workspace = match r.workspace_bytes_per_gpu.as_slice() {
        [first, rest @ ..] if rest.iter().all(|b| b == first) => {
            format!("{first} B ({})", memory::human(*first))
        }
        all => format!(
            "{} B (by rank)",
            all.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!(
        "{schedule} TP={} {} on {}× {}: median {:.3} ms, min {:.3} ms, max {:.3} ms, \
         {:.1} TFLOP/s per GPU ({} reps after {} warm-up; the slowest GPU's median)\n\
         workspace per GPU: {workspace}\n",
        r.tp,
        r.problem,
        r.tp,
        r.gpu,
        r.median_ms,
        r.min_ms,
        r.max_ms,
        r.tflops_per_gpu,
        r.reps,
        r.warmup,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ScheduleKind;

    fn report(auto: bool, workspace: Vec<usize>) -> BenchReport {
        let problem = Problem::new(16384, 57344, 8192);
        BenchReport {
            schedule: ScheduleKind::AllGatherRotatingA.cli_name(),
            requested_schedule: ScheduleKind::AllGatherRotatingA.cli_name(),
            auto,
            schedule_source: "rule".into(),
            rs_partials: "read",
            tp: 2,
            gpu: "NVIDIA H200".into(),
            problem,
            dtype: problem.dtype.name(),
            median_ms: 20.0,
            per_rep_max_median_ms: 20.5,
            min_ms: 19.5,
            max_ms: 21.25,
            tflops_per_gpu: tflops_per_gpu(&problem, 2, 20.0),
            workspace_bytes_per_gpu: workspace,
            warmup: 5,
            reps: 20,
            timeout_ms: 10_000,
            samples_ms: vec![20.0; 20],
        }
    }

    #[test]
    fn tflops_per_gpu_is_two_mnk_over_tp_over_median() {
        // 2·8192³ flop over 2 GPUs in 1.1 ms ≈ 499.7 TFLOP/s per GPU.
        let t = tflops_per_gpu(&Problem::new(8192, 8192, 8192), 2, 1.1);
        assert!((t - 499.7).abs() < 0.1, "{t}");
    }

    #[test]
    fn text_report_is_two_lines() {
        let text = render_text(&report(false, vec![1 << 20, 1 << 20]));
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.starts_with(
                "ag-a TP=2 M=16384 N=57344 K=8192 bf16 on 2× NVIDIA H200: median 20.000 ms, \
                 min 19.500 ms, max 21.250 ms, 384.8 TFLOP/s per GPU (20 reps after 5 warm-up"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("workspace per GPU: 1048576 B (1.0 MiB)\n"),
            "{text}"
        );
        let text = render_text(&report(true, vec![1024, 2048]));
        assert!(
            text.starts_with("ag-a (auto within ag-a, rule) TP=2 "),
            "{text}"
        );
        assert!(
            text.ends_with("workspace per GPU: 1024, 2048 B (by rank)\n"),
            "{text}"
        );
    }

    #[test]
    fn json_report_has_the_measurement_fields() {
        let json = serde_json::to_string(&report(true, vec![64, 64])).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for key in [
            "schedule",
            "requested_schedule",
            "auto",
            "tp",
            "gpu",
            "problem",
            "dtype",
            "median_ms",
            "min_ms",
            "max_ms",
            "tflops_per_gpu",
            "workspace_bytes_per_gpu",
            "warmup",
            "reps",
            "timeout_ms",
            "samples_ms",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(v["problem"]["m"], 16384);
        assert_eq!(v["dtype"], "bf16");
    }
}
