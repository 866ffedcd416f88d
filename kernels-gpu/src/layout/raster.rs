//! Output-tile order of the persistent GEMM: which (m-tile, n-tile) the i-th tile is.
//!
//! Tiles are visited in bands of `group_m` consecutive m-tiles; inside a band the order runs
//! down the band's m-tiles first, then moves one n-tile right. Blocks of a persistent grid
//! take tiles `b, b + grid, b + 2·grid, …`, so at any moment the grid works on a compact patch
//! of the output: a few A row-panels and B column-panels that stay in L2 and are reused.

/// `(m_tile, n_tile)` of linear tile `tile` in a `num_m × num_n` tile grid, banded by `group_m`
/// (≥ 1) m-tiles. The map is a bijection on `0..num_m * num_n`.
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
    (first_m + within % rows_in_band, within / rows_in_band)
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
    fn walks_down_a_band_before_moving_right() {
        // 4 m-tiles in bands of 2, 3 n-tiles.
        let order: Vec<_> = (0..12).map(|t| tile_coord(t, 4, 3, 2)).collect();
        assert_eq!(
            &order[..6],
            &[(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
        );
        assert_eq!(order[6], (2, 0));
    }
}
