//! [`DistGemm`]: a distributed GEMM on P Hopper GPUs driven from one process, one CUDA graph
//! per GPU.
//!
//! Life cycle:
//! 1. [`DistGemmBuilder::build`] validates (devices, peer access, Hopper, shapes), enables
//!    peer access, allocates each device's workspace and exclusive workspace (zeroed once; all
//!    devices are synchronised before anything can run), lowers the plan and builds and
//!    instantiates one graph per device (`graphs`, shared with the per-rank mode).
//! 2. [`DistGemm::run`] launches every device's graph on that device's stream and returns;
//!    runs may be queued back to back. [`DistGemm::wait`] waits for all devices, then reads
//!    every device's error word: a wait that timed out on a GPU becomes
//!    [`DistGemmError::Timeout`] naming the device, node, stage and flag.
//! 3. [`DistGemm::set_args`] points the graphs at new user buffers without rebuilding them:
//!    it waits for any run in flight, re-lowers the plan and rewrites only the nodes whose
//!    parameters changed.
//!
//! After any failure the instance is *poisoned* (the barrier counters may be out of step across
//! devices) and every later call returns [`DistGemmError::Poisoned`]; dropping it is safe. An
//! error from [`DistGemm::wait`] invalidates every run since the last successful `wait`.
//!
//! The user's shard buffers (A, B, optional C, D) are borrowed ([`super::BufferRef`]): they
//! must be `cuMemAlloc` memory of the rank's GPU. A device's input shards may be rewritten in
//! that device's stream order once its run has been enqueued (its graph ends only after every
//! peer has released them); D is final once the device's stream has passed the run. `run` is
//! ordered after earlier work on the `DistGemm`'s own streams ([`DistGemm::streams`]), or on
//! the caller's with [`DistGemm::run_on`]. One process per GPU, on the
//! caller's stream: [`super::RankGemm`].

use std::sync::Arc;
use std::time::Duration;

use super::args::{DeviceArgs, validate_args};
use super::auto::{
    ASSUMED_GPU_NAME, MachineModel, Resolution, ScheduleSource, choose_schedule_tuned,
};
use super::error::{DistGemmError, decode_timeout};
use super::graphs::{DeviceGraph, DeviceKernels, GridShare, Poison};
#[cfg(feature = "diagnostics")]
use super::lower::TimingDiagnostics;
use super::lower::{DeviceAddresses, LowerOptions, LoweredGraph, lower_device};
use super::tuning::LoadedTable;
use crate::dtype::Dtype;
use crate::gemm::check;
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::Problem;
#[cfg(feature = "testing")]
use crate::runtime::stream::GraphTopology;
use crate::runtime::{
    CudaStream, DeviceBuffer, Gpu, Module, RawStream, RuntimeError, require_peer_link,
};
#[cfg(feature = "testing")]
use crate::schedule::FlagRef;
use crate::schedule::ScheduleKind;

/// Default bound of every GPU spin-wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which schedule to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleChoice {
    /// Exactly this schedule.
    Fixed(ScheduleKind),
    /// The pipelined or single-stage schedule of this schedule's family, by a tuning table's
    /// measured choice or the rule ([`choose_schedule_tuned`]).
    Auto(ScheduleKind),
}

impl ScheduleChoice {
    /// The schedule that runs `problem` at `tp` on GPUs with `sm_count` SMs, by the rule
    /// alone (no tuning table; the builders use [`ScheduleChoice::resolve_with`]).
    #[must_use]
    pub fn resolve(self, problem: &Problem, tp: usize, sm_count: u32) -> ScheduleKind {
        self.resolve_with(problem, tp, ASSUMED_GPU_NAME, sm_count, None)
            .schedule
    }

