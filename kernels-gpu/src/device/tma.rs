//! The tensor-memory accelerator: bulk 2-D tensor copies between global and shared memory.
//!
//! A copy is described by a 128-byte `CUtensorMap` built on the host
//! (`cuTensorMapEncodeTiled`) and kept in global memory; kernels receive its generic address.
//! Coordinates are element coordinates, innermost (contiguous) dimension first: `(col, row)`.
//! Out-of-bounds parts of a box read as zero and are not written by stores.
use core::arch::asm;

/// Generic address of the calling entry point's first parameter (its by-value parameter
/// block), from which TMA may read tensor maps placed there.
///
/// Lowers to `mov.b64 %rd, <entry>_param_0; cvta.param.u64 %rd, %rd;` (nvcc's form for a
/// `__grid_constant__` parameter, PTX ISA ≥ 7.7). rustc cannot name the parameter, so the
/// assembly holds a placeholder that the build replaces with the entry's parameter symbol,
/// also raising that parameter's alignment to 128 bytes (`xtask` `patch_entry_param_0`; the
/// build fails if the placeholder is left outside an entry). Must therefore be inlined into
/// the entry point (every caller is `#[inline(always)]` up to the `extern "ptx-kernel" fn`).
#[inline(always)]
pub fn entry_params_address() -> u64 {
    let a: u64;
    unsafe {
        asm!(
            "mov.b64 {a}, __ENTRY_PARAM_0__;",
            "cvta.param.u64 {a}, {a};",
            a = out(reg64) a,
            options(pure, nomem, nostack),
        )
    };
    a
}

/// Pulls a tensor-map descriptor into the descriptor cache early.
///
/// Lowers to `prefetch.tensormap [map]`.
///
/// # Safety
/// `map` must be the generic address of a valid 64-byte aligned `CUtensorMap` in global, const
/// or param memory that outlives the kernel.
#[inline(always)]
pub unsafe fn prefetch_descriptor(map: u64) {
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map, options(nostack)) };
}

/// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`: copies
/// the box at `(col, row)` into shared memory at `dst`; the bytes retire `bar`'s transaction
/// count when they have landed. `dst` must be 128-byte aligned (1024 for the 128-byte swizzle).
///
/// Lowers to `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
/// [dst], [map, {col, row}], [bar]`.
///
/// # Safety
/// - `map` is a valid tensor map (as in [`prefetch_descriptor`]) whose box fits at `dst`, and
///   `dst` is aligned as above, inside this block's shared memory;
/// - `bar` is an initialised mbarrier of this block whose current phase expects these bytes
///   (`arrive_expect_tx` before or with the copy), and nothing reads `dst` until that phase
///   completes nor writes it while the copy is in flight;
/// - the global memory the box covers stays allocated, and unwritten, until the copy lands.
#[inline(always)]
pub unsafe fn load_2d(dst: u32, map: u64, col: i32, row: i32, bar: u32) {
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c}, {r}}}], [{b}];",
            d = in(reg32) dst, m = in(reg64) map, c = in(reg32) col, r = in(reg32) row, b = in(reg32) bar,
            options(nostack),
        )
    };
}

/// Like [`load_2d`], but the data and the `complete_tx` signal are delivered to the same
/// shared-memory offsets in every block of the cluster whose bit is set in `cta_mask`.
///
/// Lowers to `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
/// .multicast::cluster [dst], [map, {col, row}], [bar], cta_mask`.
///
/// # Safety
/// As [`load_2d`], for every block in `cta_mask`: each is a running block of this cluster
/// whose mbarrier at `bar` expects the bytes and whose shared memory at `dst` is free until
/// that phase completes; the mask names only ranks below the cluster size.
#[inline(always)]
pub unsafe fn load_2d_multicast(dst: u32, map: u64, col: i32, row: i32, bar: u32, cta_mask: u16) {
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{c}, {r}}}], [{b}], {k};",
            d = in(reg32) dst, m = in(reg64) map, c = in(reg32) col, r = in(reg32) row, b = in(reg32) bar,
            k = in(reg16) cta_mask,
            options(nostack),
        )
    };
}

/// `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group`: stores the box at `(col, row)` from
/// shared memory at `src`. Writers of `src` must have executed
/// [`crate::device::fence::proxy_async_shared`] and synchronised first.
///
/// Lowers to `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [map, {col, row}], [src]`.
///
/// # Safety
/// - `map` is a valid tensor map (as in [`prefetch_descriptor`]) whose box is the data at
///   `src`, a 128-byte aligned address inside this block's shared memory (1024 for the
///   128-byte swizzle);
/// - the writers of `src` have fenced ([`crate::device::fence::proxy_async_shared`]) and
///   synchronised with this thread, and nobody writes `src` until [`wait_group_read`] says
///   the store has read it;
/// - the global memory the box covers is allocated and no other thread accesses it until the
///   store completes ([`wait_group`], or the kernel's end).
#[inline(always)]
pub unsafe fn store_2d(map: u64, col: i32, row: i32, src: u32) {
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [{m}, {{{c}, {r}}}], [{s}];",
            m = in(reg64) map, c = in(reg32) col, r = in(reg32) row, s = in(reg32) src,
            options(nostack),
        )
    };
}

unsafe extern "C" {
    #[link_name = "llvm.nvvm.cp.async.bulk.commit.group"]
    fn commit_group_intr();
    #[link_name = "llvm.nvvm.cp.async.bulk.wait.group.read"]
    fn wait_group_read_intr(n: i32);
    #[link_name = "llvm.nvvm.cp.async.bulk.wait.group"]
    fn wait_group_intr(n: i32);
}

/// `cp.async.bulk.commit_group`: closes the group of bulk stores issued by this thread so far.
#[inline(always)]
pub fn commit_group() {
    unsafe { commit_group_intr() }
}

/// `cp.async.bulk.wait_group.read N`: waits until at most `N` of this thread's committed store
/// groups still have to *read* their shared-memory source (the buffers can then be reused).
#[inline(always)]
pub fn wait_group_read<const N: i32>() {
    unsafe { wait_group_read_intr(N) }
}

/// `cp.async.bulk.wait_group N`: waits until at most `N` committed store groups are pending,
/// their writes complete.
#[inline(always)]
pub fn wait_group<const N: i32>() {
    unsafe { wait_group_intr(N) }
}
