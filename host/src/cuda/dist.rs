//! [`DistGemm`]: a distributed GEMM on P Hopper GPUs, one CUDA graph per GPU.
//!
//! Life cycle:
//! 1. [`DistGemmBuilder::build`] validates (devices, peer access, Hopper, shapes), enables
//!    peer access, allocates each device's workspace and exclusive workspace (zeroed once; all
//!    devices are synchronised before anything can run), lowers the plan and builds and
//!    instantiates one graph per device.
//! 2. [`DistGemm::run`] launches every device's graph on that device's stream and returns;
//!    runs may be queued back to back. [`DistGemm::wait`] waits for all devices, then reads
//!    every device's error word: a wait that timed out on a GPU becomes
//!    [`DistGemmError::Timeout`] naming the device, node, stage and flag.
//! 3. [`DistGemm::set_args`] points the graphs at new user buffers without rebuilding them:
//!    it waits for any run in flight, re-lowers the plan and rewrites only the nodes whose
//!    parameters changed (`cuGraphExecKernelNodeSetParams` with freshly built tensor maps,
//!    `cuGraphExecMemcpyNodeSetParams`).
//!
//! After any failure the instance is *poisoned* (the barrier counters may be out of step across
//! devices) and every later call returns [`DistGemmError::Poisoned`]; dropping it is safe.
//!
//! The user owns the shard buffers (A, B, optional C, D): they must be `cuMemAlloc` memory of
//! the rank's GPU (e.g. [`DeviceBuffer`]), stay alive while the `DistGemm` may run, and not be
//! written while a run is in flight (peers read the A/B shards of all-gather schedules).
//! `run` is ordered after earlier work on the `DistGemm`'s own streams only
//! ([`DistGemm::streams`]); finish uploads before calling it.

use std::sync::Arc;
use std::time::Duration;

use kernels_gpu::collective_abi::{REDUCE_SMEM_BYTES, REDUCE_THREADS, REDUCE_VECTOR};

use super::auto::{MachineModel, choose_schedule};
use super::error::{DistGemmError, decode_timeout};
use super::lower::{
    DeviceAddresses, LowerOptions, LoweredGraph, LoweredNode, TimingDiagnostics, lower_device,
};
use crate::dtype::Dtype;
use crate::gemm::{GemmKernel, PreparedGemm, check};
use crate::plan::Plan;
use crate::problem::Problem;
use crate::runtime::stream::GraphTopology;
use crate::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, Gpu, Graph, GraphExec, GraphNode, Kernel, KernelArgs,
    LaunchConfig, Module, RuntimeError,
};
use crate::schedule::{BufferKind, FlagRef, ScheduleKind};

/// Default bound of every GPU spin-wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which schedule to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleChoice {
    /// Exactly this schedule.
    Fixed(ScheduleKind),
    /// The pipelined or single-stage schedule of this schedule's family, by
    /// [`choose_schedule`].
    Auto(ScheduleKind),
}

/// A user buffer: device address, size and owning GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef {
    ptr: u64,
    bytes: usize,
    ordinal: usize,
}

impl BufferRef {
    /// The whole of `buffer`.
    #[must_use]
    pub fn of<T: DeviceCopy>(buffer: &DeviceBuffer<T>) -> Self {
        BufferRef {
            ptr: buffer.device_ptr(),
            bytes: buffer.size_bytes(),
            ordinal: buffer.ordinal(),
        }
    }

    /// A raw allocation.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be `cuMemAlloc` memory of GPU `ordinal` that outlives every run
    /// that uses it.
    #[must_use]
    pub unsafe fn from_raw(ptr: u64, bytes: usize, ordinal: usize) -> Self {
        BufferRef {
            ptr,
            bytes,
            ordinal,
        }
    }

    /// Device address.
    #[must_use]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<T: DeviceCopy> From<&DeviceBuffer<T>> for BufferRef {
    fn from(buffer: &DeviceBuffer<T>) -> Self {
        BufferRef::of(buffer)
    }
}

