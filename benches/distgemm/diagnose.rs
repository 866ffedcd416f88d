//! `--diagnose`: variants of (c) and (d) that leave parts out, so that the steps between (c),
//! them and (d) say what each part of distgemm's graph costs.

use crate::contenders::{Ctx, PlanRun, err};
use distgemm::baseline::NcclElement;
use distgemm::cuda::{
    BarrierParams, REDUCE_SMEM_BYTES, REDUCE_THREADS, ReduceParams, TimingDiagnostics,
};
use distgemm::dtype::Dtype;
use distgemm::runtime::stream::DependencyKind;
use distgemm::runtime::{
    DeviceBuffer, Graph, KernelArgs, LaunchConfig, enable_peer_access_between,
};
use std::time::Duration;

/// What a (c) graph has besides its GEMM nodes (diagnostics: one of (d)'s other nodes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GraphExtra {
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

impl<T: NcclElement> PlanRun<T> {
    /// Builds every device's graph of its GEMMs (see [`PlanRun`]), with `extra` nodes. "The
    /// next GPU" of device d is d + 1 mod TP.
    pub(crate) fn into_graphs(mut self, ctx: &Ctx, extra: GraphExtra) -> Result<Self, String> {
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
}

/// Bytes every copy of the diagnostic (d) variants moves.
pub(crate) const COPY_CAP: usize = 4096;

/// How often `--diagnose` samples every GPU's SM clock and board power.
pub(crate) const POWER_SAMPLE_PERIOD: Duration = Duration::from_millis(10);

/// A diagnostic variant of (c) or (d) (see [`DIAGNOSTICS`]).
pub(crate) enum Variant {
    /// (c) launched as one CUDA graph per device, with an extra node.
    NocommGraphs(GraphExtra),
    /// (d) with parts left out.
    Dist(TimingDiagnostics),
}

pub(crate) const fn cut(no_rendezvous: bool, no_flag_waits: bool) -> Variant {
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
pub(crate) const SCATTER_DIAGNOSTICS: [(&str, Variant); 1] = [(
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
pub(crate) const DIAGNOSTICS: [(&str, Variant); 11] = [
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
