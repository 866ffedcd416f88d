//! The contract between the host and the GEMM stage kernel: tile configuration, shared-memory
//! budget and the by-value kernel parameter block. Compiled for both sides so they cannot drift.
//!
//! Problem: `D (M×N) = alpha · A · Bᵀ + beta · C`, with A M×K and B N×K both K-contiguous
//! ("TN"), C and D M×N row-major with leading dimensions `ldc`/`ldd` (elements). A and B are
//! read through TMA tensor maps the host builds over the operand views (any base pointer and
//! leading dimension, so a stage can read a sub-block of a shard or a workspace slot in place).

/// Output tile rows per block (two consumer warpgroups × 64 rows).
pub const BLOCK_M: u32 = 128;
/// Output tile columns per block (one `m64n256k16` per k16 step per consumer).
pub const BLOCK_N: u32 = 256;
/// K elements per pipeline stage: one 128-byte swizzle row of 2-byte elements.
pub const BLOCK_K: u32 = 64;
/// Pipeline depth: shared-memory slots of (A tile, B tile).
pub const STAGES: u32 = 4;
/// Threads per block: one producer warpgroup + two consumer warpgroups.
pub const THREADS: u32 = 384;
/// Bytes of one stage's A tile (BLOCK_M × BLOCK_K × 2).
pub const A_TILE_BYTES: u32 = BLOCK_M * BLOCK_K * 2;
/// Bytes of one stage's B tile (BLOCK_N × BLOCK_K × 2).
pub const B_TILE_BYTES: u32 = BLOCK_N * BLOCK_K * 2;
/// Bytes TMA delivers per stage; the producer announces them with `expect_tx`.
pub const STAGE_BYTES: u32 = A_TILE_BYTES + B_TILE_BYTES;
/// Offset of the mbarriers (full[STAGES], then empty[STAGES]) after the operand tiles.
pub const BARRIER_OFFSET: u32 = STAGES * STAGE_BYTES;
/// Offset of a 4-byte shared word telling every thread the prologue hook timed out.
pub const ABORT_FLAG_OFFSET: u32 = BARRIER_OFFSET + 2 * STAGES * 8;
/// Dynamic shared memory the kernel needs (must be ≤ 227 KiB, the opt-in limit on H100/H200).
pub const SMEM_BYTES: u32 = ABORT_FLAG_OFFSET + 16;
/// m-tiles per raster band (see [`crate::layout::raster`]).
pub const RASTER_GROUP_M: u32 = 8;
/// Box of the A tensor map: `{BLOCK_K columns, BLOCK_M rows}`, 128-byte swizzle.
pub const A_BOX: (u32, u32) = (BLOCK_K, BLOCK_M);
/// Box of the B tensor map: `{BLOCK_K columns, BLOCK_N rows}`, 128-byte swizzle.
pub const B_BOX: (u32, u32) = (BLOCK_K, BLOCK_N);

/// The distributed prologue hook: what a stage kernel does before its main loop, beyond the
/// PDL `griddepcontrol.wait` it always executes. All-zero means "nothing", and costs one
/// predictable branch.
///
/// Order (thread 0 of each block): if `signal_flag != 0` and this is block 0, release-store
/// `signal_value` to it at system scope (after a system-scope fence, so everything the previous
/// stage wrote is visible to whoever acquires the flag); then if `wait_flag != 0`, spin with
/// system-scope acquire loads until `*wait_flag >= wait_value`. If that takes longer than
/// `timeout_ns`, store `error_code` to `*error_word` and make the whole grid return without
/// touching D (the host turns the code into an error naming device, stage and flag).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageHook {
    /// Device address of the flag to signal (possibly on a peer GPU), or 0.
    pub signal_flag: u64,
    /// Device address of the flag to wait on, or 0.
    pub wait_flag: u64,
    /// Device address of the word a timeout is reported in (required when `wait_flag != 0`).
    pub error_word: u64,
    /// Spin-wait bound in nanoseconds.
    pub timeout_ns: u64,
    /// Value stored to `signal_flag`.
    pub signal_value: u32,
    /// The wait ends once `*wait_flag >= wait_value`.
    pub wait_value: u32,
    /// Value stored to `*error_word` on timeout.
    pub error_code: u32,
    pub reserved: u32,
}

/// The GEMM kernels' single by-value parameter.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GemmParams {
    /// Device address of the A tensor map (M rows × K cols, box [`A_BOX`]).
    pub map_a: u64,
    /// Device address of the B tensor map (N rows × K cols, box [`B_BOX`]).
    pub map_b: u64,
    /// D base pointer (M×N row-major, leading dimension `ldd`).
    pub d: u64,
    /// C base pointer (M×N row-major, leading dimension `ldc`), or 0 when `beta == 0`. May be a
    /// peer GPU's memory.
    pub c: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ldd: u32,
    pub ldc: u32,
    pub alpha: f32,
    pub beta: f32,
    pub reserved: u32,
    pub hook: StageHook,
}

// The configuration must fit the Hopper opt-in shared-memory limit (227 KiB), and every
// swizzled tile must start on a 1024-byte boundary (wgmma descriptors with base offset 0).
const _: () = assert!(SMEM_BYTES <= 232_448);
const _: () = assert!(A_TILE_BYTES.is_multiple_of(1024) && B_TILE_BYTES.is_multiple_of(1024));
const _: () = assert!(BARRIER_OFFSET.is_multiple_of(8));

/// Number of output tiles of an `m × n` problem.
pub const fn tile_count(m: u32, n: u32) -> u32 {
    m.div_ceil(BLOCK_M) * n.div_ceil(BLOCK_N)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_block_layout_is_stable() {
        // The host passes the struct's bytes; the PTX declares a .param of this size.
        assert_eq!(core::mem::size_of::<StageHook>(), 48);
        assert_eq!(core::mem::size_of::<GemmParams>(), 32 + 32 + 48);
        assert_eq!(core::mem::align_of::<GemmParams>(), 8);
    }
}