/// One device's shard buffers, packed row-major as the plan's shard layout says
/// (sizes: [`crate::plan::DevicePlan::buffer_elements`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Shard of A.
    pub a: BufferRef,
    /// Shard of B.
    pub b: BufferRef,
    /// Shard of C (required exactly when beta ≠ 0; ignored otherwise).
    pub c: Option<BufferRef>,
    /// Shard of D (the output).
    pub d: BufferRef,
}

/// Builder of a [`DistGemm`].
#[derive(Debug, Default)]
#[must_use]
pub struct DistGemmBuilder {
    devices: Vec<Gpu>,
    tp: Option<usize>,
    schedule: Option<ScheduleChoice>,
    problem: Option<Problem>,
    dtype: Option<Dtype>,
    timeout: Option<Duration>,
    args: Option<Vec<DeviceArgs>>,
    modules: Vec<Arc<Module>>,
    share_gpus: bool,
    missing_signals: Vec<FlagRef>,
}

impl DistGemmBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The GPUs, rank i on `gpus[i]`.
    pub fn devices(self, gpus: Vec<Gpu>) -> Self {
        DistGemmBuilder {
            devices: gpus,
            ..self
        }
    }

    /// The tensor-parallel degree (default: the number of devices).
    pub fn tp(self, tp: usize) -> Self {
        DistGemmBuilder {
            tp: Some(tp),
            ..self
        }
    }

    /// A fixed schedule.
    pub fn schedule(self, kind: ScheduleKind) -> Self {
        DistGemmBuilder {
            schedule: Some(ScheduleChoice::Fixed(kind)),
            ..self
        }
    }

    /// `Auto` within `family`'s shard layout (see [`super::auto`]).
    pub fn auto_schedule(self, family: ScheduleKind) -> Self {
        DistGemmBuilder {
            schedule: Some(ScheduleChoice::Auto(family)),
            ..self
        }
    }

    /// The global problem.
    pub fn problem(self, problem: Problem) -> Self {
        DistGemmBuilder {
            problem: Some(problem),
            ..self
        }
    }

    /// The element type (overrides the problem's).
    pub fn dtype(self, dtype: Dtype) -> Self {
        DistGemmBuilder {
            dtype: Some(dtype),
            ..self
        }
    }

    /// Bound of every GPU spin-wait (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(self, timeout: Duration) -> Self {
        DistGemmBuilder {
            timeout: Some(timeout),
            ..self
        }
    }

    /// Every device's shard buffers, index = rank.
    pub fn args(self, args: Vec<DeviceArgs>) -> Self {
        DistGemmBuilder {
            args: Some(args),
            ..self
        }
    }

    /// Already loaded PTX modules to reuse (one per GPU; others are loaded).
    pub fn modules(self, modules: Vec<Arc<Module>>) -> Self {
        DistGemmBuilder { modules, ..self }
    }

    /// Allows several ranks on one GPU (for testing the protocol on a single GPU). Building
    /// then checks that every rank's kernels fit on the GPU together.
    pub fn ranks_may_share_gpus(self, allow: bool) -> Self {
        DistGemmBuilder {
            share_gpus: allow,
            ..self
        }
    }

    /// Fault injection for tests: no node stores into `flag`, so its waiter times out.
    pub fn inject_missing_signal(mut self, flag: FlagRef) -> Self {
        self.missing_signals.push(flag);
        self
    }

    fn resolved_problem(&self) -> Result<Problem, DistGemmError> {
        let problem = self.problem.ok_or(DistGemmError::Missing("a problem"))?;
        Ok(match self.dtype {
            Some(dtype) => problem.with_dtype(dtype),
            None => problem,
        })
    }

    fn resolved_tp(&self) -> usize {
        self.tp.unwrap_or(self.devices.len())
    }

    /// The schedule that will run (resolving `Auto`).
    pub fn resolved_schedule(&self) -> Result<ScheduleKind, DistGemmError> {
        let problem = self.resolved_problem()?;
        let model = MachineModel {
            sm_count: self
                .devices
                .first()
                .map_or(MachineModel::H200.sm_count, Gpu::sm_count),
            ..MachineModel::H200
        };
        match self.schedule.ok_or(DistGemmError::Missing("a schedule"))? {
            ScheduleChoice::Fixed(kind) => Ok(kind),
            ScheduleChoice::Auto(family) => {
                Ok(choose_schedule(family, &problem, self.resolved_tp(), &model).schedule)
            }
        }
    }

    /// The plan that will run, without touching a GPU: use it to size the shard buffers.
    pub fn plan(&self) -> Result<Plan, DistGemmError> {
        let tp = self.resolved_tp();
        if tp == 0 {
            return Err(DistGemmError::Missing("at least one device"));
        }
        Ok(Plan::build(
            self.resolved_schedule()?,
            self.resolved_problem()?,
            tp,
        )?)
    }

    /// Validates everything, allocates, builds and instantiates the graphs.
    pub fn build(self) -> Result<DistGemm, DistGemmError> {
        let tp = self.resolved_tp();
        if self.devices.len() < tp || tp == 0 {
            return Err(DistGemmError::TooFewDevices {
                tp: tp.max(1),
                given: self.devices.len(),
            });
        }
        let plan = self.plan()?;
        let gpus: Vec<Gpu> = self.devices[..tp].to_vec();
        validate_devices(&gpus, self.share_gpus)?;
        let args = self.args.clone().ok_or(DistGemmError::Missing("args"))?;
        validate_args(&plan, &gpus, &args)?;

        let mut ranks = Vec::with_capacity(tp);
        for (d, gpu) in gpus.iter().enumerate() {
            let module = match self
                .modules
                .iter()
                .find(|m| m.gpu().ordinal() == gpu.ordinal())
            {
                Some(m) => Arc::clone(m),
                None => Module::load(gpu)?,
            };
            ranks.push(Rank::new(gpu, &module, &plan, d)?);
        }
        // All exclusive workspaces are zero on every device before any graph can run.
        for rank in &ranks {
            crate::runtime::stream::synchronize(&rank.stream)?;
        }
        let mut dist = DistGemm {
            graphs: Vec::new(),
            ranks,
            plan,
            args,
            options: LowerOptions {
                timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
                missing_signals: self.missing_signals,
                diagnostics: TimingDiagnostics::default(),
            },
            share_limits: Vec::new(),
            in_flight: false,
            poisoned: None,
        };
        dist.share_limits = share_limits(&gpus);
        let addresses = dist.addresses(&dist.args);
        for d in 0..tp {
            let lowered = lower_device(&dist.plan, d, &addresses, &dist.options)?;
            check_gemms(&lowered)?;
            let graph = dist.build_graph(d, lowered)?;
            dist.graphs.push(graph);
        }
        Ok(dist)
    }
}

