//! One process per rank: [`RankGemm`] over CUDA IPC, two rank processes sharing one GPU.
//!
//! A kernel spinning on a flag in one process sees a flag that another process's kernel sets
//! through a CUDA IPC mapping of the same GPU (time-sliced, with or without MPS), so the whole
//! TP=2 protocol — barrier, flags, copies of the peer's shard, the neighbour's partials — runs
//! on one GPU. Times mean nothing here; correctness does.
//!
//! The test re-executes this binary twice (`DISTGEMM_RANK_TEST=<rank>,<socket>,<section>`);
//! each child joins a [`LocalRendezvous`] and runs the section. Inputs are hash-generated per
//! element (values in ±[0.25, 1), never zero), so a rank makes exactly its shards and the
//! reference needs no global copy; every D is poisoned (NaN) before every run. Checks:
//! - `schedules`: every schedule, bf16 and f16, ragged shapes (beta = 1 for the all-gathers
//!   and alpha = 0.5 for the reduce-scatters in two of them; one of 14 rows, decode) and the
//!   four Llama-3 presets at 2·64 tokens (the all-gather-A and reduce-scatter-A families the
//!   PyTorch package runs): all-gather D bit-identical to distgemm's single-GPU kernel run as
//!   the rank's stage GEMMs are (same shapes, same grid); reduce-scatter within the f64 bound
//!   of `distgemm::reference`, every element (its f64 sums computed on the GPU);
//! - `repeat` (all-gather A; reduce-scatter A with read and with pushed partials): 1,000
//!   runs alternating two input sets at new addresses, D checked after each; 64 runs queued
//!   with no host synchronisation, each into its own D, all checked; then the caller's shard
//!   overwritten on its stream right after each launch, and the zero-copy input slot;
//! - `random`: 16 problems drawn at random from a fixed seed, two of every schedule, bf16 and
//!   f16, checked as the ragged shapes of `schedules` are;
//! - `host-cost`: the host time of a launch (same addresses, new addresses, zero-copy) and of
//!   a build at 256 tokens, printed;
//! - `killed`: rank 1 exits after building; rank 0 gets a named timeout within the bound;
//! - `cycles`: 1,000 build/run/drop cycles; open file descriptors and free device memory do
//!   not drift.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distgemm::cuda::{DistGemmError, LocalRendezvous, RankArgs, RankGemm, Rendezvous};
use distgemm::dtype::Element;
use distgemm::gemm::{GemmArgs, GemmKernel, MatrixView};
use distgemm::plan::Plan;
use distgemm::problem::{Preset, Problem};
use distgemm::reference::check_products;
use distgemm::reference::gpu::{ReferenceOperand, packed_products};
use distgemm::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module};
use distgemm::schedule::{Block, BufferKind, Collective, RsPartials, ScheduleKind};
use distgemm_tests::gpu::{self, visible_line};
use distgemm_tests::shapes::random_problem;
use half::{bf16, f16};
use rand::SeedableRng;
use rand::rngs::SmallRng;

