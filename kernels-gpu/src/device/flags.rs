//! Cross-GPU flags: system-scope acquire loads, release stores and reductions, and a clock for
//! bounded spin-waits.
//!
//! A GPU signals "data ready" by a *release* store or reduction at system scope after writing
//! the data; the waiter's *acquire* load at system scope that observes the value makes the data
//! visible to it (PTX memory model, `.sys` scope covers peer GPUs and the host).
use core::arch::asm;

/// `ld.acquire.sys.global.u32`.
#[inline(always)]
pub unsafe fn load_acquire_sys(ptr: *const u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.acquire.sys.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) ptr, options(nostack))
    };
    v
}

/// `st.release.sys.global.u32`.
#[inline(always)]
pub unsafe fn store_release_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("st.release.sys.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `st.relaxed.sys.global.u32`: a plain store that other GPUs are guaranteed to eventually see.
#[inline(always)]
pub unsafe fn store_relaxed_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("st.relaxed.sys.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `red.release.sys.global.add.u32`: atomic add with release semantics, no return value.
#[inline(always)]
pub unsafe fn add_release_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("red.release.sys.global.add.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `atom.acq_rel.sys.global.add.u32`: atomic add returning the old value.
#[inline(always)]
pub unsafe fn fetch_add_acq_rel_sys(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.acq_rel.sys.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value,
            options(nostack))
    };
    old
}

/// `nanosleep.u32 ns`: suspends the thread for about `ns` nanoseconds (at most 1 ms).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nostack)) };
}

/// `%globaltimer`: a nanosecond wall clock shared by the GPU (coarse: ~1 µs steps).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nostack)) };
    t
}

/// Outcome of a bounded wait.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    Ready,
    TimedOut,
}

/// Spins until `*flag >= target` (acquire, system scope) or `timeout_ns` have passed,
/// sleeping briefly between polls so the poller does not saturate the memory system.
#[inline(always)]
pub unsafe fn wait_at_least(flag: *const u32, target: u32, timeout_ns: u64) -> WaitOutcome {
    let start = global_timer_ns();
    loop {
        if unsafe { load_acquire_sys(flag) } >= target {
            return WaitOutcome::Ready;
        }
        if global_timer_ns().wrapping_sub(start) > timeout_ns {
            return WaitOutcome::TimedOut;
        }
        nanosleep(64);
    }
}
