//! The node and edge types of a per-device plan DAG.

use serde::{Deserialize, Serialize};

use crate::schedule::{CopyDirection, FlagRef, GemmStage, ReduceStep, Region};

/// The value a kernel stores into a peer's stage flag (any non-zero value means "set").
pub const KERNEL_SIGNAL_VALUE: u32 = 1;

/// The value a [`FlagSetNode`] stores (CUTLASS's 4-byte memset of 0xFF).
pub const FLAG_SET_VALUE: u32 = 0xFFFF_FFFF;

/// The all-device rendezvous at the start of every run (a 1-thread kernel on the GPU):
/// 1. store 0 into every flag of `reset_flags` (the device's own stage and release flags);
/// 2. atomically add 1 (release) to the barrier counter of every device in `arrive_at`;
/// 3. spin (acquire loads, bounded) until the own counter is ≥ `arrivals`;
/// 4. atomically subtract `arrivals` from the own counter.
///
/// The counter is a running counter: a fast peer may already have arrived for the next run,
/// and step 4 keeps that arrival instead of zeroing it. Because every device resets its flags
/// before it arrives, and every peer signals those flags only after it has passed the barrier,
/// no signal of this run can be wiped by the reset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierNode {
    /// The own flags to reset (all 2P: stage and release flags).
    pub reset_flags: Vec<FlagRef>,
    /// The devices whose counter receives an arrival (all but the own device).
    pub arrive_at: Vec<usize>,
    /// Arrivals to wait for (P − 1).
    pub arrivals: u32,
}

/// A flat copy of `bytes` bytes: a copy-engine memcpy of this device's GPU, `copy_from_slice`
/// on the CPU. A *pull* copies a peer's buffer (or an own input shard) into the own
/// workspace; a *push* copies the own workspace into a peer's workspace (a remote write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCopyNode {
    /// The stage whose GEMM reads the copied data (on the destination's device).
    pub stage: usize,
    /// Source region.
    pub src: Region,
    /// Destination region (same length).
    pub dst: Region,
    /// `len · element size`.
    pub bytes: usize,
    /// Pull (into the own workspace) or push (into a peer's); absent in older plans: pull.
    #[serde(default)]
    pub direction: CopyDirection,
}

/// Stores `value` into a flag with release semantics, after the copy before it in the DAG:
/// - into an own *stage* flag: the copied data is ready for the stage that waits on the flag;
/// - into a peer's *stage* flag, after a push: the pushed partial is ready for the peer's
///   stage that waits on the flag;
/// - into a peer's *release* flag ([`crate::plan::ExclusiveLayout::release_flag`]): this
///   device has finished reading the peer's input shard.
///
/// On the GPU it is a write-value node (`CU_STREAM_MEM_OP_WRITE_VALUE_32`, default flags),
/// which the driver documents as a memory fence "similar to `__threadfence_system()`" before a
/// 32-bit write, run by the GPU's front end without an SM. The CPU executor does exactly that:
/// a sequentially consistent fence, then a relaxed store. Either way, whoever acquires the
/// value sees everything ordered before the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagSetNode {
    /// The stage whose copy the flag follows (and, for a stage flag, whose GEMM waits on it).
    pub stage: usize,
    /// The flag.
    pub flag: FlagRef,
    /// The value stored ([`FLAG_SET_VALUE`]).
    pub value: u32,
}

/// The end of an all-gather device's run: wait (acquire, bounded) until every flag of `flags`
/// is non-zero. They are the device's release flags of the peers that copy its input shards,
/// so when the device's DAG has finished, no peer reads its shards any more. A 1-thread kernel
/// on the GPU (`collective_wait_flags`), after the device's last kernel on a full edge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitReleaseNode {
    /// The own release flags to wait for (one per peer that copies this device's shards).
    pub flags: Vec<FlagRef>,
}

