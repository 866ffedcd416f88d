//! The CUDA backend end to end: per-device graphs of the plans, on two GPUs with peer access
//! (TP=2) and — where only one GPU exists — TP=1 plans and TP=2 with both ranks on one GPU.
//!
//! Inputs are N(0, 1) (never zero); every output shard and every workspace is poisoned with
//! NaN (0xFF bytes) before the first run, so anything not written, or read before it is
//! written, shows up. Checks:
//! - all-gather schedules: D bit-identical to our single-GPU GEMM kernel run on the gathered
//!   global problem on GPU 0 (each output element is the same dot product in the same order);
//! - reduce-scatter schedules: within `distgemm::reference::check_products`' bound of the f64
//!   reference, its sums computed on the GPU (the bound counts the schedule's roundings);
//! - 1,000 consecutive runs of one graph with the operands rewritten between them in each
//!   rank's stream order (the end-of-run release), every run's D checked, then the counters;
//! - new inputs and outputs through the pointer-update path (`DistGemm::set_args`);
//! - the benchmarks' copy-cut diagnostic (`TimingDiagnostics::copy_limit`): capped copies move only their first
//!   bytes (NaN outputs over a poisoned workspace) and uncapping restores the result;
//! - every schedule at TP = 4 and TP = 8 where the machine has that many GPUs;
//! - 24 problems drawn at random (`distgemm_tests::shapes::random_problem`), two ranks on one
//!   GPU, every schedule, bf16 and f16;
//! - graph edges read back from the driver (programmatic type and port where the plan says so);
//! - a stuck peer (never launched) and a missing signal: errors naming device, stage and flag
//!   within the configured timeout, not hangs.
//!
//! Run from the bundle: `bundle/tests/gpu_distributed` (or `cargo test -p distgemm-tests
//! --test gpu_distributed`).
use std::time::{Duration, Instant};

use distgemm::cuda::{DeviceArgs, DistGemm, DistGemmError, TimingDiagnostics, WaitingNode};
use distgemm::dtype::{Dtype, Element};
use distgemm::fp8::ScaleMode;
use distgemm::gemm::{GemmArgs, GemmKernel, MatrixView, SectorAlignment, choose_variant_for};
use distgemm::plan::{EdgeKind, GlobalInputs, Plan};
use distgemm::problem::Problem;
use distgemm::reference::check_products;
use distgemm::reference::gpu::{ReferenceOperand, packed_products};
use distgemm::runtime::caller_stream::copy_device_async;
use distgemm::runtime::stream::DependencyKind;
use distgemm::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module};
use distgemm::schedule::{BufferKind, Collective, FlagRef, ScheduleKind};
use distgemm_tests::gpu::{self, visible_line};
use distgemm_tests::shapes::random_problem;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::Arc;

/// Bound of every GPU wait in these tests (a failure costs seconds, not the 10 s default).
const TIMEOUT: Duration = Duration::from_secs(3);

const ALL_GATHER: [ScheduleKind; 4] = [
    ScheduleKind::AllGatherRotatingA,
    ScheduleKind::AllGatherRotatingB,
    ScheduleKind::AllGatherSingleStageA,
    ScheduleKind::AllGatherSingleStageB,
];

const REDUCE_SCATTER: [ScheduleKind; 4] = [
    ScheduleKind::ReduceScatterTilingA,
    ScheduleKind::ReduceScatterTilingB,
    ScheduleKind::ReduceScatterSingleStageA,
    ScheduleKind::ReduceScatterSingleStageB,
];

/// One rank's shard buffers.
struct Shards<T: DeviceCopy> {
    a: DeviceBuffer<T>,
    b: DeviceBuffer<T>,
    c: Option<DeviceBuffer<T>>,
    d: DeviceBuffer<T>,
    stream: Arc<CudaStream>,
}

impl<T: DeviceCopy> Shards<T> {
    fn args(&self) -> DeviceArgs<'_> {
        DeviceArgs {
            a: (&self.a).into(),
            b: (&self.b).into(),
            c: self.c.as_ref().map(Into::into),
            d: (&self.d).into(),
            row_scales: None,
        }
    }
}

/// Uploads every rank's shards of `inputs` to `gpus[rank]` and poisons D with NaN.
fn upload<T: Element + DeviceCopy>(
    gpus: &[Gpu],
    plan: &Plan,
    inputs: &GlobalInputs<T>,
) -> Vec<Shards<T>> {
    plan.shard_inputs(inputs)
        .expect("shard the inputs")
        .into_iter()
        .zip(gpus)
        .zip(&plan.devices)
        .map(|((shard, gpu), dev)| {
            let stream = gpu.new_stream().expect("stream");
            let a = DeviceBuffer::from_host(gpu, &stream, &shard.a).expect("upload A");
            let b = DeviceBuffer::from_host(gpu, &stream, &shard.b).expect("upload B");
            let c = shard
                .c
                .as_ref()
                .map(|c| DeviceBuffer::from_host(gpu, &stream, c).expect("upload C"));
            let mut d = DeviceBuffer::alloc(gpu, dev.buffer_elements(BufferKind::D)).expect("D");
            d.fill_bytes(&stream, 0xFF).expect("poison D");
            distgemm::runtime::stream::synchronize(&stream).expect("sync");
            Shards { a, b, c, d, stream }
        })
        .collect()
}

/// The global D assembled from every rank's output shard.
fn gather<T: Element + DeviceCopy>(plan: &Plan, shards: &[Shards<T>]) -> Vec<T> {
    let outputs: Vec<Vec<T>> = shards
        .iter()
        .map(|s| s.d.download(&s.stream).expect("download D"))
        .collect();
    plan.gather_output(&outputs).expect("gather D")
}