    /// The schedule that runs `problem` at `tp` on GPUs named `gpu` with `sm_count` SMs, and
    /// who decided it: a fixed schedule, or `Auto` with `table`'s measured choice where an
    /// entry matches, else the rule ([`choose_schedule_tuned`]).
    #[must_use]
    pub fn resolve_with(
        self,
        problem: &Problem,
        tp: usize,
        gpu: &str,
        sm_count: u32,
        table: Option<&LoadedTable>,
    ) -> Resolution {
        match self {
            ScheduleChoice::Fixed(kind) => Resolution {
                schedule: kind,
                source: ScheduleSource::Fixed,
                rule: None,
            },
            ScheduleChoice::Auto(family) => {
                let model = MachineModel {
                    sm_count,
                    ..MachineModel::H200
                };
                choose_schedule_tuned(family, problem, tp, gpu, &model, table)
            }
        }
    }

    /// The tuning table `Auto` reads: `given`, else the file [`TUNING_ENV_VAR`] names (none
    /// for a fixed schedule: it is not read).
    ///
    /// [`TUNING_ENV_VAR`]: super::tuning::TUNING_ENV_VAR
    pub(crate) fn table(
        self,
        given: Option<&Arc<LoadedTable>>,
    ) -> Result<Option<Arc<LoadedTable>>, DistGemmError> {
        Ok(match (self, given) {
            (ScheduleChoice::Fixed(_), _) => None,
            (ScheduleChoice::Auto(_), Some(t)) => Some(Arc::clone(t)),
            (ScheduleChoice::Auto(_), None) => LoadedTable::from_env()?.map(Arc::new),
        })
    }
}

/// Builder of a [`DistGemm`].
#[derive(Debug, Default)]
#[must_use]
pub struct DistGemmBuilder<'a> {
    devices: Vec<Gpu>,
    tp: Option<usize>,
    schedule: Option<ScheduleChoice>,
    problem: Option<Problem>,
    dtype: Option<Dtype>,
    timeout: Option<Duration>,
    args: Option<Vec<DeviceArgs<'a>>>,
    modules: Vec<Arc<Module>>,
    share_gpus: bool,
    rs_partials: RsPartials,
    tuning: Option<Arc<LoadedTable>>,
    #[cfg(feature = "testing")]
    missing_signals: Vec<FlagRef>,
}

impl<'a> DistGemmBuilder<'a> {
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

    /// How the pipelined reduce-scatter schedules move partial sums (default
    /// [`RsPartials::Read`]; ignored by other schedules, also when `Auto` picks one). `Auto`
    /// never picks [`RsPartials::Push`]: it stays `Read` until pushing is measured.
    pub fn rs_partials(self, rs_partials: RsPartials) -> Self {
        DistGemmBuilder {
            rs_partials,
            ..self
        }
    }

