//! Where the ring's stages, barriers and staging buffers sit in a block's shared memory:
//!
//! ```text
//! A tiles [stages] | B tiles [stages] | staging buffers (staged tiles) |
//! full[stages] empty[stages] c_loaded[4] (order[2], ping-pong) | abort word, split words |
//! row-wise FP8 scales (staged tiles)
//! ```
//!
//! Offsets come from [`TileConfig`] (`barrier_offset`, `staging_offset`, …), which the host
//! also uses to size the launch's dynamic shared memory.
use crate::device::mbarrier::MBarrier;
use crate::gemm_abi::*;

/// Shared-memory addresses of the ring.
#[derive(Clone, Copy)]
pub(super) struct Ring {
    /// The dynamic shared memory's address in the shared window (1024-byte aligned).
    pub(super) base: u32,
    /// The configuration whose layout this is.
    pub(super) tile: TileConfig,
}

impl Ring {
    /// Slot `stage`'s A tile: `a_rows` rows of 64 elements, 128-byte swizzled.
    #[inline(always)]
    pub(super) fn a_tile(self, stage: u32) -> u32 {
        self.base + stage * self.tile.a_tile_bytes()
    }
    /// Slot `stage`'s B tile: `block_n` rows of 64 elements, 128-byte swizzled.
    #[inline(always)]
    pub(super) fn b_tile(self, stage: u32) -> u32 {
        self.base + self.tile.stages * self.tile.a_tile_bytes() + stage * self.tile.b_tile_bytes()
    }
    /// Completes when slot `stage` holds its k-block(s): the producer's arrival and the TMA
    /// bytes it announced.
    #[inline(always)]
    pub(super) fn full(self, stage: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * stage)
    }
    /// Completes when every consumer warp (of every block in the cluster) has released slot
    /// `stage`.
    #[inline(always)]
    pub(super) fn empty(self, stage: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * (self.tile.stages + stage))
    }
    /// The mbarrier on which loads of C into staging buffer `buffer` of warpgroup `half` complete.
    #[inline(always)]
    pub(super) fn c_loaded(self, half: u32, buffer: u32) -> MBarrier {
        MBarrier(
            self.base + self.tile.barrier_offset() + 8 * (2 * self.tile.stages + 2 * half + buffer),
        )
    }
    /// Staging buffer `buffer` (0 or 1) of consumer warpgroup `half`.
    #[inline(always)]
    pub(super) fn staging(self, half: u32, buffer: u32) -> u32 {
        self.base + self.tile.staging_offset() + (2 * half + buffer) * CHUNK_BYTES
    }
    #[inline(always)]
    pub(super) fn abort_flag(self) -> u32 {
        self.base + self.tile.abort_flag_offset()
    }
    /// Ping-pong: the barrier consumer warpgroup `half` waits on before each main loop but its
    /// first tile's (warpgroup 0's), completed once per main loop of the other warpgroup.
    #[inline(always)]
    pub(super) fn order(self, half: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * (2 * self.tile.stages + 4 + half))
    }
    /// Row-wise FP8: consumer warpgroup `half`'s scale area, `sb` of its share's `wg_cols`
    /// columns, then `sa` of its `wg_rows` rows ([`TileConfig::row_scales_offset`]).
    #[inline(always)]
    pub(super) fn row_scales(self, half: u32) -> u32 {
        self.base + self.tile.row_scales_offset() + half * self.tile.row_scale_bytes()
    }
    /// Split-K: the word (after the abort word) through which consumer warpgroup `half`'s
    /// leader tells the warpgroup whether it completes the tile.
    #[inline(always)]
    pub(super) fn split_word(self, half: u32) -> u32 {
        self.abort_flag() + 4 + 4 * half
    }
}
