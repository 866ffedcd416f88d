//! Memory and proxy fences.
//!
//! The tensor-memory accelerator (TMA) and `wgmma` access shared memory through the *async
//! proxy*; ordinary loads and stores (and `stmatrix`) use the *generic proxy*. Ordering between
//! the two needs an explicit proxy fence in the thread that made the accesses.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.fence.proxy.async.shared_cta"]
    fn fence_proxy_async_shared_cta_intr();
    #[link_name = "llvm.nvvm.fence.mbarrier_init.release.cluster"]
    fn fence_mbarrier_init_intr();
}

/// `fence.proxy.async.shared::cta`: orders this thread's earlier generic-proxy accesses to
/// shared memory before later async-proxy accesses (a TMA store or `wgmma` reading what this
/// thread wrote with `st.shared`/`stmatrix`; a TMA load overwriting what it read). Each writing
/// thread fences, then a barrier hands the data to the thread that issues the async operation.
#[inline(always)]
pub fn proxy_async_shared() {
    unsafe { fence_proxy_async_shared_cta_intr() }
}

/// `fence.mbarrier_init.release.cluster`: makes preceding `mbarrier.init`s visible to the async
/// proxy and to other blocks of the cluster. Follow it by a CTA or cluster barrier.
#[inline(always)]
pub fn mbarrier_init() {
    unsafe { fence_mbarrier_init_intr() }
}

/// `fence.proxy.async.global`: orders this thread's generic-proxy view of global memory with
/// later async-proxy (TMA) reads of it. Used after acquiring a cross-GPU flag and before TMA
/// loads of the data it guards.
#[inline(always)]
pub fn proxy_async_global() {
    unsafe { core::arch::asm!("fence.proxy.async.global;", options(nostack)) }
}

/// `fence.acq_rel.gpu`: a GPU-scope acquire-release fence (the other blocks of this GPU).
#[inline(always)]
pub fn acq_rel_gpu() {
    unsafe { core::arch::asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// `fence.acq_rel.sys`: a system-scope acquire-release fence (other GPUs and the host).
#[inline(always)]
pub fn acq_rel_sys() {
    unsafe { core::arch::asm!("fence.acq_rel.sys;", options(nostack)) }
}

/// `fence.proxy.tensormap::generic.acquire.sys [map], 128`: makes the 128-byte tensor map at
/// `map` (global memory, written through the generic proxy: by an upload the host issued
/// before the launch) visible to this thread's later tensor-map-proxy uses of it
/// (`prefetch.tensormap`, TMA loads and stores). The tensormap proxy is not acquired at kernel
/// start (PTX ISA, "tensormap proxy"), so each thread that uses a map acquires it once before
/// its first use. System scope: the PTX memory model orders the host's accesses with the
/// GPU's only at `.sys` scope, and the maps are written by host-issued copies (GPU scope would
/// rely on more than the model promises). Once per thread and launch, so the wider scope
/// costs nothing measurable.
///
/// # Safety
/// `map` must be the 128-byte-aligned global-memory address of a tensor map that stays
/// valid while this kernel uses it.
#[inline(always)]
pub unsafe fn tensormap_acquire(map: u64) {
    unsafe {
        core::arch::asm!(
            "fence.proxy.tensormap::generic.acquire.sys [{m}], 128;",
            m = in(reg64) map,
            options(nostack)
        )
    }
}
