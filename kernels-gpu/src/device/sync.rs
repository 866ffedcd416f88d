//! CTA-wide and named barriers, through convergent NVVM intrinsics.
//!
//! `bar.sync` / `barrier.sync.aligned` requires every thread of a warp to execute the same
//! barrier instruction: the intrinsics keep LLVM from duplicating it into divergent code.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.all"]
    fn barrier_cta_sync_all(id: u32);
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.count"]
    fn barrier_cta_sync_count(id: u32, threads: u32);
    #[link_name = "llvm.nvvm.barrier.cta.arrive.aligned.count"]
    fn barrier_cta_arrive_count(id: u32, threads: u32);
}

/// `bar.sync 0`: waits until every thread of the block arrives; orders their shared and
/// global memory accesses (CTA scope). The `__syncthreads()` of CUDA.
#[inline(always)]
pub fn sync_threads() {
    unsafe { barrier_cta_sync_all(0) }
}

/// `bar.sync id, threads`: named barrier `id` (1..16) over `threads` threads (a multiple of 32).
/// Lets a subset of warps (e.g. the two consumer warpgroups) synchronise without the others.
#[inline(always)]
pub fn named_sync(id: u32, threads: u32) {
    unsafe { barrier_cta_sync_count(id, threads) }
}

/// `bar.arrive id, threads`: arrive at named barrier `id` without waiting for it.
#[inline(always)]
pub fn named_arrive(id: u32, threads: u32) {
    unsafe { barrier_cta_arrive_count(id, threads) }
}
