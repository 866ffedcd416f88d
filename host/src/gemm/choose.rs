//! Which compiled tile configuration runs a given problem: a documented rule, not a table of
//! timings.
//!
//! A persistent grid runs `tiles` output tiles on `slots` resident blocks (one per SM; with
//! 2-block clusters, pairs of SMs). The run takes `⌈tiles / slots⌉` *waves*, each as long as
//! one tile's main loop and its epilogue, so the estimated time of a configuration is
//! `⌈tiles / slots⌉ · tile_cost`, with `tile_cost` proportional to the tile's area times a
//! per-configuration efficiency factor (smaller tiles reread more operand bytes per FLOP) and
//! the `K/64` k-blocks of its main loop, plus the epilogue's fixed share per output element
//! (`EPILOGUE_K_BLOCKS`). A ping-pong configuration overlaps each tile's epilogue with the
//! other warpgroup's main loop, so only its last one counts. The rule picks the configuration
//! with the smallest estimate; ties go to the larger tile.
use super::sectors::SectorAlignment;
use super::weight_stream;
use crate::fp8::ScaleMode;
use kernels_gpu::gemm_abi::{BLOCK_K, ConsumerSplit, GemmVariant, TILE_16X128, VARIANTS};
use kernels_gpu::layout::stream_k::{self, StreamK};

/// Relative cost of one tile's main loop per output element, by configuration name
/// (128×256 = 1). The factors come from the measured per-SM throughput of each configuration
/// on large problems, where every configuration fills its waves (kernels-gpu/NOTES.md).
fn cost_per_element(variant: &GemmVariant) -> f64 {
    // A split-K configuration's main loop is its base tile's (`128x128s` is `128x128`'s).
    match variant.name.strip_suffix('s').unwrap_or(variant.name) {
        // 2-block clusters (B multicast) measured within noise of the same tile without them
        // (benches/results/gemm-2026-11-30-b3588aa-variants.md): equal cost, so ties keep the
        // simpler launch, which comes first in `VARIANTS`. So for every width's clusters
        // (`…c2`): they win only where rows start off 32-byte boundaries (`main_loop_cost`).
        "128x256" | "128x256c2" => 1.0,
        // 1.035–1.087 (mean 1.063) over the full-wave shapes (8192³ and the TP=2 stage
        // shapes, bf16 and f16) of the two interleaved runs
        // benches/results/gemm-2026-11-30-{14e57ea,5f5e856}-variants.md; the earlier,
        // non-interleaved runs read 1.10.
        "128x128" | "128x128c2" => 1.06,
        // Not yet measured on full waves; estimated from what it moves per output element
        // relative to 128×256: 5 % more operand bytes from L2, 3 % more shared-memory reads
        // by the wgmmas, 14 % more pipeline handshakes and 7 epilogue chunks of 32 columns
        // instead of 4 of 64.
        "128x224" | "128x224c2" => 1.02,
        // Measured per k-block of one wave at 512 × 6144 × K (ncu, boost clocks, K = 1024 …
        // 16384; ncu-2026-12-02-df32b06-512x6144-k-sweep): 0.504 µs a k-block of a 128×192
        // tile against 0.559 of a 128×224 one, 5.2 % more per output element, which gave
        // 1.02 · 1.052 = 1.07 (NOTES step 60). It wins where 192 divides N into one wave that
        // 224 and 256 leave short: 512 × 6144 × 4096 (8B QKV, 128 tiles) 41.5 µs against
        // 128×224's 45.5. On several waves 1.07 priced it too high: on the 20 shapes of
        // 257–6000 rows where 1.045 (128×160's cost: it reads fewer operand bytes per output)
        // moves the pick from `128x128` or `128x160` to it, it ran 1.033 times faster in the
        // geometric mean (40 records, 0.975–1.088; 1500 × 4096 × 14336 239 → 228 µs, 3001 ×
        // 5120 × 8192 357 → 329; gemm-2026-12-04-a4057b6-{777x6144x4096,1500x3584x3584}-and-9-more;
        // NOTES step 97). No grid or seed-set shape moves.
        "128x192" | "128x192c2" => 1.045,
        // Estimated from operand bytes before it was measured: 128×160 reads 20 % more per
        // output element than 128×256 (1/160 + 1/128 against 1/256 + 1/128), between
        // 128×224's 5 % (1.02) and 128×128's 33 % (1.06). Measured 1.035–1.046 per output
        // element of 128×256 on full waves (70B QKV at TP 2 and 8B QKV, 8192 rows, bf16 and
        // f16: gemm-grid-2026-12-02-2c11ec7-qkv). It wins where 160 divides N into about a
        // wave: 70B QKV with 512 rows, 128 tiles, 66.7 µs against 128×224's 79.4.
        "128x160" | "128x160c2" => 1.045,
        // Split only (`128x144s`, stored from registers). Fitted to 512 × 2304 × 16384 (405B
        // QKV at TP 8), 64 tiles in two splits against `128x160s`' 60, five interleaved
        // rounds: 66.2 against 68.2 µs (bf16), 68.2 against 73.5 (f16), 0.95 of its time for
        // 0.90 of its area a block, so 1.045 · 0.95 / 0.90 ≈ 1.10; level with it at K = 8192
        // and with `128x128s` at 256 rows, slower than `128x128s` at 384 rows and at 1152
        // columns, where this cost keeps `128x128s`
        // (gemm-2026-12-03-e6fedea-dirty-512x2304x16384-and-5-more-128x144s; NOTES step 72).
        "128x144" => 1.10,
        // Fitted to five one-wave shapes of 160–300 rows, each against `64x128` in the same
        // rounds (gemm-2026-12-03-e595b2b-dirty-128x5120x8192-and-8-more-64x96-k2; NOTES step
        // 75): time over `64x128`'s times 1.4 · 128 / 96 gives 1.73 at 192 × 2304 × 8192 (27.6
        // against 29.7 µs), 1.75 at 256 rows, 1.74 at 300, 1.76 at 160 × 3072 × 14336 and 1.77
        // at 256 × 3072 × 8192. Its ring stage takes a one-k-block stage's time for two
        // k-blocks' work, so the cost of a 64-row tile's period is spread over more of them.
        "64x96k2" => 1.75,
        // 64-row tiles as wide as make about one wave of a few hundred ragged rows (260 ×
        // 5120: 5 × 25 = 125 tiles of 64×208; 280 × 6144: 5 × 26 = 130 of 64×240), where the
        // 128-row tiles compute up to a third of their rows as padding. Fitted to one-wave
        // shapes against the 128-row pick in the same rounds (NOTES step 78): `64x208` 1.19–1.20
        // at 260 and 300 × 5120 × 8192 (45.2 against `128x128`'s 49.1 µs), `64x240` 1.26 at
        // 260 × 6144 × 8192 (51.7 against `128x160`'s 57.0) and 1.37 at K = 4096 (280 and 320
        // × 6144), where the block's fixed time weighs twice as much; priced a little above
        // the K = 8192 fits, so that they take only the clear cases. Like `64x96k2` they
        // compete only at K = 4096–8192 and in one wave (`ONE_WAVE_64_ROW`): on two waves
        // `64x208` ran 1.6 times `64x240`'s one (260 × 6144 × 8192, 84.7 against 51.7 µs).
        "64x208" => 1.22,
        "64x240" => 1.30,
        // Fitted to one-wave shapes of a few hundred to a thousand rows, each against
        // `128x128` in the same rounds
        // (gemm-2026-12-03-2d1454d-dirty-512x2304x8192-and-10-more-128x80-probe; NOTES step
        // 73): `128x80` 1.31 at 512 × 2304 × 8192 (35.1 against 45.6 µs) and 1.38
        // at K = 4096 (21.2 against 26.3), where the block's fixed cost weighs more; `128x96`
        // 1.21–1.29 at 512 × 3072 × 8192, 1024 × 1152 × 8192 and 1024 × 1536 × 4096. Narrower
        // tiles read more operand bytes per output (1/80 + 1/128 against 128×256's 1/256 +
        // 1/128: 2.5 times) and are stored from registers (80) or in 32-column chunks (96), but
        // they cut 1–3 k columns into a wave of tiles without a split's hand-off: cuBLASLt's
        // 128×80 tile, unsplit, at such shapes (ncu-2026-12-03-2d1454d-off-grid).
        "128x80" => 1.33,
        "128x96" => 1.24,
        // Measured 0.97–1.01 (mean 0.993) of 128×256 per output element on the full-wave
        // shapes (8192³ and the TP=2 stage shapes, bf16 and f16: the measured time ratio over
        // this model's, benches/results/gemm-2026-11-30-d18f3ea-variants.md): the 12 % fewer
        // operand bytes per output did not buy speed. Costed equal, it wins only where its
        // wave count does (2048×13312).
        "192x192" | "192x192c2" => 1.0,
        // 1.36–1.43 per output element of 128×256 at M = 8192 (70B TP=2 QKV and o-proj,
        // bf16: 527 and 571 TFLOP/s against 755 and 776; gemm-grid-2026-12-01-469737e-70b):
        // an `m64n64k16` reads 4 KiB of shared memory per 65 536 MACs, 1.6 times 128×256's
        // rate. It wins where its halved tile still fits the waves: few rows (decode).
        //
        // `16x128` is `64x128` on a 12-stage ring, for at most 16 rows: costed the same and
        // listed before it in `VARIANTS`, so the tie goes to it wherever the rule would run
        // `64x128` unsplit (measured 0–9 % faster at one token, −3…+2 % at 16; NOTES step
        // 40b). Its split form `16x128s` is listed after `64x128s`, so the split decode
        // shapes keep `64x128s` (the short split measured 0–6 % slower at 16 tokens, even at
        // one).
        //
        // `16x64`, the same per-element work at half the width, is costed the same: per byte
        // of B streamed its main loop is `16x128`'s. Listed after `16x128` and `64x128`, a
        // tie (twice the waves of half-size tiles) keeps the wider tile (measured 2–8 % faster
        // at 8B fc1 and 405B o-proj/fc2); listed before `64x128s`, it takes the one-wave
        // shapes where the split would only match it. Measured at one token (NOTES step 41):
        // 8B QKV 20.1 against `64x128s`' 24.9 µs, 70B o-proj 24.3 against 27.5, 70B fc2 63.3
        // against 71.7 (and, once the split's decode hand-off was priced,
        // `SPLIT_DECODE_K_BLOCKS`, 8B o-proj and 70B QKV).
        "64x128" | "64x128w1" | "16x128" | "16x64" => 1.4,
        // `16x128t` and `16x64t`, `16x128` and `16x64` with the transposed product (a
        // quarter of their tensor work per byte of B): measured 1–10 % faster than those at
        // 1 and 16 tokens on every decode shape of the grid, and the split `16x128ts` 2–7 %
        // faster than `64x128s` (gemm-grid-2026-12-02-90ee5a3-m1; kernels-gpu/NOTES.md step
        // 51). Costed 3 % below them, so at most 16 rows this model (FP8's decode rule; in 16
        // bits the weight-stream model decides there since NOTES step 70) takes the
        // transposed form wherever it would take the plain one.
        //
        // `16x64t2`, `16x64t` with two k-blocks a stage, in its place: measured 1–12 % faster
        // than it at 1 and 16 tokens on all but one grid shape (8B o-proj 14.2 against 16.2
        // µs, 8B QKV 19.3 against 20.9; NOTES step 52, gemm-grid-2026-12-02-f66c553-m1) and
        // 9 % slower at 70B QKV (28.9 against 26.4, then 27.8 once A's box stopped at M, 1.04
        // of cuBLAS), so `16x64t` runs by name, costed as the plain short tiles. `16x128t2`
        // measured level with `16x128t` (−2…+0.2 %) and runs by name.
        "16x128t" | "16x64t2" => 1.4 * 0.97,
        "16x64t" | "16x128t2" => 1.4,
        // The narrow 64-row tiles (NOTES step 53): a block's ring stage takes about the same
        // time as `64x128`'s whatever the width, so per output element twice (64 wide) or four
        // times (32 wide) its cost. Only the weight-stream rule picks them (17–128 rows,
        // `weight_stream`), which also sees the DRAM floor and two k-blocks a stage; this
        // model prices them for `estimated_cost`'s other users.
        "64x64" | "64x64s" | "64x64k2" => 1.4 * 2.0,
        // `64x64k2` on one consumer warpgroup, which the area model sees only among the
        // one-wave 64-row tiles (`ONE_WAVE_64_ROW`): at 160–320 rows of 1024–2304 columns and
        // K = 4096–8192, 96–128 of its tiles ran 0.83–0.86 of `64x96k2`'s time in the same
        // rounds (192 × 2304 × 8192 23.1 against 27.7 µs, cuBLASLt 21.1; 224 × 2048 × 4096
        // 15.3 against 17.8; gemm-2026-12-04-7da7310-w64-*, NOTES step 87 (5)), so 1.75 ·
        // 0.845 · 96 / 64 per output element.
        "64x64k2w1" => 2.22,
        "64x32" | "64x32k2" => 1.4 * 4.0,
        // Ping-pong 128×128 (one warpgroup per tile, its epilogue hidden; FP8 only, see
        // `choose_variant`): per output element of its main loop, 1.07–1.08 of 128×256's in
        // e4m3 (the FP8 set's full-wave shapes) and 1.06–1.10 in bf16 (five prefill rows of
        // the 8B, 70B and 405B grids, K = 4096–16384), each against 128×256 in the same
        // rounds with that one's epilogue priced in (gemm-fp8-2026-12-02-cd9f2a3,
        // gemm-grid-2026-12-02-9251360-*): two `m64n128` slabs read 20 % more shared memory
        // per MAC than one `m64n256`.
        "128x128p" => 1.08,
        _ => 1.2,
    }
}