const CHILD_ENV: &str = "DISTGEMM_RANK_TEST";
const TP: usize = 2;
/// Bound of every GPU wait (a failure costs seconds).
const TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `section` in two rank processes and waits (bounded) for both.
fn run_ranks(test: &str, section: &str, limit: Duration) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    drop(session);
    let socket = std::env::temp_dir().join(format!(
        "distgemm-ranks-{}-{section}.sock",
        std::process::id()
    ));
    let exe = std::env::current_exe().expect("test binary");
    let name = test.rsplit("::").next().unwrap_or(test);
    let mut children: Vec<Child> = (0..TP)
        .map(|rank| {
            Command::new(&exe)
                .args([name, "--exact", "--nocapture", "--test-threads", "1"])
                .env(CHILD_ENV, format!("{rank},{},{section}", socket.display()))
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let start = Instant::now();
    let mut status = [None; TP];
    while status.iter().any(Option::is_none) {
        for (rank, child) in children.iter_mut().enumerate() {
            if status[rank].is_none() {
                status[rank] = child.try_wait().expect("wait for a rank");
            }
        }
        if start.elapsed() > limit {
            for child in &mut children {
                let _ = child.kill();
            }
            panic!("{test}: the ranks did not finish within {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (rank, s) in status.iter().enumerate() {
        let s = s.expect("finished");
        assert!(s.success(), "{test}: rank {rank} failed ({s})");
    }
    visible_line(&format!(
        "{test}: both ranks passed in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
}

#[test]
fn every_schedule_across_two_processes() {
    run_ranks(
        "gpu_ranks::every_schedule_across_two_processes",
        "schedules",
        Duration::from_secs(900),
    );
}

#[test]
fn random_shapes_across_two_processes() {
    run_ranks(
        "gpu_ranks::random_shapes_across_two_processes",
        "random",
        Duration::from_secs(600),
    );
}

#[test]
fn repeated_runs_with_new_and_overwritten_inputs() {
    run_ranks(
        "gpu_ranks::repeated_runs_with_new_and_overwritten_inputs",
        "repeat",
        Duration::from_secs(600),
    );
}

#[test]
fn host_cost_of_a_launch() {
    run_ranks(
        "gpu_ranks::host_cost_of_a_launch",
        "host-cost",
        Duration::from_secs(300),
    );
}

#[test]
fn a_rank_that_dies_is_a_named_timeout() {
    run_ranks(
        "gpu_ranks::a_rank_that_dies_is_a_named_timeout",
        "killed",
        Duration::from_secs(120),
    );
}

#[test]
fn build_and_drop_cycles_leak_nothing() {
    run_ranks(
        "gpu_ranks::build_and_drop_cycles_leak_nothing",
        "cycles",
        Duration::from_secs(600),
    );
}

/// One rank process.
struct Rank {
    rank: usize,
    gpu: Gpu,
    module: Arc<Module>,
    stream: Arc<CudaStream>,
    rendezvous: Arc<dyn Rendezvous>,
}

fn child(spec: &str) {
    let mut parts = spec.splitn(3, ',');
    let rank: usize = parts.next().and_then(|r| r.parse().ok()).expect("rank");
    let socket = parts.next().expect("socket").to_owned();
    let section = parts.next().expect("section").to_owned();
    let gpu = Gpu::open(0).expect("GPU 0");
    let module = Module::load(&gpu).expect("PTX module");
    let stream = gpu.new_stream().expect("stream");
    let rendezvous: Arc<dyn Rendezvous> = Arc::new(
        LocalRendezvous::join(socket.as_ref(), rank, TP, Duration::from_secs(120))
            .expect("rendezvous"),
    );
    let r = Rank {
        rank,
        gpu,
        module,
        stream,
        rendezvous,
    };
    match section.as_str() {
        "schedules" => schedules(&r),
        "random" => random(&r),
        "repeat" => repeat(&r),
        "host-cost" => host_cost(&r),
        "killed" => killed(&r),
        "cycles" => cycles(&r),
        other => panic!("unknown section {other}"),
    }
}

// ---- inputs and references ----------------------------------------------------------------

/// Element (row, col) of matrix `which` (0 = A, 1 = B, 2 = C) for `seed`: ±[0.25, 1).
fn value(seed: u64, which: u64, row: usize, col: usize) -> f32 {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(which << 60)
        .wrapping_add((row as u64) << 32)
        .wrapping_add(col as u64);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let u = (x >> 40) as f32 / (1u64 << 24) as f32;
    let v = 0.25 + 0.75 * u;
    if x & 1 == 1 { -v } else { v }
}

/// The packed block of matrix `which`, rounded to `T` (multi-threaded).
fn block_of<T: Element>(seed: u64, which: u64, b: Block) -> Vec<T> {
    let mut out = vec![T::from_f32(0.0); b.rows * b.cols];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(16));
    let rows_per = b.rows.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(rows_per * b.cols.max(1)).enumerate() {
            s.spawn(move || {
                for (i, x) in chunk.iter_mut().enumerate() {
                    let (r, c) = (t * rows_per + i / b.cols, i % b.cols);
                    *x = T::from_f32(value(seed, which, b.row0 + r, b.col0 + c));
                }
            });
        }
    });
    out
}

/// This rank's shards and output of one problem, on the GPU.
struct Shards<T: DeviceCopy> {
    a: DeviceBuffer<T>,
    b: DeviceBuffer<T>,
    c: Option<DeviceBuffer<T>>,
    d: DeviceBuffer<T>,
}

impl<T: DeviceCopy> Shards<T> {
    fn args(&self) -> RankArgs {
        RankArgs {
            a: self.a.device_ptr(),
            b: self.b.device_ptr(),
            c: self.c.as_ref().map_or(0, DeviceBuffer::device_ptr),
            d: self.d.device_ptr(),
            a_scales: 0,
            b_scales: 0,
        }
    }
}

fn upload<T: Element + DeviceCopy>(r: &Rank, plan: &Plan, seed: u64) -> Shards<T> {
    let shards = &plan.devices[r.rank].shards;
    let up = |which, b| DeviceBuffer::from_host(&r.gpu, &r.stream, &block_of::<T>(seed, which, b));
    Shards {
        a: up(0, shards.a).expect("A"),
        b: up(1, shards.b).expect("B"),
        c: shards.c.map(|c| up(2, c).expect("C")),
        d: DeviceBuffer::alloc(&r.gpu, shards.d.elements()).expect("D"),
    }
}

/// distgemm's single-GPU kernel on the rows of A and B that make this rank's D block, launched
/// as the rank's stage GEMMs are: one launch per stage, on the stage's rows and columns, with
/// the grid capped as for two ranks on one GPU (`(SMs − 1) / 2` blocks). Each element is then
/// the same dot product in the same order as in the distributed run — a split-K
/// configuration's k-ranges depend on the launch's shape (the rule) and grid (the stream-K
/// partition), so one launch over the whole block would sum some elements in another order.
/// Where this rank's own shard of A or B already holds a stage's rows (the all-gather
/// schedules keep one operand whole), they are read in place instead of generated and
/// uploaded again — a 405B weight shard is 1.7 GB.
fn single_gpu_block<T: Element + DeviceCopy>(
    r: &Rank,
    plan: &Plan,
    seed: u64,
    shards: &Shards<T>,
) -> Vec<T> {
    let p = &plan.problem;
    let device = &plan.devices[r.rank];
    let own = &device.shards;
    let d = own.d;
    let size = std::mem::size_of::<T>() as u64;
    // Rows `row0..row0 + rows` (global) of operand `which`, whole K: in place when the shard
    // holds them, else a fresh upload kept alive by the returned buffer.
    let rows_of = |which: u64, row0: usize, rows: usize, shard: Block, buffer: &DeviceBuffer<T>| {
        if shard.cols == p.k && shard.row0 <= row0 && row0 + rows <= shard.row0 + shard.rows {
            let skip = ((row0 - shard.row0) * p.k) as u64;
            (buffer.device_ptr() + skip * size, None)
        } else {
            let block = Block {
                row0,
                col0: 0,
                rows,
                cols: p.k,
            };
            let copy =
                DeviceBuffer::from_host(&r.gpu, &r.stream, &block_of::<T>(seed, which, block))
                    .expect("reference rows");
            (copy.device_ptr(), Some(copy))
        }
    };
    let mut out = DeviceBuffer::<T>::alloc(&r.gpu, d.elements()).expect("D");
    out.fill_bytes(&r.stream, 0xFF).expect("poison");
    let kernel = GemmKernel::new(&r.module).expect("GEMM kernels");
    let blocks = (r.gpu.sm_count() - 1) / TP as u32;
    let mut covered = 0;
    for stage in device.gemms() {
        assert_eq!(
            stage.d.buffer,
            BufferKind::D,
            "an all-gather stage writes D"
        );
        let (m, n) = (stage.shape.m, stage.shape.n);
        // The stage's block of D, in D's coordinates.
        let (i0, j0) = (stage.d.offset / d.cols, stage.d.offset % d.cols);
        let (a_ptr, _a_copy) = rows_of(0, d.row0 + i0, m, own.a, &shards.a);
        let (b_ptr, _b_copy) = rows_of(1, d.col0 + j0, n, own.b, &shards.b);
        let c = own.c.map(|c| {
            let block = Block {
                row0: c.row0 + i0,
                col0: c.col0 + j0,
                rows: m,
                cols: n,
            };
            DeviceBuffer::from_host(&r.gpu, &r.stream, &block_of::<T>(seed, 2, block)).expect("C")
        });
        let (m, n, k) = (m as u64, n as u64, p.k as u64);
        let args = GemmArgs {
            dtype: p.dtype,
            a: MatrixView::dense(a_ptr, m, k),
            b: MatrixView::dense(b_ptr, n, k),
            c: c.as_ref().map(|c| MatrixView::dense(c.device_ptr(), m, n)),
            d: MatrixView {
                ptr: out.device_ptr() + stage.d.offset as u64 * size,
                rows: m,
                cols: n,
                ld: d.cols as u64,
            },
            alpha: p.alpha,
            beta: p.beta,
        };
        let mut prepared = kernel.prepare(&r.stream, &args).expect("prepare");
        prepared.cap_grid(blocks);
        // SAFETY: A, B (the shards or the copies held above), C and D are live buffers of the
        // viewed sizes; the stream is synchronised by the download before they are dropped.
        unsafe { prepared.launch(&r.stream, false) }.expect("launch");
        distgemm::runtime::stream::synchronize(&r.stream).expect("reference stage");
        covered += m * n;
    }
    assert_eq!(covered, d.elements() as u64, "the stages cover the D block");
    out.download(&r.stream).expect("download")
}

/// Checks every element of this rank's block of D against the f64 reference: the sums
/// computed on the rank's GPU (`reference::gpu::products`) from the block's rows of A and of
/// B, compared by `reference::check_products` with the bound for the schedule's roundings (the
/// block checked as a problem of its own rows and columns, the same K and scalars).
fn check_f64<T: Element + ReferenceOperand>(what: &str, r: &Rank, plan: &Plan, seed: u64, d: &[T]) {
    let p = &plan.problem;
    let blk = plan.devices[r.rank].shards.d;
    let rows = |which, row0, rows| {
        let whole_k = Block {
            row0,
            col0: 0,
            rows,
            cols: p.k,
        };
        block_of::<T>(seed, which, whole_k)
    };
    let (a, b) = (rows(0, blk.row0, blk.rows), rows(1, blk.col0, blk.cols));
    let sums = packed_products(&r.module, &a, &b, (blk.rows, blk.cols, p.k))
        .unwrap_or_else(|e| panic!("{what}: f64 reference on the GPU: {e}"));
    let c = p.has_c().then(|| block_of::<T>(seed, 2, blk));
    let block = Problem {
        m: blk.rows,
        n: blk.cols,
        ..*p
    };
    let roundings = plan.schedule.roundings(plan.tp);
    let report = check_products(&block, roundings, plan.tp, &sums, c.as_deref(), d)
        .unwrap_or_else(|e| panic!("{what}: check: {e}"));
    assert!(
        report.passed(),
        "{what}: {} of {} elements outside the f64 bound (worst {:.2}× at block element {})",
        report.mismatches,
        report.elements,
        report.worst_ratio,
        report.worst_index
    );
}

fn assert_bit_identical<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    let diff = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    assert_eq!(
        diff, 0,
        "{what}: {diff} elements differ from the single-GPU kernel"
    );
}

fn build(r: &Rank, kind: ScheduleKind, problem: Problem) -> Result<RankGemm, DistGemmError> {
    build_with(r, kind, problem, RsPartials::Read)
}

fn build_with(
    r: &Rank,
    kind: ScheduleKind,
    problem: Problem,
    partials: RsPartials,
) -> Result<RankGemm, DistGemmError> {
    RankGemm::builder()
        .rs_partials(partials)
        .gpu(r.gpu.clone())
        .module(Arc::clone(&r.module))
        .schedule(kind)
        .problem(problem)
        .timeout(TIMEOUT)
        .allow_shared_gpu(true)
        .build(Arc::clone(&r.rendezvous))
}

/// One launch on the test's stream, waited for and checked for GPU errors.
fn run_once(r: &Rank, dg: &mut RankGemm, args: RankArgs) {
    // SAFETY: the shards are live allocations of the plan's sizes on this GPU, and stay
    // untouched until the synchronisation below.
    unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), args) }.expect("launch");
    dg.synchronize().expect("run");
}

