//! The pure half of the `distgemm` benchmark (`benches/distgemm.rs`): command line, which
//! baseline pairs with which schedule, the result records and their derived columns, tables,
//! verdicts, the parsing of the PyTorch peer's output and the token-sweep analysis. Kept in the
//! support library so that `cargo test` runs its tests (a `harness = false` bench's tests do
//! not run).

use distgemm::baseline::NcclGemmKind;
use distgemm::dtype::Dtype;
use distgemm::problem::{DEFAULT_TOKENS, Preset};
use distgemm::schedule::{Collective, ScheduleKind};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::TimingConfig;

/// Dense bf16/f16 tensor peak of an H100/H200 SXM, TFLOP/s.
pub const PEAK_TFLOPS: f64 = 989.0;
/// Throughput assumed when choosing repetition counts (TFLOP/s per GPU).
pub const PLANNING_TFLOPS: f64 = 650.0;
/// Token counts of the sweep.
pub const SWEEP_TOKENS: [usize; 7] = [256, 512, 1024, 2048, 4096, 8192, 16384];
/// A schedule whose time is within this factor of the best counts as "as fast".
pub const NOISE: f64 = 1.03;

// ------------------------------------------------------------------------------------------
// Schedules and their families (pure)
// ------------------------------------------------------------------------------------------

/// A row of the table: a fixed schedule, or distgemm's `Auto` choice within a family (the
/// family is fixed by the shard layout the caller holds; `Auto` picks its pipelined or its
/// single-stage schedule). `Auto` carries the family's pipelined schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sched {
    Fixed(ScheduleKind),
    Auto(ScheduleKind),
}

impl Sched {
    /// The eight fixed schedules, then `Auto` of each of the four families.
    pub fn all() -> Vec<Sched> {
        let mut v: Vec<Sched> = ScheduleKind::ALL.iter().map(|&k| Sched::Fixed(k)).collect();
        v.extend(
            ScheduleKind::ALL
                .iter()
                .filter(|k| k.is_pipelined())
                .map(|&k| Sched::Auto(k)),
        );
        v
    }

    /// `ag-a`, `rs-b-single`, `auto(ag-a)`, …
    pub fn name(self) -> String {
        match self {
            Sched::Fixed(k) => k.cli_name().to_owned(),
            Sched::Auto(f) => format!("auto({})", pipelined_of(f).cli_name()),
        }
    }

    /// The fixed schedule, if this is one.
    pub fn kind(self) -> Option<ScheduleKind> {
        match self {
            Sched::Fixed(k) => Some(k),
            Sched::Auto(_) => None,
        }
    }

    /// The schedule family (its pipelined schedule).
    pub fn family(self) -> ScheduleKind {
        match self {
            Sched::Fixed(k) | Sched::Auto(k) => pipelined_of(k),
        }
    }
}

/// The single-stage schedule of `kind`'s family (what column (b) times).
pub fn single_stage_of(kind: ScheduleKind) -> ScheduleKind {
    use ScheduleKind::*;
    match kind {
        AllGatherRotatingA | AllGatherSingleStageA => AllGatherSingleStageA,
        AllGatherRotatingB | AllGatherSingleStageB => AllGatherSingleStageB,
        ReduceScatterTilingA | ReduceScatterSingleStageA => ReduceScatterSingleStageA,
        ReduceScatterTilingB | ReduceScatterSingleStageB => ReduceScatterSingleStageB,
    }
}

/// The pipelined schedule of `kind`'s family (what column (c) times).
pub fn pipelined_of(kind: ScheduleKind) -> ScheduleKind {
    use ScheduleKind::*;
    match kind {
        AllGatherRotatingA | AllGatherSingleStageA => AllGatherRotatingA,
        AllGatherRotatingB | AllGatherSingleStageB => AllGatherRotatingB,
        ReduceScatterTilingA | ReduceScatterSingleStageA => ReduceScatterTilingA,
        ReduceScatterTilingB | ReduceScatterSingleStageB => ReduceScatterTilingB,
    }
}

/// The NCCL + cuBLAS pairing that does the same job as `kind` (column (e)).
pub fn nccl_kind_of(kind: ScheduleKind) -> NcclGemmKind {
    match (kind.collective(), kind.tiles_rows()) {
        (Collective::AllGather, true) => NcclGemmKind::AllGatherA,
        (Collective::AllGather, false) => NcclGemmKind::AllGatherB,
        (Collective::ReduceScatter, _) => NcclGemmKind::ReduceScatter,
    }
}

/// The PyTorch op doing the same collective as `kind` (column (f)); PyTorch's all-gather op
/// always gathers A and its reduce-scatter always scatters rows.
pub fn torch_op_of(kind: ScheduleKind) -> &'static str {
    match kind.collective() {
        Collective::AllGather => TORCH_AG,
        Collective::ReduceScatter => TORCH_RS,
    }
}

