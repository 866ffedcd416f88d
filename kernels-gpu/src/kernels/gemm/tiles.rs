//! Which units of work (whole tiles, or split-K pieces) a block takes, in which order.
use crate::device::index;
use crate::gemm_abi::*;
use crate::layout::raster;
use crate::layout::stream_k::{self, StreamK};

/// This block's share of the output. Tiles are grouped in *cluster tiles* of `cluster_m`
/// vertically adjacent tiles; cluster `c` takes cluster tiles `c, c + clusters, …` in raster
/// order, and its block of rank `r` computes the `r`-th tile of each: a *unit* is a tile.
/// With split-K (always without clusters) the block takes its stream-K range of k-blocks
/// instead ([`StreamK`]; [`SplitParams`]): a unit is a piece of a tile, and `u` the position
/// of its first k-block.
#[derive(Clone, Copy)]
pub(super) struct Tiles {
    /// Cluster rows of tiles (`⌈⌈M / block_m⌉ / cluster_m⌉`).
    num_m: u32,
    /// Columns of tiles (`⌈N / block_n⌉`).
    num_n: u32,
    /// The first unit: a cluster tile, or (split-K) a position.
    pub(super) first: u32,
    /// Past the last unit.
    pub(super) end: u32,
    /// Cluster tiles between a cluster's units (not used by split-K).
    step: u32,
    /// This block's rank in its cluster (0 without clusters): which of a cluster tile's
    /// tiles it computes, and which share of B it loads.
    pub(super) rank: u32,
    /// Height of the tile order's bands ([`raster::tile_coord`]).
    group_m: u32,
    /// 64-wide k-blocks of a whole tile (`⌈K / 64⌉`).
    k_blocks: u32,
    tile: TileConfig,
}

impl Tiles {
    #[inline(always)]
    pub(super) fn new(p: &GemmParams, tile: TileConfig) -> Self {
        let num_m = p.m.div_ceil(tile.block_m).div_ceil(tile.cluster_m);
        let num_n = p.n.div_ceil(tile.block_n);
        let k_blocks = p.k.div_ceil(BLOCK_K);
        let (first, end, step, rank) = if tile.split_k {
            let stream = Self::stream_k(p, tile);
            let g = index::block_idx();
            (stream.start(g), stream.start(g + 1), 0, 0)
        } else if tile.cluster_m == 1 {
            (index::block_idx(), num_m * num_n, index::grid_dim(), 0)
        } else {
            (
                index::cluster_idx(),
                num_m * num_n,
                index::cluster_count(),
                index::cluster_ctarank(),
            )
        };
        Self {
            num_m,
            num_n,
            first,
            end,
            step,
            rank,
            group_m: p.raster_group_m.max(1),
            k_blocks,
            tile,
        }
    }
    /// Split-K: the grid's partition of the k-blocks, computed from the parameters where it
    /// is needed rather than kept in registers across the main loop.
    #[inline(always)]
    pub(super) fn stream_k(p: &GemmParams, tile: TileConfig) -> StreamK {
        let tiles = p.m.div_ceil(tile.block_m) * p.n.div_ceil(tile.block_n);
        StreamK::new(tiles, p.k.div_ceil(BLOCK_K), index::grid_dim())
    }
    /// Unit `u`'s cluster tile and k-block range `kb0..kb1` of the tile's `⌈K/64⌉` (never
    /// empty); without split-K, all of tile `u`.
    #[inline(always)]
    pub(super) fn unit(self, u: u32) -> (u32, u32, u32) {
        if self.tile.split_k {
            stream_k::piece_at(u, self.end, self.k_blocks)
        } else {
            (u, 0, self.k_blocks)
        }
    }
    /// The unit after unit `u`, whose k-blocks are `kb0..kb1`.
    #[inline(always)]
    pub(super) fn next(self, u: u32, kb0: u32, kb1: u32) -> u32 {
        if self.tile.split_k {
            u + (kb1 - kb0)
        } else {
            u + self.step
        }
    }
    /// Top-left element `(row, col)` of this block's tile in cluster tile `t`.
    #[inline(always)]
    pub(super) fn origin(self, t: u32) -> (u32, u32) {
        let (mt, nt) = raster::tile_coord(t, self.num_m, self.num_n, self.group_m);
        (
            (mt * self.tile.cluster_m + self.rank) * self.tile.block_m,
            nt * self.tile.block_n,
        )
    }
}
