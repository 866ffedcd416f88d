//! The CPU executor's recorder: node spans stamped with the host's monotonic clock, which
//! every device's threads share.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use super::interval::Interval;
use super::model::NodeSpan;

/// Collects every device's node spans during a traced CPU run. Each device's list has its own
/// lock, taken once per node after the node has ended (the branches of one device's DAG run on
/// several threads).
#[derive(Debug)]
pub(crate) struct Recorder {
    origin: Instant,
    devices: Vec<Mutex<Vec<NodeSpan>>>,
}

impl Recorder {
    /// A recorder for `tp` devices whose clock starts now.
    pub(crate) fn new(tp: usize) -> Self {
        Recorder {
            origin: Instant::now(),
            devices: (0..tp).map(|_| Mutex::default()).collect(),
        }
    }

    /// Nanoseconds from the recorder's start to `t`.
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Node `node` of `device` ran from `start` to `end` in run `iteration`; a kernel's prologue
    /// waited for its flags from `flag_wait.0` to `flag_wait.1`; a node with a deferred
    /// predecessor waited for it, after its own work, from `deferred_wait.0` to
    /// `deferred_wait.1`.
    pub(crate) fn record(
        &self,
        device: usize,
        iteration: usize,
        node: usize,
        (start, end): (Instant, Instant),
        flag_wait: Option<(Instant, Instant)>,
        deferred_wait: Option<(Instant, Instant)>,
    ) {
        let interval = |(s, e)| Interval::new(self.ns(s), self.ns(e));
        let span = NodeSpan {
            iteration,
            node,
            start_ns: self.ns(start),
            end_ns: self.ns(end),
            flag_wait: flag_wait.map(interval),
            deferred_wait: deferred_wait.map(interval),
        };
        if let Some(list) = self.devices.get(device) {
            list.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(span);
        }
    }

    /// Every device's spans, index = device.
    pub(crate) fn into_spans(self) -> Vec<Vec<NodeSpan>> {
        self.devices
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }
}