pub const TORCH_AG: &str = "fused_all_gather_matmul";
pub const TORCH_RS: &str = "fused_matmul_reduce_scatter";

// ------------------------------------------------------------------------------------------
// Command line (pure)
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub filter: Option<String>,
    pub tp: Option<usize>,
    pub tokens: usize,
    pub dtype: Dtype,
    pub reps: Option<usize>,
    pub quick: bool,
    pub sweep: bool,
    /// Time the diagnostic variants beside the pipelined all-gather schedules.
    pub diagnose: bool,
    pub torch: bool,
    pub python: Option<String>,
    pub torch_timeout_s: u64,
    /// Untimed work at the start of every timed block, ms (`--settle-ms`, default
    /// [`SETTLE_MS`]).
    pub settle_ms: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            filter: None,
            tp: None,
            tokens: DEFAULT_TOKENS,
            dtype: Dtype::Bf16,
            reps: None,
            quick: false,
            sweep: false,
            diagnose: false,
            torch: true,
            python: None,
            torch_timeout_s: 300,
            settle_ms: SETTLE_MS,
        }
    }
}

pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter();
    fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> Result<String, String> {
        it.next()
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value"))
    }
    fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
        s.parse()
            .map_err(|_| format!("{flag}: '{s}' is not a valid number"))
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            "--quick" => o.quick = true,
            "--sweep" => o.sweep = true,
            "--diagnose" => o.diagnose = true,
            "--no-torch" => o.torch = false,
            "--tp" => {
                let tp: usize = number(&value(&mut it, a)?, a)?;
                if tp == 0 {
                    return Err("--tp must be at least 1".into());
                }
                o.tp = Some(tp);
            }
            "--tokens" => {
                o.tokens = number(&value(&mut it, a)?, a)?;
                if o.tokens == 0 {
                    return Err("--tokens must be at least 1".into());
                }
            }
            "--reps" => {
                let r: usize = number(&value(&mut it, a)?, a)?;
                if r < crate::MIN_TIMED_REPS {
                    return Err(format!(
                        "--reps {r}: use at least {}",
                        crate::MIN_TIMED_REPS
                    ));
                }
                o.reps = Some(r);
            }
            "--dtype" => {
                o.dtype = match value(&mut it, a)?.as_str() {
                    "bf16" => Dtype::Bf16,
                    "f16" | "fp16" => Dtype::F16,
                    other => return Err(format!("--dtype {other}: use bf16 or f16")),
                }
            }
            "--python" => o.python = Some(value(&mut it, a)?),
            "--torch-timeout" => o.torch_timeout_s = number(&value(&mut it, a)?, a)?,
            "--settle-ms" => {
                o.settle_ms = number(&value(&mut it, a)?, a)?;
                if !(o.settle_ms.is_finite() && o.settle_ms >= 0.0) {
                    return Err(format!("--settle-ms {}: use a number ≥ 0", o.settle_ms));
                }
            }
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s => {
                if o.filter.is_some() {
                    return Err(format!("only one FILTER allowed (extra '{s}')"));
                }
                o.filter = Some(s.to_owned());
            }
        }
    }
    Ok(o)
}

pub const USAGE: &str = "usage: distgemm [FILTER] [--bench] [--tp N] [--tokens M] [--dtype bf16|f16] \
[--reps N] [--quick] [--sweep] [--diagnose] [--no-torch] [--python PATH] [--torch-timeout SECONDS] \
[--settle-ms MS]";

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

/// Default untimed work at the start of every timed block, in milliseconds. The GPUs are
/// power-capped and the limiter takes up to a second to converge on a new load: a block timed
/// right after idle reads 2-4 % fast, and with 250 ms of settling a contender's reading still
/// depended on what ran before it in the round ((c) 1 % faster than (b) on 70B fc2, (d) 4-6 %
/// over (c) instead of the 2-3 % of the diagnose variants;
/// `benches/results/distgemm-2026-11-30-3b212cd-settle.md`). With 1 s the readings agree.
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

// ------------------------------------------------------------------------------------------
// Results (pure)
// ------------------------------------------------------------------------------------------

