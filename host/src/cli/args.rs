//! Command-line arguments (clap derive) and the problem they describe.

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};

use super::CliError;
use crate::dtype::Dtype;
use crate::fp8::ScaleMode;
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::{DEFAULT_TOKENS, Preset, Problem};
use crate::schedule::ScheduleKind;

/// Examples and exit status, shown by `distgemm --help` (and with the usage when no subcommand
/// is given).
const AFTER_HELP: &str = "\
Examples:
  distgemm plan --schedule ag-a --tp 4 --m 64 --n 64 --k 64
  distgemm run  --schedule rs-b-single --tp 4 --m 96 --n 64 --k 64 --backend cpu --check
  distgemm run  --schedule ag-a --tp 4 --m 256 --n 256 --k 256 --dtype e4m3 --scales row --backend cpu --check
  distgemm run  --schedule ag-a --tp 2 --preset llama3-70b-fc1 --backend cuda --check
  distgemm run  --schedule rs-a --tp 2 --m 256 --n 512 --k 384 --ranks 2 --check
  distgemm bench --schedule ag-a --tp 2 --preset llama3-70b-fc1 --auto --format json
  distgemm trace --schedule ag-a --tp 4 --m 256 --n 256 --k 256 --backend cpu --out trace
  distgemm trace --schedule rs-a --tp 2 --preset llama3-70b-fc2 --backend cuda --ranks 2 --out trace
  distgemm tune --schedule rs-a --tp 2 --preset llama3-70b-fc2 --tokens 1024 --out tuning.json

Exit status:
  0  success
  1  the run failed (a GPU or driver error, a timed-out wait, a CPU executor failure)
  2  bad input: arguments, a problem the schedule cannot run, a problem too large for this
     machine, a missing or unusable CUDA backend or PTX file
  3  --check found elements of D outside the error bound";

/// distgemm: tensor-parallel GEMM schedules, plans and a CPU executor.
#[derive(Debug, Parser)]
#[command(
    name = "distgemm",
    version,
    about,
    arg_required_else_help = true,
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the per-device plan: what runs where, what moves, which flags.
    Plan(PlanArgs),
    /// Run the plan on random data (GPUs or the CPU executor), optionally checking the result.
    Run(RunArgs),
    /// Time the plan on the GPUs (CUDA backend): median/min/max ms and TFLOP/s per GPU.
    ///
    /// Builds one DistGemm (graphs instantiated once) on GPU-generated random shards, runs it
    /// --warmup times untimed, then --reps times, each timed with CUDA events on every GPU (the
    /// slowest GPU's median is reported; the host does not wait between repetitions),
    /// and waits at the end (a timed-out GPU wait is an error, not a number). Prints the
    /// schedule that ran, TP, problem, median/min/max ms, TFLOP/s per GPU (2·M·N·K / TP /
    /// median) and workspace bytes per GPU: two lines of text, or one JSON object
    /// (--format json).
    /// Needs TP Hopper GPUs with peer access; there is no CPU fallback (exit status 2).
    Bench(BenchArgs),
    /// Record a timeline of every plan node on every device and summarise it.
    ///
    /// Runs the plan --iters times on random data and writes, into --out: trace.json (Chrome
    /// Trace Event format: open it in ui.perfetto.dev), timeline.svg, summary.txt and
    /// summary.json (per device and stage: compute, copy, wait and exposed communication);
    /// prints the summary. --backend cuda traces the GPUs through CUPTI's activity records
    /// (one process, or one per rank with --ranks) and prints the cost of tracing;
    /// --backend cpu traces the CPU executor (the schedule's structure, CPU times).
    Trace(TraceArgs),
    /// Measure which schedule of --schedule's family is faster and record it in a tuning table.
    ///
    /// Builds the family's pipelined and single-stage schedules on the GPUs and times them in
    /// interleaved rounds (order reversed each round; every block starts with --settle-ms of
    /// untimed runs), --reps timed runs each in all. Writes the fastest, with every
    /// candidate's times, into the table --out (merged: the entry of the same GPU, TP, dtype,
    /// family, token bucket, N and K is replaced), which Auto reads when DISTGEMM_TUNING names
    /// it. Prints each candidate's median, the choice and the rule's.
    /// Needs TP Hopper GPUs with peer access; there is no CPU fallback (exit status 2).
    Tune(TuneArgs),
}

