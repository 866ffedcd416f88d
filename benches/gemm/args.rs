//! `benches/gemm`'s command line.

use clap::Parser;
use distgemm::dtype::Dtype;
use distgemm::gemm::{GemmVariant, VARIANTS, variant_named};
use distgemm_benches::distgemm_report::non_negative_ms;
use distgemm_benches::{ROUNDS, RunnerFlags, parse_reps};

use crate::measure::{Extra, Inputs};
use crate::shapes::{grid_shapes, parse_shape, shape_name, shapes};

/// Default shortest timed block (ms), `--min-block-ms`.
const DEFAULT_MIN_BLOCK_MS: f64 = 100.0;

/// Default untimed work before a shape's first timed block (ms), `--settle-ms`.
pub(crate) const DEFAULT_SETTLE_MS: f64 = 200.0;

/// The longest `--min-block-ms` or `--settle-ms` (ms): a minute of one shape's launches.
const MAX_BLOCK_MS: f64 = 60_000.0;

/// The most `--rounds`: with 100 ms blocks, 4 contenders and 50 rounds a shape takes 20 s.
const MAX_ROUNDS: usize = 50;

/// Our GEMM stage kernel against cuBLASLt (see `benches/gemm/main.rs`).
#[derive(Debug, Parser)]
#[command(name = "gemm")]
pub(crate) struct Args {
    /// Only the 8192³ and stage shapes.
    #[arg(long, conflicts_with = "grid")]
    pub(crate) quick: bool,
    /// The shapes a model runs instead: decode and prefill M × the GEMMs of Llama-3 8B (TP 1),
    /// 70B (TP 2) and 405B (TP 8).
    #[arg(long)]
    pub(crate) grid: bool,
    /// These shapes instead (M×N×K, e.g. `3000x5000x4096`; comma-separated).
    #[arg(long, value_name = "MxNxK[,…]", value_delimiter = ',', value_parser = parse_shape,
          conflicts_with_all = ["quick", "grid"])]
    pub(crate) shape: Vec<(u64, u64, u64)>,
    /// A and B in e4m3 (tensor-wise scales, bf16 D) against cuBLASLt's FP8 GEMM, instead of
    /// bf16 and f16; `--variants` then means the configurations compiled for e4m3.
    #[arg(long)]
    pub(crate) fp8: bool,
    /// Also time every compiled tile configuration (the data behind the rule); one that serves
    /// fewer rows than a shape has (`16x128`) sits that shape out, as with `--variant`.
    #[arg(long, conflicts_with = "variant")]
    pub(crate) variants: bool,
    /// Also time these configurations (e.g. `128x256s,128x128s`, the split-K ones).
    #[arg(long, value_name = "NAME[,NAME…]", value_delimiter = ',', value_parser = parse_variant)]
    pub(crate) variant: Vec<&'static GemmVariant>,
    /// Also time the rule's configuration with these band heights of the tile order.
    #[arg(long, value_name = "G[,G…]", value_delimiter = ',')]
    pub(crate) raster: Vec<u32>,
    /// Also time the rule's configuration launched with programmatic dependent launch (PDL):
    /// what a caller gets who launches with the attribute, as a graph of stages does.
    #[arg(long)]
    pub(crate) pdl: bool,
    /// Also sample the SM clock (NVML, every 5 ms) while each contender's blocks run and
    /// report its mean (MHz): whether a contender ran slower than another at the same clock or
    /// at a lower one (the board's power cap sets the clock under load).
    #[arg(long)]
    pub(crate) clocks: bool,
    /// No board energy: leave NVML's energy counter unread between blocks (no "mJ" columns),
    /// so that no NVML call sits between the blocks of a shape.
    #[arg(long)]
    pub(crate) no_energy: bool,
    /// Keep only shapes whose name contains this.
    #[arg(long)]
    pub(crate) filter: Option<String>,
    /// The same as `--filter`, as `run-gpu-tests.sh --benches FILTER` passes it.
    #[arg(value_name = "FILTER", conflicts_with = "filter")]
    pub(crate) filter_word: Option<String>,
    /// Fewest timed repetitions per block (at least 20, `MIN_TIMED_REPS`).
    #[arg(long, default_value_t = 30, value_parser = parse_reps)]
    pub(crate) reps: usize,
    /// Shortest timed block, ms.
    #[arg(long, value_name = "T", default_value_t = DEFAULT_MIN_BLOCK_MS, value_parser = block_ms)]
    pub(crate) min_block_ms: f64,
    /// Untimed work before each shape's first timed block, ms: the first contender's warm-up
    /// in the first round lasts at least this long (estimated at the nominal rates).
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SETTLE_MS, value_parser = block_ms)]
    pub(crate) settle_ms: f64,
    /// Interleaved rounds per shape (each contender's median is over all of them): more
    /// rounds narrow a shape's run-to-run spread at the cost of time.
    #[arg(long, value_name = "N", default_value_t = ROUNDS, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
    #[command(flatten)]
    pub(crate) runner: RunnerFlags,
}

