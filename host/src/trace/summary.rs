//! Per device and stage: where the time went (definitions in the [module
//! documentation](super)).

use std::fmt::Write as _;

use serde::Serialize;

use super::interval::{Interval, measure, measure_outside};
use super::model::{DeviceTrace, Event, EventKind, Trace};

/// The summary of a trace: totals over every traced run, in nanoseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The schedule's CLI name.
    pub schedule: &'static str,
    /// Number of devices.
    pub tp: usize,
    /// The problem, as `M=… N=… K=… dtype`.
    pub problem: String,
    /// Where the timestamps come from.
    pub source: &'static str,
    /// Runs traced (every total below covers all of them).
    pub iterations: usize,
    /// Per device, index = device.
    pub devices: Vec<DeviceSummary>,
}

/// One device's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceSummary {
    /// The device.
    pub device: usize,
    /// From its first event's start to its last event's end.
    pub wall_ns: u64,
    /// Time in which a stage GEMM ran its main loop (after its flag wait).
    pub compute_ns: u64,
    /// Time in which a peer copy ran.
    pub copy_ns: u64,
    /// Time in which the device waited: the barrier, kernels' flag waits, the release wait.
    pub wait_ns: u64,
    /// Time in which the barrier ran.
    pub barrier_ns: u64,
    /// Time in which the reduction ran.
    pub reduce_ns: u64,
    /// Time in which the release wait ran.
    pub release_wait_ns: u64,
    /// Time in which communication or a wait ran and no GEMM computed.
    pub exposed_ns: u64,
    /// Time in which nothing ran: `wall − compute − exposed`.
    pub idle_ns: u64,
    /// Bytes copied.
    pub copy_bytes: usize,
    /// Per stage, index = stage.
    pub stages: Vec<StageSummary>,
}

/// One stage's totals on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageSummary {
    /// The stage.
    pub stage: usize,
    /// The stage GEMM's main loop.
    pub gemm_ns: u64,
    /// The stage GEMM's flag wait (and the reduction's, for the single-stage reduce-scatter).
    pub flag_wait_ns: u64,
    /// The device's copies tagged with the stage: an all-gather's pulls feed this device's
    /// stage GEMM; a reduce-scatter's pushes (device d's stage-t partial sum into its right
    /// neighbour's workspace) feed the neighbour's stage t.
    pub copy_ns: u64,
    /// Their bytes.
    pub copy_bytes: usize,
    /// The stage's copies, flag sets, flag waits and reduction while no GEMM computed.
    pub exposed_ns: u64,
}

/// The part of an event that is communication or waiting: all of it but a GEMM's main loop
/// (the reduction reads the peers' partial sums: all of it).
fn communication(e: &Event) -> Option<Interval> {
    match e.kind {
        EventKind::Gemm => e.flag_wait,
        _ => Some(e.span),
    }
}

impl DeviceSummary {
    /// The totals of one device's events.
    #[must_use]
    pub fn of(dev: &DeviceTrace) -> DeviceSummary {
        let events = &dev.events;
        let spans = |keep: fn(&Event) -> bool| {
            events
                .iter()
                .filter(move |e| keep(e))
                .map(|e| e.span)
                .collect::<Vec<_>>()
        };
        let compute: Vec<Interval> = events.iter().filter_map(Event::gemm_compute).collect();
        // A deferred wait (stage 0 waiting for the barrier) belongs to the run, like the
        // barrier: it counts here, not in its stage.
        let comm: Vec<Interval> = events
            .iter()
            .filter_map(communication)
            .chain(events.iter().filter_map(|e| e.deferred_wait))
            .collect();
        let waits = spans(|e| matches!(e.kind, EventKind::Barrier | EventKind::ReleaseWait))
            .into_iter()
            .chain(events.iter().flat_map(Event::waits));
        let wall = match (events.first(), events.iter().map(|e| e.span.end_ns).max()) {
            (Some(first), Some(end)) => end - first.span.start_ns,
            _ => 0,
        };
        let compute_ns = measure(compute.iter().copied());
        let exposed_ns = measure_outside(comm, compute.iter().copied());
        let stages = (0..=events.iter().map(|e| e.stage).max().unwrap_or(0))
            .map(|stage| stage_summary(events, stage, &compute))
            .collect();
        DeviceSummary {
            device: dev.device,
            wall_ns: wall,
            compute_ns,
            copy_ns: measure(spans(|e| matches!(e.kind, EventKind::Copy { .. }))),
            wait_ns: measure(waits),
            barrier_ns: measure(spans(|e| e.kind == EventKind::Barrier)),
            reduce_ns: measure(spans(|e| e.kind == EventKind::Reduce)),
            release_wait_ns: measure(spans(|e| e.kind == EventKind::ReleaseWait)),
            exposed_ns,
            idle_ns: wall.saturating_sub(compute_ns + exposed_ns),
            copy_bytes: copy_bytes(events.iter()),
            stages,
        }
    }
}

