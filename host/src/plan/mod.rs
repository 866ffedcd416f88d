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
//! … with pushed partials:    Barrier ─pdl→ Gemm0 ─pdl→ Gemm1 ─pdl→ … Gemm(P−1)
//!                                           └─full→ Push1 → Flag1   └─full→ Push2 → Flag2 …
//!                            (Push t copies Gemm(t−1)'s partial into right's receive slot,
//!                            Flag t sets right's flag t; Gemm t>0 waits own flag t)
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
//! and its flag reset is ordered before its arrival. A push and its flag set are joined by a
//! full edge in the pusher's graph, so the copy engine's remote writes are complete before
//! the fence of the flag set. Hence a GEMM that observes
//! flag t set also observes the copy (all-gather), the left neighbour's partial
//! (reduce-scatter) or its push that was complete before the flag was stored; and it cannot see the flag
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
//! only after that run's barrier, i.e. after every peer has finished the previous run (with
//! pushed partials, peers write only its workspace, after the same barrier). Its
//! D is written by the device alone.
//!
//! **Slots of pushed partials** ([`RsPartials::Push`]; slot names as in
//! [`crate::schedule::device_program_with`]: the left neighbour pushes into `R_t`, stage t
//! writes `S_t`, and `S_t = R_{t−1}` for 2 ≤ t ≤ P−2). Device d's workspace is written by
//! d's own stage GEMMs and by its left neighbour's pushes, and read by d's own GEMMs and
//! pushes only. Each slot use ends at a point that orders it before the next write:
//! - `R_t` (pushed by left after left's stage t−1, read by d's stage t): in one run, left
//!   pushes into `R_t` once, and d writes it (as `S_{t+1}`) only in stage t+1, which starts
//!   after stage t has completed (its programmatic edge: `griddepcontrol.wait` before any
//!   memory access), and stage t observed flag t, so the push is ordered before it. Across
//!   runs, left pushes into `R_t` only after passing the next barrier, which needs d's
//!   arrival, which d's next graph makes only after this run's graph ended (every push of d
//!   included, so `S_{t+1}` has been read too). *Frees `R_t`: d's stage t's completion (for
//!   d's own write), d's next barrier arrival (for the left neighbour's push).*
//! - `S_0`, `S_1` (written by d's stages 0 and 1, read by d's pushes 1 and 2): written once
//!   per run, rewritten only after d's next barrier, which its next graph reaches only after
//!   this run's graph, pushes included, has ended. *Frees them: the end of d's graph.*
//! - flags: d's stage flag t is set only by left's flag-set node after push t, reset by d's
//!   barrier before d arrives; left sets it only after passing that barrier (same argument as
//!   for the kernel signals below).
//!
//! Hence no slot is written while a reader may still read it, at any delay of any device;
//! the CPU executor checks this with devices delayed on purpose (`tests/cpu_executor.rs`).
//! No reduce-scatter stage is deferred ([`EdgeKind::ProgrammaticDeferred`]): stage 0 writes a
//! workspace slot, and a deferred stage runs before its device's barrier, i.e. before every
//! peer has finished the previous run. Partials that are read (not pushed) make that a race:
//! the right neighbour's stage 1 of the previous run may still read the slot over NVLink.
//! Pushed partials would not race (stage 0 writes `S_0`, never an `R_t`, and only the
//! device's own push 1 reads it, which the previous graph's end orders), but the rule is one
//! for every schedule: a deferred stage writes only its own D. [`Plan::validate`] allows a deferred
//! edge only into a pipelined all-gather's stage 0, and the lowering refuses a deferred stage
//! that signals, waits, reads a peer or writes anything but its own D.
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
pub use shard::{DeviceInputs, Fp8DeviceInputs, Fp8Inputs, GlobalInputs, SizeError, random_normal};
#[cfg(any(feature = "cli", feature = "baselines"))]
pub(crate) use shard::{random_e4m3, random_scales};

