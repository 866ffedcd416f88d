//! Node spans from GPU activity records (CUPTI): the GPU trace source's arithmetic, kept apart
//! from the profiler library so that it runs, and is tested, without a GPU.
//!
//! CUPTI reports one record per executed kernel and copy, each with the id of the graph node
//! that ran it (`cuptiGetGraphNodeId` gives the id of every node distgemm created, and graph
//! node i of a device is plan node i). From those records:
//!
//! - **kernels and copies**: the node's records sorted by start; record i is run i. Every node
//!   that runs code or a copy must have exactly one record per traced run.
//! - **flag sets** (write-value nodes: the front end stores the word, no activity kind records
//!   it): a zero-length span at the latest end of the node's predecessors in the device's DAG
//!   (the copy whose arrival it announces) — the earliest the store can happen.
//! - **flag waits** of a stage kernel (GEMM or reduction) whose prologue waits: from its start
//!   to the latest time one of its awaited flags was set in the same run (a flag set's span, a
//!   signalling kernel's start), clamped to the kernel's span; zero when every flag was set
//!   before the kernel started. This is a lower bound of the real wait (the store still has to
//!   become visible): the kernels write no timestamps of their own. Not estimated for a stage
//!   that waits only before its first C load (pushed partials, `HOOK_WAIT_BEFORE_C`), whose
//!   main loop runs while it waits, nor for a deferred wait (the pipelined all-gather's stage 0
//!   waiting for the barrier after its own work): those spans count as compute.
//!
//! Every record is on one clock: CUPTI converts the GPUs' timestamps to its host-side
//! timestamp (ns) for every device of the process.

use std::collections::HashMap;

use super::interval::Interval;
use super::model::{NodeSpan, TraceError};
use crate::plan::{Node, Plan, RsPartials};
use crate::schedule::FlagRef;

/// One executed kernel or copy, as CUPTI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ActivityRecord {
    /// The id of the graph node that ran it (`cuptiGetGraphNodeId`).
    pub graph_node_id: u64,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

/// Every device's node spans for `iterations` runs of `plan`, from the `records` of exactly
/// those runs; `node_ids[d][i]` is the graph node id of device d's node i. Records of other
/// graph nodes are ignored (other work in the process). A node that runs code or a copy with
/// not exactly `iterations` records is an error ([`TraceError::NotOnePerNode`]).
pub(crate) fn spans_from_activity(
    plan: &Plan,
    node_ids: &[Vec<u64>],
    records: &[ActivityRecord],
    iterations: usize,
) -> Result<Vec<Vec<NodeSpan>>, TraceError> {
    let timed = node_ids
        .iter()
        .map(|ids| node_intervals(ids, records))
        .collect();
    spans_from_intervals(plan, timed, iterations)
}

/// Per node of one device (`ids[i]`: node i's graph node id): the intervals of its `records`,
/// sorted by start. Records of other nodes are ignored.
pub(crate) fn node_intervals(ids: &[u64], records: &[ActivityRecord]) -> Vec<Vec<Interval>> {
    let index: HashMap<u64, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut timed = vec![Vec::new(); ids.len()];
    for r in records {
        if let Some(&i) = index.get(&r.graph_node_id) {
            timed[i].push(Interval::new(r.start_ns, r.end_ns.max(r.start_ns)));
        }
    }
    for list in &mut timed {
        list.sort_by_key(|s: &Interval| s.start_ns);
    }
    timed
}

