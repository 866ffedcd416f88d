//! Our GEMM stage kernel against cuBLASLt, in the same process, on the same inputs.
//!
//! Shapes: 8192³ and the Llama presets (M = 16384 tokens) as full single-GPU GEMMs, TP-local
//! GEMMs and the TP=2 / TP=8 stage GEMMs of the schedules (AG: (M/P)×(N/P)×K; RS: (M/P)×N×(K/P)),
//! in bf16 and f16. Operands are filled on the GPU with N(0, 1)-like data and rotated so that
//! their total exceeds 3× L2. Our kernel (and with `--variants` every tile configuration) and
//! cuBLASLt are timed in `--rounds` interleaved rounds (default 3; order reversed each round)
//! of warm-up launches and ≥ `--reps` repetitions (default 30), and at least `--min-block-ms`
//! (default 100 ms) of them, bracketed by CUDA events; we report the median of the blocks'
//! medians (one block a round per contender).
//! A shape's rounds start after at least `--settle-ms` (default 200 ms) of untimed launches,
//! so that its first block does not run in the boost-clock burst after the idle GPU time of
//! the shape's setup; they end with the host's synchronisation, like a block, so that the
//! first timed block starts as every other one does. Where NVML reports board energy, each
//! contender's energy per launch (mJ) is its timed blocks' energy over their launches
//! ([`distgemm_benches::energy`]): coarse, ±8 % at 0.6 s blocks, and left out ("—") where a
//! contender's blocks add up to less than a second ([`MIN_METERED`]: the grid's 40 ms blocks),
//! so raise `--min-block-ms` or `--rounds` for it.
//!
//! With `--grid`, the shapes are instead the grid of the shapes a model runs (issue 23):
//! M ∈ {1, 16, 64, 128, 512, 2048, 8192} tokens × the QKV, output-projection, fused gate+up
//! (fc1) and down-projection (fc2) GEMMs of Llama-3 8B at TP = 1, Llama-3 70B at TP = 2 and
//! Llama-3.1 405B at TP = 8, with N and K those of one rank's shard ([`grid_shapes`]); for
//! M ≤ 128, where the time goes into streaming the weights, each record also gives the rate
//! at which each contender streamed them (weight bytes over its median time, GB/s). A filter
//! picks part of the grid (`--filter 405b`, `--filter fc1`) to split it over several calls.
//!
//! With `--shape MxNxK[,…]`, the shapes are instead the ones given (`--shape
//! 3000x5000x4096,256x4096x14336`), named `MxNxK`: to measure a shape off both sets, e.g. where
//! a change of the rule moves one, with the configuration it ran before as a `--variant`.
//!
//! With `--fp8`, A and B are e4m3 (random codes, tensor-wise scales, bf16 D) and the baseline
//! is cuBLASLt's FP8 GEMM; "% of peak" is then of 1979 TFLOP/s.
//!
//! Usage: `gemm [--quick | --grid | --shape MxNxK[,…]] [--fp8] [--variants | --variant NAME[,NAME…]]
//! [--raster G[,G…]] [--pdl] [--clocks] [--no-energy] [--filter SUBSTRING | SUBSTRING] [--reps N] [--min-block-ms T]
//! [--settle-ms S] [--rounds N]`. Writes
//! `benches/results/gemm[-grid][-fp8]-<date>-<commit>[-<shapes>][-<filter>][-settle<ms>][-rounds<N>]`
//! `.{json,md}` (or under `DISTGEMM_BENCH_RESULTS`).
use clap::Parser;
use distgemm::baseline::{BaselineError, CublasLtElement, CublasLtGemm, TnGemmShape};
use distgemm::dtype::{Dtype, Element};
use distgemm::gemm::{
    Fp8GemmArgs, Fp8Scales, GemmKernel, GemmLaunchError, GemmVariant, MatrixView, PreparedGemm,
    VARIANTS, variant_named,
};
use distgemm::problem::Preset;
use distgemm::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module};
use distgemm_benches::distgemm_report::non_negative_ms;
use distgemm_benches::energy::{ClockPower, EnergyMeter, MIN_METERED, PowerSampler};
use distgemm_benches::{
    BenchError, DenseOperands, Provenance, ROUNDS, RotatingInputs, RunnerFlags, Timing,
    TimingConfig, gemm_tflops, interleaved, parse_reps, results_dir, time_on_stream,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default shortest timed block (ms), `--min-block-ms`.
const DEFAULT_MIN_BLOCK_MS: f64 = 100.0;

/// Default untimed work before a shape's first timed block (ms), `--settle-ms`.
const DEFAULT_SETTLE_MS: f64 = 200.0;

/// The longest `--min-block-ms` or `--settle-ms` (ms): a minute of one shape's launches.
const MAX_BLOCK_MS: f64 = 60_000.0;

/// The most `--rounds`: with 100 ms blocks, 4 contenders and 50 rounds a shape takes 20 s.
const MAX_ROUNDS: usize = 50;

/// How often `--clocks` reads the SM clock.
const CLOCK_SAMPLE_PERIOD: Duration = Duration::from_millis(5);

/// Rate (TFLOP/s) at which the repetitions for a block of `--min-block-ms` are estimated.
const NOMINAL_TFLOPS: f64 = 700.0;

/// Dense bf16 peak of an H100/H200 SXM (TFLOP/s), for the "% of peak" column.
const PEAK_TFLOPS: f64 = 989.0;

/// Dense FP8 peak of an H100/H200 SXM (TFLOP/s), the "% of peak" of `--fp8` records.
const PEAK_FP8_TFLOPS: f64 = 1979.0;

/// The element types a run measures: bf16 and f16, or (`--fp8`) e4m3 A and B with bf16 D.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    Native(Dtype),
    E4m3,
}

