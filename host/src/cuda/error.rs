//! Errors of the CUDA backend, and the 32-bit codes the kernels leave in a device's error word
//! when a bounded wait times out.
//!
//! Code layout (never 0, so 0 means "no error"):
//!
//! ```text
//! bit 31     1 (a code is present)
//! bits 28-30 the waiting device
//! bits 24-27 the waiting node: 1 barrier, 2 stage GEMM, 3 reduction, 4 end-of-run release wait
//! bits 16-23 its stage
//! bits 8-15  the device owning the awaited flag (0xFF: the barrier counter)
//! bits 0-7   the flag index (0xFF: the barrier counter)
//! ```
//!
//! A timed-out wait records its code in its own device's error word *and in every peer's*
//! (compare-and-swap from 0: each word keeps the first code it got), so the device named by a
//! word's code is the one whose wait expired, not necessarily the word's owner.

use std::time::Duration;

use thiserror::Error;

use crate::gemm::{GemmError, GemmLaunchError};
use crate::plan::PlanError;
use crate::runtime::RuntimeError;
use crate::schedule::{BufferKind, FlagRef};

/// The kind of node whose wait timed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitingNode {
    /// The start-of-run barrier (waits on the device's barrier counter).
    Barrier,
    /// A stage GEMM's prologue.
    Gemm,
    /// The single-stage reduce-scatter's reduction.
    Reduce,
    /// The end-of-run wait of an all-gather device for its peers' release flags.
    Release,
}

impl WaitingNode {
    /// The plan's node name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            WaitingNode::Barrier => "barrier",
            WaitingNode::Gemm => "gemm",
            WaitingNode::Reduce => "reduce",
            WaitingNode::Release => "release",
        }
    }
}

/// Where a wait timed out: the device, the node, its stage and the flag (none for the barrier
/// counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutSite {
    /// The device whose wait expired.
    pub device: usize,
    /// The waiting node.
    pub node: WaitingNode,
    /// Its stage.
    pub stage: usize,
    /// The flag it waited on (`None`: the barrier counter).
    pub flag: Option<FlagRef>,
}

const PRESENT: u32 = 1 << 31;
const COUNTER: u32 = 0xFF;

/// The error code of a wait at `site`. Stages, devices and flag indices above 254 cannot occur
/// (TP ≤ 8, flag indices < 2·TP) and are clamped; the waiting device is kept modulo 8.
#[must_use]
pub fn encode_timeout(site: TimeoutSite) -> u32 {
    let kind = match site.node {
        WaitingNode::Barrier => 1,
        WaitingNode::Gemm => 2,
        WaitingNode::Reduce => 3,
        WaitingNode::Release => 4,
    };
    let byte = |x: usize| u32::try_from(x.min(0xFE)).unwrap_or(0xFE);
    let (device, index) = site
        .flag
        .map_or((COUNTER, COUNTER), |f| (byte(f.device), byte(f.index)));
    let waiter = u32::try_from(site.device % 8).unwrap_or(0);
    PRESENT | waiter << 28 | kind << 24 | byte(site.stage) << 16 | device << 8 | index
}

/// Decodes a non-zero error word; `None` for 0 or a word no kernel writes.
#[must_use]
pub fn decode_timeout(code: u32) -> Option<TimeoutSite> {
    if code & PRESENT == 0 {
        return None;
    }
    let node = match (code >> 24) & 0xF {
        1 => WaitingNode::Barrier,
        2 => WaitingNode::Gemm,
        3 => WaitingNode::Reduce,
        4 => WaitingNode::Release,
        _ => return None,
    };
    let (device, index) = ((code >> 8) & 0xFF, code & 0xFF);
    let flag = (device != COUNTER).then_some(FlagRef {
        device: device as usize,
        index: index as usize,
    });
    Some(TimeoutSite {
        device: ((code >> 28) & 0x7) as usize,
        node,
        stage: ((code >> 16) & 0xFF) as usize,
        flag,
    })
}