/// A node of a device's DAG.
///
/// Kernel nodes ([`Node::Gemm`], [`Node::Reduce`]) run this prologue before touching memory:
/// wait for their predecessors (`griddepcontrol.wait` on the GPU), then store
/// [`KERNEL_SIGNAL_VALUE`] (release) into every flag they signal, then wait (acquire, bounded)
/// until every flag they wait on is non-zero. Signal-before-wait matters: the reduce-scatter
/// ring would deadlock the other way round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "node", rename_all = "snake_case")]
pub enum Node {
    /// The start-of-run rendezvous.
    Barrier(BarrierNode),
    /// A copy from a peer into the workspace, or from the workspace into a peer's.
    PeerCopy(PeerCopyNode),
    /// A flag store after a copy (an own stage flag, a peer's stage flag after a push, or a
    /// peer's release flag).
    FlagSet(FlagSetNode),
    /// A stage GEMM (views, epilogue, flags).
    Gemm(GemmStage),
    /// The single-stage reduce-scatter's reduction.
    Reduce(ReduceStep),
    /// The end-of-run wait for the peers' release of the own input shards (all-gather).
    AwaitRelease(AwaitReleaseNode),
}

impl Node {
    /// The stage the node belongs to (the barrier and the release wait: 0).
    #[must_use]
    pub fn stage(&self) -> usize {
        match self {
            Node::Barrier(_) | Node::AwaitRelease(_) => 0,
            Node::PeerCopy(c) => c.stage,
            Node::FlagSet(f) => f.stage,
            Node::Gemm(g) => g.stage,
            Node::Reduce(r) => r.stage,
        }
    }

    /// Flags this node stores into: a flag set's flag, a kernel's signals.
    #[must_use]
    pub fn flags_set(&self) -> Vec<FlagRef> {
        match self {
            Node::FlagSet(f) => vec![f.flag],
            Node::Gemm(g) => g.signals.into_iter().collect(),
            Node::Reduce(r) => r.signals.clone(),
            Node::Barrier(_) | Node::PeerCopy(_) | Node::AwaitRelease(_) => Vec::new(),
        }
    }

    /// Flags this node waits on.
    #[must_use]
    pub fn flags_awaited(&self) -> Vec<FlagRef> {
        match self {
            Node::Gemm(g) => g.waits.into_iter().collect(),
            Node::Reduce(r) => r.waits.clone(),
            Node::AwaitRelease(w) => w.flags.clone(),
            Node::Barrier(_) | Node::PeerCopy(_) | Node::FlagSet(_) => Vec::new(),
        }
    }

    /// A short name: `barrier`, `copy`, `flag`, `gemm`, `reduce`, `release`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Node::Barrier(_) => "barrier",
            Node::PeerCopy(_) => "copy",
            Node::FlagSet(_) => "flag",
            Node::Gemm(_) => "gemm",
            Node::Reduce(_) => "reduce",
            Node::AwaitRelease(_) => "release",
        }
    }
}

/// How a node depends on its predecessor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeKind {
    /// The successor starts after the predecessor has completed (a default graph edge).
    Full,
    /// Programmatic dependent launch: the successor may be launched early, and its prologue's
    /// `griddepcontrol.wait` blocks until the predecessor has completed and flushed. Since every
    /// kernel of a plan waits before touching memory, the CPU executor treats it like `Full`.
    Programmatic,
    /// Programmatic dependent launch whose successor waits for the predecessor only at its
    /// end: it reads, writes, signals and awaits nothing the predecessor guards (the first
    /// stage of a pipelined all-gather after the start-of-run barrier), so it computes while
    /// the predecessor runs, and its completion still implies the predecessor's. The CPU
    /// executor treats it like `Full`.
    ProgrammaticDeferred,
}

impl EdgeKind {
    /// Whether the edge is a programmatic (PDL) graph edge.
    #[must_use]
    pub fn is_programmatic(self) -> bool {
        matches!(
            self,
            EdgeKind::Programmatic | EdgeKind::ProgrammaticDeferred
        )
    }
}

/// `nodes[from] → nodes[to]`, both indices into the same device's node list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Edge {
    /// Predecessor node index.
    pub from: usize,
    /// Successor node index.
    pub to: usize,
    /// Dependency type.
    pub kind: EdgeKind,
}
