//! Running the plan: one thread per device replays its DAG (one more per extra branch), for
//! plain, traced and sequenced runs, and the error that names the cause when a run fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
#[cfg(feature = "testing")]
use std::time::Duration;
use std::time::Instant;

use super::node::Context;
use super::wait::{WaitFailure, Waiter};
use super::{CpuExecutor, ExecError};
use crate::dtype::Element;
use crate::plan::{DeviceInputs, EdgeKind};
use crate::schedule::BufferKind;
use crate::trace::{Trace, TraceSource, record::Recorder};

impl<T: Element> CpuExecutor<T> {
    /// Runs the plan `iters` times back to back on every device.
    pub fn run(&self, iters: usize) -> Result<(), ExecError> {
        self.run_with_progress(iters, &|_| {})
    }

    /// As [`Self::run`], calling `progress(i)` on device 0 after its i-th iteration (1-based).
    pub fn run_with_progress(
        &self,
        iters: usize,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<(), ExecError> {
        self.run_devices(
            iters,
            &|_, _| {},
            &|d, i| {
                if d == 0 {
                    progress(i + 1);
                }
            },
            None,
        )
    }

    /// As [`Self::run`], recording per device when each node started and ended and, for a
    /// kernel with flags to wait on, when its prologue waited for them: the trace of the
    /// `iters` runs, on the host's monotonic clock shared by every device.
    pub fn run_traced(&self, iters: usize) -> Result<Trace, ExecError> {
        let recorder = Recorder::new(self.plan.tp);
        self.run_devices(iters, &|_, _| {}, &|_, _| {}, Some(&recorder))?;
        Ok(Trace::new(
            &self.plan,
            TraceSource::CpuExecutor,
            &recorder.into_spans(),
        )?)
    }

    /// Runs the plan once per entry of `inputs` (one shard set per device each), back to
    /// back on every device, like a model calling the layer on new activations: device d
    /// fills its D with NaN and loads its shards of run i right after its own run i − 1 has
    /// ended, without waiting for the other devices (the plan's ordering contract for input
    /// shards, see [`crate::plan`]). Returns every run's output shards, `outputs[i][d]`.
    pub fn run_sequence(
        &self,
        inputs: &[Vec<DeviceInputs<T>>],
    ) -> Result<Vec<Vec<Vec<T>>>, ExecError> {
        for shards in inputs {
            self.check_inputs(shards)?;
        }
        let outputs: Vec<Vec<std::sync::Mutex<Vec<T>>>> = inputs
            .iter()
            .map(|_| (0..self.plan.tp).map(|_| Default::default()).collect())
            .collect();
        let before = |d: usize, i: usize| {
            let mem = &self.memory[d];
            mem.fill(BufferKind::D, T::nan());
            mem.store_inputs(&inputs[i][d]);
        };
        let after = |d: usize, i: usize| {
            let d_shard = self.memory[d].read(BufferKind::D).clone();
            *outputs[i][d]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = d_shard;
        };
        self.run_devices(inputs.len(), &before, &after, None)?;
        Ok(outputs
            .into_iter()
            .map(|run| {
                run.into_iter()
                    .map(|m| {
                        m.into_inner()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                    })
                    .collect()
            })
            .collect())
    }

    /// Every device's thread replays its DAG `iters` times, calling `before(d, i)` and
    /// `after(d, i)` around its i-th replay (0-based), in its own order; `trace` records the
    /// nodes' spans.
    fn run_devices(
        &self,
        iters: usize,
        before: &(dyn Fn(usize, usize) + Sync),
        after: &(dyn Fn(usize, usize) + Sync),
        trace: Option<&Recorder>,
    ) -> Result<(), ExecError> {
        let abort = AtomicBool::new(false);
        let waiter = Waiter {
            timeout: self.timeout,
            abort: &abort,
        };
        let ctx = Context {
            memory: &self.memory,
            exclusive: &self.exclusive,
            waiter,
            trace,
        };
        let results: Vec<Result<(), ExecError>> = thread::scope(|s| {
            let handles: Vec<_> = (0..self.plan.tp)
                .map(|d| {
                    let ctx = &ctx;
                    let abort = &abort;
                    s.spawn(move || {
                        for i in 0..iters {
                            before(d, i);
                            self.run_device(ctx, d, i)
                                .inspect_err(|_| abort.store(true, Ordering::Relaxed))?;
                            after(d, i);
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(device, h)| h.join().unwrap_or(Err(ExecError::Panicked { device })))
                .collect()
        });
        first_error(results)
    }

    /// Replay `iteration` of device `d`'s DAG: chain 0 on this thread, the others on scoped
    /// threads.
    fn run_device(
        &self,
        ctx: &Context<'_, T>,
        d: usize,
        iteration: usize,
    ) -> Result<(), ExecError> {
        let dev = &self.plan.devices[d];
        let done: Vec<AtomicBool> = dev.nodes.iter().map(|_| AtomicBool::new(false)).collect();
        let wait_for = |n: usize, pred: usize| {
            let flag = &done[pred];
            ctx.waiter
                .until(|| flag.load(Ordering::Acquire))
                .map_err(|e| match e {
                    WaitFailure::Aborted => ExecError::Aborted,
                    WaitFailure::TimedOut { since } => ExecError::DependencyTimeout {
                        since,
                        device: d,
                        node: n,
                        pred,
                        timeout: self.timeout,
                    },
                })
        };
        let run_chain = |chain: &[usize]| -> Result<(), ExecError> {
            for &n in chain {
                let deferred = |kind: &EdgeKind| *kind == EdgeKind::ProgrammaticDeferred;
                for (pred, _) in dev.predecessors(n).filter(|(_, k)| !deferred(k)) {
                    wait_for(n, pred)?;
                }
                #[cfg(feature = "testing")]
                self.injected_delay(d, n);
                let start = ctx.trace.map(|_| Instant::now());
                let flag_wait = ctx
                    .run(d, &dev.nodes[n])
                    .inspect_err(|_| ctx.waiter.abort.store(true, Ordering::Relaxed))?;
                // A deferred predecessor is waited for at the end, as the kernel does; the
                // trace keeps that wait apart from the node's own work.
                let mut deferred_wait = None;
                for (pred, _) in dev.predecessors(n).filter(|(_, k)| deferred(k)) {
                    let from = ctx.trace.map(|_| Instant::now());
                    wait_for(n, pred)?;
                    let first = deferred_wait.map_or(from, |(s, _)| Some(s));
                    deferred_wait = first.map(|s| (s, Instant::now()));
                }
                // The end is stamped before a successor may start.
                let span = start.map(|start| (start, Instant::now()));
                done[n].store(true, Ordering::Release);
                if let (Some(recorder), Some(span)) = (ctx.trace, span) {
                    recorder.record(d, iteration, n, span, flag_wait, deferred_wait);
                }
            }
            Ok(())
        };
        let chains = &self.chains[d];
        thread::scope(|s| {
            let others: Vec<_> = chains
                .iter()
                .skip(1)
                .map(|c| s.spawn(|| run_chain(c)))
                .collect();
            let mut results = vec![chains.first().map_or(Ok(()), |c| run_chain(c))];
            results.extend(
                others
                    .into_iter()
                    .map(|h| h.join().unwrap_or(Err(ExecError::Panicked { device: d }))),
            );
            first_error(results)
        })
    }

    /// Sleeps for the delays injected into node `node` of `device`.
    #[cfg(feature = "testing")]
    fn injected_delay(&self, device: usize, node: usize) {
        let delay: Duration = self
            .delays
            .iter()
            .filter(|x| x.device == device && x.node.is_none_or(|n| n == node))
            .map(|x| x.delay)
            .sum();
        if !delay.is_zero() {
            thread::sleep(delay);
        }
    }
}

/// The first real error (an `Aborted` only when nothing else failed).
impl ExecError {
    /// When the failed wait began (timeouts only).
    fn since(&self) -> Option<Instant> {
        match self {
            ExecError::FlagTimeout { since, .. }
            | ExecError::BarrierTimeout { since, .. }
            | ExecError::DependencyTimeout { since, .. } => Some(*since),
            _ => None,
        }
    }
}

/// The error that names the cause. A stuck device makes its peers wait too, from a little
/// later on: errors that are not timeouts come first, then the timeout whose wait began
/// earliest. A node waiting for a predecessor in another branch of its DAG times out only
/// because that predecessor is stuck in a bounded wait of its own, which fails too, so
/// [`ExecError::DependencyTimeout`] counts only when no other error did (its wait may have
/// begun first: a deferred predecessor is awaited after the node's own work). Threads that
/// stopped because another one failed report [`ExecError::Aborted`], which only counts when
/// nothing else failed.
fn first_error(results: Vec<Result<(), ExecError>>) -> Result<(), ExecError> {
    let mut aborted = false;
    let mut cause: Option<ExecError> = None;
    let rank = |e: &ExecError| u8::from(matches!(e, ExecError::DependencyTimeout { .. }));
    for e in results.into_iter().filter_map(Result::err) {
        if matches!(e, ExecError::Aborted) {
            aborted = true;
            continue;
        }
        let earlier = match (&cause, e.since()) {
            (None, _) => true,
            (Some(c), _) if rank(&e) != rank(c) => rank(&e) < rank(c),
            (Some(c), Some(at)) => c.since().is_some_and(|c_at| at < c_at),
            (Some(c), None) => c.since().is_some(),
        };
        if earlier {
            cause = Some(e);
        }
    }
    match (cause, aborted) {
        (Some(e), _) => Err(e),
        (None, true) => Err(ExecError::Aborted),
        (None, false) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_dependency_timeout_is_never_the_cause_when_a_wait_of_its_own_failed() {
        let early = Instant::now();
        let later = early + Duration::from_millis(1);
        let timeout = Duration::from_millis(200);
        let dependency = ExecError::DependencyTimeout {
            device: 0,
            node: 4,
            pred: 0,
            timeout,
            since: early,
        };
        let barrier = ExecError::BarrierTimeout {
            device: 0,
            counter: 0,
            arrivals: 1,
            timeout,
            since: later,
        };
        assert_eq!(
            first_error(vec![Err(dependency.clone()), Err(barrier.clone())]),
            Err(barrier)
        );
        assert_eq!(
            first_error(vec![Err(ExecError::Aborted), Err(dependency.clone())]),
            Err(dependency)
        );
    }
}
