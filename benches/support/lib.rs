//! Shared helpers of the benchmarks: timing, cache hygiene, provenance and result files.
//!
//! Method: random inputs, warm-up launches, then at least
//! [`MIN_TIMED_REPS`] repetitions each timed with a pair of CUDA events on the benchmark's
//! stream(s); the median is reported with min and max. The timing core ([`Timing`], the event
//! loop behind [`time_on_streams`], [`max_over_devices`], the [`interleaved`] rounds) is
//! `distgemm::timing`, shared with
//! the `distgemm bench` command; this crate adds the repetition minimum. Inputs rotate
//! through enough distinct sets that together exceed three times the L2 cache
//! ([`RotatingInputs`]), so no repetition finds its operands in L2 from the previous one. Every record carries the GPU, driver,
//! commit and date, and results are written as JSON (for tools) and a markdown table (for
//! people) under `benches/results/`.

pub mod distgemm_report;
pub mod energy;

use distgemm::dtype::Element;
use distgemm::gemm::GemmArgs;
use distgemm::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module, RuntimeError, driver_version,
};
use distgemm::testdata::fill_normal;
pub use distgemm::timing::{Timing, TimingConfig, TimingError, interleaved, max_over_devices};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fewest timed repetitions a measurement may use.
pub const MIN_TIMED_REPS: usize = 20;

/// The operands of one dense `m × n × k` GEMM on one GPU: A (m × k) and B (n × k) filled with
/// N(0, 1)-like values on the GPU (seeds `seeds`), D (m × n) left as allocated.
pub struct DenseOperands<T: DeviceCopy> {
    /// m × k.
    pub a: DeviceBuffer<T>,
    /// n × k.
    pub b: DeviceBuffer<T>,
    /// m × n.
    pub d: DeviceBuffer<T>,
    shape: (u64, u64, u64),
}

impl<T: Element + DeviceCopy> DenseOperands<T> {
    /// Allocates on `module`'s GPU and fills A and B on `stream`.
    pub fn new(
        module: &Arc<Module>,
        stream: &CudaStream,
        (m, n, k): (u64, u64, u64),
        seeds: (u32, u32),
    ) -> Result<Self, RuntimeError> {
        let gpu = module.gpu();
        let mut a = DeviceBuffer::<T>::alloc(gpu, (m * k) as usize)?;
        let mut b = DeviceBuffer::<T>::alloc(gpu, (n * k) as usize)?;
        let d = DeviceBuffer::<T>::alloc(gpu, (m * n) as usize)?;
        fill_normal(module, stream, &mut a, seeds.0)?;
        fill_normal(module, stream, &mut b, seeds.1)?;
        Ok(DenseOperands {
            a,
            b,
            d,
            shape: (m, n, k),
        })
    }

    /// `D = A · Bᵀ` over these buffers, for our kernel.
    pub fn args(&self) -> GemmArgs {
        GemmArgs::dense(
            T::DTYPE,
            self.a.device_ptr(),
            self.b.device_ptr(),
            self.d.device_ptr(),
            self.shape,
        )
    }
}

/// The flags `cargo bench` and the bundle's runner (`run-gpu-tests.sh`) pass every benchmark,
/// flattened into each one's command line.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct RunnerFlags {
    /// Passed by `cargo bench` and the bundle's runner; ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// List the benchmark (`run-gpu-tests.sh --list`), as libtest does, and exit.
    #[arg(long, hide = true)]
    list: bool,
}

impl RunnerFlags {
    /// With `--list`: prints `<name>: bench` (libtest's format) and returns true, and the
    /// benchmark exits without running.
    pub fn listed(&self, name: &str) -> bool {
        if self.list {
            println!("{name}: bench");
        }
        self.list
    }
}

/// `--reps`: a whole number of timed repetitions, at least [`MIN_TIMED_REPS`] (a clap value
/// parser).
pub fn parse_reps(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(r) if r >= MIN_TIMED_REPS => Ok(r),
        Ok(r) => Err(format!("{r}: use at least {MIN_TIMED_REPS}")),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// How many times the L2 size the rotating input sets must exceed together.
pub const L2_MULTIPLE: u64 = 3;

/// Errors of the benchmark harness. A [`TimingError`] becomes `Runtime` (a driver error) or
/// `Config` (bad timing parameters).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A runtime (driver) error.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The work being timed failed.
    #[error("the timed work failed: {0}")]
    Work(String),
    /// Bad harness parameters.
    #[error("benchmark configuration: {0}")]
    Config(String),
    /// Writing results failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Encoding results failed.
    #[error("encoding results as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<TimingError> for BenchError {
    fn from(e: TimingError) -> Self {
        match e {
            TimingError::Runtime(e) => BenchError::Runtime(e),
            other => BenchError::Config(other.to_string()),
        }
    }
}