    /// The tuning table `Auto` reads (default: the file `DISTGEMM_TUNING` names, if set; see
    /// [`super::tuning`]). Ignored by a fixed schedule.
    pub fn tuning_table(self, table: Arc<LoadedTable>) -> Self {
        DistGemmBuilder {
            tuning: Some(table),
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
    pub fn args(self, args: Vec<DeviceArgs<'a>>) -> Self {
        DistGemmBuilder {
            args: Some(args),
            ..self
        }
    }

    /// Already loaded PTX modules to reuse (one per GPU; others are loaded).
    pub fn modules(self, modules: Vec<Arc<Module>>) -> Self {
        DistGemmBuilder { modules, ..self }
    }

    /// Allows several ranks on one GPU (for testing the protocol on a single GPU). Every
    /// rank's kernels then get an equal share of the GPU's SMs, so all can be resident at once.
    #[cfg(feature = "testing")]
    pub fn ranks_may_share_gpus(self, allow: bool) -> Self {
        DistGemmBuilder {
            share_gpus: allow,
            ..self
        }
    }

    /// Fault injection for tests: no node stores into `flag`, so its waiter times out.
    #[cfg(feature = "testing")]
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
        Ok(self.resolution()?.schedule)
    }

    /// The schedule that will run and who decided it: `Auto` reads the tuning table (given, or
    /// named by `DISTGEMM_TUNING`; an unusable one is [`DistGemmError::Tuning`]) for the first
    /// device's GPU, or [`ASSUMED_GPU_NAME`] without devices.
    pub fn resolution(&self) -> Result<Resolution, DistGemmError> {
        let problem = self.resolved_problem()?;
        let (gpu, sm_count) = self
            .devices
            .first()
            .map_or((ASSUMED_GPU_NAME, MachineModel::H200.sm_count), |g| {
                (g.name(), g.sm_count())
            });
        let choice = self.schedule.ok_or(DistGemmError::Missing("a schedule"))?;
        let table = choice.table(self.tuning.as_ref())?;
        Ok(choice.resolve_with(
            &problem,
            self.resolved_tp(),
            gpu,
            sm_count,
            table.as_deref(),
        ))
    }

    /// The plan that will run, without touching a GPU: use it to size the shard buffers.
    pub fn plan(&self) -> Result<Plan, DistGemmError> {
        let tp = self.resolved_tp();
        if tp == 0 {
            return Err(DistGemmError::Missing("at least one device"));
        }
        crate::plan::check_gpu_kernel(&self.resolved_problem()?)?;
        Ok(Plan::build_with(
            self.resolved_schedule()?,
            self.resolved_problem()?,
            tp,
            PlanOptions {
                rs_partials: self.rs_partials,
            },
        )?)
    }

    fn lower_options(&self) -> LowerOptions {
        #[allow(unused_mut)]
        let mut options = LowerOptions {
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            ..LowerOptions::default()
        };
        #[cfg(feature = "testing")]
        {
            options.missing_signals.clone_from(&self.missing_signals);
        }
        options
    }

    /// Validates everything, allocates, builds and instantiates the graphs.
    pub fn build(self) -> Result<DistGemm<'a>, DistGemmError> {
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
        let ordinals: Vec<usize> = gpus.iter().map(Gpu::ordinal).collect();
        validate_args(&plan, &ordinals, &args)?;

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
            let share = GridShare::for_ranks(
                gpu,
                ordinals.iter().filter(|&&o| o == gpu.ordinal()).count(),
            );
            ranks.push(Rank::new(gpu, &module, &plan, d, share)?);
        }
        // All exclusive workspaces are zero on every device before any graph can run.
        for rank in &ranks {
            crate::runtime::stream::synchronize(&rank.stream)?;
        }
        let launch_streams = ranks.iter().map(|r| RawStream::of(&r.stream)).collect();
        let mut dist = DistGemm {
            graphs: Vec::new(),
            launch_streams,
            ranks,
            plan,
            args,
            options: self.lower_options(),
            in_flight: false,
            poisoned: Poison::default(),
        };
        let addresses = dist.addresses(&dist.args);
        for d in 0..tp {
            let lowered = lower_device(&dist.plan, d, &addresses, &dist.options)?;
            check_gemms(&lowered)?;
            let rank = &dist.ranks[d];
            // SAFETY: the lowering of a validated plan over validated user buffers (borrowed
            // for 'a by `dist`) and workspaces owned by `dist`.
            let graph =
                unsafe { DeviceGraph::build(&rank.kernels, rank.share, &rank.stream, lowered)? };
            dist.graphs.push(graph);
        }
        Ok(dist)
    }
}

/// One GPU of a distributed GEMM: its stream, kernels and workspaces.
struct Rank {
    stream: Arc<CudaStream>,
    kernels: DeviceKernels,
    share: Option<GridShare>,
    workspace: DeviceBuffer<u8>,
    exclusive: DeviceBuffer<u32>,
}

impl Rank {
    fn new(
        gpu: &Gpu,
        module: &Arc<Module>,
        plan: &Plan,
        d: usize,
        share: Option<GridShare>,
    ) -> Result<Rank, DistGemmError> {
        let stream = gpu.new_stream()?;
        let kernels = DeviceKernels::new(module, plan.problem.dtype)?;
        let workspace_bytes = plan.devices.get(d).map_or(0, |dev| dev.workspace_bytes);
        let workspace = DeviceBuffer::<u8>::alloc(gpu, workspace_bytes)?;
        let mut exclusive = DeviceBuffer::<u32>::alloc(gpu, plan.exclusive.bytes.div_ceil(4))?;
        exclusive.fill_bytes(&stream, 0)?;
        Ok(Rank {
            stream,
            kernels,
            share,
            workspace,
            exclusive,
        })
    }
}

