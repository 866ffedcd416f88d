//! distgemm side by side with everything it should beat, measured in one run (issue 6, items 5
//! and 6).
//!
//! For every preset (Llama-3 70B/405B fc1/fc2, M = `--tokens`, default 16384) and every
//! schedule (the four pipelined ones, their single-stage variants, and `auto(<family>)`: what
//! distgemm's `Auto` rule picks within each family, reusing that schedule's measurement), on TP
//! GPUs:
//!
//! | column | what is timed | where |
//! |---|---|---|
//! | (a) | the full M×N×K GEMM on one GPU: our kernel and cuBLASLt | GPU 0 |
//! | (b) | the single-stage GEMM of the schedule's family without communication: every device's GEMM node(s) of the `*-single` schedule's plan (e.g. M×N/P×K for `ag-a`) on its own GPU, our kernel; the shape shown is device 0's | all TP GPUs |
//! | (c) | the P stage GEMMs of the family's pipelined plan, back to back with PDL, no communication, our kernel, every device's on its own GPU | all TP GPUs |
//! | (d) | distgemm itself (`host/src/cuda` `DistGemm`, graphs built once): one `run()` per repetition, `wait()` checked afterwards | all TP GPUs |
//! | (e) | NCCL collective + cuBLASLt GEMM in sequence on every GPU (all-gather of A for `ag-a*`, of B for `ag-b*`, GEMM then reduce-scatter of row blocks for `rs-*`) | all TP GPUs |
//! | (f) | PyTorch async TP: `torch.ops.symm_mem.fused_all_gather_matmul` (gathers A) for the all-gather families, `fused_matmul_reduce_scatter` (scatters rows) for the reduce-scatter ones, from `peers/torch_async_tp.py` (the same `--settle-ms`, and `--rounds` = `ROUNDS`: it settles and interleaves like our blocks, the fused op in turns with PyTorch's own local matmul) | all TP GPUs, separate processes |
//!
//! With `--diagnose`, also for the pipelined schedules, in the same rounds: for all-gather the
//! `DIAGNOSTICS`, variants of (c) and (d) that leave parts out ((c) as one CUDA graph per
//! device, alone or with one more node: a 4 KiB copy (local, pulled from the next GPU or
//! pushed into it over NVLink), a kernel reading 4 KiB or 16 B from the next GPU, or the barrier
//! kernel (alone, or with (d)'s rendezvous: remote atomics over NVLink); (d) with its copies
//! cut to `COPY_CAP` bytes after one full run, then also uncoupled and without flag waits); for
//! the pipelined reduce-scatter schedules the `SCATTER_DIAGNOSTICS` ((d) reading the
//! neighbour's partial from its own device); in the JSON's `diagnostics` and the section
//! "Where the overhead over (c) goes"; and for every
//! family, each contender's mean SM clock and board power per device over its blocks' timed
//! part (NVML, sampled every `POWER_SAMPLE_PERIOD` by a thread from `power_skip` after the
//! block starts until it ends; the power is NVML's one-second average), in the JSON's
//! `power` and the section "SM clock and board power per contender": under the power cap,
//! the same power at a lower clock means more energy per cycle, less power means idle time.
//!
//! Derived: TFLOP/s per GPU = 2·M·N·K / TP / (d); "% of (b)" = (b)/(d) and "% of (c)" =
//! (c)/(d) (how much of the no-communication GEMM speed distgemm keeps); % of 989 TFLOP/s
//! (dense bf16 peak of H100/H200 SXM); speed-up = (e)/(d) and (f)/(d).
//!
//! Method: operands filled with N(0,1)-like values on the GPU (`fill_normal`); every timed
//! block starts with ≥ 1 s of untimed runs (`SETTLE_MS`, or `--settle-ms`; the estimate is
//! from the FLOPs per GPU at `PLANNING_TFLOPS`: the GPUs are power-capped, and a block timed
//! before the limiter has converged on its load reads fast after idle and depends on what ran
//! before it), then ≥ 20 timed repetitions
//! bracketed by CUDA events (per device for the multi-GPU columns); the slowest device's median
//! repetition is reported (`distgemm::timing` explains why not the median of each
//! repetition's slowest device, which the JSON keeps for (d) as `distgemm_per_rep_max_ms`).
//! A family's (b), (c), its two (d) schedules and its (e) are prepared together and timed in
//! interleaved rounds on all TP GPUs (order reversed each round), so the ratios between them are not skewed by clock and power drift between
//! measurements taken minutes apart (the two reduce-scatter families measure the same (e),
//! each in its own rounds). No input rotation: every working set here is several times the
//! 50 MiB L2 (a warning is printed if one is not).
//! A column that cannot be measured is `null` in the JSON with the reason in `missing`.
//!
//! Usage (the bundle's runner passes a FILTER and `--bench`):
//! `distgemm [FILTER] [--bench] [--tp N] [--tokens M] [--dtype bf16|f16] [--reps N] [--quick]
//!  [--sweep] [--diagnose] [--no-torch] [--python PATH] [--torch-timeout S] [--settle-ms MS]`
//! - `--quick`: 70B presets only, 20 repetitions;
//! - `--settle-ms MS`: untimed work at the start of every block (default `SETTLE_MS`), for
//!   checking that the power limiter has settled;
//! - `--sweep`: instead of the table, the token sweep M ∈ {256, …, 16384} for 70B fc1/fc2: all
//!   eight schedules, judged in the preset's natural family (`ag-a` for fc1, `rs-a` for fc2):
//!   its pipelined vs its single-stage schedule vs (e), where pipelining stops paying and
//!   whether `Auto` follows; writes `distgemm-sweep-<date>-<commit>.{json,md}`.
//! - `--diagnose`: the table with the diagnostic variants (below) beside the pipelined
//!   all-gather schedules (three times as many blocks: with 1 s of settling each, use
//!   `--quick` or a FILTER to stay within a 10-minute call);
//! - FILTER keeps rows whose id `distgemm/<preset>/<schedule>` contains it.
//!
//! Writes `distgemm-<date>-<commit>[-<options>].{json,md}` (`results_stem`: a suffix for each
//! option that changes the measurement, so runs with different options keep their own files)
//! under `DISTGEMM_BENCH_RESULTS` or
//! `benches/results/`. The PyTorch script is found in `DISTGEMM_PEERS_DIR`, else
//! `<bench binary>/../peers/`, else `benches/peers/` of the source tree; the interpreter is
//! `--python`, else `DISTGEMM_PYTHON`, else `python3`.