// ---- sections -------------------------------------------------------------------------------

fn check_case<T: Element + DeviceCopy + ReferenceOperand>(
    r: &Rank,
    kind: ScheduleKind,
    problem: Problem,
) {
    let problem = problem.with_dtype(T::DTYPE);
    let what = format!("rank {} {kind} {problem}", r.rank);
    // Where a case's time goes (the presets' weight shards are GBs): printed with the verdict.
    let start = Instant::now();
    let mut dg = build(r, kind, problem).unwrap_or_else(|e| panic!("{what}: build: {e}"));
    let plan = dg.plan().clone();
    let seed = (problem.m * 31 + problem.n * 7 + problem.k) as u64;
    let built = start.elapsed();
    let mut shards = upload::<T>(r, &plan, seed);
    shards.d.fill_bytes(&r.stream, 0xFF).expect("poison D");
    let uploaded = start.elapsed();
    run_once(r, &mut dg, shards.args());
    let d = shards.d.download(&r.stream).expect("D");
    let ran = start.elapsed();
    match kind.collective() {
        Collective::AllGather => {
            assert_bit_identical(&what, &d, &single_gpu_block::<T>(r, &plan, seed, &shards));
        }
        Collective::ReduceScatter => check_f64(&what, r, &plan, seed, &d),
    }
    let secs = |d: Duration| d.as_secs_f64();
    visible_line(&format!(
        "{what}: ok (build {:.1} s, inputs {:.1} s, run {:.1} s, check {:.1} s)",
        secs(built),
        secs(uploaded - built),
        secs(ran - uploaded),
        secs(start.elapsed() - ran)
    ));
}

