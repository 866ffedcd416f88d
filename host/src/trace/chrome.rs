//! The trace as Chrome Trace Event JSON, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open.
//!
//! - one process per device (`pid` = device), named `device d`;
//! - one thread per lane ([`Lane`]: `tid` 1 barrier and waits, 2 stage kernels, 3 copy
//!   engine), so that the slices of one thread never overlap;
//! - one complete (`ph: "X"`) slice per executed node, named after it (`stage 2 gemm`,
//!   `copy from device 3`, `flag 2`, `barrier`, `release wait`, …), with the node, stage and
//!   run in `args`; a kernel's flag wait is a slice nested inside the kernel's (`cat: "wait"`);
//! - a flow arrow (`ph: "s"` → `ph: "f"`, `bp: "e"`) from the event that stores a flag to each
//!   kernel that waited on it in the same run, across devices too.
//!
//! Times (`ts`, `dur`) are microseconds with nanosecond decimals.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::model::{Event, EventKind, Lane, Trace};
use crate::schedule::FlagRef;

/// The thread id of a lane.
fn tid(lane: Lane) -> u64 {
    match lane {
        Lane::Sync => 1,
        Lane::Kernels => 2,
        Lane::CopyEngine => 3,
    }
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
        EventKind::Copy { from, bytes } => {
            args["from_device"] = json!(from);
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
    args
}

impl Trace {
    /// The trace as a Chrome Trace Event JSON object (module documentation).
    #[must_use]
    pub fn to_chrome_json(&self) -> Value {
        let mut events = Vec::new();
        for dev in &self.devices {
            let pid = dev.device;
            events.push(json!({"ph": "M", "pid": pid, "name": "process_name",
                "args": {"name": format!("device {pid}")}}));
            events.push(json!({"ph": "M", "pid": pid, "name": "process_sort_index",
                "args": {"sort_index": pid}}));
            for lane in Lane::ALL {
                events.push(json!({"ph": "M", "pid": pid, "tid": tid(lane),
                    "name": "thread_name", "args": {"name": lane.name()}}));
                events.push(json!({"ph": "M", "pid": pid, "tid": tid(lane),
                    "name": "thread_sort_index", "args": {"sort_index": tid(lane)}}));
            }
            for e in &dev.events {
                let tid = tid(e.lane());
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
            }
        }
        events.extend(self.flows());
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
    /// the same run.
    fn flows(&self) -> Vec<Value> {
        let mut setters: HashMap<(usize, FlagRef), (usize, &Event)> = HashMap::new();
        for d in &self.devices {
            for e in &d.events {
                for &flag in &e.sets {
                    setters.entry((e.iteration, flag)).or_insert((d.device, e));
                }
            }
        }
        let mut flows = Vec::new();
        let waiters = self.devices.iter().flat_map(|d| {
            d.events
                .iter()
                .filter(|e| matches!(e.kind, EventKind::Gemm | EventKind::Reduce))
                .map(move |e| (d.device, e))
        });
        for (device, waiter) in waiters {
            for &flag in &waiter.awaits {
                let Some(&(from, setter)) = setters.get(&(waiter.iteration, flag)) else {
                    continue;
                };
                let id = flows.len() / 2;
                let name = format!("flag {} of device {}", flag.index, flag.device);
                let arrives = waiter.flag_wait.map_or(waiter.span.start_ns, |w| w.end_ns);
                flows.push(
                    json!({"ph": "s", "id": id, "pid": from, "tid": tid(setter.lane()),
                    "ts": us(setter.sets_flags_at_ns()), "name": name, "cat": "flag"}),
                );
                flows.push(json!({"ph": "f", "bp": "e", "id": id, "pid": device,
                    "tid": tid(waiter.lane()), "ts": us(arrives), "name": name, "cat": "flag"}));
            }
        }
        flows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ScheduleKind;
    use crate::trace::tests::synthetic;

    /// Every event has the fields its phase needs, one `X` slice per executed node (plus one
    /// per flag wait), slices of one thread nest, and every flow has both ends.
    #[test]
    fn the_json_is_trace_event_format_with_one_slice_per_node() {
        for kind in ScheduleKind::ALL {
            let (plan, trace) = synthetic(kind, 3, 2);
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
                .filter(|e| e.flag_wait.is_some())
                .count();
            assert_eq!(phase("X").count() - slices, waits, "{kind}");
            // One process per device, three named threads each.
            let names = |n: &'static str| phase("M").filter(move |e| e["name"] == n).count();
            assert_eq!(names("process_name"), plan.tp, "{kind}");
            assert_eq!(names("thread_name"), 3 * plan.tp, "{kind}");
            // Slices of one (pid, tid) nest: sorted by start, each ends before the next
            // starts or encloses it (checked on the nanoseconds the JSON is written from).
            for dev in &trace.devices {
                for lane in Lane::ALL {
                    let mut spans: Vec<(u64, u64)> = dev
                        .events
                        .iter()
                        .filter(|e| e.lane() == lane)
                        .flat_map(|e| [Some(e.span), e.flag_wait])
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
                            assert!(e <= end, "{kind}: device {} {lane:?} overlaps", dev.device);
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
