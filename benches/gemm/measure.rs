//! How `benches/gemm` times one shape: our kernel (the rule's configuration and every extra
//! one asked for) and cuBLASLt on rotating input sets, in interleaved rounds of blocks, with
//! board energy and SM clocks where NVML reports them.

use distgemm::baseline::{BaselineError, CublasLtElement, CublasLtGemm, TnGemmShape};
use distgemm::dtype::{Dtype, Element};
use distgemm::gemm::{
    Fp8GemmArgs, Fp8Scales, GemmKernel, GemmLaunchError, GemmVariant, MatrixView, PreparedGemm,
};
use distgemm::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module};
use distgemm_benches::energy::{ClockPower, EnergyMeter, MIN_METERED, PowerSampler};
use distgemm_benches::{
    BenchError, DenseOperands, RotatingInputs, Timing, TimingConfig, interleaved, time_on_stream,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub(crate) enum Inputs {
    Native(Dtype),
    E4m3,
}

impl Inputs {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Inputs::Native(d) => d.name(),
            Inputs::E4m3 => "e4m3",
        }
    }
    /// Bytes of A and B per element.
    pub(crate) fn input_bytes(self) -> u64 {
        match self {
            Inputs::Native(_) => 2,
            Inputs::E4m3 => 1,
        }
    }
    pub(crate) fn peak_tflops(self) -> f64 {
        match self {
            Inputs::Native(_) => PEAK_TFLOPS,
            Inputs::E4m3 => PEAK_FP8_TFLOPS,
        }
    }
}

/// Rate (GB/s) at which memory-bound blocks are estimated for `--min-block-ms` (below the
/// H200's 4.8 TB/s, so blocks come out a little longer than asked, never shorter).
const NOMINAL_GBPS: f64 = 3500.0;

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
pub(crate) struct Measured {
    pub(crate) name: String,
    /// The median of its block medians (`block_ms` as one device's samples), not of its
    /// launches pooled over the rounds: in short blocks (20–40 ms) the first timed block of a
    /// shape ran 5–12 % slow whichever contender ran it, with or without NVML reads between
    /// blocks (NOTES steps 77–78); pooled, that one block moved its contender's median by up
    /// to 1.5 %, where one block out of three or more cannot move a median of the blocks.
    pub(crate) timing: Timing,
    pub(crate) mj_per_gemm: Option<f64>,
    /// With `--clocks`: the mean SM clock and board power over its blocks.
    pub(crate) clock: Option<ClockPower>,
    /// Median of each of its timed blocks, one a round, in the order the rounds ran.
    pub(crate) block_ms: Vec<f64>,
}

/// Our kernel (chosen configuration first, then each one asked for) and cuBLASLt.
pub(crate) type ShapeTimings = (Vec<Measured>, Measured);

/// How a shape is timed: each contender's blocks (warm-up and timed repetitions), the
/// untimed launches that open the shape before its first block (`--settle-ms` at the
/// estimated rate) and the interleaved rounds of blocks (`--rounds`).
#[derive(Clone, Copy)]
pub(crate) struct ShapeTiming {
    blocks: TimingConfig,
    settle: usize,
    rounds: usize,
}

impl ShapeTiming {
    /// How to time an `m × n × k` GEMM of `inputs`: at least `reps` launches and at least
    /// `min_block_ms` per timed block, `settle_ms` of untimed launches before the first, in
    /// `rounds` rounds.
    pub(crate) fn for_shape(
        inputs: Inputs,
        (m, n, k): (u64, u64, u64),
        reps: usize,
        min_block_ms: f64,
        settle_ms: f64,
        rounds: usize,
    ) -> ShapeTiming {
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
        ShapeTiming {
            blocks: TimingConfig {
                warmup: if flops > 2e13 { 3 } else { 10 },
                reps: if flops > 2e13 {
                    20
                } else {
                    reps.max(block_reps)
                },
            },
            settle: (settle_ms / est_ms).ceil() as usize,
            rounds,
        }
    }
}

/// An extra configuration of our kernel timed beside the rule's choice.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Extra {
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
pub(crate) struct Harness {
    pub(crate) gpu: Gpu,
    pub(crate) module: Arc<Module>,
    pub(crate) kernel: GemmKernel,
    /// Board energy, when NVML is there.
    pub(crate) meter: Option<EnergyMeter>,
    pub(crate) extras: Vec<Extra>,
    /// `--clocks`: sample the SM clock while each timed block runs.
    pub(crate) clocks: bool,
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
pub(crate) fn bench_shape<T: Element + CublasLtElement + DeviceCopy>(
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
pub(crate) fn bench_fp8_shape(
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
