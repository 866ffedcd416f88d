//! The `distgemm` command line: `plan` prints a plan, `run` executes it.
//!
//! Exit status: 0 on success; 2 for bad input (one line on stderr naming the problem: an
//! unknown schedule or preset, TP out of range, indivisible or misaligned shapes, an
//! unavailable backend, a problem above the CPU cap); 1 when a run fails or `--check` finds a
//! mismatch.

mod args;
mod run;

use std::ffi::OsString;
use std::io::Write;

use clap::Parser;
use clap::error::ErrorKind;
use thiserror::Error;

use self::args::{Cli, Command, Format, PlanArgs};
use crate::cpu::ExecError;
use crate::plan::{Plan, PlanError};

/// Why a command failed.
#[derive(Debug, Error)]
pub enum CliError {
    /// Malformed arguments.
    #[error("{0}")]
    Usage(String),
    /// The schedule cannot run the problem.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `--backend cuda` on a machine that cannot run it.
    #[error(
        "CUDA backend unavailable: {0}; use --backend cpu (or auto, which falls back to the CPU)"
    )]
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