/// Our single-GPU kernel on the whole problem (on `gpu`): the bit-exact reference of the
/// all-gather schedules.
fn single_gpu_reference<T: Element + DeviceCopy>(
    gpu: &Gpu,
    module: &Arc<Module>,
    problem: &Problem,
    inputs: &GlobalInputs<T>,
) -> Vec<T> {
    let (m, n, k) = (problem.m as u64, problem.n as u64, problem.k as u64);
    let stream = gpu.new_stream().expect("stream");
    let a = DeviceBuffer::from_host(gpu, &stream, &inputs.a).expect("A");
    let b = DeviceBuffer::from_host(gpu, &stream, &inputs.b).expect("B");
    let c = inputs
        .c
        .as_ref()
        .map(|c| DeviceBuffer::from_host(gpu, &stream, c).expect("C"));
    let mut d = DeviceBuffer::<T>::alloc(gpu, problem.m * problem.n).expect("D");
    d.fill_bytes(&stream, 0xFF).expect("poison");
    let kernel = GemmKernel::new(module).expect("GEMM kernels");
    let args = GemmArgs {
        dtype: problem.dtype,
        a: MatrixView::dense(a.device_ptr(), m, k),
        b: MatrixView::dense(b.device_ptr(), n, k),
        c: c.as_ref().map(|c| MatrixView::dense(c.device_ptr(), m, n)),
        d: MatrixView::dense(d.device_ptr(), m, n),
        alpha: problem.alpha,
        beta: problem.beta,
    };
    let prepared = kernel.prepare(&stream, &args).expect("prepare");
    // SAFETY: A, B, C and D above are live buffers of the viewed sizes; we download after.
    unsafe { prepared.launch(&stream, false) }.expect("launch");
    d.download(&stream).expect("download")
}

/// Whether the GEMM rule may split K in any of `plan`'s 16-bit stage GEMMs or in the whole
/// problem on a GPU of `sms` SMs, wherever the operands' rows start (a stage's views may
/// start off 32-byte boundaries where the whole problem's do not, so every case is asked).
fn splits_k(plan: &Plan, sms: u32) -> bool {
    let split = |m: usize, n: usize, k: usize| {
        let (m, n, k) = (m as u64, n as u64, k as u64);
        [false, true].into_iter().any(|a| {
            [false, true].into_iter().any(|b| {
                let rows = SectorAlignment { a, b };
                choose_variant_for(m, n, k, sms, rows).config.split_k
            })
        })
    };
    let p = &plan.problem;
    split(p.m, p.n, p.k)
        || plan
            .devices
            .iter()
            .flat_map(|d| d.gemms())
            .any(|g| split(g.shape.m, g.shape.n, g.shape.k))
}

fn assert_bit_identical<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    let diff = got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits());
    if let Some(i) = diff {
        let count = got
            .iter()
            .zip(want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count();
        panic!(
            "{what}: {count} elements differ from the single-GPU kernel; first at {i}: {:?} vs {:?}",
            got[i], want[i]
        );
    }
}

/// Every element of `d` within `reference::check_products`' bound of the f64 reference, its
/// sums computed on `module`'s GPU.
fn assert_within_bound<T: Element + ReferenceOperand>(
    what: &str,
    module: &Arc<Module>,
    plan: &Plan,
    inputs: &GlobalInputs<T>,
    d: &[T],
) {
    let p = &plan.problem;
    let sums = packed_products(module, &inputs.a, &inputs.b, (p.m, p.n, p.k))
        .expect("f64 reference on the GPU");
    let roundings = plan.schedule.roundings(plan.tp);
    let report =
        check_products(p, roundings, plan.tp, &sums, inputs.c.as_deref(), d).expect("check D");
    assert!(report.passed(), "{what}: {report:?}");
}

/// Builds a DistGemm over `shards` (workspaces poisoned).
fn build<'a, T: DeviceCopy>(
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    kind: ScheduleKind,
    problem: Problem,
    shards: &'a [Shards<T>],
    share: bool,
) -> DistGemm<'a> {
    let mut dist = DistGemm::builder()
        .devices(gpus.to_vec())
        .schedule(kind)
        .problem(problem)
        .timeout(TIMEOUT)
        .modules(modules.to_vec())
        .ranks_may_share_gpus(share)
        .args(shards.iter().map(Shards::args).collect())
        .build()
        .unwrap_or_else(|e| panic!("{kind}: build: {e}"));
    dist.poison_workspaces(0xFF).expect("poison workspaces");
    dist
}

/// Random inputs of `problem` (from `seed`), `kind`'s plan on `gpus` (TP = gpus.len()) and
/// every rank's shards of the inputs (D poisoned).
fn sharded_inputs<T: Element + DeviceCopy>(
    gpus: &[Gpu],
    kind: ScheduleKind,
    problem: Problem,
    seed: u64,
) -> (Plan, GlobalInputs<T>, Vec<Shards<T>>) {
    let plan = Plan::build(kind, problem, gpus.len()).unwrap_or_else(|e| panic!("{kind}: {e}"));
    let inputs = GlobalInputs::<T>::random(&problem, seed);
    let shards = upload(gpus, &plan, &inputs);
    (plan, inputs, shards)
}

/// [`sharded_inputs`] and what a DistGemm over them needs ([`Setup::dist`]: it borrows the
/// shards).
struct Setup<T: DeviceCopy> {
    gpus: Vec<Gpu>,
    modules: Vec<Arc<Module>>,
    share: bool,
    plan: Plan,
    inputs: GlobalInputs<T>,
    shards: Vec<Shards<T>>,
}