/// A distributed GEMM ready to run; see the module documentation. It borrows the user's
/// shard buffers for `'a`.
pub struct DistGemm<'a> {
    // Dropped first: graphs and the tensor maps their nodes point to.
    graphs: Vec<DeviceGraph>,
    /// Per device: the stream of its last run (its own stream until `run_on`).
    launch_streams: Vec<RawStream>,
    ranks: Vec<Rank>,
    plan: Plan,
    args: Vec<DeviceArgs<'a>>,
    options: LowerOptions,
    in_flight: bool,
    poisoned: Poison,
}

impl std::fmt::Debug for DistGemm<'_> {
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

/// Hopper only; peer access (and native peer atomics, which the flags and the barrier use)
/// between every pair of distinct GPUs; no shared GPU unless allowed. Enables peer access.
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
                require_peer_link(from.ordinal(), to.ordinal())?;
            }
            crate::runtime::enable_peer_access_between(a, b)?;
        }
    }
    Ok(())
}

/// `can_implement` of the GEMM kernel on every stage GEMM.
pub(crate) fn check_gemms(lowered: &LoweredGraph) -> Result<(), DistGemmError> {
    for node in &lowered.nodes {
        if let super::lower::LoweredNode::Gemm { stage, args, .. } = node {
            check(args).map_err(|source| DistGemmError::Gemm {
                device: lowered.device,
                stage: *stage,
                source,
            })?;
        }
    }
    Ok(())
}

impl<'a> DistGemm<'a> {
    /// A builder.
    pub fn builder() -> DistGemmBuilder<'a> {
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

