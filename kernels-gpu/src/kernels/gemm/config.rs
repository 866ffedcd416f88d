//! The seam between the kernel's generic code (producer, consumers, split-K) and each tile
//! configuration: [`Config`], whose implementations [`super::slabs`] and [`super::swapped`]
//! generate with literal register indices.
use super::ring::Ring;
use crate::device::wgmma::InputType;
use crate::gemm_abi::*;

/// A compiled tile configuration: its [`TileConfig`] and the code that depends on the shape of
/// a consumer warpgroup's share (accumulator size, wgmma shape, epilogue), generated with
/// literal register indices.
pub(super) trait Config {
    const TILE: TileConfig;
    type Acc;
    fn new_acc() -> Self::Acc;
    fn fence(acc: &mut Self::Acc);
    /// One k16 step into every slab: `desc_a` addresses the warpgroup's first 64 A rows, each
    /// further slab's rows start [`SLAB_A_BYTES`] later; all slabs multiply the same B rows.
    unsafe fn mma<T: InputType>(acc: &mut Self::Acc, desc_a: u64, desc_b: u64, scale_d: u32);
    /// Stores the warpgroup's share from registers; `(row, col)` is its top-left element.
    unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &Self::Acc, row: u32, col: u32);
    /// Split-K: writes the accumulators to the warpgroup's partial-sum slot `slot` (layout:
    /// [`SplitParams`]), skipping rows at or past `m`; `row` is the share's top row.
    unsafe fn store_partial(acc: &Self::Acc, slot: *mut f32, row: u32, m: u32);
    /// Split-K: `acc = slot 0 + slot 1 + … + slot splits−1`, added in that order, the slots
    /// `stride` floats apart from `first`; rows at or past `m` keep what they held.
    unsafe fn sum_partials(
        acc: &mut Self::Acc,
        first: *const f32,
        stride: usize,
        splits: u32,
        row: u32,
        m: u32,
    );
    /// Stores the warpgroup's share through the staging buffers; `(row, col)` is its top-left
    /// element.
    unsafe fn epilogue_staged<T: InputType>(
        p: &GemmParams,
        acc: &Self::Acc,
        ring: Ring,
        half: u32,
        row: u32,
        col: u32,
        chunks_before: u32,
    );
}

// `seq!(G in 0..4)` and, for the transposed tiles, `seq!(G in 0..8)` in `sum_partials` spell
// the bounds of their group loops as literals.
const _: () = assert!(MAX_SUM_GROUP == 4 && SWAPPED_SUM_GROUP == 8);

/// Split-K: adds split `x` to the running sum `acc`, or starts it with split 0 (`first`).
#[inline(always)]
pub(super) fn add_split(acc: &mut f32, x: f32, first: bool) {
    *acc = if first { x } else { *acc + x };
}

/// Bytes between the A rows of consecutive 64-row slabs in a stage's A tile (128-byte rows).
pub(super) const SLAB_A_BYTES: u32 = SLAB_M * BLOCK_K * 2;
