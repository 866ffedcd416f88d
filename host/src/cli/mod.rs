//! The `distgemm` command line: `plan` prints a plan, `run` executes it, `bench` times it on
//! the GPUs, `trace` records a timeline of it (see [`crate::trace`]), `tune` measures which
//! schedule of a family is faster and records it in a tuning table
//! ([`crate::cuda::tuning`]) that `Auto` reads (`plan --auto` shows what it decides).
//!
//! `distgemm bench` (CUDA backend only) takes the same problem arguments as `run`
//! (`--schedule`, `--tp`, `--m/--n/--k` or `--preset [--tokens]`, `--dtype`) plus `--auto` (the
//! `Auto` rule picks the pipelined or single-stage schedule of `--schedule`'s family),
//! `--warmup N` (default 5), `--reps N` (default 20, 1..=10000), `--timeout-ms` (default
//! 10000) and `--format text|json` (`--json` is short for `--format json`; `run` takes the
//! same, `plan` takes `table` (alias `text`), `json` or `dot`). It fills per-device shards on the GPUs (`fill_normal`; D poisoned
//! once), builds one `DistGemm`, times `run()` per repetition with CUDA events on every GPU
//! ([`crate::timing::time_on_streams`]: the slowest GPU's median repetition), then
//! `wait()`s, which turns a timed-out GPU wait into an error. It reports the schedule that
//! ran, TP, problem, median/min/max ms, TFLOP/s per GPU (2·M·N·K / TP / median) and the
//! workspace bytes per GPU: two text lines, or one JSON object.
//!
//! Exit status ([`EXIT_RUN_FAILED`] and the other constants; `--help` lists them too): 0 on
//! success; 1 when a run fails (a driver error, a timed-out wait, a CPU executor failure);
//! 2 for bad input, always one line on stderr naming the problem (arguments, a problem the
//! schedule cannot run, a problem too large for the CPU executor or for this machine's memory,
//! an unavailable CUDA backend or an unusable `DISTGEMM_PTX` file); 3 when `--check` finds a
//! mismatch. Bare `distgemm` prints the usage with the subcommands (exit 2). A closed output
//! pipe (`distgemm plan … | head`) ends the output quietly: the rest is discarded and the exit
//! status is what it would have been.

mod args;
mod bench;
mod cupti;
mod memory;
mod ranks;
mod run;
mod trace;
mod tune;

use std::ffi::OsString;
use std::io::Write;

use clap::Parser;
use clap::error::ErrorKind;
use thiserror::Error;

use self::args::{Cli, Command, Format, PlanArgs};
use crate::cpu::ExecError;
use crate::cuda::{ASSUMED_GPU_NAME, DistGemm, DistGemmError, Resolution, ScheduleSource};
use crate::plan::{Plan, PlanError, PlanOptions, RsPartials, SizeError};
use crate::runtime::module::{PTX_ENV_VAR, PtxSource, read_ptx};
use crate::runtime::{Gpu, RuntimeError, hopper_gpus};
use crate::schedule::ScheduleKind;

/// Exit status of a successful command.
pub const EXIT_OK: u8 = 0;
/// Exit status of a run that failed (driver error, timed-out wait, CPU executor failure).
pub const EXIT_RUN_FAILED: u8 = 1;
/// Exit status of bad input (one line on stderr says what).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status of a `--check` that found elements outside the bound.
pub const EXIT_CHECK_FAILED: u8 = 3;

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
    /// The problem is too large for the CPU executor, or for this machine's memory.
    #[error("{0}")]
    TooLarge(String),
    /// Shards or outputs of the wrong size (a bug: the CLI sizes them from the plan).
    #[error(transparent)]
    Size(#[from] SizeError),
    /// The CPU run failed (deadlock, panic).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The GPU trace's records do not fit the plan (a record missing or extra).
    #[error("trace: {0}")]
    Trace(#[from] crate::trace::TraceError),
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
    /// The rank processes of `run --ranks` could not be started, met or waited for.
    #[error("rank processes: {0}")]
    RankProcesses(String),
    /// A rank process of `run --ranks` failed (it printed why); `code` is its exit status.
    #[error("{message}")]
    RankFailed {
        /// The worst exit status of the ranks.
        code: u8,
        /// Which ranks failed.
        message: String,
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
    /// `--check`'s f64 reference could not be computed on the GPU.
    #[error("--check's reference on the GPU: {0}")]
    Reference(#[from] crate::reference::gpu::GpuReferenceError),
    /// A tuning table (`DISTGEMM_TUNING`, or `tune --out`) is unusable.
    #[error(transparent)]
    Tuning(#[from] crate::cuda::TuningError),
}

impl CliError {
    /// The process exit status for this error (module documentation).
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_)
            | CliError::Plan(PlanError::Schedule(_))
            | CliError::CudaUnavailable(_)
            | CliError::Tuning(_)
            | CliError::Cuda(crate::cuda::DistGemmError::Tuning(_))
            | CliError::TooLarge(_) => EXIT_BAD_INPUT,
            CliError::Runtime(e) | CliError::Cuda(crate::cuda::DistGemmError::Runtime(e))
                if is_ptx_error(e) =>
            {
                EXIT_BAD_INPUT
            }
            CliError::CheckFailed { .. } => EXIT_CHECK_FAILED,
            CliError::RankFailed { code, .. } => *code,
            _ => EXIT_RUN_FAILED,
        }
    }
}

/// Whether `e` is about the PTX the user chose (`DISTGEMM_PTX`): bad input, not a failed run.
fn is_ptx_error(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::PtxMissing
            | RuntimeError::PtxUnreadable { .. }
            | RuntimeError::PtxMalformed { .. }
            | RuntimeError::PtxRejected { .. }
    )
}