/// One preset × schedule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    pub preset: String,
    pub tp: usize,
    pub schedule: String,
    pub schedule_full: String,
    /// The schedule `auto` chose, when the runtime says.
    pub auto_choice: Option<String>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: String,
    /// (a) our kernel, full problem on one GPU.
    pub single_gpu_ours_ms: Option<f64>,
    /// (a) cuBLASLt, full problem on one GPU.
    pub single_gpu_cublas_ms: Option<f64>,
    /// (b) shape(s) and time.
    pub single_stage_shape: Option<String>,
    pub single_stage_nocomm_ms: Option<f64>,
    /// (c) stage shapes and time.
    pub pipelined_stage_shapes: Option<String>,
    pub pipelined_nocomm_ms: Option<f64>,
    /// Every device's median of (b), (c) and (d) (the columns above are the largest): shows
    /// whether one GPU is slower than the other and what coupling them costs.
    pub device_medians_ms: DeviceMedians,
    /// (d)
    pub distgemm_ms: Option<f64>,
    pub distgemm_min_ms: Option<f64>,
    pub distgemm_max_ms: Option<f64>,
    pub distgemm_reps: Option<usize>,
    /// (d) as the median of every repetition's slowest device (the statistic before
    /// `distgemm::timing` reported the slowest device's median; see there why it overstates).
    pub distgemm_per_rep_max_ms: Option<f64>,
    /// Pipelined all-gather rows: variants of (c) and (d) that leave parts out, timed in the
    /// same rounds ([`Diagnostic`]).
    pub diagnostics: Vec<Diagnostic>,
    /// Pipelined rows with `--diagnose`: the SM clock and board power every contender of the
    /// family ran at ([`ContenderPower`]).
    pub power: Vec<ContenderPower>,
    /// (e)
    pub nccl_cublas_variant: Option<String>,
    pub nccl_cublas_ms: Option<f64>,
    /// (f)
    pub torch_async_tp_op: Option<String>,
    pub torch_async_tp_ms: Option<f64>,
    /// PyTorch's own NCCL + matmul and matmul-alone times for the same collective.
    pub torch_nccl_matmul_ms: Option<f64>,
    pub torch_matmul_local_ms: Option<f64>,
    /// Derived from (d).
    pub distgemm_tflops_per_gpu: Option<f64>,
    pub pct_of_single_stage: Option<f64>,
    pub pct_of_pipelined_nocomm: Option<f64>,
    pub pct_of_peak: Option<f64>,
    pub speedup_vs_nccl_cublas: Option<f64>,
    pub speedup_vs_torch_async_tp: Option<f64>,
    /// Why a column is null.
    pub missing: BTreeMap<String, String>,
    pub machine: String,
    pub driver: String,
    pub commit: String,
    pub date: String,
}

/// Every device's median of the family's timings ([`Record::device_medians_ms`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceMedians {
    pub single_stage_nocomm: Vec<f64>,
    pub pipelined_nocomm: Vec<f64>,
    pub distgemm: Vec<f64>,
}

/// A variant of (c) or (d) that leaves a part out (e.g. "(d), copies cut to 4096 B"): its
/// time over (c) against (d)'s says what that part costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diagnostic {
    pub name: String,
    /// The slowest device's median.
    pub ms: f64,
    pub device_medians_ms: Vec<f64>,
}

/// A contender's mean SM clock and board power on every device over the timed part of all its
/// blocks, sampled with NVML every 10 ms (the power is NVML's one-second average, so a short
/// block's reading includes some of its neighbours). Under the power cap a
/// contender that draws the cap's power at a lower clock spends more energy per cycle; one
/// that draws less than the cap is idle part of the time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ContenderPower {
    pub name: String,
    pub sm_mhz: Vec<f64>,
    pub watts: Vec<f64>,
}

impl Record {
    /// Fills the derived columns from the measured ones.
    pub fn derive(&mut self) {
        let flops_per_gpu = 2.0 * self.m as f64 * self.n as f64 * self.k as f64 / self.tp as f64;
        let Some(d) = self.distgemm_ms.filter(|&d| d > 0.0) else {
            return;
        };
        let tflops = flops_per_gpu / (d * 1e-3) / 1e12;
        self.distgemm_tflops_per_gpu = Some(tflops);
        self.pct_of_peak = Some(100.0 * tflops / PEAK_TFLOPS);
        self.pct_of_single_stage = self.single_stage_nocomm_ms.map(|b| 100.0 * b / d);
        self.pct_of_pipelined_nocomm = self.pipelined_nocomm_ms.map(|c| 100.0 * c / d);
        self.speedup_vs_nccl_cublas = self.nccl_cublas_ms.map(|e| e / d);
        self.speedup_vs_torch_async_tp = self.torch_async_tp_ms.map(|f| f / d);
    }

    pub fn set<T>(&mut self, column: &str, value: &Result<T, String>) -> Option<T>
    where
        T: Clone,
    {
        match value {
            Ok(v) => Some(v.clone()),
            Err(e) => {
                self.missing.insert(column.to_owned(), e.clone());
                None
            }
        }
    }
}

pub fn ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.3}"))
}

pub fn pct(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.1}"))
}

pub fn times(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}×"))
}

pub const TABLE_HEADER: &str = "| preset | schedule | (a) ours ms | (a) cuBLAS ms | (b) ms | (c) ms | (d) distgemm ms | TFLOP/s/GPU | % of (b) | % of (c) | % of 989 | (e) NCCL+cuBLAS ms | (f) torch async-TP ms | ×(e) | ×(f) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

