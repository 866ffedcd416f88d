//! The benchmark's command line, and the repetition counts it implies.

use clap::{ArgAction, Parser};
use distgemm::dtype::Dtype;
use distgemm::problem::{DEFAULT_TOKENS, Preset};

use super::PLANNING_TFLOPS;
use crate::{RunnerFlags, TimingConfig, parse_reps};

/// distgemm side by side with single-GPU GEMMs, NCCL + cuBLASLt and PyTorch async-TP (see
/// `benches/distgemm/main.rs`).
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(name = "distgemm")]
pub struct Options {
    /// Keep only the rows whose id `distgemm/<preset>/<schedule>` contains this.
    pub filter: Option<String>,
    /// Tensor-parallel degree (default: every GPU the driver sees).
    #[arg(long, value_parser = at_least_one)]
    pub tp: Option<usize>,
    /// Tokens: the M of every preset.
    #[arg(long, default_value_t = DEFAULT_TOKENS, value_parser = at_least_one)]
    pub tokens: usize,
    /// Element type: bf16 or f16.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: Dtype,
    /// Timed repetitions per contender (at least 20, `MIN_TIMED_REPS`; default: about 1.5 s
    /// of work, 20 to 50).
    #[arg(long, value_parser = parse_reps)]
    pub reps: Option<usize>,
    /// 70B presets only, 20 repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Instead of the table, the token sweep over 70B fc1/fc2.
    #[arg(long)]
    pub sweep: bool,
    /// Time the diagnostic variants beside the pipelined schedules.
    #[arg(long)]
    pub diagnose: bool,
    /// Run the PyTorch peer (`--no-torch`: do not).
    #[arg(long = "no-torch", action = ArgAction::SetFalse)]
    pub torch: bool,
    /// Python interpreter of the PyTorch peer (default: `DISTGEMM_PYTHON`, else `python3`).
    #[arg(long)]
    pub python: Option<String>,
    /// Seconds the PyTorch peer may take.
    #[arg(long = "torch-timeout", value_name = "SECONDS", default_value_t = 300)]
    pub torch_timeout_s: u64,
    /// Untimed work at the start of every timed block, ms (default [`SETTLE_MS`]).
    #[arg(long, value_name = "MS", default_value_t = SETTLE_MS, value_parser = non_negative_ms)]
    pub settle_ms: f64,
    /// `--bench`, `--list`.
    #[command(flatten)]
    pub runner: RunnerFlags,
}

impl Default for Options {
    /// What no options give.
    fn default() -> Self {
        Options::parse_from(["distgemm"])
    }
}

/// Parses the command line (without the program name).
pub fn parse_args(args: &[String]) -> Result<Options, clap::Error> {
    Options::try_parse_from(std::iter::once("distgemm").chain(args.iter().map(String::as_str)))
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse() {
        Ok(0) => Err("use at least 1".into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "bf16" => Ok(Dtype::Bf16),
        "f16" | "fp16" => Ok(Dtype::F16),
        other => Err(format!("'{other}': use bf16 or f16")),
    }
}

/// A duration in ms for a command-line option: finite and not negative.
pub fn non_negative_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{s}': use a number ≥ 0")),
    }
}

/// File stem of a run's results: `<what>-<date>-<commit>`, then one suffix per option that
/// changes what was measured (`-quick`, `-diagnose`, `-m<tokens>`, `-settle<ms>`, and the
/// FILTER with every character other than letters, digits and `-` as `_`), so that runs of
/// one commit with different options do not overwrite each other.
pub fn results_stem(what: &str, date: &str, commit: &str, o: &Options) -> String {
    let mut stem = format!("{what}-{}-{commit}", &date[..date.len().min(10)]);
    if o.quick {
        stem.push_str("-quick");
    }
    if o.diagnose {
        stem.push_str("-diagnose");
    }
    if o.tokens != DEFAULT_TOKENS && !o.sweep {
        stem.push_str(&format!("-m{}", o.tokens));
    }
    if o.settle_ms != SETTLE_MS {
        stem.push_str(&format!("-settle{}", o.settle_ms));
    }
    if let Some(f) = &o.filter {
        let f: String = f
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        stem.push('-');
        stem.push_str(&f);
    }
    stem
}

/// Presets of a run.
pub fn presets(quick: bool) -> Vec<Preset> {
    Preset::ALL
        .into_iter()
        .filter(|p| !quick || p.name().contains("70b"))
        .collect()
}

/// Default untimed work at the start of every timed block, in milliseconds: the GPUs are
/// power-capped, and the limiter takes up to a second to converge on a new load (shorter
/// settles read fast and depend on what ran before; kernels-gpu/NOTES.md, step 27).
pub const SETTLE_MS: f64 = 1000.0;

/// Estimated time of one repetition of `flops_per_gpu` at [`PLANNING_TFLOPS`], in ms (at
/// least 1 µs).
fn estimated_ms(flops_per_gpu: f64) -> f64 {
    (flops_per_gpu / (PLANNING_TFLOPS * 1e12) * 1e3).max(1e-3)
}

/// Untimed repetitions of `flops_per_gpu` that make at least `settle_ms` of GPU work:
/// ceil(`settle_ms` / estimated ms).
pub fn settle_warmup(flops_per_gpu: f64, settle_ms: f64) -> usize {
    (settle_ms / estimated_ms(flops_per_gpu)).ceil() as usize
}