fn schedules(r: &Rank) {
    let ragged = [
        Problem::new(200, 336, 272),
        Problem::new(72, 1040, 528).with_scalars(1.0, 1.0),
        // Decode: at most 16 rows a stage GEMM, K too short to split, so the stages run the
        // 16-row tile with its register epilogue (C from the neighbour for reduce-scatter).
        Problem::new(14, 1040, 528).with_scalars(1.0, 1.0),
    ];
    for kind in ScheduleKind::ALL {
        for problem in ragged {
            // Reduce-scatter keeps its partial sums in C, so it takes beta = 0 (a scaled
            // alpha instead); the all-gathers run the beta = 1 case.
            let problem = match kind.collective() {
                Collective::ReduceScatter if problem.beta != 0.0 => problem.with_scalars(0.5, 0.0),
                _ => problem,
            };
            check_case::<bf16>(r, kind, problem);
            check_case::<f16>(r, kind, problem);
        }
    }
    let families = [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherSingleStageA,
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterSingleStageA,
    ];
    for preset in Preset::ALL {
        for kind in families {
            check_case::<bf16>(r, kind, preset.problem(TP * 64));
        }
    }
}

/// Shapes nobody listed: 16 problems drawn from a fixed seed by `random_problem` (both ranks
/// draw the same; at most 2²⁹ products), two of every schedule, bf16 and f16 alternately,
/// every element checked as `schedules` checks the ragged shapes.
fn random(r: &Rank) {
    let mut rng = SmallRng::seed_from_u64(0x0024_A4B2);
    for (i, kind) in ScheduleKind::ALL.into_iter().cycle().take(16).enumerate() {
        let problem = random_problem(kind, TP, &mut rng, 1 << 29);
        if i % 2 == 0 {
            check_case::<bf16>(r, kind, problem);
        } else {
            check_case::<f16>(r, kind, problem);
        }
    }
}