/// One GPU of a rank: its stream, kernels and workspaces.
struct Rank {
    gpu: Gpu,
    stream: Arc<CudaStream>,
    gemm: GemmKernel,
    barrier: Kernel,
    reduce: Kernel,
    workspace: DeviceBuffer<u8>,
    exclusive: DeviceBuffer<u32>,
    _module: Arc<Module>,
}

impl Rank {
    fn new(gpu: &Gpu, module: &Arc<Module>, plan: &Plan, d: usize) -> Result<Rank, DistGemmError> {
        let stream = gpu.new_stream()?;
        let gemm = GemmKernel::new(module)?;
        let barrier = module.kernel("collective_barrier")?;
        let reduce = module.kernel(match plan.problem.dtype {
            Dtype::Bf16 => "reduce_sum_bf16",
            Dtype::F16 => "reduce_sum_f16",
        })?;
        let workspace_bytes = plan.devices.get(d).map_or(0, |dev| dev.workspace_bytes);
        let workspace = DeviceBuffer::<u8>::alloc(gpu, workspace_bytes)?;
        let mut exclusive = DeviceBuffer::<u32>::alloc(gpu, plan.exclusive.bytes.div_ceil(4))?;
        exclusive.fill_bytes(&stream, 0)?;
        Ok(Rank {
            gpu: gpu.clone(),
            stream,
            gemm,
            barrier,
            reduce,
            workspace,
            exclusive,
            _module: Arc::clone(module),
        })
    }
}

/// What a kernel node is made of: kernel, launch shape, arguments, and the prepared GEMM whose
/// tensor maps the arguments point to (GEMM nodes only).
type KernelLaunch = (Kernel, LaunchConfig, KernelArgs, Option<PreparedGemm>);

