//! One device's CUDA graph, built from its lowered plan and updated in place: the code both
//! modes share (one process driving every GPU, [`super::DistGemm`]; one process per GPU,
//! [`super::RankGemm`]). The modes differ only in where peer addresses come from.
//!
//! Node `i` of the graph is node `i` of the plan (the `lower` module). A pointer update
//! re-lowers the plan with the new addresses and rewrites only the nodes whose lowered form
//! changed: a GEMM node keeps its tensor-map blocks and gets them re-encoded in stream order
//! ([`PreparedGemm::retarget`]), then its parameter block replaced
//! (`cuGraphExecKernelNodeSetParams`, which affects later launches only); copy nodes get new
//! endpoints (`cuGraphExecMemcpyNodeSetParams`).

use std::sync::Arc;

use kernels_gpu::collective_abi::{REDUCE_SMEM_BYTES, REDUCE_THREADS, REDUCE_VECTOR};
use kernels_gpu::gemm_abi::GemmVariant;

use super::error::DistGemmError;
use super::lower::{LoweredGraph, LoweredNode};
use crate::dtype::Dtype;
use crate::gemm::{GemmKernel, GemmLaunchError, PreparedGemm};
use crate::runtime::{
    CudaStream, Gpu, Graph, GraphExec, GraphNode, Kernel, KernelArgs, LaunchConfig, Module,
    RawStream,
};

/// The kernels one GPU's graphs launch, looked up once in its PTX module.
pub(crate) struct DeviceKernels {
    pub(crate) gpu: Gpu,
    gemm: GemmKernel,
    barrier: Kernel,
    reduce: Kernel,
    wait_flags: Kernel,
    _module: Arc<Module>,
}

impl DeviceKernels {
    /// Looks the kernels up in `module` (the reduction of element type `dtype`).
    pub(crate) fn new(module: &Arc<Module>, dtype: Dtype) -> Result<Self, DistGemmError> {
        Ok(DeviceKernels {
            gpu: module.gpu().clone(),
            gemm: GemmKernel::new(module)?,
            barrier: module.kernel("collective_barrier")?,
            reduce: module.kernel(match dtype {
                Dtype::Bf16 => "reduce_sum_bf16",
                Dtype::F16 => "reduce_sum_f16",
            })?,
            wait_flags: module.kernel("collective_wait_flags")?,
            _module: Arc::clone(module),
        })
    }
}

/// How much of the GPU one rank's kernels may use when several ranks share it (protocol tests
/// on one GPU, MPS): each kernel gets at most `blocks` blocks, so every rank's kernels can be
/// resident together and a spinning wait never starves the kernel it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GridShare {
    /// Ranks on the GPU.
    pub(crate) ranks: usize,
    /// Blocks per kernel.
    pub(crate) blocks: u32,
}

impl GridShare {
    /// `ranks` ranks on `gpu` (None for one rank): one SM is left for the 1-thread
    /// collective kernels, the rest split evenly.
    pub(crate) fn for_ranks(gpu: &Gpu, ranks: usize) -> Option<GridShare> {
        (ranks > 1).then(|| GridShare {
            ranks,
            blocks: (gpu.sm_count().saturating_sub(1) / ranks as u32).max(1),
        })
    }

    /// The most blocks one rank's GEMM on `variant` may take, of which the GPU holds
    /// `resident_clusters` clusters at once: its share of the SMs and, for a clustered
    /// configuration, its share of those clusters less one. A cluster's blocks run on one GPC,
    /// so free SMs spread over several GPCs need not hold a cluster, and the SM the collective
    /// kernels take may leave one GPC a cluster short.
    pub(crate) fn gemm_blocks(self, variant: &GemmVariant, resident_clusters: u32) -> u32 {
        let cluster = variant.config.cluster_m.max(1);
        if cluster == 1 {
            return self.blocks;
        }
        let clusters = resident_clusters.saturating_sub(1) / self.ranks as u32;
        self.blocks.min(clusters.max(1) * cluster)
    }
}

/// Whether an instance is still usable: after any failure the barrier counters may be out of
/// step across devices, so every later call refuses ([`DistGemmError::Poisoned`]) until the
/// instance is rebuilt. The first failure's message is kept.
#[derive(Debug, Default)]
pub(crate) struct Poison(Option<String>);