fn repeat(r: &Rank) {
    for (kind, partials) in [
        (ScheduleKind::AllGatherRotatingA, RsPartials::Read),
        (ScheduleKind::ReduceScatterTilingA, RsPartials::Read),
        (ScheduleKind::ReduceScatterTilingA, RsPartials::Push),
    ] {
        let problem = Problem::new(256, 512, 384);
        let what = format!("rank {} {kind} ({partials:?} partials) repeat", r.rank);
        let mut dg = build_with(r, kind, problem, partials).expect("build");
        let plan = dg.plan().clone();
        let sets = [11u64, 12];
        let mut shards: Vec<Shards<bf16>> = sets.iter().map(|&s| upload(r, &plan, s)).collect();
        // The expected D of each input set: the first run's, proved correct once.
        let mut expected = Vec::new();
        for (set, &seed) in sets.iter().enumerate() {
            shards[set].d.fill_bytes(&r.stream, 0xFF).expect("poison");
            run_once(r, &mut dg, shards[set].args());
            let d = shards[set].d.download(&r.stream).expect("D");
            match kind.collective() {
                Collective::AllGather => {
                    assert_bit_identical(
                        &what,
                        &d,
                        &single_gpu_block::<bf16>(r, &plan, seed, &shards[set]),
                    );
                }
                Collective::ReduceScatter => check_f64(&what, r, &plan, seed, &d),
            }
            expected.push(d);
        }
        for i in 0..1000 {
            let set = i % 2;
            shards[set].d.fill_bytes(&r.stream, 0xFF).expect("poison");
            run_once(r, &mut dg, shards[set].args());
            let d = shards[set].d.download(&r.stream).expect("D");
            assert_bit_identical(&format!("{what} run {i}"), &d, &expected[set]);
        }
        visible_line(&format!("{what}: 1000 runs at alternating addresses ok"));
        // Queued: 64 launches alternating the input sets, each into its own poisoned D, with
        // no host synchronisation between them (pointer updates and tensor-map re-encoding
        // while earlier runs are still in flight), then every D checked.
        let plan_d = plan.devices[r.rank].shards.d.elements();
        let mut outputs: Vec<DeviceBuffer<bf16>> = (0..64)
            .map(|_| DeviceBuffer::alloc(&r.gpu, plan_d).expect("D"))
            .collect();
        for d in &mut outputs {
            d.fill_bytes(&r.stream, 0xFF).expect("poison");
        }
        for (i, d) in outputs.iter().enumerate() {
            let mut args = shards[i % 2].args();
            args.d = d.device_ptr();
            // SAFETY: both input sets and every D are live buffers of the plan's sizes, kept
            // until the synchronisation below.
            unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), args) }.expect("launch");
        }
        dg.synchronize().expect("queued runs");
        for (i, d) in outputs.iter().enumerate() {
            let got = d.download(&r.stream).expect("D");
            assert_bit_identical(&format!("{what} queued run {i}"), &got, &expected[i % 2]);
        }
        visible_line(&format!(
            "{what}: 64 queued runs at alternating addresses ok"
        ));
        // The caller's shard overwritten on its stream right after the launch (as a caching
        // allocator reuses memory): peers must never see the new bytes.
        let original = shards[0].a.download(&r.stream).expect("A");
        for i in 0..50 {
            shards[0].d.fill_bytes(&r.stream, 0xFF).expect("poison");
            // SAFETY: as in `run_once`; the overwrite below is ordered after the launch on the
            // same stream, which is what the contract allows.
            unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), shards[0].args()) }.expect("launch");
            shards[0]
                .a
                .fill_bytes(&r.stream, 0x3C)
                .expect("overwrite A");
            dg.synchronize().expect("run");
            let d = shards[0].d.download(&r.stream).expect("D");
            assert_bit_identical(&format!("{what} overwrite {i}"), &d, &expected[0]);
            shards[0].a.upload(&r.stream, &original).expect("restore A");
        }
        if let Some(slot) = dg.input_slot() {
            assert_eq!(slot.kind, BufferKind::A);
            for i in 0..50 {
                let mut args = shards[0].args();
                // SAFETY: both are live device buffers of `slot.bytes` bytes on this GPU.
                unsafe {
                    distgemm::runtime::caller_stream::copy_device_async(
                        &r.gpu,
                        slot.ptr,
                        args.a,
                        slot.bytes,
                        gpu::raw_stream(&r.stream),
                    )
                }
                .expect("fill the slot");
                args.a = slot.ptr;
                shards[0].d.fill_bytes(&r.stream, 0xFF).expect("poison");
                // SAFETY: as above; the slot is overwritten only after the launch, in stream
                // order, which the end-of-run release makes safe.
                unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), args) }.expect("launch");
                // SAFETY: as above.
                unsafe {
                    distgemm::runtime::caller_stream::copy_device_async(
                        &r.gpu,
                        slot.ptr,
                        shards[1].a.device_ptr(),
                        slot.bytes,
                        gpu::raw_stream(&r.stream),
                    )
                }
                .expect("overwrite the slot");
                dg.synchronize().expect("run");
                let d = shards[0].d.download(&r.stream).expect("D");
                assert_bit_identical(&format!("{what} zero-copy {i}"), &d, &expected[0]);
            }
        }
        visible_line(&format!("{what}: overwritten inputs never reached a peer"));
    }
}