use distgemm::baseline::{
    CublasLtGemm, NcclElement, NcclGemmBaseline, NcclGemmKind, NcclGemmLayout, TnGemmShape,
};
use distgemm::cuda::{
    BarrierParams, DistGemm, REDUCE_SMEM_BYTES, REDUCE_THREADS, ReduceParams, TimingDiagnostics,
};
use distgemm::dtype::Dtype;
use distgemm::gemm::{GemmArgs, GemmKernel, MatrixView, PreparedGemm};
use distgemm::plan::{DevicePlan, Plan};
use distgemm::problem::{Preset, Problem};
use distgemm::runtime::stream::DependencyKind;
use distgemm::runtime::{
    CudaStream, DeviceBuffer, Gpu, Graph, GraphExec, KernelArgs, LaunchConfig, Module,
    enable_peer_access_between, hopper_gpus,
};
use distgemm::schedule::{BufferKind, CSource, Collective, GemmStage, ScheduleKind, View};
use distgemm::testdata::{RandomShard, fill_normal, random_shards};
use distgemm_benches::distgemm_report::{
    ContenderPower, Diagnostic, Options, Record, SWEEP_TOKENS, Sched, SweepPoint, TABLE_HEADER,
    TORCH_AG, TorchResults, USAGE, find_peer_script, missing_notes, ms, nccl_kind_of,
    overhead_split, parse_args, pipelined_of, pipelining_threshold, power_split, presets,
    results_stem, row_id, run_peer_command, single_stage_of, table_row, timing_for, torch_op_of,
    verdicts,
};
use distgemm_benches::energy::{ClockPower, PowerSampler};
use distgemm_benches::{
    BenchError, MIN_TIMED_REPS, Provenance, ROUNDS, Timing, TimingConfig, interleaved, results_dir,
    time_on_stream, time_on_streams,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the PyTorch script once; never fails (a failure is recorded in the result).
fn run_torch(o: &Options, presets: &[Preset], tokens: &[usize], tp: usize) -> TorchResults {
    let script = match find_peer_script() {
        Ok(s) => s,
        Err(e) => return TorchResults::failed(e),
    };
    let python = o
        .python
        .clone()
        .or_else(|| {
            std::env::var("DISTGEMM_PYTHON")
                .ok()
                .filter(|p| !p.is_empty())
        })
        .unwrap_or_else(|| "python3".into());
    let join = |v: Vec<String>| v.join(",");
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--presets")
        .arg(join(presets.iter().map(|p| p.name().to_owned()).collect()))
        .arg("--tokens")
        .arg(join(tokens.iter().map(|t| t.to_string()).collect()))
        .arg("--tp")
        .arg(tp.to_string())
        .arg("--dtype")
        .arg(o.dtype.name())
        .arg("--reps")
        .arg(o.reps.unwrap_or(30).to_string())
        .arg("--rounds")
        .arg(ROUNDS.to_string())
        .arg("--settle-ms")
        .arg(o.settle_ms.to_string())
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NCCL_NVLS_ENABLE", "0")
        .env("NVSHMEM_DISABLE_NVLS", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    println!("== PyTorch peer: {python} {}", script.display());
    run_peer_command(
        cmd,
        Duration::from_secs(o.torch_timeout_s),
        "--torch-timeout",
    )
}

// ------------------------------------------------------------------------------------------
// GPU measurements
// ------------------------------------------------------------------------------------------

struct Ctx {
    gpus: Vec<Gpu>,
    modules: Vec<Arc<Module>>,
    /// The GEMM kernel on every GPU (`kernels[d]` from `modules[d]`); GPU 0's also runs (a).
    kernels: Vec<GemmKernel>,
    opts: Options,
    l2_bytes: u64,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn warn_if_in_l2(ctx: &Ctx, what: &str, bytes: u64) {
    if bytes < 3 * ctx.l2_bytes {
        println!(
            "   warning: {what}: working set {} MiB is below 3× L2; repetitions may hit in L2",
            bytes >> 20
        );
    }
}

/// Our kernel's and cuBLASLt's timing, each possibly missing with the reason.
type PairOfTimings = (Result<Timing, String>, Result<Timing, String>);

/// (a): the full problem on GPU 0, our kernel and cuBLASLt, on the same operands.
fn single_gpu<T: NcclElement>(ctx: &Ctx, (m, n, k): (u64, u64, u64)) -> PairOfTimings {
    let run = || -> Result<PairOfTimings, String> {
        let gpu = &ctx.gpus[0];
        let module = &ctx.modules[0];
        let stream = gpu.new_stream().map_err(err)?;
        let mut a = DeviceBuffer::<T>::alloc(gpu, (m * k) as usize).map_err(err)?;
        let mut b = DeviceBuffer::<T>::alloc(gpu, (n * k) as usize).map_err(err)?;
        let mut d = DeviceBuffer::<T>::alloc(gpu, (m * n) as usize).map_err(err)?;
        fill_normal(module, &stream, &mut a, 11).map_err(err)?;
        fill_normal(module, &stream, &mut b, 12).map_err(err)?;
        warn_if_in_l2(ctx, "single GPU", 2 * (m * k + n * k + m * n));
        let timing = timing_for(2.0 * (m * n * k) as f64, &ctx.opts);
        let args = GemmArgs::dense(
            T::DTYPE,
            a.device_ptr(),
            b.device_ptr(),
            d.device_ptr(),
            (m, n, k),
        );
        let ours = ctx.kernels[0]
            .prepare(&stream, &args)
            .map_err(err)
            .and_then(|g| {
                time_on_stream(gpu, &stream, timing, |_| Ok(g.launch(&stream, false)?)).map_err(err)
            });
        let cublas = CublasLtGemm::<T>::new(gpu, stream.clone(), TnGemmShape::packed(m, n, k))
            .map_err(err)
            .and_then(|lt| {
                time_on_stream(gpu, &stream, timing, |_| {
                    lt.run(&a, &b, None, &mut d, 1.0, 0.0)
                        .map_err(|e| BenchError::Work(e.to_string()))
                })
                .map_err(err)
            });
        Ok((ours, cublas))
    };
    match run() {
        Ok(r) => r,
        Err(e) => (Err(e.clone()), Err(e)),
    }
}

/// Device `dev`'s buffers of a plan, allocated on GPU `dev` and filled with random values
/// (inputs and workspace; the workspace stands in for data a peer would have sent).
struct PlanBuffers<T: NcclElement> {
    dev: usize,
    a: DeviceBuffer<T>,
    b: DeviceBuffer<T>,
    c: DeviceBuffer<T>,
    d: DeviceBuffer<T>,
    ws: DeviceBuffer<T>,
}

impl<T: NcclElement> PlanBuffers<T> {
    fn new(ctx: &Ctx, dev: usize, plan: &DevicePlan, stream: &CudaStream) -> Result<Self, String> {
        let gpu = &ctx.gpus[dev];
        let module = &ctx.modules[dev];
        let alloc = |kind| DeviceBuffer::<T>::alloc(gpu, plan.buffer_elements(kind)).map_err(err);
        let mut s = PlanBuffers {
            dev,
            a: alloc(BufferKind::A)?,
            b: alloc(BufferKind::B)?,
            c: alloc(BufferKind::C)?,
            d: alloc(BufferKind::D)?,
            ws: alloc(BufferKind::Workspace)?,
        };
        for (i, buf) in [&mut s.a, &mut s.b, &mut s.c, &mut s.ws]
            .into_iter()
            .enumerate()
        {
            if !buf.is_empty() {
                let seed = 21 + 8 * dev as u32 + i as u32;
                fill_normal(module, stream, buf, seed).map_err(err)?;
            }
        }
        Ok(s)
    }

    fn buffer(&self, kind: BufferKind) -> &DeviceBuffer<T> {
        match kind {
            BufferKind::A => &self.a,
            BufferKind::B => &self.b,
            BufferKind::C => &self.c,
            BufferKind::D => &self.d,
            BufferKind::Workspace => &self.ws,
        }
    }

    /// The view on this GPU's own buffer of the same kind (a peer's buffer has the same
    /// layout, so a remote operand is replaced by the local one: compute without
    /// communication).
    fn local(&self, v: &View) -> Result<MatrixView, String> {
        let buf = self.buffer(v.buffer);
        if v.end() > buf.len() {
            return Err(format!(
                "view {v:?} does not fit device {}'s {} buffer",
                self.dev,
                v.buffer.name()
            ));
        }
        Ok(MatrixView {
            ptr: buf.device_ptr() + (v.offset * size_of::<T>()) as u64,
            rows: v.rows as u64,
            cols: v.cols as u64,
            ld: v.ld as u64,
        })
    }

    fn args(&self, g: &GemmStage) -> Result<GemmArgs, String> {
        let c = match &g.epilogue.source {
            CSource::None => None,
            CSource::Local(v) | CSource::Peer(v) => Some(self.local(v)?),
        };
        Ok(GemmArgs {
            dtype: T::DTYPE,
            a: self.local(&g.a)?,
            b: self.local(&g.b)?,
            c,
            d: self.local(&g.d)?,
            alpha: g.epilogue.alpha,
            beta: g.epilogue.beta,
        })
    }
}

/// "M×N×K" of a plan's GEMM nodes, e.g. "2×(8192×28672×8192)".
fn stage_shapes(dev: &DevicePlan) -> String {
    let shapes: Vec<String> = dev
        .gemms()
        .map(|g| format!("{}×{}×{}", g.shape.m, g.shape.n, g.shape.k))
        .collect();
    match shapes.first() {
        Some(first) if shapes.iter().all(|s| s == first) && shapes.len() > 1 => {
            format!("{}×({first})", shapes.len())
        }
        _ => shapes.join(" + "),
    }
}

/// A prepared contender: times one block of repetitions (its own state captured).
type Block<'a> = Box<dyn FnMut(TimingConfig) -> Result<Timing, String> + 'a>;

/// One device's prepared GEMM launches and the buffers they read and write (dropped after
/// them).
struct DeviceGemms<T: NcclElement> {
    gemms: Vec<PreparedGemm>,
    bufs: PlanBuffers<T>,
    /// The words of a graph's extra barrier node ([`GraphExtra::Barrier`]).
    extra_words: Option<DeviceBuffer<u32>>,
}

/// What a (c) graph has besides its GEMM nodes (diagnostics: one of (d)'s other nodes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GraphExtra {
    Nothing,
    /// A 4 KiB copy node that stage 1 follows.
    Copy,
    /// The same, pulling from the next GPU over NVLink.
    PeerCopy,
    /// The same, pushing into the next GPU's workspace over NVLink (the copy engine writes
    /// remote memory instead of reading it).
    PeerPush,
    /// A kernel node before stage 0 (programmatic edge) whose SMs read this many bytes (a
    /// multiple of 16, at most `COPY_CAP`) from the next GPU over NVLink (the reduction kernel
    /// with one peer source): NVLink traffic without the copy engine.
    PeerRead(usize),
    /// A barrier kernel node before stage 0 (programmatic edge), alone: no peers, nothing to
    /// wait for.
    Barrier,
    /// The same with (d)'s rendezvous: it arrives at every other GPU's counter (remote
    /// atomics over NVLink) and waits for their arrivals.
    PeerBarrier,
}

/// Every TP device's [`DeviceGemms`] and its stream (`streams[d]` on GPU d); with `graphs`,
/// each device's GEMMs as one CUDA graph (kernel nodes, programmatic edges between consecutive
/// ones: (d)'s GEMM nodes without its barrier, copies and flags).
struct PlanRun<T: NcclElement> {
    devices: Vec<DeviceGemms<T>>,
    streams: Vec<Arc<CudaStream>>,
    graphs: Vec<(Graph, GraphExec)>,
}

impl<T: NcclElement> PlanRun<T> {
    /// Launches every device's GEMMs on its stream, back to back, PDL between consecutive ones
    /// of a device: as stream launches, or as the device's graph.
    fn launch_all(&self) -> Result<(), BenchError> {
        if !self.graphs.is_empty() {
            for ((_, exec), stream) in self.graphs.iter().zip(&self.streams) {
                exec.launch(stream)?;
            }
            return Ok(());
        }
        for (dev, stream) in self.devices.iter().zip(&self.streams) {
            for (i, g) in dev.gemms.iter().enumerate() {
                g.launch(stream, i > 0)?;
            }
        }
        Ok(())
    }

    /// Builds every device's graph of its GEMMs (see [`PlanRun`]), with `extra` nodes. "The
    /// next GPU" of device d is d + 1 mod TP.
    fn into_graphs(mut self, ctx: &Ctx, extra: GraphExtra) -> Result<Self, String> {
        let tp = self.devices.len();
        let next = |d: usize| (d + 1) % tp;
        let remote = matches!(
            extra,
            GraphExtra::PeerCopy
                | GraphExtra::PeerPush
                | GraphExtra::PeerRead(_)
                | GraphExtra::PeerBarrier
        );
        if remote {
            for d in 0..tp {
                for q in (d + 1)..tp {
                    enable_peer_access_between(&ctx.gpus[d], &ctx.gpus[q]).map_err(err)?;
                }
            }
        }
        // Every device's B and workspace: where the 4 KiB copies and reads come from and go.
        let b: Vec<u64> = self.devices.iter().map(|d| d.bufs.b.device_ptr()).collect();
        let ws: Vec<u64> = self
            .devices
            .iter()
            .map(|d| d.bufs.ws.device_ptr())
            .collect();
        if self
            .devices
            .iter()
            .any(|d| d.bufs.b.size_bytes() < COPY_CAP || d.bufs.ws.size_bytes() < COPY_CAP)
        {
            return Err("buffers smaller than the copy".into());
        }
        if matches!(extra, GraphExtra::Barrier | GraphExtra::PeerBarrier) {
            // The barrier's counter and error word on every GPU, zeroed (`fill` waits) before
            // any graph that arrives at them exists.
            for (d, dev) in self.devices.iter_mut().enumerate() {
                let mut words = DeviceBuffer::<u32>::alloc(&ctx.gpus[d], 2).map_err(err)?;
                words.fill(&self.streams[d], 0).map_err(err)?;
                dev.extra_words = Some(words);
            }
        }
        let counters: Vec<u64> = self
            .devices
            .iter()
            .map(|d| d.extra_words.as_ref().map_or(0, |w| w.device_ptr()))
            .collect();
        for (d, dev) in self.devices.iter_mut().enumerate() {
            let gpu = &ctx.gpus[d];
            let mut graph = Graph::new(gpu).map_err(err)?;
            let mut previous = None;
            if matches!(extra, GraphExtra::Barrier | GraphExtra::PeerBarrier) {
                // (d)'s first node: alone, with nothing to reset, no peers and 0 arrivals to
                // wait for (uncoupled); with peers, arriving at every other GPU's counter and
                // waiting for their arrivals, as (d)'s rendezvous does.
                let mut params = BarrierParams {
                    counter: counters[d],
                    error_word: counters[d] + 4,
                    timeout_ns: 1_000_000_000,
                    ..BarrierParams::default()
                };
                if extra == GraphExtra::PeerBarrier {
                    for (i, q) in (0..tp).filter(|&q| q != d).enumerate() {
                        params.arrive[i] = counters[q];
                    }
                    params.arrive_count = (tp - 1) as u32;
                    params.arrivals = (tp - 1) as u32;
                }
                let kernel = ctx.modules[d].kernel("collective_barrier").map_err(err)?;
                let mut args = KernelArgs::new().by_value(&params);
                // SAFETY: `collective_barrier(p: BarrierParams)`; its words (own and peers')
                // are owned by `self.devices`, which outlives the graphs.
                let node = unsafe {
                    graph.add_kernel_node(&kernel, &LaunchConfig::linear(1, 1), &mut args)
                }
                .map_err(err)?;
                previous = Some(node);
            }
            if let GraphExtra::PeerRead(bytes) = extra {
                // One block of the reduction kernel summing a single source: `bytes` of the
                // next GPU's B, read by this GPU's SMs, into the workspace.
                let elements = (bytes.min(COPY_CAP) / size_of::<T>()) as u32;
                let mut params = ReduceParams {
                    dst: ws[d],
                    rows: 1,
                    cols: elements,
                    dst_ld: elements,
                    source_count: 1,
                    ..ReduceParams::default()
                };
                params.sources[0] = b[next(d)];
                params.source_ld[0] = elements;
                let name = match T::DTYPE {
                    Dtype::Bf16 => "reduce_sum_bf16",
                    Dtype::F16 => "reduce_sum_f16",
                };
                let kernel = ctx.modules[d].kernel(name).map_err(err)?;
                let mut args = KernelArgs::new().by_value(&params);
                let cfg =
                    LaunchConfig::linear(1, REDUCE_THREADS).with_dynamic_smem(REDUCE_SMEM_BYTES);
                // SAFETY: `reduce_sum_*(p: ReduceParams)` over 4 KiB of two buffers of at least
                // COPY_CAP bytes (checked above) that outlive the graph; no flags.
                let node =
                    unsafe { graph.add_kernel_node(&kernel, &cfg, &mut args) }.map_err(err)?;
                previous = Some(node);
            }
            let mut nodes = Vec::new();
            for g in &dev.gemms {
                let mut args = g.kernel_args();
                // SAFETY: the parameter block is the prepared GEMM's own (its tensor maps are
                // owned by `g`, the operands by `dev`); both outlive the graph (`self`).
                let node = unsafe {
                    graph.add_kernel_node(g.kernel(), &g.launch_config(false), &mut args)
                }
                .map_err(err)?;
                if let Some(p) = previous {
                    graph
                        .add_dependency(p, node, DependencyKind::Programmatic)
                        .map_err(err)?;
                }
                previous = Some(node);
                nodes.push(node);
            }
            // 4 KiB on the copy engine, which stage 1 follows with a full edge: (d)'s copy
            // node, cut; from this GPU's B into its workspace, pulled from the next GPU's B,
            // or pushed into the next GPU's workspace.
            let copy = match extra {
                GraphExtra::Copy => Some((ws[d], b[d])),
                GraphExtra::PeerCopy => Some((ws[d], b[next(d)])),
                GraphExtra::PeerPush => Some((ws[next(d)], b[d])),
                _ => None,
            };
            if let (Some((dst, src)), Some(&stage1)) = (copy, nodes.get(1)) {
                // SAFETY: both buffers hold at least COPY_CAP bytes (checked above) and outlive
                // the graph.
                let copy = unsafe { graph.add_memcpy_node(dst, src, COPY_CAP) }.map_err(err)?;
                graph
                    .add_dependency(copy, stage1, DependencyKind::Default)
                    .map_err(err)?;
            }
            let exec = graph.instantiate().map_err(err)?;
            self.graphs.push((graph, exec));
        }
        Ok(self)
    }

    /// Times one block of [`Self::launch_all`] on every device's stream. A method, so that a
    /// closure calling it captures the whole struct: one that named only `run.devices` or
    /// `run.streams` would capture just that field (disjoint closure captures) and free the
    /// rest early.
    fn time_block(&self, gpus: &[Gpu], timing: TimingConfig) -> Result<Timing, String> {
        time_on_streams(gpus, &self.streams, timing, |_| self.launch_all()).map_err(err)
    }
}

/// (b)/(c): every device's GEMM nodes of `kind`'s plan, each on its own GPU with that GPU's
/// kernel and buffers, back to back (PDL between them), no communication and no flags; all TP
/// GPUs at once, timed like (d). Returns the block, its timing and device 0's stage shapes.
fn plan_gemms_block<'a, T: NcclElement>(
    ctx: &'a Ctx,
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
    graphs: Option<GraphExtra>,
) -> Result<(Block<'a>, TimingConfig, String), String> {
    let plan = Plan::build(kind, problem, tp).map_err(|e| format!("{}: {e}", kind.cli_name()))?;
    let gpus = &ctx.gpus[..tp];
    if plan.devices.len() != tp {
        return Err(format!(
            "{}: the plan has {} devices for TP = {tp}",
            kind.cli_name(),
            plan.devices.len()
        ));
    }
    let mut devices = Vec::with_capacity(tp);
    let mut streams = Vec::with_capacity(tp);
    for (d, dev) in plan.devices.iter().enumerate() {
        let stream = ctx.gpus[d].new_stream().map_err(err)?;
        let bufs = PlanBuffers::<T>::new(ctx, d, dev, &stream)?;
        let gemms: Vec<PreparedGemm> = dev
            .gemms()
            .map(|g| {
                let args = bufs.args(g)?;
                ctx.kernels[d].prepare(&stream, &args).map_err(err)
            })
            .collect::<Result<_, _>>()?;
        if gemms.is_empty() {
            return Err(format!("device {d}'s plan has no GEMM"));
        }
        devices.push(DeviceGemms {
            gemms,
            bufs,
            extra_words: None,
        });
        streams.push(stream);
    }
    let dev0 = &plan.devices[0];
    let flops = plan
        .devices
        .iter()
        .map(|dev| dev.gemms().map(|g| g.shape.flops()).sum::<f64>())
        .fold(0.0, f64::max);
    let bytes: usize = [
        BufferKind::A,
        BufferKind::B,
        BufferKind::D,
        BufferKind::Workspace,
    ]
    .iter()
    .map(|&b| dev0.buffer_elements(b) * size_of::<T>())
    .sum();
    warn_if_in_l2(ctx, kind.cli_name(), bytes as u64);
    let mut run = PlanRun {
        devices,
        streams,
        graphs: Vec::new(),
    };
    if let Some(extra) = graphs {
        run = run.into_graphs(ctx, extra)?;
    }
    let block = move |timing| run.time_block(gpus, timing);
    Ok((
        Box::new(block),
        timing_for(flops, &ctx.opts),
        stage_shapes(dev0),
    ))
}

/// A built NCCL + cuBLASLt baseline (it owns its communicators, streams and buffers).
struct NcclRun<T: NcclElement> {
    base: NcclGemmBaseline<T>,
}

impl<T: NcclElement> NcclRun<T> {
    /// Times one block of `enqueue()`s on every rank's stream, then synchronises. A method, so
    /// that the closure calling it owns the whole baseline (see [`PlanRun::time_block`]).
    fn time_block(&self, gpus: &[Gpu], timing: TimingConfig) -> Result<Timing, String> {
        let streams = self.base.streams();
        let t = time_on_streams(gpus, &streams, timing, |_| {
            self.base
                .enqueue()
                .map_err(|e| BenchError::Work(e.to_string()))
        })
        .map_err(err)?;
        self.base.synchronize().map_err(err)?;
        Ok(t)
    }
}

/// (e): NCCL collective + cuBLASLt on the first `tp` GPUs, built once; each block is
/// [`NcclRun::time_block`].
fn nccl_block<'a, T: NcclElement>(
    ctx: &'a Ctx,
    kind: NcclGemmKind,
    problem: Problem,
    tp: usize,
) -> Result<(Block<'a>, TimingConfig), String> {
    let (m, n, k) = (problem.m as u64, problem.n as u64, problem.k as u64);
    let layout = NcclGemmLayout::new(kind, m, n, k, tp as u64)?;
    let base = NcclGemmBaseline::<T>::new(&ctx.modules[..tp], kind, (m, n, k), 31).map_err(err)?;
    let gpus = &ctx.gpus[..tp];
    let run = NcclRun { base };
    let block = move |timing| run.time_block(gpus, timing);
    Ok((Box::new(block), timing_for(layout.gemm.flops(), &ctx.opts)))
}

