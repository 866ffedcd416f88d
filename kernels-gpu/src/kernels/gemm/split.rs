//! Split-K's hand-off: a tile cut between blocks is summed, in k order, by the last piece
//! to finish ([`crate::layout::stream_k`] cuts the tiles; [`SplitParams`] holds the slots).
use super::WARPGROUP_THREADS;
use super::config::Config;
use super::ring::Ring;
use super::tiles::Tiles;
use crate::device::{fence, grid, index, smem, sync};
use crate::gemm_abi::*;

/// Split-K, after a piece of tile `t` (every thread of consumer warpgroup `half`, whose share
/// starts at row `row`): if other blocks compute pieces of the tile too, writes the
/// warpgroup's partial sum to the piece's slot, counts the warpgroup in on the tile's counter
/// and, if it is the tile's last piece, adds every piece's partial into `acc` in k order and
/// resets the counter (the hand-off: [`grid`]). Returns whether this warpgroup completes the
/// tile (and runs its epilogue): always where this block computes the whole tile.
///
/// # Safety
/// `p.split` must hold the workspace the host sized for this grid (`tiles + grid` slots of
/// `block_m · block_n` f32 and `2 · tiles` zeroed counters, [`SplitParams`]); every thread of
/// the warpgroup must call it (it contains warpgroup barriers).
#[inline(always)]
pub(super) unsafe fn finish_split<C: Config>(
    p: &GemmParams,
    ring: Ring,
    acc: &mut C::Acc,
    t: u32,
    half: u32,
    row: u32,
) -> bool {
    let (g0, pieces) = Tiles::stream_k(p, C::TILE).pieces(t);
    if pieces == 1 {
        return true;
    }
    // Floats of one warpgroup's part of a slot: half a tile.
    let per_half = (C::TILE.block_m * C::TILE.block_n / 2) as usize;
    let partials = p.split.partials as *mut f32;
    let slot_of = |slot: u32| (2 * slot as usize + half as usize) * per_half;
    unsafe { C::store_partial(acc, partials.add(slot_of(t + index::block_idx())), row, p.m) };
    let barrier = 1 + half;
    sync::named_sync(barrier, WARPGROUP_THREADS);
    if index::thread_in_warpgroup() == 0 {
        let counter = unsafe { (p.split.counters as *mut u32).add(2 * t as usize + half as usize) };
        // Release: every partial store of the warpgroup (ordered before this thread by the
        // barrier) before the count.
        fence::acq_rel_gpu();
        let last = unsafe { grid::fetch_add_relaxed_gpu(counter, 1) } + 1 == pieces;
        if last {
            // Acquire: the other pieces' partials, released with their counts.
            fence::acq_rel_gpu();
            unsafe { grid::store_relaxed_gpu(counter, 0) };
        }
        unsafe { smem::store_u32(ring.split_word(half), last as u32) };
    }
    sync::named_sync(barrier, WARPGROUP_THREADS);
    let last = unsafe { smem::load_u32(ring.split_word(half)) } != 0;
    if last {
        let first = unsafe { partials.add(slot_of(t + g0)) };
        unsafe { C::sum_partials(acc, first, 2 * per_half, pieces, row, p.m) };
    }
    last
}
