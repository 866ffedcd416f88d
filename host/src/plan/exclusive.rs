//! The exclusive workspace of a device: the barrier counter, the error word, the P stage flags
//! and the P release flags (u32 each).
//!
//! Layout, extending CUTLASS's: the counter at byte 0 (32 bytes reserved), flag i at byte
//! `32 + 4·i`; total `32 + roundup(4·2P, 32)` bytes (64 B for P ≤ 4, 96 B for P ≤ 8).
//! - Flags `0..P` are the *stage flags* (flag t: the data stage t reads is ready).
//! - Flags `P..2P` are the *release flags* of all-gather schedules: flag `P + q` of device d is
//!   set by device q once it has finished copying d's input shard, and d's graph ends only when
//!   every copying peer has set its flag (`Node::AwaitRelease`). Reduce-scatter schedules leave
//!   them unused.
//!
//! distgemm adds an *error word* at byte 4 (inside the counter's reserved area): a GPU wait
//! that times out records a code there naming the device, node, stage and flag (`crate::cuda`
//! decodes it), and into every peer's error word too (the first code stays: sticky poison,
//! see `kernels_gpu::collective_abi`). The CPU executor reports timeouts as Rust errors and
//! does not use it. The workspace is zeroed once, before the first run of any device, and must
//! persist across runs: the counter is a running counter that peers update asynchronously,
//! and every run's barrier resets the device's flags (stage and release).

use serde::{Deserialize, Serialize};

/// Byte layout of the exclusive workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExclusiveLayout {
    /// Byte offset of the barrier counter (0).
    pub counter_offset: usize,
    /// Byte offset of the u32 error word (4).
    #[serde(default = "default_error_offset")]
    pub error_offset: usize,
    /// Byte offset of flag 0 (32).
    pub flags_offset: usize,
    /// Number of flags (2P: the stage flags, then the release flags).
    pub flag_count: usize,
    /// Index of the first release flag (P).
    pub release_base: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// The error word's offset (plans serialised before it existed get it too).
const fn default_error_offset() -> usize {
    4
}

impl ExclusiveLayout {
    /// Bytes reserved for the counter.
    const COUNTER_BYTES: usize = 32;

    /// The layout for `p` devices.
    #[must_use]
    pub fn new(p: usize) -> Self {
        let flag_count = 2 * p;
        let flag_bytes = (4 * flag_count).div_ceil(Self::COUNTER_BYTES) * Self::COUNTER_BYTES;
        ExclusiveLayout {
            counter_offset: 0,
            error_offset: default_error_offset(),
            flags_offset: Self::COUNTER_BYTES,
            flag_count,
            release_base: p,
            bytes: Self::COUNTER_BYTES + flag_bytes,
        }
    }

    /// Byte offset of flag `index` (a stage or a release flag).
    #[must_use]
    pub fn flag_offset(&self, index: usize) -> usize {
        self.flags_offset + 4 * index
    }

    /// Index of the release flag that device `peer` sets on a device whose input shard it
    /// has finished copying.
    #[must_use]
    pub fn release_flag(&self, peer: usize) -> usize {
        self.release_base + peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_then_release_flags_after_the_counter() {
        for p in 1..=4 {
            assert_eq!(ExclusiveLayout::new(p).bytes, 64);
        }
        for p in 5..=8 {
            assert_eq!(ExclusiveLayout::new(p).bytes, 96);
        }
        let layout = ExclusiveLayout::new(4);
        assert_eq!(layout.flag_offset(3), 44);
        // Release flag of peer 2 follows the 4 stage flags.
        assert_eq!(layout.release_flag(2), 6);
        assert_eq!(layout.flag_offset(layout.release_flag(2)), 56);
        assert_eq!(layout.flag_offset(layout.flag_count), layout.bytes);
        let layout = ExclusiveLayout::new(8);
        assert!(layout.flag_offset(layout.flag_count - 1) + 4 <= layout.bytes);
        assert!(layout.error_offset + 4 <= layout.flags_offset);
        assert_ne!(layout.error_offset, layout.counter_offset);
    }
}