/// Bytes moved by the copies among `events`.
fn copy_bytes<'a>(events: impl Iterator<Item = &'a Event>) -> usize {
    events
        .map(|e| match e.kind {
            EventKind::Copy { bytes, .. } => bytes,
            _ => 0,
        })
        .sum()
}

/// Stage `stage`'s totals; `compute` is the device's GEMM main loops.
fn stage_summary(events: &[Event], stage: usize, compute: &[Interval]) -> StageSummary {
    // The barrier and the release wait belong to the run, not to stage 0.
    let of_stage = events.iter().filter(|e| {
        e.stage == stage && !matches!(e.kind, EventKind::Barrier | EventKind::ReleaseWait)
    });
    let copies = of_stage
        .clone()
        .filter(|e| matches!(e.kind, EventKind::Copy { .. }));
    StageSummary {
        stage,
        gemm_ns: measure(of_stage.clone().filter_map(Event::gemm_compute)),
        flag_wait_ns: measure(of_stage.clone().filter_map(|e| e.flag_wait)),
        copy_ns: measure(copies.clone().map(|e| e.span)),
        copy_bytes: copy_bytes(copies),
        exposed_ns: measure_outside(of_stage.filter_map(communication), compute.iter().copied()),
    }
}

impl Summary {
    /// The summary of `trace`.
    #[must_use]
    pub fn of(trace: &Trace) -> Summary {
        Summary {
            schedule: trace.schedule.cli_name(),
            tp: trace.tp,
            problem: trace.problem.to_string(),
            source: trace.source.name(),
            iterations: trace.iterations,
            devices: trace.devices.iter().map(DeviceSummary::of).collect(),
        }
    }