/// The problem: a schedule, a TP and either explicit sizes or a preset.
#[derive(Debug, Args)]
pub(crate) struct ProblemArgs {
    /// The schedule.
    #[arg(long)]
    pub(crate) schedule: ScheduleKind,
    /// Tensor-parallel degree (number of devices), 1..=8.
    #[arg(long)]
    pub(crate) tp: usize,
    /// Rows of A and D (tokens).
    #[arg(long)]
    pub(crate) m: Option<usize>,
    /// Rows of B, columns of D.
    #[arg(long)]
    pub(crate) n: Option<usize>,
    /// Reduction dimension.
    #[arg(long)]
    pub(crate) k: Option<usize>,
    /// A LLaMA-3 projection (instead of --m/--n/--k).
    #[arg(long)]
    pub(crate) preset: Option<Preset>,
    /// Tokens (M) of a preset [default: 16384].
    #[arg(long)]
    pub(crate) tokens: Option<usize>,
    /// Element type of A and B (and of C and D, except for e4m3, whose output type is
    /// --out-dtype). `run` takes e4m3 on the CPU executor and the GPUs, `bench` and `tune` on
    /// the GPUs; `trace` in one process (not with --ranks).
    #[arg(long, value_enum, default_value = "bf16")]
    pub(crate) dtype: DtypeArg,
    /// With --dtype e4m3: one scale per operand (tensor) or one per row of A and of B (row)
    /// [default: tensor].
    #[arg(long)]
    pub(crate) scales: Option<ScaleMode>,
    /// With --dtype e4m3: the type of C, D and the reduce-scatter partials [default: bf16].
    #[arg(long)]
    pub(crate) out_dtype: Option<Dtype>,
    /// How rs-a and rs-b move partial sums: read (the next stage's epilogue loads the left
    /// neighbour's partial over NVLink) or push (the left neighbour's copy engine pushes it
    /// into the device's workspace; more workspace). Default: read, or with --auto a tuning
    /// table's measured choice. Other schedules ignore it, with a note.
    #[arg(long, value_enum)]
    pub(crate) rs_partials: Option<RsPartials>,
}

/// `--dtype`: a 16-bit type for everything, or e4m3 operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DtypeArg {
    /// bfloat16 A, B, C and D.
    Bf16,
    /// IEEE binary16 A, B, C and D.
    F16,
    /// OCP FP8 E4M3 A and B with --scales; C and D of --out-dtype.
    E4m3,
}

/// Output format of `plan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Per device and stage, aligned columns (`text` is the same).
    #[value(alias = "text")]
    Table,
    /// The plan as JSON (the data the executors consume).
    Json,
    /// Graphviz: one cluster per device, flag dependencies across devices.
    Dot,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    pub(crate) problem: ProblemArgs,
    /// Let Auto choose between --schedule's pipelined and single-stage variants, as on an
    /// NVIDIA H200 (a tuning table's measured choice when DISTGEMM_TUNING names one and an
    /// entry matches, else the rule); a note on stderr says which ran and who decided.
    #[arg(long)]
    pub(crate) auto: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) format: Format,
}

/// Output format of `run` and `bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ReportFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object.
    Json,
}

/// How `run` and `bench` write their report: `--format text|json`, or `--json` for short.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) format: ReportFormat,
    /// Same as --format json.
    #[arg(long, conflicts_with = "format")]
    pub(crate) json: bool,
}

impl ReportArgs {
    /// Whether the report is JSON (`--format json` or `--json`).
    pub(crate) fn json(&self) -> bool {
        self.json || self.format == ReportFormat::Json
    }
}

