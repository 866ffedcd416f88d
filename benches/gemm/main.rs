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
//!
//! Modules: `args` (the command line), `shapes` (the shape sets), `measure` (timing one
//! shape's contenders) and `report` (records, the table and the result files).

mod args;
mod measure;
mod report;
mod shapes;

use clap::Parser;
use distgemm::dtype::Dtype;
use distgemm::gemm::GemmKernel;
use distgemm::runtime::{Gpu, Module};
use distgemm_benches::energy::EnergyMeter;
use distgemm_benches::{BenchError, Provenance};

use args::Args;
use measure::{Harness, Inputs, ShapeTiming, bench_fp8_shape, bench_shape};

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
    let filter = args.filter.clone().or_else(|| args.filter_word.clone());
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
        extras: args.extras(),
        clocks: args.clocks,
    };
    let mut records = Vec::new();
    // The markdown report: every line printed as it is measured, and kept for the .md file.
    let mut table = Vec::new();
    let mut emit = |line: String| {
        println!("{line}");
        table.push(line);
    };
    for line in report::TABLE_HEADER {
        emit(line.to_owned());
    }
    for (name, m, n, k) in args.shapes(filter.as_deref()) {
        for inputs in args.inputs() {
            let timing = ShapeTiming::for_shape(
                inputs,
                (m, n, k),
                args.reps,
                args.min_block_ms,
                args.settle_ms,
                args.rounds,
            );
            let timings = match inputs {
                Inputs::Native(Dtype::Bf16) => bench_shape::<half::bf16>(&h, (m, n, k), timing)?,
                Inputs::Native(Dtype::F16) => bench_shape::<half::f16>(&h, (m, n, k), timing)?,
                Inputs::E4m3 => bench_fp8_shape(&h, (m, n, k), timing)?,
            };
            let r = report::record(&name, (m, n, k), inputs, &timings, &provenance);
            emit(report::table_row(&r));
            records.push(r);
        }
    }
    for line in report::summary(&records, args.grid || !args.shape.is_empty()) {
        emit(line);
    }
    report::write(&args, filter.as_deref(), &provenance, &table, &records)
}
