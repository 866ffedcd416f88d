//! The trace: per device, one event per executed plan node, on one clock across devices.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::interval::Interval;
use crate::plan::{Node, Plan};
use crate::problem::Problem;
use crate::schedule::{FlagRef, ScheduleKind};

/// Why timestamps do not make a trace of a plan (a bug in the trace source).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TraceError {
    /// Not one list of spans per device.
    #[error("{got} devices' spans for a plan of {expected} devices")]
    DeviceCount {
        /// Lists given.
        got: usize,
        /// Devices of the plan.
        expected: usize,
    },
    /// A span names a node the device's plan does not have.
    #[error("device {device}: node {node} is not in its plan ({nodes} nodes)")]
    UnknownNode {
        /// The device.
        device: usize,
        /// The node index.
        node: usize,
        /// Nodes of the device's plan.
        nodes: usize,
    },
    /// A node of an iteration has no span, or more than one.
    #[error("device {device}, iteration {iteration}: node {node} has {spans} spans, not 1")]
    NotOnePerNode {
        /// The device.
        device: usize,
        /// The iteration.
        iteration: usize,
        /// The node index.
        node: usize,
        /// Spans found.
        spans: usize,
    },
    /// A span ends before it starts, or its flag wait lies outside it.
    #[error("device {device}, iteration {iteration}, node {node}: {what}")]
    Malformed {
        /// The device.
        device: usize,
        /// The iteration.
        iteration: usize,
        /// The node index.
        node: usize,
        /// What is wrong.
        what: &'static str,
    },
}

/// Where a trace's timestamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceSource {
    /// The CPU executor (`CpuExecutor::run_traced`): one thread per branch of a device's DAG,
    /// `Instant` stamps, the host's monotonic clock shared by every device.
    CpuExecutor,
    /// The GPUs: CUPTI activity records of the graphs' kernels and copies, on CUPTI's clock
    /// for every device of the process; flag sets and flag waits derived from them (see
    /// `trace::activity`).
    Cupti,
}

impl TraceSource {
    /// A short name: `cpu executor`, `cupti activity records`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            TraceSource::CpuExecutor => "cpu executor",
            TraceSource::Cupti => "cupti activity records",
        }
    }
}

/// One timed execution of a plan node, as a trace source reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpan {
    /// The run (0-based) of the plan.
    pub iteration: usize,
    /// The node's index in its device's plan.
    pub node: usize,
    /// When the node started.
    pub start_ns: u64,
    /// When it ended (`≥ start_ns`).
    pub end_ns: u64,
    /// For a kernel with a flag to wait on: when its prologue waited for the flag (inside the
    /// span).
    pub flag_wait: Option<Interval>,
    /// For a kernel with a deferred predecessor (the pipelined all-gather's stage 0 and the
    /// barrier): when it waited for that predecessor after its own work (inside the span, at
    /// its end).
    #[serde(default)]
    pub deferred_wait: Option<Interval>,
}

/// What an event is: the plan node's kind with what its name and lane need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The start-of-run rendezvous.
    Barrier,
    /// A copy-engine copy: from a peer into the own workspace, of the own shard (a
    /// single-stage all-gather), or of the own partial into a peer's workspace (a push).
    Copy {
        /// The device whose buffer is read.
        from: usize,
        /// The device whose buffer is written.
        to: usize,
        /// Bytes moved.
        bytes: usize,
    },
    /// A flag set after a copy.
    FlagSet {
        /// The flag.
        flag: FlagRef,
        /// Whether it is a peer's release flag (else an own stage flag).
        release: bool,
    },
    /// A stage GEMM.
    Gemm,
    /// The single-stage reduce-scatter's reduction.
    Reduce,
    /// The end-of-run wait for the peers' release flags.
    ReleaseWait,
}

/// Where an event runs on its device: the lanes of a device's timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// The 1-thread collective kernels: barrier and release wait.
    Sync,
    /// The kernels that use the SMs: stage GEMMs and the reduction.
    Kernels,
    /// The copy engine: peer copies and the flag sets that follow them.
    CopyEngine,
}

impl Lane {
    /// Every lane, top to bottom.
    pub const ALL: [Lane; 3] = [Lane::Sync, Lane::Kernels, Lane::CopyEngine];

    /// The lane's name in the timelines.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Lane::Sync => "barrier and waits",
            Lane::Kernels => "stage kernels (SMs)",
            Lane::CopyEngine => "copy engine",
        }
    }
}