pub fn table_row(r: &Record) -> String {
    let sched = match &r.auto_choice {
        Some(c) => format!("{} → {c}", r.schedule),
        None => r.schedule.clone(),
    };
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        r.preset,
        sched,
        ms(r.single_gpu_ours_ms),
        ms(r.single_gpu_cublas_ms),
        ms(r.single_stage_nocomm_ms),
        ms(r.pipelined_nocomm_ms),
        ms(r.distgemm_ms),
        r.distgemm_tflops_per_gpu
            .map_or("—".into(), |v| format!("{v:.0}")),
        pct(r.pct_of_single_stage),
        pct(r.pct_of_pipelined_nocomm),
        pct(r.pct_of_peak),
        ms(r.nccl_cublas_ms),
        ms(r.torch_async_tp_ms),
        times(r.speedup_vs_nccl_cublas),
        times(r.speedup_vs_torch_async_tp),
    )
}

/// One line per row with diagnostics: (c), each diagnostic and (d), with their excess over (c)
/// and every device's median.
pub fn overhead_split(records: &[Record]) -> String {
    let per_device = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    records
        .iter()
        .filter(|r| r.auto_choice.is_none() && !r.diagnostics.is_empty())
        .filter_map(|r| {
            let (c, d) = (r.pipelined_nocomm_ms?, r.distgemm_ms?);
            let item = |name: &str, ms: f64, devices: &[f64]| {
                format!(
                    "{name} {ms:.3} ms ({:+.1} %) [{}]",
                    (ms - c) / c * 100.0,
                    per_device(devices)
                )
            };
            let mut items = vec![format!(
                "(c) {c:.3} ms [{}]",
                per_device(&r.device_medians_ms.pipelined_nocomm)
            )];
            items.extend(
                r.diagnostics
                    .iter()
                    .map(|x| item(&x.name, x.ms, &x.device_medians_ms)),
            );
            items.push(item("(d)", d, &r.device_medians_ms.distgemm));
            Some(format!(
                "- {} {}: {}\n",
                r.preset,
                r.schedule,
                items.join("; ")
            ))
        })
        .collect()
}

/// One line per row with power samples: every contender's SM clock and board power per device.
pub fn power_split(records: &[Record]) -> String {
    let join = |v: &[f64], unit: &str| {
        let parts: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        format!("{} {unit}", parts.join("/"))
    };
    records
        .iter()
        .filter(|r| r.auto_choice.is_none() && !r.power.is_empty())
        .map(|r| {
            let items: Vec<String> = r
                .power
                .iter()
                .map(|p| {
                    format!(
                        "{} {}, {}",
                        p.name,
                        join(&p.sm_mhz, "MHz"),
                        join(&p.watts, "W")
                    )
                })
                .collect();
            format!("- {} {}: {}\n", r.preset, r.schedule, items.join("; "))
        })
        .collect()
}