/// What a tile's epilogue costs per output element, in k-blocks of 128×256's main loop: the
/// accumulators scaled, converted, staged through shared memory and stored (with C read where
/// beta ≠ 0) while the tensor cores idle. Priced from [`COMPUTE_BOUND_ROWS`] only: below, the
/// producer keeps the weight stream going through an epilogue (the ring has free slots), so
/// the run is the stream's length either way. Measured 1–7 (mostly 2–4) across the 8B and 70B
/// grids' prefill rows by skipping the epilogue in a diagnostic build (`diag/no-epilogue`,
/// ff7eae0; 4–6 % of the run at K = 4096, 1–2 % at 8192; gemm-grid-2026-12-02-ff7eae0-*
/// against gemm-grid-2026-12-02-5b168e3-* in the same call), and 3 from ping-pong's gain over
/// 128×256 at the FP8 shapes of 3584 e4m3 columns (28 k-blocks of pairs).
const EPILOGUE_K_BLOCKS: f64 = 3.0;

/// [`EPILOGUE_K_BLOCKS`] with FP8 row-wise scales: each accumulator also multiplied by its
/// row's and column's scale (read from shared memory). Row-wise over tensor-wise on 128×256
/// measured 1.4–3.1 % at 28–52 k-blocks (gemm-fp8-2026-12-02-5b168e3-*-rounds9; NOTES step
/// 35j), one k-block more.
const ROW_SCALED_EPILOGUE_K_BLOCKS: f64 = 4.0;

/// Estimated relative run time of `variant` on an `m × n × k` problem with `sm_count` SMs, with
/// a 16-bit or tensor-wise-scaled epilogue (`EPILOGUE_K_BLOCKS`).
///
/// Without split-K, `⌈tiles / slots⌉` waves of one tile's main loop and epilogue each; a
/// ping-pong configuration ([`ConsumerSplit::Tiles`]) pays its main loops in waves and one
/// epilogue, the last, since each other one runs beside the other warpgroup's main loop. A
/// split-K configuration runs one wave of [`split_grid`] blocks (or, where that finds no split
/// that pays, one block per tile up to the SMs), each its `⌈W/G⌉` of the `W = tiles · ⌈K/64⌉`
/// k-blocks plus the hand-off of its most-cut tile (`split_hand_off`) and one epilogue.
/// In units of output elements of 128×256's main loop over the whole K.
/// Operands whose rows all start on 32-byte boundaries ([`SectorAlignment::ALIGNED`]).
#[must_use]
pub fn estimated_cost(variant: &GemmVariant, m: u64, n: u64, k: u64, sm_count: u32) -> f64 {
    let problem = (m, n, k, SectorAlignment::ALIGNED);
    cost_with_epilogue(variant, problem, sm_count, EPILOGUE_K_BLOCKS)
}

/// An `m × n × k` problem and where its operands' rows start.
type Problem = (u64, u64, u64, SectorAlignment);

/// [`estimated_cost`] of `problem` with an epilogue of `epilogue` k-blocks per output element.
fn cost_with_epilogue(
    variant: &GemmVariant,
    (m, n, k, rows): Problem,
    sm_count: u32,
    epilogue: f64,
) -> f64 {
    let c = variant.config;
    let slots = u64::from((sm_count / c.cluster_m) * c.cluster_m).max(1);
    let tiles = tile_count(variant, m, n);
    let area = f64::from(c.block_m * c.block_n);
    let k_blocks = k.div_ceil(u64::from(BLOCK_K)).max(1) as f64;
    let main_loop = area * main_loop_cost(variant, rows);
    let epilogue = if m >= COMPUTE_BOUND_ROWS {
        area * epilogue / k_blocks
    } else {
        0.0
    };
    if !c.split_k {
        let waves = tiles.div_ceil(slots) as f64;
        return match c.split {
            ConsumerSplit::Tiles => waves * main_loop + epilogue,
            ConsumerSplit::Rows | ConsumerSplit::Columns | ConsumerSplit::Single => {
                waves * (main_loop + epilogue)
            }
        };
    }
    let grid = split_grid(variant, m, n, k, sm_count)
        .map_or_else(|| tiles.min(slots), u64::from)
        .max(1);
    let main_loop = if c.block_m == 64 && m > weight_stream::MAX_ROWS && k >= 8192 {
        main_loop * SPLIT_64_ROW_MANY_ROWS
    } else {
        main_loop
    };
    main_loop * split_k_blocks(variant, m, tiles, k_blocks as u64, grid) / k_blocks + epilogue
}

/// What a 64-row split tile's main loop costs over its base tile's above
/// [`weight_stream::MAX_ROWS`] (the weight-stream band, where the other split costs were
/// fitted) at K ≥ 8192: on 20 off-grid shapes of 160–1024 rows (N = 1024–3072, K =
/// 8192–16384; NOTES step 87 (4), gemm-2026-12-04-7da7310-mid-rows-*) `64x128s` ran 1.12–1.42
/// of this model's estimate relative to the unsplit `64x128` in the same rounds, while the
/// 128-row split tiles ran 0.6–1.1 of theirs. With [`SPLIT_PARTIAL_MANY_ROWS_K_BLOCKS`], this
/// factor brings the rule from 2.1 % to 0.6 % off the fastest measured candidate over those
/// records and the one-wave `64x64k2w1` survey's (68 in all; NOTES step 89). At K = 4096 the
/// split `64x128s` measured 14–20 % faster than what the factor moved it to (161 × 1024 ×
/// 4096: 14.7 µs against `64x96k2`'s 16.7 and `64x128`'s 17.6), so it stops there.
const SPLIT_64_ROW_MANY_ROWS: f64 = 1.3;

/// [`cost_per_element`], or, where rows of A or B start off 32-byte boundaries
/// ([`SectorAlignment`]), what their L2 requests cost if that is more: the main loop is then
/// bound by the requests of the off-sector rows a block loads per output element — `1/block_n`
/// of A, `1/(block_m · cluster_m)` of B (a cluster pair sharing B loads half its box each) —
/// at [`OFF_SECTOR_ROW_COST`] per 128×256's rows per output element (both operands off).
fn main_loop_cost(variant: &GemmVariant, rows: SectorAlignment) -> f64 {
    let c = variant.config;
    let compute = cost_per_element(variant);
    if !rows.any_off() {
        return compute;
    }
    // Each row of A a block loads serves `block_n` outputs, each of B `block_m · cluster_m`.
    let per_output = |outputs_per_a_row: u32, outputs_per_b_row: u32| {
        rows.off_sector_rows(
            1.0 / f64::from(outputs_per_a_row),
            1.0 / f64::from(outputs_per_b_row),
        )
    };
    let requests = OFF_SECTOR_ROW_COST * per_output(c.block_n, c.block_m * c.cluster_m)
        / (1.0 / 256.0 + 1.0 / 128.0);
    compute.max(requests)
}