impl Poison {
    /// `Ok` while no failure was recorded.
    pub(crate) fn check(&self) -> Result<(), DistGemmError> {
        match &self.0 {
            Some(why) => Err(DistGemmError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Records `e` (unless an earlier failure was) and hands it back.
    pub(crate) fn record(&mut self, e: DistGemmError) -> DistGemmError {
        self.set(|| e.to_string());
        e
    }

    /// Records a failure described by `why` unless one was recorded before.
    pub(crate) fn set(&mut self, why: impl FnOnce() -> String) {
        if self.0.is_none() {
            self.0 = Some(why());
        }
    }
}

/// What a kernel node is made of: kernel, launch shape, arguments, and the prepared GEMM whose
/// tensor maps the arguments point to (GEMM nodes only).
type KernelLaunch = (Kernel, LaunchConfig, KernelArgs, Option<PreparedGemm>);

/// A device's instantiated graph and what its nodes were built from.
pub(crate) struct DeviceGraph {
    exec: GraphExec,
    /// The graph the instance came from. Pointer updates name its nodes
    /// (`cuGraphExecKernelNodeSetParams` takes the node handles of the graph the instance was
    /// instantiated from), and destroying it invalidates those handles, so it lives as long as
    /// the instance.
    #[cfg_attr(
        not(feature = "testing"),
        expect(dead_code, reason = "held for its node handles; only tests read it")
    )]
    graph: Graph,
    nodes: Vec<GraphNode>,
    lowered: LoweredGraph,
    /// Per node: the kernel and launch shape of kernel nodes.
    launches: Vec<Option<(Kernel, LaunchConfig)>>,
    /// Per node: the prepared GEMM (owns the tensor maps the node's parameters point to).
    gemms: Vec<Option<PreparedGemm>>,
}

/// The kernel, launch configuration, arguments and prepared GEMM of kernel node `node`
/// (None for a copy or flag node). GEMM tensor maps are uploaded on `setup`.
fn kernel_launch(
    kernels: &DeviceKernels,
    share: Option<GridShare>,
    setup: &CudaStream,
    device: usize,
    node: &LoweredNode,
) -> Result<Option<KernelLaunch>, DistGemmError> {
    let launch = match node {
        LoweredNode::Barrier(p) => Some((
            kernels.barrier.clone(),
            LaunchConfig::linear(1, 1),
            KernelArgs::new().by_value(p),
            None,
        )),
        LoweredNode::Gemm {
            stage,
            args,
            fp8,
            hook,
        } => {
            let mut prepared = kernels
                .gemm
                .prepare_stage(setup, args, *fp8)
                .map_err(at_stage(device, *stage))?;
            prepared.set_hook(*hook);
            if let Some(share) = share {
                let resident = kernels.gemm.resident_clusters_of(prepared.variant());
                prepared.cap_grid(share.gemm_blocks(prepared.variant(), resident));
            }
            let cfg = prepared.launch_config(false);
            let kernel = prepared.kernel().clone();
            let kargs = prepared.kernel_args();
            Some((kernel, cfg, kargs, Some(prepared)))
        }
        LoweredNode::Reduce(p) => {
            let vectors = u64::from(p.rows) * u64::from(p.cols / REDUCE_VECTOR);
            let mut blocks = vectors.div_ceil(u64::from(REDUCE_THREADS));
            blocks = blocks.min(u64::from(kernels.gpu.sm_count()) * 4);
            if let Some(share) = share {
                blocks = blocks.min(u64::from(share.blocks));
            }
            let blocks = u32::try_from(blocks.max(1)).unwrap_or(1);
            Some((
                kernels.reduce.clone(),
                LaunchConfig::linear(blocks, REDUCE_THREADS).with_dynamic_smem(REDUCE_SMEM_BYTES),
                KernelArgs::new().by_value(p),
                None,
            ))
        }
        LoweredNode::WaitFlags(p) => Some((
            kernels.wait_flags.clone(),
            LaunchConfig::linear(1, 1),
            KernelArgs::new().by_value(p),
            None,
        )),
        LoweredNode::Copy { .. } | LoweredNode::FlagSet { .. } => None,
    };
    Ok(launch)
}

/// A GEMM error of stage `stage` on device `device`, with both named.
fn at_stage(device: usize, stage: usize) -> impl FnOnce(GemmLaunchError) -> DistGemmError {
    move |e| match DistGemmError::from(e) {
        DistGemmError::Gemm { source, .. } => DistGemmError::Gemm {
            device,
            stage,
            source,
        },
        other => other,
    }
}

impl DeviceGraph {
    /// Builds and instantiates the graph of `lowered` on `kernels.gpu`; GEMM tensor maps are
    /// uploaded on `setup` (which this waits for).
    ///
    /// # Safety
    /// Every address in `lowered` must be memory that stays valid, with the sizes the plan
    /// gives, for as long as the graph may run (the callers validate the user's buffers and
    /// own the workspaces and peer mappings).
    pub(crate) unsafe fn build(
        kernels: &DeviceKernels,
        share: Option<GridShare>,
        setup: &CudaStream,
        lowered: LoweredGraph,
    ) -> Result<DeviceGraph, DistGemmError> {
        let device = lowered.device;
        let mut graph = Graph::new(&kernels.gpu)?;
        let mut nodes = Vec::with_capacity(lowered.nodes.len());
        let mut launches = Vec::with_capacity(lowered.nodes.len());
        let mut gemms = Vec::with_capacity(lowered.nodes.len());
        for node in &lowered.nodes {
            let handle = match (kernel_launch(kernels, share, setup, device, node)?, node) {
                (Some((kernel, cfg, mut args, prepared)), _) => {
                    // SAFETY: the function's contract; the tensor maps are owned by `prepared`,
                    // kept beside the node below.
                    let handle = unsafe { graph.add_kernel_node(&kernel, &cfg, &mut args)? };
                    launches.push(Some((kernel, cfg)));
                    gemms.push(prepared);
                    handle
                }
                (None, LoweredNode::Copy { dst, src, bytes }) => {
                    launches.push(None);
                    gemms.push(None);
                    // SAFETY: the function's contract.
                    unsafe { graph.add_memcpy_node(*dst, *src, *bytes)? }
                }
                (None, LoweredNode::FlagSet { dst, value }) => {
                    launches.push(None);
                    gemms.push(None);
                    // SAFETY: the function's contract (a flag of an exclusive workspace).
                    unsafe { graph.add_write_value_node(*dst, *value)? }
                }
                (None, other) => {
                    return Err(DistGemmError::Internal(format!(
                        "{} node without a launch",
                        other.name()
                    )));
                }
            };
            nodes.push(handle);
        }
        for e in &lowered.edges {
            let (Some(&from), Some(&to)) = (nodes.get(e.from), nodes.get(e.to)) else {
                return Err(DistGemmError::Internal(format!(
                    "edge {e:?} leaves the graph"
                )));
            };
            graph.add_dependency(from, to, e.kind)?;
        }
        let exec = graph.instantiate()?;
        crate::runtime::stream::synchronize(setup)?;
        Ok(DeviceGraph {
            exec,
            graph,
            nodes,
            lowered,
            launches,
            gemms,
        })
    }