    #[cfg(feature = "testing")]
    fn graph(&self, rank: usize) -> Result<&DeviceGraph, DistGemmError> {
        self.graphs.get(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })
    }

    /// Device `rank`'s graph as the driver sees it (node indices in creation order = plan
    /// order), for tests that compare it with the plan.
    #[cfg(feature = "testing")]
    pub fn graph_topology(&self, rank: usize) -> Result<GraphTopology, DistGemmError> {
        Ok(self.graph(rank)?.graph().topology()?)
    }

    fn addresses(&self, args: &[DeviceArgs<'_>]) -> Vec<DeviceAddresses> {
        self.ranks
            .iter()
            .zip(args)
            .map(|(r, a)| DeviceAddresses {
                a: a.a.ptr(),
                b: a.b.ptr(),
                c: a.c.map_or(0, |c| c.ptr()),
                d: a.d.ptr(),
                workspace: r.workspace.device_ptr(),
                exclusive: r.exclusive.device_ptr(),
            })
            .collect()
    }

    /// Launches one run on every device, each on its own stream ([`DistGemm::streams`]), and
    /// returns without waiting.
    pub fn run(&mut self) -> Result<(), DistGemmError> {
        let all: Vec<usize> = (0..self.plan.tp).collect();
        self.run_ranks(&all)
    }

    /// Launches one run on every device on the caller's streams (`streams[d]` for device d),
    /// behind the caller's earlier work on them; [`DistGemm::wait`] then waits for those
    /// streams. A device's runs stay in order: when its stream differs from its last run's,
    /// the host first waits for the last run's stream (queue runs on one stream per device to
    /// avoid that wait).
    ///
    /// # Safety
    /// Each stream must be a live stream of its device's GPU (primary context) or the legacy
    /// default stream, and stay alive until [`DistGemm::wait`] (or the drop) has returned.
    pub unsafe fn run_on(&mut self, streams: &[RawStream]) -> Result<(), DistGemmError> {
        if streams.len() != self.plan.tp {
            return Err(DistGemmError::ArgumentCount {
                given: streams.len(),
                tp: self.plan.tp,
            });
        }
        self.poisoned.check()?;
        for (r, &stream) in streams.iter().enumerate() {
            self.launch_device(r, stream)?;
        }
        Ok(())
    }

    /// Launches device `r`'s graph on `stream`. Runs of one device stay in order: when the
    /// stream changes, the last one is waited for first.
    fn launch_device(&mut self, r: usize, stream: RawStream) -> Result<(), DistGemmError> {
        if self.launch_streams[r] != stream {
            if let Err(e) = self.launch_streams[r].synchronize(&self.ranks[r].kernels.gpu) {
                return Err(self.poisoned.record(e.into()));
            }
            self.launch_streams[r] = stream;
        }
        if let Err(e) = self.graphs[r].launch(stream) {
            return Err(self.poisoned.record(e));
        }
        self.in_flight = true;
        Ok(())
    }

    /// Fault injection for tests: launches the graphs of `ranks` only, as if the other devices
    /// were stuck. Their peers' barriers time out; the instance is poisoned afterwards.
    #[cfg(feature = "testing")]
    pub fn run_only(&mut self, ranks: &[usize]) -> Result<(), DistGemmError> {
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.plan.tp) {
            return Err(DistGemmError::NoSuchDevice {
                device: bad,
                tp: self.plan.tp,
            });
        }
        let result = self.run_ranks(ranks);
        if ranks.len() < self.plan.tp {
            self.poisoned
                .set(|| "a fault-injection run left out some devices".into());
        }
        result
    }

    fn run_ranks(&mut self, ranks: &[usize]) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        for &r in ranks {
            let stream = RawStream::of(&self.ranks[r].stream);
            self.launch_device(r, stream)?;
        }
        Ok(())
    }

    /// Waits for every device, then checks every device's error word: a timed-out wait becomes
    /// [`DistGemmError::Timeout`] (the first device's, by rank), and poisons the instance.
    pub fn wait(&mut self) -> Result<(), DistGemmError> {
        let mut first: Option<DistGemmError> = None;
        for (rank, stream) in self.ranks.iter().zip(&mut self.launch_streams) {
            if let Err(e) = stream.synchronize(&rank.kernels.gpu) {
                first.get_or_insert(e.into());
            }
            // A caller's stream is promised alive only until here (`run_on`).
            *stream = RawStream::of(&rank.stream);
        }
        self.in_flight = false;
        if let Some(e) = first {
            return Err(self.poisoned.record(e));
        }
        let word = self.plan.exclusive.error_offset / 4;
        for (d, rank) in self.ranks.iter().enumerate() {
            let words = rank.exclusive.download(&rank.stream)?;
            let code = words.get(word).copied().unwrap_or(0);
            let ordinals: Vec<usize> = self.ranks.iter().map(|r| r.kernels.gpu.ordinal()).collect();
            if let Some(e) = error_of(d, &ordinals, code, self.options.timeout) {
                return Err(self.poisoned.record(e));
            }
        }
        Ok(())
    }

    /// Device `rank`'s exclusive workspace as u32 words (counter, error word, flags), after
    /// waiting for its stream. A finished sequence of runs leaves every counter at 0.
    #[cfg(feature = "testing")]
    pub fn exclusive_words(&self, rank: usize) -> Result<Vec<u32>, DistGemmError> {
        let r = self.ranks.get(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })?;
        Ok(r.exclusive.download(&r.stream)?)
    }

    /// Fills every workspace with `byte` (e.g. 0xFF: NaN), after waiting for runs in flight,
    /// so a test can see that nothing reads a slot before it is written.
    #[cfg(feature = "testing")]
    pub fn poison_workspaces(&mut self, byte: u8) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
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
    pub fn set_device_args(
        &mut self,
        rank: usize,
        args: DeviceArgs<'a>,
    ) -> Result<(), DistGemmError> {
        let mut all = self.args.clone();
        let slot = all.get_mut(rank).ok_or(DistGemmError::NoSuchDevice {
            device: rank,
            tp: self.plan.tp,
        })?;
        *slot = args;
        self.set_args(all)
    }

    /// Points the graphs at new shard buffers without rebuilding them. Waits for any run in
    /// flight first, then rewrites only the nodes whose parameters change — including peers'
    /// nodes that read this device's buffers (see the `graphs` module).
    pub fn set_args(&mut self, args: Vec<DeviceArgs<'a>>) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        if self.in_flight {
            self.wait()?;
        }
        let ordinals: Vec<usize> = self.ranks.iter().map(|r| r.kernels.gpu.ordinal()).collect();
        validate_args(&self.plan, &ordinals, &args)?;
        self.relower(&args)?;
        self.args = args;
        Ok(())
    }

    /// Re-lowers every device's graph for `args` and rewrites what changed.
    fn relower(&mut self, args: &[DeviceArgs<'_>]) -> Result<(), DistGemmError> {
        let addresses = self.addresses(args);
        let mut updated = Vec::with_capacity(self.plan.tp);
        for d in 0..self.plan.tp {
            let lowered = lower_device(&self.plan, d, &addresses, &self.options)?;
            check_gemms(&lowered)?;
            updated.push(lowered);
        }
        for (d, lowered) in updated.into_iter().enumerate() {
            let rank = &self.ranks[d];
            let stream = RawStream::of(&rank.stream);
            // SAFETY: validated buffers borrowed for 'a, own workspaces; no run is in flight
            // (waited above) and the uploads finish before this returns.
            let result = unsafe { self.graphs[d].update(&rank.kernels, lowered, stream) }
                // The re-encoded tensor maps are in place before any later run, whichever
                // stream it is launched on.
                .and_then(|()| Ok(crate::runtime::stream::synchronize(&rank.stream)?));
            if let Err(e) = result {
                return Err(self.poisoned.record(e));
            }
        }
        Ok(())
    }

    /// Diagnostics for benchmarks: from now on, runs leave out what `diagnostics` says
    /// ([`TimingDiagnostics`]; the default restores real runs). Nodes are updated in place,
    /// like [`DistGemm::set_args`]. The workspaces keep what earlier runs copied into them, so
    /// after one full run capped copies still feed the GEMMs real data (see
    /// `kernels-gpu/NOTES.md` on why zeros would time faster).
    #[cfg(feature = "diagnostics")]
    pub fn set_timing_diagnostics(
        &mut self,
        diagnostics: TimingDiagnostics,
    ) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        if self.in_flight {
            self.wait()?;
        }
        let previous = std::mem::replace(&mut self.options.diagnostics, diagnostics);
        let args = self.args.clone();
        let result = self.relower(&args);
        if result.is_err() {
            // Nothing was applied (or the instance is poisoned): later updates must not
            // apply the rejected diagnostics.
            self.options.diagnostics = previous;
        }
        result
    }
}