/// A built `DistGemm` and the shards it reads and writes (dropped after it).
struct DistRun<T: NcclElement> {
    dist: DistGemm,
    _shards: Vec<RandomShard<T>>,
}

impl<T: NcclElement> DistRun<T> {
    /// Times one block of `run()`s on every device's stream, then `wait()`s, which turns a
    /// timed-out GPU wait into an error instead of a number. A method, so that the closure
    /// calling it owns the shards too (see [`PlanRun::launch_all`]).
    fn time_block(&mut self, gpus: &[Gpu], timing: TimingConfig) -> Result<Timing, String> {
        let streams = self.dist.streams();
        let dist = &mut self.dist;
        let measured = time_on_streams(gpus, &streams, timing, |_| {
            dist.run().map_err(|e| BenchError::Work(e.to_string()))
        });
        // Always wait (and read the error words), also after a failed launch.
        let waited = dist.wait().map_err(err);
        let t = measured.map_err(err)?;
        waited?;
        Ok(t)
    }
}

/// (d): distgemm (`host/src/cuda`) running `kind` on the first `tp` GPUs: per-device shards
/// sized by the plan and filled on their GPUs, one `DistGemm` built (graphs instantiated
/// once); each block is [`DistRun::time_block`].
fn distgemm_block<'a, T: NcclElement>(
    ctx: &'a Ctx,
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
    diagnostics: TimingDiagnostics,
) -> Result<(Block<'a>, TimingConfig), String> {
    let gpus = &ctx.gpus[..tp];
    let builder = DistGemm::builder()
        .devices(gpus.to_vec())
        .tp(tp)
        .schedule(kind)
        .problem(problem)
        .dtype(T::DTYPE)
        .modules(ctx.modules[..tp].to_vec());
    let plan = builder.plan().map_err(err)?;
    let shards = random_shards::<T>(&plan, gpus, &ctx.modules[..tp], 41).map_err(err)?;
    let args = shards.iter().map(RandomShard::device_args).collect();
    let mut dist = builder.args(args).build().map_err(err)?;
    if diagnostics != TimingDiagnostics::default() {
        // One full run first: runs with capped copies then multiply the real data left in
        // the workspace.
        dist.run().map_err(err)?;
        dist.wait().map_err(err)?;
        dist.set_timing_diagnostics(diagnostics).map_err(err)?;
    }
    let mut run = DistRun {
        dist,
        _shards: shards,
    };
    let block = move |timing| run.time_block(gpus, timing);
    let flops_per_gpu = problem.flops() / tp as f64;
    Ok((Box::new(block), timing_for(flops_per_gpu, &ctx.opts)))
}

