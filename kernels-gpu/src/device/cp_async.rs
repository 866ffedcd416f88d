//! `cp.async` (Ampere's asynchronous copy, not the bulk/TMA form): small global → shared copies
//! that a thread issues and forgets, tracked per thread in commit groups. The copy moves the
//! bytes without a register round trip, so a value can be fetched long before it is used (a
//! tile's epilogue operands during its main loop) without holding registers meanwhile.
//!
//! Visibility: a thread's copies are complete and visible *to that thread* once
//! `cp.async.wait_group` says their group is done; other threads of the block see them after a
//! barrier that follows that wait (the pattern CUDA C++'s `cp.async.wait_all` +
//! `__syncthreads()` uses).
use core::arch::asm;

/// Starts copying the 4 bytes at global address `src` to shared-window address `dst`.
///
/// Lowers to `cvta.to.global.u64` + `cp.async.ca.shared.global [dst], [src], 4`.
///
/// # Safety
/// `src` must be a 4-byte aligned global-memory address that no one writes until the copy
/// completes; `dst` a 4-byte aligned address inside this block's shared memory that nothing
/// reads or writes until this thread's [`wait_all`] (and, for other threads, a barrier after
/// it).
#[inline(always)]
pub unsafe fn copy_4(dst: u32, src: *const f32) {
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {s}; cp.async.ca.shared.global [{d}], [g], 4; }}",
            d = in(reg32) dst,
            s = in(reg64) src,
            options(nostack),
        )
    };
}

/// `cp.async.commit_group`: closes the group of this thread's copies issued since the last
/// commit.
#[inline(always)]
pub fn commit_group() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_all`: waits until every copy this thread issued has completed (committed or
/// not) and is visible to it.
#[inline(always)]
pub fn wait_all() {
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}
