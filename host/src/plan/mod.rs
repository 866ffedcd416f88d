//! Plans: per-device DAGs of typed nodes, built once from a schedule and consumed unchanged by
//! the CPU executor and the CUDA-graph lowering.
//!
//! Device d's DAG (P = TP):
//!
//! ```text
//! pipelined all-gather:   Barrier ─full→ Copy1 → Flag1 → Copy2 → Flag2 … Copy(P−1) → Flag(P−1)
//!                            └─pdl*→ Gemm0 ─pdl→ Gemm1 ─pdl→ … Gemm(P−1)  (Gemm t>0 waits flag t)
//!                            (pdl*: Gemm0 waits for the barrier at its end, see
//!                            `EdgeKind::ProgrammaticDeferred`)
//! pipelined reduce-scatter: Barrier ─pdl→ Gemm0 ─pdl→ … Gemm(P−1)
//!                            (Gemm t>0 signals right's flag t, then waits own flag t)
//! single-stage all-gather:  Barrier ─full→ Copy(d) → Copy(d+1) … → Copy(d−1) ─full→ Gemm
//! single-stage reduce-scatter: Barrier ─pdl→ Gemm ─pdl→ Reduce
//!                            (Reduce signals flag d of every peer, then waits own flags q ≠ d)
//! ```
//!
//! Nodes are listed in a topological order. There are no cross-device edges: data readiness
//! between devices is carried by the stage flags of the exclusive workspace.
//!
//! **Memory ordering** (what both executors implement): a flag store is a *release* (on the GPU
//! `st.release.sys` / `red.release.sys`, or a fence before the memset), a flag poll an
//! *acquire* (`ld.acquire.sys`); the barrier's arrivals are release RMWs and its poll an
//! acquire load, and its flag reset is ordered before its arrival. Hence a GEMM that observes
//! flag t set also observes the copy (all-gather) or the left neighbour's partial
//! (reduce-scatter) that was complete before the flag was stored; and it cannot see the flag
//! still set by the previous run, since it runs after a stage whose completion implies the
//! barrier's (and with it the flag reset). Across runs, nobody writes
//! into a buffer a peer may still read until that peer has arrived at the next barrier, i.e.
//! finished the previous run.

mod exclusive;
mod node;
mod render;
mod shard;
mod validate;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use exclusive::ExclusiveLayout;
pub use node::{
    BarrierNode, Edge, EdgeKind, FLAG_SET_VALUE, FlagSetNode, KERNEL_SIGNAL_VALUE, Node,
    PeerCopyNode,
};
pub use shard::{DeviceInputs, GlobalInputs, SizeError, random_normal};

use crate::problem::Problem;
use crate::schedule::{
    BufferKind, Collective, DeviceProgram, FlagRef, ScheduleError, ScheduleKind, ShardLayout,
    WorkspaceLayout, can_implement, device_program,
};

/// Why no plan was built.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum PlanError {
    /// The schedule cannot run the problem (a user error).
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A view or region escaped its buffer, is misaligned or does not match its node (a bug in
    /// the schedule for [`Plan::build`], an edited plan for [`Plan::from_json`]).
    #[error("invalid plan: device {device}, {node} node: {what}")]
    InvalidView {
        /// The device.
        device: usize,
        /// The node name.
        node: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The plan's devices, layouts or DAG disagree with its schedule, problem or TP (an edited
    /// plan; see [`Plan::validate`]).
    #[error("invalid plan: {0}")]
    Inconsistent(String),
}

/// Why a JSON plan was not accepted.
#[derive(Debug, Error)]
pub enum PlanFromJsonError {
    /// Not a plan.
    #[error("not a distgemm plan: {0}")]
    Json(#[from] serde_json::Error),
    /// A plan that [`Plan::validate`] refuses.
    #[error(transparent)]
    Invalid(#[from] PlanError),
}

/// The plan of one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicePlan {
    /// The device index.
    pub device: usize,
    /// Which blocks of the global A, B, C, D the device holds (packed shards).
    pub shards: ShardLayout,
    /// Workspace slots.
    pub workspace: WorkspaceLayout,
    /// Workspace size in bytes.
    pub workspace_bytes: usize,
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    /// Dependencies between the nodes.
    pub edges: Vec<Edge>,
}

impl DevicePlan {
    /// Elements of one of the device's buffers (0 for an absent C).
    #[must_use]
    pub fn buffer_elements(&self, buffer: BufferKind) -> usize {
        match buffer {
            BufferKind::A => self.shards.a.elements(),
            BufferKind::B => self.shards.b.elements(),
            BufferKind::C => self.shards.c.map_or(0, |c| c.elements()),
            BufferKind::D => self.shards.d.elements(),
            BufferKind::Workspace => self.workspace.elements(),
        }
    }

    /// The predecessors of node `index`, with the edge kinds.
    pub fn predecessors(&self, index: usize) -> impl Iterator<Item = (usize, EdgeKind)> + '_ {
        self.edges
            .iter()
            .filter(move |e| e.to == index)
            .map(|e| (e.from, e.kind))
    }

    /// The stage GEMM nodes, in stage order.
    pub fn gemms(&self) -> impl Iterator<Item = &crate::schedule::GemmStage> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Gemm(g) => Some(g),
            _ => None,
        })
    }
}