/// What 128×256's main loop costs per output element where both operands' rows start off
/// 32-byte boundaries, in units of its cost on aligned rows ([`main_loop_cost`]). Fitted (least
/// squares on the log of the ratio) to 78 pairs of records, eight 128-row configurations each
/// timed at K ≡ 8 mod 16 and at K − 8 in the same rounds on six shapes of 512–8192 rows, bf16
/// and f16 (`benches/results/gemm-2026-12-04-cc712bf-offsector-{big,mid}-*`,
/// `…-offsector-7000x3000x5000-and-4-more-tiles`; kernels-gpu/NOTES.md step 93): `128x256`
/// measured 1.05–1.46 times its aligned time, `128x128` 1.50–1.84, `128x128c2` 1.19–1.29,
/// `128x256c2` (half of B's rows a block) 0.96–1.12, each within ~10 % of this model.
const OFF_SECTOR_ROW_COST: f64 = 1.27;

/// Output tiles of `variant` on an `m × n` output, whole clusters.
pub(super) fn tile_count(variant: &GemmVariant, m: u64, n: u64) -> u64 {
    let c = variant.config;
    m.div_ceil(u64::from(c.block_m))
        .next_multiple_of(u64::from(c.cluster_m))
        * n.div_ceil(u64::from(c.block_n))
}

/// A split-K grid of `grid` blocks' longest run, in k-blocks of the main loop: its share of
/// the k-blocks, the hand-off of the most-cut tile where a tile is cut, and
/// [`STREAM_K_K_BLOCKS`] where the blocks' ranges do not follow the tiles (`grid` not a
/// multiple of `tiles`). Infinite where the partition does not fit the kernel's 32-bit
/// arithmetic ([`stream_k::fits`]): the configuration cannot run that grid.
fn split_k_blocks(variant: &GemmVariant, m: u64, tiles: u64, k_blocks: u64, grid: u64) -> f64 {
    if !stream_k::fits(tiles, k_blocks, grid) {
        return f64::INFINITY;
    }
    let partition = StreamK::new(tiles as u32, k_blocks as u32, grid as u32);
    let pieces = partition.max_pieces();
    let stream = if grid.is_multiple_of(tiles.max(1)) {
        0.0
    } else {
        STREAM_K_K_BLOCKS
    };
    (tiles * k_blocks).div_ceil(grid) as f64 + split_hand_off(variant, m, pieces) + stream
}

/// What cutting a tile into `pieces` costs its last piece, in k-blocks of the main loop
/// (nothing for an uncut tile): [`SPLIT_ROUND_TRIP_K_BLOCKS`] per L2 round trip of the
/// finishing warpgroup's sum (`⌈pieces / sum_group⌉` of them: `TileConfig::sum_group`) and
/// [`SPLIT_PARTIAL_K_BLOCKS`] per piece and 64 real rows of partial sums (each piece stores
/// them, the finisher reads them all back; [`SPLIT_PARTIAL_MANY_ROWS_K_BLOCKS`] for a 128-row
/// tile narrower than 256 in 3 or more pieces above [`weight_stream::MAX_ROWS`]), plus
/// [`SPLIT_DECODE_K_BLOCKS`] at most [`DECODE_ROWS`] rows.
fn split_hand_off(variant: &GemmVariant, m: u64, pieces: u32) -> f64 {
    if pieces <= 1 {
        return 0.0;
    }
    let c = variant.config;
    let round_trips = pieces.div_ceil(c.sum_group()) as f64;
    let rows = m.min(u64::from(c.block_m)) as f64 / 64.0;
    let partial =
        if c.block_m >= 128 && c.block_n < 256 && m > weight_stream::MAX_ROWS && pieces >= 3 {
            SPLIT_PARTIAL_MANY_ROWS_K_BLOCKS
        } else {
            SPLIT_PARTIAL_K_BLOCKS
        };
    let decode = if m <= DECODE_ROWS {
        SPLIT_DECODE_K_BLOCKS
    } else {
        0.0
    };
    SPLIT_ROUND_TRIP_K_BLOCKS * round_trips + partial * f64::from(pieces) * rows + decode
}

/// Rows up to which a k-block of the main loop is a pure stream of weights (8–16 KiB of B,
/// ~0.23 µs at decode): the rows the 16-row tiles serve.
pub(super) const DECODE_ROWS: u64 = TILE_16X128.max_rows() as u64;

/// What the rest of a split's hand-off costs where k-blocks are that short, in k-blocks: the
/// chain after the main loop (partials stored, a fence and the counted arrival, the finisher's
/// read-back, only then the epilogue) measured ~5 µs at one token, not the ~1 µs that
/// [`SPLIT_ROUND_TRIP_K_BLOCKS`] alone stands for. Fitted to the decode rows of
/// `gemm-grid-2026-12-01-16a62a3-m1` (each shape's split and unsplit tiles timed in the same
/// rounds; kernels-gpu/NOTES.md step 41): at 17–48 it runs `16x64` unsplit at 8B o-proj and 70B
/// QKV (5–8 % faster at one token than `64x128s`, 2–3 % at 16) and `16x128` at 70B fc1 (4 %
/// faster at one token), and keeps the split at 8B fc2 and 405B QKV (16–42 % faster there).
/// At more rows a k-block's tensor work makes the same latency a smaller share (the other two
/// constants' fits at 128 and 512 rows stand alone).
const SPLIT_DECODE_K_BLOCKS: f64 = 20.0;

/// What one L2 round trip of split-K's sum costs, in k-blocks of the unit's main loop: at
/// decode a 64-deep k-block of a weight-streaming `64x128` tile takes ~0.23 µs (405B QKV at
/// TP 8, M = 1: 58 µs for 256 k-blocks, gemm-grid-2026-12-01-e6d8b28-405b) and an L2 round
/// trip under load ~0.5–1 µs, plus the counter hand-off.
const SPLIT_ROUND_TRIP_K_BLOCKS: f64 = 4.0;

/// What a split's partial sums cost per 64 real rows, in k-blocks: a 64-row partial of a
/// 128-wide tile is 32 KiB of f32, twice a k-block's 16 KiB of B, stored by the split and read
/// back by the finisher. Fitted (4.4–7.7) to three measured choices between a 128-row split
/// tile and the best unsplit one (kernels-gpu/NOTES.md step 37): `128x128s` slower than
/// `64x128` at 70B QKV with 128 rows, faster at 8B fc2 with 128 rows; `128x256s` faster than
/// `128x128` at 405B QKV with 512 rows.
const SPLIT_PARTIAL_K_BLOCKS: f64 = 6.0;

/// [`SPLIT_PARTIAL_K_BLOCKS`] for the 128-row split tiles narrower than 256 cut into 3 or
/// more pieces above [`weight_stream::MAX_ROWS`]: there they ran 0.6–0.95 of this model's
/// estimate with 4–8 pieces (NOTES step 87 (4)); refitted with [`SPLIT_64_ROW_MANY_ROWS`] on
/// the same records (NOTES step 89). In two pieces it keeps the old price: with this one
/// `128x160s` in two pieces took shapes from the one-wave `128x80` that it measured 0–9 %
/// slower (449 × 2560 × 14336, 961 × 1280 × 14336), and 3 for every split moves 768 × 1536 ×
/// 8192 from `128x80` to `128x144s`, 5 % slower. `128x256s` keeps it too: with this one, in
/// FP8 it took 128 × 128's shapes at 257–897 rows and K = 28672, and measured 9–10 % slower
/// there (83.3 against 75.4 µs at 257 × 3584 × 28672).
const SPLIT_PARTIAL_MANY_ROWS_K_BLOCKS: f64 = 4.0;

/// The configuration the rule picks for an `m × n × k` problem on a GPU with `sm_count` SMs:
/// the cheapest by [`estimated_cost`], split-K ones only where they split (`s ≥ 2`, i.e. the
/// tiles fill at most half the SMs), ping-pong never (it runs by name in 16 bits), the narrow
/// 64-row tiles only as `64x64k2w1` in one wave of at least three quarters of the SMs at
/// K = 4096–8192 (the others were measured only where the weights stream). Up to 128 rows,
/// instead, the
/// fastest tile by a model of the weight stream (`host/src/gemm/weight_stream.rs`: the decode
/// tiles at most 16 rows, the 64-row ones above), where that model holds (above 64 rows,
/// where some candidate's tiles fit one wave). For operands whose rows all start on 32-byte
/// boundaries; [`choose_variant_for`] takes where they start.
#[must_use]
pub fn choose_variant(m: u64, n: u64, k: u64, sm_count: u32) -> &'static GemmVariant {
    choose_variant_for(m, n, k, sm_count, SectorAlignment::ALIGNED)
}

/// [`choose_variant`] for operands whose rows start where `rows` says: where some start off
/// 32-byte boundaries, both models price their L2 requests (`main_loop_cost`,
/// `weight_stream`'s off-sector floors), which favours the tiles that load fewer rows per
/// output element — the clusters sharing B, the wider and the split tiles.
#[must_use]
pub fn choose_variant_for(
    m: u64,
    n: u64,
    k: u64,
    sm_count: u32,
    rows: SectorAlignment,
) -> &'static GemmVariant {
    if m <= weight_stream::MAX_ROWS
        && let Some(v) = weight_stream::choose(m, n, k, sm_count, rows)
    {
        return v;
    }
    // Ping-pong only in FP8: in 16 bits it measured 2–7 % slower than 128×256 where this
    // model has it 1–9 % faster (8192 × 4096 × 2048, 8192 × 8192 × 1024, 405B o-proj at TP 8
    // with 2048 and 8192 rows) and level with 128×128 at 768–2048 rows
    // (gemm-grid-2026-12-02-9e4c1dd-405b-tp8-o-proj-*,
    // gemm-2026-12-02-9e4c1dd-8192x8192x1024-and-5-more; kernels-gpu/NOTES.md step 47
    // outcome), while in e4m3 the same model's picks measured 3–5 % faster.
    let k_blocks = k.div_ceil(u64::from(BLOCK_K));
    let sixteen_bit = VARIANTS.iter().filter(|v| {
        v.config.split != ConsumerSplit::Tiles
            && (!weight_stream::picked_only_here(v) || ONE_WAVE_64_ROW.contains(&v.name))
            && (!ONE_WAVE_64_ROW.contains(&v.name)
                || (ONE_WAVE_64_ROW_K_BLOCKS.contains(&k_blocks)
                    && fills_one_wave(v, tile_count(v, m, n), sm_count)))
    });
    cheapest(sixteen_bit, (m, n, k, rows), sm_count, EPILOGUE_K_BLOCKS)
}

