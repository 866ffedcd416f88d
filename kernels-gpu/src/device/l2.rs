//! L2 eviction priorities for bulk copies: `createpolicy` makes a 64-bit cache policy that
//! TMA loads take as their `.L2::cache_hint` operand (PTX ISA 7.4+, sm_80+).
//!
//! A line brought in under `evict_first` is among the first to go when L2 needs room, so data
//! read once (or by a few readers close together in time) does not push out data that will be
//! read again. The hint is advisory: it changes which lines stay, never what a load returns.
use core::arch::asm;

/// A cache policy for the `.L2::cache_hint` operand of [`crate::device::tma`] loads.
#[derive(Clone, Copy)]
pub struct CachePolicy(pub u64);

impl CachePolicy {
    /// `createpolicy.fractional.L2::evict_first.b64 p, 1.0`: every line the load touches is an
    /// early eviction candidate.
    #[inline(always)]
    pub fn evict_first() -> Self {
        let policy: u64;
        unsafe {
            asm!(
                "createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;",
                p = out(reg64) policy,
                options(nostack, nomem, pure),
            )
        };
        CachePolicy(policy)
    }
}
