//! The rule for small-batch problems (17–64 rows): a model of the run as a stream of the
//! weights, in microseconds, among the 64-row tiles.
//!
//! At these rows a GEMM reads B (the weights, `N × K`) once and does little else, and
//! [`estimated_cost`](super::estimated_cost)'s model — tile area times a per-configuration
//! factor, in waves — cannot tell the 64-row tiles apart: measured on one H200
//! (`gemm-grid-2026-12-02-3be1dff-m64`, kernels-gpu/NOTES.md step 53), a block of any of them
//! spends a roughly fixed time per ring stage whatever the tile's width
//! ([`STAGE_US`], [`TWO_K_BLOCK_STAGE_US`]), and the whole grid cannot read B faster than
//! [`DRAM_BYTES_PER_US`]. So a wave of `w` blocks takes
//! `max(stages · stage time, w · block_n · K · 2 / DRAM rate)`, and a split-K grid its blocks'
//! longest share of the stages or the weights' DRAM time, whichever is longer, plus the
//! finishing block's hand-off ([`split_hand_off_us`]). Over that grid's twelve shapes this
//! model picks within 4 % of the fastest of the seven 64-row tiles on every shape.
//!
//! Among the configurations within [`TIE`] of the fastest estimate, the rule prefers fewer
//! waves, then more blocks (more of the weight stream in flight: at the DRAM floor 128 blocks
//! of `64x32k2` measured 4 % faster than 64 of `64x64k2`), then the shorter stage-bound time.
use super::choose::split_grid;
use kernels_gpu::gemm_abi::{BLOCK_K, GemmVariant, VARIANTS};
use kernels_gpu::layout::stream_k::StreamK;

/// The most rows this rule serves; fewer than 17 run the 16-row tiles.
pub(super) const MAX_ROWS: u64 = 64;

/// Time of one ring stage of one k-block (64 deep) in one block of a 64-row tile, µs: 64 × 32,
/// 64 × 64 and 64 × 128 tiles alike where the stages, not DRAM, bound the run (405B QKV at
/// TP 8 with 64 rows: 0.17–0.18 µs a stage over 256 stages; 8B fc2: 0.175). It is the
/// consumer's hand-off per stage (barrier wait, `wgmma` batch, commit and release), not bytes.
const STAGE_US: f64 = 0.175;

/// Time of one ring stage of two k-blocks, µs ([`TileConfig::k_blocks_per_stage`]
/// (kernels_gpu::gemm_abi::TileConfig::k_blocks_per_stage) = 2): 0.25–0.28 measured, so a
/// k-block costs ~0.135 instead of 0.175.
const TWO_K_BLOCK_STAGE_US: f64 = 0.27;

/// The rate at which the whole GPU reads the weights from DRAM at these rows, bytes per µs
/// (4.0 TB/s on an H200; 3.7–4.1 measured across the grid's DRAM-bound shapes).
const DRAM_BYTES_PER_US: f64 = 4.0e6;

/// Estimates within this fraction of the fastest count as ties.
const TIE: f64 = 0.005;

/// What finishing a tile cut into `pieces` adds after the stream, µs: the partials stored,
/// counted and summed. Fitted to three split runs of the grid (64×128 in 4 and 7 pieces,
/// 64×64 in 4: 4.7, 6.3 and 3.9 µs).
fn split_hand_off_us(pieces: u32) -> f64 {
    2.5 + 0.5 * f64::from(pieces)
}

/// One candidate's estimate.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// The whole run, µs (without the launch and prologue, the same for every candidate).
    total_us: f64,
    /// The part bound by stages alone (no DRAM floor): the slack under the floor.
    stage_us: f64,
    waves: u64,
    blocks: u64,
}

/// The 64-row tiles this rule chooses among: those whose stage times it was fitted to (every
/// one measured at these rows in the same rounds, NOTES step 53). A 64-row tile joins once
/// measured (`64x128k2`, by name, has not been).
const CANDIDATES: [&str; 7] = [
    "64x128", "64x128s", "64x64", "64x64s", "64x64k2", "64x32", "64x32k2",
];