/// A device's instantiated graph and what its nodes were built from.
struct DeviceGraph {
    exec: GraphExec,
    graph: Graph,
    nodes: Vec<GraphNode>,
    lowered: LoweredGraph,
    /// Per node: the kernel and launch shape of kernel nodes.
    launches: Vec<Option<(Kernel, LaunchConfig)>>,
    /// Per node: the prepared GEMM (owns the tensor maps the node's parameters point to).
    gemms: Vec<Option<PreparedGemm>>,
}

/// A distributed GEMM ready to run; see the module documentation.
pub struct DistGemm {
    // Dropped first: graphs and the tensor maps their nodes point to.
    graphs: Vec<DeviceGraph>,
    ranks: Vec<Rank>,
    plan: Plan,
    args: Vec<DeviceArgs>,
    options: LowerOptions,
    /// Per rank: the most blocks one kernel may use when ranks share its GPU.
    share_limits: Vec<Option<(usize, u32)>>,
    in_flight: bool,
    poisoned: Option<String>,
}

impl std::fmt::Debug for DistGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistGemm")
            .field("schedule", &self.plan.schedule)
            .field("problem", &self.plan.problem)
            .field("tp", &self.plan.tp)
            .field("in_flight", &self.in_flight)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// Peer access between every pair of distinct GPUs, Hopper only, no shared GPU unless allowed.
fn validate_devices(gpus: &[Gpu], share: bool) -> Result<(), DistGemmError> {
    for gpu in gpus {
        let (major, minor) = gpu.compute_capability();
        if (major, minor) != (9, 0) {
            return Err(RuntimeError::NotHopper {
                ordinal: gpu.ordinal(),
                name: gpu.name().to_owned(),
                major,
                minor,
            }
            .into());
        }
    }
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate().skip(i + 1) {
            if a.ordinal() == b.ordinal() {
                if !share {
                    return Err(DistGemmError::SharedGpu {
                        first: i,
                        second: j,
                        ordinal: a.ordinal(),
                    });
                }
                continue;
            }
            for (from, to) in [(a, b), (b, a)] {
                if !from.can_access_peer(to)? {
                    return Err(RuntimeError::NoPeerAccess {
                        from: from.ordinal(),
                        to: to.ordinal(),
                    }
                    .into());
                }
            }
            crate::runtime::enable_peer_access_between(a, b)?;
        }
    }
    Ok(())
}

/// Per rank, `(ranks on its GPU, blocks per kernel)` when the GPU is shared: every kernel of
/// every rank must be able to be resident at once (the GEMM uses one block per SM), with one
/// SM left for the 1-thread barrier kernels.
fn share_limits(gpus: &[Gpu]) -> Vec<Option<(usize, u32)>> {
    gpus.iter()
        .map(|g| {
            let ranks = gpus.iter().filter(|o| o.ordinal() == g.ordinal()).count();
            (ranks > 1).then(|| {
                let per_rank = g.sm_count().saturating_sub(1) / ranks as u32;
                (ranks, per_rank)
            })
        })
        .collect()
}

fn validate_args(plan: &Plan, gpus: &[Gpu], args: &[DeviceArgs]) -> Result<(), DistGemmError> {
    if args.len() != plan.tp {
        return Err(DistGemmError::ArgumentCount {
            given: args.len(),
            tp: plan.tp,
        });
    }
    let elem = plan.problem.dtype.size_bytes();
    for ((dev, gpu), a) in plan.devices.iter().zip(gpus).zip(args) {
        let needs_c = dev.shards.c.is_some();
        let buffers = [
            (BufferKind::A, Some(a.a)),
            (BufferKind::B, Some(a.b)),
            (BufferKind::C, if needs_c { a.c } else { None }),
            (BufferKind::D, Some(a.d)),
        ];
        for (kind, buffer) in buffers {
            let needed = dev.buffer_elements(kind) * elem;
            let bad = |reason: String| DistGemmError::BadBuffer {
                device: dev.device,
                buffer: kind,
                reason,
            };
            let Some(b) = buffer else {
                if kind == BufferKind::C && needs_c {
                    return Err(bad(format!(
                        "beta = {} needs a C shard of {needed} bytes",
                        plan.problem.beta
                    )));
                }
                continue;
            };
            if b.ordinal != gpu.ordinal() {
                return Err(bad(format!(
                    "it lives on GPU {} but rank {} runs on GPU {}",
                    b.ordinal,
                    dev.device,
                    gpu.ordinal()
                )));
            }
            if b.bytes < needed {
                return Err(bad(format!(
                    "it has {} bytes, the plan needs {needed} ({} elements)",
                    b.bytes,
                    dev.buffer_elements(kind)
                )));
            }
            if b.ptr == 0 || !b.ptr.is_multiple_of(16) {
                return Err(bad(format!(
                    "address {:#x} is not a 16-byte-aligned allocation",
                    b.ptr
                )));
            }
        }
    }
    Ok(())
}