/// The 64-row tiles that compete in [`choose_variant`] only at [`ONE_WAVE_64_ROW_K_BLOCKS`]
/// and where their tiles leave an SM free: `64x64k2w1` and `64x96k2` (two k-blocks a stage,
/// for narrow N; the first otherwise the weight-stream rule's, [`weight_stream`]) and the
/// wide `64x208` and `64x240` (a 64-row granularity for ragged rows of 5–10 k columns).
const ONE_WAVE_64_ROW: [&str; 4] = ["64x64k2w1", "64x96k2", "64x208", "64x240"];

/// Whether `tiles` tiles of the [`ONE_WAVE_64_ROW`] configuration `v` make one wave that
/// leaves an SM free, and, for `64x64k2w1`, fill at least three quarters of the SMs: where it
/// wins (0.83–0.86 of `64x96k2`'s time) it was measured on 96–128 tiles (NOTES step 87 (5));
/// with 80 (320 × 1024 × 8192) the split `64x128s` that the rule runs there was 12 % faster
/// (19.9 against 22.6 µs), and fewer tiles were not measured.
fn fills_one_wave(v: &GemmVariant, tiles: u64, sm_count: u32) -> bool {
    let sms = u64::from(sm_count);
    tiles < sms && (v.name != "64x64k2w1" || 4 * tiles >= 3 * sms)
}

/// The depths, in 64-deep k-blocks, at which the [`ONE_WAVE_64_ROW`] tiles compete in
/// [`choose_variant`]: K = 4096–8192, where they were measured. For `64x96k2`: of 21 of the
/// rule's moves to it sampled at 129–704 rows, each against `64x128` in the same rounds
/// (gemm-2026-12-03-4dffe51-129x2048x6144-and-17-more-64x96k2-moves and the survey
/// gemm-2026-12-03-d348a15-*-survey; NOTES step 76), 19 ran 1–9 % faster, one level and one
/// 2.8 % slower (704 × 1024 × 4096). Outside, its cost (one per output element) misleads: at
/// K ≤ 2048 its five deep stages fill later and it ran 2–4 % slower than `64x128` (768 ×
/// 1024 × 2048 13.4 against 13.0 µs, 176 × 3584 × 1024 10.3 against 10.0), and at K ≥ 14336
/// 4–18 % slower than the split `128x128s` (768 × 1024 × 16384 63.5 against 53.7, 384 × 2048
/// × 14336 51.2 against 49.1). Those two and 768 × 1024 × 8192 (35.0 against `64x128`'s
/// 30.3) are waves of tiles that fill every SM; 704 × 1152 × 8192, one too, ran 5 % faster
/// (29.8 against 31.5). Until that loss is understood, a full wave keeps `64x128`.
/// `64x208` and `64x240` were measured at K = 4096 and 8192 only (NOTES step 78).
const ONE_WAVE_64_ROW_K_BLOCKS: std::ops::RangeInclusive<u64> = 64..=128;

/// The candidate with the smallest [`estimated_cost`]; within 0.1 % the earlier one (the
/// order of [`VARIANTS`]: the simpler launch first). A split-K candidate that would not split
/// is skipped (it is its base configuration plus the hand-off), as is a short tile on more
/// rows than it serves (`TileConfig::max_rows`).
fn cheapest<'v>(
    candidates: impl Iterator<Item = &'v GemmVariant>,
    problem: Problem,
    sm_count: u32,
    epilogue: f64,
) -> &'v GemmVariant {
    let (m, n, k, _) = problem;
    let mut candidates = candidates.filter(|v| {
        m <= u64::from(v.config.max_rows())
            && (!v.config.split_k || split_grid(v, m, n, k, sm_count).is_some())
    });
    let first = candidates
        .next()
        .expect("at least one candidate configuration");
    let cost = |v: &GemmVariant| cost_with_epilogue(v, problem, sm_count, epilogue);
    candidates.fold(first, |best, v| {
        if cost(v) < cost(best) * 0.999 {
            v
        } else {
            best
        }
    })
}

/// The configuration the rule picks for an FP8 GEMM with an `m × n` output and `k_pairs`
/// columns of e4m3 pairs (the kernel's view: K/2 16-bit columns): the cheapest by
/// [`estimated_cost`] among those compiled for e4m3, as [`choose_variant`], with the row-wise
/// epilogue's price (`ROW_SCALED_EPILOGUE_K_BLOCKS`) for [`ScaleMode::Rowwise`]. A k-block of pairs
/// takes a 16-bit k-block's time (twice the elements at twice the tensor rate), so an FP8
/// GEMM's epilogue weighs as a 16-bit one's at half its K: ping-pong wins at shorter K
/// (70B fc2 at TP 8, 3584 columns: 737 µs against 128×256's 776). From 17 to 64 rows, the
/// weight-stream model's pick among the 64-row tiles, as in 16 bits. Rows off 32-byte
/// boundaries (K ≡ 16 mod 32 e4m3 elements) are not priced here: measured only in 16 bits
/// ([`choose_variant_for`]), and no e4m3 configuration shares B in clusters.
#[must_use]
pub fn choose_fp8_variant(
    m: u64,
    n: u64,
    k_pairs: u64,
    sm_count: u32,
    scales: ScaleMode,
) -> &'static GemmVariant {
    let epilogue = match scales {
        ScaleMode::Tensorwise => EPILOGUE_K_BLOCKS,
        ScaleMode::Rowwise => ROW_SCALED_EPILOGUE_K_BLOCKS,
    };
    // From 17 to 64 rows the weight stream decides, as in 16 bits (measured in e4m3 at 32
    // and 64 rows); elsewhere the narrow tiles run by name only.
    if m > DECODE_ROWS
        && m <= weight_stream::FP8_MAX_ROWS
        && let Some(v) = weight_stream::choose_fp8(m, n, k_pairs, sm_count)
    {
        return v;
    }
    let fp8 = VARIANTS
        .iter()
        .filter(|v| v.kernel_e4m3.is_some() && !weight_stream::picked_only_here(v));
    cheapest(
        fp8,
        (m, n, k_pairs, SectorAlignment::ALIGNED),
        sm_count,
        epilogue,
    )
}

/// Height of the tile order's bands, in cluster tiles, for `variant` on an `m × n` output run
/// by a grid of `resident` clusters (see `kernels_gpu::layout::raster`).
///
/// The grid works on `W = min(resident, cluster tiles)` tiles at once: a patch of `g` cluster
/// rows by `W / g` tile columns, whose operands — `g · block_m · cluster_m` rows of A and
/// `(W / g) · block_n` rows of B, all K columns — come from DRAM once and are then shared
/// through L2. That footprint is smallest at `g = √(W · block_n / (block_m · cluster_m))`:
/// 16 m-tiles for 128×256 tiles on 132 SMs (a 2048 × 2112-row patch, where bands of 8 read
/// 1024 + 4224 rows: 26 % more DRAM traffic per wave), 11 for 128×128. Rounded, and at most
/// the problem's cluster rows.
#[must_use]
pub fn raster_group_m(variant: &GemmVariant, m: u64, n: u64, resident: u32) -> u32 {
    let c = variant.config;
    let cluster_rows = m
        .div_ceil(u64::from(c.block_m))
        .div_ceil(u64::from(c.cluster_m));
    let tiles = cluster_rows * n.div_ceil(u64::from(c.block_n));
    let concurrent = tiles.min(u64::from(resident)).max(1) as f64;
    let tile_rows = f64::from(c.block_m * c.cluster_m);
    let g = (concurrent * f64::from(c.block_n) / tile_rows)
        .sqrt()
        .round() as u64;
    g.clamp(1, cluster_rows.max(1)) as u32
}

/// The most k-splits of a tile in plain split-K (`s` blocks per tile): bounds the
/// partial-sum traffic.
pub const MAX_SPLITS: u32 = 32;

/// The fewest 64-wide k-blocks a block of a split grid runs: below this the pipeline's fill
/// and the partial sum's write and read cost more than the split saves.
pub const MIN_SPLIT_K_BLOCKS: u64 = 8;

/// The most rows of partial sums with which two splits still pay: measured, two splits of
/// 48–64 tiles gained 7–20 % at 1 and 16 rows and lost 5–12 % at 64 (NOTES step 37): there the
/// unsplit kernel already streams ~3.8 TB/s on half the SMs, and the partials are 64 rows.
pub const TWO_SPLIT_MAX_ROWS: u64 = 16;

/// Rows from which the main loop is bound by its tensor work, not by the weights' stream. A
/// GEMM does `2·M·N·K` FLOP on `2·N·K` bytes of weights, M FLOP a byte, and the H200 is
/// compute-bound above 989 TFLOP/s / 4.8 TB/s ≈ 206 FLOP a byte.
pub const COMPUTE_BOUND_ROWS: u64 = 256;

/// Rows from which two splits pay again: from [`COMPUTE_BOUND_ROWS`] a split's second block
/// adds tensor throughput, where at 17–255 rows the unsplit tiles already stream the weights as
/// fast as DRAM gives them.
pub const TWO_SPLIT_MIN_ROWS: u64 = COMPUTE_BOUND_ROWS;

/// The most rows for which a grid of one block per SM takes stream-K ranges that are not
/// whole splits of every tile. Measured (kernels-gpu/NOTES.md step 39): with 64 rows every
/// such grid ran 5–20 % slower than the best unsplit or plainly split one; with more than one
/// row of tiles, the tiles that share a B panel run at different k-offsets in different
/// blocks, so B comes from DRAM once per tile row (405B fc1 at TP 8 with 512 rows: 1.8× the
/// time).
pub const STREAM_K_MAX_ROWS: u64 = 16;