/// Per preset: the fastest schedule and the issue's three conditions on it.
pub fn verdicts(records: &[Record]) -> String {
    let mut out = String::new();
    let mut names: Vec<&str> = records.iter().map(|r| r.preset.as_str()).collect();
    names.dedup();
    for preset in names {
        let best = records
            .iter()
            .filter(|r| r.preset == preset && !r.schedule.starts_with("auto"))
            .filter_map(|r| r.distgemm_ms.map(|d| (d, r)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((d, r)) = best else {
            out.push_str(&format!("- {preset}: no distgemm time\n"));
            continue;
        };
        let best_e = records
            .iter()
            .filter(|x| x.preset == preset)
            .filter_map(|x| x.nccl_cublas_ms)
            .fold(f64::INFINITY, f64::min);
        // PyTorch's best op, with the local matmul it took turns with.
        let best_f = records
            .iter()
            .filter(|x| x.preset == preset)
            .filter_map(|x| x.torch_async_tp_ms.map(|f| (f, x.torch_matmul_local_ms)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let (best_f, torch_local) = best_f.unwrap_or((f64::INFINITY, None));
        let check = |ok: bool| if ok { "yes" } else { "NO" };
        let b = r.single_stage_nocomm_ms;
        // What each adds over its own GEMM on the device-local problem: the price of the
        // distributed machinery, with the GEMM kernels' own speeds taken out.
        let over = |t: f64, local: Option<f64>| {
            local.map_or("—".into(), |l| format!("{:+.1} %", 100.0 * (t / l - 1.0)))
        };
        let overheads = if best_f.is_finite() {
            format!(
                "; over its own local GEMM: distgemm {} (of (b)), PyTorch {} (of its local matmul)",
                over(d, b),
                over(best_f, torch_local)
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "- {preset}: best schedule {} at {d:.3} ms; ≤ 1.03 × (b) ({}): {}; faster than the best (e) ({}): {}; no slower than the best (f) ({}): {}{overheads}\n",
            r.schedule,
            ms(b),
            b.map_or("unknown", |b| check(d <= NOISE * b)),
            if best_e.is_finite() { format!("{best_e:.3}") } else { "—".into() },
            if best_e.is_finite() { check(d < best_e) } else { "unknown" },
            if best_f.is_finite() { format!("{best_f:.3}") } else { "—".into() },
            if best_f.is_finite() { check(d <= best_f) } else { "unknown" },
        ));
    }
    out
}

// ------------------------------------------------------------------------------------------
// PyTorch peer (subprocess; parsing is pure)
// ------------------------------------------------------------------------------------------

/// Times (or errors) of the PyTorch script, keyed by (preset, M, op).
#[derive(Debug, Default, Clone)]
pub struct TorchResults {
    /// Set when the script could not run at all.
    pub failure: Option<String>,
    pub entries: HashMap<(String, usize, String), Result<f64, String>>,
    pub info: Option<serde_json::Value>,
}

impl TorchResults {
    pub fn failed(reason: String) -> Self {
        TorchResults {
            failure: Some(reason),
            ..Default::default()
        }
    }

    /// Parses the script's stdout: one JSON object per line; other lines are ignored.
    pub fn parse(stdout: &str) -> Self {
        let mut r = TorchResults::default();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
                continue;
            };
            let op = v["op"].as_str().unwrap_or_default().to_owned();
            match op.as_str() {
                "info" => r.info = Some(v),
                "setup" => {
                    let e = v["error"].as_str().unwrap_or("setup failed").to_owned();
                    r.failure = Some(match r.failure.take() {
                        Some(prev) => format!("{prev}; {e}"),
                        None => e,
                    });
                }
                _ => {
                    let (Some(preset), Some(m)) = (v["preset"].as_str(), v["m"].as_u64()) else {
                        continue;
                    };
                    let value = match (v["ms"].as_f64(), v["error"].as_str()) {
                        (_, Some(e)) => Err(format!("PyTorch: {e}")),
                        (Some(t), None) => Ok(t),
                        (None, None) => Err("PyTorch record without ms".into()),
                    };
                    r.entries.insert((preset.to_owned(), m as usize, op), value);
                }
            }
        }
        r
    }

    pub fn get(&self, preset: &str, m: usize, op: &str) -> Result<f64, String> {
        if let Some(v) = self.entries.get(&(preset.to_owned(), m, op.to_owned())) {
            return v.clone();
        }
        Err(match &self.failure {
            Some(f) => format!("PyTorch peer did not run: {f}"),
            None => format!("PyTorch script printed no record for {preset} M={m} {op}"),
        })
    }
}

/// Runs a peer benchmark command (stdout piped, one JSON object per line, echoed with a
/// `torch:` prefix) and parses what it printed. The command gets its own process group, so
/// that after `timeout` the whole group (the script and every worker it spawned) is killed.
/// Never fails: a spawn error, a non-zero exit or a timeout is recorded in `failure`, and the
/// records printed before it are kept.
pub fn run_peer_command(mut cmd: Command, timeout: Duration, timeout_flag: &str) -> TorchResults {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    cmd.stdout(Stdio::piped());
    cmd.process_group(0);
    let program = cmd.get_program().to_string_lossy().into_owned();
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return TorchResults::failed(format!("cannot start {program}: {e}")),
    };
    let pid = child.id();
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return TorchResults::failed("no stdout pipe".into());
    };
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("   torch: {line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > timeout => {
                timed_out = true;
                // The whole process group this command leads (its id is the child's pid).
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => break None,
        }
    };
    let text = reader.join().unwrap_or_default();
    let mut r = TorchResults::parse(&text);
    let why = if timed_out {
        Some(format!(
            "timed out after {} s ({timeout_flag})",
            timeout.as_secs()
        ))
    } else {
        match status {
            Some(s) if s.success() => None,
            Some(s) => Some(format!("{program} exited with {s}")),
            None => Some(format!("could not wait for {program}")),
        }
    };
    if let Some(why) = why {
        r.failure = Some(match r.failure.take() {
            Some(prev) => format!("{prev}; {why}"),
            None => why,
        });
    }
    println!(
        "== peer finished in {:.1} s{}",
        started.elapsed().as_secs_f64(),
        r.failure
            .as_ref()
            .map_or(String::new(), |f| format!(" ({f})"))
    );
    r
}

/// Where `peers/torch_async_tp.py` is.
pub fn find_peer_script() -> Result<PathBuf, String> {
    let name = "torch_async_tp.py";
    let mut tried = Vec::new();
    if let Some(dir) = std::env::var_os("DISTGEMM_PEERS_DIR").filter(|d| !d.is_empty()) {
        tried.push(PathBuf::from(dir).join(name));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join("../peers").join(name));
    }
    tried.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("peers")
            .join(name),
    );
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "{name} not found (tried {}); set DISTGEMM_PEERS_DIR",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub fn row_id(preset: Preset, sched: Sched) -> String {
    format!("distgemm/{}/{}", preset.name(), sched.name())
}