fn killed(r: &Rank) {
    let problem = Problem::new(256, 512, 384);
    let mut dg = build(r, ScheduleKind::AllGatherRotatingA, problem).expect("build");
    if r.rank == 1 {
        // Dies without launching or tearing down.
        std::process::exit(0);
    }
    let plan = dg.plan().clone();
    let shards = upload::<bf16>(r, &plan, 5);
    let start = Instant::now();
    // SAFETY: as in `run_once`.
    unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), shards.args()) }.expect("launch");
    let err = dg.synchronize().expect_err("the peer is gone");
    let elapsed = start.elapsed();
    let text = err.to_string();
    assert!(
        matches!(err, DistGemmError::Timeout { device: 0, .. }),
        "{text}"
    );
    assert!(text.contains("barrier"), "{text}");
    assert!(elapsed < TIMEOUT * 3, "took {elapsed:?}");
    assert!(matches!(
        unsafe { dg.launch_raw(gpu::raw_stream(&r.stream), shards.args()) },
        Err(DistGemmError::Poisoned(_))
    ));
    let closed = dg.close();
    assert!(closed.is_err(), "teardown with a dead peer must report it");
    visible_line(&format!(
        "rank 0: {text} (after {:.1} s)",
        elapsed.as_secs_f64()
    ));
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

