//! CTA-wide and named barriers and the warp vote, through convergent NVVM intrinsics.
//!
//! `bar.sync` / `barrier.sync.aligned` requires every thread of a warp to execute the same
//! barrier instruction, `vote.sync` every lane its mask names: the intrinsics keep LLVM from
//! duplicating them into divergent code.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.all"]
    fn barrier_cta_sync_all(id: u32);
    #[link_name = "llvm.nvvm.barrier.cta.sync.aligned.count"]
    fn barrier_cta_sync_count(id: u32, threads: u32);
    #[link_name = "llvm.nvvm.vote.all.sync"]
    fn vote_all_sync(mask: u32, pred: bool) -> bool;
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

/// `vote.sync.all.pred` over the full warp: true in every lane when `pred` is true in every
/// lane. Every lane of the warp must execute it. Its result is warp-uniform by construction,
/// which ptxas knows (it lands in a uniform predicate): a loop that branches on it is uniform
/// control flow, so values carried around that loop can stay in uniform registers.
#[inline(always)]
pub fn all_lanes(pred: bool) -> bool {
    unsafe { vote_all_sync(u32::MAX, pred) }
}
