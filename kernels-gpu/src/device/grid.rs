//! Memory the blocks of one grid share on this GPU: split-K's f32 partial sums and the
//! counters that tell a tile's last split to add them up.
//!
//! The hand-off follows the usual grid-scope pattern: every thread of the writing warpgroup
//! stores its partial, a warpgroup barrier collects the stores in the leader, and the leader
//! publishes them with [`crate::device::fence::acq_rel_gpu`] followed by a relaxed
//! [`fetch_add_relaxed_gpu`] on the tile's counter (the fence makes the add a release of
//! everything the barrier ordered before it). The leader that reads the last count fences
//! again (acquire) and hands the news to its warpgroup through shared memory and a barrier,
//! after which every thread may read every split's partial. Partials are read with
//! [`load_f32_cg`] (`.cg`: from L2, never from a line this SM's L1 may hold).

use core::arch::asm;

/// `atom.relaxed.gpu.global.add.u32`: adds `value` to `*ptr` and returns the old value.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of this GPU's global memory that stays valid during
/// the access and that only this kind of atomic (and stores ordered before the kernel)
/// touches while the grid runs.
#[inline(always)]
pub unsafe fn fetch_add_relaxed_gpu(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.relaxed.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value,
            options(nostack))
    };
    old
}

/// `st.relaxed.gpu.global.u32`: stores `value` to `*ptr`.
///
/// # Safety
/// As for [`fetch_add_relaxed_gpu`]; no other thread may access `*ptr` for the rest of the
/// grid (a later grid in stream order sees the value).
#[inline(always)]
pub unsafe fn store_relaxed_gpu(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("st.relaxed.gpu.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `st.global.f32`: a plain store of one float.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of this GPU's global memory, valid during the
/// access, that no other thread accesses until the hand-off described in the module
/// documentation.
#[inline(always)]
pub unsafe fn store_f32(ptr: *mut f32, value: f32) {
    unsafe {
        asm!("st.global.f32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `ld.global.cg.f32`: a load of one float cached in L2 only.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of this GPU's global memory, valid during the
/// access, whose last writer is ordered before this thread by the hand-off described in the
/// module documentation.
#[inline(always)]
pub unsafe fn load_f32_cg(ptr: *const f32) -> f32 {
    let v: f32;
    unsafe {
        asm!("ld.global.cg.f32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) ptr, options(nostack))
    };
    v
}