/// Where `run` executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// CUDA when available, else the CPU executor (with a notice).
    Auto,
    /// The CPU executor.
    Cpu,
    /// The CUDA backend: one graph per GPU (needs TP Hopper GPUs with peer access).
    Cuda,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) problem: ProblemArgs,
    /// Execution backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) backend: Backend,
    /// Verify every element of D against an f64 reference (computed on the first GPU after a
    /// CUDA run, on the CPU after a CPU run; with --ranks, each rank checks its block of D on
    /// its GPU); exit 3 on mismatch.
    #[arg(long)]
    pub(crate) check: bool,
    /// Consecutive runs of the plan (1..=10000).
    #[arg(long, default_value_t = 1)]
    pub(crate) iters: usize,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Bound of every executor wait, in milliseconds (at least 1).
    #[arg(long, default_value_t = 5000)]
    pub(crate) timeout_ms: u64,
    /// One process per rank on this host (the per-rank mode over CUDA IPC), RANKS = --tp;
    /// each rank checks its own block of D with --check.
    #[arg(long)]
    pub(crate) ranks: Option<usize>,
    /// With --ranks: every rank on GPU 0 (tests the cross-process protocol on one GPU; times
    /// mean nothing then).
    #[arg(long, requires = "ranks")]
    pub(crate) share_gpu: bool,
}

/// Most iterations `run` accepts (as `bench`'s repetitions).
pub(crate) const MAX_RUN_ITERS: usize = 10_000;

/// Fewest timed repetitions `bench` accepts.
pub(crate) const MIN_BENCH_REPS: usize = 1;
/// Most timed (or warm-up) repetitions `bench` accepts (every timed repetition holds two CUDA
/// events per GPU until the end).
pub(crate) const MAX_BENCH_REPS: usize = 10_000;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) problem: ProblemArgs,
    /// Let distgemm's Auto rule choose between --schedule's pipelined and single-stage
    /// variants (same shard layout); the report names the schedule that ran.
    #[arg(long)]
    pub(crate) auto: bool,
    /// Untimed runs before timing (0..=10000).
    #[arg(long, default_value_t = 5)]
    pub(crate) warmup: usize,
    /// Timed runs (1..=10000); the median, min and max are reported.
    #[arg(long, default_value_t = 20)]
    pub(crate) reps: usize,
    /// Bound of every GPU wait, in milliseconds (a stuck peer becomes an error, not a hang).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) timeout_ms: u64,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Default total of timed runs per candidate of `tune`, over all rounds.
pub(crate) const DEFAULT_TUNE_REPS: usize = 60;
/// Most interleaved rounds `tune` runs.
pub(crate) const MAX_TUNE_ROUNDS: usize = 100;

#[derive(Debug, Args)]
pub(crate) struct TuneArgs {
    #[command(flatten)]
    pub(crate) problem: ProblemArgs,
    /// The tuning table to update (created if missing) [default: $DISTGEMM_TUNING, else
    /// distgemm-tuning.json].
    #[arg(long)]
    pub(crate) out: Option<std::path::PathBuf>,
    /// Timed runs per candidate, over all rounds (1..=10000).
    #[arg(long, default_value_t = DEFAULT_TUNE_REPS)]
    pub(crate) reps: usize,
    /// Interleaved rounds (1..=100); each times every candidate once, in reversed order
    /// every other round.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Untimed work at the start of every timed block, in milliseconds (the GPUs are
    /// power-capped; the limiter takes up to a second to settle on a new load).
    #[arg(long, default_value_t = 1000)]
    pub(crate) settle_ms: u64,
    /// Bound of every GPU wait, in milliseconds (a stuck peer becomes an error, not a hang).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) timeout_ms: u64,
}

impl Command {
    /// The problem arguments every subcommand has.
    pub(crate) fn problem(&self) -> &ProblemArgs {
        match self {
            Command::Plan(a) => &a.problem,
            Command::Run(a) => &a.problem,
            Command::Bench(a) => &a.problem,
            Command::Trace(a) => &a.problem,
            Command::Tune(a) => &a.problem,
        }
    }
}

impl ProblemArgs {
    /// The plan of the arguments' schedule, problem, TP and options.
    pub(crate) fn plan(&self, problem: Problem) -> Result<Plan, CliError> {
        Ok(Plan::build_with(
            self.schedule,
            problem,
            self.tp,
            self.plan_options(),
        )?)
    }

