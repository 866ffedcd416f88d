//! Stream-K: how the split-K configurations share a GEMM's k-blocks among the blocks of the
//! grid (CUTLASS's stream-K scheduler is the model; the hand-off here is wait-free).
//!
//! Lay every output tile's k-blocks end to end, tile `t`'s k-block `kb` at *position*
//! `t · k_blocks + kb`, in the tiles' raster order: `W = tiles · k_blocks` positions. Block `g`
//! of a grid of `G` takes the contiguous range `start(g) .. start(g + 1)` with
//! `start(g) = ⌊g·W/G⌋`, so every block runs `⌊W/G⌋` or `⌈W/G⌉` k-blocks, whatever the tile
//! count. A range cuts tiles into *pieces*: the tail of one tile, whole tiles, the head of
//! another. A tile that one block covers whole needs nothing else; a tile cut into `n > 1`
//! pieces has them computed by the consecutive blocks `g₀ … g₀ + n − 1`, each storing its f32
//! partial sum, and the last to finish adds the `n` partials in k order (the same bits
//! whichever block finishes last).
//!
//! With `G = tiles · s` this is plain split-K: every tile in `s` pieces of
//! `⌊j·k_blocks/s⌋ .. ⌊(j+1)·k_blocks/s⌋`. With `G` = the SM count and tiles that do not
//! divide it (224 tiles on 132 SMs: 1.7 tiles' worth each), it removes the idle last wave.
//!
//! Partial-sum slots: the piece of tile `t` computed by block `g` has slot `t + g`. Pieces in
//! position order have non-decreasing `t` and `g`, one of them increasing, so the slots are
//! distinct, fewer than `tiles + G`, and a tile's pieces have the consecutive slots
//! `t + g₀ … t + g₀ + n − 1`.

/// The partition of `tiles · k_blocks` positions among `blocks` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamK {
    /// Positions: tiles × k-blocks per tile.
    work: u32,
    /// Blocks with a non-empty range: the grid, at most `work`.
    blocks: u32,
    /// K-blocks per tile (at least 1).
    k_blocks: u32,
}

impl StreamK {
    /// The partition of `tiles` tiles of `k_blocks` k-blocks among a grid of `grid` blocks.
    /// Blocks past `tiles · k_blocks` get empty ranges (every non-empty range then holds at
    /// least one k-block, which the piece count relies on). `tiles · k_blocks · grid` must
    /// fit in 32 bits (the host checks: [`fits`]), so that the boundaries are 32-bit
    /// arithmetic — a 64-bit division costs the split-K kernels registers that their
    /// accumulators need.
    #[inline(always)]
    pub const fn new(tiles: u32, k_blocks: u32, grid: u32) -> Self {
        let k_blocks = if k_blocks == 0 { 1 } else { k_blocks };
        let work = tiles * k_blocks;
        let blocks = if grid < work { grid } else { work };
        Self {
            work,
            blocks: if blocks == 0 { 1 } else { blocks },
            k_blocks,
        }
    }

    /// First position of block `g`'s range, `⌊g·W/G⌋` (`W` for every `g ≥ G`, an empty
    /// range).
    #[inline(always)]
    pub const fn start(&self, g: u32) -> u32 {
        let g = if g < self.blocks { g } else { self.blocks };
        g * self.work / self.blocks
    }

    /// The block whose range holds position `x < W`: the largest `g` with `⌊g·W/G⌋ ≤ x`,
    /// i.e. with `g·W < (x + 1)·G`, which is `⌈(x + 1)·G / W⌉ − 1`.
    #[inline(always)]
    pub const fn block_of(&self, x: u32) -> u32 {
        ((x + 1) * self.blocks).div_ceil(self.work) - 1
    }

    /// Tile `t`'s pieces: the block that computes its first k-block, and how many blocks
    /// share it (1: one block computes the whole tile).
    #[inline(always)]
    pub const fn pieces(&self, t: u32) -> (u32, u32) {
        let first = t * self.k_blocks;
        let g0 = self.block_of(first);
        let g1 = self.block_of(first + self.k_blocks - 1);
        (g0, g1 - g0 + 1)
    }

    /// The most pieces any tile is cut into. Only a tile that holds the start of some
    /// block's range (past position 0) is cut, so the tiles holding those `G − 1` starts are
    /// all there is to look at, however many tiles there are.
    pub fn max_pieces(&self) -> u32 {
        (1..self.blocks)
            .map(|g| self.pieces(self.start(g) / self.k_blocks).1)
            .max()
            .unwrap_or(1)
    }
}

