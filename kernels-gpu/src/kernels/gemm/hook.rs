//! The stage's entry into a distributed run: the PDL wait and the cross-GPU flags of its
//! [`StageHook`].
use super::ring::Ring;
use crate::device::flags::{self, WaitOutcome};
use crate::device::{cluster, fence, gdc, index, smem, sync};
use crate::gemm_abi::*;

/// The stage's entry into the distributed run, before it touches global memory: unless the
/// host deferred it (`defer_grid_wait`, [`HOOK_DEFER_GRID_WAIT`]), wait for the previous grid
/// in the stream (PDL: everything it wrote is visible after `griddepcontrol.wait`), then run
/// the prologue hook (signal and wait on cross-GPU flags). Returns whether the block goes on;
/// every thread of the cluster must call it.
#[inline(always)]
pub(super) unsafe fn stage_prologue(p: &GemmParams, ring: Ring, defer_grid_wait: bool) -> bool {
    if !defer_grid_wait {
        gdc::wait_for_prerequisites();
    }
    unsafe { prologue_hook(&p.hook, ring) }
}

/// Runs the prologue hook on thread 0 and tells every thread whether to go on; in a cluster,
/// both blocks go on only if neither timed out. Must be reached by all threads of the cluster
/// (it contains a CTA or cluster barrier, which also publishes the mbarrier initialisation).
#[inline(always)]
unsafe fn prologue_hook(hook: &StageHook, ring: Ring) -> bool {
    if index::thread_idx() == 0 {
        let mut abort = 0;
        if hook.signal_flag != 0 && index::block_idx() == 0 {
            fence::acq_rel_sys();
            unsafe { flags::store_release_sys(hook.signal_flag as *mut u32, hook.signal_value) };
        }
        if hook.wait_flag != 0 && hook.flags & HOOK_WAIT_BEFORE_C == 0 {
            if unsafe { wait_for_hook_flag(hook) } {
                abort = 1;
            }
            // TMA reads what the flag guards through the async proxy (A and B: this thread;
            // C: the consumer leaders, which fence for themselves in `consume`).
            fence::proxy_async_global();
        }
        unsafe { smem::store_u32(ring.abort_flag(), abort) };
    }
    if ring.tile.cluster_m == 1 {
        sync::sync_threads();
        unsafe { smem::load_u32(ring.abort_flag()) == 0 }
    } else {
        cluster::cluster_sync();
        let mut abort = 0;
        for rank in 0..ring.tile.cluster_m {
            abort |= unsafe {
                cluster::load_shared_cluster_u32(cluster::map_shared_rank(ring.abort_flag(), rank))
            };
        }
        abort == 0
    }
}

/// One thread waits (system-scope acquire, bounded by `hook.timeout_ns`) until the hook's
/// `wait_flag` reaches `wait_value`; on a timeout it records `hook.error_code` in the
/// device's and every peer's error word and returns true.
///
/// # Safety
/// `hook.wait_flag`, `hook.error_word` and `hook.peer_errors` must be the valid global
/// addresses the lowering fills (this GPU's or a peer's).
#[inline(always)]
pub(super) unsafe fn wait_for_hook_flag(hook: &StageHook) -> bool {
    let outcome = unsafe {
        flags::wait_at_least(
            hook.wait_flag as *const u32,
            hook.wait_value,
            hook.timeout_ns,
        )
    };
    let timed_out = outcome == WaitOutcome::TimedOut;
    if timed_out {
        unsafe { flags::record_error(hook.error_word, &hook.peer_errors, hook.error_code) };
    }
    timed_out
}