impl Inputs {
    fn name(self) -> &'static str {
        match self {
            Inputs::Native(d) => d.name(),
            Inputs::E4m3 => "e4m3",
        }
    }
    /// Bytes of A and B per element.
    fn input_bytes(self) -> u64 {
        match self {
            Inputs::Native(_) => 2,
            Inputs::E4m3 => 1,
        }
    }
    fn peak_tflops(self) -> f64 {
        match self {
            Inputs::Native(_) => PEAK_TFLOPS,
            Inputs::E4m3 => PEAK_FP8_TFLOPS,
        }
    }
}

/// Rate (GB/s) at which memory-bound blocks are estimated for `--min-block-ms` (below the
/// H200's 4.8 TB/s, so blocks come out a little longer than asked, never shorter).
const NOMINAL_GBPS: f64 = 3500.0;

/// Tokens of the `--grid` rows: decode batches up to 128, then prefill chunks.
const GRID_TOKENS: [u64; 7] = [1, 16, 64, 128, 512, 2048, 8192];

/// Largest M whose records carry the weight-streaming rate.
const WEIGHT_BOUND_MAX_M: u64 = 128;

#[derive(Debug, Serialize)]
struct Record {
    shape: String,
    m: u64,
    n: u64,
    k: u64,
    dtype: String,
    /// The tile configuration the rule picked.
    tile: String,
    ours_ms: f64,
    cublas_ms: f64,
    ours_tflops: f64,
    cublas_tflops: f64,
    ratio: f64,
    ours_pct_of_peak: f64,
    /// For M ≤ [`WEIGHT_BOUND_MAX_M`]: B's bytes (the weights) over our median time, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    ours_weight_gbps: Option<f64>,
    /// ... and over cuBLASLt's.
    #[serde(skip_serializing_if = "Option::is_none")]
    cublas_weight_gbps: Option<f64>,
    machine: String,
    driver: String,
    commit: String,
    date: String,
    /// Board energy of one launch (NVML), when available and metered for at least
    /// [`MIN_METERED`].
    ours_mj: Option<f64>,
    cublas_mj: Option<f64>,
    /// With `--variants` / `--raster`: TFLOP/s of every extra configuration.
    variant_tflops: BTreeMap<String, f64>,
    /// ... and its median time, ms (the table prints µs: decode shapes run at a few TFLOP/s,
    /// where whole TFLOP/s hide the differences).
    variant_ms: BTreeMap<String, f64>,
    /// ... and its energy per launch (mJ), when available.
    variant_mj: BTreeMap<String, f64>,
    /// With `--clocks`: the mean SM clock (MHz) NVML read while each contender's timed
    /// blocks ran, ours (the rule's pick) ...
    #[serde(skip_serializing_if = "Option::is_none")]
    ours_sm_mhz: Option<f64>,
    /// ... cuBLASLt's ...
    #[serde(skip_serializing_if = "Option::is_none")]
    cublas_sm_mhz: Option<f64>,
    /// ... and every extra configuration's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    variant_sm_mhz: BTreeMap<String, f64>,
    /// The median of each timed block of ours (the rule's pick), one a round in the order
    /// the rounds ran: drift over the rounds, or a block unlike the others, shows here
    /// (ours opens round 0, after the shape's settling launches, and each later round at the
    /// other end from the round before) ...
    ours_block_ms: Vec<f64>,
    /// ... cuBLASLt's ...
    cublas_block_ms: Vec<f64>,
    /// ... and every extra configuration's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    variant_block_ms: BTreeMap<String, Vec<f64>>,
}

/// The benchmark's shapes: (name, m, n, k).
fn shapes() -> Vec<(String, u64, u64, u64)> {
    let mut v = vec![("square 8192".to_owned(), 8192, 8192, 8192)];
    let tokens = 16384u64;
    for preset in Preset::ALL {
        let (n, k) = preset.n_k();
        let (n, k) = (n as u64, k as u64);
        let name = preset.name();
        let fc1 = name.ends_with("fc1");
        v.push((format!("{name} full"), tokens, n, k));
        for tp in [2u64, 8] {
            if fc1 {
                // All-gather of A: local GEMM M×(N/P)×K, stage (M/P)×(N/P)×K.
                v.push((format!("{name} TP{tp} local"), tokens, n / tp, k));
                v.push((format!("{name} TP{tp} stage"), tokens / tp, n / tp, k));
            } else {
                // Reduce-scatter: local GEMM M×N×(K/P), stage (M/P)×N×(K/P).
                v.push((format!("{name} TP{tp} local"), tokens, n, k / tp));
                v.push((format!("{name} TP{tp} stage"), tokens / tp, n, k / tp));
            }
        }
    }
    v
}

/// A model's dimensions and the tensor-parallel degree its grid rows use.
struct Model {
    name: &'static str,
    tp: u64,
    hidden: u64,
    /// Width of one of the two MLP projections (the fused fc1 is twice this).
    intermediate: u64,
    heads: u64,
    kv_heads: u64,
}

/// Head width of every Llama-3 model.
const HEAD_DIM: u64 = 128;

/// The models of `--grid`, each at the TP it is usually served with.
const GRID_MODELS: [Model; 3] = [
    Model {
        name: "llama3-8b",
        tp: 1,
        hidden: 4096,
        intermediate: 14336,
        heads: 32,
        kv_heads: 8,
    },
    Model {
        name: "llama3-70b",
        tp: 2,
        hidden: 8192,
        intermediate: 28672,
        heads: 64,
        kv_heads: 8,
    },
    Model {
        name: "llama3-405b",
        tp: 8,
        hidden: 16384,
        intermediate: 53248,
        heads: 128,
        kv_heads: 8,
    },
];