fn cycles(r: &Rank) {
    let problem = Problem::new(256, 512, 384);
    let kinds = [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::ReduceScatterTilingA,
    ];
    let plans: Vec<Plan> = kinds
        .iter()
        .map(|&k| Plan::build(k, problem, TP).expect("plan"))
        .collect();
    let shards: Vec<Shards<bf16>> = plans.iter().map(|p| upload(r, p, 3)).collect();
    let mut baseline = None;
    for i in 0..1000 {
        let which = i % 2;
        let mut dg = build(r, kinds[which], problem).expect("build");
        run_once(r, &mut dg, shards[which].args());
        drop(dg);
        if i == 19 {
            r.gpu.synchronize().expect("sync");
            baseline = Some((open_fds(), r.gpu.memory_info().expect("memory").0));
        }
    }
    r.gpu.synchronize().expect("sync");
    let (fds, free) = (open_fds(), r.gpu.memory_info().expect("memory").0);
    let (fds0, free0) = baseline.expect("baseline");
    visible_line(&format!(
        "rank {}: after 1000 cycles: fds {fds0} -> {fds}, free device memory {free0} -> {free}",
        r.rank
    ));
    assert!(fds <= fds0, "file descriptors grew from {fds0} to {fds}");
    // The other rank allocates and frees concurrently: allow one cycle's worth of noise.
    assert!(
        free + (64 << 20) >= free0,
        "device memory shrank from {free0} to {free}"
    );
}

/// Host-side cost of `launch_raw` (what a framework's call pays before the GPU runs), at a
/// 256-token 70B fc1 and fc2 shape, on each path: the same addresses as the last launch, new
/// addresses every launch (graph parameter update with tensor maps re-encoded), and the
/// zero-copy input slot. Median over 200 launches each, printed (times on a shared GPU mean
/// nothing; the host cost does).
fn host_cost(r: &Rank) {
    for (kind, preset) in [
        (ScheduleKind::AllGatherRotatingA, Preset::ALL[0]),
        (ScheduleKind::ReduceScatterTilingA, Preset::ALL[1]),
    ] {
        let problem = preset.problem(256);
        let build_start = Instant::now();
        let mut dg = build(r, kind, problem).expect("build");
        let build_ms = build_start.elapsed().as_secs_f64() * 1e3;
        let plan = dg.plan().clone();
        let sets: Vec<Shards<bf16>> = (0..2).map(|s| upload(r, &plan, 40 + s)).collect();
        let stream = gpu::raw_stream(&r.stream);
        let slot = dg.input_slot();
        let mut median_us = |label: &str, args: &dyn Fn(usize) -> RankArgs| {
            let mut times = Vec::with_capacity(200);
            for i in 0..200 {
                let a = args(i);
                let start = Instant::now();
                // SAFETY: both input sets are live shards of the plan's sizes; runs are
                // synchronised below before anything is freed.
                unsafe { dg.launch_raw(stream, a) }.expect("launch");
                times.push(start.elapsed().as_secs_f64() * 1e6);
                if i % 20 == 19 {
                    dg.synchronize().expect("runs");
                }
            }
            dg.synchronize().expect("runs");
            times.sort_by(f64::total_cmp);
            visible_line(&format!(
                "rank {} {kind} {problem}: {label}: median {:.1} µs per launch (host)",
                r.rank,
                times[times.len() / 2]
            ));
        };
        median_us("same addresses", &|_| sets[0].args());
        median_us("new addresses every call", &|i| sets[i % 2].args());
        if let Some(slot) = slot {
            let mut args = sets[0].args();
            args.a = slot.ptr;
            median_us("zero-copy input slot", &move |_| args);
        }
        visible_line(&format!(
            "rank {} {kind} {problem}: build {build_ms:.1} ms (module loaded once before)",
            r.rank
        ));
    }
}