impl<T: DeviceCopy> Setup<T> {
    /// A DistGemm over the shards, workspaces poisoned.
    fn dist(&self) -> DistGemm<'_> {
        build(
            &self.gpus,
            &self.modules,
            self.plan.schedule,
            self.plan.problem,
            &self.shards,
            self.share,
        )
    }
}

fn setup<T: Element + DeviceCopy>(
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    kind: ScheduleKind,
    problem: Problem,
    seed: u64,
    share: bool,
) -> Setup<T> {
    let (plan, inputs, shards) = sharded_inputs(gpus, kind, problem, seed);
    Setup {
        gpus: gpus.to_vec(),
        modules: modules.to_vec(),
        share,
        plan,
        inputs,
        shards,
    }
}

/// Checks `d`, the gathered output of `plan` on `inputs`: bit-exact against the single-GPU
/// kernel (on `gpus[0]`) for all-gather, within the f64 bound for reduce-scatter.
///
/// Bit-exactness holds because every unsplit tile configuration adds an output's K products
/// in the same order (k-block by k-block), whichever tile shape a stage and the whole problem
/// run with. Split-K adds the splits' sums instead, so where the rule splits K in a stage or
/// in the whole problem the all-gather result is checked against the f64 bound too.
fn assert_correct<T: Element + DeviceCopy + ReferenceOperand>(
    what: &str,
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    plan: &Plan,
    inputs: &GlobalInputs<T>,
    d: &[T],
) {
    match plan.schedule.collective() {
        Collective::AllGather if !splits_k(plan, gpus[0].sm_count()) => {
            let want = single_gpu_reference(&gpus[0], &modules[0], &plan.problem, inputs);
            assert_bit_identical(what, d, &want);
        }
        Collective::AllGather | Collective::ReduceScatter => {
            assert_within_bound(what, &modules[0], plan, inputs, d);
        }
    }
}

/// Runs `kind` on `gpus` (TP = gpus.len()) once and checks D ([`assert_correct`]).
fn run_and_check<T: Element + DeviceCopy + ReferenceOperand>(
    test: &str,
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    kind: ScheduleKind,
    problem: Problem,
    share: bool,
) {
    let seed = (problem.m ^ (problem.n << 16)) as u64;
    let s = setup::<T>(gpus, modules, kind, problem, seed, share);
    let mut dist = s.dist();
    dist.run().expect("run");
    dist.wait().unwrap_or_else(|e| panic!("{test} {kind}: {e}"));
    let what = format!("{test} {kind} TP={} {problem}", gpus.len());
    let d = gather(&s.plan, &s.shards);
    assert_correct(&what, gpus, modules, &s.plan, &s.inputs, &d);
    visible_line(&format!(
        "{what}: ok (workspace {} B per device)",
        dist.workspace_bytes(0)
    ));
}

#[test]
fn all_gather_is_bit_identical_to_the_single_gpu_kernel() {
    let test = "gpu_distributed::all_gather_is_bit_identical_to_the_single_gpu_kernel";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    // 2048³, and a ragged-but-valid shape with C (beta ≠ 0): M/2 = 500 rows, N/2 = 392.
    let problems = [
        Problem::new(2048, 2048, 2048),
        Problem::new(1000, 784, 520).with_scalars(1.0, 0.5),
    ];
    for kind in ALL_GATHER {
        for problem in problems {
            run_and_check::<half::bf16>(test, &session.gpus, &modules, kind, problem, false);
        }
    }
}

#[test]
fn reduce_scatter_is_within_the_f64_bound() {
    let test = "gpu_distributed::reduce_scatter_is_within_the_f64_bound";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    for kind in REDUCE_SCATTER {
        run_and_check::<half::bf16>(
            test,
            &session.gpus,
            &modules,
            kind,
            Problem::new(1024, 1024, 1024),
            false,
        );
        // Ragged M, K/2 = 264, f16 (the f16 reduction kernel).
        let ragged = Problem::new(1000, 784, 528).with_dtype(Dtype::F16);
        run_and_check::<half::f16>(test, &session.gpus, &modules, kind, ragged, false);
    }
}

/// TP = 4 and TP = 8 where the machine has that many GPUs with peer access (skipped, visibly,
/// otherwise): every schedule, checked as at TP = 2, on an even problem and on one whose M and
/// N shards are ragged (M/P and N/P not multiples of the tile).
#[test]
fn every_schedule_at_tp4_and_tp8() {
    for tp in [4, 8] {
        let test = format!("gpu_distributed::every_schedule_at_tp4_and_tp8 (TP={tp})");
        let Some(session) = gpu::peer_hopper_gpus(&test, tp) else {
            continue;
        };
        let modules = session.modules().expect("modules");
        for kind in ALL_GATHER {
            for problem in [
                Problem::new(2048, 2048, 2048),
                Problem::new(1000, 1984, 520),
            ] {
                run_and_check::<half::bf16>(&test, &session.gpus, &modules, kind, problem, false);
            }
        }
        for kind in REDUCE_SCATTER {
            for problem in [
                Problem::new(2048, 2048, 2048),
                Problem::new(1000, 1984, 1024),
            ] {
                run_and_check::<half::bf16>(&test, &session.gpus, &modules, kind, problem, false);
            }
        }
    }
}

/// Which of the two input sets run `run` of [`a_thousand_runs_of_one_graph`] uses: an
/// irregular pattern (0 1 0 0 1 0 …), so a run that saw its predecessor's operands, or ran
/// ahead of the barrier, yields the other set's D.
fn input_set(run: usize) -> usize {
    usize::from(run % 3 == 1)
}