/// Why a distributed GEMM could not be built or run.
#[derive(Debug, Error)]
pub enum DistGemmError {
    /// The builder was not given a required piece.
    #[error("distributed GEMM builder: {0} is required")]
    Missing(&'static str),
    /// An FP8 problem's tensor-wise scales missing or out of range, or scales given for a
    /// 16-bit problem.
    #[error("FP8 scales: {0}")]
    Fp8Scales(String),
    /// Fewer GPUs than the requested tensor-parallel degree.
    #[error("TP={tp} needs {tp} GPUs, but {given} were given")]
    TooFewDevices {
        /// The requested TP.
        tp: usize,
        /// GPUs given.
        given: usize,
    },
    /// Two ranks on one GPU without opting in.
    #[error(
        "ranks {first} and {second} both use GPU {ordinal}: give one GPU per rank (or opt in with \
         `ranks_may_share_gpus`, meant for single-GPU testing)"
    )]
    SharedGpu {
        /// The first rank.
        first: usize,
        /// The second rank.
        second: usize,
        /// The GPU.
        ordinal: usize,
    },
    /// The ranks of a per-rank group disagree, or one of them failed (the message names the
    /// rank and what differs).
    #[error("TP group: {0}")]
    Group(String),
    /// The caller's rendezvous failed (a rank that never joined, exited or stalled).
    #[error(transparent)]
    Rendezvous(#[from] crate::cuda::rank::RendezvousError),
    /// Arguments of a per-rank launch that cannot be used.
    #[error("rank {rank}: {reason}")]
    BadLaunch {
        /// The rank.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// The problem does not fit the schedule.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The tuning table `Auto` was to read is unusable ([`super::tuning`]).
    #[error(transparent)]
    Tuning(#[from] super::tuning::TuningError),
    /// A stage GEMM the kernel cannot run.
    #[error("device {device}, stage {stage}: {source}")]
    Gemm {
        /// The device.
        device: usize,
        /// The stage.
        stage: usize,
        /// Why.
        source: GemmError,
    },
    /// A user buffer that does not fit its role.
    #[error("device {device}, buffer {}: {reason}", buffer.name())]
    BadBuffer {
        /// The device.
        device: usize,
        /// The buffer.
        buffer: BufferKind,
        /// What is wrong.
        reason: String,
    },
    /// One argument set per device is needed.
    #[error("{given} argument sets given for {tp} devices")]
    ArgumentCount {
        /// Sets given.
        given: usize,
        /// Devices.
        tp: usize,
    },
    /// A device index out of range.
    #[error("device {device} does not exist (TP={tp})")]
    NoSuchDevice {
        /// The index.
        device: usize,
        /// The TP.
        tp: usize,
    },
    /// A bounded wait on a GPU expired: a peer never arrived or never signalled.
    #[error(
        "device {device} (GPU {ordinal}) timed out after {timeout:?} in {}: {}",
        site_node(*site),
        site_wait(*site)
    )]
    Timeout {
        /// The device (rank) whose wait expired.
        device: usize,
        /// Its GPU.
        ordinal: usize,
        /// Where.
        site: TimeoutSite,
        /// The bound.
        timeout: Duration,
    },
    /// An error word holding a code no kernel writes (memory corruption or a stale build).
    #[error("device {device}'s error word holds {code:#010x}, which no distgemm kernel writes")]
    UnknownErrorCode {
        /// The device.
        device: usize,
        /// The word.
        code: u32,
    },
    /// An earlier run failed; the barrier counters may be out of step.
    #[error(
        "this distributed GEMM is unusable after an earlier failure ({0}); drop it and build a \
         new one (on every rank)"
    )]
    Poisoned(String),
    /// A driver-level failure.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A bug: the plan and the lowering disagree.
    #[error("internal error in the CUDA lowering: {0}")]
    Internal(String),
}

fn site_node(site: TimeoutSite) -> String {
    match site.node {
        WaitingNode::Barrier => "the start-of-run barrier".to_string(),
        WaitingNode::Release => "the end-of-run release wait".to_string(),
        node => format!("the stage-{} {} node", site.stage, node.name()),
    }
}

fn site_wait(site: TimeoutSite) -> String {
    match site.flag {
        Some(f) if site.node == WaitingNode::Release => format!(
            "release flag {} of device {} was never set (a peer did not finish copying this \
             device's input shard)",
            f.index, f.device
        ),
        None => "not every peer arrived at its barrier counter (a peer did not launch this run, \
                 or is stuck in an earlier one)"
            .to_string(),
        Some(f) => format!(
            "flag {} of device {} was never set (the peer that signals it did not get there)",
            f.index, f.device
        ),
    }
}

impl From<GemmLaunchError> for DistGemmError {
    fn from(e: GemmLaunchError) -> Self {
        match e {
            GemmLaunchError::Runtime(r) => DistGemmError::Runtime(r),
            GemmLaunchError::Invalid(g) => DistGemmError::Gemm {
                device: usize::MAX,
                stage: usize::MAX,
                source: g,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_never_zero() {
        let sites = [
            TimeoutSite {
                device: 0,
                node: WaitingNode::Barrier,
                stage: 0,
                flag: None,
            },
            TimeoutSite {
                device: 7,
                node: WaitingNode::Gemm,
                stage: 3,
                flag: Some(FlagRef {
                    device: 7,
                    index: 3,
                }),
            },
            TimeoutSite {
                device: 2,
                node: WaitingNode::Reduce,
                stage: 1,
                flag: Some(FlagRef {
                    device: 0,
                    index: 5,
                }),
            },
            // Device 3's end-of-run wait for device 1's release of its shard (P = 8).
            TimeoutSite {
                device: 3,
                node: WaitingNode::Release,
                stage: 0,
                flag: Some(FlagRef {
                    device: 3,
                    index: 8 + 1,
                }),
            },
        ];
        for site in sites {
            let code = encode_timeout(site);
            assert_ne!(code, 0);
            assert_eq!(decode_timeout(code), Some(site));
        }
        assert_eq!(decode_timeout(0), None);
        assert_eq!(decode_timeout(0x8F00_0000), None);
    }

    #[test]
    fn timeout_message_names_device_stage_and_flag() {
        let e = DistGemmError::Timeout {
            device: 1,
            ordinal: 1,
            site: TimeoutSite {
                device: 1,
                node: WaitingNode::Gemm,
                stage: 1,
                flag: Some(FlagRef {
                    device: 1,
                    index: 1,
                }),
            },
            timeout: Duration::from_secs(2),
        };
        let msg = e.to_string();
        assert!(
            msg.contains("device 1") && msg.contains("stage-1 gemm"),
            "{msg}"
        );
        assert!(msg.contains("flag 1 of device 1"), "{msg}");
    }
}
