//! Lowering a device's plan DAG to CUDA-graph node descriptions, as plain data.
//!
//! Every plan node becomes exactly one graph node, and every plan edge one graph edge, in the
//! plan's order, so node `i` of the graph *is* node `i` of the plan (what `distgemm plan
//! --format dot` shows):
//!
//! | plan node | graph node |
//! |---|---|
//! | `Barrier` | kernel `collective_barrier` (1 thread), [`BarrierParams`] |
//! | `PeerCopy` | memcpy node (this GPU's copy engine): pull, peer → own workspace; push, own workspace → peer's workspace (a remote write) |
//! | `FlagSet` | write-value node (`CU_STREAM_MEM_OP_WRITE_VALUE_32`: a fence, then the store), own stage flag, a peer's stage flag (after a push) or a peer's release flag |
//! | `Gemm` | kernel node of the GEMM stage kernel, [`GemmArgs`] + [`StageHook`] |
//! | `Reduce` | kernel `reduce_sum_{bf16,f16}`, [`ReduceParams`] |
//! | `AwaitRelease` | kernel `collective_wait_flags` (1 thread), [`WaitFlagsParams`] |
//!
//! `Full` edges become default edges and `Programmatic` edges programmatic ones (only between
//! kernel nodes, which the plan guarantees and [`lower_device`] checks).
//!
//! Addresses: element `e` of buffer `X` of device `q` is `addresses[q].X + e·size(X)`, with
//! `size(X)` = [`Plan::element_bytes`] (2 for bf16 and f16; in an FP8 plan 1 for A, B and an
//! all-gather workspace, the output type's 2 for C, D and partials); flag `i` of
//! device `q` is `addresses[q].exclusive + layout.flag_offset(i)`, its counter
//! `+ counter_offset` and its error word `+ error_offset`. Nothing here re-derives an index of
//! the schedule: views, regions and flags come from the plan as they are. Every waiting kernel
//! gets the device's own error word and every peer's ([`PeerErrorWords`](kernels_gpu::collective_abi::PeerErrorWords)): a timeout is
//! recorded in all of them, and its code names the waiting device (sticky poison, see
//! [`kernels_gpu::collective_abi`]).

use std::time::Duration;

use kernels_gpu::collective_abi::{BarrierParams, ReduceParams, WaitFlagsParams};
use kernels_gpu::gemm_abi::{RowScales, StageHook};

use super::error::DistGemmError;
use crate::gemm::GemmArgs;
use crate::plan::{DevicePlan, EdgeKind, Plan};
use crate::runtime::stream::DependencyKind;
use crate::schedule::{BufferKind, FlagRef};

/// The device addresses of one device's buffers (0 for an absent buffer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceAddresses {
    /// Shard of A.
    pub a: u64,
    /// Shard of B.
    pub b: u64,
    /// Shard of C (0 when the problem has none).
    pub c: u64,
    /// Shard of D.
    pub d: u64,
    /// Workspace.
    pub workspace: u64,
    /// Exclusive workspace (counter, error word, flags).
    pub exclusive: u64,
    /// Row-wise FP8: the scales of every row of the global A (M f32) on this device, or 0.
    pub a_scales: u64,
    /// Row-wise FP8: the scales of every row of the global B (N f32) on this device, or 0.
    pub b_scales: u64,
}

impl DeviceAddresses {
    /// Base address of `buffer`.
    #[must_use]
    pub fn of(&self, buffer: BufferKind) -> u64 {
        match buffer {
            BufferKind::A => self.a,
            BufferKind::B => self.b,
            BufferKind::C => self.c,
            BufferKind::D => self.d,
            BufferKind::Workspace => self.workspace,
        }
    }
}

/// Options of a lowering.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LowerOptions {
    /// Bound of every GPU spin-wait.
    pub timeout: Duration,
    /// An FP8 run's tensor-wise scales of A and B (`[sa, sb]`), which every stage GEMM folds
    /// into its alpha; required for an FP8 plan, refused for a 16-bit one.
    pub fp8_scales: Option<[f32; 2]>,
    /// Flags whose stores are left out (fault injection for tests: the nodes stay, a kernel
    /// skips the store, a flag-set node stores 0), so the waiter times out.
    pub missing_signals: Vec<FlagRef>,
    /// Parts of a run left out for timing (`DistGemm::set_timing_diagnostics`); all off for
    /// real runs.
    pub diagnostics: TimingDiagnostics,
}

/// Diagnostics for benchmarks: parts of a run left out, so that timing what is left splits
/// distgemm's time over the no-communication GEMMs into its causes. The graph keeps its nodes
/// and edges; D is wrong (and, without the rendezvous, a fast device may overwrite a slot its
/// peer still reads). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimingDiagnostics {
    /// Every peer copy moves at most this many bytes.
    pub copy_limit: Option<usize>,
    /// The start-of-run barrier neither arrives at its peers nor waits for them (it still
    /// resets the device's flags): the devices run uncoupled.
    pub no_rendezvous: bool,
    /// Stage GEMMs skip their flag waits.
    pub no_flag_waits: bool,
    /// Stage GEMMs whose C is a peer's partial (the pipelined reduce-scatter) read it from the
    /// same place in their own device's buffer instead: the epilogue's reads over NVLink left
    /// out, the flags kept.
    pub local_c: bool,
}