/// Every device's node spans for `iterations` runs from `timed[d][i]`, the sorted intervals
/// of device d's node i ([`node_intervals`], possibly from several processes on one clock):
/// run r of a kernel or copy is its r-th interval, flag sets and flag waits are derived (see
/// the module documentation).
#[expect(
    clippy::needless_range_loop,
    reason = "the run indexes every node's records, not one list"
)]
pub(crate) fn spans_from_intervals(
    plan: &Plan,
    timed: Vec<Vec<Vec<Interval>>>,
    iterations: usize,
) -> Result<Vec<Vec<NodeSpan>>, TraceError> {
    if timed.len() != plan.tp {
        return Err(TraceError::DeviceCount {
            got: timed.len(),
            expected: plan.tp,
        });
    }
    for (d, dev) in plan.devices.iter().enumerate() {
        for (i, node) in dev.nodes.iter().enumerate() {
            let list = timed[d].get(i).map_or(&[][..], Vec::as_slice);
            let expected = if matches!(node, Node::FlagSet(_)) {
                0
            } else {
                iterations
            };
            if list.len() != expected {
                return Err(TraceError::NotOnePerNode {
                    device: d,
                    iteration: list.len().min(iterations.saturating_sub(1)),
                    node: i,
                    spans: list.len(),
                });
            }
        }
    }
    let mut spans: Vec<Vec<NodeSpan>> = vec![Vec::new(); plan.tp];
    for run in 0..iterations {
        // Kernels, copies and flag sets (predecessors come first: nodes are in topological
        // order).
        let mut runs: Vec<Vec<Interval>> = Vec::with_capacity(plan.tp);
        for (d, dev) in plan.devices.iter().enumerate() {
            let mut own: Vec<Interval> = Vec::with_capacity(dev.nodes.len());
            for (i, node) in dev.nodes.iter().enumerate() {
                let span = if matches!(node, Node::FlagSet(_)) {
                    let at = dev
                        .edges
                        .iter()
                        .filter(|e| e.to == i && e.from < i)
                        .map(|e| own[e.from].end_ns)
                        .max()
                        .unwrap_or(0);
                    Interval::new(at, at)
                } else {
                    timed[d][i][run]
                };
                own.push(span);
            }
            runs.push(own);
        }
        // When each flag was set in this run.
        let mut set_at: HashMap<FlagRef, u64> = HashMap::new();
        for (dev, own) in plan.devices.iter().zip(&runs) {
            for (node, span) in dev.nodes.iter().zip(own) {
                for flag in node.flags_set() {
                    let t = set_at.entry(flag).or_insert(span.start_ns);
                    *t = (*t).max(span.start_ns);
                }
            }
        }
        for ((dev, own), out) in plan.devices.iter().zip(&runs).zip(&mut spans) {
            for (i, (node, span)) in dev.nodes.iter().zip(own).enumerate() {
                out.push(NodeSpan {
                    iteration: run,
                    node: i,
                    start_ns: span.start_ns,
                    end_ns: span.end_ns,
                    flag_wait: estimated_flag_wait(plan, node, *span, &set_at),
                    deferred_wait: None,
                });
            }
        }
    }
    Ok(spans)
}

