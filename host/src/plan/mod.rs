//! Plans: per-device DAGs of typed nodes, built once from a schedule and consumed unchanged by
//! the CPU executor and the CUDA-graph lowering.
//!
//! Device d's DAG (P = TP):
//!
//! ```text
//! pipelined all-gather:   Barrier ─full→ Copy1 → Flag1 → Rel1 → … Copy(P−1) → Flag(P−1) → Rel(P−1) ─┐
//!                            └─pdl*→ Gemm0 ─pdl→ Gemm1 ─pdl→ … Gemm(P−1) ─full→ AwaitRelease ←─┘
//!                            (Gemm t>0 waits flag t; pdl*: Gemm0 waits for the barrier at its
//!                            end, see `EdgeKind::ProgrammaticDeferred`)
//! pipelined reduce-scatter: Barrier ─pdl→ Gemm0 ─pdl→ … Gemm(P−1)
//!                            (Gemm t>0 signals right's flag t, then waits own flag t)
//! single-stage all-gather:  Barrier ─full→ Copy(d) → Copy(d+1) → Rel … → Copy(d−1) → Rel ─full→ Gemm
//!                            ─full→ AwaitRelease
//! single-stage reduce-scatter: Barrier ─pdl→ Gemm ─pdl→ Reduce
//!                            (Reduce signals flag d of every peer, then waits own flags q ≠ d)
//! ```
//!
//! `Rel` after a copy from peer q's input shard sets q's release flag of this device
//! ([`ExclusiveLayout::release_flag`]); `AwaitRelease` waits until every peer that copies this
//! device's shards has set its release flag here.
//!
//! Nodes are listed in a topological order. There are no cross-device edges: data readiness
//! between devices is carried by the stage flags of the exclusive workspace, and the end of
//! peers' reads of a device's input shards by its release flags.
//!
//! **Memory ordering** (what both executors implement): a kernel's flag store is a *release*
//! (on the GPU `fence.acq_rel.sys` then `st.release.sys`); a flag-set node after a copy is a
//! system-wide fence followed by a 32-bit store (a write-value node, whose default the driver
//! documents as a fence "similar to `__threadfence_system()`" before the write; on the CPU a
//! `SeqCst` fence then a relaxed store), which is a release too; a flag poll is an *acquire*
//! (`ld.acquire.sys`); the barrier's arrivals are release RMWs and its poll an acquire load,
//! and its flag reset is ordered before its arrival. Hence a GEMM that observes
//! flag t set also observes the copy (all-gather) or the left neighbour's partial
//! (reduce-scatter) that was complete before the flag was stored; and it cannot see the flag
//! still set by the previous run, since it runs after a stage whose completion implies the
//! barrier's (and with it the flag reset). Across runs, nobody writes
//! into a buffer a peer may still read until that peer has arrived at the next barrier, i.e.
//! finished the previous run.
//!
//! **Input shards and the end of a run.** In all-gather schedules peers read a device's input
//! shard (A for `ag-a`, B for `ag-b`) with their copy engines, possibly after the device's own
//! GEMMs are done; the device's DAG therefore ends with `AwaitRelease`, and the contract is:
//! *a device's input shards may be rewritten in its own stream order once its graph has
//! ended* (no host-side wait for the other devices is needed). Reduce-scatter schedules need
//! no release: peers read only a device's workspace, which the device rewrites in the next run
//! only after that run's barrier, i.e. after every peer has finished the previous run. Its
//! D is written by the device alone.
//!
//! **Failures.** A GPU wait that times out records its code in every device's error word, and
//! a barrier that finds its own word set arrives nowhere (sticky poison: no device runs on one
//! barrier ahead of the others). The CPU executor stops the whole run at the first failure.

mod exclusive;
mod node;
mod render;
mod shard;
mod validate;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use exclusive::ExclusiveLayout;
pub use node::{
    AwaitReleaseNode, BarrierNode, Edge, EdgeKind, FLAG_SET_VALUE, FlagSetNode,
    KERNEL_SIGNAL_VALUE, Node, PeerCopyNode,
};
pub use shard::{DeviceInputs, GlobalInputs, SizeError, random_normal};