/// 1,000 runs of one graph queued back to back, with the operands changing between runs: before
/// each run, every rank's A and B shards are overwritten from one of two input sets, in that
/// rank's stream order right behind its previous run, without waiting for the other rank (the
/// plan's ordering contract for input shards: in all-gather the peer may still be copying the
/// old shard then, and the end-of-run release holds the rank's graph until it has finished).
/// Every run's D is copied aside in stream order and checked: the first run of each set
/// against the reference, every other run bit for bit against it.
#[test]
fn a_thousand_runs_of_one_graph() {
    const RUNS: usize = 1000;
    const BATCH: usize = 10;
    let test = "gpu_distributed::a_thousand_runs_of_one_graph";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    let problem = Problem::new(1024, 1024, 1024);
    for kind in [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherSingleStageB,
        ScheduleKind::ReduceScatterTilingB,
        ScheduleKind::ReduceScatterSingleStageA,
    ] {
        let s = setup::<half::bf16>(&session.gpus, &modules, kind, problem, 11, false);
        let sets = [
            sharded_inputs::<half::bf16>(&session.gpus, kind, problem, 11),
            sharded_inputs::<half::bf16>(&session.gpus, kind, problem, 12),
        ];
        let saved: Vec<Vec<DeviceBuffer<half::bf16>>> = (0..BATCH)
            .map(|_| {
                s.shards
                    .iter()
                    .zip(&session.gpus)
                    .map(|(sh, gpu)| DeviceBuffer::alloc(gpu, sh.d.len()).expect("D copy"))
                    .collect()
            })
            .collect();
        let mut dist = s.dist();
        let streams = dist.streams();
        let copy = |rank: usize, dst: u64, src: u64, bytes: usize| {
            let stream = gpu::raw_stream(&streams[rank]);
            // SAFETY: both buffers live until the end of this iteration, after `wait`; the
            // copy is ordered behind the rank's previous run on its own stream.
            unsafe { copy_device_async(&session.gpus[rank], dst, src, bytes, stream) }
                .expect("stream-ordered copy");
        };
        let mut expected: [Option<Vec<half::bf16>>; 2] = [None, None];
        let start = Instant::now();
        for first in (0..RUNS).step_by(BATCH) {
            for (slot, run) in (first..RUNS.min(first + BATCH)).enumerate() {
                let (_, _, from) = &sets[input_set(run)];
                for (rank, (to, from)) in s.shards.iter().zip(from).enumerate() {
                    copy(
                        rank,
                        to.a.device_ptr(),
                        from.a.device_ptr(),
                        to.a.size_bytes(),
                    );
                    copy(
                        rank,
                        to.b.device_ptr(),
                        from.b.device_ptr(),
                        to.b.size_bytes(),
                    );
                }
                dist.run().expect("run");
                for (rank, sh) in s.shards.iter().enumerate() {
                    let aside = &saved[slot][rank];
                    copy(
                        rank,
                        aside.device_ptr(),
                        sh.d.device_ptr(),
                        sh.d.size_bytes(),
                    );
                }
            }
            dist.wait()
                .unwrap_or_else(|e| panic!("{kind}: runs from {first}: {e}"));
            for (slot, run) in (first..RUNS.min(first + BATCH)).enumerate() {
                let outputs: Vec<Vec<half::bf16>> = saved[slot]
                    .iter()
                    .zip(&s.shards)
                    .map(|(d, sh)| d.download(&sh.stream).expect("download D"))
                    .collect();
                let d = s.plan.gather_output(&outputs).expect("gather D");
                let set = input_set(run);
                match &expected[set] {
                    Some(want) => assert_bit_identical(&format!("{kind} run {run}"), &d, want),
                    None => {
                        let what = format!("{kind} run {run} (input set {set})");
                        let (_, inputs, _) = &sets[set];
                        assert_correct(&what, &session.gpus, &modules, &s.plan, inputs, &d);
                        expected[set] = Some(d);
                    }
                }
            }
        }
        let elapsed = start.elapsed();
        for rank in 0..2 {
            let words = dist.exclusive_words(rank).expect("exclusive");
            assert_eq!(
                words[0], 0,
                "{kind}: device {rank}'s barrier counter after {RUNS} runs"
            );
            assert_eq!(words[1], 0, "{kind}: device {rank}'s error word");
        }
        visible_line(&format!(
            "{test}: {kind}: {RUNS} runs with operands changing between them in {elapsed:?}, \
             every run's D and the counters ok"
        ));
    }
}

#[test]
fn pointer_updates_without_rebuilding() {
    let test = "gpu_distributed::pointer_updates_without_rebuilding";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    let problem = Problem::new(1024, 1024, 1024);
    for kind in [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherSingleStageB,
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterSingleStageB,
    ] {
        let s = setup::<half::bf16>(&session.gpus, &modules, kind, problem, 1, false);
        let (_, second, shards_2) = sharded_inputs::<half::bf16>(&session.gpus, kind, problem, 2);
        let mut dist = s.dist();
        dist.run().expect("run");
        dist.wait().expect("wait");
        let d1 = gather(&s.plan, &s.shards);
        dist.set_args(shards_2.iter().map(Shards::args).collect())
            .unwrap_or_else(|e| panic!("{kind}: set_args: {e}"));
        dist.run().expect("run");
        dist.wait().expect("wait");
        let d2 = gather(&s.plan, &shards_2);
        // The first outputs were not touched by the second run.
        assert_bit_identical(
            &format!("{kind}: first outputs"),
            &gather(&s.plan, &s.shards),
            &d1,
        );
        let what = format!("{kind} after set_args");
        assert_correct(&what, &session.gpus, &modules, &s.plan, &second, &d2);
        visible_line(&format!("{test}: {kind}: ok"));
    }
}