/// What a stream-K grid (one block per SM, ranges that do not follow the tiles) costs beyond
/// its share of the k-blocks and the hand-off of its most-cut tile, in k-blocks of the main
/// loop. Fitted to the grid run of step 39 (one H200, 1–16 rows, 64×128 tiles, ~0.5 µs per
/// k-block with every SM on the weight stream): it gained where it saved 39 and 54 k-blocks a
/// block (70B fc1 at TP 2: 136 → 124 µs; 405B fc1 at TP 8: 135 → 116 µs) and lost where it
/// saved 19 (8B fc1: 70 → 77 µs) and against plain splits of 32–64 tiles; 24 puts the
/// break-even between. What the time is spent on is not yet measured.
const STREAM_K_K_BLOCKS: f64 = 24.0;

/// The grid of a split-K configuration ([`SplitParams`](kernels_gpu::gemm_abi::SplitParams)):
/// how many blocks share the tiles' k-blocks out (stream-K,
/// [`kernels_gpu::layout::stream_k`]) on an `m × n × k` problem with `sm_count` SMs, or
/// `None` where no split pays by the estimate (`split_k_blocks` against a wave of whole
/// tiles) and for configurations without split-K.
///
/// Candidates: plain split-K, `G = tiles · s` with `s = ⌊SMs / tiles⌋` (at most
/// `MAX_SPLITS`, at least `MIN_SPLIT_K_BLOCKS` k-blocks a split; two only for at most
/// `TWO_SPLIT_MAX_ROWS` rows): one wave of units, since every split adds to the finishing
/// warpgroup's sum (NOTES steps 34 and 37); and, for at most `STREAM_K_MAX_ROWS` rows, one
/// block per SM (fewer if that left a block under `MIN_SPLIT_K_BLOCKS`) at an extra
/// `STREAM_K_K_BLOCKS` — the stream-K grid, which evens out a last wave of few tiles (224
/// tiles on 132 SMs: 1.7 tiles' worth each instead of 2 waves) and a tile count far from a
/// divisor of the SMs (104 tiles: 1.3 tiles' worth instead of 1 wave with 28 SMs idle).
///
/// Examples on 132 SMs: 1 × 2304 × 16384 (405B QKV at TP 8) in 64×128 tiles: 18 tiles,
/// 7 splits of 36–37 k-blocks (126 blocks); 16 × 8192 × 14336 in 128×256 tiles: 32 tiles, 4
/// splits; 16 × 13312 × 16384 (405B fc1 at TP 8) in 64×128 tiles: 104 tiles on 132 blocks of
/// 201–202 k-blocks.
#[must_use]
pub fn split_grid(variant: &GemmVariant, m: u64, n: u64, k: u64, sm_count: u32) -> Option<u32> {
    let c = variant.config;
    if !c.split_k {
        return None;
    }
    let tiles = tile_count(variant, m, n);
    if tiles == 0 {
        return None;
    }
    let slots = u64::from(sm_count.max(1));
    let k_blocks = k.div_ceil(u64::from(BLOCK_K)).max(1);
    // Saturating: past 2^64 no grid's partition fits 32 bits (`split_k_blocks` prices those
    // grids infinite, so they are never taken).
    let work = tiles.saturating_mul(k_blocks);
    let max_grid = work / MIN_SPLIT_K_BLOCKS;
    let splits = (slots / tiles.max(1))
        .min(k_blocks / MIN_SPLIT_K_BLOCKS)
        .min(u64::from(MAX_SPLITS));
    let two_pays = m <= TWO_SPLIT_MAX_ROWS || m >= TWO_SPLIT_MIN_ROWS;
    let plain = (splits >= 2 && (splits > 2 || two_pays)).then(|| {
        (
            tiles * splits,
            split_k_blocks(variant, m, tiles, k_blocks, tiles * splits),
        )
    });
    let stream = slots.min(max_grid);
    let stream = (m <= STREAM_K_MAX_ROWS && !stream.is_multiple_of(tiles.max(1)))
        .then(|| (stream, split_k_blocks(variant, m, tiles, k_blocks, stream)));
    let whole_tiles = tiles.div_ceil(slots) as f64 * k_blocks as f64;
    plain
        .into_iter()
        .chain(stream)
        .filter(|&(_, cost)| cost < whole_tiles)
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(grid, _)| grid as u32)
}

