//! `stmatrix` / `ldmatrix`: a warp stores (loads) 8×8 tiles of 16-bit elements from (to)
//! registers to (from) shared memory, in the `wgmma` accumulator fragment layout.
use core::arch::asm;

/// `stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}`: stores four 8×8
/// matrices. Lane `l` provides the 16-byte aligned shared address of row `l % 8` of matrix
/// `l / 8`; register `j` of lane `l` holds elements (row `l / 4`, cols `2(l % 4)`, `+1`) of
/// matrix `j` — the same fragment layout as a `wgmma` accumulator pair, packed with `cvt.rn`.
/// Every lane of the warp must execute it.
///
/// Lowers to `stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}`.
///
/// # Safety
/// Every lane of the warp must call it together (converged, same call site), each with a
/// 16-byte aligned shared-window address of a 16-byte row inside this block's shared memory
/// that no other thread or asynchronous proxy accesses until the warp has synchronised again.
#[inline(always)]
pub unsafe fn store_x4(addr: u32, r0: u32, r1: u32, r2: u32, r3: u32) {
    unsafe {
        asm!(
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [{a}], {{{r0}, {r1}, {r2}, {r3}}};",
            a = in(reg32) addr, r0 = in(reg32) r0, r1 = in(reg32) r1, r2 = in(reg32) r2, r3 = in(reg32) r3,
            options(nostack),
        )
    };
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [addr]`: the inverse of
/// [`store_x4`], with the same addressing and register layout. Every lane must execute it.
///
/// Lowers to `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [addr]`.
///
/// # Safety
/// As [`store_x4`], except that the rows are read: they must have been written and made
/// visible to the warp (a barrier, or an mbarrier phase) before the call.
#[inline(always)]
pub unsafe fn load_x4(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    unsafe {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{r0}, {r1}, {r2}, {r3}}}, [{a}];",
            a = in(reg32) addr, r0 = out(reg32) r0, r1 = out(reg32) r1, r2 = out(reg32) r2, r3 = out(reg32) r3,
            options(nostack),
        )
    };
    [r0, r1, r2, r3]
}
