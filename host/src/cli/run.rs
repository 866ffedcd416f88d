//! `distgemm run`: random inputs, the CPU executor or the CUDA backend (`DistGemm`), timing
//! and the optional check.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::args::{Backend, MAX_RUN_ITERS, RunArgs};
use super::memory::{self, Executor};
use super::{CliError, check_ptx_file, cuda_devices};
use crate::cpu::CpuExecutor;
use crate::cuda::{DeviceArgs, DistGemm, Fp8RowScales};
use crate::dtype::{Dtype, Element};
use crate::plan::{Fp8Inputs, GlobalInputs, Plan, SizeError};
use crate::problem::Problem;
use crate::reference::gpu::{ReferenceOperand, packed_products};
use crate::reference::{
    CheckInputs, CheckReport, Products, ScaledCheckInputs, check, check_products, check_scaled,
    check_scaled_products,
};
use crate::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module};
use crate::schedule::{BufferKind, can_implement};

/// The CPU executor's cap on `2·M·N·K` per iteration (≈4.3 GFLOP: seconds, not hours, on a
/// laptop; the presets are ~10^4 times larger).
pub const CPU_FLOP_CAP: f64 = 4_294_967_296.0;

/// Where `--check` computed each element's f64 sums; it compares every element of D either
/// way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum ReferenceOn {
    /// The host's f64 loop (the CPU executor's runs, under [`CPU_FLOP_CAP`]).
    Cpu,
    /// The reference kernel on the first GPU of the run ([`packed_products`]), after the run.
    Gpu,
}

/// What `run --format json` prints.
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
    check_reference: Option<ReferenceOn>,
}

pub(super) fn run(
    args: &RunArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    check_counts(args)?;
    let plan = args.problem.plan(problem)?;
    if let Ok(spec) = std::env::var(super::ranks::RANK_ENV) {
        return super::ranks::rank_main(args, &spec, out);
    }
    if let Some(ranks) = args.ranks {
        if args.backend == Backend::Cpu {
            return Err(CliError::Usage(
                "--ranks runs one process per GPU (the CUDA backend); drop --backend cpu".into(),
            ));
        }
        check_ptx_file()?;
        return super::ranks::launch(args, ranks, out);
    }
    // With `auto`, why the GPUs are not used: a notice before a CPU run, or part of the one
    // error line when the CPU cannot run the problem either.
    let (gpus, no_gpus) = match args.backend {
        Backend::Cpu => (None, None),
        Backend::Cuda => {
            // Everything that needs no GPU first: the PTX file, then the host memory.
            check_ptx_file()?;
            check_host_memory(&plan, Executor::Cuda, args.check)?;
            let gpus = cuda_devices(plan.tp).map_err(|reason| {
                CliError::CudaUnavailable(format!(
                    "{reason}; use --backend cpu (or auto, which falls back to the CPU)"
                ))
            })?;
            (Some(gpus), None)
        }
        Backend::Auto => match cuda_devices(plan.tp) {
            Ok(gpus) => {
                check_ptx_file()?;
                check_host_memory(&plan, Executor::Cuda, args.check)?;
                (Some(gpus), None)
            }
            Err(reason) => (None, Some(reason)),
        },
    };
    if let Some(gpus) = gpus {
        memory::check_devices(&plan, &gpus)?;
        return match (problem.fp8, problem.dtype) {
            (Some(_), Dtype::Bf16) => run_cuda_fp8::<half::bf16>(args, plan, gpus, out),
            (Some(_), Dtype::F16) => run_cuda_fp8::<half::f16>(args, plan, gpus, out),
            (None, Dtype::Bf16) => run_cuda::<half::bf16>(args, plan, gpus, out),
            (None, Dtype::F16) => run_cuda::<half::f16>(args, plan, gpus, out),
        };
    }
    if problem.flops() > CPU_FLOP_CAP {
        let why = too_large(args, &problem);
        return Err(CliError::TooLarge(match no_gpus {
            Some(reason) => format!("{why} (the CUDA backend is unavailable: {reason})"),
            None => why,
        }));
    }
    check_host_memory(&plan, Executor::Cpu, args.check)?;
    if let Some(reason) = no_gpus {
        writeln!(
            err,
            "notice: {reason}; running on the CPU executor (cap: 2·M·N·K ≤ {CPU_FLOP_CAP:.3e} flop)"
        )?;
    }
    match (problem.fp8, problem.dtype) {
        (Some(_), Dtype::Bf16) => run_fp8::<half::bf16>(args, plan, out),
        (Some(_), Dtype::F16) => run_fp8::<half::f16>(args, plan, out),
        (None, Dtype::Bf16) => run_typed::<half::bf16>(args, plan, out),
        (None, Dtype::F16) => run_typed::<half::f16>(args, plan, out),
    }
}

