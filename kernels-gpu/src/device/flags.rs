//! Cross-GPU flags: system-scope acquire loads, release stores and reductions, and a clock for
//! bounded spin-waits.
//!
//! A GPU signals "data ready" by a *release* store or reduction at system scope after writing
//! the data; the waiter's *acquire* load at system scope that observes the value makes the data
//! visible to it (PTX memory model, `.sys` scope covers peer GPUs and the host).
use crate::collective_abi::{MAX_PEERS, PeerErrorWords};
use core::arch::asm;
use seq_macro::seq;

const _: () = assert!(
    MAX_PEERS == 8,
    "record_error's unrolled loop assumes 8 peers"
);

/// `ld.acquire.sys.global.u32`.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access.
#[inline(always)]
pub unsafe fn load_acquire_sys(ptr: *const u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.acquire.sys.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) ptr, options(nostack))
    };
    v
}

/// `st.release.sys.global.u32`.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access and
/// that the protocol reserves for flags (nothing reads it as other data). Atomics on a peer
/// GPU's memory need native peer atomics (NVLink).
#[inline(always)]
pub unsafe fn store_release_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("st.release.sys.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `st.relaxed.sys.global.u32`: a plain store that other GPUs are guaranteed to eventually see.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access and
/// that the protocol reserves for flags (nothing reads it as other data). Atomics on a peer
/// GPU's memory need native peer atomics (NVLink).
#[inline(always)]
pub unsafe fn store_relaxed_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("st.relaxed.sys.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `red.release.sys.global.add.u32`: atomic add with release semantics, no return value.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access and
/// that the protocol reserves for flags (nothing reads it as other data). Atomics on a peer
/// GPU's memory need native peer atomics (NVLink).
#[inline(always)]
pub unsafe fn add_release_sys(ptr: *mut u32, value: u32) {
    unsafe {
        asm!("red.release.sys.global.add.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack))
    };
}

/// `atom.acq_rel.sys.global.add.u32`: atomic add returning the old value.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access and
/// that the protocol reserves for flags (nothing reads it as other data). Atomics on a peer
/// GPU's memory need native peer atomics (NVLink).
#[inline(always)]
pub unsafe fn fetch_add_acq_rel_sys(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.acq_rel.sys.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value,
            options(nostack))
    };
    old
}

/// `atom.relaxed.sys.global.cas.b32`: stores `new` if `*ptr == expected`; returns the old value.
///
/// # Safety
/// `ptr` must be a 4-byte-aligned address of global memory (this GPU's, a peer's mapped by
/// peer access or CUDA IPC, or mapped host memory) that stays valid during the access and
/// that the protocol reserves for flags (nothing reads it as other data). Atomics on a peer
/// GPU's memory need native peer atomics (NVLink).
#[inline(always)]
pub unsafe fn compare_and_swap_relaxed_sys(ptr: *mut u32, expected: u32, new: u32) -> u32 {
    let old: u32;
    unsafe {
        asm!("atom.relaxed.sys.global.cas.b32 {o}, [{p}], {e}, {n};", o = out(reg32) old, p = in(reg64) ptr,
            e = in(reg32) expected, n = in(reg32) new, options(nostack))
    };
    old
}

/// Records error `code` in the own error word and in every non-zero entry of `peers` with
/// `atom.cas 0 → code` (relaxed, system scope), so each word keeps the first code it got.
/// Relaxed suffices: nothing is published through the words but the codes themselves, and any
/// later release by this thread (a flag store, the grid's completion) orders them before it.
/// Lowers to one `atom.relaxed.sys.global.cas.b32` per non-zero word.
///
/// # Safety
/// `own` and every non-zero entry of `peers` must be the error words of live exclusive
/// workspaces (4-byte aligned global memory of this GPU or of a peer reachable with native
/// atomics), as the lowering fills them.
#[inline(always)]
pub unsafe fn record_error(own: u64, peers: &PeerErrorWords, code: u32) {
    unsafe { compare_and_swap_relaxed_sys(own as *mut u32, 0, code) };
    seq!(I in 0..8 {
        if peers[I] != 0 {
            unsafe { compare_and_swap_relaxed_sys(peers[I] as *mut u32, 0, code) };
        }
    });
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
/// Lowers to a loop of `ld.acquire.sys.global.u32`, `mov.u64 %globaltimer` and `nanosleep.u32`.
///
/// # Safety
/// As for [`load_acquire_sys`]: `flag` is a valid, 4-byte-aligned flag of global memory.
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
