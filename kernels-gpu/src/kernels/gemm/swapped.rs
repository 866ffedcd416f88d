//! [`Config`] for the transposed-product decode configurations (`*t`, at most 16 rows:
//! [`TileConfig::swap_ab`]), spelled out per configuration by `swapped_config!`.
use super::config::{Config, add_split};
use super::ring::Ring;
use super::store::store_one;
use crate::device::wgmma::{self, InputType};
use crate::device::{grid, index};
use crate::gemm_abi::*;
use crate::layout::fragment;
use seq_macro::seq;

/// Implements [`Config`] for each transposed-product configuration listed
/// ([`TileConfig::swap_ab`]): a consumer warpgroup's accumulator is one 64 × 16 `wgmma`
/// fragment of the share's product with its rows and columns traded — fragment row `i` is
/// the share's column (weight row) `i`, fragment column `j` its row (token) `j`
/// ([`fragment::accumulator_element`]); 8 registers a thread. Stored from registers one
/// element at a time (the decode output is a few rows; its bytes are nothing beside the
/// weights').
macro_rules! swapped_config {
    ($($name:ident: $tile:ident),+) => {$(
        pub(super) struct $name;
        const _: () = {
            let t = $tile;
            assert!(t.swap_ab && t.a_rows == 16 && t.wg_cols() == SLAB_M && !t.staged);
        };
        impl Config for $name {
            const TILE: TileConfig = $tile;
            type Acc = [f32; 8];
            #[inline(always)]
            fn new_acc() -> Self::Acc {
                [0.0; 8]
            }
            #[inline(always)]
            fn fence(acc: &mut Self::Acc) {
                wgmma::fence_operands_8(acc);
            }
            /// The share's 64 B rows are the instruction's A operand (its M), the stage's 16
            /// A rows its B operand (its N): the descriptors trade places.
            #[inline(always)]
            unsafe fn mma<T: InputType>(acc: &mut Self::Acc, desc_a: u64, desc_b: u64, scale_d: u32) {
                unsafe { T::mma_n16(acc, desc_b, desc_a, scale_d) };
            }
            #[inline(always)]
            unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &Self::Acc, row: u32, col: u32) {
                let t = index::thread_in_warpgroup();
                seq!(R in 0..8 {
                    let (weight, token) = fragment::accumulator_element(t, R);
                    unsafe { store_one::<T>(p, row + token, col + weight, acc[R]) };
                });
            }
            /// Register `r` is float `r·128 + t` of the slot, as in the other configurations;
            /// registers of tokens at or past `m` are skipped.
            #[inline(always)]
            unsafe fn store_partial(acc: &Self::Acc, slot: *mut f32, row: u32, m: u32) {
                let t = index::thread_in_warpgroup();
                seq!(R in 0..8 {
                    if row + fragment::accumulator_element(t, R).1 < m {
                        unsafe { grid::store_f32(slot.add((R * 128 + t) as usize), acc[R]) };
                    }
                });
            }
            /// Eight splits' loads at a time ([`SWAPPED_SUM_GROUP`]: 64 registers beside the 8
            /// accumulators), added in split order.
            #[inline(always)]
            unsafe fn sum_partials(
                acc: &mut Self::Acc,
                first: *const f32,
                stride: usize,
                splits: u32,
                row: u32,
                m: u32,
            ) {
                let t = index::thread_in_warpgroup();
                let keep = |r: u32| row + fragment::accumulator_element(t, r).1 < m;
                for j0 in (0..splits).step_by(SWAPPED_SUM_GROUP as usize) {
                    let mut v = [[0.0f32; 8]; SWAPPED_SUM_GROUP as usize];
                    seq!(G in 0..8 {
                        if j0 + G < splits {
                            let slot = unsafe { first.add((j0 + G) as usize * stride) };
                            seq!(R in 0..8 {
                                if keep(R) {
                                    v[G][R] = unsafe { grid::load_f32_cg(slot.add((R * 128 + t) as usize)) };
                                }
                            });
                        }
                    });
                    seq!(G in 0..8 {
                        if j0 + G < splits {
                            seq!(R in 0..8 {
                                if keep(R) {
                                    add_split(&mut acc[R], v[G][R], j0 + G == 0);
                                }
                            });
                        }
                    });
                }
            }
            /// Never staged (checked above): the register epilogue.
            #[inline(always)]
            unsafe fn epilogue_staged<T: InputType>(
                p: &GemmParams,
                acc: &Self::Acc,
                _ring: Ring,
                _half: u32,
                row: u32,
                col: u32,
                _chunks_before: u32,
            ) {
                unsafe { Self::epilogue::<T>(p, acc, row, col) };
            }
        }
    )+};
}

swapped_config!(
    Tile16x128T: TILE_16X128_SWAPPED,
    Tile16x128TS: TILE_16X128_SWAPPED_SPLITK,
    Tile16x64T: TILE_16X64_SWAPPED,
    Tile16x64T2: TILE_16X64_SWAPPED_DEEP,
    Tile16x128T2: TILE_16X128_SWAPPED_DEEP,
    Tile16x64T4: TILE_16X64_SWAPPED_DEEP4
);