fn is_candidate(v: &GemmVariant) -> bool {
    CANDIDATES.contains(&v.name)
}

/// The candidates narrower than 128 columns (`64x64…`, `64x32…`): measured only at 17–64 rows,
/// so only this rule picks them.
pub(super) fn is_narrow(v: &GemmVariant) -> bool {
    is_candidate(v) && v.config.block_n < 128
}

/// The estimate of `variant` on an `m × n × k` problem on `sm_count` SMs, or `None` for a
/// split-K configuration that would not split ([`split_grid`]).
fn estimate(variant: &GemmVariant, m: u64, n: u64, k: u64, sm_count: u32) -> Option<Estimate> {
    let c = variant.config;
    let slots = u64::from(sm_count.max(1));
    let tiles = m.div_ceil(u64::from(c.block_m)) * n.div_ceil(u64::from(c.block_n));
    let k_blocks = k.div_ceil(u64::from(BLOCK_K)).max(1);
    let kps = u64::from(c.k_blocks_per_stage);
    let stage = if kps == 2 {
        TWO_K_BLOCK_STAGE_US
    } else {
        STAGE_US
    };
    // Bytes of B one tile streams.
    let tile_bytes = (u64::from(c.block_n) * k * 2) as f64;
    if c.split_k {
        let grid = u64::from(split_grid(variant, m, n, k, sm_count)?);
        let partition = StreamK::new(tiles as u32, k_blocks as u32, grid as u32);
        let stage_us = (tiles * k_blocks).div_ceil(grid) as f64 * stage;
        let dram_us = tiles as f64 * tile_bytes / DRAM_BYTES_PER_US;
        return Some(Estimate {
            total_us: stage_us.max(dram_us) + split_hand_off_us(partition.max_pieces()),
            stage_us,
            waves: 1,
            blocks: grid,
        });
    }
    let stage_us = k_blocks.div_ceil(kps) as f64 * stage;
    let waves = tiles.div_ceil(slots);
    let total_us = (0..waves)
        .map(|w| {
            let blocks = (tiles - w * slots).min(slots);
            stage_us.max(blocks as f64 * tile_bytes / DRAM_BYTES_PER_US)
        })
        .sum();
    Some(Estimate {
        total_us,
        stage_us: stage_us * waves as f64,
        waves,
        blocks: tiles.min(slots),
    })
}