#[test]
fn capped_copies_keep_the_workspace_and_uncap() {
    let test = "gpu_distributed::capped_copies_keep_the_workspace_and_uncap";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    let problem = Problem::new(1024, 1024, 1024);
    for kind in [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherRotatingB,
    ] {
        let s = setup::<half::bf16>(&session.gpus, &modules, kind, problem, 5, false);
        let mut dist = s.dist();
        let want = single_gpu_reference(&session.gpus[0], &modules[0], &problem, &s.inputs);
        let run = |dist: &mut DistGemm<'_>| {
            dist.run().expect("run");
            dist.wait().unwrap_or_else(|e| panic!("{kind}: {e}"));
            gather(&s.plan, &s.shards)
        };
        assert_bit_identical(&format!("{kind}: full copies"), &run(&mut dist), &want);
        // Capped after a full run: the workspace still holds the peer's data.
        dist.set_timing_diagnostics(TimingDiagnostics {
            copy_limit: Some(4096),
            ..TimingDiagnostics::default()
        })
        .expect("cap");
        assert_bit_identical(&format!("{kind}: capped, kept"), &run(&mut dist), &want);
        // Capped over a poisoned workspace: only 4 KiB of the peer's shard arrive, so the
        // peer stage's outputs are NaN.
        dist.poison_workspaces(0xFF).expect("poison");
        let nan = run(&mut dist)
            .iter()
            .filter(|x| x.to_f32().is_nan())
            .count();
        assert!(
            nan >= problem.m * problem.n / 4,
            "{kind}: capped copies over a NaN workspace left only {nan} NaN outputs"
        );
        dist.set_timing_diagnostics(TimingDiagnostics::default())
            .expect("uncap");
        assert_bit_identical(&format!("{kind}: uncapped"), &run(&mut dist), &want);
        visible_line(&format!(
            "{test}: {kind}: ok ({nan} NaN outputs while capped)"
        ));
    }
}

/// The driver's edges match the plan's: same endpoints, programmatic type and port exactly
/// where the plan has a programmatic edge.
fn check_edges(what: &str, dist: &DistGemm<'_>) {
    for (rank, dev) in dist.plan().devices.iter().enumerate() {
        let topology = dist.graph_topology(rank).expect("topology");
        assert_eq!(
            topology.node_count,
            dev.nodes.len(),
            "{what}: device {rank}"
        );
        assert_eq!(
            topology.edges.len(),
            dev.edges.len(),
            "{what}: device {rank}"
        );
        for e in &dev.edges {
            let got = topology
                .edges
                .iter()
                .find(|g| (g.from, g.to) == (e.from, e.to))
                .unwrap_or_else(|| panic!("{what}: device {rank}: edge {e:?} missing"));
            match e.kind {
                EdgeKind::Programmatic | EdgeKind::ProgrammaticDeferred => {
                    assert_eq!(got.kind, DependencyKind::Programmatic, "{what}: {e:?}");
                    assert_eq!((got.from_port, got.to_port), (1, 0), "{what}: {e:?}");
                }
                EdgeKind::Full => {
                    assert_eq!(got.kind, DependencyKind::Default, "{what}: {e:?}");
                    assert_eq!(got.from_port, 0, "{what}: {e:?}");
                }
            }
        }
        let gemm_to_gemm = dev
            .edges
            .iter()
            .filter(|e| {
                e.kind == EdgeKind::Programmatic
                    && dev.nodes[e.from].name() == "gemm"
                    && dev.nodes[e.to].name() == "gemm"
            })
            .count();
        if dist.schedule().is_pipelined() {
            assert_eq!(gemm_to_gemm, dist.plan().tp - 1, "{what}: GEMM chain");
        }
    }
}

#[test]
fn graph_edges_are_the_plans() {
    let test = "gpu_distributed::graph_edges_are_the_plans";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let module = session.module().expect("module");
    // Two ranks on one GPU: the graphs are the same as on two GPUs.
    let gpus = vec![session.gpu.clone(), session.gpu.clone()];
    let modules = vec![module];
    let problem = Problem::new(512, 512, 512);
    for kind in ScheduleKind::ALL {
        let s = setup::<half::bf16>(&gpus, &modules, kind, problem, 3, true);
        check_edges(&format!("{kind}"), &s.dist());
    }
    visible_line(&format!("{test}: every schedule's edges match its plan"));
}

#[test]
fn a_stuck_peer_is_a_named_timeout_not_a_hang() {
    let test = "gpu_distributed::a_stuck_peer_is_a_named_timeout_not_a_hang";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    let problem = Problem::new(1024, 1024, 1024);
    for kind in [
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::AllGatherRotatingB,
    ] {
        let s = setup::<half::bf16>(&session.gpus, &modules, kind, problem, 5, false);
        let mut dist = s.dist();
        let start = Instant::now();
        dist.run_only(&[0]).expect("launch device 0 only");
        let err = dist.wait().expect_err("device 1 never ran");
        let elapsed = start.elapsed();
        assert!(
            matches!(
                &err,
                DistGemmError::Timeout { device: 0, site, .. }
                    if site.node == WaitingNode::Barrier && site.flag.is_none()
            ),
            "{kind}: {err}"
        );
        assert!(
            elapsed < TIMEOUT + Duration::from_secs(5),
            "{kind}: took {elapsed:?}"
        );
        assert!(matches!(dist.run(), Err(DistGemmError::Poisoned(_))));
        visible_line(&format!("{test}: {kind}: {err} (after {elapsed:?})"));
    }
}

