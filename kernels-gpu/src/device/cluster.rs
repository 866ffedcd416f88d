//! Thread-block clusters: cluster barriers and distributed shared memory addresses.
use core::arch::asm;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.barrier.cluster.arrive"]
    fn barrier_cluster_arrive();
    #[link_name = "llvm.nvvm.barrier.cluster.wait"]
    fn barrier_cluster_wait();
}

/// `barrier.cluster.arrive` + `barrier.cluster.wait`: every thread of every block in the
/// cluster arrives, then waits for all of them. Release/acquire at cluster scope, so shared
/// memory written before it (e.g. mbarrier initialisation) is visible to the other blocks.
#[inline(always)]
pub fn cluster_sync() {
    unsafe {
        barrier_cluster_arrive();
        barrier_cluster_wait();
    }
}

/// `mapa.shared::cluster.u32`: maps the shared-window address `addr` of this block to the
/// address of the same variable in block `rank` of the cluster, for `.shared::cluster` accesses
/// (remote `mbarrier.arrive`, `ld.shared::cluster`).
#[inline(always)]
pub fn map_shared_rank(addr: u32, rank: u32) -> u32 {
    let r: u32;
    unsafe {
        asm!("mapa.shared::cluster.u32 {r}, {a}, {k};", r = out(reg32) r, a = in(reg32) addr, k = in(reg32) rank,
            options(pure, nomem, nostack))
    };
    r
}

/// Reads a 32-bit word of another block's shared memory at an address from
/// [`map_shared_rank`].
///
/// Lowers to `ld.shared::cluster.u32 v, [addr]`.
///
/// # Safety
/// `addr` must be a 4-byte aligned `.shared::cluster` address (from [`map_shared_rank`]) of a
/// block of this cluster that has not exited, inside that block's shared memory; the word must
/// have been made visible to this thread (a [`cluster_sync`] or a release/acquire pair after it
/// was written).
#[inline(always)]
pub unsafe fn load_shared_cluster_u32(addr: u32) -> u32 {
    let v: u32;
    unsafe {
        asm!("ld.shared::cluster.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack))
    };
    v
}