/// One executed plan node on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The run (0-based).
    pub iteration: usize,
    /// The node's index in the device's plan (= its graph node on the GPU).
    pub node: usize,
    /// What the node is.
    pub kind: EventKind,
    /// The node's stage ([`Node::stage`]).
    pub stage: usize,
    /// Its time.
    pub span: Interval,
    /// A kernel's flag wait (inside `span`).
    pub flag_wait: Option<Interval>,
    /// A kernel's wait for a deferred predecessor after its own work (inside `span`, at its
    /// end).
    #[serde(default)]
    pub deferred_wait: Option<Interval>,
    /// Flags the node stores into ([`Node::flags_set`]).
    pub sets: Vec<FlagRef>,
    /// Flags the node waits on ([`Node::flags_awaited`]).
    pub awaits: Vec<FlagRef>,
}

impl Event {
    /// The slice name on `device`: `barrier`, `stage 2 gemm`, `copy from device 3`,
    /// `copy own shard`, `push to device 1`, `flag 2` (own), `flag 2 of device 1` (a peer's),
    /// `release to device 1`, `reduce`, `release wait`.
    #[must_use]
    pub fn name(&self, device: usize) -> String {
        match self.kind {
            EventKind::Barrier => "barrier".into(),
            EventKind::Copy { to, .. } if to != device => format!("push to device {to}"),
            EventKind::Copy { from, .. } if from == device => "copy own shard".into(),
            EventKind::Copy { from, .. } => format!("copy from device {from}"),
            EventKind::FlagSet {
                flag,
                release: true,
            } => format!("release to device {}", flag.device),
            EventKind::FlagSet { flag, .. } if flag.device != device => {
                format!("flag {} of device {}", flag.index, flag.device)
            }
            EventKind::FlagSet { flag, .. } => format!("flag {}", flag.index),
            EventKind::Gemm => format!("stage {} gemm", self.stage),
            EventKind::Reduce => "reduce".into(),
            EventKind::ReleaseWait => "release wait".into(),
        }
    }

    /// The lane it runs on.
    #[must_use]
    pub fn lane(&self) -> Lane {
        match self.kind {
            EventKind::Barrier | EventKind::ReleaseWait => Lane::Sync,
            EventKind::Gemm | EventKind::Reduce => Lane::Kernels,
            EventKind::Copy { .. } | EventKind::FlagSet { .. } => Lane::CopyEngine,
        }
    }

    /// When the flags of [`Event::sets`] are stored: a kernel signals in its prologue (at its
    /// start), a flag-set node is the store (its middle, which lies inside it).
    #[must_use]
    pub fn sets_flags_at_ns(&self) -> u64 {
        match self.kind {
            EventKind::FlagSet { .. } => self.span.start_ns + self.span.len_ns() / 2,
            _ => self.span.start_ns,
        }
    }

    /// A GEMM's main loop: its span after the flag wait and before the deferred wait (None
    /// for other events).
    #[must_use]
    pub fn gemm_compute(&self) -> Option<Interval> {
        (self.kind == EventKind::Gemm).then(|| {
            let start = self.flag_wait.map_or(self.span.start_ns, |w| w.end_ns);
            let end = self.deferred_wait.map_or(self.span.end_ns, |w| w.start_ns);
            Interval::new(start, end.max(start))
        })
    }

    /// The waits inside the event: its flag wait, then its deferred wait.
    pub fn waits(&self) -> impl Iterator<Item = Interval> + use<> {
        self.flag_wait.into_iter().chain(self.deferred_wait)
    }
}

/// One device's events, sorted by start time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTrace {
    /// The device.
    pub device: usize,
    /// Its events, by start time (then node index).
    pub events: Vec<Event>,
}

/// A trace of one or more runs of a plan: every device's events on one clock whose zero is the
/// earliest event's start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// The schedule.
    pub schedule: ScheduleKind,
    /// The global problem.
    pub problem: Problem,
    /// Number of devices.
    pub tp: usize,
    /// Where the timestamps come from.
    pub source: TraceSource,
    /// Runs traced.
    pub iterations: usize,
    /// Per device, index = device.
    pub devices: Vec<DeviceTrace>,
}

