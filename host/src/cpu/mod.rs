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
//! [`EdgeKind::ProgrammaticDeferred`](crate::plan::EdgeKind::ProgrammaticDeferred) edge (the
//! pipelined all-gather's stage 0) runs at once and waits for that predecessor only before it
//! completes, as its kernel does with its deferred `griddepcontrol.wait`. Other programmatic
//! edges are treated like full ones: those kernels wait before touching memory.

mod chains;
mod io;
mod memory;
mod node;
mod run;
mod wait;

use std::time::{Duration, Instant};

use thiserror::Error;

use self::memory::{DeviceMemory, ExclusiveWorkspace};
use crate::dtype::{Dtype, Element};
use crate::plan::{Plan, SizeError};
use crate::schedule::{BufferKind, FlagRef};
use crate::trace::TraceError;

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

    /// The plan being executed.
    #[must_use]
    pub fn plan(&self) -> &Plan {
        &self.plan
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