/// Times `enqueue`, which puts one repetition's work on `stream` (it gets the repetition
/// index, counting warm-up, for picking a rotating input set): [`time_on_streams`] on one GPU.
pub fn time_on_stream<F>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    config: TimingConfig,
    enqueue: F,
) -> Result<Timing, BenchError>
where
    F: FnMut(usize) -> Result<(), BenchError>,
{
    time_on_streams(
        std::slice::from_ref(gpu),
        std::slice::from_ref(stream),
        config,
        enqueue,
    )
}

/// [`distgemm::timing::time_on_streams`] (events on every stream, no host wait between
/// repetitions, a repetition's time = the slowest device's) with the benchmarks' rule of at
/// least [`MIN_TIMED_REPS`] timed repetitions.
pub fn time_on_streams<F>(
    gpus: &[Gpu],
    streams: &[Arc<CudaStream>],
    config: TimingConfig,
    enqueue: F,
) -> Result<Timing, BenchError>
where
    F: FnMut(usize) -> Result<(), BenchError>,
{
    if config.reps < MIN_TIMED_REPS {
        return Err(BenchError::Config(format!(
            "{} timed repetitions requested; use at least {MIN_TIMED_REPS}",
            config.reps
        )));
    }
    distgemm::timing::time_on_streams(gpus, streams, config, enqueue)
}

/// Interleaved timing rounds per comparison.
pub const ROUNDS: usize = 3;

/// Achieved TFLOP/s of a GEMM `m × n × k` (2·M·N·K flops) taking `ms` milliseconds.
pub fn gemm_tflops(m: u64, n: u64, k: u64, ms: f64) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12
}

/// How many input sets of `bytes_per_set` bytes rotate so that together they exceed
/// [`L2_MULTIPLE`] × `l2_bytes` (at least 2, so consecutive repetitions never share a set).
pub fn rotation_count(bytes_per_set: u64, l2_bytes: u64) -> usize {
    let target = L2_MULTIPLE.saturating_mul(l2_bytes);
    let n = (target / bytes_per_set.max(1)) + 1;
    usize::try_from(n.max(2)).unwrap_or(usize::MAX)
}

/// Input sets used in turn, enough of them that their total exceeds 3× L2.
#[derive(Debug)]
pub struct RotatingInputs<S> {
    sets: Vec<S>,
}

impl<S> RotatingInputs<S> {
    /// Makes [`rotation_count`]`(bytes_per_set, gpu L2)` sets with `make(index)`.
    pub fn new<F>(gpu: &Gpu, bytes_per_set: u64, make: F) -> Result<Self, BenchError>
    where
        F: FnMut(usize) -> Result<S, BenchError>,
    {
        let count = rotation_count(bytes_per_set, u64::from(gpu.l2_cache_bytes()));
        Ok(RotatingInputs {
            sets: (0..count).map(make).collect::<Result<_, _>>()?,
        })
    }

    /// The set for repetition `rep`.
    pub fn get(&self, rep: usize) -> &S {
        &self.sets[rep % self.sets.len()]
    }

    /// Number of sets.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// Whether there are no sets (never, after `new`).
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }
}

/// Where and on what a benchmark ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// GPU name, e.g. "NVIDIA H200".
    pub gpu: String,
    /// NVIDIA driver version (from `/proc/driver/nvidia/version`) and CUDA version.
    pub driver: String,
    /// Git commit of the code measured.
    pub commit: String,
    /// UTC date and time, ISO 8601.
    pub date: String,
}

impl Provenance {
    /// Describes this run on `gpu`.
    pub fn collect(gpu: &Gpu) -> Self {
        let cuda = driver_version().map_or_else(|_| "CUDA unknown".to_owned(), |v| v.to_string());
        let driver = match nvidia_driver_version() {
            Some(v) => format!("{v} ({cuda})"),
            None => cuda,
        };
        Provenance {
            gpu: gpu.name().to_owned(),
            driver,
            commit: git_commit(),
            date: utc_now(),
        }
    }
}

/// The kernel module's driver version, e.g. "580.159.04", if Linux exposes it.
pub fn nvidia_driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_nvidia_driver_version(&text)
}

/// Extracts the version from `/proc/driver/nvidia/version` text
/// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ...").
fn parse_nvidia_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    line.split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_owned)
}

/// The commit measured: `DISTGEMM_COMMIT` at run time, else at build time (the bundle sets it),
/// else `git rev-parse --short=12 HEAD`, else "unknown".
pub fn git_commit() -> String {
    if let Some(c) = std::env::var("DISTGEMM_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return c;
    }
    if let Some(c) = option_env!("DISTGEMM_COMMIT").filter(|c| !c.is_empty()) {
        return c.to_owned();
    }
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Formats seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian;
/// days-to-civil conversion after H. Hinnant's `civil_from_days`).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// Benchmark name, e.g. "gemm".
    pub bench: String,
    /// What was measured, e.g. "distgemm" or "cublaslt".
    pub variant: String,
    /// Element type, e.g. "bf16".
    pub dtype: String,
    /// GEMM rows.
    pub m: u64,
    /// GEMM columns.
    pub n: u64,
    /// GEMM reduction.
    pub k: u64,
    /// Median time.
    pub median_ms: f64,
    /// Fastest repetition.
    pub min_ms: f64,
    /// Slowest repetition.
    pub max_ms: f64,
    /// Timed repetitions.
    pub reps: usize,
    /// TFLOP/s at the median time.
    pub tflops: f64,
    /// Where and when it ran.
    pub provenance: Provenance,
    /// Free-form remarks (settings, caveats).
    #[serde(default)]
    pub notes: String,
}

