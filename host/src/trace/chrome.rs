//! The trace as Chrome Trace Event JSON, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open.
//!
//! - one process per device (`pid` = device), named `device d`;
//! - one thread per lane ([`Lane`]: `tid` 1 barrier and waits, 2 stage kernels, 3 copy
//!   engine); events of one lane that overlap (copies of two branches in flight) go to further
//!   threads of the lane (`tid` 13, 23, …: `copy engine #2`, …), so that the slices of one
//!   thread always nest;
//! - one complete (`ph: "X"`) slice per executed node, named after it (`stage 2 gemm`,
//!   `copy from device 3`, `flag 2`, `barrier`, `release wait`, …), with the node, stage and
//!   run in `args`; a kernel's flag wait is a slice nested inside the kernel's (`cat: "wait"`);
//! - a flow arrow (`ph: "s"` → `ph: "f"`, `bp: "e"`) from the event that stores a flag to each
//!   kernel that waited on it in the same run, across devices too.
//!
//! Times (`ts`, `dur`) are microseconds with nanosecond decimals.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::model::{DeviceTrace, Event, EventKind, Lane, Trace};
use crate::schedule::FlagRef;

/// A thread of the JSON: track `index` of a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Track {
    lane: Lane,
    index: usize,
}

impl Track {
    /// Its `tid`: 1, 2, 3 for the lanes' first tracks, then 11, 12, 13, then 21, ….
    fn tid(self) -> u64 {
        let lane = match self.lane {
            Lane::Sync => 1,
            Lane::Kernels => 2,
            Lane::CopyEngine => 3,
        };
        lane + 10 * self.index as u64
    }

    /// Its name: the lane's, numbered from the second track on.
    fn name(self) -> String {
        match self.index {
            0 => self.lane.name().into(),
            i => format!("{} #{}", self.lane.name(), i + 1),
        }
    }
}

/// The track of each of `dev`'s events, in their order (by start): the first track of the
/// event's lane whose last event has ended by the event's start.
fn tracks(dev: &DeviceTrace) -> Vec<Track> {
    let mut ends: HashMap<Lane, Vec<u64>> = HashMap::new();
    dev.events
        .iter()
        .map(|e| {
            let ends = ends.entry(e.lane()).or_default();
            let index = match ends.iter().position(|&end| end <= e.span.start_ns) {
                Some(i) => i,
                None => {
                    ends.push(0);
                    ends.len() - 1
                }
            };
            ends[index] = e.span.end_ns;
            Track {
                lane: e.lane(),
                index,
            }
        })
        .collect()
}

/// Nanoseconds as the format's microseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The slice's `cat`.
fn category(e: &Event) -> &'static str {
    match e.kind {
        EventKind::Barrier | EventKind::ReleaseWait => "sync",
        EventKind::Gemm => "gemm",
        EventKind::Reduce => "reduce",
        EventKind::Copy { .. } => "copy",
        EventKind::FlagSet { .. } => "flag",
    }
}

/// The slice's `args`.
fn args(e: &Event) -> Value {
    let mut args = json!({"iteration": e.iteration, "node": e.node, "stage": e.stage});
    match e.kind {
        EventKind::Copy { from, to, bytes } => {
            args["from_device"] = json!(from);
            args["to_device"] = json!(to);
            args["bytes"] = json!(bytes);
            if e.span.len_ns() > 0 {
                args["gb_per_s"] = json!(bytes as f64 / e.span.len_ns() as f64);
            }
        }
        EventKind::FlagSet { flag, .. } => {
            args["flag"] = json!({"device": flag.device, "index": flag.index});
        }
        _ => {}
    }
    if let Some(w) = e.flag_wait {
        args["flag_wait_ns"] = json!(w.len_ns());
    }
    if let Some(w) = e.deferred_wait {
        args["deferred_wait_ns"] = json!(w.len_ns());
    }
    args
}