#[test]
fn a_missing_signal_names_device_stage_and_flag() {
    let test = "gpu_distributed::a_missing_signal_names_device_stage_and_flag";
    let Some(session) = gpu::peer_hopper_gpus(test, 2) else {
        return;
    };
    let modules = session.modules().expect("modules");
    let problem = Problem::new(1024, 1024, 1024);
    // (schedule, flag whose store is dropped, the node that then waits in vain)
    let cases = [
        // Device 1's stage-1 GEMM signals flag 1 of device 0; device 0's stage 1 waits.
        (
            ScheduleKind::ReduceScatterTilingA,
            FlagRef {
                device: 0,
                index: 1,
            },
            WaitingNode::Gemm,
            1,
        ),
        // Device 1's flag set after its copy sets its own flag 1; its stage-1 GEMM waits.
        (
            ScheduleKind::AllGatherRotatingA,
            FlagRef {
                device: 1,
                index: 1,
            },
            WaitingNode::Gemm,
            1,
        ),
        // Device 1's reduction signals flag 1 of device 0; device 0's reduction waits.
        (
            ScheduleKind::ReduceScatterSingleStageA,
            FlagRef {
                device: 0,
                index: 1,
            },
            WaitingNode::Reduce,
            1,
        ),
    ];
    for (kind, flag, node, stage) in cases {
        let (_, _, shards) = sharded_inputs::<half::bf16>(&session.gpus, kind, problem, 6);
        let mut dist = DistGemm::builder()
            .devices(session.gpus.clone())
            .schedule(kind)
            .problem(problem)
            .timeout(TIMEOUT)
            .modules(modules.clone())
            .inject_missing_signal(flag)
            .args(shards.iter().map(Shards::args).collect())
            .build()
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        let start = Instant::now();
        dist.run().expect("run");
        let err = dist.wait().expect_err("the flag is never set");
        let elapsed = start.elapsed();
        assert!(
            matches!(
                &err,
                DistGemmError::Timeout { site, .. }
                    if site.device == flag.device && site.node == node && site.stage == stage
                        && site.flag == Some(flag)
            ),
            "{kind}: {err}"
        );
        assert!(
            elapsed < TIMEOUT + Duration::from_secs(5),
            "{kind}: took {elapsed:?}"
        );
        visible_line(&format!("{test}: {kind}: {err} (after {elapsed:?})"));
    }
}

#[test]
fn tp1_plans_on_one_gpu() {
    let test = "gpu_distributed::tp1_plans_on_one_gpu";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let modules = vec![session.module().expect("module")];
    let gpus = vec![session.gpu.clone()];
    // A ragged prefill, and decode batches of 96 and 40 tokens, whose stage GEMMs the
    // weight-stream rule gives the narrow 64-row tiles (two m-tiles, the last one partial);
    // rows 16 bytes off 32-byte boundaries (K ≡ 8 mod 16), where every stage runs in 2-block
    // clusters (`128x256c2`); and 16 tokens of long K, on the transposed split tile
    // (`16x128ts`). The unit test
    // `the_one_gpu_test_problems_cover_every_kind_of_stage_configuration` holds the rule to
    // the last two.
    for problem in [
        Problem::new(1000, 784, 520),
        Problem::new(96, 784, 520),
        Problem::new(40, 4096, 1024),
        Problem::new(2048, 2048, 4104),
        Problem::new(16, 2304, 16384),
    ] {
        for kind in ScheduleKind::ALL {
            run_and_check::<half::bf16>(test, &gpus, &modules, kind, problem, false);
        }
    }
}

#[test]
fn two_ranks_on_one_gpu() {
    let test = "gpu_distributed::two_ranks_on_one_gpu";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let modules = vec![session.module().expect("module")];
    // Small enough that both ranks' kernels are resident together (checked by the builder).
    let gpus = vec![session.gpu.clone(), session.gpu.clone()];
    let problem = Problem::new(1024, 1024, 1024);
    // And a decode batch of 128 tokens: 64-row stages (all-gather) on the narrow tiles.
    for p in [problem, Problem::new(128, 1024, 1024)] {
        for kind in ScheduleKind::ALL {
            run_and_check::<half::bf16>(test, &gpus, &modules, kind, p, true);
        }
    }
    // And the rule's other kinds of configuration in stages (the unit test
    // `the_one_gpu_test_problems_cover_every_kind_of_stage_configuration` holds it to them):
    // 2-block clusters on rows off 32-byte boundaries (the all-gathers with K ≡ 8 mod 16, the
    // reduce-scatters with A's second half 16 bytes off), split-K (64 tokens of long K in the
    // all-gathers: stream-K grids capped to the rank's share of the SMs) and the transposed
    // decode tiles (16 tokens).
    for (collective, p) in [
        (Some(Collective::AllGather), Problem::new(2048, 4096, 4104)),
        (
            Some(Collective::ReduceScatter),
            Problem::new(2048, 2048, 4112),
        ),
        (Some(Collective::AllGather), Problem::new(64, 2048, 8192)),
        (None, Problem::new(16, 4608, 16384)),
    ] {
        let kinds = ScheduleKind::ALL.into_iter();
        for kind in kinds.filter(|k| collective.is_none_or(|c| c == k.collective())) {
            run_and_check::<half::bf16>(test, &gpus, &modules, kind, p, true);
        }
    }
    // And a hundred back-to-back runs of a reduce-scatter ring on one GPU.
    let kind = ScheduleKind::ReduceScatterTilingA;
    let s = setup::<half::bf16>(&gpus, &modules, kind, problem, 9, true);
    let mut dist = s.dist();
    for _ in 0..100 {
        dist.run().expect("run");
    }
    dist.wait()
        .unwrap_or_else(|e| panic!("{kind} x100 on one GPU: {e}"));
    let d = gather(&s.plan, &s.shards);
    assert_within_bound("100 runs, one GPU", &modules[0], &s.plan, &s.inputs, &d);
    visible_line(&format!("{test}: 100 runs of {kind} on one GPU: ok"));
}

