//! The f64 reference products of a GEMM (see [`crate::reference_abi`]): `Σ a·b` and
//! `Σ |a·b|` of every output element, for `--check` and the GPU tests at sizes where the
//! host's f64 loop would take minutes.
//!
//! A classic shared-memory tiled GEMM in f64, chosen for being obviously right rather than
//! fast (it runs once per check, at a few TFLOP/s of f64): each block stages a
//! `64 × 32` slice of A and of B per step, widened to f64 ([`crate::widen`]) with zeros
//! past the matrix edges (which add nothing to either sum), and each thread accumulates its
//! 4 × 4 elements over the slice's k in increasing order. No tensor cores, no asynchronous
//! copies: the only synchronisation is the block barrier around each staged slice.
use crate::device::{index, smem, sync};
use crate::reference_abi::{
    REFERENCE_K_TILE as K_TILE, REFERENCE_PITCH as PITCH, REFERENCE_THREADS as THREADS,
    REFERENCE_TILE as TILE, ReferenceParams,
};
use crate::widen;

/// Elements each thread computes along each side.
const PER_THREAD: usize = 4;

/// Threads along each side of the block's thread grid (`SIDE² = THREADS`).
const SIDE: u32 = TILE / PER_THREAD as u32;

/// Stages rows `row0..row0 + TILE` and k-elements `k0..k0 + K_TILE` of one operand (`ld`
/// elements a row, `rows` rows, `k` columns), widened by `widen`, into `tile` (`TILE` rows of
/// `PITCH` f64); elements outside the operand are 0. Consecutive threads read consecutive k
/// of one row (coalesced).
///
/// # Safety
/// `base` must point to an operand with `rows` rows of `ld ≥ k` elements of `E`; `tile` to
/// `TILE · PITCH` f64 of this block's shared memory, not being read by any thread.
#[inline(always)]
unsafe fn stage<E: Copy>(
    base: *const E,
    ld: u64,
    rows: u32,
    k: u32,
    row0: u32,
    k0: u32,
    tile: *mut f64,
    widen: impl Fn(E) -> f64,
) {
    let mut e = index::thread_idx();
    while e < TILE * K_TILE {
        let (r, kk) = (e / K_TILE, e % K_TILE);
        let (row, col) = (row0 + r, k0 + kk);
        let v = if row < rows && col < k {
            widen(unsafe { *base.add((row as u64 * ld + col as u64) as usize) })
        } else {
            0.0
        };
        unsafe { *tile.add((r * PITCH + kk) as usize) = v };
        e += THREADS;
    }
}

/// The reference products for element type `E` (read as `widen` says).
///
/// # Safety
/// `p` must describe valid operands and outputs ([`ReferenceParams`]); the launch must have
/// [`THREADS`] threads a block, `REFERENCE_SMEM_BYTES` of dynamic shared memory and at least
/// `⌈m / TILE⌉ · ⌈n / TILE⌉` blocks (extra blocks return).
#[inline(always)]
unsafe fn products<E: Copy>(p: &ReferenceParams, widen: impl Fn(E) -> f64 + Copy) {
    let tiles_n = p.n.div_ceil(TILE);
    let block = index::block_idx();
    if block >= p.m.div_ceil(TILE) * tiles_n {
        return;
    }
    let (row0, col0) = ((block / tiles_n) * TILE, (block % tiles_n) * TILE);
    let a_tile = smem::dynamic_smem() as *mut f64;
    let b_tile = unsafe { a_tile.add((TILE * PITCH) as usize) };
    let (tx, ty) = (index::thread_idx() % SIDE, index::thread_idx() / SIDE);
    let mut exact = [[0.0f64; PER_THREAD]; PER_THREAD];
    let mut magnitude = [[0.0f64; PER_THREAD]; PER_THREAD];
    let mut k0 = 0;
    while k0 < p.k {
        unsafe {
            stage(p.a as *const E, p.lda, p.m, p.k, row0, k0, a_tile, widen);
            stage(p.b as *const E, p.ldb, p.n, p.k, col0, k0, b_tile, widen);
        }
        sync::sync_threads();
        for kk in 0..K_TILE {
            let mut a = [0.0f64; PER_THREAD];
            let mut b = [0.0f64; PER_THREAD];
            for r in 0..PER_THREAD {
                let (ar, bc) = (ty + SIDE * r as u32, tx + SIDE * r as u32);
                a[r] = unsafe { *a_tile.add((ar * PITCH + kk) as usize) };
                b[r] = unsafe { *b_tile.add((bc * PITCH + kk) as usize) };
            }
            for r in 0..PER_THREAD {
                for c in 0..PER_THREAD {
                    // Exact product (see the ABI's documentation); one rounding per addition.
                    let product = a[r] * b[c];
                    exact[r][c] += product;
                    magnitude[r][c] += product.abs();
                }
            }
        }
        sync::sync_threads();
        k0 += K_TILE;
    }
    for r in 0..PER_THREAD {
        let row = row0 + ty + SIDE * r as u32;
        for c in 0..PER_THREAD {
            let col = col0 + tx + SIDE * c as u32;
            if row < p.m && col < p.n {
                let at = (row as u64 * p.n as u64 + col as u64) as usize;
                unsafe {
                    *(p.exact as *mut f64).add(at) = exact[r][c];
                    *(p.magnitude as *mut f64).add(at) = magnitude[r][c];
                }
            }
        }
    }
}

/// Reference products of bf16 operands.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reference_products_bf16(p: ReferenceParams) {
    unsafe { products::<u16>(&p, widen::bf16_to_f64) }
}

/// Reference products of IEEE half operands.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reference_products_f16(p: ReferenceParams) {
    unsafe { products::<u16>(&p, widen::f16_to_f64) }
}

/// Reference products of e4m3 operands (the codes, unscaled; the host applies the scales).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reference_products_e4m3(p: ReferenceParams) {
    unsafe { products::<u8>(&p, widen::e4m3_to_f64) }
}
