//! The register epilogue's stores: one output, or a pair of adjacent ones, straight from
//! registers to global memory, bounds-checked against M × N.
use super::row_scales::row_scale;
use crate::device::wgmma::InputType;
use crate::gemm_abi::*;

/// Stores one pair of horizontally adjacent outputs `(row, col)`, `(row, col + 1)`.
///
/// # Safety
/// `p.d` (and, with `beta != 0`, `p.c`) must address M rows of `ldd` (`ldc`) 16-bit elements
/// in global memory this thread may write (read); with row-wise FP8 scales, as [`row_scale`].
#[inline(always)]
pub(super) unsafe fn store_pair<T: InputType>(
    p: &GemmParams,
    row: u32,
    col: u32,
    x0: f32,
    x1: f32,
) {
    if col + 1 >= p.n {
        // The last column of an odd N (or none at all).
        return unsafe { store_one::<T>(p, row, col, x0) };
    }
    if row >= p.m {
        return;
    }
    let mut v0 = p.alpha * x0;
    let mut v1 = p.alpha * x1;
    if T::FP8 && p.row_scales.a != 0 {
        v0 *= unsafe { row_scale(p, row, col) };
        v1 *= unsafe { row_scale(p, row, col + 1) };
    }
    let at_d = (row as usize) * (p.ldd as usize) + col as usize;
    if p.beta != 0.0 {
        let at_c = (row as usize) * (p.ldc as usize) + col as usize;
        let (c0, c1) = T::unpack2(unsafe { *((p.c as *const u16).add(at_c) as *const u32) });
        v0 += p.beta * c0;
        v1 += p.beta * c1;
    }
    unsafe { *((p.d as *mut u16).add(at_d) as *mut u32) = T::pack2(v0, v1) };
}

/// Stores one output `(row, col)`: `alpha·x` (row-wise FP8: times the row's and column's
/// scales) plus `beta·C`; nothing outside the M × N output.
///
/// # Safety
/// `p.d` (and, with `beta != 0`, `p.c`) must address M rows of `ldd` (`ldc`) 16-bit elements
/// in global memory this thread may write (read); with row-wise FP8 scales, as [`row_scale`].
#[inline(always)]
pub(super) unsafe fn store_one<T: InputType>(p: &GemmParams, row: u32, col: u32, x: f32) {
    if row >= p.m || col >= p.n {
        return;
    }
    let mut v = p.alpha * x;
    if T::FP8 && p.row_scales.a != 0 {
        v *= unsafe { row_scale(p, row, col) };
    }
    if p.beta != 0.0 {
        let at_c = (row as usize) * (p.ldc as usize) + col as usize;
        v += p.beta * T::unpack2(unsafe { *(p.c as *const u16).add(at_c) } as u32).0;
    }
    let at_d = (row as usize) * (p.ldd as usize) + col as usize;
    unsafe { *(p.d as *mut u16).add(at_d) = T::pack2(v, 0.0) as u16 };
}