/// The `--grid` shapes: per model, one rank's shard of its four GEMMs (`D = A·Bᵀ`, B the
/// N × K weight) at every [`GRID_TOKENS`] M. Column-parallel layers (QKV, fc1) split N by TP,
/// row-parallel ones (output projection, fc2) split K; the KV heads are split like the query
/// heads (every TP here divides 8).
fn grid_shapes() -> Vec<(String, u64, u64, u64)> {
    let mut v = Vec::new();
    for model in &GRID_MODELS {
        let tp = model.tp;
        let qkv = (model.heads + 2 * model.kv_heads) * HEAD_DIM;
        let layers = [
            ("qkv", qkv / tp, model.hidden),
            ("o-proj", model.hidden, model.heads * HEAD_DIM / tp),
            ("fc1", 2 * model.intermediate / tp, model.hidden),
            ("fc2", model.hidden, model.intermediate / tp),
        ];
        for (layer, n, k) in layers {
            for m in GRID_TOKENS {
                v.push((format!("{} tp{tp} {layer} m{m}", model.name), m, n, k));
            }
        }
    }
    v
}

/// One input set of a shape: the operands (A and B of type `A`, D of type `O`) and our
/// prepared GEMMs on them (the rule's configuration, then each extra one).
struct Operands<A: DeviceCopy, O: DeviceCopy> {
    a: DeviceBuffer<A>,
    b: DeviceBuffer<A>,
    d: DeviceBuffer<O>,
    ours: Vec<PreparedGemm>,
    /// Row-wise scales some of `ours` read (FP8).
    _scales: Vec<DeviceBuffer<f32>>,
}

/// One contender's measurement: its timing and, where NVML reports board energy over at least
/// [`MIN_METERED`] of blocks, the energy of one launch (the energy of its timed blocks, warm-up
/// included, over their launches).
struct Measured {
    name: String,
    /// The median of its block medians (`block_ms` as one device's samples), not of its
    /// launches pooled over the rounds: in short blocks (20–40 ms) the first timed block of a
    /// shape ran 5–12 % slow whichever contender ran it, with or without NVML reads between
    /// blocks (NOTES steps 77–78); pooled, that one block moved its contender's median by up
    /// to 1.5 %, where one block out of three or more cannot move a median of the blocks.
    timing: Timing,
    mj_per_gemm: Option<f64>,
    /// With `--clocks`: the mean SM clock and board power over its blocks.
    clock: Option<ClockPower>,
    /// Median of each of its timed blocks, one a round, in the order the rounds ran.
    block_ms: Vec<f64>,
}

/// Our kernel (chosen configuration first, then each one asked for) and cuBLASLt.
type ShapeTimings = (Vec<Measured>, Measured);

/// How a shape is timed: each contender's blocks (warm-up and timed repetitions), the
/// untimed launches that open the shape before its first block (`--settle-ms` at the
/// estimated rate) and the interleaved rounds of blocks (`--rounds`).
#[derive(Clone, Copy)]
struct ShapeTiming {
    blocks: TimingConfig,
    settle: usize,
    rounds: usize,
}