/// One graph node, fully resolved to addresses.
#[derive(Clone, Debug, PartialEq)]
pub enum LoweredNode {
    /// The barrier kernel.
    Barrier(BarrierParams),
    /// A stage GEMM: its operands (for `GemmKernel::prepare`) and its prologue hook.
    Gemm {
        /// The stage.
        stage: usize,
        /// The GEMM; for an FP8 plan in pair form
        /// ([`Fp8GemmArgs::as_pairs`](crate::gemm::Fp8GemmArgs::as_pairs): A and B as 16-bit
        /// pairs of e4m3, the tensor-wise scales folded into alpha).
        args: GemmArgs,
        /// `Some` for an FP8 stage (the e4m3 entry points), with its row-wise scales (zero
        /// for tensor-wise).
        fp8: Option<RowScales>,
        /// Flags to signal and wait on.
        hook: StageHook,
    },
    /// The reduction kernel.
    Reduce(ReduceParams),
    /// A flat copy.
    Copy {
        /// Destination address.
        dst: u64,
        /// Source address (possibly on a peer).
        src: u64,
        /// Bytes.
        bytes: usize,
    },
    /// A release store of a 4-byte value: a write-value node
    /// ([`crate::runtime::Graph::add_write_value_node`]), a fence then the store.
    FlagSet {
        /// The flag's address (own, or a peer's release flag).
        dst: u64,
        /// The value.
        value: u32,
    },
    /// The end-of-run wait kernel for the peers' release flags.
    WaitFlags(WaitFlagsParams),
}

impl LoweredNode {
    /// Whether the node is a kernel node.
    #[must_use]
    pub fn is_kernel(&self) -> bool {
        matches!(
            self,
            LoweredNode::Barrier(_)
                | LoweredNode::Gemm { .. }
                | LoweredNode::Reduce(_)
                | LoweredNode::WaitFlags(_)
        )
    }

    /// A short name of the node's kind, for errors and tests: `barrier`, `gemm`, `reduce`,
    /// `copy`, `flag`, `release`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            LoweredNode::Barrier(_) => "barrier",
            LoweredNode::Gemm { .. } => "gemm",
            LoweredNode::Reduce(_) => "reduce",
            LoweredNode::Copy { .. } => "copy",
            LoweredNode::FlagSet { .. } => "flag",
            LoweredNode::WaitFlags(_) => "release",
        }
    }
}

/// A dependency `nodes[from] → nodes[to]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoweredEdge {
    /// Upstream node.
    pub from: usize,
    /// Downstream node.
    pub to: usize,
    /// Default or programmatic.
    pub kind: DependencyKind,
}

/// A device's graph as data.
#[derive(Clone, Debug, PartialEq)]
pub struct LoweredGraph {
    /// The device.
    pub device: usize,
    /// Nodes, in the plan's order.
    pub nodes: Vec<LoweredNode>,
    /// Edges, in the plan's order.
    pub edges: Vec<LoweredEdge>,
}

mod nodes;
mod resolve;

use nodes::DeviceLowering;
use resolve::Resolver;
#[cfg(test)]
mod tests;

/// The plan's edges as graph edges (programmatic ones only between kernel nodes).
fn lower_edges(dev: &DevicePlan, nodes: &[LoweredNode]) -> Result<Vec<LoweredEdge>, DistGemmError> {
    dev.edges
        .iter()
        .map(|e| {
            let kind = match e.kind {
                EdgeKind::Full => DependencyKind::Default,
                EdgeKind::Programmatic | EdgeKind::ProgrammaticDeferred => {
                    DependencyKind::Programmatic
                }
            };
            let (Some(from), Some(to)) = (nodes.get(e.from), nodes.get(e.to)) else {
                return Err(DistGemmError::Internal(format!(
                    "edge {e:?} leaves the node list"
                )));
            };
            if kind == DependencyKind::Programmatic && !(from.is_kernel() && to.is_kernel()) {
                return Err(DistGemmError::Internal(format!(
                    "programmatic edge {e:?} does not join two kernel nodes"
                )));
            }
            Ok(LoweredEdge {
                from: e.from,
                to: e.to,
                kind,
            })
        })
        .collect()
}

/// Lowers device `device` of `plan`, with every device's buffer addresses.
pub fn lower_device(
    plan: &Plan,
    device: usize,
    addresses: &[DeviceAddresses],
    options: &LowerOptions,
) -> Result<LoweredGraph, DistGemmError> {
    let dev = plan
        .devices
        .get(device)
        .ok_or(DistGemmError::NoSuchDevice {
            device,
            tp: plan.tp,
        })?;
    let r = Resolver { plan, addresses };
    let lowering = DeviceLowering {
        error_word: r.error_word(device)?,
        peer_errors: r.peer_errors(device)?,
        r,
        dev,
        options,
        timeout_ns: u64::try_from(options.timeout.as_nanos()).unwrap_or(u64::MAX),
    };
    let nodes = dev
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| lowering.node(index, node))
        .collect::<Result<Vec<_>, _>>()?;
    let edges = lower_edges(dev, &nodes)?;
    Ok(LoweredGraph {
        device,
        nodes,
        edges,
    })
}
