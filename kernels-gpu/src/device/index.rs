//! Thread, warp, warpgroup, block and cluster indices (PTX special registers).
use core::arch::asm;
use core::arch::nvptx;

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;
/// Threads per warpgroup: four consecutive warps, the unit that issues `wgmma`.
pub const WARPGROUP_SIZE: u32 = 128;

/// `%tid.x`: the thread's index in its block (1-D blocks only in this project).
#[inline(always)]
pub fn thread_idx() -> u32 {
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `%ctaid.x`: the block's index in the grid.
#[inline(always)]
pub fn block_idx() -> u32 {
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `%ntid.x`: threads per block.
#[inline(always)]
pub fn block_dim() -> u32 {
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `%nctaid.x`: blocks in the grid.
#[inline(always)]
pub fn grid_dim() -> u32 {
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// The global 1-D thread index `blockIdx.x * blockDim.x + threadIdx.x`.
#[inline(always)]
pub fn global_thread_idx() -> u32 {
    block_idx() * block_dim() + thread_idx()
}

/// `%laneid`-equivalent for 1-D blocks: the thread's lane in its warp.
#[inline(always)]
pub fn lane_idx() -> u32 {
    thread_idx() % WARP_SIZE
}

/// The warpgroup's index in its block (warps 4g..4g+3 form warpgroup g).
#[inline(always)]
pub fn warpgroup_idx() -> u32 {
    thread_idx() / WARPGROUP_SIZE
}

/// [`warpgroup_idx`] broadcast from lane 0 with `shfl.sync.idx`: the same value, but ptxas
/// can then prove it warp-uniform and keep what is derived from it (shared-memory addresses,
/// wgmma descriptors) in uniform registers, instead of recomputing it per thread and moving
/// it into uniform registers before every `wgmma` (CUTLASS's `canonical_warp_group_idx`).
#[inline(always)]
pub fn warpgroup_idx_uniform() -> u32 {
    let r: u32;
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {r}, {v}, 0, 0x1f, 0xffffffff;",
            r = out(reg32) r,
            v = in(reg32) warpgroup_idx(),
            options(nostack, nomem),
        )
    };
    r
}

/// The thread's index within its warpgroup, 0..128.
#[inline(always)]
pub fn thread_in_warpgroup() -> u32 {
    thread_idx() % WARPGROUP_SIZE
}

/// `%cluster_ctarank`: this block's rank within its thread-block cluster (0 without clusters).
#[inline(always)]
pub fn cluster_ctarank() -> u32 {
    let r: u32;
    unsafe {
        asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(pure, nomem, nostack))
    };
    r
}

/// `%cluster_nctarank`: the number of blocks in this block's cluster (1 without clusters).
#[inline(always)]
pub fn cluster_nctarank() -> u32 {
    let r: u32;
    unsafe {
        asm!("mov.u32 {r}, %cluster_nctarank;", r = out(reg32) r, options(pure, nomem, nostack))
    };
    r
}

/// `%clusterid.x`: the cluster's index along x in the grid of clusters.
#[inline(always)]
pub fn cluster_idx() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {r}, %clusterid.x;", r = out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// `%nclusterid.x`: clusters in the grid along x.
#[inline(always)]
pub fn cluster_count() -> u32 {
    let r: u32;
    unsafe { asm!("mov.u32 {r}, %nclusterid.x;", r = out(reg32) r, options(pure, nomem, nostack)) };
    r
}
