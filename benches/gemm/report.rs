//! `benches/gemm`'s records, its markdown table and summary lines, and its result files.

use distgemm_benches::{BenchError, Provenance, ROUNDS, gemm_tflops, results_dir};
use serde::Serialize;
use std::collections::BTreeMap;

use crate::args::{Args, DEFAULT_SETTLE_MS};
use crate::measure::{Inputs, ShapeTimings};
use crate::shapes::shape_name;

/// Largest M whose records carry the weight-streaming rate.
const WEIGHT_BOUND_MAX_M: u64 = 128;

#[derive(Debug, Serialize)]
pub(crate) struct Record {
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

/// The markdown table's header and separator lines.
pub(crate) const TABLE_HEADER: [&str; 2] = [
    "| shape | M | N | K | dtype | tile | ours ms | cuBLAS ms | ours TFLOP/s | cuBLAS TFLOP/s | ours/cuBLAS | % of peak (989, e4m3 1979) | weights GB/s ours / cuBLAS | ours mJ | cuBLAS mJ | µs (mJ) per extra configuration | SM MHz ours / cuBLAS / extras |",
    "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
];

/// The record of shape `name` (`m × n × k`, `inputs`) from its timings: the rule's
/// configuration (the first of ours), every extra one, and cuBLASLt.
pub(crate) fn record(
    name: &str,
    (m, n, k): (u64, u64, u64),
    inputs: Inputs,
    (ours, cublas): &ShapeTimings,
    provenance: &Provenance,
) -> Record {
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
        (m <= WEIGHT_BOUND_MAX_M).then(|| (inputs.input_bytes() * n * k) as f64 / (ms * 1e6))
    };
    Record {
        shape: name.to_owned(),
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
    }
}

/// `r` as a row of the markdown table ([`TABLE_HEADER`]).
pub(crate) fn table_row(r: &Record) -> String {
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
    format!(
        "| {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {:.0} | {:.0} | {:.3} | {:.1} | {weights} | {} | {} | {} | {mhz} |",
        r.shape,
        r.m,
        r.n,
        r.k,
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
    )
}

/// The lines under the table: the geometric mean of ours/cuBLAS per dtype over every record
/// and over the criteria's subset — issue 5's set (8192³, TP-local and stage shapes, not the
/// full single-GPU ones) by default; with `--grid` or `--shape` (`given_or_grid`) the decode
/// rows (M ≤ 128) — and, where the rule's pick also ran as an extra, the noise between the two.
pub(crate) fn summary(records: &[Record], given_or_grid: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let criterion: fn(&Record) -> bool = if given_or_grid {
        |r| r.m <= WEIGHT_BOUND_MAX_M
    } else {
        |r| !r.shape.contains("full")
    };
    let subset = if given_or_grid {
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
        lines.push(format!(
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
        lines.push(format!(
            "the rule's pick timed twice (as ours and as an extra), ours over the extra: {geo:.3} \
             in the geometric mean ({lowest:.3}–{highest:.3} over {} rows)",
            twice.len()
        ));
    }
    lines
}

/// The geometric mean and the smallest of `ratios` (not empty).
fn geo_mean_and_min(ratios: &[f64]) -> (f64, f64) {
    let log_mean = ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64;
    (
        log_mean.exp(),
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
    )
}

/// Writes the run's `.json` (the records) and `.md` (a header, then `table`'s lines) under
/// [`results_dir`], named `gemm[-grid][-fp8]-<date>-<commit>[-<shapes>][-<filter>]
/// [-settle<ms>][-rounds<N>]`.
pub(crate) fn write(
    args: &Args,
    filter: Option<&str>,
    provenance: &Provenance,
    table: &[String],
    records: &[Record],
) -> Result<(), BenchError> {
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
    let part = filter.map_or(String::new(), |f| {
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
        filter.map_or(String::new(), |f| format!("; shapes containing {f:?}")),
    );
    let md = format!("{header}\n{}\n", table.join("\n"));
    let json = serde_json::to_string_pretty(records)? + "\n";
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