impl Trace {
    /// The trace of `plan` from `spans[d]`, device d's spans on a clock shared by every device:
    /// exactly one span per node of every iteration `0..n` (n = the largest iteration + 1),
    /// each ending no earlier than it starts, flag waits inside their spans, deferred waits
    /// inside them after the flag waits. Times are shifted
    /// so that the earliest start is 0.
    pub fn new(
        plan: &Plan,
        source: TraceSource,
        spans: &[Vec<NodeSpan>],
    ) -> Result<Trace, TraceError> {
        if spans.len() != plan.tp {
            return Err(TraceError::DeviceCount {
                got: spans.len(),
                expected: plan.tp,
            });
        }
        let iterations = spans
            .iter()
            .flatten()
            .map(|s| s.iteration + 1)
            .max()
            .unwrap_or(0);
        let origin = spans
            .iter()
            .flatten()
            .map(|s| s.start_ns)
            .min()
            .unwrap_or(0);
        let devices = plan
            .devices
            .iter()
            .zip(spans)
            .map(|(dev, spans)| {
                check_device(dev.device, &dev.nodes, iterations, spans)?;
                let mut events: Vec<Event> = spans
                    .iter()
                    .map(|s| event(&dev.nodes[s.node], s, origin, plan))
                    .collect();
                events.sort_by_key(|e| (e.span.start_ns, e.iteration, e.node));
                Ok(DeviceTrace {
                    device: dev.device,
                    events,
                })
            })
            .collect::<Result<_, TraceError>>()?;
        Ok(Trace {
            schedule: plan.schedule,
            problem: plan.problem,
            tp: plan.tp,
            source,
            iterations,
            devices,
        })
    }

    /// The end of the last event.
    #[must_use]
    pub fn end_ns(&self) -> u64 {
        self.devices
            .iter()
            .flat_map(|d| &d.events)
            .map(|e| e.span.end_ns)
            .max()
            .unwrap_or(0)
    }
}

/// Exactly one well-formed span per node and iteration.
fn check_device(
    device: usize,
    nodes: &[Node],
    iterations: usize,
    spans: &[NodeSpan],
) -> Result<(), TraceError> {
    let mut counts = vec![0usize; nodes.len() * iterations];
    for s in spans {
        let malformed = |what| TraceError::Malformed {
            device,
            iteration: s.iteration,
            node: s.node,
            what,
        };
        if s.node >= nodes.len() {
            return Err(TraceError::UnknownNode {
                device,
                node: s.node,
                nodes: nodes.len(),
            });
        }
        if s.end_ns < s.start_ns {
            return Err(malformed("it ends before it starts"));
        }
        if let Some(w) = s.flag_wait
            && (w.end_ns < w.start_ns || !Interval::new(s.start_ns, s.end_ns).contains(&w))
        {
            return Err(malformed("its flag wait lies outside it"));
        }
        if let Some(w) = s.deferred_wait
            && (w.end_ns < w.start_ns
                || !Interval::new(s.start_ns, s.end_ns).contains(&w)
                || s.flag_wait.is_some_and(|f| w.start_ns < f.end_ns))
        {
            return Err(malformed(
                "its deferred wait lies outside it or before its flag wait",
            ));
        }
        counts[s.iteration * nodes.len() + s.node] += 1;
    }
    match counts.iter().position(|&c| c != 1) {
        Some(i) => Err(TraceError::NotOnePerNode {
            device,
            iteration: i / nodes.len(),
            node: i % nodes.len(),
            spans: counts[i],
        }),
        None => Ok(()),
    }
}

