//! The contenders of the table, each prepared once and then timed block by block: (a) the
//! full GEMM on one GPU, (b)/(c) a plan's GEMM nodes without communication, (d) distgemm,
//! (e) NCCL + cuBLASLt.

use crate::diagnose::GraphExtra;
use distgemm::baseline::{
    CublasLtGemm, NcclElement, NcclGemmBaseline, NcclGemmKind, NcclGemmLayout, TnGemmShape,
};
use distgemm::cuda::{DistGemm, DistGemmBuilder, TimingDiagnostics};
use distgemm::gemm::{GemmArgs, GemmKernel, MatrixView, PreparedGemm};
use distgemm::plan::{DevicePlan, Plan};
use distgemm::problem::Problem;
use distgemm::runtime::{CudaStream, DeviceBuffer, Gpu, Graph, GraphExec, Module};
use distgemm::schedule::{BufferKind, CSource, GemmStage, ScheduleKind, View};
use distgemm::testdata::{RandomShard, fill_normal, random_shards};
use distgemm_benches::distgemm_report::{Options, timing_for};
use distgemm_benches::{
    BenchError, DenseOperands, Timing, TimingConfig, time_on_stream, time_on_streams,
};
use std::sync::Arc;

pub(crate) struct Ctx {
    pub(crate) gpus: Vec<Gpu>,
    pub(crate) modules: Vec<Arc<Module>>,
    /// The GEMM kernel on every GPU (`kernels[d]` from `modules[d]`); GPU 0's also runs (a).
    pub(crate) kernels: Vec<GemmKernel>,
    pub(crate) opts: Options,
    pub(crate) l2_bytes: u64,
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(crate) fn warn_if_in_l2(ctx: &Ctx, what: &str, bytes: u64) {
    if bytes < 3 * ctx.l2_bytes {
        println!(
            "   warning: {what}: working set {} MiB is below 3× L2; repetitions may hit in L2",
            bytes >> 20
        );
    }
}

/// Our kernel's and cuBLASLt's timing, each possibly missing with the reason.
pub(crate) type PairOfTimings = (Result<Timing, String>, Result<Timing, String>);

/// (a): the full problem on GPU 0, our kernel and cuBLASLt, on the same operands.
pub(crate) fn single_gpu<T: NcclElement>(ctx: &Ctx, (m, n, k): (u64, u64, u64)) -> PairOfTimings {
    let run = || -> Result<PairOfTimings, String> {
        let gpu = &ctx.gpus[0];
        let module = &ctx.modules[0];
        let stream = gpu.new_stream().map_err(err)?;
        let mut ops = DenseOperands::<T>::new(module, &stream, (m, n, k), (11, 12)).map_err(err)?;
        warn_if_in_l2(ctx, "single GPU", 2 * (m * k + n * k + m * n));
        let timing = timing_for(2.0 * (m * n * k) as f64, &ctx.opts);
        let args = ops.args();
        let ours = ctx.kernels[0]
            .prepare(&stream, &args)
            .map_err(err)
            .and_then(|g| {
                // SAFETY: `g` points into `ops`, alive for the whole timing.
                time_on_stream(gpu, &stream, timing, |_| {
                    Ok(unsafe { g.launch(&stream, false) }?)
                })
                .map_err(err)
            });
        let cublas = CublasLtGemm::<T>::new(gpu, stream.clone(), TnGemmShape::packed(m, n, k))
            .map_err(err)
            .and_then(|lt| {
                time_on_stream(gpu, &stream, timing, |_| {
                    lt.run(&ops.a, &ops.b, None, &mut ops.d, 1.0, 0.0)
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
pub(crate) struct PlanBuffers<T: NcclElement> {
    pub(crate) dev: usize,
    pub(crate) a: DeviceBuffer<T>,
    pub(crate) b: DeviceBuffer<T>,
    pub(crate) c: DeviceBuffer<T>,
    pub(crate) d: DeviceBuffer<T>,
    pub(crate) ws: DeviceBuffer<T>,
}

impl<T: NcclElement> PlanBuffers<T> {
    pub(crate) fn new(
        ctx: &Ctx,
        dev: usize,
        plan: &DevicePlan,
        stream: &CudaStream,
    ) -> Result<Self, String> {
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

    pub(crate) fn buffer(&self, kind: BufferKind) -> &DeviceBuffer<T> {
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
    pub(crate) fn local(&self, v: &View) -> Result<MatrixView, String> {
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

    pub(crate) fn args(&self, g: &GemmStage) -> Result<GemmArgs, String> {
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
pub(crate) fn stage_shapes(dev: &DevicePlan) -> String {
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
pub(crate) type Block<'a> = Box<dyn FnMut(TimingConfig) -> Result<Timing, String> + 'a>;

/// One device's prepared GEMM launches and the buffers they read and write (dropped after
/// them).
pub(crate) struct DeviceGemms<T: NcclElement> {
    pub(crate) gemms: Vec<PreparedGemm>,
    pub(crate) bufs: PlanBuffers<T>,
    /// The words of a graph's extra barrier node ([`GraphExtra::Barrier`]).
    pub(crate) extra_words: Option<DeviceBuffer<u32>>,
}

/// Every TP device's [`DeviceGemms`] and its stream (`streams[d]` on GPU d); with `graphs`,
/// each device's GEMMs as one CUDA graph (kernel nodes, programmatic edges between consecutive
/// ones: (d)'s GEMM nodes without its barrier, copies and flags).
pub(crate) struct PlanRun<T: NcclElement> {
    pub(crate) devices: Vec<DeviceGemms<T>>,
    pub(crate) streams: Vec<Arc<CudaStream>>,
    pub(crate) graphs: Vec<(Graph, GraphExec)>,
}

impl<T: NcclElement> PlanRun<T> {
    /// Launches every device's GEMMs on its stream, back to back, PDL between consecutive ones
    /// of a device: as stream launches, or as the device's graph.
    pub(crate) fn launch_all(&self) -> Result<(), BenchError> {
        if !self.graphs.is_empty() {
            for ((_, exec), stream) in self.graphs.iter().zip(&self.streams) {
                exec.launch(stream)?;
            }
            return Ok(());
        }
        for (dev, stream) in self.devices.iter().zip(&self.streams) {
            for (i, g) in dev.gemms.iter().enumerate() {
                // SAFETY: the stage GEMMs point into the contender's live operands.
                unsafe { g.launch(stream, i > 0) }?;
            }
        }
        Ok(())
    }

    /// Times one block of [`Self::launch_all`] on every device's stream. A method, so that a
    /// closure calling it captures the whole struct: one that named only `run.devices` or
    /// `run.streams` would capture just that field (disjoint closure captures) and free the
    /// rest early.
    pub(crate) fn time_block(&self, gpus: &[Gpu], timing: TimingConfig) -> Result<Timing, String> {
        time_on_streams(gpus, &self.streams, timing, |_| self.launch_all()).map_err(err)
    }
}

/// (b)/(c): every device's GEMM nodes of `kind`'s plan, each on its own GPU with that GPU's
/// kernel and buffers, back to back (PDL between them), no communication and no flags; all TP
/// GPUs at once, timed like (d). Returns the block, its timing and device 0's stage shapes.
pub(crate) fn plan_gemms_block<'a, T: NcclElement>(
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
pub(crate) struct NcclRun<T: NcclElement> {
    pub(crate) base: NcclGemmBaseline<T>,
}

impl<T: NcclElement> NcclRun<T> {
    /// Times one block of `enqueue()`s on every rank's stream, then synchronises. A method, so
    /// that the closure calling it owns the whole baseline (see [`PlanRun::time_block`]).
    pub(crate) fn time_block(&self, gpus: &[Gpu], timing: TimingConfig) -> Result<Timing, String> {
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
pub(crate) fn nccl_block<'a, T: NcclElement>(
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

/// (d)'s operands for `kind`: per-device shards sized by the plan and filled on their GPUs.
/// The caller keeps them while the [`distgemm_block`] that borrows them lives.
pub(crate) fn dist_shards<T: NcclElement>(
    ctx: &Ctx,
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> Result<Vec<RandomShard<T>>, String> {
    let plan = dist_builder::<T>(ctx, kind, problem, tp)
        .plan()
        .map_err(err)?;
    random_shards::<T>(&plan, &ctx.gpus[..tp], &ctx.modules[..tp], 41).map_err(err)
}

fn dist_builder<'a, T: NcclElement>(
    ctx: &Ctx,
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> DistGemmBuilder<'a> {
    DistGemm::builder()
        .devices(ctx.gpus[..tp].to_vec())
        .tp(tp)
        .schedule(kind)
        .problem(problem)
        .dtype(T::DTYPE)
        .modules(ctx.modules[..tp].to_vec())
}

/// Times one block of `run()`s on every device's stream, then `wait()`s, which turns a
/// timed-out GPU wait into an error instead of a number.
fn time_dist_block(
    dist: &mut DistGemm<'_>,
    gpus: &[Gpu],
    timing: TimingConfig,
) -> Result<Timing, String> {
    let streams = dist.streams();
    let measured = time_on_streams(gpus, &streams, timing, |_| {
        dist.run().map_err(|e| BenchError::Work(e.to_string()))
    });
    // Always wait (and read the error words), also after a failed launch.
    let waited = dist.wait().map_err(err);
    let t = measured.map_err(err)?;
    waited?;
    Ok(t)
}

/// (d): distgemm (`host/src/cuda`) running `kind` on the first `tp` GPUs over `shards` (from
/// [`dist_shards`]), one `DistGemm` built (graphs instantiated once); each block is
/// [`time_dist_block`].
pub(crate) fn distgemm_block<'a, T: NcclElement>(
    ctx: &'a Ctx,
    shards: &'a [RandomShard<T>],
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
    diagnostics: TimingDiagnostics,
) -> Result<(Block<'a>, TimingConfig), String> {
    let gpus = &ctx.gpus[..tp];
    let args = shards.iter().map(RandomShard::device_args).collect();
    let mut dist = dist_builder::<T>(ctx, kind, problem, tp)
        .args(args)
        .build()
        .map_err(err)?;
    if diagnostics != TimingDiagnostics::default() {
        // One full run first: runs with capped copies then multiply the real data left in
        // the workspace.
        dist.run().map_err(err)?;
        dist.wait().map_err(err)?;
        dist.set_timing_diagnostics(diagnostics).map_err(err)?;
    }
    let block = move |timing| time_dist_block(&mut dist, gpus, timing);
    let flops_per_gpu = problem.flops() / tp as f64;
    Ok((Box::new(block), timing_for(flops_per_gpu, &ctx.opts)))
}

/// A prepared contender on its own: one block with its full timing (the token sweep's (d)
/// and (e)).
pub(crate) fn one_block((mut block, timing): (Block<'_>, TimingConfig)) -> Result<Timing, String> {
    block(timing)
}