use crate::problem::Problem;
pub use crate::schedule::RsPartials;
use crate::schedule::{
    BufferKind, Collective, CopyDirection, CopyStep, DeviceProgram, FlagRef, ScheduleError,
    ScheduleKind, ShardLayout, WorkspaceLayout, can_implement, device_program_with,
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
    /// A node's view points at a buffer of the wrong element type: a GEMM's A and B read
    /// operands ([`Problem::operand_bytes`]: 1-byte e4m3 in an FP8 plan), its C and D and a
    /// reduction's views hold outputs ([`Problem::output_bytes`]). Only an edited FP8 plan can
    /// mix them up; bf16 and f16 plans have one element size.
    #[error(
        "invalid plan: device {device}, {node} node: its {role} view points at device \
         {view_device}'s {buffer_name} buffer of {got}-byte elements; {role} views need \
         {expected}-byte elements",
        buffer_name = .buffer.name()
    )]
    ElementType {
        /// The device whose node it is.
        device: usize,
        /// The node name.
        node: &'static str,
        /// The view's role in the node: `A`, `B`, `C`, `D`, `reduction source` or
        /// `reduction destination`.
        role: &'static str,
        /// The device the view points at.
        view_device: usize,
        /// The buffer the view points at.
        buffer: BufferKind,
        /// Bytes of one element of that buffer ([`Plan::element_bytes`]).
        got: usize,
        /// Bytes of one element the role needs.
        expected: usize,
    },
    /// A [`EdgeKind::ProgrammaticDeferred`] edge into anything but stage 0's GEMM of a
    /// pipelined all-gather (the only stage that reads and writes nothing the start-of-run
    /// barrier guards; see the module documentation).
    #[error(
        "invalid plan: device {device}: edge {edge} into its {node} node (stage {stage}) of \
         {schedule} is deferred; only a pipelined all-gather's stage-0 GEMM may be deferred"
    )]
    DeferredEdge {
        /// The device.
        device: usize,
        /// The edge's index in the device's edge list.
        edge: usize,
        /// The name of the node the edge enters.
        node: &'static str,
        /// That node's stage.
        stage: usize,
        /// The plan's schedule.
        schedule: ScheduleKind,
    },
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

/// Choices of [`Plan::build_with`] beyond schedule, problem and TP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PlanOptions {
    /// How the pipelined reduce-scatter moves partials (ignored by other schedules).
    pub rs_partials: RsPartials,
}