/// `can_implement` of the GEMM kernel on every stage GEMM.
fn check_gemms(lowered: &LoweredGraph) -> Result<(), DistGemmError> {
    for node in &lowered.nodes {
        if let LoweredNode::Gemm { stage, args, .. } = node {
            check(args).map_err(|source| DistGemmError::Gemm {
                device: lowered.device,
                stage: *stage,
                source,
            })?;
        }
    }
    Ok(())
}

impl DistGemm {
    /// A builder.
    pub fn builder() -> DistGemmBuilder {
        DistGemmBuilder::new()
    }

    /// The plan the graphs were built from.
    #[must_use]
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The schedule that runs.
    #[must_use]
    pub fn schedule(&self) -> ScheduleKind {
        self.plan.schedule
    }

    /// Workspace bytes allocated on device `rank` (at most P−1 stage slices for the pipelined
    /// schedules, P for the single-stage ones).
    #[must_use]
    pub fn workspace_bytes(&self, rank: usize) -> usize {
        self.ranks.get(rank).map_or(0, |r| r.workspace.size_bytes())
    }

    /// Exclusive-workspace bytes per device.
    #[must_use]
    pub fn exclusive_bytes(&self) -> usize {
        self.plan.exclusive.bytes
    }

    /// The stream each device's graph runs on, index = rank.
    #[must_use]
    pub fn streams(&self) -> Vec<Arc<CudaStream>> {
        self.ranks.iter().map(|r| Arc::clone(&r.stream)).collect()
    }

    /// The bound of every GPU wait.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// Device `rank`'s graph as lowered data (node i = plan node i).
    pub fn lowered(&self, rank: usize) -> Result<&LoweredGraph, DistGemmError> {
        self.graphs
            .get(rank)
            .map(|g| &g.lowered)
            .ok_or(DistGemmError::NoSuchDevice {
                device: rank,
                tp: self.plan.tp,
            })
    }