impl BenchRecord {
    /// A GEMM record from a timing (TFLOP/s from the median).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        bench: &str,
        variant: &str,
        dtype: &str,
        (m, n, k): (u64, u64, u64),
        timing: &Timing,
        provenance: &Provenance,
        notes: &str,
    ) -> Self {
        BenchRecord {
            bench: bench.to_owned(),
            variant: variant.to_owned(),
            dtype: dtype.to_owned(),
            m,
            n,
            k,
            median_ms: timing.median_ms,
            min_ms: timing.min_ms,
            max_ms: timing.max_ms,
            reps: timing.samples_ms.len(),
            tflops: gemm_tflops(m, n, k, timing.median_ms),
            provenance: provenance.clone(),
            notes: notes.to_owned(),
        }
    }
}

/// A markdown table of `records`.
pub fn markdown_table(records: &[BenchRecord]) -> String {
    let mut out = String::from(
        "| bench | variant | dtype | M | N | K | median ms | min ms | max ms | reps | TFLOP/s | GPU | driver | commit | date | notes |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|\n",
    );
    for r in records {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {:.4} | {} | {:.1} | {} | {} | {} | {} | {} |\n",
            r.bench,
            r.variant,
            r.dtype,
            r.m,
            r.n,
            r.k,
            r.median_ms,
            r.min_ms,
            r.max_ms,
            r.reps,
            r.tflops,
            r.provenance.gpu,
            r.provenance.driver,
            r.provenance.commit,
            r.provenance.date,
            r.notes.replace('|', "\\|"),
        ));
    }
    out
}

/// The results folder: `DISTGEMM_BENCH_RESULTS` if set (bundles run away from the source
/// tree), else `benches/results` of this checkout.
pub fn results_dir() -> PathBuf {
    std::env::var_os("DISTGEMM_BENCH_RESULTS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"))
}

/// Writes `records` to `<dir>/<stem>.json` and `<dir>/<stem>.md`; returns both paths.
pub fn write_results(
    dir: &Path,
    stem: &str,
    records: &[BenchRecord],
) -> Result<(PathBuf, PathBuf), BenchError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = dir.join(format!("{stem}.json"));
    let md = dir.join(format!("{stem}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(records)? + "\n").map_err(io(&json))?;
    std::fs::write(&md, markdown_table(records)).map_err(io(&md))?;
    Ok((json, md))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tflops_of_a_square_gemm() {
        // 2 · 8192³ flops in 1.1 ms ≈ 999.5 TFLOP/s.
        let t = gemm_tflops(8192, 8192, 8192, 1.1);
        assert!((t - 999.5).abs() < 0.1, "{t}");
    }

    #[test]
    fn rotation_exceeds_three_times_l2() {
        let l2 = 60 * 1024 * 1024;
        for bytes in [1u64, 1 << 20, 96 << 20, 200 << 20, 1 << 40] {
            let n = rotation_count(bytes, l2) as u64;
            assert!(n >= 2);
            assert!(n * bytes > 3 * l2, "{bytes} B × {n}");
        }
        assert_eq!(rotation_count(96 << 20, l2), 2);
        assert_eq!(rotation_count(32 << 20, l2), 6);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_796_041_845), "2026-11-30T12:30:45Z");
    }

    #[test]
    fn nvidia_driver_version_is_parsed() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct 14 2025\n\
                    GCC version:  gcc version 12.2.0";
        assert_eq!(
            parse_nvidia_driver_version(text).as_deref(),
            Some("580.159.04")
        );
        assert_eq!(parse_nvidia_driver_version("nothing"), None);
    }

    #[test]
    fn results_round_trip_through_json_and_markdown() {
        let p = Provenance {
            gpu: "NVIDIA H200".into(),
            driver: "580.159.04 (CUDA 13.0)".into(),
            commit: "abc".into(),
            date: "2026-11-30T00:00:00Z".into(),
        };
        let t = Timing::from_samples(vec![1.0; 20]).unwrap();
        let r = BenchRecord::gemm(
            "gemm",
            "cublaslt",
            "bf16",
            (8192, 8192, 8192),
            &t,
            &p,
            "a|b",
        );
        let dir = std::env::temp_dir().join(format!("distgemm-bench-test-{}", std::process::id()));
        let (json, md) = write_results(&dir, "t", std::slice::from_ref(&r)).unwrap();
        let back: Vec<BenchRecord> =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(back, vec![r]);
        let table = std::fs::read_to_string(md).unwrap();
        assert!(table.contains("| gemm | cublaslt | bf16 | 8192 |") && table.contains("a\\|b"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