use crate::problem::Problem;
use crate::schedule::{
    BufferKind, Collective, CopyStep, DeviceProgram, FlagRef, ScheduleError, ScheduleKind,
    ShardLayout, WorkspaceLayout, can_implement, device_program,
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
        let exclusive = ExclusiveLayout::new(tp);
        let programs: Vec<DeviceProgram> = (0..tp)
            .map(|d| device_program(schedule, &problem, tp, d))
            .collect();
        let devices = (0..tp)
            .map(|d| wire(schedule, &problem, &exclusive, &programs, d))
            .collect();
        let plan = Plan {
            schedule,
            problem,
            tp,
            exclusive,
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

/// Whether a copy reads another device's input shard (which that device must not rewrite
/// before the copy is over: the copying device releases it afterwards).
fn reads_peer_shard(copy: &CopyStep, device: usize) -> bool {
    copy.src.device != device
        && matches!(
            copy.src.buffer,
            BufferKind::A | BufferKind::B | BufferKind::C
        )
}

/// Turns device `d`'s program into nodes and edges (see the module documentation for the
/// shapes); `programs` are every device's, for the release flags of d's input shards.
fn wire(
    kind: ScheduleKind,
    problem: &Problem,
    exclusive: &ExclusiveLayout,
    programs: &[DeviceProgram],
    d: usize,
) -> DevicePlan {
    let program = &programs[d];
    let tp = programs.len();
    let own = |index| FlagRef { device: d, index };
    let mut nodes = vec![Node::Barrier(BarrierNode {
        reset_flags: (0..exclusive.flag_count).map(own).collect(),
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

    // The copy chain hangs off the barrier with full edges: each copy, then the stage flag it
    // feeds, then (for a peer's input shard) the owner's release flag.
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
        let release = reads_peer_shard(copy, d).then(|| FlagRef {
            device: copy.src.device,
            index: exclusive.release_flag(d),
        });
        for flag in copy.sets_flag.into_iter().chain(release) {
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
    for gemm in &program.gemms {
        tail = push(&mut nodes, Node::Gemm(*gemm), tail, edge);
        edge = EdgeKind::Programmatic;
    }
    if let Some(reduce) = &program.reduce {
        tail = push(
            &mut nodes,
            Node::Reduce(reduce.clone()),
            tail,
            EdgeKind::Programmatic,
        );
    }

    // The end of the run: wait until every peer that copies one of d's input shards has
    // released it. It follows the last kernel and, when the copy chain runs beside the
    // kernels, the copy chain too, so that it is the DAG's only sink.
    let released: Vec<FlagRef> = programs
        .iter()
        .filter(|p| p.device != d)
        .filter(|p| {
            p.copies
                .iter()
                .any(|c| c.src.device == d && reads_peer_shard(c, p.device))
        })
        .map(|p| own(exclusive.release_flag(p.device)))
        .collect();
    if !released.is_empty() {
        let wait = push(
            &mut nodes,
            Node::AwaitRelease(AwaitReleaseNode { flags: released }),
            tail,
            EdgeKind::Full,
        );
        if copy_tail != tail {
            edges.push(Edge {
                from: copy_tail,
                to: wait,
                kind: EdgeKind::Full,
            });
        }
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

    /// All-gather: every copy of a peer's input shard is followed (in its chain) by a flag set
    /// on that peer's release flag of the copying device, and every device's DAG ends with one
    /// wait for exactly the release flags of the peers that copy its shards. Reduce-scatter:
    /// no release at all.
    #[test]
    fn every_copied_shard_is_released_and_awaited() {
        for kind in ScheduleKind::ALL {
            for tp in [1, 2, 3, 8] {
                let problem = Problem::new(64 * tp, 64 * tp, 64 * tp);
                let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
                let layout = plan.exclusive;
                let mut released = vec![Vec::new(); tp];
                for dev in &plan.devices {
                    let d = dev.device;
                    for (i, node) in dev.nodes.iter().enumerate() {
                        let Node::PeerCopy(c) = node else { continue };
                        if c.src.device == d {
                            continue;
                        }
                        let release = FlagRef {
                            device: c.src.device,
                            index: layout.release_flag(d),
                        };
                        let follows = dev.edges.iter().any(|e| {
                            e.from >= i
                                && matches!(&dev.nodes[e.to], Node::FlagSet(f) if f.flag == release)
                        });
                        assert!(follows, "{kind} TP={tp}: device {d}'s copy {i}");
                        released[c.src.device].push(FlagRef {
                            device: c.src.device,
                            index: layout.release_flag(d),
                        });
                    }
                }
                for dev in &plan.devices {
                    let waits: Vec<&AwaitReleaseNode> = dev
                        .nodes
                        .iter()
                        .filter_map(|n| match n {
                            Node::AwaitRelease(w) => Some(w),
                            _ => None,
                        })
                        .collect();
                    let expected = &released[dev.device];
                    match waits.as_slice() {
                        [] => assert!(expected.is_empty(), "{kind} TP={tp}"),
                        [w] => {
                            assert_eq!(&w.flags, expected, "{kind} TP={tp}");
                            // The DAG's only sink.
                            let last = dev.nodes.len() - 1;
                            assert!(matches!(dev.nodes[last], Node::AwaitRelease(_)));
                            assert!((0..last).all(|i| dev.edges.iter().any(|e| e.from == i)));
                        }
                        _ => panic!("{kind} TP={tp}: more than one release wait"),
                    }
                    let all_gather = kind.collective() == Collective::AllGather;
                    assert_eq!(waits.len(), usize::from(all_gather && tp > 1), "{kind}");
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