/// The error a non-zero error word `code` found in device `owner`'s exclusive workspace stands
/// for. A timeout's code names the device whose wait expired (the kernels push it into every
/// peer's word too), so the error names that device and its GPU (`ordinals[device]`, or the
/// owner's when the device is out of range).
pub(crate) fn error_of(
    owner: usize,
    ordinals: &[usize],
    code: u32,
    timeout: Duration,
) -> Option<DistGemmError> {
    (code != 0).then(|| match decode_timeout(code) {
        Some(site) => {
            let device = if site.device < ordinals.len() {
                site.device
            } else {
                owner
            };
            DistGemmError::Timeout {
                device,
                ordinal: ordinals.get(device).copied().unwrap_or_default(),
                site,
                timeout,
            }
        }
        None => DistGemmError::UnknownErrorCode {
            device: owner,
            code,
        },
    })
}

impl Drop for DistGemm<'_> {
    /// Waits for every device's stream (runs in flight read the workspaces and the user's
    /// buffers), then frees graphs, tensor maps and workspaces. Errors cannot be returned from
    /// `drop` and are ignored here.
    fn drop(&mut self) {
        for (rank, stream) in self.ranks.iter().zip(&self.launch_streams) {
            let _ = stream.synchronize(&rank.kernels.gpu);
        }
        self.graphs.clear();
    }
}

/// An instance moves between threads (a framework's worker, a Python object).
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<DistGemm<'static>>();
};