/// Shapes nobody listed, two ranks on one GPU: 24 problems drawn from a fixed seed (so a
/// failure reproduces) by `random_problem` (at most 2²⁹ products, the f64 check's time),
/// three of every schedule, bf16 and f16 alternately. Each is checked as [`run_and_check`]
/// checks.
#[test]
fn two_ranks_on_one_gpu_random_shapes() {
    let test = "gpu_distributed::two_ranks_on_one_gpu_random_shapes";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let modules = vec![session.module().expect("module")];
    let gpus = vec![session.gpu.clone(), session.gpu.clone()];
    let mut rng = SmallRng::seed_from_u64(0x2_4A4B);
    for (i, kind) in ScheduleKind::ALL.into_iter().cycle().take(24).enumerate() {
        let problem = random_problem(kind, gpus.len(), &mut rng, 1 << 29);
        if i % 2 == 0 {
            run_and_check::<half::bf16>(test, &gpus, &modules, kind, problem, true);
        } else {
            let problem = problem.with_dtype(Dtype::F16);
            run_and_check::<half::f16>(test, &gpus, &modules, kind, problem, true);
        }
    }
}

#[test]
fn bad_setups_are_errors() {
    let test = "gpu_distributed::bad_setups_are_errors";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let problem = Problem::new(1024, 1024, 1024);
    let kind = ScheduleKind::AllGatherRotatingA;
    // Too few devices.
    let err = DistGemm::builder()
        .devices(vec![session.gpu.clone()])
        .tp(2)
        .schedule(kind)
        .problem(problem)
        .build()
        .expect_err("one GPU for TP=2");
    assert!(
        matches!(err, DistGemmError::TooFewDevices { tp: 2, given: 1 }),
        "{err}"
    );
    // The same GPU twice without opting in.
    let err = DistGemm::builder()
        .devices(vec![session.gpu.clone(), session.gpu.clone()])
        .schedule(kind)
        .problem(problem)
        .build()
        .expect_err("shared GPU");
    assert!(matches!(err, DistGemmError::SharedGpu { .. }), "{err}");
    // Indivisible shape.
    let err = DistGemm::builder()
        .devices(vec![session.gpu.clone(), session.gpu.clone()])
        .ranks_may_share_gpus(true)
        .schedule(kind)
        .problem(Problem::new(1023, 1024, 1024))
        .build()
        .expect_err("M odd");
    assert!(matches!(err, DistGemmError::Plan(_)), "{err}");
    // Buffers too small.
    let gpus = vec![session.gpu.clone(), session.gpu.clone()];
    let (_, _, shards) = sharded_inputs::<half::bf16>(&gpus, kind, problem, 4);
    let mut args: Vec<DeviceArgs> = shards.iter().map(Shards::args).collect();
    let small = DeviceBuffer::<half::bf16>::alloc(&session.gpu, 8).expect("small");
    args[1].d = (&small).into();
    let err = DistGemm::builder()
        .devices(gpus)
        .ranks_may_share_gpus(true)
        .schedule(kind)
        .problem(problem)
        .args(args)
        .build()
        .expect_err("D too small");
    assert!(
        matches!(
            err,
            DistGemmError::BadBuffer {
                device: 1,
                buffer: BufferKind::D,
                ..
            }
        ),
        "{err}"
    );
    visible_line(&format!("{test}: ok"));
}

/// FP8 (e4m3 A and B, bf16 C and D) through every schedule at TP = 2 in both scale modes,
/// both ranks on one GPU: every element of D against `reference::check_scaled` (e4m3 values
/// and scales exact in f64; the bound of `ErrorBound::scaled` with the schedule's roundings),
/// D poisoned with NaN before each run. Tensor-wise scales go to the builder; row-wise, every
/// device gets the full M and N scale vectors with its buffers. Then the scales change in
/// place — `set_fp8_scales`, or `set_args` with new scale vectors — and the next run must
/// match the reference with the new ones (the stage GEMMs' alpha or scale pointers rewritten).
#[test]
fn fp8_on_every_schedule_in_both_scale_modes_two_ranks_on_one_gpu() {
    let test = "gpu_distributed::fp8_on_every_schedule_in_both_scale_modes_two_ranks_on_one_gpu";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let module = session.module().expect("module");
    for mode in [ScaleMode::Tensorwise, ScaleMode::Rowwise] {
        for kind in ScheduleKind::ALL {
            fp8_case(test, &session.gpu, &module, kind, mode);
        }
    }
}

