//! Row-wise FP8 scales in the epilogue: read from global memory by the register epilogue,
//! copied into shared memory during the main loop for the staged one.
use super::WARPGROUP_THREADS;
use super::config::Config;
use super::ring::Ring;
use crate::device::{cp_async, index, smem, sync};
use crate::gemm_abi::*;

/// Row-wise FP8, staged epilogue: starts copying the scales of consumer warpgroup `half`'s
/// share of a tile, whose top-left element is `(row, col)`, into its scale area
/// ([`Ring::row_scales`]) with `cp.async`, so that they arrive while the main loop runs and the
/// epilogue reads them from shared memory ([`stage_row_scales_ready`]). Thread `t` of the
/// warpgroup copies `sb[col + t + 128·j]` and `sa[row + t]` (indices clamped to N − 1 and
/// M − 1: the rows and columns past them are computed but never stored). Its copies for an
/// earlier unit must be complete first: a split-K unit that ran no epilogue never waited.
///
/// # Safety
/// As [`row_scale`]; every thread of the warpgroup calls it, after the warpgroup's last
/// epilogue read of the area (its chunks' barriers order those reads before this).
#[inline(always)]
pub(super) unsafe fn copy_row_scales<C: Config>(
    p: &GemmParams,
    ring: Ring,
    half: u32,
    row: u32,
    col: u32,
) {
    let t = index::thread_in_warpgroup();
    let area = ring.row_scales(half);
    let (cols, rows) = (C::TILE.wg_cols(), C::TILE.wg_rows());
    cp_async::wait_all();
    let sb = p.row_scales.b as *const f32;
    let sa = p.row_scales.a as *const f32;
    let mut c = t;
    while c < cols {
        let src = unsafe { sb.add((col + c).min(p.n - 1) as usize) };
        unsafe { cp_async::copy_4(area + 4 * c, src) };
        c += WARPGROUP_THREADS;
    }
    if t < rows {
        let src = unsafe { sa.add((row + t).min(p.m - 1) as usize) };
        unsafe { cp_async::copy_4(area + 4 * (cols + t), src) };
    }
    cp_async::commit_group();
}

/// Row-wise FP8, staged epilogue: waits for this thread's [`copy_row_scales`] and, with the
/// warpgroup barrier `barrier`, for every other thread's, so the whole scale area is visible.
#[inline(always)]
pub(super) fn stage_row_scales_ready(barrier: u32) {
    cp_async::wait_all();
    sync::named_sync(barrier, WARPGROUP_THREADS);
}

/// Row-wise FP8, staged epilogue: the B scales a lane applies in one chunk, `PAIRS` groups of
/// columns `c + 16·pr + {0, 1, 8, 9}` of the warpgroup's share (`c`: the lane's first column
/// in the chunk, even; group `pr` covers column blocks `2·pr` and `2·pr + 1` of the chunk, 8
/// columns each, of which the lane holds two adjacent columns per block), read from the
/// scale area `area` as pairs.
///
/// # Safety
/// `area` must be the warpgroup's scale area after [`stage_row_scales_ready`].
#[inline(always)]
pub(super) unsafe fn chunk_scales_b<const PAIRS: usize>(area: u32, c: u32) -> [[f32; 4]; PAIRS] {
    let mut scales = [[1.0; 4]; PAIRS];
    for (pr, group) in scales.iter_mut().enumerate() {
        let c0 = area + 4 * (c + 16 * pr as u32);
        let [x0, x1] = unsafe { smem::load_f32x2(c0) };
        let [x8, x9] = unsafe { smem::load_f32x2(c0 + 32) };
        *group = [x0, x1, x8, x9];
    }
    scales
}

/// Row-wise FP8 scales ([`RowScales`]): `sa[row] · sb[col]`, the row and column clamped to
/// M − 1 and N − 1 (elements past them are computed but never stored).
///
/// # Safety
/// `p.row_scales` must hold the addresses of M and N f32 in this GPU's memory.
#[inline(always)]
pub(super) unsafe fn row_scale(p: &GemmParams, row: u32, col: u32) -> f32 {
    unsafe { scale_a(p, row) * scale_b(p, col) }
}

/// Row-wise FP8: `sa[row]`, the row clamped to M − 1 ([`row_scale`]'s first factor).
///
/// # Safety
/// As [`row_scale`].
#[inline(always)]
unsafe fn scale_a(p: &GemmParams, row: u32) -> f32 {
    unsafe { *(p.row_scales.a as *const f32).add(row.min(p.m - 1) as usize) }
}

/// Row-wise FP8: `sb[col]`, the column clamped to N − 1 ([`row_scale`]'s second factor).
///
/// # Safety
/// As [`row_scale`].
#[inline(always)]
unsafe fn scale_b(p: &GemmParams, col: u32) -> f32 {
    unsafe { *(p.row_scales.b as *const f32).add(col.min(p.n - 1) as usize) }
}
