//! Cache hints: `prefetch.global.L1` asks this SM's L1 to fetch the 128-byte line holding an
//! address, without waiting for it and without a register. It changes no value a later load
//! returns (loads still see the memory model's values; a line the hint brought in is an
//! ordinary L1 line), only how long that load may take, and a later load of a line the hint
//! already brought in hits L1 (~30 cycles) instead of going to L2 (~300–600).

use core::arch::asm;

/// `prefetch.global.L1 [ptr]`.
///
/// # Safety
/// `ptr` must be an address of this GPU's global memory inside an allocation (the hint reads
/// the line that holds it).
#[inline(always)]
pub unsafe fn l1<T>(ptr: *const T) {
    unsafe { asm!("prefetch.global.L1 [{p}];", p = in(reg64) ptr, options(nostack, readonly)) };
}
