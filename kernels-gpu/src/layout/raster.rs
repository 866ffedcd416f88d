//! Output-tile order of the persistent GEMM: which (m-tile, n-tile) the i-th tile is.
//!
//! Tiles are visited in bands of `group_m` consecutive m-tiles; inside a band the order runs
//! down the band's m-tiles first, then moves one n-tile along. Blocks of a persistent grid
//! take tiles `b, b + grid, b + 2·grid, …`, so at any moment the grid works on a compact patch
//! of the output: a few A row-panels and B column-panels that stay in L2 and are reused.
//!
//! Bands alternate direction (a serpentine): even bands walk the n-tiles left to right, odd
//! bands right to left. A band then starts on the B column-panels its predecessor has just
//! read, which are still in L2, instead of on panels read a whole band ago; the wave that
//! straddles the turn also stays one compact patch. Measured on 70B fc1's TP=2 shapes (K =
//! 8192, 8 and 4 bands): 1.1 % less time in bf16, 0.4 % in f16, against cuBLAS in the same
//! runs (kernels-gpu/NOTES.md step 31). Operand reads from DRAM cost the power-capped clock
//! about 8 % of the time on those shapes (same step), so every panel read from L2 instead
//! counts.

/// `(m_tile, n_tile)` of linear tile `tile` in a `num_m × num_n` tile grid, banded by `group_m`
/// (≥ 1) m-tiles, odd bands walking the n-tiles backwards. The map is a bijection on
/// `0..num_m * num_n`.
#[inline(always)]
pub const fn tile_coord(tile: u32, num_m: u32, num_n: u32, group_m: u32) -> (u32, u32) {
    let per_band = group_m * num_n;
    let band = tile / per_band;
    let first_m = band * group_m;
    let rows_in_band = if num_m - first_m < group_m {
        num_m - first_m
    } else {
        group_m
    };
    let within = tile % per_band;
    let step = within / rows_in_band;
    let n_tile = if band.is_multiple_of(2) {
        step
    } else {
        num_n - 1 - step
    };
    (first_m + within % rows_in_band, n_tile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_bijection_for_ragged_bands() {
        for (num_m, num_n, group) in [
            (1, 1, 8),
            (7, 3, 8),
            (13, 5, 4),
            (16, 9, 8),
            (3, 20, 1),
            (9, 1, 2),
        ] {
            let mut seen = vec![false; (num_m * num_n) as usize];
            for t in 0..num_m * num_n {
                let (m, n) = tile_coord(t, num_m, num_n, group);
                assert!(
                    m < num_m && n < num_n,
                    "tile {t} -> ({m},{n}) out of {num_m}x{num_n}"
                );
                let i = (m * num_n + n) as usize;
                assert!(!seen[i], "({m},{n}) visited twice");
                seen[i] = true;
            }
        }
    }

    #[test]
    fn walks_down_a_band_then_along_it_alternating_direction() {
        // 5 m-tiles in bands of 2 (the last band ragged: 1 m-tile), 3 n-tiles.
        let order: Vec<_> = (0..15).map(|t| tile_coord(t, 5, 3, 2)).collect();
        assert_eq!(
            order,
            [
                // Band 0, left to right.
                (0, 0),
                (1, 0),
                (0, 1),
                (1, 1),
                (0, 2),
                (1, 2),
                // Band 1 starts on the column band 0 ended on and walks back.
                (2, 2),
                (3, 2),
                (2, 1),
                (3, 1),
                (2, 0),
                (3, 0),
                // Band 2 (one m-tile), left to right again.
                (4, 0),
                (4, 1),
                (4, 2),
            ]
        );
    }
}
