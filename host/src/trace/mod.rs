//! Traces of DistGEMM runs: per device, when each plan node ran, on one clock across devices,
//! and what that says about where the time went (issue 25).
//!
//! A [`Trace`] is built from a [`Plan`](crate::plan::Plan) and, per device, one [`NodeSpan`]
//! per executed node and run: start, end, for a kernel that waits on a flag, when its
//! prologue waited, and for a kernel with a deferred predecessor (the pipelined all-gather's
//! stage 0 after the barrier), when it waited for it after its own work. Each span becomes an [`Event`] named after its node (`stage 2 gemm`,
//! `copy from device 3`, `push to device 1`, `flag 2`, `release to device 1`, `barrier`,
//! `reduce`, `release wait`) on one of three [`Lane`]s of its device: the 1-thread collective kernels
//! (barrier, release wait), the stage kernels (GEMMs, reduction) and the copy engine (copies
//! and the flag sets after them). The outputs:
//!
//! - [`Trace::to_chrome_json`]: Chrome Trace Event JSON for Perfetto (one process per device,
//!   one thread per lane, more where a lane's events overlap, flow arrows from a flag's store
//!   to the kernels that waited on it);
//! - `Trace::render_svg` (feature `cli`): an SVG timeline, one band per device;
//! - [`Summary`]: per device and stage, the totals defined below, as text or JSON.
//!
//! # Definitions (per device, over every traced run; `|S|` is the time covered by a set of
//! intervals, overlaps counted once)
//!
//! - **wall**: from the device's first event's start to its last event's end;
//! - **compute**: `|GEMM main loops|`, a main loop being a stage GEMM's span after its flag
//!   wait and before its deferred wait;
//! - **copy**: `|copies|`; **wait**: `|barriers ∪ flag waits ∪ deferred waits ∪ release
//!   waits|`;
//! - **communication**: every event's span except the GEMMs', plus the GEMMs' flag and
//!   deferred waits (copies, flag sets, the barrier, the reduction, which reads the peers'
//!   partial sums, the release wait);
//! - **exposed communication**: `|communication \ compute|`, the time in which the device
//!   communicated or waited and no GEMM computed;
//! - **idle**: `wall − compute − exposed`, the time in which nothing of the plan ran (on the
//!   CPU executor: thread scheduling between nodes).
//!
//! So `compute + exposed + idle = wall`. Per stage: its GEMM's main loop, its flag wait, the
//! device's copies tagged with the stage (bytes too: an all-gather's pulls, which feed this
//! device's stage GEMM, or a reduce-scatter's pushes, which feed the receiving neighbour's
//! stage) and its exposed communication (the stage's copies, flag sets, waits and reduction
//! outside every GEMM main loop of the device). The barrier, a deferred wait for it and the
//! release wait belong to the run, not to a stage.
//!
//! # Sources
//!
//! **The CPU executor** ([`CpuExecutor::run_traced`](crate::cpu::CpuExecutor::run_traced)):
//! every node's thread stamps `Instant`s around the node (one host clock for every device);
//! a kernel node also stamps its prologue's flag wait and its wait for a deferred predecessor. Untraced runs check one `Option` per
//! node and read no clock. Its times are the CPU's, useful to check the plan's shape and the
//! outputs, not the GPU's speed.
//!
//! **The GPUs** (`distgemm trace --backend cuda`, [`TraceSource::Cupti`]): CUPTI activity
//! records of every kernel (`CONCURRENT_KERNEL`) and copy (`MEMCPY`, `MEMCPY2`) of the plan's
//! graphs, each carrying the id of the graph node that ran it; the instance's nodes are clones
//! of the built graph's, so a resource callback maps clone ids to the ids `cuptiGetGraphNodeId`
//! gives for graph node i, which is plan node i (the lowering keeps the order). Records of
//! one process are on one clock for every GPU. `activity` turns them into spans: a flag set
//! (a write-value node, not recorded) at its copy's end, a stage kernel's prologue flag wait
//! estimated from its flags' setters (a lower bound). The collection (the CLI's `cupti`
//! module) starts before the graphs are built and is paused outside the traced runs; CUPTI is
//! loaded only then, and the kernels are unchanged, so a run without tracing costs nothing
//! extra. Measured on one H200: 1.4–2.0 % more host wall time per run while CUPTI collects.
//!
//! Not built: kernel-side stamps. `%globaltimer` written by each stage kernel's block 0 around
//! its prologue wait (a `trace: u64` slot address in [`StageHook`] and the collective kernels'
//! parameters, 0 = off) would give the real flag waits and the deferred wait of the pipelined
//! all-gather's stage 0 instead of estimates, at the cost of a branch outside the main loop
//! (gate: check-ptx registers and SASS unchanged outside the guarded blocks, `distgemm bench`
//! within noise). Per-rank processes (`run --ranks`) are not traced yet: each process would
//! collect its own records and the launcher merge them (CUPTI's timestamps are the host's
//! clock in every process).
//!
//! [`StageHook`]: kernels_gpu::gemm_abi::StageHook