/// The event of `node` timed by `span`, on the clock that starts at `origin`.
fn event(node: &Node, span: &NodeSpan, origin: u64, plan: &Plan) -> Event {
    let kind = match node {
        Node::Barrier(_) => EventKind::Barrier,
        Node::PeerCopy(c) => EventKind::Copy {
            from: c.src.device,
            to: c.dst.device,
            bytes: c.bytes,
        },
        Node::FlagSet(f) => EventKind::FlagSet {
            flag: f.flag,
            release: f.flag.index >= plan.exclusive.release_base,
        },
        Node::Gemm(_) => EventKind::Gemm,
        Node::Reduce(_) => EventKind::Reduce,
        Node::AwaitRelease(_) => EventKind::ReleaseWait,
    };
    let shift = |i: Interval| Interval::new(i.start_ns - origin, i.end_ns - origin);
    Event {
        iteration: span.iteration,
        node: span.node,
        kind,
        stage: node.stage(),
        span: shift(Interval::new(span.start_ns, span.end_ns)),
        flag_wait: span.flag_wait.map(shift),
        deferred_wait: span.deferred_wait.map(shift),
        sets: node.flags_set(),
        awaits: node.flags_awaited(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanOptions, RsPartials};
    use crate::trace::tests::{synthetic, traced};

    #[test]
    fn events_are_named_after_their_nodes_and_shifted_to_zero() {
        let (plan, trace) = synthetic(ScheduleKind::AllGatherRotatingA, 2, 2);
        assert_eq!(trace.iterations, 2);
        let first = trace
            .devices
            .iter()
            .flat_map(|d| &d.events)
            .map(|e| e.span.start_ns)
            .min();
        assert_eq!(first, Some(0));
        let names: Vec<String> = trace.devices[0]
            .events
            .iter()
            .filter(|e| e.iteration == 0)
            .map(|e| e.name(0))
            .collect();
        for want in [
            "barrier",
            "copy from device 1",
            "flag 1",
            "release to device 1",
            "stage 0 gemm",
            "stage 1 gemm",
            "release wait",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert_eq!(names.len(), plan.devices[0].nodes.len());
        // Stage 1's GEMM waits for flag 1, which device 0's own flag-set node stores.
        let gemm1 = trace.devices[0]
            .events
            .iter()
            .find(|e| e.iteration == 1 && e.kind == EventKind::Gemm && e.stage == 1)
            .unwrap_or_else(|| panic!("no stage 1 gemm"));
        let flag = gemm1.awaits[0];
        let setters: Vec<String> = trace.devices[0]
            .events
            .iter()
            .filter(|e| e.iteration == 1 && e.sets.contains(&flag))
            .map(|e| e.name(0))
            .collect();
        assert_eq!(setters, ["flag 1"]);
    }

    /// Pushed partials: device 0 pushes into its right neighbour's workspace and sets that
    /// neighbour's flag; the neighbour's stage waits on it.
    #[test]
    fn pushes_are_named_after_their_destination() {
        let options = PlanOptions {
            rs_partials: RsPartials::Push,
        };
        let problem = Problem::new(48, 48, 48).with_dtype(crate::dtype::Dtype::F16);
        let plan = Plan::build_with(ScheduleKind::ReduceScatterTilingA, problem, 3, options)
            .unwrap_or_else(|e| panic!("{e}"));
        let trace = traced(&plan, 1);
        let names: Vec<String> = trace.devices[0].events.iter().map(|e| e.name(0)).collect();
        assert!(names.iter().any(|n| n == "push to device 1"), "{names:?}");
        let flag = names
            .iter()
            .find(|n| n.starts_with("flag ") && n.ends_with(" of device 1"));
        assert!(flag.is_some(), "{names:?}");
        // Every flag a stage waits on has its store, on the left neighbour: one flow each.
        let json = trace.to_chrome_json();
        let flows = json["traceEvents"]
            .as_array()
            .map_or(0, |events| events.iter().filter(|e| e["ph"] == "s").count());
        let awaited: usize = trace
            .devices
            .iter()
            .flat_map(|d| &d.events)
            .filter(|e| e.kind == EventKind::Gemm)
            .map(|e| e.awaits.len())
            .sum();
        assert_eq!(flows, awaited);
        assert!(awaited > 0);
    }

    #[test]
    fn a_missing_or_doubled_node_is_refused() {
        let plan = Plan::build(
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(64, 64, 64),
            2,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let span = |node, start, end| NodeSpan {
            iteration: 0,
            node,
            start_ns: start,
            end_ns: end,
            flag_wait: None,
            deferred_wait: None,
        };
        let full: Vec<NodeSpan> = (0..plan.devices[0].nodes.len())
            .map(|n| span(n, 10 * n as u64, 10 * n as u64 + 5))
            .collect();
        let mut missing = full.clone();
        missing.pop();
        let last = full.len() - 1;
        assert_eq!(
            Trace::new(
                &plan,
                TraceSource::CpuExecutor,
                &[full.clone(), missing.clone()]
            ),
            Err(TraceError::NotOnePerNode {
                device: 1,
                iteration: 0,
                node: last,
                spans: 0
            })
        );
        let mut backwards = full.clone();
        backwards[0].end_ns = 0;
        backwards[0].start_ns = 3;
        assert!(matches!(
            Trace::new(&plan, TraceSource::CpuExecutor, &[full.clone(), backwards]),
            Err(TraceError::Malformed { device: 1, .. })
        ));
        let mut outside = full.clone();
        outside[1].flag_wait = Some(Interval::new(0, 100));
        assert!(matches!(
            Trace::new(&plan, TraceSource::CpuExecutor, &[outside, full.clone()]),
            Err(TraceError::Malformed { device: 0, .. })
        ));
        assert!(matches!(
            Trace::new(&plan, TraceSource::CpuExecutor, &[full]),
            Err(TraceError::DeviceCount {
                got: 1,
                expected: 2
            })
        ));
    }
}