impl Args {
    /// The contenders timed beside the rule's configuration: `--variants` / `--variant`,
    /// row-wise scales with `--fp8`, `--raster` and `--pdl`.
    pub(crate) fn extras(&self) -> Vec<Extra> {
        let mut extra: Vec<Extra> = Vec::new();
        if self.variants {
            let compiled = |v: &&GemmVariant| !self.fp8 || v.kernel_e4m3.is_some();
            extra.extend(VARIANTS.iter().filter(compiled).map(Extra::Variant));
        }
        extra.extend(self.variant.iter().copied().map(Extra::Variant));
        if self.fp8 {
            // Issue 24 compares row-wise scales with tensor-wise ones, each on its rule's pick.
            extra.push(Extra::RowScales);
        }
        extra.extend(self.raster.iter().copied().map(Extra::Raster));
        if self.pdl {
            extra.push(Extra::Pdl);
        }
        extra
    }

    /// The element types each shape runs in: e4m3 with `--fp8`, else bf16 and f16.
    pub(crate) fn inputs(&self) -> Vec<Inputs> {
        if self.fp8 {
            vec![Inputs::E4m3]
        } else {
            Dtype::ALL.into_iter().map(Inputs::Native).collect()
        }
    }

    /// The shapes to measure, `(name, m, n, k)`: the given ones, the grid or the seed's set
    /// (with `--quick` its 8192³ and stage shapes), those whose name contains `filter`.
    pub(crate) fn shapes(&self, filter: Option<&str>) -> Vec<(String, u64, u64, u64)> {
        let all = if !self.shape.is_empty() {
            let named = |&(m, n, k): &(u64, u64, u64)| (shape_name((m, n, k)), m, n, k);
            self.shape.iter().map(named).collect()
        } else if self.grid {
            grid_shapes()
        } else {
            shapes()
        };
        all.into_iter()
            .filter(|(name, ..)| !self.quick || name.contains("square") || name.contains("stage"))
            .filter(|(name, ..)| filter.is_none_or(|f| name.contains(f)))
            .collect()
    }
}

/// A duration for `--min-block-ms` or `--settle-ms`: finite, not negative, at most
/// [`MAX_BLOCK_MS`] (larger ones would ask for more launches than the run can hold).
fn block_ms(s: &str) -> Result<f64, String> {
    let ms = non_negative_ms(s)?;
    if ms > MAX_BLOCK_MS {
        return Err(format!("'{s}': use at most {MAX_BLOCK_MS} ms"));
    }
    Ok(ms)
}

/// A count of interleaved rounds for `--rounds`: 1 to [`MAX_ROUNDS`].
fn parse_rounds(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(r) if (1..=MAX_ROUNDS).contains(&r) => Ok(r),
        Ok(r) => Err(format!("{r}: use 1 to {MAX_ROUNDS}")),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// A compiled configuration by name, for `--variant`.
fn parse_variant(name: &str) -> Result<&'static GemmVariant, String> {
    variant_named(name).ok_or_else(|| {
        let known: Vec<&str> = VARIANTS.iter().map(|v| v.name).collect();
        format!(
            "unknown configuration {name:?}; known: {}",
            known.join(", ")
        )
    })
}