/// A complete plan: one DAG per device plus the shared layouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The schedule.
    pub schedule: ScheduleKind,
    /// The global problem.
    pub problem: Problem,
    /// Number of devices.
    pub tp: usize,
    /// Exclusive workspace layout (same on every device).
    pub exclusive: ExclusiveLayout,
    /// Per-device plans, index = device.
    pub devices: Vec<DevicePlan>,
}

impl Plan {
    /// Builds the plan of `schedule` for `problem` on `tp` devices.
    pub fn build(schedule: ScheduleKind, problem: Problem, tp: usize) -> Result<Plan, PlanError> {
        can_implement(schedule, &problem, tp)?;
        let devices = (0..tp)
            .map(|d| {
                wire(
                    schedule,
                    &problem,
                    tp,
                    device_program(schedule, &problem, tp, d),
                )
            })
            .collect();
        let plan = Plan {
            schedule,
            problem,
            tp,
            exclusive: ExclusiveLayout::new(tp),
            devices,
        };
        plan.validate()?;
        Ok(plan)
    }

    /// Reads a plan written by [`Plan::to_json`] and validates it ([`Plan::validate`]): an
    /// edited plan is refused with an error, never run.
    pub fn from_json(json: &str) -> Result<Plan, PlanFromJsonError> {
        let plan: Plan = serde_json::from_str(json)?;
        plan.validate()?;
        Ok(plan)
    }

    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

/// Turns a device program into nodes and edges (see the module documentation for the shapes).
fn wire(kind: ScheduleKind, problem: &Problem, tp: usize, program: DeviceProgram) -> DevicePlan {
    let d = program.device;
    let mut nodes = vec![Node::Barrier(BarrierNode {
        reset_flags: (0..tp).map(|index| FlagRef { device: d, index }).collect(),
        arrive_at: (0..tp).filter(|&q| q != d).collect(),
        arrivals: u32::try_from(tp - 1).unwrap_or(u32::MAX),
    })];
    let mut edges = Vec::new();
    let mut push = |nodes: &mut Vec<Node>, node: Node, from: usize, kind: EdgeKind| {
        nodes.push(node);
        edges.push(Edge {
            from,
            to: nodes.len() - 1,
            kind,
        });
        nodes.len() - 1
    };

    // The copy chain hangs off the barrier with full edges.
    let mut copy_tail = 0;
    for copy in &program.copies {
        let bytes = copy.src.len * problem.dtype.size_bytes();
        let node = Node::PeerCopy(PeerCopyNode {
            stage: copy.stage,
            src: copy.src,
            dst: copy.dst,
            bytes,
        });
        copy_tail = push(&mut nodes, node, copy_tail, EdgeKind::Full);
        if let Some(flag) = copy.sets_flag {
            let node = Node::FlagSet(FlagSetNode {
                stage: copy.stage,
                flag,
                value: FLAG_SET_VALUE,
            });
            copy_tail = push(&mut nodes, node, copy_tail, EdgeKind::Full);
        }
    }

    // The kernel chain: PDL edges, except that a single-stage all-gather's GEMM needs the
    // whole gathered operand, so it follows the copy chain with a full edge, and that a
    // pipelined all-gather's first stage (local A, B and D, no flags: nothing the barrier
    // guards) waits for the barrier only at its end, so a late peer delays only the copies.
    let all_gather = kind.collective() == Collective::AllGather;
    let (mut tail, mut edge) = match (all_gather, kind.is_pipelined()) {
        (true, false) => (copy_tail, EdgeKind::Full),
        (true, true) => (0, EdgeKind::ProgrammaticDeferred),
        (false, _) => (0, EdgeKind::Programmatic),
    };
    for gemm in program.gemms {
        tail = push(&mut nodes, Node::Gemm(gemm), tail, edge);
        edge = EdgeKind::Programmatic;
    }
    if let Some(reduce) = program.reduce {
        push(
            &mut nodes,
            Node::Reduce(reduce),
            tail,
            EdgeKind::Programmatic,
        );
    }

    DevicePlan {
        device: d,
        shards: program.shards,
        workspace: program.workspace,
        workspace_bytes: program.workspace.elements() * problem.dtype.size_bytes(),
        nodes,
        edges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_topologically_ordered_and_views_valid() {
        let problem = Problem::new(48, 48, 48).with_scalars(1.0, 0.5);
        for kind in ScheduleKind::ALL {
            let problem = if kind.collective() == Collective::ReduceScatter {
                problem.with_scalars(1.0, 0.0)
            } else {
                problem
            };
            let plan = Plan::build(kind, problem, 3).unwrap_or_else(|e| panic!("{kind}: {e}"));
            for dev in &plan.devices {
                assert!(dev.edges.iter().all(|e| e.from < e.to), "{kind}");
                // Every node but the barrier has a predecessor.
                for i in 1..dev.nodes.len() {
                    assert!(dev.predecessors(i).next().is_some(), "{kind} node {i}");
                }
            }
        }
    }

    #[test]
    fn pipelined_workspace_is_p_minus_one_slices() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            4,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ws = plan.devices[0].workspace;
        assert_eq!((ws.slots, ws.slot_elements), (3, 16 * 64));
        assert_eq!(plan.devices[0].workspace_bytes, 3 * 16 * 64 * 2);
    }
}