pub fn missing_notes(records: &[Record]) -> String {
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in records {
        for (col, why) in &r.missing {
            reasons
                .entry(why.clone())
                .or_default()
                .push(format!("{}/{} {col}", r.preset, r.schedule));
        }
    }
    let mut out = String::new();
    for (why, where_) in reasons {
        let shown: Vec<&str> = where_.iter().take(4).map(String::as_str).collect();
        out.push_str(&format!(
            "- {why} ({}{})\n",
            shown.join(", "),
            if where_.len() > 4 {
                format!(", … {} in all", where_.len())
            } else {
                String::new()
            }
        ));
    }
    out
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepPoint {
    pub preset: String,
    pub tp: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: String,
    /// The family judged (the preset's natural one: `ag-a` for fc1, `rs-a` for fc2).
    pub family: String,
    /// Every fixed schedule's distgemm time (null: not measured, see `missing`).
    pub schedules_ms: BTreeMap<String, Option<f64>>,
    /// Fastest pipelined schedule of any family.
    pub best_pipelined: Option<String>,
    pub best_pipelined_ms: Option<f64>,
    /// The family's pipelined and single-stage schedules.
    pub family_pipelined_ms: Option<f64>,
    pub family_single_stage_ms: Option<f64>,
    /// What `Auto` picks for the family, and that schedule's time.
    pub auto_choice: Option<String>,
    pub auto_ms: Option<f64>,
    /// (e) for the family's collective.
    pub nccl_cublas_variant: String,
    pub nccl_cublas_ms: Option<f64>,
    /// The family's pipelined schedule beats both its single-stage variant and (e).
    pub pipelining_pays: Option<bool>,
    /// `Auto` is within 3 % of the fastest of: the family's two schedules and (e).
    pub auto_follows: Option<bool>,
    pub missing: BTreeMap<String, String>,
    pub machine: String,
    pub commit: String,
    pub date: String,
}

impl SweepPoint {
    /// Fills the best-of and verdict fields from `schedules_ms`, `auto_choice` and
    /// `nccl_cublas_ms`.
    pub fn derive(&mut self) {
        let time = |name: &str| self.schedules_ms.get(name).copied().flatten();
        self.best_pipelined = None;
        self.best_pipelined_ms = None;
        if let Some((t, name)) = ScheduleKind::ALL
            .iter()
            .filter(|k| k.is_pipelined())
            .filter_map(|k| time(k.cli_name()).map(|t| (t, k.cli_name())))
            .min_by(|a, b| a.0.total_cmp(&b.0))
        {
            self.best_pipelined_ms = Some(t);
            self.best_pipelined = Some(name.to_owned());
        }
        let family = ScheduleKind::ALL
            .iter()
            .find(|k| k.cli_name() == self.family)
            .copied();
        self.family_pipelined_ms = family.and_then(|f| time(pipelined_of(f).cli_name()));
        self.family_single_stage_ms = family.and_then(|f| time(single_stage_of(f).cli_name()));
        self.auto_ms = self.auto_choice.as_deref().and_then(time);
        let alternative = [self.family_single_stage_ms, self.nccl_cublas_ms]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        self.pipelining_pays = match self.family_pipelined_ms {
            Some(p) if alternative.is_finite() => Some(p < alternative),
            _ => None,
        };
        let fastest = alternative.min(self.family_pipelined_ms.unwrap_or(f64::INFINITY));
        self.auto_follows = match self.auto_ms {
            Some(a) if fastest.is_finite() => Some(a <= NOISE * fastest),
            _ => None,
        };
    }
}

/// The smallest M from which pipelining pays at every larger measured M (None if it never
/// does at the largest M). Points must be sorted by M.
pub fn pipelining_threshold(points: &[(usize, Option<bool>)]) -> Option<usize> {
    let mut threshold = None;
    for &(m, pays) in points.iter().rev() {
        match pays {
            Some(true) => threshold = Some(m),
            Some(false) => break,
            None => continue,
        }
    }
    threshold
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
    fn power_split_lists_every_contender_per_device() {
        let power = vec![
            ContenderPower {
                name: "(c)".into(),
                sm_mhz: vec![1470.4, 1489.6],
                watts: vec![699.0, 688.2],
            },
            ContenderPower {
                name: "(d) ag-a".into(),
                sm_mhz: vec![1430.0, 1431.0],
                watts: vec![700.0, 655.0],
            },
        ];
        let rows = [
            Record {
                preset: "p".into(),
                schedule: "ag-a".into(),
                power,
                ..Default::default()
            },
            Record {
                preset: "p".into(),
                schedule: "ag-a-single".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            power_split(&rows),
            "- p ag-a: (c) 1470/1490 MHz, 699/688 W; (d) ag-a 1430/1431 MHz, 700/655 W\n"
        );
    }

    #[test]
    fn overhead_split_lists_rows_with_diagnostics() {
        let row = |schedule: &str, capped: Option<f64>| Record {
            preset: "p".into(),
            schedule: schedule.into(),
            pipelined_nocomm_ms: Some(10.0),
            distgemm_ms: Some(10.3),
            diagnostics: capped
                .map(|ms| Diagnostic {
                    name: "cut".into(),
                    ms,
                    device_medians_ms: vec![ms, ms - 0.05],
                })
                .into_iter()
                .collect(),
            device_medians_ms: DeviceMedians {
                single_stage_nocomm: vec![9.9, 10.0],
                pipelined_nocomm: vec![9.95, 10.0],
                distgemm: vec![10.3, 10.29],
            },
            ..Default::default()
        };
        assert_eq!(
            overhead_split(&[row("ag-a", Some(10.1)), row("rs-a", None)]),
            "- p ag-a: (c) 10.000 ms [9.950/10.000]; cut 10.100 ms (+1.0 %) [10.100/10.050]; \
             (d) 10.300 ms (+3.0 %) [10.300/10.290]\n"
        );
    }

    #[test]
    fn families_map_to_their_single_stage_pipelined_and_baselines() {
        use ScheduleKind::*;
        for k in ScheduleKind::ALL {
            assert!(!single_stage_of(k).is_pipelined(), "{k}");
            assert!(pipelined_of(k).is_pipelined(), "{k}");
            assert_eq!(single_stage_of(k).collective(), k.collective());
            assert_eq!(pipelined_of(k).tiles_rows(), k.tiles_rows());
        }
        assert_eq!(nccl_kind_of(AllGatherRotatingA), NcclGemmKind::AllGatherA);
        assert_eq!(
            nccl_kind_of(AllGatherSingleStageB),
            NcclGemmKind::AllGatherB
        );
        assert_eq!(
            nccl_kind_of(ReduceScatterTilingB),
            NcclGemmKind::ReduceScatter
        );
        assert_eq!(torch_op_of(ReduceScatterSingleStageA), TORCH_RS);
        assert_eq!(Sched::all().len(), 12);
        assert_eq!(Sched::Auto(AllGatherRotatingB).name(), "auto(ag-b)");
        assert_eq!(
            Sched::Auto(ReduceScatterTilingA).family(),
            ReduceScatterTilingA
        );
        assert_eq!(
            Sched::Fixed(AllGatherSingleStageA).family(),
            AllGatherRotatingA
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

    #[test]
    fn torch_output_is_parsed_with_errors_and_junk() {
        let out = r#"{"op": "info", "torch": "2.11.0"}
NCCL INFO something
{"preset": "llama3-70b-fc1", "m": 16384, "op": "fused_all_gather_matmul", "ms": 12.5}
{"preset": "llama3-70b-fc2", "m": 16384, "op": "fused_matmul_reduce_scatter", "error": "RuntimeError: no"}
"#;
        let t = TorchResults::parse(out);
        assert_eq!(t.get("llama3-70b-fc1", 16384, TORCH_AG), Ok(12.5));
        assert!(
            t.get("llama3-70b-fc2", 16384, TORCH_RS)
                .unwrap_err()
                .contains("RuntimeError: no")
        );
        assert!(
            t.get("llama3-405b-fc1", 16384, TORCH_AG)
                .unwrap_err()
                .contains("no record")
        );
        assert!(t.info.is_some() && t.failure.is_none());
        let t = TorchResults::parse(r#"{"op": "setup", "error": "cannot import torch"}"#);
        assert!(
            t.get("llama3-70b-fc1", 16384, TORCH_AG)
                .unwrap_err()
                .contains("cannot import torch")
        );
    }

    #[test]
    fn peer_command_output_exit_status_and_timeout() {
        let sh = |script: &str| {
            let mut c = Command::new("sh");
            c.arg("-c").arg(script);
            c
        };
        let r = run_peer_command(
            sh(r#"echo '{"preset": "p", "m": 8, "op": "fused_all_gather_matmul", "ms": 1.5}'"#),
            Duration::from_secs(20),
            "--t",
        );
        assert_eq!(r.get("p", 8, TORCH_AG), Ok(1.5));
        assert!(r.failure.is_none());
        let r = run_peer_command(
            sh(
                r#"echo '{"preset": "p", "m": 8, "op": "fused_all_gather_matmul", "ms": 2}'; exit 3"#,
            ),
            Duration::from_secs(20),
            "--t",
        );
        assert_eq!(r.get("p", 8, TORCH_AG), Ok(2.0));
        assert!(r.failure.as_deref().unwrap().contains("exit"), "{r:?}");
        // A hung script with a hung child (like torch.multiprocessing workers): both are
        // killed, and the records printed before the hang are kept.
        let started = Instant::now();
        let r = run_peer_command(
            sh(
                r#"echo '{"preset": "p", "m": 8, "op": "fused_matmul_reduce_scatter", "ms": 3}'; sleep 60 & sleep 60"#,
            ),
            Duration::from_secs(1),
            "--t",
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(r.get("p", 8, TORCH_RS), Ok(3.0));
        assert!(
            r.failure
                .as_deref()
                .unwrap()
                .contains("timed out after 1 s (--t)")
        );
        let r = run_peer_command(
            Command::new("/nonexistent/python3"),
            Duration::from_secs(1),
            "--t",
        );
        assert!(r.failure.as_deref().unwrap().contains("cannot start"));
    }

    #[test]
    fn derived_columns() {
        let mut r = Record {
            m: 16384,
            n: 57344,
            k: 8192,
            tp: 2,
            distgemm_ms: Some(12.0),
            single_stage_nocomm_ms: Some(11.0),
            pipelined_nocomm_ms: Some(11.5),
            nccl_cublas_ms: Some(13.2),
            torch_async_tp_ms: Some(12.6),
            ..Default::default()
        };
        r.derive();
        let tflops = 2.0 * 16384.0 * 57344.0 * 8192.0 / 2.0 / 12e-3 / 1e12;
        assert!((r.distgemm_tflops_per_gpu.unwrap() - tflops).abs() < 1e-9);
        assert!((r.pct_of_single_stage.unwrap() - 100.0 * 11.0 / 12.0).abs() < 1e-9);
        assert!((r.speedup_vs_nccl_cublas.unwrap() - 1.1).abs() < 1e-9);
        assert!((r.speedup_vs_torch_async_tp.unwrap() - 1.05).abs() < 1e-9);
        let row = table_row(&r);
        assert!(row.contains("| 12.000 |") && row.contains("1.10×"), "{row}");
        let mut none = Record::default();
        none.derive();
        assert!(none.distgemm_tflops_per_gpu.is_none());
        let json = serde_json::to_value(&none).unwrap();
        for key in [
            "preset",
            "tp",
            "schedule",
            "m",
            "n",
            "k",
            "dtype",
            "distgemm_ms",
            "single_stage_nocomm_ms",
            "pipelined_nocomm_ms",
            "nccl_cublas_ms",
            "torch_async_tp_ms",
            "machine",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn verdicts_name_the_best_schedule() {
        let rec = |s: &str, d: f64, b: f64| Record {
            preset: "p".into(),
            schedule: s.into(),
            distgemm_ms: Some(d),
            single_stage_nocomm_ms: Some(b),
            nccl_cublas_ms: Some(10.0),
            torch_async_tp_ms: Some(9.0),
            ..Default::default()
        };
        let mut a = rec("ag-a", 9.5, 9.4);
        a.torch_matmul_local_ms = Some(8.0);
        let v = verdicts(&[a, rec("ag-b", 9.9, 9.0)]);
        assert!(v.contains("best schedule ag-a at 9.500"), "{v}");
        assert!(v.contains("≤ 1.03 × (b) (9.400): yes"), "{v}");
        assert!(v.contains("no slower than the best (f) (9.000): NO"), "{v}");
        // 9.5 / 9.4 and 9.0 / 8.0.
        assert!(
            v.contains("distgemm +1.1 % (of (b)), PyTorch +12.5 % (of its local matmul)"),
            "{v}"
        );
    }

    #[test]
    fn sweep_verdicts() {
        let mut p = SweepPoint {
            family: "ag-a".into(),
            ..Default::default()
        };
        p.schedules_ms.insert("ag-a".into(), Some(10.0));
        p.schedules_ms.insert("ag-b".into(), Some(9.0));
        p.schedules_ms.insert("ag-a-single".into(), Some(10.5));
        p.schedules_ms.insert("rs-a".into(), None);
        p.nccl_cublas_ms = Some(12.0);
        p.auto_choice = Some("ag-a".into());
        p.derive();
        assert_eq!(p.best_pipelined.as_deref(), Some("ag-b"));
        assert_eq!(p.family_pipelined_ms, Some(10.0));
        assert_eq!(p.family_single_stage_ms, Some(10.5));
        assert_eq!((p.pipelining_pays, p.auto_ms), (Some(true), Some(10.0)));
        assert_eq!(p.auto_follows, Some(true));
        p.auto_choice = Some("ag-a-single".into());
        p.derive();
        assert_eq!(p.auto_follows, Some(false));
        p.nccl_cublas_ms = Some(9.5);
        p.derive();
        assert_eq!(p.pipelining_pays, Some(false));

        assert_eq!(
            pipelining_threshold(&[
                (256, Some(false)),
                (512, Some(true)),
                (1024, Some(false)),
                (2048, Some(true)),
                (4096, None),
                (8192, Some(true)),
            ]),
            Some(2048)
        );
        assert_eq!(
            pipelining_threshold(&[(256, Some(true)), (512, Some(false))]),
            None
        );
        assert_eq!(pipelining_threshold(&[(256, None)]), None);
    }

    #[test]
    fn the_peer_script_is_found_in_the_source_tree() {
        if std::env::var_os("DISTGEMM_PEERS_DIR").is_none() {
            let p = find_peer_script().unwrap();
            assert!(p.ends_with("peers/torch_async_tp.py"), "{}", p.display());
        }
    }
}