/// An output that a closed pipe turns into a sink: `distgemm plan … | head` must end quietly
/// with the command's own exit status, not with an error about the reader having left.
struct ClosedPipeIsQuiet<'a> {
    inner: &'a mut dyn Write,
    closed: bool,
}

impl Write for ClosedPipeIsQuiet<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
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
    let mut out = ClosedPipeIsQuiet {
        inner: out,
        closed: false,
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = write!(out, "{e}");
                    EXIT_OK
                }
                // Bare `distgemm`: the usage with the subcommands, as an error.
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = write!(err, "{e}");
                    EXIT_BAD_INPUT
                }
                _ => {
                    let _ = writeln!(err, "{}", one_line(&e));
                    EXIT_BAD_INPUT
                }
            };
        }
    };
    if let Some(note) = cli.command.problem().rs_partials_note() {
        let _ = writeln!(err, "note: {note}");
    }
    let result = match cli.command {
        Command::Plan(args) => plan(&args, &mut out, err),
        Command::Run(args) => run::run(&args, &mut out, err),
        Command::Bench(args) => bench::bench(&args, &mut out),
        Command::Trace(args) => trace::trace(&args, &mut out),
        Command::Tune(args) => tune::tune(&args, &mut out),
    }
    .and_then(|()| Ok(out.flush()?));
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let _ = writeln!(err, "error: {}", single_line(&e.to_string()));
            e.exit_code()
        }
    }
}

/// A message on one line: its lines joined with " | " (a JIT log, for example, has many).
fn single_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
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

/// Reads the PTX file `DISTGEMM_PTX` names, if it is set, so that an unusable file (not a
/// regular file, too large, empty, not text) is bad input on every machine, found before the
/// GPUs are probed or any input is generated. The embedded PTX needs no check.
fn check_ptx_file() -> Result<(), CliError> {
    if let Some(path) = std::env::var_os(PTX_ENV_VAR).filter(|v| !v.is_empty()) {
        read_ptx(PtxSource::File(path.into()))?;
    }
    Ok(())
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

fn plan(args: &PlanArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    let (schedule, options) = if args.auto {
        let resolution = DistGemm::builder()
            .tp(args.problem.tp)
            .auto_schedule(args.problem.schedule)
            .problem(problem)
            .resolution()
            .map_err(|e| match e {
                DistGemmError::Tuning(e) => CliError::Tuning(e),
                e => CliError::Cuda(e),
            })?;
        writeln!(
            err,
            "note: {}",
            auto_note(args.problem.schedule, &resolution)
        )?;
        let rs_partials = resolution.rs_partials_with(args.problem.rs_partials);
        (resolution.schedule, PlanOptions { rs_partials })
    } else {
        (args.problem.schedule, args.problem.plan_options())
    };
    let plan = Plan::build_with(schedule, problem, args.problem.tp, options)?;
    match args.format {
        Format::Table => write!(out, "{}", plan.render_table())?,
        Format::Json => writeln!(out, "{}", plan.to_json()?)?,
        Format::Dot => write!(out, "{}", plan.render_dot())?,
    }
    Ok(())
}

/// What `--auto` decided, in one line: the schedule, the family, the GPU assumed and who
/// decided (with the rule's choice when a table overrode it).
fn auto_note(requested: ScheduleKind, resolution: &Resolution) -> String {
    let rule = match (&resolution.source, resolution.rule) {
        (ScheduleSource::Tuned { .. }, Some(rule)) => {
            format!("; the rule picks {}", rule.schedule.cli_name())
        }
        _ => String::new(),
    };
    let partials = match resolution.rs_partials {
        Some(RsPartials::Push) => " with pushed partials",
        _ => "",
    };
    format!(
        "--auto runs {}{partials} (family {}, for an {ASSUMED_GPU_NAME}): {}{rule}",
        resolution.schedule.cli_name(),
        requested.pipelined().cli_name(),
        resolution.source,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_tell_bad_input_failed_runs_and_failed_checks_apart() {
        let check = CliError::CheckFailed {
            mismatches: 1,
            elements: 4,
            row: 0,
            col: 1,
            ratio: 2.0,
        };
        assert_eq!(check.exit_code(), EXIT_CHECK_FAILED);
        assert_eq!(CliError::Usage(String::new()).exit_code(), EXIT_BAD_INPUT);
        assert_eq!(
            CliError::TooLarge(String::new()).exit_code(),
            EXIT_BAD_INPUT
        );
        let ptx = RuntimeError::PtxMalformed {
            origin: "DISTGEMM_PTX=x".into(),
            reason: "NUL".into(),
        };
        assert_eq!(CliError::Runtime(ptx).exit_code(), EXIT_BAD_INPUT);
        assert_eq!(
            CliError::Exec(ExecError::Aborted).exit_code(),
            EXIT_RUN_FAILED
        );
        let codes = [EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_CHECK_FAILED];
        assert!(
            codes
                .iter()
                .enumerate()
                .all(|(i, c)| !codes[..i].contains(c))
        );
    }

    #[test]
    fn multi_line_messages_become_one_line() {
        assert_eq!(
            single_line("the JIT said:\nptxas error\n\n  line 2\n"),
            "the JIT said: | ptxas error | line 2"
        );
    }
}