    /// Device `rank`'s graph as the driver sees it (node indices in creation order = plan
    /// order).
    pub fn graph_topology(&self, rank: usize) -> Result<GraphTopology, DistGemmError> {
        let graph = self.graphs.get(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })?;
        Ok(graph.graph.topology()?)
    }

    fn addresses(&self, args: &[DeviceArgs]) -> Vec<DeviceAddresses> {
        self.ranks
            .iter()
            .zip(args)
            .map(|(r, a)| DeviceAddresses {
                a: a.a.ptr,
                b: a.b.ptr,
                c: a.c.map_or(0, |c| c.ptr),
                d: a.d.ptr,
                workspace: r.workspace.device_ptr(),
                exclusive: r.exclusive.device_ptr(),
            })
            .collect()
    }

    /// The kernel, launch configuration, arguments and prepared GEMM of kernel node `node`.
    fn kernel_launch(
        &self,
        rank: usize,
        node: &LoweredNode,
    ) -> Result<Option<KernelLaunch>, DistGemmError> {
        let r = &self.ranks[rank];
        let launch = match node {
            LoweredNode::Barrier(p) => Some((
                r.barrier.clone(),
                LaunchConfig::linear(1, 1),
                KernelArgs::new().by_value(p),
                None,
            )),
            LoweredNode::Gemm { stage, args, hook } => {
                let mut prepared =
                    r.gemm
                        .prepare(&r.stream, args)
                        .map_err(|e| match DistGemmError::from(e) {
                            DistGemmError::Gemm { source, .. } => DistGemmError::Gemm {
                                device: rank,
                                stage: *stage,
                                source,
                            },
                            other => other,
                        })?;
                prepared.set_hook(*hook);
                let cfg = prepared.launch_config(false);
                let kernel = prepared.kernel().clone();
                let kargs = prepared.kernel_args();
                Some((kernel, cfg, kargs, Some(prepared)))
            }
            LoweredNode::Reduce(p) => {
                let vectors = u64::from(p.rows) * u64::from(p.cols / REDUCE_VECTOR);
                let mut blocks = vectors.div_ceil(u64::from(REDUCE_THREADS));
                blocks = blocks.min(u64::from(r.gpu.sm_count()) * 4);
                if let Some(Some((_, limit))) = self.share_limits.get(rank) {
                    blocks = blocks.min(u64::from(*limit));
                }
                let blocks = u32::try_from(blocks.max(1)).unwrap_or(1);
                Some((
                    r.reduce.clone(),
                    LaunchConfig::linear(blocks, REDUCE_THREADS)
                        .with_dynamic_smem(REDUCE_SMEM_BYTES),
                    KernelArgs::new().by_value(p),
                    None,
                ))
            }
            LoweredNode::Copy { .. } | LoweredNode::FlagSet { .. } => None,
        };
        if let (Some((_, cfg, _, _)), Some(Some((ranks, limit)))) =
            (&launch, self.share_limits.get(rank))
        {
            let blocks = cfg.grid.0 * cfg.grid.1 * cfg.grid.2;
            if blocks > *limit {
                return Err(DistGemmError::TooLargeForSharedGpu {
                    rank,
                    node: node_name(node),
                    blocks,
                    ranks: *ranks,
                    ordinal: self.ranks[rank].gpu.ordinal(),
                    limit: *limit,
                });
            }
        }
        Ok(launch)
    }

    fn build_graph(
        &self,
        rank: usize,
        lowered: LoweredGraph,
    ) -> Result<DeviceGraph, DistGemmError> {
        let mut graph = Graph::new(&self.ranks[rank].gpu)?;
        let mut nodes = Vec::with_capacity(lowered.nodes.len());
        let mut launches = Vec::with_capacity(lowered.nodes.len());
        let mut gemms = Vec::with_capacity(lowered.nodes.len());
        for node in &lowered.nodes {
            let handle = match (self.kernel_launch(rank, node)?, node) {
                (Some((kernel, cfg, mut args, prepared)), _) => {
                    // SAFETY: the arguments come from the lowering of a validated plan over
                    // validated buffers; the workspaces are owned by `self`, the tensor maps by
                    // `prepared` (kept below), the user buffers by the caller (module contract).
                    let handle = unsafe { graph.add_kernel_node(&kernel, &cfg, &mut args)? };
                    launches.push(Some((kernel, cfg)));
                    gemms.push(prepared);
                    handle
                }
                (None, LoweredNode::Copy { dst, src, bytes }) => {
                    launches.push(None);
                    gemms.push(None);
                    // SAFETY: as above; both ranges were checked against the plan's sizes.
                    unsafe { graph.add_memcpy_node(*dst, *src, *bytes)? }
                }
                (None, LoweredNode::FlagSet { dst, value }) => {
                    launches.push(None);
                    gemms.push(None);
                    // SAFETY: a flag of an exclusive workspace owned by `self`.
                    unsafe { graph.add_memset_u32_node(*dst, *value)? }
                }
                (None, other) => {
                    return Err(DistGemmError::Internal(format!(
                        "{} node without a launch",
                        node_name(other)
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
        Ok(DeviceGraph {
            exec,
            graph,
            nodes,
            lowered,
            launches,
            gemms,
        })
    }

    fn usable(&self) -> Result<(), DistGemmError> {
        match &self.poisoned {
            Some(why) => Err(DistGemmError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn poison(&mut self, e: DistGemmError) -> DistGemmError {
        if self.poisoned.is_none() {
            self.poisoned = Some(e.to_string());
        }
        e
    }

    /// Launches one run on every device and returns without waiting.
    pub fn run(&mut self) -> Result<(), DistGemmError> {
        let all: Vec<usize> = (0..self.plan.tp).collect();
        self.run_ranks(&all)
    }

    /// Fault injection for tests: launches the graphs of `ranks` only, as if the other devices
    /// were stuck. Their peers' barriers time out; the instance is poisoned afterwards.
    pub fn run_only(&mut self, ranks: &[usize]) -> Result<(), DistGemmError> {
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.plan.tp) {
            return Err(DistGemmError::NoSuchDevice {
                device: bad,
                tp: self.plan.tp,
            });
        }
        let result = self.run_ranks(ranks);
        if ranks.len() < self.plan.tp && self.poisoned.is_none() {
            self.poisoned = Some("a fault-injection run left out some devices".into());
        }
        result
    }

    fn run_ranks(&mut self, ranks: &[usize]) -> Result<(), DistGemmError> {
        self.usable()?;
        for &r in ranks {
            let (graph, rank) = (&self.graphs[r], &self.ranks[r]);
            if let Err(e) = graph.exec.launch(&rank.stream) {
                return Err(self.poison(e.into()));
            }
            self.in_flight = true;
        }
        Ok(())
    }

    /// Waits for every device, then checks every device's error word: a timed-out wait becomes
    /// [`DistGemmError::Timeout`] (the first device's, by rank), and poisons the instance.
    pub fn wait(&mut self) -> Result<(), DistGemmError> {
        let mut first: Option<DistGemmError> = None;
        for rank in &self.ranks {
            if let Err(e) = crate::runtime::stream::synchronize(&rank.stream) {
                first.get_or_insert(e.into());
            }
        }
        self.in_flight = false;
        if let Some(e) = first {
            return Err(self.poison(e));
        }
        let word = self.plan.exclusive.error_offset / 4;
        for (d, rank) in self.ranks.iter().enumerate() {
            let words = rank.exclusive.download(&rank.stream)?;
            let code = words.get(word).copied().unwrap_or(0);
            if code != 0 {
                let e = match decode_timeout(code) {
                    Some(site) => DistGemmError::Timeout {
                        device: d,
                        ordinal: rank.gpu.ordinal(),
                        site,
                        timeout: self.options.timeout,
                    },
                    None => DistGemmError::UnknownErrorCode { device: d, code },
                };
                return Err(self.poison(e));
            }
        }
        Ok(())
    }

    /// Alias of [`DistGemm::wait`].
    pub fn synchronize(&mut self) -> Result<(), DistGemmError> {
        self.wait()
    }

    /// Device `rank`'s exclusive workspace as u32 words (counter, error word, flags), after
    /// waiting for its stream. A finished sequence of runs leaves every counter at 0.
    pub fn exclusive_words(&self, rank: usize) -> Result<Vec<u32>, DistGemmError> {
        let r = self.ranks.get(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })?;
        Ok(r.exclusive.download(&r.stream)?)
    }

    /// Fills every workspace with `byte` (e.g. 0xFF: NaN), after waiting for runs in flight,
    /// so a test can see that nothing reads a slot before it is written.
    pub fn poison_workspaces(&mut self, byte: u8) -> Result<(), DistGemmError> {
        self.usable()?;
        if self.in_flight {
            self.wait()?;
        }
        for rank in &mut self.ranks {
            rank.workspace.fill_bytes(&rank.stream, byte)?;
            crate::runtime::stream::synchronize(&rank.stream)?;
        }
        Ok(())
    }

    /// Points device `rank` at new shard buffers; see [`DistGemm::set_args`].
    pub fn set_device_args(&mut self, rank: usize, args: DeviceArgs) -> Result<(), DistGemmError> {
        let mut all = self.args.clone();
        let slot = all.get_mut(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })?;
        *slot = args;
        self.set_args(all)
    }

    /// Points the graphs at new shard buffers without rebuilding them. Waits for any run in
    /// flight first (parameters of an instantiated graph must not change under a launch), then
    /// rewrites only the nodes whose parameters change — including peers' nodes that read
    /// this device's buffers — with `cuGraphExecKernelNodeSetParams` (GEMM nodes get new
    /// tensor maps) and `cuGraphExecMemcpyNodeSetParams`.
    pub fn set_args(&mut self, args: Vec<DeviceArgs>) -> Result<(), DistGemmError> {
        self.usable()?;
        if self.in_flight {
            self.wait()?;
        }
        let gpus: Vec<Gpu> = self.ranks.iter().map(|r| r.gpu.clone()).collect();
        validate_args(&self.plan, &gpus, &args)?;
        let addresses = self.addresses(&args);
        let mut updated = Vec::with_capacity(self.plan.tp);
        for d in 0..self.plan.tp {
            let lowered = lower_device(&self.plan, d, &addresses, &self.options)?;
            check_gemms(&lowered)?;
            updated.push(lowered);
        }
        for (d, lowered) in updated.into_iter().enumerate() {
            if let Err(e) = self.update_graph(d, lowered) {
                return Err(self.poison(e));
            }
        }
        self.args = args;
        Ok(())
    }

    /// Diagnostics for benchmarks: from now on, runs leave out what `diagnostics` says
    /// ([`TimingDiagnostics`]; the default restores real runs). Nodes are updated in place,
    /// like [`DistGemm::set_args`]. The workspaces keep what earlier runs copied into them, so
    /// after one full run capped copies still feed the GEMMs real data: a workspace of zeros
    /// draws less power, and power-capped GEMMs then run faster (measured 5–12 % faster than
    /// the same GEMMs on random data).
    pub fn set_timing_diagnostics(
        &mut self,
        diagnostics: TimingDiagnostics,
    ) -> Result<(), DistGemmError> {
        let previous = std::mem::replace(&mut self.options.diagnostics, diagnostics);
        let result = self.set_args(self.args.clone());
        if result.is_err() {
            // Nothing was applied (or the instance is poisoned): later updates must not
            // apply the rejected diagnostics.
            self.options.diagnostics = previous;
        }
        result
    }

    fn update_graph(&mut self, rank: usize, lowered: LoweredGraph) -> Result<(), DistGemmError> {
        for (i, node) in lowered.nodes.iter().enumerate() {
            if self.graphs[rank].lowered.nodes.get(i) == Some(node) {
                continue;
            }
            let handle = self.graphs[rank].nodes[i];
            match (self.kernel_launch(rank, node)?, node) {
                (Some((kernel, cfg, mut args, prepared)), _) => {
                    let same_shape = self.graphs[rank].launches[i]
                        .as_ref()
                        .is_some_and(|(k, c)| k.cu_function() == kernel.cu_function() && *c == cfg);
                    if !same_shape {
                        return Err(DistGemmError::Internal(format!(
                            "node {i} of device {rank} would change its kernel or launch shape"
                        )));
                    }
                    let graph = &mut self.graphs[rank];
                    // SAFETY: as in `build_graph`; no run is in flight (waited above).
                    unsafe {
                        graph
                            .exec
                            .set_kernel_node_params(handle, &kernel, &cfg, &mut args)?
                    };
                    // The old tensor maps are no longer referenced by the instance.
                    graph.gemms[i] = prepared;
                }
                (None, LoweredNode::Copy { dst, src, bytes }) => {
                    // SAFETY: as in `build_graph`; no run is in flight.
                    unsafe {
                        self.graphs[rank]
                            .exec
                            .set_memcpy_node_params(handle, *dst, *src, *bytes)?
                    };
                }
                (None, other) => {
                    return Err(DistGemmError::Internal(format!(
                        "{} node {i} of device {rank} changed on a pointer update",
                        node_name(other)
                    )));
                }
            }
        }
        self.graphs[rank].lowered = lowered;
        Ok(())
    }
}

fn node_name(node: &LoweredNode) -> &'static str {
    match node {
        LoweredNode::Barrier(_) => "barrier",
        LoweredNode::Gemm { .. } => "gemm",
        LoweredNode::Reduce(_) => "reduce",
        LoweredNode::Copy { .. } => "copy",
        LoweredNode::FlagSet { .. } => "flag",
    }
}

impl Drop for DistGemm {
    /// Waits for every device's stream (runs in flight read the workspaces and the user's
    /// buffers), then frees graphs, tensor maps and workspaces. Errors cannot be returned from
    /// `drop` and are ignored here.
    fn drop(&mut self) {
        for rank in &self.ranks {
            let _ = crate::runtime::stream::synchronize(&rank.stream);
        }
        self.graphs.clear();
    }
}