    /// The graph the instance came from.
    #[cfg(feature = "testing")]
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph's node handles, in plan order.
    #[cfg(feature = "cli")]
    pub(crate) fn nodes(&self) -> &[GraphNode] {
        &self.nodes
    }

    /// Enqueues one run on `stream`.
    pub(crate) fn launch(&self, stream: RawStream) -> Result<(), DistGemmError> {
        Ok(self.exec.launch_on(stream)?)
    }

    /// Rewrites the nodes whose lowered form differs from `lowered` (same plan, new
    /// addresses); see the module documentation. Tensor maps are re-encoded in stream order
    /// on `stream` (from pageable host memory: the driver may wait for `stream` to stage them).
    ///
    /// # Safety
    /// As for [`DeviceGraph::build`] for the new addresses, and every launch of this graph
    /// must be enqueued on `stream` (or be complete).
    pub(crate) unsafe fn update(
        &mut self,
        kernels: &DeviceKernels,
        lowered: LoweredGraph,
        stream: RawStream,
    ) -> Result<(), DistGemmError> {
        let device = lowered.device;
        if lowered.nodes.len() != self.lowered.nodes.len() {
            return Err(DistGemmError::Internal(format!(
                "device {device}'s graph would change its node count on a pointer update"
            )));
        }
        for (i, node) in lowered.nodes.iter().enumerate() {
            let old = &self.lowered.nodes[i];
            if old == node {
                continue;
            }
            let handle = self.nodes[i];
            match (old, node) {
                (
                    LoweredNode::Gemm {
                        args: old_args,
                        fp8: old_fp8,
                        ..
                    },
                    LoweredNode::Gemm {
                        stage,
                        args,
                        fp8,
                        hook,
                    },
                ) if old_fp8.is_some() == fp8.is_some() => {
                    let (Some(prepared), Some((kernel, cfg))) =
                        (self.gemms[i].as_mut(), self.launches[i].as_ref())
                    else {
                        return Err(DistGemmError::Internal(format!(
                            "GEMM node {i} of device {device} has no prepared GEMM"
                        )));
                    };
                    if old_args != args {
                        // SAFETY: the function's contract.
                        unsafe { prepared.retarget(&kernels.gpu, old_args, args, stream) }
                            .map_err(at_stage(device, *stage))?;
                    }
                    // Row-wise FP8: the stage's rows in new scale vectors.
                    if let Some(rows) = fp8.filter(|_| old_fp8 != fp8) {
                        prepared.set_row_scales(rows);
                    }
                    // Flags and timeouts (e.g. a timing diagnostic that skips the waits).
                    prepared.set_hook(*hook);
                    let mut kargs = prepared.kernel_args();
                    // SAFETY: the function's contract; same kernel and launch shape.
                    unsafe {
                        self.exec
                            .set_kernel_node_params(handle, kernel, cfg, &mut kargs)?
                    };
                }
                (LoweredNode::Reduce(_), LoweredNode::Reduce(_))
                | (LoweredNode::Barrier(_), LoweredNode::Barrier(_))
                | (LoweredNode::WaitFlags(_), LoweredNode::WaitFlags(_)) => {
                    let Some((kernel, cfg)) = self.launches[i].as_ref() else {
                        return Err(DistGemmError::Internal(format!(
                            "kernel node {i} of device {device} has no launch"
                        )));
                    };
                    let mut kargs = match node {
                        LoweredNode::Reduce(p) => KernelArgs::new().by_value(p),
                        LoweredNode::Barrier(p) => KernelArgs::new().by_value(p),
                        LoweredNode::WaitFlags(p) => KernelArgs::new().by_value(p),
                        other => {
                            return Err(DistGemmError::Internal(format!(
                                "{} node {i} is not a collective kernel",
                                other.name()
                            )));
                        }
                    };
                    // SAFETY: the function's contract; same kernel and launch shape.
                    unsafe {
                        self.exec
                            .set_kernel_node_params(handle, kernel, cfg, &mut kargs)?
                    };
                }
                (LoweredNode::Copy { .. }, LoweredNode::Copy { dst, src, bytes }) => {
                    // SAFETY: the function's contract.
                    unsafe {
                        self.exec
                            .set_memcpy_node_params(handle, *dst, *src, *bytes)?
                    };
                }
                (old, new) => {
                    return Err(DistGemmError::Internal(format!(
                        "{} node {i} of device {device} cannot become {} on a pointer update",
                        old.name(),
                        new.name()
                    )));
                }
            }
        }
        self.lowered = lowered;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::GridShare;
    use crate::gemm::variant_named;

    #[test]
    fn a_shared_gpu_holds_every_ranks_clusters() {
        let share = GridShare {
            ranks: 2,
            blocks: 65,
        };
        // Unclustered: the rank's share of the SMs.
        assert_eq!(
            share.gemm_blocks(variant_named("128x256").unwrap(), 132),
            65
        );
        // 2-block clusters, 66 resident: 32 a rank (one left for the collective kernels' SM),
        // 64 blocks, under the 65 the SMs allow.
        let c2 = variant_named("128x256c2").unwrap();
        assert_eq!(share.gemm_blocks(c2, 66), 64);
        // A GPU whose GPCs hold fewer whole clusters than its SMs suggest: their count bounds.
        assert_eq!(share.gemm_blocks(c2, 51), 50);
        // Never less than one cluster.
        assert_eq!(share.gemm_blocks(c2, 1), 2);
    }
}