/// `--iters` and `--timeout-ms` within their ranges.
fn check_counts(args: &RunArgs) -> Result<(), CliError> {
    if !(1..=MAX_RUN_ITERS).contains(&args.iters) {
        return Err(CliError::Usage(format!(
            "--iters must be between 1 and {MAX_RUN_ITERS}, got {}",
            args.iters
        )));
    }
    if args.timeout_ms == 0 {
        return Err(CliError::Usage(
            "--timeout-ms must be at least 1 (it bounds every wait; 0 would fail every run \
             that waits at all)"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses (bad input, with the numbers) when the run would not fit this machine's memory.
fn check_host_memory(plan: &Plan, executor: Executor, check: bool) -> Result<(), CliError> {
    let what = match executor {
        Executor::Cpu => format!("{} on the CPU executor", plan.problem),
        Executor::Cuda => format!("{} (inputs generated on the host)", plan.problem),
    };
    memory::check_host(memory::host_bytes(plan, executor, check), &what)
}

/// Why the problem does not fit the CPU executor, and a smaller problem that does.
fn too_large(args: &RunArgs, problem: &Problem) -> String {
    let head = format!(
        "{problem} needs {} flop per iteration, above the CPU executor's cap of {}",
        flop_count(problem.flops()),
        flop_count(CPU_FLOP_CAP)
    );
    match args.problem.preset {
        Some(preset) => match largest_cpu_tokens(args, problem) {
            Some(tokens) => format!("{head}: pass --tokens {tokens} or fewer for {preset}"),
            None => format!(
                "{head}: no --tokens count of {preset} fits the CPU at TP={}; use a GPU backend",
                args.problem.tp
            ),
        },
        None => format!("{head}: use smaller --m/--n/--k"),
    }
}

/// A flop count that tells a count just above the cap from the cap: exact below 10^15,
/// scientific above.
fn flop_count(flops: f64) -> String {
    if flops < 1e15 {
        format!("{flops:.0}")
    } else {
        format!("{flops:.3e}")
    }
}

/// The largest token count (M) of the preset that is under the CPU cap and that the schedule
/// accepts at this TP (divisibility and alignment), if any.
fn largest_cpu_tokens(args: &RunArgs, problem: &Problem) -> Option<usize> {
    let per_token = 2.0 * problem.n as f64 * problem.k as f64;
    let max = (CPU_FLOP_CAP / per_token).floor();
    if max < 1.0 {
        return None;
    }
    // Below 2^31 by the cap (N, K ≥ 1), and the schedule constraints on M are divisibility
    // by TP, so the search stops within TP steps when any count works.
    (1..=max as usize).rev().take(64).find(|&tokens| {
        let candidate = Problem {
            m: tokens,
            ..*problem
        };
        can_implement(args.problem.schedule, &candidate, args.problem.tp).is_ok()
    })
}

/// Distinct input sets a checked multi-iteration CPU run cycles through (bounded memory).
const CHECKED_INPUT_SETS: usize = 4;

fn run_typed<T: Element + ReferenceOperand>(
    args: &RunArgs,
    plan: Plan,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if args.check && args.iters > 1 {
        return run_typed_checked_sequence::<T>(args, plan, out);
    }
    let problem = plan.problem;
    let inputs = GlobalInputs::<T>::random(&problem, args.seed);
    let shards = plan.shard_inputs(&inputs)?;
    let mut exec = CpuExecutor::new(plan)?.with_timeout(Duration::from_millis(args.timeout_ms));
    exec.load_inputs(&shards)?;
    exec.poison();

    let bar = if args.report.json() || args.iters < 2 {
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
    let d = exec.gathered_output()?;
    report(args, exec.plan(), None, &inputs, &d, seconds_per_iter, out)
}

/// `run --backend cpu --dtype e4m3`: random FP8 inputs ([`Fp8Inputs::random`]) sharded with
/// their scales, `iters` runs on the CPU executor, D checked with [`check_scaled`] (every
/// element under the CPU cap). Every run reads the same inputs: the executor's run sequence
/// with new inputs per run is bf16/f16 only so far.
fn run_fp8<T: Element>(args: &RunArgs, plan: Plan, out: &mut dyn Write) -> Result<(), CliError> {
    let problem = plan.problem;
    let inputs = Fp8Inputs::<T>::random(&problem, args.seed);
    let shards = plan.shard_fp8_inputs(&inputs)?;
    let mut exec = CpuExecutor::new(plan)?.with_timeout(Duration::from_millis(args.timeout_ms));
    exec.load_fp8_inputs(&shards)?;
    exec.poison();
    let start = Instant::now();
    exec.run(args.iters)?;
    let seconds_per_iter = start.elapsed().as_secs_f64() / args.iters as f64;
    let d = exec.gathered_output()?;
    let checked = check_fp8(args, exec.plan(), &inputs, &d, None)?;
    print_report(args, exec.plan(), "cpu", checked, seconds_per_iter, out)
}

/// `--check` of an FP8 run's gathered D against `reference::check_scaled`, every element;
/// the f64 sums on `gpu` where given (see [`checked`]).
fn check_fp8<T: Element>(
    args: &RunArgs,
    plan: &Plan,
    inputs: &Fp8Inputs<T>,
    d: &[T],
    gpu: Option<&Arc<Module>>,
) -> Result<Option<(CheckReport, ReferenceOn)>, CliError> {
    let check_inputs = ScaledCheckInputs {
        a: &inputs.a,
        b: &inputs.b,
        scales: &inputs.scales,
        c: inputs.c.as_deref(),
    };
    let c = inputs.c.as_deref();
    checked(
        args,
        plan,
        gpu.map(|module| (module, &inputs.a[..], &inputs.b[..])),
        |p, roundings, tp| check_scaled(p, roundings, tp, check_inputs, d),
        |p, roundings, tp, products| {
            check_scaled_products(p, roundings, tp, products, &inputs.scales, c, d)
        },
    )
}

/// `--check` of a run's gathered D (nothing without `--check`): every element, against f64
/// sums computed on the GPU of `gpu`'s module from its A and B (the CUDA backend's runs, at
/// any size; `given` compares D with them), or on the CPU by `host` (the CPU executor's runs).
/// Each closure gets the problem, the schedule's output roundings and TP.
#[allow(clippy::type_complexity)]
fn checked<O: ReferenceOperand>(
    args: &RunArgs,
    plan: &Plan,
    gpu: Option<(&Arc<Module>, &[O], &[O])>,
    host: impl FnOnce(&Problem, usize, usize) -> Result<CheckReport, SizeError>,
    given: impl FnOnce(&Problem, usize, usize, &Products) -> Result<CheckReport, SizeError>,
) -> Result<Option<(CheckReport, ReferenceOn)>, CliError> {
    if !args.check {
        return Ok(None);
    }
    let p = plan.problem;
    let roundings = plan.schedule.roundings(plan.tp);
    Ok(Some(match gpu {
        None => (host(&p, roundings, plan.tp)?, ReferenceOn::Cpu),
        Some((module, a, b)) => {
            let products = packed_products(module, a, b, (p.m, p.n, p.k))?;
            (given(&p, roundings, plan.tp, &products)?, ReferenceOn::Gpu)
        }
    }))
}

/// `run --backend cpu --iters N --check`: every run gets new inputs (seeds `seed`, `seed + 1`,
/// … cycling through [`CHECKED_INPUT_SETS`] sets), loaded by each device right after its own
/// previous run as a model's next call would ([`CpuExecutor::run_sequence`]), with D poisoned
/// before each run; every run's D is checked in full (CPU runs are under the CPU cap), so a
/// run that read a stale flag, slot or input shows up. The report is the last run's.
fn run_typed_checked_sequence<T: Element + ReferenceOperand>(
    args: &RunArgs,
    plan: Plan,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = plan.problem;
    let sets = args.iters.min(CHECKED_INPUT_SETS);
    let mut inputs = Vec::with_capacity(sets);
    let mut shards = Vec::with_capacity(sets);
    for i in 0..sets {
        let global = GlobalInputs::<T>::random(&problem, args.seed.wrapping_add(i as u64));
        shards.push(plan.shard_inputs(&global)?);
        inputs.push(global);
    }
    let exec = CpuExecutor::new(plan)?.with_timeout(Duration::from_millis(args.timeout_ms));
    let roundings = exec.plan().schedule.roundings(exec.plan().tp);
    let start = Instant::now();
    let mut last = None;
    let mut done = 0;
    while done < args.iters {
        let runs = (args.iters - done).min(sets);
        let outputs = exec.run_sequence(&shards[..runs])?;
        for (i, output) in outputs.iter().enumerate() {
            let d = exec.plan().gather_output(output)?;
            let set = &inputs[i];
            let report = check(
                &problem,
                roundings,
                exec.plan().tp,
                CheckInputs {
                    a: &set.a,
                    b: &set.b,
                    c: set.c.as_deref(),
                },
                &d,
            )?;
            if !report.passed() {
                return Err(check_failed(&report, problem.n));
            }
            last = Some((i, d));
        }
        done += runs;
    }
    let seconds_per_iter = start.elapsed().as_secs_f64() / args.iters as f64;
    let (set, d) = last.ok_or_else(|| CliError::Usage("--iters must be at least 1".into()))?;
    report(
        args,
        exec.plan(),
        None,
        &inputs[set],
        &d,
        seconds_per_iter,
        out,
    )
}

/// `run` on the GPUs: shards uploaded from host-generated inputs, one `DistGemm`, `iters`
/// runs queued back to back, timed from the first launch to the end of the last.
fn run_cuda<T: Element + ReferenceOperand>(
    args: &RunArgs,
    plan: Plan,
    gpus: Vec<Gpu>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    // The kernels first: a PTX that the driver rejects is bad input, reported before the
    // inputs are generated and uploaded.
    let modules = load_modules(&gpus)?;
    let reference = first_module(&modules)?;
    let inputs = GlobalInputs::<T>::random(&plan.problem, args.seed);
    let shards = host_shards(&plan, &inputs)?;
    let (seconds_per_iter, d) = timed_runs(args, &plan, gpus, modules, shards, None)?;
    report(
        args,
        &plan,
        Some(&reference),
        &inputs,
        &d,
        seconds_per_iter,
        out,
    )
}

/// `run --backend cuda --dtype e4m3`: random FP8 inputs ([`Fp8Inputs::random`]) sharded,
/// uploaded (A and B as e4m3 bytes; row-wise, every device gets the full scale vectors), run
/// `--iters` times, D gathered and checked against `reference::check_scaled`.
fn run_cuda_fp8<T: Element + DeviceCopy>(
    args: &RunArgs,
    plan: Plan,
    gpus: Vec<Gpu>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let modules = load_modules(&gpus)?;
    let reference = first_module(&modules)?;
    let inputs = Fp8Inputs::<T>::random(&plan.problem, args.seed);
    let shards = fp8_host_shards(&plan, &inputs)?;
    let scales = Some(&inputs.scales);
    let (seconds_per_iter, d) = timed_runs(args, &plan, gpus, modules, shards, scales)?;
    let checked = check_fp8(args, &plan, &inputs, &d, Some(&reference))?;
    print_report(args, &plan, "cuda", checked, seconds_per_iter, out)
}

/// Every device's host operands of `inputs`.
pub(super) fn host_shards<T: Element>(
    plan: &Plan,
    inputs: &GlobalInputs<T>,
) -> Result<Vec<HostShard<T, T>>, CliError> {
    Ok(plan
        .shard_inputs(inputs)?
        .into_iter()
        .map(|s| (s.a, s.b, s.c))
        .collect())
}

/// Every device's host operands of FP8 `inputs` (A and B as e4m3 bytes).
pub(super) fn fp8_host_shards<T: Element>(
    plan: &Plan,
    inputs: &Fp8Inputs<T>,
) -> Result<Vec<HostShard<u8, T>>, CliError> {
    Ok(plan
        .shard_fp8_inputs(inputs)?
        .into_iter()
        .map(|s| (e4m3_bytes(&s.a), e4m3_bytes(&s.b), s.c))
        .collect())
}

/// The module of every GPU.
pub(super) fn load_modules(gpus: &[Gpu]) -> Result<Vec<std::sync::Arc<Module>>, CliError> {
    Ok(gpus
        .iter()
        .map(Module::load)
        .collect::<Result<Vec<_>, _>>()?)
}

/// The first GPU's module, which `--check` computes its reference on after the runs.
fn first_module(modules: &[Arc<Module>]) -> Result<Arc<Module>, CliError> {
    modules
        .first()
        .cloned()
        .ok_or_else(|| CliError::Usage("the run has no GPU".into()))
}

/// One device's host operands: A and B (`O`: the element type, or e4m3 bytes), C if any.
pub(super) type HostShard<O, T> = (Vec<O>, Vec<O>, Option<Vec<T>>);

/// `run`'s use of the GPUs (`modules` loaded first): [`with_dist`] bounded by
/// `--timeout-ms`, then `--iters` runs queued back to back; returns the seconds per run (from
/// the first launch to the end of the last) and the gathered D.
fn timed_runs<O: DeviceCopy, T: Element + DeviceCopy>(
    args: &RunArgs,
    plan: &Plan,
    gpus: Vec<Gpu>,
    modules: Vec<std::sync::Arc<Module>>,
    shards: Vec<HostShard<O, T>>,
    scales: Option<&crate::fp8::Scales>,
) -> Result<(f64, Vec<T>), CliError> {
    let timeout = Duration::from_millis(args.timeout_ms);
    with_dist(timeout, plan, gpus, modules, shards, scales, |dist| {
        let start = Instant::now();
        for _ in 0..args.iters {
            dist.run()?;
        }
        dist.wait()?;
        Ok(start.elapsed().as_secs_f64() / args.iters as f64)
    })
}

/// Uploads every device's `shards` (and an FP8 problem's row-wise scale vectors), builds the
/// plan's schedule on them (tensor-wise scales given to the builder, every GPU wait bounded
/// by `timeout`), hands it to `drive` and returns what `drive` returned with the gathered D.
pub(super) fn with_dist<O: DeviceCopy, T: Element + DeviceCopy, R>(
    timeout: Duration,
    plan: &Plan,
    gpus: Vec<Gpu>,
    modules: Vec<std::sync::Arc<Module>>,
    shards: Vec<HostShard<O, T>>,
    scales: Option<&crate::fp8::Scales>,
    drive: impl FnOnce(&mut DistGemm<'_>) -> Result<R, CliError>,
) -> Result<(R, Vec<T>), CliError> {
    let mut buffers = Vec::with_capacity(plan.tp);
    for (((a, b, c), gpu), dev) in shards.iter().zip(&gpus).zip(&plan.devices) {
        let stream = gpu.new_stream()?;
        let d_elements = dev.buffer_elements(BufferKind::D);
        let uploaded = upload_shard(gpu, &stream, (a, b, c.as_deref()), d_elements)?;
        let row_scales = upload_row_scales(gpu, &stream, scales)?;
        crate::runtime::stream::synchronize(&stream)?;
        buffers.push((uploaded, row_scales, stream));
    }
    let device_args = buffers
        .iter()
        .map(|((a, b, c, d), rows, _)| DeviceArgs {
            a: a.into(),
            b: b.into(),
            c: c.as_ref().map(Into::into),
            d: d.into(),
            row_scales: rows.as_ref().map(|(sa, sb)| Fp8RowScales {
                a: sa.into(),
                b: sb.into(),
            }),
        })
        .collect();
    let mut builder = DistGemm::builder()
        .devices(gpus)
        .schedule(plan.schedule)
        .rs_partials(plan.rs_partials)
        .problem(plan.problem)
        .timeout(timeout)
        .modules(modules)
        .args(device_args);
    if let Some(&crate::fp8::Scales::Tensorwise { a, b }) = scales {
        builder = builder.fp8_scales(a, b);
    }
    let mut dist = builder.build()?;
    let outcome = drive(&mut dist)?;
    drop(dist);
    let mut outputs = Vec::with_capacity(buffers.len());
    for ((_, _, _, d), _, stream) in &buffers {
        outputs.push(d.download(stream)?);
    }
    Ok((outcome, plan.gather_output(&outputs)?))
}

/// The bytes of e4m3 codes, as the GPU reads them.
pub(super) fn e4m3_bytes(codes: &[crate::fp8::E4m3]) -> Vec<u8> {
    codes.iter().map(|x| x.to_bits()).collect()
}

/// Row-wise FP8's full scale vectors on one GPU: A's M f32 and B's N f32.
pub(super) type ScaleVectors = (DeviceBuffer<f32>, DeviceBuffer<f32>);

/// Row-wise FP8's full scale vectors on `gpu`, ordered on `stream`; `None` for any other run.
pub(super) fn upload_row_scales(
    gpu: &Gpu,
    stream: &CudaStream,
    scales: Option<&crate::fp8::Scales>,
) -> Result<Option<ScaleVectors>, CliError> {
    match scales {
        Some(crate::fp8::Scales::Rowwise { a, b }) => Ok(Some((
            DeviceBuffer::from_host(gpu, stream, a)?,
            DeviceBuffer::from_host(gpu, stream, b)?,
        ))),
        _ => Ok(None),
    }
}

/// Prints the run's summary (and check) and turns a failed check into an error: a CUDA run
/// (`gpu`, the module of its first GPU) has its f64 reference computed there, a CPU run on
/// the CPU (see [`checked`]).
fn report<T: Element + ReferenceOperand>(
    args: &RunArgs,
    plan: &Plan,
    gpu: Option<&Arc<Module>>,
    inputs: &GlobalInputs<T>,
    d: &[T],
    seconds_per_iter: f64,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let check_inputs = CheckInputs {
        a: &inputs.a,
        b: &inputs.b,
        c: inputs.c.as_deref(),
    };
    let c = inputs.c.as_deref();
    let checked = checked(
        args,
        plan,
        gpu.map(|module| (module, &inputs.a[..], &inputs.b[..])),
        |p, roundings, tp| check(p, roundings, tp, check_inputs, d),
        |p, roundings, tp, products| check_products(p, roundings, tp, products, c, d),
    )?;
    let backend = if gpu.is_some() { "cuda" } else { "cpu" };
    print_report(args, plan, backend, checked, seconds_per_iter, out)
}

/// Prints the run's summary and its check (the bound's magnitude term names the scales of
/// an FP8 problem), and turns a failed check into an error.
fn print_report(
    args: &RunArgs,
    plan: &Plan,
    backend: &'static str,
    checked: Option<(CheckReport, ReferenceOn)>,
    seconds_per_iter: f64,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let problem = plan.problem;
    let summary = RunReport {
        schedule: plan.schedule.cli_name(),
        tp: plan.tp,
        problem: &problem,
        backend,
        iters: args.iters,
        seconds_per_iter,
        gflops: problem.flops() / seconds_per_iter / 1e9,
        check: checked.map(|(r, _)| r),
        check_reference: checked.map(|(_, on)| on),
    };
    if args.report.json() {
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
        if let Some((r, on)) = &checked {
            let compared = match on {
                ReferenceOn::Cpu => format!("{} elements", r.elements),
                ReferenceOn::Gpu => format!("{} elements (f64 reference on the GPU)", r.elements),
            };
            let scale = match problem.fp8 {
                Some(_) => "|alpha·sa_i·sb_j|",
                None => "|alpha|",
            };
            writeln!(
                out,
                "check: {} — {compared}, |D − D_ref| ≤ {:.3e}·({scale}·Σ|a·b| + |beta·c|) + {:.1e}; worst {:.3} of the bound, max abs error {:.3e}",
                if r.passed() { "passed" } else { "FAILED" },
                r.bound.relative,
                r.bound.absolute,
                r.worst_ratio,
                r.max_abs_error
            )?;
        }
    }
    match checked {
        Some((r, _)) if !r.passed() => Err(check_failed(&r, problem.n)),
        _ => Ok(()),
    }
}

/// The error of a failed check of a D with `n` columns.
pub(super) fn check_failed(r: &CheckReport, n: usize) -> CliError {
    CliError::CheckFailed {
        mismatches: r.mismatches,
        elements: r.elements,
        row: r.worst_index / n,
        col: r.worst_index % n,
        ratio: r.worst_ratio,
    }
}

/// A device's shard buffers: A and B (`O`: the element type, or e4m3 bytes), optional C, D.
pub(super) type ShardBuffers<O, T> = (
    DeviceBuffer<O>,
    DeviceBuffer<O>,
    Option<DeviceBuffer<T>>,
    DeviceBuffer<T>,
);

/// A device's shard buffers on `gpu`: A, B and C uploaded from `(a, b, c)`, D of
/// `d_elements` poisoned with NaN (0xFF bytes), all ordered on `stream`.
pub(super) fn upload_shard<O: DeviceCopy, T: Element + DeviceCopy>(
    gpu: &Gpu,
    stream: &CudaStream,
    (a, b, c): (&[O], &[O], Option<&[T]>),
    d_elements: usize,
) -> Result<ShardBuffers<O, T>, CliError> {
    let a = DeviceBuffer::from_host(gpu, stream, a)?;
    let b = DeviceBuffer::from_host(gpu, stream, b)?;
    let c = match c {
        Some(c) => Some(DeviceBuffer::from_host(gpu, stream, c)?),
        None => None,
    };
    let mut d = DeviceBuffer::<T>::alloc(gpu, d_elements)?;
    d.fill_bytes(stream, 0xFF)?;
    Ok((a, b, c, d))
}
