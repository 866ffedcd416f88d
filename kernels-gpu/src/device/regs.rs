//! Register reallocation between warpgroups (`setmaxnreg`, sm_90a).
//!
//! `setmaxnreg.{inc,dec}.sync.aligned.u32 N` changes the per-thread register budget of the
//! executing warpgroup to N (24..=256, multiple of 8). ptxas honours it only when the kernel's
//! register count at entry is known: rustc cannot emit `.maxntid`, so `cargo xtask build-ptx`
//! adds launch bounds to the entries listed in `meta::KERNELS` (otherwise ptxas warns C7508).
//! Every warp of the warpgroup must execute it, in warpgroup-uniform control flow.

unsafe extern "C" {
    #[link_name = "llvm.nvvm.setmaxnreg.inc.sync.aligned.u32"]
    fn setmaxnreg_inc(n: u32);
    #[link_name = "llvm.nvvm.setmaxnreg.dec.sync.aligned.u32"]
    fn setmaxnreg_dec(n: u32);
}

/// Raises this warpgroup's register budget to `N` (blocks until the block's pool has them).
#[inline(always)]
pub fn increase_to<const N: u32>() {
    unsafe { setmaxnreg_inc(N) }
}

/// Lowers this warpgroup's register budget to `N`, returning registers to the block's pool.
#[inline(always)]
pub fn decrease_to<const N: u32>() {
    unsafe { setmaxnreg_dec(N) }
}