    /// A table per device: the totals divided by the number of runs, in microseconds.
    #[must_use]
    pub fn render_text(&self) -> String {
        let runs = self.iterations.max(1) as f64;
        let us = |ns: u64| ns as f64 / runs / 1000.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "trace of {} at TP={}, {}, {}: {} run(s); µs per run",
            self.schedule, self.tp, self.problem, self.source, self.iterations
        );
        for d in &self.devices {
            let _ = writeln!(
                out,
                "device {}: wall {:.1}  compute {:.1}  copy {:.1}  wait {:.1} (barrier {:.1}, \
                 release {:.1})  reduce {:.1}  exposed {:.1}  idle {:.1}",
                d.device,
                us(d.wall_ns),
                us(d.compute_ns),
                us(d.copy_ns),
                us(d.wait_ns),
                us(d.barrier_ns),
                us(d.release_wait_ns),
                us(d.reduce_ns),
                us(d.exposed_ns),
                us(d.idle_ns)
            );
            let _ = writeln!(
                out,
                "  {:>5} {:>10} {:>10} {:>10} {:>12} {:>10}",
                "stage", "gemm", "flag wait", "copy", "copy bytes", "exposed"
            );
            for s in &d.stages {
                let _ = writeln!(
                    out,
                    "  {:>5} {:>10.1} {:>10.1} {:>10.1} {:>12} {:>10.1}",
                    s.stage,
                    us(s.gemm_ns),
                    us(s.flag_wait_ns),
                    us(s.copy_ns),
                    s.copy_bytes as f64 / runs,
                    us(s.exposed_ns)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;
    use crate::trace::tests::synthetic;
    use crate::trace::{NodeSpan, TraceSource};

    /// A hand-timed TP = 2 pipelined all-gather: the numbers follow from the definitions.
    #[test]
    fn hand_timed_trace_gives_the_defined_numbers() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            2,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Device nodes: 0 barrier, 1 copy (stage 1), 2 flag 1, 3 release flag, 4 gemm 0,
        // 5 gemm 1 (waits flag 1), 6 release wait.
        let names: Vec<&str> = plan.devices[0].nodes.iter().map(|n| n.name()).collect();
        assert_eq!(
            names,
            ["barrier", "copy", "flag", "flag", "gemm", "gemm", "release"]
        );
        let span = |node, s: u64, e: u64, wait: Option<(u64, u64)>| NodeSpan {
            iteration: 0,
            node,
            start_ns: s,
            end_ns: e,
            flag_wait: wait.map(|(a, b)| Interval::new(a, b)),
            deferred_wait: None,
        };
        // barrier [0,10); copy [10,50); flags [50,51), [51,52); gemm 0 [5,40) (beside the
        // barrier); gemm 1 [40,100) waiting [40,52); release wait [100,110).
        let device = vec![
            span(0, 0, 10, None),
            span(1, 10, 50, None),
            span(2, 50, 51, None),
            span(3, 51, 52, None),
            span(4, 5, 40, None),
            span(5, 40, 100, Some((40, 52))),
            span(6, 100, 110, None),
        ];
        let trace = Trace::new(&plan, TraceSource::CpuExecutor, &[device.clone(), device])
            .unwrap_or_else(|e| panic!("{e}"));
        let d = DeviceSummary::of(&trace.devices[0]);
        assert_eq!(d.wall_ns, 110);
        // GEMM main loops: [5,40) and [52,100).
        assert_eq!(d.compute_ns, 35 + 48);
        assert_eq!(d.copy_ns, 40);
        assert_eq!(d.copy_bytes, 32 * 64 * 2);
        // Barrier [0,10), flag wait [40,52), release wait [100,110).
        assert_eq!(d.wait_ns, 10 + 12 + 10);
        assert_eq!((d.barrier_ns, d.release_wait_ns), (10, 10));
        // Communication [0,52) ∪ [100,110) outside [5,40) ∪ [52,100): [0,5), [40,52), [100,110).
        assert_eq!(d.exposed_ns, 5 + 12 + 10);
        assert_eq!(d.idle_ns, 0);
        let s1 = &d.stages[1];
        assert_eq!((s1.gemm_ns, s1.flag_wait_ns, s1.copy_ns), (48, 12, 40));
        // Stage 1's copy [10,50), flags [50,52) and wait [40,52) outside the main loops.
        assert_eq!(s1.exposed_ns, 12);
        assert_eq!(d.stages[0].exposed_ns, 0);
    }

    /// On recorded traces of every schedule: compute + exposed + idle = wall, the parts fit
    /// into the wall, and the stages add up to their device.
    #[test]
    fn recorded_traces_add_up() {
        for kind in ScheduleKind::ALL {
            for tp in [1, 2, 4] {
                let (_, trace) = synthetic(kind, tp, 2);
                let summary = Summary::of(&trace);
                assert_eq!(summary.devices.len(), tp);
                for d in &summary.devices {
                    let what = format!("{kind} TP={tp} device {}", d.device);
                    assert_eq!(d.compute_ns + d.exposed_ns + d.idle_ns, d.wall_ns, "{what}");
                    for part in [d.copy_ns, d.wait_ns, d.reduce_ns, d.compute_ns] {
                        assert!(part <= d.wall_ns, "{what}");
                    }
                    assert!(d.barrier_ns + d.release_wait_ns <= d.wait_ns, "{what}");
                    let stage = |f: fn(&StageSummary) -> u64| d.stages.iter().map(f).sum::<u64>();
                    // A device's GEMMs run one after the other, its copies too.
                    assert_eq!(stage(|s| s.gemm_ns), d.compute_ns, "{what}");
                    assert_eq!(stage(|s| s.copy_ns), d.copy_ns, "{what}");
                    assert_eq!(
                        d.stages.iter().map(|s| s.copy_bytes).sum::<usize>(),
                        d.copy_bytes,
                        "{what}"
                    );
                    // Stages' communication may overlap (a copy beside the previous
                    // stage's wait), so each fits into the device's, not their sum.
                    assert!(
                        d.stages.iter().all(|s| s.exposed_ns <= d.exposed_ns),
                        "{what}"
                    );
                    assert!(d.compute_ns > 0, "{what}");
                }
                let text = summary.render_text();
                assert_eq!(
                    text.lines().count(),
                    1 + tp * 2
                        + summary
                            .devices
                            .iter()
                            .map(|d| d.stages.len())
                            .sum::<usize>()
                );
            }
        }
    }
}