/// The compiled configuration named `name`: any [`GemmVariant::name`] in [`VARIANTS`] (the
/// table `gemm_abi::gemm_variants!` generates), e.g. `128x256`, the split-K `128x144s`, the
/// ping-pong `128x128p` or the decode tile `16x64t2` (the short tiles serve at most
/// `TileConfig::max_rows` rows).
#[must_use]
pub fn variant_named(name: &str) -> Option<&'static GemmVariant> {
    VARIANTS.iter().find(|v| v.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_filled_last_wave_wins() {
        // 2048×13312 (405B fc1, TP=8 stage), in units of a 128×256 tile's time: 832 wide tiles
        // = 6.3 waves → 7; 1664 narrow ones = 12.6 → 13 · 1.06 / 2 = 6.89; 11 · 70 = 770
        // tiles of 192×192 = 5.8 waves → 6 · 1.125 = 6.75. Measured: 192×192 3–4 % faster
        // than 128×256 and 6–7 % faster than 128×128 (gemm-2026-11-30-d18f3ea-variants.md).
        assert_eq!(choose_variant(2048, 13312, 16384, 132).name, "192x192");
        // 2048×16384 (405B fc2, TP=8 stage): 8 waves against 16 · 1.06 / 2 = 8.5: wide.
        assert_eq!(choose_variant(2048, 16384, 6656, 132).config.block_n, 256);
    }

    #[test]
    fn full_waves_keep_the_large_tile_and_ragged_waves_split() {
        // 8192×8192: 64×32 = 2048 tiles of 128×256 = 15.5 waves on 132 SMs: keeps wide tiles.
        assert_eq!(choose_variant(8192, 8192, 8192, 132).config.block_n, 256);
        // 2048×7168: 448 wide tiles = 3.39 waves (4 waves for 3.39 of work); 896 narrow
        // tiles = 6.8 waves (7 · 1.06 / 2 = 3.71); 512 tiles of 224 columns = 3.88 waves
        // (4 · 1.02 · 224 / 256 = 3.57): the 224-wide tiles win.
        assert_eq!(choose_variant(2048, 7168, 8192, 132).config.block_n, 224);
        // 8192×8192 in 224-wide tiles: 64 × 37 = 2368 tiles, 18 waves (17.9) against 16
        // (15.5) of 256-wide ones: 18 · 1.02 · 224 / 256 = 16.07 > 16, the wide tiles stay.
        assert_eq!(choose_variant(8192, 8192, 8192, 132).config.block_n, 256);
    }

    #[test]
    fn widths_that_160_divides_fill_the_wave() {
        // 70B QKV at TP 2 (5120 = 32 · 160), 512 rows: 128 tiles of 128×160 make one wave
        // (20 480 · 1.045 = 21 402) against 92 of 128×224 (one wave, 28 672 · 1.02 = 29 245),
        // 80 of 128×256 (32 768) and 160 of 128×128 (two waves: 34 734).
        assert_eq!(choose_variant(512, 5120, 8192, 132).name, "128x160");
        // 8192 columns: 52 tiles of 160 a row against 32 of 256: the wide tiles stay.
        assert_eq!(choose_variant(8192, 8192, 8192, 132).name, "128x256");
    }

    #[test]
    fn widths_that_192_divides_fill_the_wave() {
        // 8B QKV (6144 = 32 · 192), 512 rows, 64 k-blocks: 128 tiles of 128×192, one wave
        // (24 576 · (1.045 + 3/64) = 26 834 with the epilogue), against 112 of 128×224 (one
        // wave, 28 672 · (1.02 + 3/64) = 30 589) and 192 of 128×160 (two waves):
        // measured 41.5 µs against 128×224's 45.5 (gemm-grid-2026-12-02-df32b06-m512).
        assert_eq!(choose_variant(512, 6144, 4096, 132).name, "128x192");
        // 3000 × 5000: 648 tiles of 128×192 in 5 waves (5 · 24 576 · (1.045 + 3/64) =
        // 134 170) against 768 of 128×160 in 6 (6 · 20 480 · (1.045 + 3/64) = 134 170): a tie
        // that the listing order gives to 128×192, measured 1–2 % faster there (168.9 against
        // 172.1 µs in bf16).
        assert_eq!(choose_variant(3000, 5000, 4096, 132).name, "128x192");
        // Two waves of 128×192 against three of 128×128 (1500 × 4096 × 14336: 228 against 239
        // µs).
        assert_eq!(choose_variant(1500, 4096, 14336, 132).name, "128x192");
        // 70B QKV (5120 columns): 27 tiles of 192 a row, the last 128 wide; 128×160 stays.
        assert_eq!(choose_variant(512, 5120, 8192, 132).name, "128x160");
    }

    #[test]
    fn bands_make_the_wave_patch_square_in_operand_rows() {
        let wide = variant_named("128x256").unwrap();
        let narrow = variant_named("128x128").unwrap();
        let wide_c2 = variant_named("128x256c2").unwrap();
        assert_eq!(raster_group_m(wide, 16384, 28672, 132), 16);
        assert_eq!(raster_group_m(narrow, 16384, 28672, 132), 11);
        // Clusters: 66 resident pairs of 256 × 256 → 8 cluster rows (16 m-tiles).
        assert_eq!(raster_group_m(wide_c2, 16384, 28672, 66), 8);
        // Never more than the problem's rows, never 0.
        assert_eq!(raster_group_m(wide, 1024, 28672, 132), 8);
        assert_eq!(raster_group_m(wide, 1, 8, 132), 1);
    }

    #[test]
    fn split_grids_fill_the_sms() {
        let s = variant_named("128x256s").unwrap();
        // 32 tiles: 4 splits make one full wave of 128 blocks.
        assert_eq!(split_grid(s, 16, 8192, 14336, 132), Some(128));
        // The tiles fill the SMs in whole waves, or too many rows for stream-K: no split.
        assert_eq!(split_grid(s, 8192, 8192, 8192, 132), None);
        assert_eq!(split_grid(s, 64, 28672, 8192, 132), None);
        // Short K, 17 rows (one past the decode rows): at least 8 k-blocks a split (K = 2048:
        // 32 k-blocks, 4 splits of 8), and the split must pay: at K = 1024, 4 splits would
        // run 4 of 16 k-blocks and hand off 4 partials, one L2 round trip each (4 · 4 + 4):
        // 24 > 16. At 16 rows the decode hand-off (20 more) makes even K = 2048 not pay.
        assert_eq!(split_grid(s, 17, 8192, 2048, 132), Some(128));
        assert_eq!(split_grid(s, 17, 8192, 1024, 132), None);
        assert_eq!(split_grid(s, 16, 8192, 2048, 132), None);
        let narrow = variant_named("64x128s").unwrap();
        // Two splits only for few rows: 8B QKV (48 tiles of 64×128) at 16 and 64 tokens.
        assert_eq!(split_grid(narrow, 16, 6144, 4096, 132), Some(96));
        assert_eq!(split_grid(narrow, 64, 6144, 4096, 132), None);
        // 405B QKV at TP 8, one token, 64×128 tiles: 18 tiles, 7 splits (126 blocks).
        assert_eq!(split_grid(narrow, 1, 2304, 16384, 132), Some(126));
        // Stream-K where a last wave or idle SMs waste more than its extra cost and the
        // decode hand-off: 405B fc1 at TP 8 (104 tiles, 28 SMs idle: 256 against
        // 202 + 4 + 24 + 20 = 250); not 70B fc1 at TP 2 (224 tiles: 2 waves of 128 k-blocks,
        // against 218 + 4 + 24 + 20 = 266; its 2 waves of `16x128` measured 4 % faster than
        // stream-K at one token) nor 8B fc1 (224 tiles of 64 k-blocks: 128 against
        // 109 + 4 + 24 + 20).
        assert_eq!(split_grid(narrow, 16, 13312, 16384, 132), Some(132));
        assert_eq!(split_grid(narrow, 1, 28672, 8192, 132), None);
        assert_eq!(split_grid(narrow, 1, 28672, 4096, 132), None);
        // One tile and a huge K: never more than MAX_SPLITS plain splits.
        assert_eq!(split_grid(s, 1, 8, 1 << 24, 132), Some(MAX_SPLITS));
        // Other configurations never split.
        assert_eq!(
            split_grid(variant_named("128x256").unwrap(), 16, 8192, 14336, 132),
            None
        );
    }

    #[test]
    fn empty_problems_and_no_sms_have_a_choice() {
        // The rule is public: degenerate sizes get an answer, not a panic (launching them is
        // refused by `gemm::check`).
        for (m, n, k, sms) in [
            (0, 8, 8, 132),
            (8, 0, 8, 132),
            (8, 8, 0, 132),
            (1, 8, 64, 0),
        ] {
            let _ = choose_variant(m, n, k, sms);
            let _ = (
                choose_fp8_variant(m, n, k, sms, ScaleMode::Tensorwise),
                choose_fp8_variant(m, n, k, sms, ScaleMode::Rowwise),
            );
            for v in &VARIANTS {
                let _ = (estimated_cost(v, m, n, k, sms), split_grid(v, m, n, k, sms));
            }
        }
    }

    #[test]
    fn every_shape_check_admits_gets_a_configuration_that_can_run_it() {
        // M, N and K over 1..2^31 (K a multiple of 8), as `gemm::check` admits them, on GPUs of
        // 1–144 SMs and both row alignments: the rule and its public parts answer without a
        // panic (overflow included, in this debug build) and in time, with a configuration that
        // serves M rows, and a split grid, where it picks one, whose stream-K partition fits
        // 32 bits. (Until this test, 65–128 rows of 2^31 columns on one SM summed the weight
        // stream wave by wave: 12 s a call; and 2^31 × 2^31 overflowed the split estimate.)
        let dims = [
            1,
            7,
            16,
            17,
            64,
            65,
            128,
            129,
            257,
            1000,
            65_535,
            (1 << 31) - 1,
        ];
        let depths = [8, 64, 72, 4096, 16_384, (1 << 31) - 8];
        let off = SectorAlignment { a: false, b: false };
        for sms in [1, 132, 144] {
            for (m, n, k) in dims
                .into_iter()
                .flat_map(|m| dims.map(|n| (m, n)))
                .flat_map(|(m, n)| depths.map(|k| (m, n, k)))
            {
                for rows in [SectorAlignment::ALIGNED, off] {
                    let v = choose_variant_for(m, n, k, sms, rows);
                    assert!(
                        m <= u64::from(v.config.max_rows()),
                        "{m}x{n}x{k}: {}",
                        v.name
                    );
                    let _ = raster_group_m(v, m, n, sms);
                    if let Some(grid) = split_grid(v, m, n, k, sms) {
                        let k_blocks = k.div_ceil(u64::from(BLOCK_K));
                        let tiles = tile_count(v, m, n);
                        assert!(stream_k::fits(tiles, k_blocks, grid.into()), "{m}x{n}x{k}");
                    }
                }
                let _ = choose_fp8_variant(m, n, k / 2, sms, ScaleMode::Rowwise);
                for v in &VARIANTS {
                    let _ = (estimated_cost(v, m, n, k, sms), split_grid(v, m, n, k, sms));
                }
            }
        }
    }

    #[test]
    fn split_k_runs_where_the_tiles_leave_sms_idle() {
        // 405B QKV at TP 8 (2304 × 16384): 18 or 36 tiles of 64×128 at 1–128 tokens. A split
        // costs 1/s of the main loop plus its hand-off (4 k-blocks per round trip of the sum,
        // which 64×128 does for 4 splits at once, and 6 per split and 64 rows of partials).
        // At most 16 rows the split is the 16-row transposed tile's (`16x128ts`).
        for (m, n, k) in [(1, 2304, 16384), (128, 2304, 16384), (16, 2304, 16384)] {
            let split = if m <= 16 { "16x128ts" } else { "64x128s" };
            assert_eq!(choose_variant(m, n, k, 132).name, split, "{m}x{n}x{k}");
        }
        // 128 rows: 70B QKV at TP 2 runs 80 tiles of 64×128 unsplit (one wave: 11 469) rather
        // than 40 of 128×128 split 3 ways (hand-off 3 · 4 + 6 · 3 · 2 = 48 k-blocks:
        // 16 384 · 1.06 · (43 + 48) / 128 = 12 347); 8B fc2 (4096 × 14336) splits 32 tiles of
        // 128×128 4 ways (16 384 · 1.06 · (56 + 64) / 224 = 9 304 against 11 469); 405B QKV at
        // 512 rows splits 64 tiles of 128×144 2 ways (18 432 · 1.10 · (128 + 2 · 4 + 6 · 2 · 2)
        // / 256 = 12 672, two splits being allowed from `TWO_SPLIT_MIN_ROWS`) against 60 tiles
        // of 128×160 split 2 ways (20 480 · 1.045 · 160 / 256 = 13 376), 36 tiles of 128×256
        // split 3 ways (32 768 · (86 + 48) / 256 = 17 152) and 72 unsplit 128×128 tiles'
        // 17 367. The first two as measured (NOTES step 37), the third too (step 72). Since
        // NOTES step 56 the weight stream decides at 128 rows: the first as here, the second
        // on 128 tiles of `64x64k2` in one wave (39.8 µs against `128x128s`' 44.7), since
        // step 80 on one consumer warpgroup (`64x64k2w1`), and the first since step 81 on one
        // consumer warpgroup too (`64x128w1`).
        assert_eq!(choose_variant(128, 5120, 8192, 132).name, "64x128w1");
        assert_eq!(choose_variant(512, 2304, 16384, 132).name, "128x144s");
        assert_eq!(choose_variant(128, 4096, 14336, 132).name, "64x64k2w1");
        // The 64-row tiles take two waves and K is too short for stream-K to pay (8B fc1, 16
        // tokens), K too short to split (8 k-blocks), or prefill: no split.
        for (m, n, k) in [
            (16, 28672, 4096),
            (1, 2304, 512),
            (2048, 7168, 8192),
            (8192, 8192, 8192),
        ] {
            assert!(!choose_variant(m, n, k, 132).config.split_k, "{m}x{n}x{k}");
        }
    }

    #[test]
    fn narrow_128_row_tiles_fill_a_wave_of_few_columns() {
        // 512 × 2304: 116 tiles of 80 columns in one wave, where 128×128 fills 72 SMs and
        // 128×144 needs two splits (measured 35.1 against 45.6 and 39.1 µs, NOTES step 73).
        assert_eq!(choose_variant(512, 2304, 8192, 132).name, "128x80");
        assert_eq!(choose_variant(768, 1536, 8192, 132).name, "128x80");
        // 96 divides 3072 and 1536 into a wave of 128 tiles at 512 and 1024 rows.
        assert_eq!(choose_variant(512, 3072, 8192, 132).name, "128x96");
        assert_eq!(choose_variant(1024, 1536, 4096, 132).name, "128x96");
        // Long K at 512 rows keeps the split 144-wide tile (405B QKV at TP 8), and a full
        // wave of wide tiles keeps them.
        assert_eq!(choose_variant(512, 2304, 16384, 132).name, "128x144s");
        assert_eq!(choose_variant(2048, 2304, 16384, 132).name, "192x192");
    }

    #[test]
    fn wide_64_row_tiles_take_ragged_rows_of_one_wave() {
        // A few rows past a multiple of 128, where they make about one wave (NOTES step 78).
        for (m, n, k, tile) in [
            (260, 5120, 8192, "64x208"),
            (300, 5120, 8192, "64x208"),
            (260, 6144, 8192, "64x240"),
            (280, 6144, 4096, "64x240"),
        ] {
            assert_eq!(choose_variant(m, n, k, 132).name, tile, "{m}x{n}x{k}");
        }
        // Two waves of them (9 × 26 tiles), a K outside 4096–8192, or rows a 128-row tile
        // divides keep the 128-row tiles.
        for (m, n, k) in [
            (520, 6144, 4096),
            (260, 5120, 2048),
            (260, 5120, 16384),
            (256, 5120, 8192),
        ] {
            assert!(
                !choose_variant(m, n, k, 132).name.starts_with("64x2"),
                "{m}x{n}x{k}"
            );
        }
    }

    #[test]
    fn two_k_block_64x96_tiles_take_a_few_hundred_rows_of_narrow_columns() {
        // One wave either way, 72–120 tiles of 64 × 96 against 54–90 of 64 × 128: measured
        // 6–7 % faster (192 × 2304 × 8192 27.6 against 29.7 µs; NOTES step 75).
        for (m, n, k) in [(256, 2304, 8192), (300, 2304, 8192), (256, 3072, 8192)] {
            assert_eq!(choose_variant(m, n, k, 132).name, "64x96k2", "{m}x{n}x{k}");
        }
        // A second wave of them keeps the 128-row tile; 128 rows and fewer are the weight
        // stream's (`weight_stream`), which does not list it; nor does FP8 compile it.
        assert_eq!(choose_variant(512, 4096, 4096, 132).name, "128x128");
        assert_ne!(choose_variant(128, 5120, 8192, 132).name, "64x96k2");
        // Outside K = 4096–8192 (`ONE_WAVE_64_ROW_K_BLOCKS`) the tiles it measured slower
        // than stay: `64x128` at 2048, the split 128-row tiles at 14336 and 16384.
        assert_eq!(choose_variant(768, 1024, 2048, 132).name, "64x128");
        for (m, n, k) in [(768, 1024, 16384), (384, 2048, 14336)] {
            let v = choose_variant(m, n, k, 132);
            assert!(
                v.config.split_k && v.config.block_m == 128,
                "{m}x{n}x{k}: {}",
                v.name
            );
        }
        // Nor where its tiles fill every SM (12 × 11 of them).
        assert_eq!(choose_variant(768, 1024, 8192, 132).name, "64x128");
        assert_ne!(
            choose_fp8_variant(256, 2304, 4096, 132, ScaleMode::Tensorwise).name,
            "64x96k2"
        );
    }

    #[test]
    fn middle_rows_split_as_measured_fastest() {
        // The off-grid middle rows of NOTES step 87 (4) where the split costs' refit (step 89)
        // moves the rule to the candidate measured fastest (µs bf16, before → after):
        // `64x128s` → `128x128s` 37.6 → 31.7, `128x128s` → `128x160s` 48.9 → 45.1 and
        // 54.4 → 50.1. (It keeps `64x96k2` at 256 × 2304 × 8192, 28.3 against `128x128s`'
        // 27.2.) And the split `64x128s` stays at K = 4096, where it measured fastest (161 ×
        // 1024 × 4096: 14.7 µs against `64x96k2`'s 16.7, NOTES step 89).
        for (m, n, k, tile) in [
            (384, 1024, 16384, "128x128s"),
            (384, 2048, 14336, "128x160s"),
            (768, 1024, 16384, "128x160s"),
            (161, 1024, 4096, "64x128s"),
            (321, 512, 4096, "64x128s"),
        ] {
            assert_eq!(choose_variant(m, n, k, 132).name, tile, "{m}x{n}x{k}");
        }
        // FP8's split `128x256s` keeps the old price: 128 × 128 measured 9–10 % faster at
        // 257–897 rows and K = 28672 (14336 pairs).
        for (m, n) in [(257, 3584), (513, 2048), (897, 1280)] {
            let v = choose_fp8_variant(m, n, 14336, 132, ScaleMode::Tensorwise);
            assert_eq!(v.name, "128x128", "{m}x{n}");
        }
    }

    /// The rule's pick on every record with rows off 32-byte boundaries (K ≡ 8 mod 16) of
    /// a run that timed each candidate in the same rounds, over the fastest candidate
    /// measured: the worst ratio, the geometric mean and the number of records.
    fn off_sector_regret(json: &str) -> (f64, f64, usize) {
        let records: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        let (mut worst, mut log_sum, mut count) = (1.0_f64, 0.0, 0);
        for r in records
            .iter()
            .filter(|r| r["k"].as_u64().unwrap() % 16 == 8)
        {
            let dim = |key: &str| r[key].as_u64().unwrap();
            let (m, n, k) = (dim("m"), dim("n"), dim("k"));
            let pick = choose_variant_for(m, n, k, 132, SectorAlignment::dense(2 * k));
            let measured = |name: &str| {
                r["variant_ms"][name].as_f64().or_else(|| {
                    (r["tile"].as_str() == Some(name)).then(|| r["ours_ms"].as_f64().unwrap())
                })
            };
            let fastest = r["variant_ms"]
                .as_object()
                .unwrap()
                .values()
                .filter_map(serde_json::Value::as_f64)
                .chain(r["ours_ms"].as_f64())
                .fold(f64::INFINITY, f64::min);
            let time = measured(pick.name)
                .unwrap_or_else(|| panic!("{}: {} not measured", r["shape"], pick.name));
            worst = worst.max(time / fastest);
            log_sum += (time / fastest).ln();
            count += 1;
        }
        (worst, (log_sum / count as f64).exp(), count)
    }

    /// Rows off 32-byte boundaries, every candidate timed (one H200, 2026-12-04, bf16 and
    /// f16; kernels-gpu/NOTES.md step 93). Above 128 rows (the twelve 128-row
    /// configurations, with and without clusters, at eeca396's tree with the clusters of
    /// every width): the rule's pick within 4 % of the fastest measured on 41 of 42 records
    /// of 21 shapes (256–8192 rows), 8 % on the last (8192 × 8192 × 4104 in f16: `128x256c2`
    /// 860 µs against `128x224c2`'s 796; in bf16 it was the fastest), 1.007 in the geometric
    /// mean, where the aligned rule's picks ran 1.15–1.45 times slower on most of them. At
    /// 1–128 rows (cc712bf, the weight-stream candidates): within 2 % on the 16 records of 1
    /// and 16 rows, within 7 % on the 18 of 64–128 rows (64 × 6144 × 4104: `64x64` 28.2 µs
    /// against `64x128w1`'s 26.5).
    #[test]
    fn rows_off_sectors_take_the_tiles_that_load_fewest_rows() {
        let runs = [
            include_str!(
                "../../../benches/results/gemm-2026-12-04-eeca396-dirty-c2w-1-7000x3000x5000-and-10-more-settle50-rounds2.json"
            ),
            include_str!(
                "../../../benches/results/gemm-2026-12-04-eeca396-dirty-c2w-2-6000x4000x3000-and-9-more-settle50-rounds2.json"
            ),
            include_str!(
                "../../../benches/results/gemm-2026-12-04-cc712bf-offsector-d16-1x6144x4104-and-7-more-settle50-rounds2.json"
            ),
            include_str!(
                "../../../benches/results/gemm-2026-12-04-cc712bf-offsector-d128-64x4096x8200-and-8-more-settle50-rounds2.json"
            ),
        ];
        // (worst ratio, records) of each run.
        let bounds = [(1.09, 22), (1.04, 20), (1.02, 16), (1.07, 18)];
        for (json, (bound, records)) in runs.into_iter().zip(bounds) {
            let (worst, mean, count) = off_sector_regret(json);
            assert_eq!(count, records);
            assert!(worst <= bound && mean <= 1.01, "{worst:.3} {mean:.3}");
        }
    }

    #[test]
    fn one_warpgroup_64x64_tiles_take_a_wave_of_a_few_hundred_narrow_rows() {
        // 108–128 tiles of 64 × 64 on two-k-block stages, one consumer warpgroup: 0.83–0.86 of
        // `64x96k2`'s time where the rule ran that (192 × 2304 × 8192 23.1 against 27.7 µs,
        // 224 × 2048 × 4096 15.3 against 17.8; NOTES step 87 (5)).
        for (m, n, k) in [(160, 2304, 8192), (192, 2304, 8192), (224, 2048, 4096)] {
            assert_eq!(
                choose_variant(m, n, k, 132).name,
                "64x64k2w1",
                "{m}x{n}x{k}"
            );
        }
        // Not where its tiles leave a quarter of the SMs idle (320 × 1024 × 8192: 80 tiles,
        // where the split `64x128s` ran 12 % faster), nor on a second wave of them (256 ×
        // 2304: 144), nor outside K = 4096–8192 (144 × 2304 × 16384), nor where the
        // weight-stream rule serves (at most 128 rows).
        for (m, n, k) in [
            (320, 1024, 8192),
            (256, 2304, 8192),
            (144, 2304, 16384),
            (128, 2304, 8192),
        ] {
            assert_ne!(
                choose_variant(m, n, k, 132).name,
                "64x64k2w1",
                "{m}x{n}x{k}"
            );
        }
    }

    #[test]
    fn the_64_row_tile_runs_decode_rows() {
        // Few rows: 64×128 tiles cost 1.4 × 8192 each where 128-row tiles cost 16 384 or
        // more in as many waves (70B fc2 at TP 2, 16 × 8192: 64 tiles of either height; 70B
        // QKV, 128 × 5120: 80 tiles against 40, one wave each — measured 330 against 240
        // TFLOP/s). Measured faster than 128×128 on every 70B TP=2 shape of 1–128 rows. Where
        // its tiles fill at most half the SMs it also splits K (`64x128s`).
        for (m, n) in [(1, 8192), (16, 8192), (64, 5120), (16, 28672), (7, 1001)] {
            assert_eq!(
                choose_variant(m, n, 8192, 132).config.block_m,
                64,
                "{m}x{n}"
            );
            assert_eq!(
                choose_fp8_variant(m, n, 4096, 132, ScaleMode::Tensorwise)
                    .config
                    .block_m,
                64,
                "{m}x{n}"
            );
        }
        // More rows, or wide enough that its tiles take more waves: 70B fc1 at 128 rows
        // (448 tiles, 4 waves: 432 TFLOP/s against 128×224's 1.05 of cuBLAS), prefill.
        for (m, n) in [(128, 28672), (512, 5120), (2048, 7168), (8192, 8192)] {
            assert_ne!(
                choose_variant(m, n, 8192, 132).config.block_m,
                64,
                "{m}x{n}"
            );
            assert_ne!(
                choose_fp8_variant(m, n, 4096, 132, ScaleMode::Tensorwise)
                    .config
                    .block_m,
                64,
                "{m}x{n}"
            );
        }
    }

    #[test]
    fn decode_rows_run_what_measured_fastest() {
        // At 1 and 16 tokens the rule's choice among `16x128`, `16x64` and `64x128s` was the
        // one measured fastest in bf16 in the same rounds (gemm-grid-2026-12-01-16a62a3-m1; µs
        // at one token): unsplit `16x64` where N gives about one wave of 64-wide tiles (8B QKV
        // 19.5, 8B o-proj 17.7 against `64x128s` 19.2, 70B QKV 29.4 against 31.2, 70B o-proj
        // and fc2); unsplit `16x128` in two waves (8B fc1 62.9, 70B fc1 117.4 against
        // stream-K's 122.9, 405B fc2); the split where the unsplit tiles leave most SMs idle or
        // run a long K on few blocks (8B fc2 38.6 against 45.8, 405B QKV 29.9 against 51.1).
        // Each now runs in its transposed form, measured faster in the same rounds
        // (gemm-grid-2026-12-02-90ee5a3-m1, one token): `16x64t` 70B QKV 26.4 against 28.8,
        // 70B o-proj 22.9 against 23.8, 70B fc2 61.6 against 62.7; `16x128t` 70B fc1 116.3
        // against 117.7, 405B fc2 55.9 against 57.1, 405B o-proj 21.9 against 23.0;
        // `16x128ts` 8B fc2 36.3 against `64x128s`' 38.9, 405B QKV 28.4 against 29.8. And
        // `16x64t` runs with two k-blocks a stage, `16x64t2`, measured faster still
        // (gemm-2026-12-02-86ae8ad-1x4096x4096-and-4-more: 8B o-proj 14.5 against 16.1, 8B
        // QKV 19.6 against 20.8, 70B fc2 61.0 against 61.8).
        // Since NOTES step 70 the weight-stream model picks among the transposed tiles, with
        // every one of them timed in the same rounds (gemm-grid-2026-12-03-600d1cb4589c-m1-settle100,
        // bf16 at one token): `16x64t2` at 8B fc2 (33.3 against the area model's `16x128ts`,
        // 36.6: 64 blocks already at the DRAM floor), `16x128t2` where `16x128t` ran (level
        // or up to 1 % faster: 405B fc2 56.9 against 57.0, 405B o-proj 21.6 against 21.7) and
        // at 405B fc1 (108.2 against `16x128ts`' 111.3). Since NOTES step 86 `16x64t2` runs
        // as `16x64t4` (four k-blocks a stage; `weight_stream::FORMS`).
        let cases = [
            (6144, 4096, "16x64t4"),
            (4096, 4096, "16x64t4"),
            (5120, 8192, "16x64t4"),
            (8192, 4096, "16x64t4"),
            (8192, 14336, "16x64t4"),
            (4096, 14336, "16x64t4"),
            (28672, 4096, "16x128t2"),
            (28672, 8192, "16x128t2"),
            (16384, 6656, "16x128t2"),
            (16384, 2048, "16x128t2"),
            (13312, 16384, "16x128t2"),
            (2304, 16384, "16x128ts"),
        ];
        for m in [1, 16] {
            for (n, k, name) in cases {
                assert_eq!(choose_variant(m, n, k, 132).name, name, "{m}x{n}x{k}");
            }
        }
    }

    #[test]
    fn fp8_picks_among_its_compiled_configurations() {
        for (m, n) in [
            (1, 8192),
            (1, 2304),
            (2048, 7168),
            (8192, 8192),
            (2048, 13312),
        ] {
            let v = choose_fp8_variant(m, n, 8192, 132, ScaleMode::Tensorwise);
            assert!(v.kernel_e4m3.is_some(), "{m}x{n}: {}", v.name);
        }
        assert_eq!(
            choose_fp8_variant(8192, 8192, 4096, 132, ScaleMode::Tensorwise).name,
            "128x256"
        );
        assert_eq!(
            choose_fp8_variant(1, 2304, 8192, 132, ScaleMode::Tensorwise).name,
            "16x128ts"
        );
    }

    #[test]
    fn ping_pong_takes_the_shapes_whose_epilogue_weighs_most() {
        // 70B fc2 at TP 8 (16384 × 8192 × 3584): in e4m3 (1792 pairs, 28 k-blocks) ping-pong,
        // measured 737 µs against 128×256's 776 (gemm-fp8-2026-12-02-cd9f2a3), in both scale
        // modes; in bf16 128×256.
        for scales in ScaleMode::ALL {
            let v = choose_fp8_variant(16384, 8192, 1792, 132, scales);
            assert_eq!(v.name, "128x128p", "{scales:?}");
        }
        assert_eq!(choose_variant(16384, 8192, 3584, 132).name, "128x256");
        // Never in 16 bits, where it measured slower even at K = 1024–2048.
        for (m, n, k) in [(8192, 4096, 2048), (8192, 8192, 1024), (2048, 16384, 2048)] {
            assert_ne!(choose_variant(m, n, k, 132).name, "128x128p", "{m}x{n}x{k}");
        }
        // Long K (8192³, 405B fc1 at TP 2): 128×256 in every mode; ping-pong's main loop
        // costs 8 % more per output and measured 1–6 % slower there.
        for (m, n, k) in [(8192, 8192, 8192), (8192, 53248, 16384)] {
            assert_eq!(choose_variant(m, n, k, 132).name, "128x256");
            for scales in ScaleMode::ALL {
                let v = choose_fp8_variant(m, n, k / 2, 132, scales);
                assert_eq!(v.name, "128x256", "{m}x{n}x{k} {scales:?}");
            }
        }
        // The row-wise epilogue costs more, so its break-even K is longer: 405B fc2 at TP 8
        // (16384 × 16384 × 6656) runs ping-pong row-wise only.
        assert_eq!(
            choose_fp8_variant(16384, 16384, 3328, 132, ScaleMode::Tensorwise).name,
            "128x256"
        );
        assert_eq!(
            choose_fp8_variant(16384, 16384, 3328, 132, ScaleMode::Rowwise).name,
            "128x128p"
        );
        // Below `COMPUTE_BOUND_ROWS` the epilogue is not priced (it hides behind the weight
        // stream), so ping-pong, whose main loop alone costs more than 128×128's, is not run.
        for m in [1, 16, 64, 128, 255] {
            for k in [1024, 4096] {
                assert_ne!(choose_variant(m, 16384, k, 132).name, "128x128p", "{m}x{k}");
                let v = choose_fp8_variant(m, 16384, k / 2, 132, ScaleMode::Rowwise);
                assert_ne!(v.name, "128x128p", "{m}x{k}");
            }
        }
    }

    #[test]
    fn the_16_row_tiles_take_the_64_row_tiles_problems_of_at_most_16_rows() {
        // At most 16 rows, wherever the rule would run a 64-row tile it runs a 16-row one in
        // its transposed form (`16x128t2`, `16x64t2`, split `16x128ts`: never `16x128`, `16x64`
        // or `16x128s`, which run by name); never a short tile on more rows than it serves.
        for n in [1001, 2304, 4096, 8192, 28672] {
            for k in [512, 4096, 16384] {
                for m in [1, 7, 16, 17, 64, 65, 128] {
                    let fp8 = |scales| choose_fp8_variant(m, n, k, 132, scales);
                    let [tensor, row] = ScaleMode::ALL.map(fp8);
                    for pick in [choose_variant(m, n, k, 132), tensor, row] {
                        let name = pick.name;
                        let never: &[&str] = if m <= 16 {
                            &[
                                "16x128", "16x64", "16x128s", "64x128", "64x128w1", "64x128s",
                            ]
                        } else {
                            &[
                                "16x128", "16x64", "16x128s", "16x128t", "16x64t", "16x128ts",
                            ]
                        };
                        assert!(!never.contains(&name), "{m}x{n}x{k}: {name}");
                    }
                }
            }
        }
        // 8B fc1 (28672 × 4096) and 405B fc2 at TP 8 (16384 × 6656), one token: unsplit.
        assert_eq!(choose_variant(1, 28672, 4096, 132).name, "16x128t2");
        assert_eq!(choose_variant(1, 16384, 6656, 132).name, "16x128t2");
    }

    #[test]
    fn every_variant_is_reachable_by_name() {
        for v in &VARIANTS {
            assert_eq!(variant_named(v.name), Some(v));
        }
        assert_eq!(variant_named("256x256"), None);
    }

    #[test]
    fn the_narrow_64_row_tiles_run_only_where_the_weights_stream() {
        // Picked by `weight_stream` at 17–128 rows (17–64 in FP8); the area model, which
        // cannot see the DRAM floor, would otherwise take them for small outputs through the
        // epilogue's share (512 × 1000 × 1000: `64x64` priced below `64x128`), where they
        // were never measured. (At 1–16 rows the decode tiles run, `16x64t2` as its
        // four-k-block form, which only `weight_stream` picks too. The one exception above 128
        // rows, `64x64k2w1` in one wave at K = 4096–8192, has its own test.)
        for m in [1, 7, 16, 129, 256, 512, 1000, 3000, 8192] {
            for (n, k) in [
                (100, 64),
                (1000, 1000),
                (4096, 4096),
                (2304, 16384),
                (28672, 8192),
            ] {
                let v = choose_variant(m, n, k, 132);
                assert!(
                    !weight_stream::picked_only_here(v) || v.config.swap_ab,
                    "{m}x{n}x{k}: {}",
                    v.name
                );
            }
        }
        for m in [1, 16, 65, 128, 2048] {
            for (n, k) in [(1000, 1000), (4096, 2048), (2304, 8192), (28672, 4096)] {
                let v = choose_fp8_variant(m, n, k, 132, ScaleMode::Tensorwise);
                assert!(
                    !weight_stream::picked_only_here(v),
                    "{m}x{n}x{k}: {}",
                    v.name
                );
            }
        }
        // Where they stream the weights fastest: 8B o-proj at 32 rows (`64x32k2` 11.0 µs in
        // e4m3 against `64x128s`' 14.4) and at 128 rows in bf16 (`64x64k2` 16.7 against
        // `64x128`'s 19.3).
        assert!(weight_stream::picked_only_here(choose_variant(
            32, 4096, 4096, 132
        )));
        assert!(weight_stream::picked_only_here(choose_variant(
            128, 4096, 4096, 132
        )));
        let fp8 = choose_fp8_variant(32, 4096, 2048, 132, ScaleMode::Rowwise);
        assert!(weight_stream::picked_only_here(fp8), "{}", fp8.name);
    }
}