/// The configuration for an `m × n × k` problem of 17–[`MAX_ROWS`] rows on `sm_count` SMs:
/// among the 64-row tiles, the fastest by the weight-stream estimate, ties broken as the
/// module says (then by the order of [`VARIANTS`]).
pub(super) fn choose(m: u64, n: u64, k: u64, sm_count: u32) -> &'static GemmVariant {
    let estimates: Vec<(&'static GemmVariant, Estimate)> = VARIANTS
        .iter()
        .filter(|v| is_candidate(v))
        .filter_map(|v| Some((v, estimate(v, m, n, k, sm_count)?)))
        .collect();
    let fastest = estimates
        .iter()
        .map(|(_, e)| e.total_us)
        .fold(f64::INFINITY, f64::min);
    estimates
        .into_iter()
        .filter(|(_, e)| e.total_us <= fastest * (1.0 + TIE))
        .reduce(|best, next| {
            let (b, x) = (best.1, next.1);
            let better = (x.waves, std::cmp::Reverse(x.blocks))
                < (b.waves, std::cmp::Reverse(b.blocks))
                || ((x.waves, x.blocks) == (b.waves, b.blocks) && x.stage_us < b.stage_us);
            if better { next } else { best }
        })
        .map(|(v, _)| v)
        .expect("the 64-row tiles are compiled")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid's twelve shapes at 64 rows, each with the tile that measured fastest in
    /// bf16 (`gemm-grid-2026-12-02-3be1dff-m64`, one H200; every 64-row tile in the same
    /// rounds) and the one this rule picks where it is another, within 4 % of it.
    #[test]
    fn picks_the_fastest_64_row_tile_measured_or_within_4_percent() {
        let cases = [
            // (n, k, the rule's pick): the shape, the fastest measured (µs, bf16), others
            (6144, 4096, "64x64k2"), // 8B QKV: 20.0 (`64x128` 20.3, cuBLAS 18.8)
            (4096, 4096, "64x32k2"), // 8B o-proj: 15.6 (`64x128s` 19.6, cuBLAS 14.9)
            (28672, 4096, "64x128"), // 8B fc1: 65.2
            (4096, 14336, "64x32k2"), // 8B fc2: 36.3 (`64x128s` 40.4, cuBLAS 39.3)
            (5120, 8192, "64x64k2"), // 70B QKV: 28.1 (`64x128s` 32.0, cuBLAS 32.3)
            (8192, 4096, "64x64k2"), // 70B o-proj: 23.5 (`64x128` 23.4)
            (28672, 8192, "64x128"), // 70B fc1: 118.7
            (8192, 14336, "64x64k2"), // 70B fc2: 63.7 (`64x128` 63.7)
            (2304, 16384, "64x64s"), // 405B QKV: 29.3 (`64x128s` 31.7, cuBLAS 28.1)
            (16384, 2048, "64x128"), // 405B o-proj: 23.4 (`64x64k2` 23.3)
            (13312, 16384, "64x128"), // 405B fc1: 110.4 (`64x64k2` 123.0)
            (16384, 6656, "64x128"), // 405B fc2: 59.0
        ];
        for (n, k, pick) in cases {
            assert_eq!(choose(64, n, k, 132).name, pick, "64 x {n} x {k}");
        }
    }

    /// Against the run the model was fitted to, every candidate timed in the same rounds
    /// (bf16 and f16): the pick is within 4 % of the fastest candidate on every shape.
    #[test]
    fn picks_within_4_percent_of_the_fastest_measured() {
        let records: Vec<serde_json::Value> = serde_json::from_str(include_str!(
            "../../../benches/results/gemm-grid-2026-12-02-3be1dff-m64.json"
        ))
        .unwrap();
        assert_eq!(records.len(), 24);
        for r in &records {
            let dim = |key: &str| r[key].as_u64().unwrap();
            let (m, n, k) = (dim("m"), dim("n"), dim("k"));
            let measured = |name: &str| r["variant_ms"][name].as_f64().unwrap();
            let fastest = CANDIDATES
                .iter()
                .map(|name| measured(name))
                .fold(f64::INFINITY, f64::min);
            let pick = choose(m, n, k, 132).name;
            let ratio = measured(pick) / fastest;
            assert!(ratio <= 1.04, "{}: {pick} {ratio:.3}", r["shape"]);
        }
    }

    #[test]
    fn the_candidates_are_compiled_64_row_tiles() {
        for name in CANDIDATES {
            let v = VARIANTS.iter().find(|v| v.name == name).expect(name);
            let c = v.config;
            assert!(
                c.block_m == 64 && c.a_rows == 64 && c.cluster_m == 1,
                "{name}"
            );
        }
    }

    #[test]
    fn more_rows_are_more_tiles_and_every_row_count_gets_a_64_row_tile() {
        for m in 17..=MAX_ROWS {
            for (n, k) in [(8, 64), (1000, 1000), (4096, 4096), (28672, 8192)] {
                let v = choose(m, n, k, 132);
                assert!(is_candidate(v), "{m} x {n} x {k}: {}", v.name);
            }
        }
        // At the DRAM floor the time is the bytes: 132 blocks of 64 × 64 tiles on K = 4096
        // (stages 64 · 0.175 = 11.2 µs) read 17.3 µs of weights, 100 blocks 13.1 µs.
        let v = VARIANTS.iter().find(|v| v.name == "64x64").unwrap();
        let few = estimate(v, 64, 100 * 64, 4096, 132).unwrap();
        let wave = estimate(v, 64, 132 * 64, 4096, 132).unwrap();
        assert!((wave.total_us / few.total_us - 1.32).abs() < 1e-9);
        assert!((few.stage_us - 11.2).abs() < 1e-9);
    }
}
