//! The producer: one thread streams every unit's A and B k-blocks into the ring with TMA.
use super::ring::Ring;
use super::tiles::Tiles;
use crate::device::mbarrier::PipelineState;
use crate::device::{gdc, tma};
use crate::gemm_abi::*;

/// Generic addresses of the tensor maps in this entry's parameter block ([`OperandMaps`], at
/// its start).
#[derive(Clone, Copy)]
pub(super) struct MapAddresses {
    pub(super) a: u64,
    pub(super) b: u64,
    /// The last m-tile's A map.
    pub(super) a_tail: u64,
    /// The last n-tile's B map.
    pub(super) b_tail: u64,
}

#[inline(always)]
pub(super) fn operand_maps() -> MapAddresses {
    let base = tma::entry_params_address() + core::mem::offset_of!(GemmParams, maps) as u64;
    MapAddresses {
        a: base + core::mem::offset_of!(OperandMaps, a) as u64,
        b: base + core::mem::offset_of!(OperandMaps, b) as u64,
        a_tail: base + core::mem::offset_of!(OperandMaps, a_tail) as u64,
        b_tail: base + core::mem::offset_of!(OperandMaps, b_tail) as u64,
    }
}

/// Producer: one thread streams (A, B) k-blocks of every tile of this block into the ring;
/// each k-block's A box is the whole slot (`a_rows` rows, `maps.a`), but in the last m-tile
/// where M ends inside it, `a_tail_box_rows` rows (`maps.a_tail`: TMA would otherwise
/// zero-fill the rows past M, which costs time; [`TileConfig::a_tail_box_rows`]); likewise
/// B's box is the block's share of the tile (`maps.b`), but in the last n-tile where N ends
/// inside it `b_tail_box_rows` rows (`maps.b_tail`; [`TileConfig::b_tail_box_rows`]).
///
/// # Safety
/// One thread of the producer warpgroup, after the ring's barriers are initialised and the
/// tensor maps acquired; `p.m` and `p.n` must be the A and B maps' row counts and
/// `p.a_tail_box_rows`, `p.b_tail_box_rows` the tail maps' box heights, or the `full`
/// barriers' byte counts never complete.
#[inline(always)]
pub(super) unsafe fn produce(p: &GemmParams, ring: Ring, tiles: Tiles) {
    let tile = ring.tile;
    let maps = operand_maps();
    let (m, n) = (p.m, p.n);
    let b_share_rows = tile.block_n / tile.cluster_m;
    let b_share_bytes = tile.b_tile_bytes() / tile.cluster_m;
    let mut slot = PipelineState::new(tile.stages);
    let mut u = tiles.first;
    while u < tiles.end {
        let (t, kb0, kb1) = tiles.unit(u);
        let (row, col) = tiles.origin(t);
        // Only the last m-tile can end past M (the tiles' count is M over `block_m`, rounded
        // up; a cluster's second block may even start past it).
        let (map_a, a_box_rows) = if row + tile.block_m > m {
            (maps.a_tail, p.a_tail_box_rows)
        } else {
            (maps.a, tile.a_rows)
        };
        // Only the last n-tile can end past N (in clusters its box is the share's, as
        // every other tile's).
        let (map_b, b_box_rows) = if col + tile.block_n > n {
            (maps.b_tail, p.b_tail_box_rows)
        } else {
            (maps.b, b_share_rows)
        };
        let stage_bytes = tile.loaded_stage_bytes(a_box_rows, b_box_rows);
        // Stage `st` holds k-blocks `st·kps ..` (`kps` = k-blocks per stage; with 2, `kb0` is
        // 0: never split-K).
        let kps = tile.k_blocks_per_stage;
        for st in kb0 / kps..kb1.div_ceil(kps) {
            let k = (st * kps * BLOCK_K) as i32;
            unsafe {
                ring.empty(slot.stage).wait(slot.phase ^ 1);
                let full = ring.full(slot.stage);
                full.arrive_expect_tx(stage_bytes);
                // The stage's further k-blocks, if any (never split-K: a unit is a whole
                // tile): past the last k-block TMA fills their tiles with zeros, which add
                // nothing.
                for j in 1..tile.k_blocks_per_stage {
                    let kj = k + (j * BLOCK_K) as i32;
                    let a = ring.a_tile(slot.stage) + j * tile.a_block_bytes();
                    let b = ring.b_tile(slot.stage) + j * tile.b_block_bytes();
                    tma::load_2d(a, map_a, kj, row as i32, full.0);
                    tma::load_2d(b, map_b, kj, col as i32, full.0);
                }
                tma::load_2d(ring.a_tile(slot.stage), map_a, k, row as i32, full.0);
                if tile.cluster_m == 1 {
                    tma::load_2d(ring.b_tile(slot.stage), map_b, k, col as i32, full.0);
                } else {
                    let share = tiles.rank;
                    let dst = ring.b_tile(slot.stage) + share * b_share_bytes;
                    let b_row = (col + share * b_share_rows) as i32;
                    tma::load_2d_multicast(
                        dst,
                        map_b,
                        k,
                        b_row,
                        full.0,
                        (1u16 << tile.cluster_m) - 1,
                    );
                }
            }
            slot.advance();
        }
        u = tiles.next(u, kb0, kb1);
    }
    gdc::launch_dependents();
}