/// An extra configuration of our kernel timed beside the rule's choice.
#[derive(Debug, Clone, Copy)]
enum Extra {
    /// `--variants`: a compiled tile configuration (with the rule's band height).
    Variant(&'static GemmVariant),
    /// `--raster G`: the rule's tile configuration with the tile order's band height forced.
    Raster(u32),
    /// `--fp8`: row-wise scales (all 1) instead of tensor-wise, on the rule's configuration
    /// for row-wise scales (which may differ: their epilogue costs more).
    RowScales,
    /// `--pdl`: the rule's configuration launched with programmatic stream serialization, so
    /// that each launch's blocks may start while the launch before it drains (the kernel
    /// waits with `griddepcontrol.wait` before it touches global memory).
    Pdl,
}

impl Extra {
    /// Whether this contender's launches carry the programmatic-serialization attribute.
    fn pdl(self) -> bool {
        matches!(self, Extra::Pdl)
    }
}

/// What every shape is measured with.
struct Harness {
    gpu: Gpu,
    module: Arc<Module>,
    kernel: GemmKernel,
    /// Board energy, when NVML is there.
    meter: Option<EnergyMeter>,
    extras: Vec<Extra>,
    /// `--clocks`: sample the SM clock while each timed block runs.
    clocks: bool,
}

impl Harness {
    /// The extra contenders of a shape of `m` rows: every one but the configurations that
    /// serve fewer rows (`16x128` on a prefill shape).
    fn extras_for(&self, m: u64) -> Vec<Extra> {
        self.extras
            .iter()
            .copied()
            .filter(|e| !matches!(e, Extra::Variant(v) if m > u64::from(v.config.max_rows())))
            .collect()
    }
}

/// Our GEMMs on `args` for the rule's configuration and each of `extras`, prepared by
/// `prepare` (the configuration given, or the rule's for `None`).
fn prepare_all(
    extras: &[Extra],
    prepare: impl Fn(Option<Extra>) -> Result<PreparedGemm, GemmLaunchError>,
) -> Result<Vec<PreparedGemm>, BenchError> {
    let config = |e: GemmLaunchError| BenchError::Config(e.to_string());
    let mut ours = vec![prepare(None).map_err(config)?];
    for &e in extras {
        ours.push(
            match e {
                Extra::Raster(g) => prepare(None).map(|mut p| {
                    p.set_raster_group_m(g);
                    p
                }),
                other => prepare(Some(other)),
            }
            .map_err(config)?,
        );
    }
    Ok(ours)
}

/// A bf16 or f16 GEMM: operands filled with N(0, 1) on the GPU.
fn bench_shape<T: Element + CublasLtElement + DeviceCopy>(
    h: &Harness,
    (m, n, k): (u64, u64, u64),
    timing: ShapeTiming,
) -> Result<ShapeTimings, BenchError> {
    let (module, kernel) = (&h.module, &h.kernel);
    let bytes = 2 * (m * k + n * k + m * n);
    let make = |i: usize, stream: &Arc<CudaStream>| {
        let seeds = (2 * i as u32 + 1, 2 * i as u32 + 2);
        let ops = DenseOperands::<T>::new(module, stream, (m, n, k), seeds)?;
        let args = ops.args();
        let ours = prepare_all(&h.extras_for(m), |e| match e {
            Some(Extra::Variant(v)) => kernel.prepare_variant(stream, &args, v),
            _ => kernel.prepare(stream, &args),
        })?;
        Ok(Operands {
            a: ops.a,
            b: ops.b,
            d: ops.d,
            ours,
            _scales: Vec::new(),
        })
    };
    let shape = TnGemmShape::packed(m, n, k);
    let lt = |stream| CublasLtGemm::<T>::new(&h.gpu, stream, shape);
    bench_sets(h, m, bytes, timing, make, lt)
}

/// An FP8 GEMM: A and B random e4m3 codes (no NaN) made on the host, tensor-wise scales 1
/// (and, as the extra contender [`Extra::RowScales`], row-wise scales of 1), bf16 D;
/// cuBLASLt's FP8 GEMM (tensor-wise) as the baseline.
fn bench_fp8_shape(
    h: &Harness,
    (m, n, k): (u64, u64, u64),
    timing: ShapeTiming,
) -> Result<ShapeTimings, BenchError> {
    let kernel = &h.kernel;
    let bytes = m * k + n * k + 2 * m * n;
    let make = |i: usize, stream: &Arc<CudaStream>| {
        let a = DeviceBuffer::from_host(&h.gpu, stream, &e4m3_codes(m * k, 2 * i as u64 + 1))?;
        let b = DeviceBuffer::from_host(&h.gpu, stream, &e4m3_codes(n * k, 2 * i as u64 + 2))?;
        let d = DeviceBuffer::<half::bf16>::alloc(&h.gpu, (m * n) as usize)?;
        let ones = |len: u64| DeviceBuffer::from_host(&h.gpu, stream, &vec![1.0f32; len as usize]);
        let (sa, sb) = (ones(m)?, ones(n)?);
        let args = |scales| Fp8GemmArgs {
            a: MatrixView::dense(a.device_ptr(), m, k),
            b: MatrixView::dense(b.device_ptr(), n, k),
            c: None,
            d: MatrixView::dense(d.device_ptr(), m, n),
            alpha: 1.0,
            beta: 0.0,
            scales,
        };
        let tensorwise = args(Fp8Scales::Tensorwise { a: 1.0, b: 1.0 });
        let rowwise = args(Fp8Scales::Rowwise {
            a: sa.device_ptr(),
            b: sb.device_ptr(),
        });
        let ours = prepare_all(&h.extras_for(m), |e| match e {
            Some(Extra::Variant(v)) => kernel.prepare_fp8_variant(stream, &tensorwise, v),
            Some(Extra::RowScales) => kernel.prepare_fp8(stream, &rowwise),
            _ => kernel.prepare_fp8(stream, &tensorwise),
        })?;
        Ok(Operands {
            a,
            b,
            d,
            ours,
            _scales: vec![sa, sb],
        })
    };
    let shape = TnGemmShape::packed(m, n, k);
    let lt = |stream| CublasLtGemm::<half::bf16>::new_e4m3(&h.gpu, stream, shape);
    bench_sets(h, m, bytes, timing, make, lt)
}

/// `len` random e4m3 codes, every code but the two NaNs (a SplitMix64 stream from `seed`).
fn e4m3_codes(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let code = (z >> 56) as u8;
            if code & 0x7F == 0x7F { code ^ 1 } else { code }
        })
        .collect()
}

