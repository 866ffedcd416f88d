//! The CPU executor: runs a [`Plan`] with one thread per logical device (plus one per extra
//! branch of its DAG), per-device host buffers, real copies between them, and `AtomicU32`
//! flags and barrier counters used with the acquire/release protocol of the GPU.
//!
//! A run of `iters` iterations starts every device's thread once; each thread replays its DAG
//! `iters` times back to back, like graph launches queued on one stream, so fast devices reach
//! the next barrier while slow ones are still finishing (which is what the running barrier
//! counter is for). [`CpuExecutor::run_sequence`] also gives each run new inputs, which each
//! device loads as soon as its own previous run has ended (the plan's ordering contract for
//! input shards). Every wait is bounded: a protocol error fails the run with an error naming
//! the device, stage and flag.
//!
//! [`CpuExecutor::run_traced`] also records when every node of every device started and ended,
//! and how long a kernel's prologue waited for its flags ([`crate::trace`]); without it the
//! node loop checks one `Option` per node and reads no clock.
//!
//! FP8 plans ([`crate::problem::Problem::fp8`]) run the same DAGs on e4m3 A and B shards
//! ([`CpuExecutor::load_fp8_inputs`]): copies of gathered rows move their row-wise scales with
//! them, a stage GEMM computes as the FP8 kernel is to ([`crate::reference::gemm_scaled_f32`]:
//! f32 accumulation, the scales on the accumulator, one rounding to the output type), and
//! reduce-scatter partials are stored in the output type (each hop rounds once, as for bf16).
//!
//! Timing is modelled where the GPU lets work start early: a node after a
//! [`EdgeKind::ProgrammaticDeferred`] edge (the pipelined all-gather's stage 0) runs at once
//! and waits for that predecessor only before it completes, as its kernel does with its
//! deferred `griddepcontrol.wait`. Other programmatic edges are treated like full ones: those
//! kernels wait before touching memory.

mod chains;
mod memory;
mod node;
mod wait;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use thiserror::Error;

use self::memory::{DeviceMemory, ExclusiveWorkspace};
use self::node::Context;
use self::wait::{WaitFailure, Waiter};
use crate::dtype::{Dtype, Element};
use crate::plan::{DeviceInputs, EdgeKind, Fp8DeviceInputs, Plan, SizeError};
use crate::schedule::{BufferKind, FlagRef};
use crate::trace::{Trace, TraceError, TraceSource, record::Recorder};