/// One schedule of [`fp8_on_every_schedule_in_both_scale_modes_two_ranks_on_one_gpu`].
fn fp8_case(test: &str, gpu: &Gpu, module: &Arc<Module>, kind: ScheduleKind, mode: ScaleMode) {
    use distgemm::cuda::{BufferRef, Fp8RowScales};
    use distgemm::fp8::{E4m3, Scales};
    use distgemm::plan::Fp8Inputs;
    use distgemm::reference::check_scaled_products;
    let gpus = vec![gpu.clone(), gpu.clone()];
    let bytes = |v: &[E4m3]| v.iter().map(|x| x.to_bits()).collect::<Vec<u8>>();
    // beta·C on the all-gather schedules; reduce-scatter keeps its partial sums in C, so
    // beta = 0 there (the plan refuses anything else).
    let beta = match kind.collective() {
        Collective::AllGather => 0.5,
        Collective::ReduceScatter => 0.0,
    };
    let problem = Problem::new(512, 768, 1024)
        .with_scalars(0.75, beta)
        .with_fp8(mode);
    let builder = || {
        DistGemm::builder()
            .devices(gpus.clone())
            .ranks_may_share_gpus(true)
            .modules(vec![Arc::clone(module); 2])
            .schedule(kind)
            .problem(problem)
    };
    let plan = builder()
        .plan()
        .unwrap_or_else(|e| panic!("{kind} {mode:?}: plan: {e}"));
    let inputs = Fp8Inputs::<half::bf16>::random(&problem, 0xF8 + kind as u64);
    // The second round's scales: A's doubled, B's quartered (powers of two keep them exact).
    let rescale = |s: &Scales| match s {
        Scales::Tensorwise { a, b } => Scales::Tensorwise {
            a: 2.0 * a,
            b: 0.25 * b,
        },
        Scales::Rowwise { a, b } => Scales::Rowwise {
            a: a.iter().map(|x| 2.0 * x).collect(),
            b: b.iter().map(|x| 0.25 * x).collect(),
        },
    };
    let rounds = [inputs.scales.clone(), rescale(&inputs.scales)];
    let shards = plan.shard_fp8_inputs(&inputs).expect("shard");
    let stream = gpu.new_stream().expect("stream");
    let upload = |v: &[u8]| DeviceBuffer::from_host(gpu, &stream, v).expect("upload");
    let (mut operands, mut outputs) = (Vec::new(), Vec::new());
    for (shard, dev) in shards.iter().zip(&plan.devices) {
        let (a, b) = (upload(&bytes(&shard.a)), upload(&bytes(&shard.b)));
        let c = shard
            .c
            .as_ref()
            .map(|c| DeviceBuffer::from_host(gpu, &stream, c).expect("C"));
        let d =
            DeviceBuffer::<half::bf16>::alloc(gpu, dev.buffer_elements(BufferKind::D)).expect("D");
        operands.push((a, b, c));
        outputs.push(d);
    }
    // Row-wise: each round's full scale vectors, one copy per device.
    let vectors: Vec<Vec<(DeviceBuffer<f32>, DeviceBuffer<f32>)>> = rounds
        .iter()
        .map(|scales| match scales {
            Scales::Rowwise { a, b } => (0..plan.tp)
                .map(|_| {
                    let up = |v: &[f32]| DeviceBuffer::from_host(gpu, &stream, v).expect("scales");
                    (up(a), up(b))
                })
                .collect(),
            Scales::Tensorwise { .. } => Vec::new(),
        })
        .collect();
    // D is handed over as a raw reference so that the test can poison it between runs
    // (after `wait`, when no run uses it).
    let d_raw: Vec<(u64, usize, usize)> = outputs
        .iter()
        .map(|d| (d.device_ptr(), d.size_bytes(), d.ordinal()))
        .collect();
    let args = |round: usize| -> Vec<DeviceArgs<'_>> {
        operands
            .iter()
            .zip(&d_raw)
            .enumerate()
            .map(|(dev, ((a, b, c), &(ptr, size, ordinal)))| DeviceArgs {
                a: a.into(),
                b: b.into(),
                c: c.as_ref().map(Into::into),
                // SAFETY: D (`outputs`) outlives `dist` (declared before it) and is written by
                // the test only between `wait` and the next `run`.
                d: unsafe { BufferRef::from_raw(ptr, size, ordinal) },
                row_scales: vectors[round].get(dev).map(|(sa, sb)| Fp8RowScales {
                    a: sa.into(),
                    b: sb.into(),
                }),
            })
            .collect()
    };
    let mut dist = match &rounds[0] {
        Scales::Tensorwise { a, b } => builder().fp8_scales(*a, *b),
        Scales::Rowwise { .. } => builder(),
    }
    .args(args(0))
    .build()
    .unwrap_or_else(|e| panic!("{kind} {mode:?}: build: {e}"));
    // The rounds change the scales only: the f64 sums of the codes are computed once, on the
    // GPU, and each round's check applies its scales to them.
    let shape = (problem.m, problem.n, problem.k);
    let sums = packed_products(module, &inputs.a, &inputs.b, shape)
        .unwrap_or_else(|e| panic!("{kind} {mode:?}: f64 reference on the GPU: {e}"));
    for (round, scales) in rounds.iter().enumerate() {
        if round > 0 {
            match scales {
                Scales::Tensorwise { a, b } => dist.set_fp8_scales(*a, *b),
                Scales::Rowwise { .. } => dist.set_args(args(round)),
            }
            .unwrap_or_else(|e| panic!("{kind} {mode:?}: new scales: {e}"));
        }
        for d in &mut outputs {
            d.fill(&stream, half::bf16::NAN).expect("poison D");
        }
        distgemm::runtime::stream::synchronize(&stream).expect("sync");
        dist.run()
            .unwrap_or_else(|e| panic!("{kind} {mode:?}: run: {e}"));
        dist.wait()
            .unwrap_or_else(|e| panic!("{kind} {mode:?}: wait: {e}"));
        let downloaded: Vec<Vec<half::bf16>> = outputs
            .iter()
            .map(|d| d.download(&stream).expect("download D"))
            .collect();
        let d = plan.gather_output(&downloaded).expect("gather D");
        let roundings = kind.roundings(plan.tp);
        let c = inputs.c.as_deref();
        let report = check_scaled_products(&problem, roundings, plan.tp, &sums, scales, c, &d)
            .expect("reference");
        assert_eq!(
            report.mismatches, 0,
            "{kind} {mode:?} round {round}: {report:?}"
        );
        visible_line(&format!(
            "{test}: {kind} {mode:?} round {round}: ok (worst {:.2} of the bound)",
            report.worst_ratio
        ));
    }
    // Tensor-wise scales out of range, or given to a row-wise plan, are refused.
    assert!(
        dist.set_fp8_scales(f32::NAN, 1.0).is_err(),
        "{kind} {mode:?}"
    );
}