/// Times our GEMMs and cuBLASLt on rotating input sets made by `make` (set index, stream),
/// `bytes_per_set` each, in interleaved rounds; `m` rows (which extras run).
fn bench_sets<A: DeviceCopy, O: CublasLtElement + DeviceCopy>(
    h: &Harness,
    m: u64,
    bytes_per_set: u64,
    timing: ShapeTiming,
    mut make: impl FnMut(usize, &Arc<CudaStream>) -> Result<Operands<A, O>, BenchError>,
    lt: impl FnOnce(Arc<CudaStream>) -> Result<CublasLtGemm<O>, BaselineError>,
) -> Result<ShapeTimings, BenchError> {
    let (gpu, extras) = (&h.gpu, &h.extras_for(m));
    let meter = h.meter.as_ref();
    let stream = gpu.new_stream()?;
    let sets = RotatingInputs::new(gpu, bytes_per_set, |i| make(i, &stream))?;
    let lt = lt(stream.clone()).map_err(|e| BenchError::Config(e.to_string()))?;
    // Contenders 0..=variants are ours, the last is cuBLAS, timed in interleaved rounds.
    let contenders = extras.len() + 2;
    let pdl: Vec<bool> = std::iter::once(false)
        .chain(extras.iter().map(|e| e.pdl()))
        .collect();
    // Per contender: (millijoules, launches, metered time) of its timed blocks, while NVML
    // answers.
    let mut energy = vec![meter.map(|_| (0u64, 0usize, Duration::ZERO)); contenders];
    // Per contender: the mean SM clock and power of its blocks so far (`--clocks`).
    let mut clocks = vec![h.clocks.then(ClockPower::default); contenders];
    // Per contender: each timed block's median, round by round.
    let mut block_ms = vec![Vec::new(); contenders];
    // One launch of contender `c` on input set `rep`.
    let launch = |c: usize, rep: usize| -> Result<(), BenchError> {
        let s = sets.get(rep);
        if c == contenders - 1 {
            let d = s.d.device_ptr();
            // SAFETY: the set's buffers hold the planned shape's operands on this GPU and
            // outlive the launches (`sets` lives until this function returns, after the
            // timing has synchronised).
            unsafe { lt.run_raw(s.a.device_ptr(), s.b.device_ptr(), d, d, 1.0, 0.0) }
                .map_err(|e| BenchError::Config(e.to_string()))
        } else {
            // SAFETY: each prepared GEMM points into its live input set `sets.get(rep)`.
            Ok(unsafe { s.ours[c].launch(&stream, pdl[c]) }?)
        }
    };
    // A contender's first failed block is its error; its samples are kept as `block_ms`, the
    // median of each block (what is reported: `Measured::timing`).
    let blocks = interleaved(contenders, timing.rounds, |c, round| {
        if (round, c) == (0, 0) {
            // The shape opens with its settling launches (the GPU idled while its inputs were
            // made), untimed and synchronised like a block of their own: the first timed block
            // then starts as every other block does, after the host's round trip between
            // blocks, not straight out of 200 ms of load (the rule's pick, which alone
            // started so, read 1–6 % slower than the same kernel as an extra; NOTES step 59).
            for rep in 0..timing.settle {
                launch(c, rep)?;
            }
            distgemm::runtime::stream::synchronize(&stream)?;
        }
        let round_timing = TimingConfig {
            warmup: if round == 0 { timing.blocks.warmup } else { 2 },
            reps: timing.blocks.reps,
        };
        let before = meter.map(EnergyMeter::read_mj);
        let metered = Instant::now();
        let sampler = h.clocks.then(|| {
            PowerSampler::start(
                vec![gpu.pci_bus_id().to_owned()],
                CLOCK_SAMPLE_PERIOD,
                Duration::ZERO,
            )
        });
        let t = time_on_stream(gpu, &stream, round_timing, |rep| launch(c, rep))?;
        let after = meter.map(EnergyMeter::read_mj);
        let metered = metered.elapsed();
        if let Some(sampler) = sampler {
            // A failed sampler (NVML gone) drops the contender's clock, not the timing.
            clocks[c] = match (clocks[c], sampler.finish()) {
                (Some(sum), Ok(read)) => read.first().map(|&r| sum.merged(r)),
                _ => None,
            };
        }
        block_ms[c].push(t.median_ms);
        energy[c] = match (energy[c], before, after) {
            (Some((mj, n, time)), Some(Ok(b)), Some(Ok(a))) => Some((
                mj + a.saturating_sub(b),
                n + round_timing.warmup + round_timing.reps,
                time + metered,
            )),
            _ => None,
        };
        Ok::<_, BenchError>(t.per_device_ms)
    });
    for block in blocks {
        block?;
    }
    let per_gemm = |c: usize| {
        energy[c]
            .filter(|&(_, _, time)| time >= MIN_METERED)
            .map(|(mj, n, _)| mj as f64 / n.max(1) as f64)
    };
    let mut measured = (0..contenders)
        .map(|c| {
            let name = if c == contenders - 1 {
                "cuBLASLt".to_owned()
            } else {
                let tile = sets.get(0).ours[c].variant().name;
                match c.checked_sub(1).map(|e| extras[e]) {
                    Some(Extra::Raster(g)) => format!("{tile} g{g}"),
                    Some(Extra::RowScales) => format!("{tile} row-wise"),
                    Some(Extra::Pdl) => format!("{tile} pdl"),
                    _ => tile.to_owned(),
                }
            };
            Ok(Measured {
                name,
                timing: Timing::from_devices(vec![block_ms[c].clone()])?,
                mj_per_gemm: per_gemm(c),
                clock: clocks[c],
                block_ms: std::mem::take(&mut block_ms[c]),
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    let cublas = measured.pop().expect("cuBLAS is the last contender");
    let ours = measured;
    Ok((ours, cublas))
}

/// Our GEMM stage kernel against cuBLASLt (see `benches/gemm.rs`).
#[derive(Debug, Parser)]
#[command(name = "gemm")]
struct Args {
    /// Only the 8192³ and stage shapes.
    #[arg(long, conflicts_with = "grid")]
    quick: bool,
    /// The shapes a model runs instead: decode and prefill M × the GEMMs of Llama-3 8B (TP 1),
    /// 70B (TP 2) and 405B (TP 8).
    #[arg(long)]
    grid: bool,
    /// These shapes instead (M×N×K, e.g. `3000x5000x4096`; comma-separated).
    #[arg(long, value_name = "MxNxK[,…]", value_delimiter = ',', value_parser = parse_shape,
          conflicts_with_all = ["quick", "grid"])]
    shape: Vec<(u64, u64, u64)>,
    /// A and B in e4m3 (tensor-wise scales, bf16 D) against cuBLASLt's FP8 GEMM, instead of
    /// bf16 and f16; `--variants` then means the configurations compiled for e4m3.
    #[arg(long)]
    fp8: bool,
    /// Also time every compiled tile configuration (the data behind the rule); one that serves
    /// fewer rows than a shape has (`16x128`) sits that shape out, as with `--variant`.
    #[arg(long, conflicts_with = "variant")]
    variants: bool,
    /// Also time these configurations (e.g. `128x256s,128x128s`, the split-K ones).
    #[arg(long, value_name = "NAME[,NAME…]", value_delimiter = ',', value_parser = parse_variant)]
    variant: Vec<&'static GemmVariant>,
    /// Also time the rule's configuration with these band heights of the tile order.
    #[arg(long, value_name = "G[,G…]", value_delimiter = ',')]
    raster: Vec<u32>,
    /// Also time the rule's configuration launched with programmatic dependent launch (PDL):
    /// what a caller gets who launches with the attribute, as a graph of stages does.
    #[arg(long)]
    pdl: bool,
    /// Also sample the SM clock (NVML, every 5 ms) while each contender's blocks run and
    /// report its mean (MHz): whether a contender ran slower than another at the same clock or
    /// at a lower one (the board's power cap sets the clock under load).
    #[arg(long)]
    clocks: bool,
    /// No board energy: leave NVML's energy counter unread between blocks (no "mJ" columns),
    /// so that no NVML call sits between the blocks of a shape.
    #[arg(long)]
    no_energy: bool,
    /// Keep only shapes whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// The same as `--filter`, as `run-gpu-tests.sh --benches FILTER` passes it.
    #[arg(value_name = "FILTER", conflicts_with = "filter")]
    filter_word: Option<String>,
    /// Fewest timed repetitions per block (at least 20, `MIN_TIMED_REPS`).
    #[arg(long, default_value_t = 30, value_parser = parse_reps)]
    reps: usize,
    /// Shortest timed block, ms.
    #[arg(long, value_name = "T", default_value_t = DEFAULT_MIN_BLOCK_MS, value_parser = block_ms)]
    min_block_ms: f64,
    /// Untimed work before each shape's first timed block, ms: the first contender's warm-up
    /// in the first round lasts at least this long (estimated at the nominal rates).
    #[arg(long, value_name = "S", default_value_t = DEFAULT_SETTLE_MS, value_parser = block_ms)]
    settle_ms: f64,
    /// Interleaved rounds per shape (each contender's median is over all of them): more
    /// rounds narrow a shape's run-to-run spread at the cost of time.
    #[arg(long, value_name = "N", default_value_t = ROUNDS, value_parser = parse_rounds)]
    rounds: usize,
    #[command(flatten)]
    runner: RunnerFlags,
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

/// One `--shape`: `MxNxK`, three whole numbers of at least 1.
fn parse_shape(s: &str) -> Result<(u64, u64, u64), String> {
    let dims: Vec<u64> = s
        .split('x')
        .map(|d| d.trim().parse::<u64>().ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!("'{s}': give M, N and K as whole numbers of at least 1, e.g. 3000x5000x4096")
        })?;
    match dims[..] {
        [m, n, k] => Ok((m, n, k)),
        _ => Err(format!(
            "'{s}': give three dimensions, MxNxK (e.g. 3000x5000x4096)"
        )),
    }
}

/// A `--shape`'s name in reports and file names: `MxNxK`.
fn shape_name((m, n, k): (u64, u64, u64)) -> String {
    format!("{m}x{n}x{k}")
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

fn main() {
    if let Err(e) = run() {
        eprintln!("gemm bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BenchError> {
    let args = Args::parse();
    if args.runner.listed("gemm") {
        return Ok(());
    }
    let (quick, reps, min_block_ms, settle_ms) =
        (args.quick, args.reps, args.min_block_ms, args.settle_ms);
    let filter = args.filter.or(args.filter_word);
    let mut extra: Vec<Extra> = Vec::new();
    if args.variants {
        let compiled = |v: &&GemmVariant| !args.fp8 || v.kernel_e4m3.is_some();
        extra.extend(VARIANTS.iter().filter(compiled).map(Extra::Variant));
    }
    extra.extend(args.variant.into_iter().map(Extra::Variant));
    if args.fp8 {
        // Issue 24 compares row-wise scales with tensor-wise ones, each on its rule's pick.
        extra.push(Extra::RowScales);
    }
    extra.extend(args.raster.into_iter().map(Extra::Raster));
    if args.pdl {
        extra.push(Extra::Pdl);
    }
    let gpu = Gpu::open(0)?;
    let module = Module::load(&gpu)?;
    let kernel = GemmKernel::new(&module)?;
    let provenance = Provenance::collect(&gpu);
    println!(
        "resident clusters (blocks) per tile configuration: {:?}",
        kernel.resident_clusters()
    );
    let meter = if args.no_energy {
        None
    } else {
        EnergyMeter::open(&gpu)
            .inspect_err(|e| println!("no energy columns: {e}"))
            .ok()
    };
    let h = Harness {
        gpu,
        module,
        kernel,
        meter,
        extras: extra,
        clocks: args.clocks,
    };
    let mut records = Vec::new();
    // The markdown report: every line printed as it is measured, and kept for the .md file.
    let mut report = Vec::new();
    let mut emit = |line: String| {
        println!("{line}");
        report.push(line);
    };
    emit("| shape | M | N | K | dtype | tile | ours ms | cuBLAS ms | ours TFLOP/s | cuBLAS TFLOP/s | ours/cuBLAS | % of peak (989, e4m3 1979) | weights GB/s ours / cuBLAS | ours mJ | cuBLAS mJ | µs (mJ) per extra configuration | SM MHz ours / cuBLAS / extras |".to_owned());
    emit(
        "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
            .to_owned(),
    );
    let all_shapes = if !args.shape.is_empty() {
        let named = |&(m, n, k): &(u64, u64, u64)| (shape_name((m, n, k)), m, n, k);
        args.shape.iter().map(named).collect()
    } else if args.grid {
        grid_shapes()
    } else {
        shapes()
    };
    for (name, m, n, k) in all_shapes {
        if quick && !(name.contains("square") || name.contains("stage")) {
            continue;
        }
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let kinds: Vec<Inputs> = if args.fp8 {
            vec![Inputs::E4m3]
        } else {
            Dtype::ALL.into_iter().map(Inputs::Native).collect()
        };
        for inputs in kinds {
            let flops = 2.0 * (m * n * k) as f64;
            // At least `reps` launches and at least `min_block_ms` per timed block, estimated
            // at a nominal rate: a 0.3 ms TP=8 stage GEMM timed in blocks of 20 launches (6 ms)
            // ran in the boost-clock burst after the previous block and read up to 14 % apart
            // between runs, where blocks of 100 ms show the power-capped steady state a
            // pipelined distributed GEMM runs in (the convention of Triton's `do_bench`).
            // Estimated at the slower of the nominal compute and memory rates (decode shapes
            // are bound by reading the weights).
            let bytes = (inputs.input_bytes() * (m * k + n * k) + 2 * m * n) as f64;
            let est_ms = (flops / NOMINAL_TFLOPS / 1e9).max(bytes / NOMINAL_GBPS / 1e6);
            let block_reps = (min_block_ms / est_ms).ceil() as usize;
            let timing = ShapeTiming {
                blocks: TimingConfig {
                    warmup: if flops > 2e13 { 3 } else { 10 },
                    reps: if flops > 2e13 {
                        20
                    } else {
                        reps.max(block_reps)
                    },
                },
                settle: (settle_ms / est_ms).ceil() as usize,
                rounds: args.rounds,
            };
            let (ours, cublas) = match inputs {
                Inputs::Native(Dtype::Bf16) => bench_shape::<half::bf16>(&h, (m, n, k), timing)?,
                Inputs::Native(Dtype::F16) => bench_shape::<half::f16>(&h, (m, n, k), timing)?,
                Inputs::E4m3 => bench_fp8_shape(&h, (m, n, k), timing)?,
            };
            let chosen = &ours[0];
            let (ot, ct) = (
                gemm_tflops(m, n, k, chosen.timing.median_ms),
                gemm_tflops(m, n, k, cublas.timing.median_ms),
            );
            let per_variant: BTreeMap<String, f64> = ours[1..]
                .iter()
                .map(|v| (v.name.clone(), gemm_tflops(m, n, k, v.timing.median_ms)))
                .collect();
            let variant_ms: BTreeMap<String, f64> = ours[1..]
                .iter()
                .map(|v| (v.name.clone(), v.timing.median_ms))
                .collect();
            let variant_mj: BTreeMap<String, f64> = ours[1..]
                .iter()
                .filter_map(|v| Some((v.name.clone(), v.mj_per_gemm?)))
                .collect();
            let variant_sm_mhz: BTreeMap<String, f64> = ours[1..]
                .iter()
                .filter_map(|v| Some((v.name.clone(), v.clock?.sm_mhz)))
                .collect();
            let variant_block_ms: BTreeMap<String, Vec<f64>> = ours[1..]
                .iter()
                .map(|v| (v.name.clone(), v.block_ms.clone()))
                .collect();
            // Weights: B, N × K elements of 2 bytes; GB/s = bytes / (ms · 1e6).
            let weight_gbps = |ms: f64| {
                (m <= WEIGHT_BOUND_MAX_M)
                    .then(|| (inputs.input_bytes() * n * k) as f64 / (ms * 1e6))
            };
            let r = Record {
                shape: name.clone(),
                m,
                n,
                k,
                dtype: inputs.name().to_owned(),
                tile: chosen.name.clone(),
                ours_ms: chosen.timing.median_ms,
                cublas_ms: cublas.timing.median_ms,
                ours_mj: chosen.mj_per_gemm,
                cublas_mj: cublas.mj_per_gemm,
                ours_tflops: ot,
                cublas_tflops: ct,
                ratio: ot / ct,
                ours_pct_of_peak: 100.0 * ot / inputs.peak_tflops(),
                ours_weight_gbps: weight_gbps(chosen.timing.median_ms),
                cublas_weight_gbps: weight_gbps(cublas.timing.median_ms),
                machine: provenance.gpu.clone(),
                driver: provenance.driver.clone(),
                commit: provenance.commit.clone(),
                date: provenance.date.clone(),
                variant_tflops: per_variant,
                variant_ms,
                variant_mj,
                ours_sm_mhz: chosen.clock.map(|c| c.sm_mhz),
                cublas_sm_mhz: cublas.clock.map(|c| c.sm_mhz),
                variant_sm_mhz,
                ours_block_ms: chosen.block_ms.clone(),
                cublas_block_ms: cublas.block_ms.clone(),
                variant_block_ms,
            };
            let variants_cell: Vec<String> = r
                .variant_ms
                .iter()
                .map(|(v, ms)| {
                    let us = ms * 1e3;
                    match r.variant_mj.get(v) {
                        Some(mj) => format!("{v} {us:.1} ({mj:.0})"),
                        None => format!("{v} {us:.1}"),
                    }
                })
                .collect();
            let mj = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.0}"));
            let mhz = match (r.ours_sm_mhz, r.cublas_sm_mhz) {
                (Some(o), Some(c)) => std::iter::once(format!("{o:.0} / {c:.0}"))
                    .chain(r.variant_sm_mhz.values().map(|v| format!("{v:.0}")))
                    .collect::<Vec<_>>()
                    .join(" / "),
                _ => "—".to_owned(),
            };
            let weights = match (r.ours_weight_gbps, r.cublas_weight_gbps) {
                (Some(o), Some(c)) => format!("{o:.0} / {c:.0}"),
                _ => "—".to_owned(),
            };
            emit(format!(
                "| {} | {m} | {n} | {k} | {} | {} | {:.4} | {:.4} | {:.0} | {:.0} | {:.3} | {:.1} | {weights} | {} | {} | {} | {mhz} |",
                r.shape,
                r.dtype,
                r.tile,
                r.ours_ms,
                r.cublas_ms,
                r.ours_tflops,
                r.cublas_tflops,
                r.ratio,
                r.ours_pct_of_peak,
                mj(r.ours_mj),
                mj(r.cublas_mj),
                variants_cell.join(", ")
            ));
            records.push(r);
        }
    }
    // The criteria: issue 5's set (8192³, TP-local and stage shapes, not the full single-GPU
    // ones) by default; with `--grid` every shape, and apart the decode rows (M ≤ 128).
    // Given shapes are split like the grid's.
    let decode_subset = args.grid || !args.shape.is_empty();
    let criterion: fn(&Record) -> bool = if decode_subset {
        |r| r.m <= WEIGHT_BOUND_MAX_M
    } else {
        |r| !r.shape.contains("full")
    };
    let subset = if decode_subset {
        "decode rows (M ≤ 128)"
    } else {
        "without the full single-GPU shapes"
    };
    for (label, keep) in [("every shape", None), (subset, Some(criterion))] {
        let line: Vec<String> = ["bf16", "f16", "e4m3"]
            .iter()
            .filter_map(|&name| {
                let ratios: Vec<f64> = records
                    .iter()
                    .filter(|r| r.dtype == name && keep.is_none_or(|f| f(r)))
                    .map(|r| r.ratio)
                    .collect();
                (!ratios.is_empty()).then(|| {
                    let (geo, lowest) = geo_mean_and_min(&ratios);
                    format!("{name} {geo:.3} (lowest {lowest:.3})")
                })
            })
            .collect();
        emit(format!(
            "geometric mean ours/cuBLAS, {label}: {}",
            line.join(", ")
        ));
    }
    // Where the rule's pick also ran as an extra (`--variant`), the same kernel was timed in
    // two slots of the same rounds: their ratio is the run's noise between contenders, the
    // scale against which its other ratios are read (kernels-gpu/NOTES.md step 59).
    let twice: Vec<f64> = records
        .iter()
        .filter_map(|r| Some(r.ours_ms / r.variant_ms.get(&r.tile)?))
        .collect();
    if !twice.is_empty() {
        let (geo, lowest) = geo_mean_and_min(&twice);
        let highest = twice.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        emit(format!(
            "the rule's pick timed twice (as ours and as an extra), ours over the extra: {geo:.3} \
             in the geometric mean ({lowest:.3}–{highest:.3} over {} rows)",
            twice.len()
        ));
    }
    let dir = results_dir();
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.clone(),
        source,
    })?;
    let bench = match (args.grid, args.fp8) {
        (false, false) => "gemm",
        (true, false) => "gemm-grid",
        (false, true) => "gemm-fp8",
        (true, true) => "gemm-grid-fp8",
    };
    // A filtered run names its files after the filter, so that the calls a grid is split
    // over (`--filter 8b`, `--filter 70b`, …) do not overwrite each other.
    let part = filter.as_ref().map_or(String::new(), |f| {
        let slug: String = f
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!("-{slug}")
    });
    // Given shapes name the files: up to three of them, or the first and their count.
    let shapes_part = match args.shape.as_slice() {
        [] => String::new(),
        given @ [first, ..] => {
            if given.len() <= 3 {
                let names: Vec<String> = given.iter().copied().map(shape_name).collect();
                format!("-{}", names.join("-"))
            } else {
                format!("-{}-and-{}-more", shape_name(*first), given.len() - 1)
            }
        }
    };
    // As a filter, a settle other than the default names the files (`-settle0`).
    let settle = if args.settle_ms == DEFAULT_SETTLE_MS {
        String::new()
    } else {
        format!("-settle{}", args.settle_ms)
    };
    // So does a count of rounds other than the default (`-rounds9`).
    let rounds = if args.rounds == ROUNDS {
        String::new()
    } else {
        format!("-rounds{}", args.rounds)
    };
    let stem = format!(
        "{bench}-{}-{}{shapes_part}{part}{settle}{rounds}",
        &provenance.date[..10],
        provenance.commit
    );
    let header = format!(
        "# `benches/gemm{}{}`: our GEMM against cuBLASLt\n\n{}, driver {}, commit {}, {}; median of {} interleaved rounds per contender, blocks of at least {} ms after {} ms of untimed launches per shape{}.\n",
        if args.grid { " --grid" } else { "" },
        if args.fp8 { " --fp8" } else { "" },
        provenance.gpu,
        provenance.driver,
        provenance.commit,
        provenance.date,
        args.rounds,
        args.min_block_ms,
        args.settle_ms,
        filter
            .as_ref()
            .map_or(String::new(), |f| format!("; shapes containing {f:?}")),
    );
    let md = format!("{header}\n{}\n", report.join("\n"));
    let json = serde_json::to_string_pretty(&records)? + "\n";
    for (ext, text) in [("json", json), ("md", md)] {
        let path = dir.join(format!("{stem}.{ext}"));
        std::fs::write(&path, text).map_err(|source| BenchError::Io {
            path: path.clone(),
            source,
        })?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The geometric mean and the smallest of `ratios` (not empty).
fn geo_mean_and_min(ratios: &[f64]) -> (f64, f64) {
    let log_mean = ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64;
    (
        log_mean.exp(),
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
    )
}