#[cfg(feature = "cli")]
pub(crate) mod activity;
mod chrome;
mod interval;
mod model;
pub(crate) mod record;
mod summary;
#[cfg(feature = "cli")]
mod svg;

pub use interval::Interval;
pub use model::{DeviceTrace, Event, EventKind, Lane, NodeSpan, Trace, TraceError, TraceSource};
pub use summary::{DeviceSummary, StageSummary, Summary};
#[cfg(feature = "cli")]
pub use svg::SvgError;

#[cfg(test)]
pub(crate) mod tests {
    use half::f16;

    use super::Trace;
    use crate::cpu::CpuExecutor;
    use crate::dtype::Dtype;
    use crate::plan::{GlobalInputs, Plan};
    use crate::problem::Problem;
    use crate::schedule::{Collective, ScheduleKind};

    /// A recorded trace: `iters` runs of `kind` at `tp` on the CPU executor, on a small
    /// problem (16·TP in every dimension, f16).
    pub(crate) fn synthetic(kind: ScheduleKind, tp: usize, iters: usize) -> (Plan, Trace) {
        let mut problem = Problem::new(16 * tp, 16 * tp, 16 * tp).with_dtype(Dtype::F16);
        if kind.collective() == Collective::AllGather {
            problem = problem.with_scalars(1.0, 0.5);
        }
        let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let trace = traced(&plan, iters);
        (plan, trace)
    }

    /// `iters` traced runs of `plan` (f16) on the CPU executor, on random inputs.
    pub(crate) fn traced(plan: &Plan, iters: usize) -> Trace {
        let mut exec = CpuExecutor::<f16>::new(plan.clone()).unwrap_or_else(|e| panic!("{e}"));
        let shards = plan
            .shard_inputs(&GlobalInputs::random(&plan.problem, 3))
            .unwrap_or_else(|e| panic!("{e}"));
        exec.load_inputs(&shards).unwrap_or_else(|e| panic!("{e}"));
        exec.run_traced(iters)
            .unwrap_or_else(|e| panic!("{}: {e}", plan.schedule))
    }

    /// The CPU recorder: every node of every run once, each after the predecessors it waits
    /// for before it starts (all but a deferred one), and a flag wait for exactly the kernels
    /// that wait on flags.
    #[test]
    fn cpu_traces_follow_the_dag() {
        use crate::plan::EdgeKind;
        for kind in ScheduleKind::ALL {
            let (plan, trace) = synthetic(kind, 3, 3);
            assert_eq!(trace.iterations, 3);
            for (dev, dt) in plan.devices.iter().zip(&trace.devices) {
                assert_eq!(dt.events.len(), 3 * dev.nodes.len(), "{kind}");
                for e in &dt.events {
                    let kernel_waits = !dev.nodes[e.node].flags_awaited().is_empty()
                        && e.kind != super::EventKind::ReleaseWait;
                    assert_eq!(
                        e.flag_wait.is_some(),
                        kernel_waits,
                        "{kind} node {}",
                        e.node
                    );
                    for (pred, edge) in dev.predecessors(e.node) {
                        if edge == EdgeKind::ProgrammaticDeferred {
                            continue;
                        }
                        let p = dt
                            .events
                            .iter()
                            .find(|p| p.iteration == e.iteration && p.node == pred)
                            .unwrap_or_else(|| panic!("{kind}: no node {pred}"));
                        assert!(
                            p.span.end_ns <= e.span.start_ns,
                            "{kind}: {pred} → {}",
                            e.node
                        );
                    }
                }
            }
        }
    }
}
