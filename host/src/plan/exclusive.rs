//! The exclusive workspace of a device: the barrier counter and the P stage flags (u32 each).
//!
//! Layout, as CUTLASS's: the counter at byte 0 (32 bytes reserved), flag t at byte `32 + 4·t`;
//! total `32 + roundup(4·P, 32)` bytes (64 B for P ≤ 8). distgemm adds an *error word* at
//! byte 4 (inside the counter's reserved area): a GPU wait that times out stores a code there
//! naming the node, stage and flag (`crate::cuda` decodes it). The CPU executor reports
//! timeouts as Rust errors and does not use it. It is zeroed once, before the first
//! run of any device, and must persist across runs: the counter is a running counter that
//! peers update asynchronously, and the flags are reset by every run's barrier.

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
    /// Number of stage flags (P).
    pub flag_count: usize,
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
        let flag_bytes = (4 * p).div_ceil(Self::COUNTER_BYTES) * Self::COUNTER_BYTES;
        ExclusiveLayout {
            counter_offset: 0,
            error_offset: default_error_offset(),
            flags_offset: Self::COUNTER_BYTES,
            flag_count: p,
            bytes: Self::COUNTER_BYTES + flag_bytes,
        }
    }

    /// Byte offset of flag `index`.
    #[must_use]
    pub fn flag_offset(&self, index: usize) -> usize {
        self.flags_offset + 4 * index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixty_four_bytes_up_to_eight_devices() {
        for p in 1..=8 {
            assert_eq!(ExclusiveLayout::new(p).bytes, 64);
        }
        assert_eq!(ExclusiveLayout::new(4).flag_offset(3), 44);
        let layout = ExclusiveLayout::new(2);
        assert!(layout.error_offset + 4 <= layout.flags_offset);
        assert_ne!(layout.error_offset, layout.counter_offset);
    }
}