/// Warm-up and repetitions for work of `flops_per_gpu`: about 1.5 s of timed work, between 20
/// and 50 repetitions (20 with `--quick`), unless `--reps` says otherwise; the warm-up is
/// max(2 or 5, [`settle_warmup`]), so every block starts with ≥ `o.settle_ms` of untimed work.
pub fn timing_for(flops_per_gpu: f64, o: &Options) -> TimingConfig {
    let est_ms = estimated_ms(flops_per_gpu);
    let reps = o.reps.unwrap_or(if o.quick {
        20
    } else {
        ((1500.0 / est_ms) as usize).clamp(20, 50)
    });
    let warmup = if est_ms > 20.0 { 2 } else { 5 };
    TimingConfig {
        warmup: warmup.max(settle_warmup(flops_per_gpu, o.settle_ms)),
        reps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_the_runner_invocation() {
        let o = parse_args(&args("distgemm --bench --quick --tp 2")).unwrap();
        assert_eq!(o.filter.as_deref(), Some("distgemm"));
        assert!(o.quick && !o.sweep && o.torch);
        assert_eq!(o.tp, Some(2));
        assert_eq!(o.tokens, DEFAULT_TOKENS);
        assert_eq!(o.settle_ms, SETTLE_MS);
        let o = parse_args(&args(
            "--sweep --dtype f16 --reps 30 --no-torch --settle-ms 250",
        ))
        .unwrap();
        assert!(o.sweep && !o.torch);
        assert_eq!(
            (o.dtype, o.reps, o.settle_ms),
            (Dtype::F16, Some(30), 250.0)
        );
        // A shorter settle means fewer warm-up launches: 250 ms of ~5.6 ms GEMMs (70B fc2,
        // TP = 2) against 1 s.
        let fc2 = 2.0 * 16384.0 * 8192.0 * 28672.0 / 2.0;
        assert!(3 * timing_for(fc2, &o).warmup < timing_for(fc2, &Options::default()).warmup);
        assert!(parse_args(&args("--settle-ms -1")).is_err());
        assert!(parse_args(&args("--settle-ms NaN")).is_err());
        assert!(parse_args(&args("--reps 5")).is_err());
        assert!(parse_args(&args("--reps thirty")).is_err());
        assert!(parse_args(&args("--dtype fp8")).is_err());
        assert!(parse_args(&args("--tp 0")).is_err());
        assert!(parse_args(&args("--tokens")).is_err());
        assert!(parse_args(&args("--frobnicate")).is_err());
        assert!(parse_args(&args("a b")).is_err());
    }

    #[test]
    fn results_stems_name_the_options_that_change_the_measurement() {
        let stem = |a: &str| {
            results_stem(
                "distgemm",
                "2026-11-30T16:10:42Z",
                "abc1234",
                &parse_args(&args(a)).unwrap(),
            )
        };
        assert_eq!(stem(""), "distgemm-2026-11-30-abc1234");
        // The runner's --bench and options that only change how it runs leave the name alone.
        assert_eq!(
            stem("--bench --no-torch --reps 60"),
            "distgemm-2026-11-30-abc1234"
        );
        assert_eq!(
            stem("--quick --diagnose --tokens 4096 --settle-ms 250 llama3-70b-fc2/ag-"),
            "distgemm-2026-11-30-abc1234-quick-diagnose-m4096-settle250-llama3-70b-fc2_ag-"
        );
        assert_eq!(
            results_stem(
                "distgemm-sweep",
                "2026-11-30",
                "abc1234",
                &parse_args(&args("--sweep --tokens 512")).unwrap()
            ),
            "distgemm-sweep-2026-11-30-abc1234"
        );
    }

    #[test]
    fn repetitions_stay_within_bounds() {
        let o = Options::default();
        // 405B fc1 full: ~57 TFLOP ≈ 88 ms → 20 reps; 12 warm-ups make ≥ 1 s.
        let t = timing_for(2.0 * 16384.0 * 106496.0 * 16384.0, &o);
        assert_eq!((t.warmup, t.reps), (12, 20));
        // 405B fc1 at TP = 8: ≈ 11 ms → 91 warm-ups make ≥ 1 s, 50 reps.
        let t = timing_for(2.0 * 16384.0 * 106496.0 * 16384.0 / 8.0, &o);
        assert_eq!((t.warmup, t.reps), (91, 50));
        // A tiny GEMM (1 GFLOP ≈ 1.5 µs): capped at 50 reps; just enough warm-ups for 1 s.
        let t = timing_for(1e9, &o);
        let est_ms = estimated_ms(1e9);
        assert_eq!(t.reps, 50);
        assert!(t.warmup as f64 * est_ms >= SETTLE_MS);
        assert!((t.warmup - 1) as f64 * est_ms < SETTLE_MS);
        // Work estimated above 1 s: the plain minimum of 2 warm-ups.
        assert_eq!(settle_warmup(1.2 * PLANNING_TFLOPS * 1e12, SETTLE_MS), 1);
        assert_eq!(timing_for(1.2 * PLANNING_TFLOPS * 1e12, &o).warmup, 2);
        let quick = Options {
            quick: true,
            ..Options::default()
        };
        assert_eq!(timing_for(1e9, &quick).reps, 20);
        assert_eq!(presets(true).len(), 2);
        assert_eq!(presets(false).len(), 4);
    }
}