/// A prepared contender on its own: one block with its full timing (the token sweep's (d)
/// and (e)).
fn one_block((mut block, timing): (Block<'_>, TimingConfig)) -> Result<Timing, String> {
    block(timing)
}

/// (b), (c), (d) and (e) of one schedule family, timed together on all TP GPUs in interleaved
/// rounds (each round a block of a third of the repetitions, at least [`MIN_TIMED_REPS`],
/// after `--settle-ms` of untimed launches): the ratios (b)/(d), (c)/(d) and (e)/(d) then
/// compare measurements taken under the same drift of clocks and power, not minutes apart.
struct FamilyTimings {
    /// (b): the single-stage schedule's GEMM without communication, and its shape.
    single_stage_nocomm: Result<(Timing, String), String>,
    /// (c): the pipelined schedule's stage GEMMs without communication, and their shapes.
    pipelined_nocomm: Result<(Timing, String), String>,
    /// (d) of the family's pipelined and single-stage schedules.
    distgemm: HashMap<ScheduleKind, Result<Timing, String>>,
    /// (e): the family's NCCL collective + cuBLASLt ([`nccl_kind_of`]).
    nccl_cublas: Result<Timing, String>,
    /// With `--diagnose`: the [`DIAGNOSTICS`] (all-gather families) or the
    /// [`SCATTER_DIAGNOSTICS`] (reduce-scatter families) of the pipelined schedule.
    diagnostics: Vec<(&'static str, Result<Timing, String>)>,
    /// With `--diagnose`: every contender's mean SM clock and board power per device over its
    /// blocks, by name.
    power: Vec<ContenderPower>,
}

/// Bytes every copy of the diagnostic (d) variants moves.
const COPY_CAP: usize = 4096;

/// How often `--diagnose` samples every GPU's SM clock and board power.
const POWER_SAMPLE_PERIOD: Duration = Duration::from_millis(10);

/// How long after a block starts `--diagnose` begins sampling: past its settling launches
/// (`settle_ms` of estimated GPU time, enqueued at once), with a margin.
fn power_skip(settle_ms: f64) -> Duration {
    Duration::from_millis(settle_ms as u64 + 30)
}

/// A diagnostic variant of (c) or (d) (see [`DIAGNOSTICS`]).
enum Variant {
    /// (c) launched as one CUDA graph per device, with an extra node.
    NocommGraphs(GraphExtra),
    /// (d) with parts left out.
    Dist(TimingDiagnostics),
}

const fn cut(no_rendezvous: bool, no_flag_waits: bool) -> Variant {
    Variant::Dist(TimingDiagnostics {
        copy_limit: Some(COPY_CAP),
        no_rendezvous,
        no_flag_waits,
        local_c: false,
    })
}

/// Variants timed beside the pipelined reduce-scatter schedules: (d) whose epilogues read the
/// neighbour's partial from their own device instead of over NVLink (the flags kept), after
/// one full run.
const SCATTER_DIAGNOSTICS: [(&str, Variant); 1] = [(
    "(d) C read locally",
    Variant::Dist(TimingDiagnostics {
        copy_limit: None,
        no_rendezvous: false,
        no_flag_waits: false,
        local_c: true,
    }),
)];

/// Variants timed beside the pipelined all-gather schedules, in the same rounds: each leaves
/// out one more part of (d), so the steps between (c), them and (d) say what each part costs.
/// Copies are cut after one full run, so the GEMMs still multiply real data (zeros would
/// draw less power and run faster).
const DIAGNOSTICS: [(&str, Variant); 11] = [
    ("(c) as graphs", Variant::NocommGraphs(GraphExtra::Nothing)),
    (
        "(c) as graphs + copy node",
        Variant::NocommGraphs(GraphExtra::Copy),
    ),
    (
        "(c) as graphs + peer copy node",
        Variant::NocommGraphs(GraphExtra::PeerCopy),
    ),
    (
        "(c) as graphs + peer push node",
        Variant::NocommGraphs(GraphExtra::PeerPush),
    ),
    (
        "(c) as graphs + peer read kernel",
        Variant::NocommGraphs(GraphExtra::PeerRead(COPY_CAP)),
    ),
    (
        "(c) as graphs + peer read kernel, 16 B",
        Variant::NocommGraphs(GraphExtra::PeerRead(16)),
    ),
    (
        "(c) as graphs + barrier node",
        Variant::NocommGraphs(GraphExtra::Barrier),
    ),
    (
        "(c) as graphs + peer barrier node",
        Variant::NocommGraphs(GraphExtra::PeerBarrier),
    ),
    ("(d) copies cut, uncoupled, no flag waits", cut(true, true)),
    ("(d) copies cut, uncoupled", cut(true, false)),
    ("(d) copies cut", cut(false, false)),
];

fn family_timings<T: NcclElement>(
    ctx: &Ctx,
    family: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> FamilyTimings {
    let (piped, single) = (pipelined_of(family), single_stage_of(family));
    let mut shapes = [String::new(), String::new()];
    let mut prepared: Vec<Result<(Block<'_>, TimingConfig), String>> = Vec::new();
    for (i, kind) in [single, piped].into_iter().enumerate() {
        prepared.push(plan_gemms_block::<T>(ctx, kind, problem, tp, None).map(
            |(block, timing, shape)| {
                shapes[i] = shape;
                (block, timing)
            },
        ));
    }
    for kind in [piped, single] {
        prepared.push(distgemm_block::<T>(
            ctx,
            kind,
            problem,
            tp,
            TimingDiagnostics::default(),
        ));
    }
    prepared.push(nccl_block::<T>(ctx, nccl_kind_of(family), problem, tp));
    // With --diagnose, the family's diagnostic variants of its pipelined schedule too.
    let variants: &[(&str, Variant)] = match (ctx.opts.diagnose, family.collective()) {
        (false, _) => &[],
        (true, Collective::AllGather) => &DIAGNOSTICS,
        (true, Collective::ReduceScatter) => &SCATTER_DIAGNOSTICS,
    };
    for (_, variant) in variants {
        prepared.push(match variant {
            Variant::NocommGraphs(extra) => {
                plan_gemms_block::<T>(ctx, piped, problem, tp, Some(*extra))
                    .map(|(block, timing, _)| (block, timing))
            }
            Variant::Dist(diagnostics) => {
                distgemm_block::<T>(ctx, piped, problem, tp, *diagnostics)
            }
        });
    }
    // With --diagnose, what clock and power every contender's blocks ran at.
    let bus_ids: Vec<String> = ctx.gpus[..tp]
        .iter()
        .map(|g| g.pci_bus_id().to_owned())
        .collect();
    // Per contender, every device's means so far; None once a sampler failed.
    let mut power = vec![Some(vec![ClockPower::default(); tp]); prepared.len()];
    // Every block starts with ≥ --settle-ms of untimed launches (the warm-up of `timing_for`):
    // a (d) block timed straight after a GPU had idled caught it waking up (samples up to
    // 1.4× the median in a first interleaved run).
    let samples = interleaved(prepared.len(), ROUNDS, |c, _round| {
        let (block, timing) = prepared[c].as_mut().map_err(|e| e.clone())?;
        let round_timing = TimingConfig {
            warmup: timing.warmup,
            reps: (timing.reps / ROUNDS).max(MIN_TIMED_REPS),
        };
        let sampler = ctx.opts.diagnose.then(|| {
            PowerSampler::start(
                bus_ids.clone(),
                POWER_SAMPLE_PERIOD,
                power_skip(ctx.opts.settle_ms),
            )
        });
        let timed = block(round_timing).map(|t| t.per_device_ms);
        if let Some(sampler) = sampler {
            power[c] = power[c]
                .take()
                .zip(sampler.finish().ok())
                .map(|(sofar, block)| {
                    sofar
                        .into_iter()
                        .zip(block)
                        .map(|(a, b)| a.merged(b))
                        .collect()
                });
        }
        timed
    });
    let mut names = vec![
        "(b)".to_owned(),
        "(c)".to_owned(),
        format!("(d) {}", piped.cli_name()),
        format!("(d) {}", single.cli_name()),
        "(e)".to_owned(),
    ];
    names.extend(variants.iter().map(|(name, _)| (*name).to_owned()));
    let power = if ctx.opts.diagnose {
        names
            .into_iter()
            .zip(power)
            .filter_map(|(name, p)| {
                let p = p.filter(|p| p.iter().any(|x| x.samples > 0))?;
                Some(ContenderPower {
                    name,
                    sm_mhz: p.iter().map(|x| x.sm_mhz).collect(),
                    watts: p.iter().map(|x| x.watts).collect(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut timings = samples
        .into_iter()
        .map(|s| s.and_then(|s| Timing::from_devices(s).map_err(err)));
    let mut next = || timings.next().expect("one timing per contender");
    let [b_shape, c_shape] = shapes;
    let b = next().map(|t| (t, b_shape));
    let c = next().map(|t| (t, c_shape));
    let distgemm = HashMap::from([(piped, next()), (single, next())]);
    FamilyTimings {
        single_stage_nocomm: b,
        pipelined_nocomm: c,
        distgemm,
        nccl_cublas: next(),
        diagnostics: variants.iter().map(|(name, _)| (*name, next())).collect(),
        power,
    }
}

/// The schedule distgemm's `Auto` picks in `family` for `problem` (pure: the cost model).
fn resolve_auto<T: NcclElement>(
    ctx: &Ctx,
    family: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> Result<ScheduleKind, String> {
    DistGemm::builder()
        .devices(ctx.gpus[..tp].to_vec())
        .tp(tp)
        .auto_schedule(family)
        .problem(problem)
        .dtype(T::DTYPE)
        .resolved_schedule()
        .map_err(err)
}

// ------------------------------------------------------------------------------------------
// The table
// ------------------------------------------------------------------------------------------

/// Measures every selected row of `preset`.
fn preset_rows<T: NcclElement>(
    ctx: &Ctx,
    preset: Preset,
    tp: usize,
    torch: &TorchResults,
    prov: &Provenance,
) -> Vec<Record> {
    let o = &ctx.opts;
    let problem = preset.problem(o.tokens).with_dtype(o.dtype);
    let rows: Vec<Sched> = Sched::all()
        .into_iter()
        .filter(|s| {
            o.filter
                .as_ref()
                .is_none_or(|f| row_id(preset, *s).contains(f.as_str()))
        })
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    println!("== {} (M={}, TP={tp})", preset.name(), o.tokens);
    let (m, n, k) = (problem.m as u64, problem.n as u64, problem.k as u64);
    let (a_ours, a_cublas) = single_gpu::<T>(ctx, (m, n, k));
    // (b), (c), (d) and (e) per family, each family's contenders timed together (rs-a and rs-b
    // measure the same (e), each in its own family's rounds).
    let mut families: HashMap<ScheduleKind, FamilyTimings> = HashMap::new();
    for family in rows.iter().map(|s| s.family()) {
        families
            .entry(family)
            .or_insert_with(|| family_timings::<T>(ctx, family, problem, tp));
    }
    let mut out = Vec::new();
    for sched in rows {
        let mut r = Record {
            preset: preset.name().into(),
            tp,
            schedule: sched.name(),
            schedule_full: match sched {
                Sched::Fixed(k) => k.full_name().to_owned(),
                Sched::Auto(f) => format!("Auto within {}", f.full_name()),
            },
            m: problem.m,
            n: problem.n,
            k: problem.k,
            dtype: o.dtype.name().into(),
            machine: prov.gpu.clone(),
            driver: prov.driver.clone(),
            commit: prov.commit.clone(),
            date: prov.date.clone(),
            ..Default::default()
        };
        r.single_gpu_ours_ms = r
            .set("single_gpu_ours_ms", &a_ours)
            .map(|t: Timing| t.median_ms);
        r.single_gpu_cublas_ms = r
            .set("single_gpu_cublas_ms", &a_cublas)
            .map(|t: Timing| t.median_ms);
        // `Auto` is resolved by the runtime's (pure) rule, and the chosen schedule's
        // measurement is reused: the graphs would be identical.
        let chosen = match sched {
            Sched::Fixed(k) => Ok(k),
            Sched::Auto(f) => resolve_auto::<T>(ctx, f, problem, tp),
        };
        if let Sched::Auto(_) = sched {
            r.auto_choice = r
                .set("auto_choice", &chosen)
                .map(|k| k.cli_name().to_owned());
        }
        let family = &families[&sched.family()];
        let d = chosen.clone().and_then(|k| {
            family
                .distgemm
                .get(&k)
                .cloned()
                .unwrap_or_else(|| Err(format!("{} is not in the family", k.cli_name())))
        });
        if let Some(t) = r.set("distgemm_ms", &d) {
            r.distgemm_ms = Some(t.median_ms);
            r.distgemm_min_ms = Some(t.min_ms);
            r.distgemm_max_ms = Some(t.max_ms);
            r.distgemm_reps = Some(t.samples_ms.len());
            r.distgemm_per_rep_max_ms = Some(t.per_rep_max_median_ms);
            r.device_medians_ms.distgemm = t.device_medians_ms();
        }
        // (b), (c), (e), (f) of the family (the chosen schedule's, which is in the family).
        let kind = chosen.unwrap_or(sched.family());
        if let Some((t, s)) = r.set("single_stage_nocomm_ms", &family.single_stage_nocomm) {
            r.single_stage_nocomm_ms = Some(t.median_ms);
            r.device_medians_ms.single_stage_nocomm = t.device_medians_ms();
            r.single_stage_shape = Some(s);
        }
        if let Some((t, s)) = r.set("pipelined_nocomm_ms", &family.pipelined_nocomm) {
            r.pipelined_nocomm_ms = Some(t.median_ms);
            r.device_medians_ms.pipelined_nocomm = t.device_medians_ms();
            r.pipelined_stage_shapes = Some(s);
        }
        r.nccl_cublas_variant = Some(nccl_kind_of(sched.family()).name().into());
        r.nccl_cublas_ms = r
            .set("nccl_cublas_ms", &family.nccl_cublas)
            .map(|t: Timing| t.median_ms);
        let op = torch_op_of(kind);
        r.torch_async_tp_op = Some(op.into());
        r.torch_async_tp_ms = r.set(
            "torch_async_tp_ms",
            &torch.get(preset.name(), problem.m, op),
        );
        let (nccl_op, local_op) = if op == TORCH_AG {
            ("nccl_all_gather+matmul", "matmul_ag_local")
        } else {
            ("matmul+nccl_reduce_scatter", "matmul_rs_local")
        };
        r.torch_nccl_matmul_ms = torch.get(preset.name(), problem.m, nccl_op).ok();
        r.torch_matmul_local_ms = torch.get(preset.name(), problem.m, local_op).ok();
        if kind.is_pipelined() {
            r.power = family.power.clone();
            for (name, timing) in &family.diagnostics {
                if let Some(t) = r.set(name, timing) {
                    r.diagnostics.push(Diagnostic {
                        name: (*name).into(),
                        ms: t.median_ms,
                        device_medians_ms: t.device_medians_ms(),
                    });
                }
            }
        }
        r.derive();
        print!("{}", table_row(&r));
        out.push(r);
    }
    out
}

fn write_outputs(stem: &str, json: &str, md: &str) -> Result<(PathBuf, PathBuf), BenchError> {
    let dir = results_dir();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let jp = dir.join(format!("{stem}.json"));
    let mp = dir.join(format!("{stem}.md"));
    std::fs::write(&jp, json).map_err(io(&jp))?;
    std::fs::write(&mp, md).map_err(io(&mp))?;
    Ok((jp, mp))
}

fn table<T: NcclElement>(
    ctx: &Ctx,
    tp: usize,
    torch: &TorchResults,
    prov: &Provenance,
) -> Result<(), BenchError> {
    print!("{TABLE_HEADER}");
    let mut records = Vec::new();
    for preset in presets(ctx.opts.quick) {
        records.extend(preset_rows::<T>(ctx, preset, tp, torch, prov));
    }
    if records.is_empty() {
        println!(
            "distgemm bench: no row matches the filter {:?}",
            ctx.opts.filter
        );
        return Ok(());
    }
    let verdict = verdicts(&records);
    let notes = missing_notes(&records);
    println!("\n{verdict}");
    if !notes.is_empty() {
        println!("missing columns:\n{notes}");
    }
    let mut md = format!(
        "# distgemm vs single-GPU GEMM, NCCL + cuBLAS and PyTorch async-TP\n\n\
         Machine: {} × {tp}, {}. Date: {}. Commit: {}. M = {} tokens, {}, TP = {tp}.\n\
         PyTorch: {}.\n\n\
         (a) full GEMM on one GPU; (b) the family's single-stage local GEMM, no communication; \
         (c) the family's P pipelined stage GEMMs back to back, no communication; (d) distgemm; \
         (e) NCCL collective + cuBLASLt in sequence; (f) PyTorch symm_mem fused op. \
         % of (b)/(c) = (b)/(d), (c)/(d); ×(e), ×(f) = speed-up of (d). (b)-(f) run on all TP \
         GPUs; a time is the slowest device's median repetition (distgemm::timing: devices \
         that meet at a barrier every run make each other wait, so the median of each \
         repetition's slowest device counts a slow device's excess twice; that statistic is \
         `distgemm_per_rep_max_ms` in the JSON, and PyTorch's `ms_per_call_max`). Every timed block \
         starts with ≥ {settle:.0} ms of untimed work (a GPU that idled runs at boost clock \
         at first); a family's (b), (c), (d) and (e) are timed together in interleaved rounds \
         on all TP GPUs; PyTorch settles and interleaves the same way (--settle-ms {settle:.0} \
         --rounds {ROUNDS}: its fused op and its local matmul take turns).\n\n",
        prov.gpu,
        prov.driver,
        prov.date,
        prov.commit,
        ctx.opts.tokens,
        ctx.opts.dtype.name(),
        torch
            .info
            .as_ref()
            .map_or_else(|| "did not run".into(), |v| v.to_string()),
        settle = ctx.opts.settle_ms,
    );
    md.push_str(TABLE_HEADER);
    for r in &records {
        md.push_str(&table_row(r));
    }
    md.push_str(&format!("\n## Verdicts (issue 6)\n\n{verdict}"));
    let split = overhead_split(&records);
    if !split.is_empty() {
        println!("\n{split}");
        md.push_str(&format!(
            "\n## Where the overhead over (c) goes (pipelined schedules; all-gather copies cut to {COPY_CAP} B; per-device medians in brackets)\n\n{split}"
        ));
    }
    let power = power_split(&records);
    if !power.is_empty() {
        println!("\n{power}");
        md.push_str(&format!(
            "\n## SM clock and board power per contender (NVML every {} ms over the timed part of its blocks; power is a one-second average; per device)\n\n{power}",
            POWER_SAMPLE_PERIOD.as_millis()
        ));
    }
    if !notes.is_empty() {
        md.push_str(&format!("\n## Missing columns\n\n{notes}"));
    }
    let stem = results_stem("distgemm", &prov.date, &prov.commit, &ctx.opts);
    let (jp, mp) = write_outputs(
        &stem,
        &(serde_json::to_string_pretty(&records)? + "\n"),
        &md,
    )?;
    println!("wrote {} and {}", jp.display(), mp.display());
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The token sweep (item 6)
// ------------------------------------------------------------------------------------------

fn sweep<T: NcclElement>(ctx: &Ctx, tp: usize, prov: &Provenance) -> Result<(), BenchError> {
    let o = &ctx.opts;
    let mut points = Vec::new();
    let mut md = format!(
        "# distgemm token sweep: where pipelining stops paying\n\n\
         Machine: {} × {tp}, {}. Date: {}. Commit: {}. {}, TP = {tp}. Times in ms (the slowest \
         device's median; every timed block starts with ≥ {settle:.0} ms of untimed work). \
         (e) = NCCL collective + cuBLASLt in sequence.\n\n",
        prov.gpu,
        prov.driver,
        prov.date,
        prov.commit,
        o.dtype.name(),
        settle = o.settle_ms,
    );
    for preset in [Preset::Llama3_70bFc1, Preset::Llama3_70bFc2] {
        if o.filter
            .as_ref()
            .is_some_and(|f| !format!("distgemm/{}", preset.name()).contains(f.as_str()))
        {
            continue;
        }
        // The preset's natural family: all-gather of A for fc1, reduce-scatter of rows for fc2.
        let family = if preset.name().ends_with("fc1") {
            ScheduleKind::AllGatherRotatingA
        } else {
            ScheduleKind::ReduceScatterTilingA
        };
        let natural = nccl_kind_of(family);
        let header = format!(
            "## {} (family {family}: {family} vs {single} vs (e) {})\n\n| M | {family} ms | {single} ms | (e) ms | auto picks | auto ms | pipelining pays | auto follows | best pipelined (any family) | ms |\n|---:|---:|---:|---:|---|---:|---|---|---|---:|\n",
            preset.name(),
            natural.name(),
            family = family.cli_name(),
            single = single_stage_of(family).cli_name(),
        );
        print!("\n{header}");
        md.push_str(&header);
        let mut rows = Vec::new();
        for &m in &SWEEP_TOKENS {
            let problem = preset.problem(m).with_dtype(o.dtype);
            let mut p = SweepPoint {
                preset: preset.name().into(),
                tp,
                m,
                n: problem.n,
                k: problem.k,
                dtype: o.dtype.name().into(),
                nccl_cublas_variant: natural.name().into(),
                machine: prov.gpu.clone(),
                commit: prov.commit.clone(),
                date: prov.date.clone(),
                ..Default::default()
            };
            p.family = family.cli_name().into();
            for kind in ScheduleKind::ALL {
                match distgemm_block::<T>(ctx, kind, problem, tp, TimingDiagnostics::default())
                    .and_then(one_block)
                {
                    Ok(t) => {
                        p.schedules_ms
                            .insert(kind.cli_name().into(), Some(t.median_ms));
                    }
                    Err(e) => {
                        p.schedules_ms.insert(kind.cli_name().into(), None);
                        p.missing.insert(kind.cli_name().into(), e);
                    }
                }
            }
            match resolve_auto::<T>(ctx, family, problem, tp) {
                Ok(k) => p.auto_choice = Some(k.cli_name().into()),
                Err(e) => {
                    p.missing.insert("auto".into(), e);
                }
            }
            match nccl_block::<T>(ctx, natural, problem, tp).and_then(one_block) {
                Ok(t) => p.nccl_cublas_ms = Some(t.median_ms),
                Err(e) => {
                    p.missing.insert("nccl_cublas_ms".into(), e);
                }
            }
            p.derive();
            let yes_no = |v: Option<bool>| v.map_or("—", |b| if b { "yes" } else { "no" });
            let line = format!(
                "| {m} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                ms(p.family_pipelined_ms),
                ms(p.family_single_stage_ms),
                ms(p.nccl_cublas_ms),
                p.auto_choice.as_deref().unwrap_or("?"),
                ms(p.auto_ms),
                yes_no(p.pipelining_pays),
                yes_no(p.auto_follows),
                p.best_pipelined.as_deref().unwrap_or("—"),
                ms(p.best_pipelined_ms),
            );
            print!("{line}");
            md.push_str(&line);
            rows.push((m, p.pipelining_pays, p.auto_follows));
            points.push(p);
        }
        let threshold = pipelining_threshold(
            &rows
                .iter()
                .map(|&(m, pays, _)| (m, pays))
                .collect::<Vec<_>>(),
        );
        let follows: Vec<usize> = rows
            .iter()
            .filter(|r| r.2 == Some(false))
            .map(|r| r.0)
            .collect();
        let known = rows.iter().any(|r| r.1.is_some());
        let summary = format!(
            "\n{}: {}; {}\n\n",
            preset.name(),
            match (known, threshold) {
                (false, _) => "pipelining could not be judged (no distgemm times)".to_owned(),
                (true, Some(t)) => format!("pipelining pays from M = {t} upwards"),
                (true, None) => "pipelining does not pay at the largest M measured".to_owned(),
            },
            if rows.iter().all(|r| r.2.is_none()) {
                "auto could not be judged".to_owned()
            } else if follows.is_empty() {
                "auto is within 3 % of the fastest of (family pipelined, family single-stage, (e)) at every M".to_owned()
            } else {
                format!("auto is more than 3 % slower than the fastest option at M = {follows:?}")
            }
        );
        print!("{summary}");
        md.push_str(&summary);
    }
    if points.is_empty() {
        println!(
            "distgemm bench: no sweep preset matches the filter {:?}",
            o.filter
        );
        return Ok(());
    }
    let notes: BTreeMap<String, usize> = points
        .iter()
        .flat_map(|p| p.missing.values().cloned())
        .fold(BTreeMap::new(), |mut acc, why| {
            *acc.entry(why).or_default() += 1;
            acc
        });
    if !notes.is_empty() {
        md.push_str("## Missing measurements\n\n");
        for (why, count) in notes {
            let line = format!("- {why} ({count}×)\n");
            print!("{line}");
            md.push_str(&line);
        }
    }
    let stem = results_stem("distgemm-sweep", &prov.date, &prov.commit, o);
    let (jp, mp) = write_outputs(&stem, &(serde_json::to_string_pretty(&points)? + "\n"), &md)?;
    println!("wrote {} and {}", jp.display(), mp.display());
    Ok(())
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("distgemm bench: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(opts) {
        eprintln!("distgemm bench: {e}");
        std::process::exit(1);
    }
}

fn run(opts: Options) -> Result<(), BenchError> {
    let started = Instant::now();
    // How many GPUs, without creating contexts (PyTorch should find the GPUs untouched).
    let count = distgemm::runtime::device::device_count()?;
    let tp = opts.tp.unwrap_or(count);
    if tp == 0 || tp > count {
        return Err(BenchError::Config(format!(
            "--tp {tp} but the driver sees {count} GPU(s)"
        )));
    }
    // The PyTorch peer first, alone on the GPUs, before this process allocates anything.
    let torch = if opts.sweep {
        TorchResults::failed("not run for the sweep".into())
    } else if !opts.torch {
        TorchResults::failed("--no-torch".into())
    } else {
        // Only the presets that have a row selected by FILTER.
        let selected: Vec<Preset> = presets(opts.quick)
            .into_iter()
            .filter(|&p| {
                opts.filter.as_ref().is_none_or(|f| {
                    Sched::all()
                        .into_iter()
                        .any(|s| row_id(p, s).contains(f.as_str()))
                })
            })
            .collect();
        if selected.is_empty() {
            TorchResults::failed("no preset selected".into())
        } else {
            run_torch(&opts, &selected, &[opts.tokens], tp)
        }
    };
    let gpus: Vec<Gpu> = hopper_gpus()?.into_iter().take(tp).collect();
    let modules = gpus
        .iter()
        .map(Module::load)
        .collect::<Result<Vec<_>, _>>()?;
    let kernels = modules
        .iter()
        .map(GemmKernel::new)
        .collect::<Result<Vec<_>, _>>()?;
    let prov = Provenance::collect(&gpus[0]);
    let ctx = Ctx {
        l2_bytes: u64::from(gpus[0].l2_cache_bytes()),
        gpus,
        modules,
        kernels,
        opts,
    };
    println!(
        "distgemm bench: {} × {tp}, {}, commit {}, {}{}",
        prov.gpu,
        prov.driver,
        prov.commit,
        ctx.opts.dtype.name(),
        if ctx.opts.quick { ", --quick" } else { "" }
    );
    let result = match (ctx.opts.sweep, ctx.opts.dtype) {
        (false, Dtype::Bf16) => table::<half::bf16>(&ctx, tp, &torch, &prov),
        (false, Dtype::F16) => table::<half::f16>(&ctx, tp, &torch, &prov),
        (true, Dtype::Bf16) => sweep::<half::bf16>(&ctx, tp, &prov),
        (true, Dtype::F16) => sweep::<half::f16>(&ctx, tp, &prov),
    };
    println!(
        "distgemm bench: finished in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    result
}
