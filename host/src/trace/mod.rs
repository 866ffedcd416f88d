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
//! **The GPUs (designed, not built).** Two sources, combined:
//!
//! 1. *Kernel stamps.* Every kernel parameter block gets a `trace: u64` field, the address of
//!    the node's slot in a per-device trace buffer, 0 when tracing is off ([`StageHook`] for
//!    the stage GEMM, and `BarrierParams`, `ReduceParams`, `WaitFlagsParams`). When it is not
//!    0 the kernel writes `%globaltimer` (ns, in steps of about 1 µs:
//!    `kernels_gpu::device::flags::global_timer_ns`) into the slot: the barrier and the
//!    release wait (1 thread) at entry and exit; a stage GEMM and the reduction from block 0's
//!    thread 0 at entry, around its prologue's flag wait, and at exit from every block's
//!    thread 0 as an `atom.max` (the kernel ends with its last block). The
//!    slot of run i is `buffer + ((i mod capacity) · nodes + node) · 32` bytes, four `u64`s
//!    (start, wait start, wait end, end); i is a counter in the buffer's header that the
//!    device's sink node (release wait, or the last kernel of a reduce-scatter) increments
//!    after its own stamp: graph launches on one stream are ordered, so every kernel of run
//!    i reads i. Cost when on: 3 stores on one thread per kernel plus one atomic per block.
//! 2. *Copies and flag sets.* The copy engine and the front end run no code of ours. CUPTI
//!    activity records (cudarc's `cupti` feature; `CUpti_ActivityMemcpy5` and, with
//!    `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`, `CUpti_ActivityKernel9`) carry `graphNodeId`,
//!    which `cuptiGetGraphNodeId` maps back to graph node i, which is plan node i
//!    ([`crate::cuda`]'s lowering keeps the order): memcpy records give the copies' spans,
//!    kernel records cross-check the kernel stamps. A flag set (a write-value node) has no
//!    record (no activity kind for stream memory operations was found): it is placed after
//!    its copy's end, and bounded by the end of the flag wait of the kernel that observed it.
//!    Without CUPTI, a copy is bounded by its neighbours: it starts after its chain
//!    predecessor and ends before its flag's observer stopped waiting. To check on the GPU
//!    first: that the records of an instantiated, replayed graph carry the ids
//!    `cuptiGetGraphNodeId` gives for the nodes it was instantiated from, and that enabling
//!    the memcpy and kernel kinds does not serialise the graph's branches (compare a run's
//!    time with and without them).
//!
//! One clock across GPUs: `%globaltimer` is per GPU. Every device's barrier returns within an
//! NVLink round trip of the last arrival, so the barrier ends of one run are nearly
//! simultaneous: device d's offset is the median over runs of `barrier_end(d) −
//! barrier_end(0)`, subtracted from its stamps (CUPTI records of one process are already on
//! one clock and give a second estimate).
//!
//! Tracing off must cost nothing measurable. The kernels' branch on `trace != 0` is on a
//! launch parameter, uniform and outside the main loop, so the next session checks, with the
//! field present and 0: `cargo xtask check-ptx` reports the same registers, no spills and
//! HGMMA in every entry, and the GEMM entry's SASS differs from today's only by the guarded
//! stamp blocks (diff `cuobjdump -sass` before/after, count instructions outside the
//! prologue/epilogue: 0); `distgemm bench` of the previous commit and the new one, tracing off,
//! in interleaved rounds (70B fc1 `ag-a` and fc2 `rs-a` at 16384 tokens, TP = 1 on one H200)
//! agree within the rounds' spread; and, tracing on, the same bench states the overhead.
//! If the branch showed up after all, a second GEMM entry compiled with tracing (a const
//! generic) leaves the untraced entry's PTX byte-identical.
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
