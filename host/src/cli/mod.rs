//! The `distgemm` command line: `plan` prints a plan, `run` executes it, `bench` times it on
//! the GPUs.
//!
//! `distgemm bench` (CUDA backend only) takes the same problem arguments as `run`
//! (`--schedule`, `--tp`, `--m/--n/--k` or `--preset [--tokens]`, `--dtype`) plus `--auto` (the
//! `Auto` rule picks the pipelined or single-stage schedule of `--schedule`'s family),
//! `--warmup N` (default 5), `--reps N` (default 20, 1..=10000), `--timeout-ms` (default
//! 10000) and `--json`. It fills per-device shards on the GPUs (`fill_normal`; D poisoned
//! once), builds one `DistGemm`, times `run()` per repetition with CUDA events on every GPU
//! ([`crate::timing::time_on_streams`]: the slowest GPU's median repetition), then
//! `wait()`s, which turns a timed-out GPU wait into an error. It reports the schedule that
//! ran, TP, problem, median/min/max ms, TFLOP/s per GPU (2·M·N·K / TP / median) and the
//! workspace bytes per GPU: two text lines, or one JSON object with `--json`.
//!
//! Exit status: 0 on success; 2 for bad input (one line on stderr naming the problem: an
//! unknown schedule or preset, TP out of range, indivisible or misaligned shapes, an
//! unavailable backend — for `bench`, no TP Hopper GPUs with peer access —, a problem above the
//! CPU cap, repetition counts out of range); 1 when a run fails or `--check` finds a mismatch.

mod args;
mod bench;
mod run;

use std::ffi::OsString;
use std::io::Write;

use clap::Parser;
use clap::error::ErrorKind;
use thiserror::Error;

use self::args::{Cli, Command, Format, PlanArgs};
use crate::cpu::ExecError;
use crate::plan::{Plan, PlanError};
use crate::runtime::{Gpu, hopper_gpus};

/// Why a command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// Malformed arguments.
    #[error("{0}")]
    Usage(String),
    /// The schedule cannot run the problem.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `run --backend cuda` or `bench` on a machine that cannot run the CUDA backend (the
    /// reason and what to do instead).
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(String),
    /// A driver call failed.
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// The CUDA run failed (timeout, driver error).
    #[error(transparent)]
    Cuda(#[from] crate::cuda::DistGemmError),
    /// The problem is too large for the CPU executor.
    #[error("{0}")]
    TooLargeForCpu(String),
    /// The CPU run failed (deadlock, panic).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// `--check` found elements outside the bound.
    #[error(
        "check failed: {mismatches} of {elements} elements outside the bound; worst at (row {row}, col {col}) is {ratio:.3e}× the bound"
    )]
    CheckFailed {
        /// Elements outside the bound.
        mismatches: usize,
        /// Elements compared.
        elements: usize,
        /// Row of the worst element.
        row: usize,
        /// Column of the worst element.
        col: usize,
        /// Its error / bound.
        ratio: f64,
    },
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
    /// Timing the runs failed (a driver error while recording or reading events).
    #[error("timing failed: {0}")]
    Timing(#[from] crate::timing::TimingError),
    /// Serialising JSON failed.
    #[error("cannot serialise JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl CliError {
    /// The process exit status for this error.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_)
            | CliError::Plan(PlanError::Schedule(_))
            | CliError::CudaUnavailable(_)
            | CliError::TooLargeForCpu(_) => 2,
            _ => 1,
        }
    }
}

/// Runs the command line `args` (including the program name), writing results to `out` and
/// one-line errors and notices to `err`; returns the exit status.
pub fn main_with<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = write!(out, "{e}");
                    0
                }
                _ => {
                    let _ = writeln!(err, "{}", one_line(&e));
                    2
                }
            };
        }
    };
    let result = match cli.command {
        Command::Plan(args) => plan(&args, out),
        Command::Run(args) => run::run(&args, out, err),
        Command::Bench(args) => bench::bench(&args, out),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            e.exit_code()
        }
    }
}

/// Clap's multi-line error as one line: its first line plus the indented lines right below it
/// (the missing arguments, or the possible values).
fn one_line(e: &clap::Error) -> String {
    let rendered = e.to_string();
    let mut lines = rendered.lines();
    let mut line = lines
        .next()
        .unwrap_or("error: invalid arguments")
        .trim()
        .to_string();
    for detail in lines.take_while(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty()) {
        line.push(' ');
        line.push_str(detail.trim());
    }
    line
}

/// The first `tp` GPUs if they are Hopper GPUs with peer access between every pair, else why
/// not (one line). Used by `run --backend cuda|auto` and `bench`.
fn cuda_devices(tp: usize) -> Result<Vec<Gpu>, String> {
    let gpus = hopper_gpus().map_err(|e| e.to_string())?;
    if gpus.len() < tp {
        return Err(format!(
            "TP={tp} needs {tp} Hopper GPUs, this machine has {}",
            gpus.len()
        ));
    }
    let gpus: Vec<Gpu> = gpus.into_iter().take(tp).collect();
    for a in &gpus {
        for b in &gpus {
            if !a.can_access_peer(b).map_err(|e| e.to_string())? {
                return Err(format!(
                    "GPU {} cannot access GPU {} (no peer access)",
                    a.ordinal(),
                    b.ordinal()
                ));
            }
        }
    }
    Ok(gpus)
}

fn plan(args: &PlanArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let plan = Plan::build(
        args.problem.schedule,
        args.problem.problem()?,
        args.problem.tp,
    )?;
    match args.format {
        Format::Table => write!(out, "{}", plan.render_table())?,
        Format::Json => writeln!(out, "{}", plan.to_json()?)?,
        Format::Dot => write!(out, "{}", plan.render_dot())?,
    }
    Ok(())
}