/// A complete plan: one DAG per device plus the shared layouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The schedule.
    pub schedule: ScheduleKind,
    /// How partials move: [`RsPartials::Push`] only for a pipelined reduce-scatter built with
    /// it, else [`RsPartials::Read`] (also when absent, in plans written before pushes).
    #[serde(default)]
    pub rs_partials: RsPartials,
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
    /// Builds the plan of `schedule` for `problem` on `tp` devices (partials read remotely).
    pub fn build(schedule: ScheduleKind, problem: Problem, tp: usize) -> Result<Plan, PlanError> {
        Self::build_with(schedule, problem, tp, PlanOptions::default())
    }

    /// Builds the plan of `schedule` for `problem` on `tp` devices with `options`; an option
    /// that does not apply to the schedule is ignored ([`RsPartials::effective`]), and
    /// [`Plan::rs_partials`] records what runs.
    pub fn build_with(
        schedule: ScheduleKind,
        problem: Problem,
        tp: usize,
        options: PlanOptions,
    ) -> Result<Plan, PlanError> {
        can_implement(schedule, &problem, tp)?;
        let rs_partials = options.rs_partials.effective(schedule);
        let exclusive = ExclusiveLayout::new(tp);
        let programs: Vec<DeviceProgram> = (0..tp)
            .map(|d| device_program_with(schedule, &problem, tp, d, rs_partials))
            .collect();
        let devices = (0..tp)
            .map(|d| wire(schedule, &problem, &exclusive, &programs, d))
            .collect();
        let plan = Plan {
            schedule,
            rs_partials,
            problem,
            tp,
            exclusive,
            devices,
        };
        plan.validate()?;
        Ok(plan)
    }

    /// Bytes of one element of `buffer` (1 for FP8's A, B and all-gathered slots, else the
    /// dtype's 2): the one place the executors, the validation and the memory estimate ask.
    #[must_use]
    pub fn element_bytes(&self, buffer: BufferKind) -> usize {
        buffer.element_bytes(self.schedule, &self.problem)
    }

    /// Elements per row of an operand buffer of `device` (see [`BufferKind::holds_operands`]):
    /// its A or B block's columns, or K for an all-gather workspace (gathered rows of A or B);
    /// `None` for the other buffers. Row-wise FP8 scales are one per such row, so a row's
    /// scale is found, and moved, with the row.
    #[must_use]
    pub fn operand_row_elements(&self, device: usize, buffer: BufferKind) -> Option<usize> {
        let dev = self.devices.get(device)?;
        match buffer {
            BufferKind::A => Some(dev.shards.a.cols),
            BufferKind::B => Some(dev.shards.b.cols),
            BufferKind::Workspace if buffer.holds_operands(self.schedule) => Some(self.problem.k),
            BufferKind::C | BufferKind::D | BufferKind::Workspace => None,
        }
    }

    /// Bytes of `buffer` on `device` (0 for an absent C or device).
    #[must_use]
    pub fn buffer_bytes(&self, device: usize, buffer: BufferKind) -> usize {
        self.devices.get(device).map_or(0, |d| {
            d.buffer_elements(buffer)
                .saturating_mul(self.element_bytes(buffer))
        })
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

/// Appends `node` with an edge from node `from`; returns its index.
fn append(
    nodes: &mut Vec<Node>,
    edges: &mut Vec<Edge>,
    node: Node,
    from: usize,
    kind: EdgeKind,
) -> usize {
    nodes.push(node);
    edges.push(Edge {
        from,
        to: nodes.len() - 1,
        kind,
    });
    nodes.len() - 1
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

    // A copy, then the stage flag it feeds, then (for a peer's input shard) the owner's
    // release flag, in a chain of full edges hanging off node `from`; returns the tail.
    let copy_chain = |nodes: &mut Vec<Node>, edges: &mut Vec<Edge>, copy: &CopyStep, from| {
        let node = Node::PeerCopy(PeerCopyNode {
            stage: copy.stage,
            src: copy.src,
            dst: copy.dst,
            bytes: copy.src.len * copy.src.buffer.element_bytes(kind, problem),
            direction: copy.direction,
        });
        let mut tail = append(nodes, edges, node, from, EdgeKind::Full);
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
            tail = append(nodes, edges, node, tail, EdgeKind::Full);
        }
        tail
    };

    // The pulls: one chain off the barrier.
    let mut copy_tail = 0;
    for copy in program
        .copies
        .iter()
        .filter(|c| c.direction == CopyDirection::Pull)
    {
        copy_tail = copy_chain(&mut nodes, &mut edges, copy, copy_tail);
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
    let mut gemm_nodes = Vec::with_capacity(program.gemms.len());
    for gemm in &program.gemms {
        tail = append(&mut nodes, &mut edges, Node::Gemm(*gemm), tail, edge);
        gemm_nodes.push((gemm.stage, tail));
        edge = EdgeKind::Programmatic;
    }
    // The pushes: each one off the stage GEMM that wrote its source (stage − 1), one branch
    // per stage, so no push waits for another.
    for copy in program
        .copies
        .iter()
        .filter(|c| c.direction == CopyDirection::Push)
    {
        let producer = gemm_nodes
            .iter()
            .find(|(stage, _)| *stage + 1 == copy.stage)
            .map_or(tail, |&(_, node)| node);
        copy_chain(&mut nodes, &mut edges, copy, producer);
    }
    if let Some(reduce) = &program.reduce {
        tail = append(
            &mut nodes,
            &mut edges,
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
        let wait = append(
            &mut nodes,
            &mut edges,
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
        workspace_bytes: program.workspace.elements()
            * BufferKind::Workspace.element_bytes(kind, problem),
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

    /// The happens-before relation of one run of a plan, over the start and end events of
    /// every node of every device (event `2·k` starts global node k, `2·k + 1` ends it):
    /// a node's predecessors end before it starts (a deferred edge: before it ends); a
    /// kernel stores its signals when it starts (after its predecessors, before touching
    /// memory), a flag-set node when it ends; a wait starts its node after the store; a
    /// barrier ends after every peer's barrier has started (arrived).
    struct HappensBefore {
        /// Global index of device d's node 0.
        base: Vec<usize>,
        /// Successor events of every event.
        next: Vec<Vec<usize>>,
    }

    impl HappensBefore {
        fn new(plan: &Plan) -> Self {
            let mut base = Vec::new();
            let mut total = 0;
            for dev in &plan.devices {
                base.push(total);
                total += dev.nodes.len();
            }
            let mut next = vec![Vec::new(); 2 * total];
            let start = |k: usize| 2 * k;
            let end = |k: usize| 2 * k + 1;
            for dev in &plan.devices {
                let g = |i: usize| base[dev.device] + i;
                for (i, node) in dev.nodes.iter().enumerate() {
                    next[start(g(i))].push(end(g(i)));
                    if let Node::Barrier(b) = node {
                        for &q in &b.arrive_at {
                            next[start(g(i))].push(end(base[q]));
                        }
                    }
                }
                for e in &dev.edges {
                    let to = match e.kind {
                        EdgeKind::ProgrammaticDeferred => end(g(e.to)),
                        EdgeKind::Full | EdgeKind::Programmatic => start(g(e.to)),
                    };
                    next[end(g(e.from))].push(to);
                }
            }
            for setter in &plan.devices {
                for (i, node) in setter.nodes.iter().enumerate() {
                    let k = base[setter.device] + i;
                    let stored = match node {
                        Node::FlagSet(_) => end(k),
                        _ => start(k),
                    };
                    for flag in node.flags_set() {
                        let waiter = &plan.devices[flag.device];
                        for (j, w) in waiter.nodes.iter().enumerate() {
                            if w.flags_awaited().contains(&flag) {
                                next[stored].push(start(base[waiter.device] + j));
                            }
                        }
                    }
                }
            }
            HappensBefore { base, next }
        }

        /// Whether node `i` of device `d` ends before node `j` of device `q` starts.
        fn ordered(&self, (d, i): (usize, usize), (q, j): (usize, usize)) -> bool {
            let (from, to) = (2 * (self.base[d] + i) + 1, 2 * (self.base[q] + j));
            let mut seen = vec![false; self.next.len()];
            let mut stack = vec![from];
            while let Some(e) = stack.pop() {
                if e == to {
                    return true;
                }
                for &n in &self.next[e] {
                    if !std::mem::replace(&mut seen[n], true) {
                        stack.push(n);
                    }
                }
            }
            false
        }
    }

    /// The memory a node touches: (device, buffer, first element, end, written).
    fn accesses(node: &Node) -> Vec<(usize, BufferKind, usize, usize, bool)> {
        let view = |v: &crate::schedule::View, w| (v.device, v.buffer, v.offset, v.end(), w);
        let region = |r: &crate::schedule::Region, w| (r.device, r.buffer, r.offset, r.end(), w);
        match node {
            Node::Gemm(g) => {
                let mut out = vec![view(&g.a, false), view(&g.b, false), view(&g.d, true)];
                out.extend(g.epilogue.source.view().map(|c| view(c, false)));
                out
            }
            Node::PeerCopy(c) => vec![region(&c.src, false), region(&c.dst, true)],
            Node::Reduce(r) => r
                .sources
                .iter()
                .map(|s| view(s, false))
                .chain([view(&r.dst, true)])
                .collect(),
            Node::Barrier(_) | Node::FlagSet(_) | Node::AwaitRelease(_) => Vec::new(),
        }
    }

    /// Every pair of nodes of one run that touch overlapping memory, one of them writing,
    /// without either ending before the other starts.
    fn races(plan: &Plan) -> Vec<String> {
        let hb = HappensBefore::new(plan);
        let nodes: Vec<(usize, usize, &Node)> = plan
            .devices
            .iter()
            .flat_map(|dev| {
                dev.nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (dev.device, i, n))
            })
            .collect();
        let mut found = Vec::new();
        for (x, &(d, i, a)) in nodes.iter().enumerate() {
            for &(q, j, b) in &nodes[x + 1..] {
                let conflict = accesses(a).iter().any(|&(ad, ab, alo, ahi, aw)| {
                    accesses(b).iter().any(|&(bd, bb, blo, bhi, bw)| {
                        (ad, ab) == (bd, bb) && alo < bhi && blo < ahi && (aw || bw)
                    })
                });
                if conflict && !hb.ordered((d, i), (q, j)) && !hb.ordered((q, j), (d, i)) {
                    found.push(format!(
                        "device {d} node {i} ({} t={}) and device {q} node {j} ({} t={})",
                        a.name(),
                        a.stage(),
                        b.name(),
                        b.stage()
                    ));
                }
            }
        }
        found
    }

    /// Within a run, every two nodes that touch the same memory (one writing) are ordered by
    /// the plan's edges, flags and barrier, for every schedule, TP and way of moving partials:
    /// so the pushed partials' slot reuse (`S_t = R_{t−1}`) is safe at any timing. Across
    /// runs, every node follows its device's barrier (no deferred edge in reduce-scatter),
    /// which no device passes before every device's previous run has ended.
    #[test]
    fn no_two_nodes_of_a_run_race_for_memory() {
        for kind in ScheduleKind::ALL {
            for tp in 1..=8 {
                for rs_partials in RsPartials::ALL {
                    let problem = Problem::new(16 * tp, 16 * tp, 16 * tp);
                    let plan = Plan::build_with(kind, problem, tp, PlanOptions { rs_partials })
                        .unwrap_or_else(|e| panic!("{e}"));
                    let races = races(&plan);
                    assert!(
                        races.is_empty(),
                        "{kind} TP={tp} {rs_partials:?}: {races:?}"
                    );
                    if kind.collective() == Collective::ReduceScatter {
                        let hb = HappensBefore::new(&plan);
                        for dev in &plan.devices {
                            for i in 1..dev.nodes.len() {
                                assert!(hb.ordered((dev.device, 0), (dev.device, i)));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The checker finds a slot reused too early: stage 1 writing `R_2`, which the left
    /// neighbour may push into at any time.
    #[test]
    fn a_send_slot_the_left_neighbour_pushes_into_is_a_race() {
        let problem = Problem::new(64, 64, 64);
        let options = PlanOptions {
            rs_partials: RsPartials::Push,
        };
        let mut plan = Plan::build_with(ScheduleKind::ReduceScatterTilingA, problem, 4, options)
            .unwrap_or_else(|e| panic!("{e}"));
        let r2 = plan.devices[1].workspace.slot_offset(1);
        for node in &mut plan.devices[1].nodes {
            match node {
                Node::Gemm(g) if g.stage == 1 => g.d.offset = r2,
                Node::PeerCopy(c) if c.stage == 2 => c.src.offset = r2,
                _ => {}
            }
        }
        assert!(plan.validate().is_ok());
        let races = races(&plan);
        assert!(
            races
                .iter()
                .any(|r| r.contains("device 0") && r.contains("copy t=2")),
            "{races:?}"
        );
    }

    /// Pushing: P−1 pushes per device, each after the stage GEMM that wrote its source and
    /// followed by the flag set of the right neighbour's stage flag; workspace P−1 + min(P−1, 2)
    /// slots.
    #[test]
    fn each_push_follows_its_stage_and_sets_the_right_neighbours_flag() {
        for tp in 1..=8 {
            let problem = Problem::new(16 * tp, 16 * tp, 16 * tp);
            let options = PlanOptions {
                rs_partials: RsPartials::Push,
            };
            let plan = Plan::build_with(ScheduleKind::ReduceScatterTilingB, problem, tp, options)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(plan.rs_partials, RsPartials::Push);
            for dev in &plan.devices {
                let mut pushes = 0;
                for (i, node) in dev.nodes.iter().enumerate() {
                    let Node::PeerCopy(c) = node else { continue };
                    pushes += 1;
                    let preds: Vec<_> = dev.predecessors(i).collect();
                    let [(producer, EdgeKind::Full)] = preds[..] else {
                        panic!("TP={tp}: push {i} has predecessors {preds:?}")
                    };
                    assert!(
                        matches!(&dev.nodes[producer], Node::Gemm(g) if g.stage + 1 == c.stage)
                    );
                    let flag = dev
                        .edges
                        .iter()
                        .find(|e| e.from == i)
                        .map(|e| &dev.nodes[e.to]);
                    let right = (dev.device + 1) % tp;
                    assert!(
                        matches!(flag, Some(Node::FlagSet(f))
                            if f.flag == FlagRef { device: right, index: c.stage }),
                        "TP={tp}: {flag:?}"
                    );
                }
                assert_eq!(pushes, tp - 1);
                let slots = tp - 1 + (tp - 1).min(2);
                assert_eq!(dev.workspace.slots, slots);
                assert_eq!(dev.workspace_bytes, slots * (16 * tp) * 16 * 2);
            }
        }
    }

    /// Removes every key of `keys` from the objects of `value`, at any depth.
    fn strip(value: &mut serde_json::Value, keys: &[&str]) {
        match value {
            serde_json::Value::Object(map) => {
                map.retain(|k, _| !keys.contains(&k.as_str()));
                map.values_mut().for_each(|v| strip(v, keys));
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| strip(v, keys)),
            _ => {}
        }
    }

    #[test]
    fn options_that_do_not_apply_are_ignored_and_old_plans_read() {
        let options = PlanOptions {
            rs_partials: RsPartials::Push,
        };
        let problem = Problem::new(64, 64, 64);
        for kind in ScheduleKind::ALL {
            let plan =
                Plan::build_with(kind, problem, 2, options).unwrap_or_else(|e| panic!("{e}"));
            let read = Plan::build(kind, problem, 2).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(plan == read, !RsPartials::applies_to(kind), "{kind}");
            // A plan written before pushes existed (no `rs_partials`, no copy `direction`).
            let mut json = serde_json::to_value(&read).unwrap_or_else(|e| panic!("{e}"));
            strip(&mut json, &["rs_partials", "direction"]);
            let old = json.to_string();
            assert!(!old.contains("rs_partials") && !old.contains("direction"));
            let back = Plan::from_json(&old).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(back, read, "{kind}");
        }
    }

    /// FP8 plans of every schedule at TP 1–8 in both scale modes validate (whole operand
    /// rows included), have the bf16 plan's DAG, and count 1 byte per gathered operand
    /// element and 2 per partial; they survive JSON.
    #[test]
    fn fp8_plans_are_the_bf16_dags_with_one_byte_operands() {
        use crate::fp8::ScaleMode;
        for kind in ScheduleKind::ALL {
            for tp in 1..=8 {
                for scales in ScaleMode::ALL {
                    let bf16 = Problem::new(16 * tp, 16 * tp, 32 * tp);
                    let fp8 = bf16.with_fp8(scales);
                    let plain = Plan::build(kind, bf16, tp).unwrap_or_else(|e| panic!("{e}"));
                    let plan = Plan::build(kind, fp8, tp).unwrap_or_else(|e| panic!("{e}"));
                    let operand_ws = kind.collective() == Collective::AllGather;
                    assert_eq!(plan.element_bytes(BufferKind::A), 1);
                    assert_eq!(plan.element_bytes(BufferKind::D), 2);
                    assert_eq!(
                        plan.element_bytes(BufferKind::Workspace),
                        if operand_ws { 1 } else { 2 }
                    );
                    for (dev, old) in plan.devices.iter().zip(&plain.devices) {
                        assert_eq!(
                            (&dev.nodes.len(), &dev.edges),
                            (&old.nodes.len(), &old.edges)
                        );
                        assert_eq!(dev.shards, old.shards);
                        let ws = dev.workspace.elements();
                        assert_eq!(dev.workspace_bytes, ws * if operand_ws { 1 } else { 2 });
                        for (node, old) in dev.nodes.iter().zip(&old.nodes) {
                            match (node, old) {
                                (Node::PeerCopy(c), Node::PeerCopy(o)) => {
                                    assert_eq!((c.src, c.dst), (o.src, o.dst));
                                    let bytes = if operand_ws { c.src.len } else { o.bytes };
                                    assert_eq!(c.bytes, bytes, "{kind} TP={tp}");
                                }
                                (node, old) => assert_eq!(node, old, "{kind} TP={tp}"),
                            }
                        }
                    }
                    let json = plan.to_json().unwrap_or_else(|e| panic!("{e}"));
                    let back = Plan::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(back, plan);
                }
            }
        }
    }

    /// An FP8 plan whose gathered copy starts mid-row is refused: its row-wise scales would
    /// not follow it.
    #[test]
    fn an_fp8_copy_of_part_of_a_row_is_refused() {
        let problem = Problem::new(64, 64, 64).with_fp8(crate::fp8::ScaleMode::Rowwise);
        let mut plan = Plan::build(ScheduleKind::AllGatherRotatingA, problem, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        for node in &mut plan.devices[0].nodes {
            if let Node::PeerCopy(c) = node {
                c.src.len -= 16;
                c.dst.len -= 16;
                c.bytes -= 16;
            }
        }
        let err = plan.validate().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("not whole rows of 64 e4m3")),
            "{err:?}"
        );
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