/// The default bound of every wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a CPU run failed.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ExecError {
    /// A kernel waited too long for a flag: a missing or misdirected signal.
    #[error(
        "deadlock: device {device}, stage {stage} ({node}) waited {timeout:?} for flag {} of device {} \
         and it was never set",
        flag.index,
        flag.device
    )]
    FlagTimeout {
        /// The waiting device.
        device: usize,
        /// Its stage.
        stage: usize,
        /// The waiting node ("gemm" or "reduce").
        node: &'static str,
        /// The flag.
        flag: FlagRef,
        /// The bound that elapsed.
        timeout: Duration,
        /// When the wait began: with several devices stuck, the earliest wait is the cause.
        since: Instant,
    },
    /// The barrier did not see all arrivals.
    #[error(
        "deadlock: device {device}'s barrier waited {timeout:?}; counter is {counter}, needs {arrivals}"
    )]
    BarrierTimeout {
        /// The waiting device.
        device: usize,
        /// The counter's value at the timeout.
        counter: u32,
        /// Arrivals needed.
        arrivals: u32,
        /// The bound that elapsed.
        timeout: Duration,
        /// When the wait began: with several devices stuck, the earliest wait is the cause.
        since: Instant,
    },
    /// A node waited too long for a predecessor in another branch of its device's DAG.
    #[error(
        "deadlock: device {device}, node {node} waited {timeout:?} for its predecessor node {pred}"
    )]
    DependencyTimeout {
        /// The device.
        device: usize,
        /// The waiting node.
        node: usize,
        /// The predecessor.
        pred: usize,
        /// The bound that elapsed.
        timeout: Duration,
        /// When the wait began: with several devices stuck, the earliest wait is the cause.
        since: Instant,
    },
    /// Another device failed first (never returned by [`CpuExecutor::run`]).
    #[error("aborted because another device failed")]
    Aborted,
    /// The executor's element type is not the plan's.
    #[error("the plan is for {plan} but the executor holds {executor} elements")]
    DtypeMismatch {
        /// The plan's dtype.
        plan: Dtype,
        /// The executor's.
        executor: Dtype,
    },
    /// Inputs of the other kind than the plan's operands (bf16/f16 shards for an FP8 plan or
    /// the reverse).
    #[error("the plan's A and B are {plan} but the inputs' are {inputs}")]
    OperandMismatch {
        /// The plan's operand type ("e4m3", "bf16" or "f16").
        plan: &'static str,
        /// The inputs'.
        inputs: &'static str,
    },
    /// FP8 input scales of the wrong mode or number.
    #[error("device {device}: {source}")]
    Scales {
        /// The device.
        device: usize,
        /// What is wrong.
        source: SizeError,
    },
    /// A stage GEMM's operands do not fit its shape (a plan that validation should have
    /// refused).
    #[error("a stage GEMM's operands: {0}")]
    GemmOperands(#[from] SizeError),
    /// Input shards of the wrong size.
    #[error("device {device}: the {buffer:?} shard has {got} elements, the plan needs {expected}")]
    InputSize {
        /// The device.
        device: usize,
        /// The buffer.
        buffer: BufferKind,
        /// Elements given.
        got: usize,
        /// Elements expected.
        expected: usize,
    },
    /// Not one input shard set per device.
    #[error("{got} input shard sets given, the plan has {expected} devices")]
    ShardCount {
        /// Shard sets given.
        got: usize,
        /// Devices of the plan.
        expected: usize,
    },
    /// A device thread panicked (a bug).
    #[error("device {device}'s thread panicked")]
    Panicked {
        /// The device.
        device: usize,
    },
    /// The recorded spans do not make a trace of the plan (a bug in the recorder).
    #[error("the recorded trace is inconsistent: {0}")]
    Trace(#[from] TraceError),
}

/// A snapshot of one device's exclusive workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExclusiveState {
    /// The barrier counter.
    pub counter: u32,
    /// The stage flags.
    pub flags: Vec<u32>,
}

/// Runs one plan on host memory.
#[derive(Debug)]
pub struct CpuExecutor<T> {
    plan: Plan,
    memory: Vec<DeviceMemory<T>>,
    exclusive: Vec<ExclusiveWorkspace>,
    chains: Vec<Vec<Vec<usize>>>,
    timeout: Duration,
    #[cfg(feature = "testing")]
    delays: Vec<InjectedDelay>,
}

/// Test hook (`testing` feature): a node that sleeps before it runs, in every run, so that a
/// test can make one device, or one of its nodes (a GEMM, a push), late on purpose.
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedDelay {
    /// The device.
    pub device: usize,
    /// Its node index, or `None` for every node of the device.
    pub node: Option<usize>,
    /// How long the node sleeps once its predecessors are done, before it runs.
    pub delay: Duration,
}

impl<T: Element> CpuExecutor<T> {
    /// Allocates zeroed buffers and exclusive workspaces for every device of `plan`.
    pub fn new(plan: Plan) -> Result<Self, ExecError> {
        if plan.problem.dtype != T::DTYPE {
            return Err(ExecError::DtypeMismatch {
                plan: plan.problem.dtype,
                executor: T::DTYPE,
            });
        }
        let memory = (0..plan.tp).map(|d| DeviceMemory::new(&plan, d)).collect();
        let exclusive = plan
            .devices
            .iter()
            .map(|_| ExclusiveWorkspace::new(plan.exclusive.flag_count))
            .collect();
        let chains = plan.devices.iter().map(chains::chains).collect();
        Ok(CpuExecutor {
            plan,
            memory,
            exclusive,
            chains,
            timeout: DEFAULT_TIMEOUT,
            #[cfg(feature = "testing")]
            delays: Vec::new(),
        })
    }