    /// The plan options the arguments give (partials read unless `--rs-partials` says).
    pub(crate) fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            rs_partials: self.rs_partials.unwrap_or_default(),
        }
    }

    /// A note when `--rs-partials` asks for something the schedule does not have.
    pub(crate) fn rs_partials_note(&self) -> Option<String> {
        let asked = self.rs_partials?;
        (asked.effective(self.schedule) != asked).then(|| {
            format!(
                "--rs-partials {} applies to rs-a and rs-b only; {} runs unchanged",
                asked.cli_name(),
                self.schedule.cli_name()
            )
        })
    }

    /// The problem the arguments describe (validity against the schedule is checked by the plan).
    pub(crate) fn problem(&self) -> Result<Problem, CliError> {
        let problem = match (self.preset, self.m, self.n, self.k) {
            (Some(preset), None, None, None) => {
                preset.problem(self.tokens.unwrap_or(DEFAULT_TOKENS))
            }
            (Some(_), ..) => {
                return Err(CliError::Usage(
                    "--preset cannot be combined with --m, --n or --k".into(),
                ));
            }
            (None, Some(m), Some(n), Some(k)) if self.tokens.is_none() => Problem::new(m, n, k),
            (None, Some(_), Some(_), Some(_)) => {
                return Err(CliError::Usage(
                    "--tokens only applies to --preset; use --m".into(),
                ));
            }
            (None, ..) => {
                return Err(CliError::Usage(
                    "give either --m, --n and --k, or --preset".into(),
                ));
            }
        };
        let fp8_only = |flag: &str| {
            Err(CliError::Usage(format!(
                "{flag} applies to --dtype e4m3 only (bf16 and f16 have no scales and are \
                 their own output type)"
            )))
        };
        match (self.dtype, self.scales, self.out_dtype) {
            (DtypeArg::E4m3, scales, out) => Ok(problem
                .with_dtype(out.unwrap_or(Dtype::Bf16))
                .with_fp8(scales.unwrap_or(ScaleMode::Tensorwise))),
            (_, Some(_), _) => fp8_only("--scales"),
            (_, None, Some(_)) => fp8_only("--out-dtype"),
            (DtypeArg::Bf16, None, None) => Ok(problem.with_dtype(Dtype::Bf16)),
            (DtypeArg::F16, None, None) => Ok(problem.with_dtype(Dtype::F16)),
        }
    }
}

impl ValueEnum for ScheduleKind {
    fn value_variants<'a>() -> &'a [Self] {
        &ScheduleKind::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.cli_name()).help(self.full_name()))
    }
}

impl ValueEnum for RsPartials {
    fn value_variants<'a>() -> &'a [Self] {
        &RsPartials::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.cli_name()))
    }
}

impl ValueEnum for Preset {
    fn value_variants<'a>() -> &'a [Self] {
        &Preset::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

impl ValueEnum for Dtype {
    fn value_variants<'a>() -> &'a [Self] {
        &Dtype::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

impl ValueEnum for ScaleMode {
    fn value_variants<'a>() -> &'a [Self] {
        &ScaleMode::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

/// Where `trace` takes its timestamps from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum TraceBackend {
    /// The CPU executor (one thread per branch of each device's DAG, one host clock).
    Cpu,
    /// The GPUs: CUPTI activity records of every kernel and copy (one process, TP GPUs).
    Cuda,
}

/// Most runs `trace` records (every node of every run is one slice of the outputs).
pub(crate) const MAX_TRACE_ITERS: usize = 1000;

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    pub(crate) problem: ProblemArgs,
    /// Where the timestamps come from.
    #[arg(long, value_enum)]
    pub(crate) backend: TraceBackend,
    /// Directory for trace.json, timeline.svg, summary.txt and summary.json (created if
    /// missing; existing files of those names are replaced).
    #[arg(long)]
    pub(crate) out: std::path::PathBuf,
    /// Consecutive runs of the plan to trace (1..=1000).
    #[arg(long, default_value_t = 1)]
    pub(crate) iters: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Bound of every executor wait, in milliseconds (at least 1).
    #[arg(long, default_value_t = 5000)]
    pub(crate) timeout_ms: u64,
    /// With --backend cuda: one process per rank on this host (the per-rank mode), RANKS =
    /// --tp; each rank collects its own GPU's records and this process merges them (bf16 and
    /// f16).
    #[arg(long)]
    pub(crate) ranks: Option<usize>,
    /// With --ranks: every rank on GPU 0 (shows the cross-process protocol on one GPU; the
    /// ranks then share its SMs, so times are not those of separate GPUs).
    #[arg(long, requires = "ranks")]
    pub(crate) share_gpu: bool,
}