/// Whether `tiles` tiles of `k_blocks` k-blocks can be partitioned among `grid` blocks in
/// 32-bit arithmetic ([`StreamK::new`]).
pub const fn fits(tiles: u64, k_blocks: u64, grid: u64) -> bool {
    match tiles.checked_mul(k_blocks) {
        Some(work) => match work.checked_mul(grid) {
            Some(product) => product <= u32::MAX as u64,
            None => false,
        },
        None => false,
    }
}

/// The piece that starts at position `x` of a range ending at `end`, with `k_blocks` per
/// tile: its tile and its k-blocks `kb0 .. kb1` of that tile (`x < end`).
#[inline(always)]
pub const fn piece_at(x: u32, end: u32, k_blocks: u32) -> (u32, u32, u32) {
    let t = x / k_blocks;
    let kb0 = x % k_blocks;
    let left = end - x;
    let kb1 = if k_blocks - kb0 < left {
        k_blocks
    } else {
        kb0 + left
    };
    (t, kb0, kb1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks every block's range piece by piece, as the kernel does, and checks that the
    /// pieces tile every tile's k-blocks exactly once, that `block_of` and `pieces` agree with
    /// the walk, and that the slots `t + g` are distinct and consecutive per tile.
    #[test]
    fn pieces_cover_every_k_block_once_with_consecutive_slots() {
        for (tiles, k_blocks, grid) in [
            (48, 64, 132),
            (224, 64, 132),
            (18, 256, 126),
            (32, 224, 128),
            (1, 1, 132),
            (3, 7, 5),
            (7, 3, 2),
            (5, 5, 25),
            (132, 128, 132),
            (1, 100, 1),
            (13, 9, 200),
        ] {
            let sk = StreamK::new(tiles, k_blocks, grid);
            let mut covered = vec![vec![false; k_blocks as usize]; tiles as usize];
            let mut pieces_of = vec![Vec::new(); tiles as usize];
            let mut slots = std::collections::BTreeSet::new();
            for g in 0..grid {
                let end = sk.start(g + 1);
                let mut x = sk.start(g);
                if g >= sk.blocks {
                    assert_eq!(x, end, "block {g} past the work has work");
                }
                while x < end {
                    assert_eq!(sk.block_of(x), g, "position {x}");
                    let (t, kb0, kb1) = piece_at(x, end, k_blocks);
                    assert!(kb0 < kb1 && kb1 <= k_blocks);
                    for kb in kb0..kb1 {
                        let seen = &mut covered[t as usize][kb as usize];
                        assert!(!*seen, "tile {t} k-block {kb} twice");
                        *seen = true;
                    }
                    pieces_of[t as usize].push(g);
                    assert!(slots.insert(t + g), "slot {} twice", t + g);
                    x += kb1 - kb0;
                }
            }
            assert!(
                covered.iter().flatten().all(|&c| c),
                "{tiles}x{k_blocks}/{grid}"
            );
            for (t, blocks) in pieces_of.iter().enumerate() {
                let (g0, n) = sk.pieces(t as u32);
                let expected: Vec<u32> = (g0..g0 + n).collect();
                assert_eq!(blocks, &expected, "tile {t} of {tiles}x{k_blocks}/{grid}");
            }
            assert!(slots.iter().all(|&s| s < tiles + grid));
            let most = pieces_of.iter().map(Vec::len).max().unwrap_or(1).max(1);
            assert_eq!(sk.max_pieces() as usize, most, "{tiles}x{k_blocks}/{grid}");
        }
    }

    #[test]
    fn whole_splits_are_plain_split_k() {
        // 48 tiles of 64 k-blocks on 96 blocks: two halves per tile.
        let sk = StreamK::new(48, 64, 96);
        assert_eq!(sk.max_pieces(), 2);
        assert_eq!(piece_at(sk.start(5), sk.start(6), 64), (2, 32, 64));
        // On 132 blocks: 23–24 k-blocks each, so a tile in 3 or 4 pieces.
        let sk = StreamK::new(48, 64, 132);
        assert_eq!(sk.max_pieces(), 4);
        // More tiles than blocks: 224 tiles on 132 blocks, 108–109 k-blocks each.
        let sk = StreamK::new(224, 64, 132);
        assert_eq!(sk.max_pieces(), 2);
        assert_eq!(sk.start(1), 108);
    }
}
