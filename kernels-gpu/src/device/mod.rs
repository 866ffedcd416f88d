//! The device layer: small, typed wrappers over the PTX instructions the kernels use.
//!
//! Every wrapper states the PTX semantics it relies on and, where the caller must uphold
//! something, a `# Safety` section and the PTX it lowers to. Two rules shape how they are
//! written:
//! - Instructions with `.aligned` semantics and no pointer operand (CTA/cluster barriers,
//!   `wgmma.fence/commit/wait`, `setmaxnreg`, `griddepcontrol`) go through NVVM intrinsics,
//!   which LLVM knows are `convergent`: a plain `asm!` block is not, and LLVM was seen
//!   duplicating one into both arms of a divergent branch, which deadlocks.
//! - Instructions that take shared-memory addresses (mbarrier, TMA, `stmatrix`, `mapa`,
//!   `wgmma.mma_async`) stay in `asm!` with 32-bit shared-window addresses. `asm!` is volatile
//!   and clobbers memory by default, which these need; none is marked `nomem`/`pure` unless it
//!   only reads a special register or does arithmetic.
pub mod cluster;
pub mod cp_async;
pub mod fence;
pub mod flags;
pub mod gdc;
pub mod grid;
pub mod index;
pub mod mbarrier;
pub mod regs;
pub mod smem;
pub mod stmatrix;
pub mod sync;
pub mod tma;
pub mod wgmma;