impl Trace {
    /// The trace as a Chrome Trace Event JSON object (module documentation).
    #[must_use]
    pub fn to_chrome_json(&self) -> Value {
        let mut events = Vec::new();
        let tracks: Vec<Vec<Track>> = self.devices.iter().map(tracks).collect();
        for (dev, tracks) in self.devices.iter().zip(&tracks) {
            let pid = dev.device;
            events.push(json!({"ph": "M", "pid": pid, "name": "process_name",
                "args": {"name": format!("device {pid}")}}));
            events.push(json!({"ph": "M", "pid": pid, "name": "process_sort_index",
                "args": {"sort_index": pid}}));
            let mut named: Vec<Track> = Lane::ALL
                .iter()
                .map(|&lane| Track { lane, index: 0 })
                .collect();
            for &t in tracks {
                if !named.contains(&t) {
                    named.push(t);
                }
            }
            for t in named {
                events.push(json!({"ph": "M", "pid": pid, "tid": t.tid(),
                    "name": "thread_name", "args": {"name": t.name()}}));
                events.push(json!({"ph": "M", "pid": pid, "tid": t.tid(),
                    "name": "thread_sort_index", "args": {"sort_index": t.tid()}}));
            }
            for (e, track) in dev.events.iter().zip(tracks) {
                let tid = track.tid();
                events.push(
                    json!({"ph": "X", "pid": pid, "tid": tid, "name": e.name(pid),
                    "cat": category(e), "ts": us(e.span.start_ns), "dur": us(e.span.len_ns()),
                    "args": args(e)}),
                );
                if let Some(w) = e.flag_wait {
                    let flags: Vec<String> = e
                        .awaits
                        .iter()
                        .map(|f| format!("flag {} of device {}", f.index, f.device))
                        .collect();
                    events.push(json!({"ph": "X", "pid": pid, "tid": tid,
                        "name": format!("wait {}", flags.join(", ")), "cat": "wait",
                        "ts": us(w.start_ns), "dur": us(w.len_ns()),
                        "args": {"iteration": e.iteration, "node": e.node}}));
                }
                if let Some(w) = e.deferred_wait {
                    events.push(json!({"ph": "X", "pid": pid, "tid": tid,
                        "name": "wait deferred predecessor", "cat": "wait",
                        "ts": us(w.start_ns), "dur": us(w.len_ns()),
                        "args": {"iteration": e.iteration, "node": e.node}}));
                }
            }
        }
        events.extend(self.flows(&tracks));
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "schedule": self.schedule.cli_name(),
                "tp": self.tp,
                "problem": self.problem.to_string(),
                "source": self.source.name(),
                "iterations": self.iterations,
            },
        })
    }

    /// Flow arrows: from the event that stores a flag to every kernel that waited on it in
    /// the same run; `tracks` are every device's events' tracks.
    fn flows(&self, tracks: &[Vec<Track>]) -> Vec<Value> {
        let events = || {
            self.devices.iter().zip(tracks).flat_map(|(d, tracks)| {
                d.events
                    .iter()
                    .zip(tracks)
                    .map(move |(e, t)| (d.device, e, t.tid()))
            })
        };
        let mut setters: HashMap<(usize, FlagRef), (usize, &Event, u64)> = HashMap::new();
        for (device, e, tid) in events() {
            for &flag in &e.sets {
                setters
                    .entry((e.iteration, flag))
                    .or_insert((device, e, tid));
            }
        }
        let mut flows = Vec::new();
        let waiters =
            events().filter(|(_, e, _)| matches!(e.kind, EventKind::Gemm | EventKind::Reduce));
        for (device, waiter, waiter_tid) in waiters {
            for &flag in &waiter.awaits {
                let Some(&(from, setter, setter_tid)) = setters.get(&(waiter.iteration, flag))
                else {
                    continue;
                };
                let id = flows.len() / 2;
                let name = format!("flag {} of device {}", flag.index, flag.device);
                let arrives = waiter.flag_wait.map_or(waiter.span.start_ns, |w| w.end_ns);
                flows.push(json!({"ph": "s", "id": id, "pid": from, "tid": setter_tid,
                    "ts": us(setter.sets_flags_at_ns()), "name": name, "cat": "flag"}));
                flows.push(json!({"ph": "f", "bp": "e", "id": id, "pid": device,
                    "tid": waiter_tid, "ts": us(arrives), "name": name, "cat": "flag"}));
            }
        }
        flows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;
    use crate::plan::{Plan, PlanOptions, RsPartials};
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;
    use crate::trace::tests::{synthetic, traced};
    use crate::trace::{NodeSpan, TraceSource};

    /// Every schedule at TP = 3, two runs; the reduce-scatters also with pushed partials.
    fn traces() -> Vec<(String, Plan, Trace)> {
        let mut traces: Vec<(String, Plan, Trace)> = ScheduleKind::ALL
            .iter()
            .map(|&kind| {
                let (plan, trace) = synthetic(kind, 3, 2);
                (kind.to_string(), plan, trace)
            })
            .collect();
        for kind in [
            ScheduleKind::ReduceScatterTilingA,
            ScheduleKind::ReduceScatterTilingB,
        ] {
            let options = PlanOptions {
                rs_partials: RsPartials::Push,
            };
            let problem = Problem::new(48, 48, 48).with_dtype(Dtype::F16);
            let plan =
                Plan::build_with(kind, problem, 3, options).unwrap_or_else(|e| panic!("{e}"));
            let trace = traced(&plan, 2);
            traces.push((format!("{kind} push"), plan, trace));
        }
        traces
    }

    /// Two copies in flight at once go to two threads of the copy engine's lane.
    #[test]
    fn overlapping_events_of_a_lane_get_their_own_threads() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(48, 48, 48),
            3,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Nodes: 0 barrier, 1 copy, 2 flag, 3 release, 4 copy, 5 flag, 6 release, 7..9 gemms,
        // 10 release wait. The second copy starts before the first ends.
        let times = [
            (0, 10),
            (10, 50),
            (50, 51),
            (51, 52),
            (30, 80),
            (80, 81),
            (81, 82),
            (0, 40),
            (52, 90),
            (90, 120),
            (120, 130),
        ];
        let spans: Vec<NodeSpan> = times
            .iter()
            .enumerate()
            .map(|(node, &(s, e))| NodeSpan {
                iteration: 0,
                node,
                start_ns: s,
                end_ns: e,
                flag_wait: None,
                deferred_wait: None,
            })
            .collect();
        let spans = vec![spans; 3];
        let trace =
            Trace::new(&plan, TraceSource::CpuExecutor, &spans).unwrap_or_else(|e| panic!("{e}"));
        let dev = &trace.devices[0];
        let tids: Vec<(usize, u64)> = dev
            .events
            .iter()
            .zip(tracks(dev))
            .map(|(e, t)| (e.node, t.tid()))
            .collect();
        let tid_of = |node| tids.iter().find(|(n, _)| *n == node).map(|(_, t)| *t);
        assert_eq!(tid_of(1), Some(3));
        assert_eq!(tid_of(4), Some(13));
        // The flag sets after the first copy fit back into the first thread.
        assert_eq!(tid_of(2), Some(3));
        assert_eq!(tid_of(5), Some(3));
        let json = trace.to_chrome_json();
        let named = json["traceEvents"].as_array().map_or(0, |events| {
            events
                .iter()
                .filter(|e| e["name"] == "thread_name" && e["args"]["name"] == "copy engine #2")
                .count()
        });
        assert_eq!(named, 3);
    }

    /// Every event has the fields its phase needs, one `X` slice per executed node (plus one
    /// per flag wait), slices of one thread nest, and every flow has both ends.
    #[test]
    fn the_json_is_trace_event_format_with_one_slice_per_node() {
        for (what, plan, trace) in traces() {
            let kind = &what;
            let text =
                serde_json::to_string(&trace.to_chrome_json()).unwrap_or_else(|e| panic!("{e}"));
            let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
            let events = parsed["traceEvents"]
                .as_array()
                .unwrap_or_else(|| panic!("{kind}: no traceEvents"));
            let phase = |p: &'static str| events.iter().filter(move |e| e["ph"] == p);
            for e in events {
                assert!(e["name"].is_string() && e["pid"].is_u64(), "{kind}: {e}");
                match e["ph"].as_str() {
                    Some("X") => {
                        assert!(e["tid"].is_u64() && e["cat"].is_string(), "{e}");
                        assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
                        assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
                    }
                    Some("M") => assert!(e["args"].is_object(), "{e}"),
                    Some("s" | "f") => assert!(e["id"].is_u64() && e["ts"].is_f64(), "{e}"),
                    other => panic!("{kind}: unexpected phase {other:?}"),
                }
            }
            let nodes: usize = plan.devices.iter().map(|d| d.nodes.len()).sum();
            let slices = phase("X").filter(|e| e["cat"] != "wait").count();
            assert_eq!(slices, nodes * trace.iterations, "{kind}");
            let waits = trace
                .devices
                .iter()
                .flat_map(|d| &d.events)
                .flat_map(Event::waits)
                .count();
            assert_eq!(phase("X").count() - slices, waits, "{kind}");
            // One process per device, three named threads each.
            let names = |n: &'static str| phase("M").filter(move |e| e["name"] == n).count();
            assert_eq!(names("process_name"), plan.tp, "{kind}");
            assert!(names("thread_name") >= 3 * plan.tp, "{kind}");
            // Slices of one (pid, tid) nest: sorted by start, each ends before the next
            // starts or encloses it (checked on the nanoseconds the JSON is written from).
            for dev in &trace.devices {
                let tracks = tracks(dev);
                let mut tids: Vec<u64> = tracks.iter().map(|t| t.tid()).collect();
                tids.sort_unstable();
                tids.dedup();
                for tid in tids {
                    let mut spans: Vec<(u64, u64)> = dev
                        .events
                        .iter()
                        .zip(&tracks)
                        .filter(|(_, t)| t.tid() == tid)
                        .flat_map(|(e, _)| [Some(e.span), e.flag_wait, e.deferred_wait])
                        .flatten()
                        .map(|i| (i.start_ns, i.end_ns))
                        .collect();
                    spans.sort_by_key(|&(s, e)| (s, std::cmp::Reverse(e)));
                    let mut open: Vec<u64> = Vec::new();
                    for (s, e) in spans {
                        while open.last().is_some_and(|&end| end <= s) {
                            open.pop();
                        }
                        if let Some(&end) = open.last() {
                            assert!(e <= end, "{what}: device {} tid {tid} overlaps", dev.device);
                        }
                        open.push(e);
                    }
                }
            }
            // Flows come in pairs with the same id; every waiting kernel gets one per flag
            // its peers or copy chain set.
            let starts = phase("s").count();
            assert_eq!(starts, phase("f").count(), "{kind}");
            let awaited: usize = trace
                .devices
                .iter()
                .flat_map(|d| &d.events)
                .filter(|e| matches!(e.kind, EventKind::Gemm | EventKind::Reduce))
                .map(|e| e.awaits.len())
                .sum();
            assert_eq!(starts, awaited, "{kind}");
        }
    }
}