/// The estimated prologue flag wait of a stage kernel (see the module documentation).
fn estimated_flag_wait(
    plan: &Plan,
    node: &Node,
    span: Interval,
    set_at: &HashMap<FlagRef, u64>,
) -> Option<Interval> {
    let waits_in_prologue = match node {
        Node::Gemm(_) => plan.rs_partials != RsPartials::Push,
        Node::Reduce(_) => true,
        _ => false,
    };
    let awaited = node.flags_awaited();
    if !waits_in_prologue || awaited.is_empty() {
        return None;
    }
    let last_set = awaited.iter().filter_map(|f| set_at.get(f)).max()?;
    let end = (*last_set).clamp(span.start_ns, span.end_ns);
    Some(Interval::new(span.start_ns, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanOptions, RsPartials};
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;
    use crate::trace::{Trace, TraceSource};

    fn plan(kind: ScheduleKind, tp: usize, partials: RsPartials) -> Plan {
        let problem = Problem::new(64 * tp, 64 * tp, 64 * tp);
        Plan::build_with(
            kind,
            problem,
            tp,
            PlanOptions {
                rs_partials: partials,
            },
        )
        .expect("plan")
    }

    /// Synthetic records: node ids `1000·d + i`; in run r, node i of device d runs from
    /// `r·10⁶ + 1000·i + 10·d` for 500 ns. Returned runs last to first.
    fn records(plan: &Plan, runs: usize) -> (Vec<Vec<u64>>, Vec<ActivityRecord>) {
        let ids: Vec<Vec<u64>> = plan
            .devices
            .iter()
            .enumerate()
            .map(|(d, dev)| {
                (0..dev.nodes.len())
                    .map(|i| (1000 * d + i) as u64)
                    .collect()
            })
            .collect();
        let mut out = Vec::new();
        for r in (0..runs).rev() {
            for (d, dev) in plan.devices.iter().enumerate() {
                for (i, node) in dev.nodes.iter().enumerate() {
                    if matches!(node, Node::FlagSet(_)) {
                        continue;
                    }
                    let start = (r * 1_000_000 + 1000 * i + 10 * d) as u64;
                    out.push(ActivityRecord {
                        graph_node_id: ids[d][i],
                        start_ns: start,
                        end_ns: start + 500,
                    });
                }
            }
        }
        (ids, out)
    }

    #[test]
    fn every_schedule_gives_one_span_per_node_and_run_and_a_valid_trace() {
        for kind in ScheduleKind::ALL {
            for tp in [1, 2, 4] {
                for partials in [RsPartials::Read, RsPartials::Push] {
                    let plan = plan(kind, tp, partials);
                    let (ids, recs) = records(&plan, 3);
                    let spans = spans_from_activity(&plan, &ids, &recs, 3)
                        .unwrap_or_else(|e| panic!("{kind:?} tp {tp}: {e}"));
                    for (dev, s) in plan.devices.iter().zip(&spans) {
                        assert_eq!(s.len(), 3 * dev.nodes.len());
                    }
                    let trace = Trace::new(&plan, TraceSource::Cupti, &spans)
                        .unwrap_or_else(|e| panic!("{kind:?} tp {tp}: {e}"));
                    assert_eq!(trace.iterations, 3);
                }
            }
        }
    }

    #[test]
    fn runs_follow_start_order_and_flag_sets_follow_their_copy() {
        let plan = plan(ScheduleKind::AllGatherRotatingA, 2, RsPartials::Read);
        let (ids, recs) = records(&plan, 2);
        let spans = spans_from_activity(&plan, &ids, &recs, 2).expect("spans");
        let dev = &plan.devices[0];
        for s in &spans[0] {
            let node = &dev.nodes[s.node];
            if let Node::FlagSet(_) = node {
                // The latest end among its predecessors (a copy, or a flag set after one).
                let end_of = |n: usize| {
                    spans[0]
                        .iter()
                        .find(|x| x.iteration == s.iteration && x.node == n)
                        .map(|x| x.end_ns)
                };
                let expected = dev
                    .edges
                    .iter()
                    .filter(|e| e.to == s.node)
                    .filter_map(|e| end_of(e.from))
                    .max()
                    .expect("a flag set has a predecessor");
                assert!(expected > (s.iteration * 1_000_000) as u64);
                assert_eq!((s.start_ns, s.end_ns), (expected, expected), "{s:?}");
            } else {
                let start = (s.iteration * 1_000_000 + 1000 * s.node) as u64;
                assert_eq!((s.start_ns, s.end_ns), (start, start + 500), "{s:?}");
            }
        }
    }

    #[test]
    fn a_stage_gemm_waits_until_its_flag_was_set() {
        let plan = plan(ScheduleKind::AllGatherRotatingA, 2, RsPartials::Read);
        let (ids, recs) = records(&plan, 1);
        let spans = spans_from_activity(&plan, &ids, &recs, 1).expect("spans");
        let mut waited = 0;
        for (d, dev) in plan.devices.iter().enumerate() {
            for s in &spans[d] {
                let Node::Gemm(g) = &dev.nodes[s.node] else {
                    continue;
                };
                let Some(flag) = g.waits else {
                    assert_eq!(s.flag_wait, None);
                    continue;
                };
                // The setter: the flag set node storing `flag` (zero-length, after its copy).
                let set = plan
                    .devices
                    .iter()
                    .zip(&spans)
                    .flat_map(|(dv, ss)| ss.iter().map(move |x| (&dv.nodes[x.node], x)))
                    .find(|(n, _)| n.flags_set().contains(&flag))
                    .map(|(_, x)| x.start_ns)
                    .expect("a setter");
                let w = s.flag_wait.expect("an estimated wait");
                assert_eq!(w.start_ns, s.start_ns);
                assert_eq!(w.end_ns, set.clamp(s.start_ns, s.end_ns));
                waited += 1;
            }
        }
        assert!(waited > 0, "the pipelined all-gather's later stages wait");
    }

    #[test]
    fn a_missing_or_extra_record_is_named() {
        let plan = plan(ScheduleKind::ReduceScatterTilingA, 2, RsPartials::Push);
        let (ids, mut recs) = records(&plan, 2);
        let dropped = recs.pop().expect("a record");
        let err = spans_from_activity(&plan, &ids, &recs, 2).expect_err("one record short");
        assert!(
            matches!(err, TraceError::NotOnePerNode { spans: 1, .. }),
            "{err}"
        );
        recs.push(dropped);
        recs.push(dropped);
        let err = spans_from_activity(&plan, &ids, &recs, 2).expect_err("one record extra");
        assert!(
            matches!(err, TraceError::NotOnePerNode { spans: 3, .. }),
            "{err}"
        );
        // Records of nodes that are not the plan's are ignored.
        recs.pop();
        recs.push(ActivityRecord {
            graph_node_id: 999_999,
            start_ns: 0,
            end_ns: 1,
        });
        assert!(spans_from_activity(&plan, &ids, &recs, 2).is_ok());
    }
}