    /// The same executor with another bound on every wait.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        CpuExecutor { timeout, ..self }
    }

    /// Test hook: the same executor with `delays` injected into its devices' nodes.
    #[cfg(feature = "testing")]
    #[must_use]
    pub fn with_delays(self, delays: Vec<InjectedDelay>) -> Self {
        CpuExecutor { delays, ..self }
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

    /// The plan being executed.
    #[must_use]
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Copies every device's input shards in (see [`Plan::shard_inputs`]): one per device,
    /// each with the sizes the plan gives the device's buffers.
    pub fn load_inputs(&mut self, shards: &[DeviceInputs<T>]) -> Result<(), ExecError> {
        self.check_inputs(shards)?;
        for (mem, inputs) in self.memory.iter().zip(shards) {
            mem.store_inputs(inputs);
        }
        Ok(())
    }

    /// The plan's operand type, for [`ExecError::OperandMismatch`].
    fn operand_name(&self) -> &'static str {
        match self.plan.problem.fp8 {
            Some(_) => "e4m3",
            None => self.plan.problem.dtype.name(),
        }
    }

    /// Copies every device's FP8 input shards and their scales in (see
    /// [`Plan::shard_fp8_inputs`]): one per device, with the sizes the plan gives the
    /// device's buffers and, row-wise, one scale per row of its A and B shards.
    pub fn load_fp8_inputs(&mut self, shards: &[Fp8DeviceInputs<T>]) -> Result<(), ExecError> {
        let Some(fp8) = self.plan.problem.fp8 else {
            return Err(ExecError::OperandMismatch {
                plan: self.operand_name(),
                inputs: "e4m3",
            });
        };
        if shards.len() != self.plan.tp {
            return Err(ExecError::ShardCount {
                got: shards.len(),
                expected: self.plan.tp,
            });
        }
        for (dev, inputs) in self.plan.devices.iter().zip(shards) {
            let device = dev.device;
            let c_len = inputs.c.as_ref().map_or(0, Vec::len);
            let given = [
                (BufferKind::A, inputs.a.len()),
                (BufferKind::B, inputs.b.len()),
                (BufferKind::C, c_len),
            ];
            for (buffer, got) in given {
                let expected = dev.buffer_elements(buffer);
                if got != expected {
                    return Err(ExecError::InputSize {
                        device,
                        buffer,
                        got,
                        expected,
                    });
                }
            }
            let scales = if inputs.scales.mode() == fp8.scales {
                inputs.scales.validate(dev.shards.a.rows, dev.shards.b.rows)
            } else {
                Err(SizeError::ScaleMode {
                    got: inputs.scales.mode(),
                    expected: fp8.scales,
                })
            };
            scales.map_err(|source| ExecError::Scales { device, source })?;
        }
        for (mem, inputs) in self.memory.iter().zip(shards) {
            mem.store_fp8_inputs(inputs);
        }
        Ok(())
    }

    /// One input shard set per device, each with the sizes the plan gives its buffers.
    fn check_inputs(&self, shards: &[DeviceInputs<T>]) -> Result<(), ExecError> {
        if self.plan.problem.fp8.is_some() {
            return Err(ExecError::OperandMismatch {
                plan: "e4m3",
                inputs: T::DTYPE.name(),
            });
        }
        if shards.len() != self.plan.tp {
            return Err(ExecError::ShardCount {
                got: shards.len(),
                expected: self.plan.tp,
            });
        }
        for (dev, inputs) in self.plan.devices.iter().zip(shards) {
            let empty = Vec::new();
            let given = [
                (BufferKind::A, &inputs.a),
                (BufferKind::B, &inputs.b),
                (BufferKind::C, inputs.c.as_ref().unwrap_or(&empty)),
            ];
            for (buffer, data) in given {
                let expected = dev.buffer_elements(buffer);
                if data.len() != expected {
                    return Err(ExecError::InputSize {
                        device: dev.device,
                        buffer,
                        got: data.len(),
                        expected,
                    });
                }
            }
        }
        Ok(())
    }

    /// Fills every output and workspace element with NaN, so that anything a run fails to write
    /// (or reads before it is written) shows up in the result.
    pub fn poison(&mut self) {
        for mem in &mut self.memory {
            for buffer in [BufferKind::D, BufferKind::Workspace] {
                mem.get_mut(buffer).fill(T::nan());
            }
            if let Some(fp8) = &mut mem.fp8 {
                fp8.poison();
            }
        }
    }

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

    /// Every device's output shard.
    #[must_use]
    pub fn outputs(&self) -> Vec<Vec<T>> {
        self.memory
            .iter()
            .map(|m| m.read(BufferKind::D).clone())
            .collect()
    }

    /// The global D assembled from the output shards.
    pub fn gathered_output(&self) -> Result<Vec<T>, SizeError> {
        self.plan.gather_output(&self.outputs())
    }

    /// Every device's barrier counter and flags (a run leaves all counters at 0).
    #[must_use]
    pub fn exclusive_state(&self) -> Vec<ExclusiveState> {
        self.exclusive
            .iter()
            .map(|e| ExclusiveState {
                counter: e.counter.load(Ordering::Acquire),
                flags: e.flags.iter().map(|f| f.load(Ordering::Acquire)).collect(),
            })
            .collect()
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
    use half::f16;

    use super::*;
    use crate::plan::{GlobalInputs, Node};
    use crate::problem::Problem;
    use crate::reference::{CheckInputs, check};
    use crate::schedule::ScheduleKind;

    fn executor(kind: ScheduleKind, tp: usize) -> (CpuExecutor<f16>, GlobalInputs<f16>) {
        let problem = Problem::new(16 * tp, 16 * tp, 16 * tp).with_dtype(Dtype::F16);
        let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
        let inputs = GlobalInputs::random(&problem, 1);
        let mut exec = CpuExecutor::new(plan).unwrap_or_else(|e| panic!("{e}"));
        let shards = exec
            .plan()
            .shard_inputs(&inputs)
            .unwrap_or_else(|e| panic!("{e}"));
        exec.load_inputs(&shards).unwrap_or_else(|e| panic!("{e}"));
        exec.poison();
        (exec, inputs)
    }

    #[test]
    fn reduce_scatter_runs_and_leaves_counters_at_zero() {
        let (exec, inputs) = executor(ScheduleKind::ReduceScatterTilingB, 3);
        exec.run(3).unwrap_or_else(|e| panic!("{e}"));
        let plan = exec.plan();
        let report = check(
            &plan.problem,
            plan.schedule.roundings(plan.tp),
            plan.tp,
            CheckInputs {
                a: &inputs.a,
                b: &inputs.b,
                c: None,
            },
            &exec.gathered_output().unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(report.passed(), "{report:?}");
        assert!(exec.exclusive_state().iter().all(|e| e.counter == 0));
    }

    #[test]
    fn a_missing_signal_is_a_named_deadlock() {
        let (mut exec, _) = executor(ScheduleKind::ReduceScatterTilingA, 2);
        if let Some(Node::Gemm(g)) = exec.plan.devices[0].nodes.get_mut(2) {
            g.signals = None;
        }
        let exec = exec.with_timeout(Duration::from_millis(200));
        let err = exec.run(1).err();
        let flag = FlagRef {
            device: 1,
            index: 1,
        };
        assert!(
            matches!(err, Some(ExecError::FlagTimeout { device: 1, stage: 1, flag: f, .. }) if f == flag),
            "{err:?}"
        );
    }

    #[test]
    fn too_few_input_shards_are_refused() {
        let (mut exec, inputs) = executor(ScheduleKind::AllGatherRotatingB, 3);
        let mut shards = exec
            .plan()
            .shard_inputs(&inputs)
            .unwrap_or_else(|e| panic!("{e}"));
        shards.pop();
        assert_eq!(
            exec.load_inputs(&shards),
            Err(ExecError::ShardCount {
                got: 2,
                expected: 3
            })
        );
    }

    /// The pipelined all-gather's stage 0 waits for the barrier only at its end: with a
    /// barrier that never completes (a peer that never arrives), it has still written its D
    /// rows when the run fails, while later stages have not.
    #[test]
    fn the_deferred_first_stage_runs_beside_the_barrier() {
        let (mut exec, _) = executor(ScheduleKind::AllGatherRotatingA, 2);
        if let Some(Node::Barrier(b)) = exec.plan.devices[1].nodes.first_mut() {
            b.arrive_at.clear();
        }
        let exec = exec.with_timeout(Duration::from_millis(200));
        let err = exec.run(1).err();
        assert!(
            matches!(err, Some(ExecError::BarrierTimeout { device: 0, .. })),
            "{err:?}"
        );
        // Device 0's D: what stage 0 writes is there, what stage 1 writes is not.
        let d = &exec.outputs()[0];
        let written = |stage: usize| {
            let g = exec.plan.devices[0]
                .gemms()
                .find(|g| g.stage == stage)
                .unwrap_or_else(|| panic!("no stage {stage}"));
            (0..g.d.rows).all(|r| {
                let row = &d[g.d.offset + r * g.d.ld..][..g.d.cols];
                row.iter().all(|x| !x.is_nan())
            })
        };
        assert!(written(0));
        assert!(!written(1));
    }

    /// A traced pipelined all-gather whose device 1 reaches the barrier 50 ms late: device
    /// 0's stage 0 runs beside the barrier and then waits for it at its end. That wait is a
    /// wait, not compute: the summary's compute is the GEMMs' own few milliseconds at most,
    /// and compute, exposed communication and idle time add up to the wall time.
    #[cfg(feature = "testing")]
    #[test]
    fn a_deferred_wait_is_traced_as_a_wait_not_as_compute() {
        let (exec, _) = executor(ScheduleKind::AllGatherRotatingA, 2);
        let late = Duration::from_millis(50);
        let exec = exec.with_delays(vec![InjectedDelay {
            device: 1,
            node: Some(0),
            delay: late,
        }]);
        let trace = exec.run_traced(1).unwrap_or_else(|e| panic!("{e}"));
        let dev0 = &trace.devices[0];
        let deferred: Vec<_> = dev0.events.iter().filter_map(|e| e.deferred_wait).collect();
        assert_eq!(deferred.len(), 1, "{:?}", dev0.events);
        let summary = crate::trace::DeviceSummary::of(dev0);
        let late_ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        assert!(
            summary.compute_ns < late_ns / 2,
            "compute {} ns counts the barrier wait",
            summary.compute_ns
        );
        assert!(deferred[0].len_ns() > late_ns / 2, "{deferred:?}");
        assert!(summary.wait_ns >= summary.barrier_ns, "{summary:?}");
        assert_eq!(
            summary.compute_ns + summary.exposed_ns + summary.idle_ns,
            summary.wall_ns,
            "{summary:?}"
        );
    }

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

    /// The barrier resets the release flags too: a release left over from the previous run
    /// does not end the next one early.
    #[test]
    fn a_stale_release_does_not_count_in_the_next_run() {
        let (mut exec, _) = executor(ScheduleKind::AllGatherRotatingB, 2);
        exec.run(1).unwrap_or_else(|e| panic!("{e}"));
        let released = exec.plan.exclusive.release_flag(1);
        assert_ne!(exec.exclusive_state()[0].flags[released], 0);
        // From now on device 1 releases device 0's shard into its own flags instead.
        for node in &mut exec.plan.devices[1].nodes {
            if let Node::FlagSet(f) = node
                && f.flag.device == 0
            {
                f.flag.device = 1;
            }
        }
        let exec = exec.with_timeout(Duration::from_millis(200));
        let err = exec.run(1).err();
        assert!(
            matches!(
                err,
                Some(ExecError::FlagTimeout { device: 0, node: "release", flag, .. })
                    if flag == FlagRef { device: 0, index: released }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn wrong_dtype_is_refused() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(16, 16, 16),
            1,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            CpuExecutor::<f16>::new(plan),
            Err(ExecError::DtypeMismatch { .. })
        ));
    }
}
