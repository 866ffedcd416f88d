//! Building a [`RankGemm`]: what a rank does alone (plan, kernels, memory, exports), the two
//! collective exchanges (the hellos, then every rank's result of mapping its peers and building
//! its graph), and the addresses every device's plan nodes resolve to in this process.

use std::sync::Arc;
use std::time::Duration;

use super::handshake::{
    self, ExportSizes, Exports, Hello, PROTOCOL_VERSION, SharedMemory, check_group,
    gathered_operand,
};
use super::{OwnMemory, RankArgs, RankGemm, Rendezvous};
use crate::cuda::args::validate_fp8_scales;
use crate::cuda::auto::{ASSUMED_GPU_NAME, MachineModel, Resolution};
use crate::cuda::dist::{DEFAULT_TIMEOUT, ScheduleChoice, check_gemms};
use crate::cuda::error::DistGemmError;
use crate::cuda::graphs::{DeviceGraph, DeviceKernels, GridShare, Poison};
use crate::cuda::lower::{DeviceAddresses, LowerOptions, lower_device};
use crate::cuda::tuning::LoadedTable;
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::Problem;
use crate::runtime::{
    CudaStream, DeviceBuffer, Gpu, IpcHandle, IpcMapping, Module, PinnedWord, RuntimeError,
    StreamEvent, device_uuid, require_peer_link,
};
use crate::schedule::{BufferKind, ScheduleKind};

/// Builder of a [`RankGemm`].
#[derive(Debug, Default)]
#[must_use]
pub struct RankGemmBuilder {
    gpu: Option<Gpu>,
    schedule: Option<ScheduleChoice>,
    problem: Option<Problem>,
    timeout: Option<Duration>,
    allow_shared_gpu: bool,
    module: Option<Arc<Module>>,
    rs_partials: Option<RsPartials>,
    tuning: Option<Arc<LoadedTable>>,
    fp8_scales: Option<[f32; 2]>,
}

impl RankGemmBuilder {
    /// An FP8 problem's tensor-wise scales (the same on every rank): `D = alpha · (sa·A) ·
    /// (sb·B)ᵀ + beta · C`. Required for an FP8 problem, refused for a 16-bit one; change them
    /// between launches with [`RankGemm::set_fp8_scales`].
    pub fn fp8_scales(self, sa: f32, sb: f32) -> Self {
        RankGemmBuilder {
            fp8_scales: Some([sa, sb]),
            ..self
        }
    }

    /// This rank's GPU.
    pub fn gpu(self, gpu: Gpu) -> Self {
        RankGemmBuilder {
            gpu: Some(gpu),
            ..self
        }
    }

    /// A fixed schedule.
    pub fn schedule(self, kind: ScheduleKind) -> Self {
        RankGemmBuilder {
            schedule: Some(ScheduleChoice::Fixed(kind)),
            ..self
        }
    }

    /// `Auto` within `family`'s shard layout (see [`crate::cuda::auto`]); every rank resolves it
    /// the same way.
    pub fn auto_schedule(self, family: ScheduleKind) -> Self {
        RankGemmBuilder {
            schedule: Some(ScheduleChoice::Auto(family)),
            ..self
        }
    }

    /// How the pipelined reduce-scatter schedules move partial sums (ignored by other
    /// schedules); every rank must give the same. Unset: a tuning table's measured choice
    /// where `Auto` found an entry, else [`RsPartials::Read`].
    pub fn rs_partials(self, rs_partials: RsPartials) -> Self {
        RankGemmBuilder {
            rs_partials: Some(rs_partials),
            ..self
        }
    }

    /// The tuning table `Auto` reads (default: the file `DISTGEMM_TUNING` names, if set; see
    /// [`crate::cuda::tuning`]). Every rank must resolve `Auto` alike: the handshake compares
    /// the schedules and names each rank's table when they differ.
    pub fn tuning_table(self, table: Arc<LoadedTable>) -> Self {
        RankGemmBuilder {
            tuning: Some(table),
            ..self
        }
    }

    /// The global problem (all ranks together).
    pub fn problem(self, problem: Problem) -> Self {
        RankGemmBuilder {
            problem: Some(problem),
            ..self
        }
    }

    /// Bound of every GPU spin-wait (default [`DEFAULT_TIMEOUT`]); every rank must give the
    /// same. Host pauses of a peer (garbage collection, checkpoints) count against it.
    pub fn timeout(self, timeout: Duration) -> Self {
        RankGemmBuilder {
            timeout: Some(timeout),
            ..self
        }
    }

    /// Allows ranks of the group to share this GPU (testing the protocol on one GPU, or
    /// several ranks per GPU under MPS). Every rank of the group must allow it.
    pub fn allow_shared_gpu(self, allow: bool) -> Self {
        RankGemmBuilder {
            allow_shared_gpu: allow,
            ..self
        }
    }

    /// An already loaded PTX module of this rank's GPU to reuse.
    pub fn module(self, module: Arc<Module>) -> Self {
        RankGemmBuilder {
            module: Some(module),
            ..self
        }
    }

    fn timeout_or_default(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }

    /// The plan a group of `tp` ranks would run (no GPU needed: `Auto` assumes an H200
    /// unless a GPU was given).
    pub fn plan(&self, tp: usize) -> Result<Plan, DistGemmError> {
        self.plan_of(tp, &self.resolution(tp)?)
    }

    /// The plan of `resolved` (its schedule, and its partials unless this builder sets them)
    /// for a group of `tp` ranks.
    fn plan_of(&self, tp: usize, resolved: &Resolution) -> Result<Plan, DistGemmError> {
        let problem = self.problem.ok_or(DistGemmError::Missing("a problem"))?;
        let options = PlanOptions {
            rs_partials: resolved.rs_partials_with(self.rs_partials),
        };
        Ok(Plan::build_with(resolved.schedule, problem, tp, options)?)
    }

    /// The schedule a group of `tp` ranks would run and who decided it (`Auto` reads the
    /// tuning table for this rank's GPU, or [`ASSUMED_GPU_NAME`] without one).
    pub fn resolution(&self, tp: usize) -> Result<Resolution, DistGemmError> {
        let problem = self.problem.ok_or(DistGemmError::Missing("a problem"))?;
        let choice = self.schedule.ok_or(DistGemmError::Missing("a schedule"))?;
        if tp == 0 {
            return Err(DistGemmError::Missing("at least one rank"));
        }
        let (gpu, sm_count) = self
            .gpu
            .as_ref()
            .map_or((ASSUMED_GPU_NAME, MachineModel::H200.sm_count), |g| {
                (g.name(), g.sm_count())
            });
        let table = choice.table(self.tuning.as_ref())?;
        Ok(choice.resolve_with(&problem, tp, gpu, sm_count, table.as_deref()))
    }

    /// Builds this rank's part of the group: collective over `rendezvous` (every rank calls
    /// `build` with the same schedule, problem and timeout). Returns an error on every rank
    /// if any rank fails or disagrees.
    pub fn build(self, rendezvous: Arc<dyn Rendezvous>) -> Result<RankGemm, DistGemmError> {
        let rank = rendezvous.rank();
        let world = rendezvous.world_size();
        // Resolved once: the plan and the handshake's schedule and source come from the same
        // reading of the tuning table (a table file may change between two readings).
        let resolution = self.resolution(world);
        let schedule_source = resolution
            .as_ref()
            .map_or_else(ToString::to_string, |r| r.source.to_string());
        let resolved = resolution.as_ref().ok().map(|r| r.schedule);
        let local = resolution.and_then(|r| self.prepare(rank, world, &r));
        let (plan_schedule, problem, rs_partials) = match &local {
            Ok(l) => (l.plan.schedule, l.plan.problem, l.plan.rs_partials),
            // Without a plan, the schedule resolved (so that it agrees with the source), else
            // the one asked for.
            Err(_) => (
                resolved.unwrap_or_else(|| {
                    self.schedule
                        .map_or(ScheduleKind::AllGatherRotatingA, |c| match c {
                            ScheduleChoice::Fixed(k) | ScheduleChoice::Auto(k) => k,
                        })
                }),
                self.problem.unwrap_or(Problem::new(0, 0, 0)),
                self.rs_partials.unwrap_or_default(),
            ),
        };
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            rank,
            world,
            gpu_uuid: self
                .gpu
                .as_ref()
                .and_then(|g| g.uuid().ok())
                .unwrap_or_default(),
            allow_shared_gpu: self.allow_shared_gpu,
            schedule: plan_schedule,
            schedule_source,
            rs_partials,
            problem,
            timeout_ns: u64::try_from(self.timeout_or_default().as_nanos()).unwrap_or(u64::MAX),
            exports: local
                .as_ref()
                .map(|l| l.exports.clone())
                .map_err(ToString::to_string),
        };
        let bytes = serde_json::to_vec(&hello)
            .map_err(|e| DistGemmError::Internal(format!("handshake encoding: {e}")))?;
        let answers = rendezvous.all_gather(&bytes)?;
        let mut local = local?;
        let hellos = answers
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice::<Hello>(b).map_err(|e| {
                    DistGemmError::Group(format!(
                        "rank {r} sent a handshake this version cannot read ({e}); are all \
                         ranks running the same distgemm?"
                    ))
                })
            })
            .collect::<Result<Vec<Hello>, _>>()?;
        let group = check_group(&hellos, rank, &local.sizes).map_err(DistGemmError::Group)?;
        // Second exchange: every rank's result of mapping its peers and building its graph.
        let connected = local.connect(&hellos, &group, self.timeout_or_default());
        let status = match &connected {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        };
        // From here on peers may hold mappings of this rank's memory: a rendezvous that fails
        // (it may have succeeded on other ranks, which then run) leaves it allocated.
        let statuses = match rendezvous.all_gather(status.as_bytes()) {
            Ok(statuses) => statuses,
            Err(e) => return Err(local.abandon(e.into())),
        };
        if let Some((r, why)) = statuses.iter().enumerate().find(|(_, s)| !s.is_empty()) {
            // Every rank unmaps its peers before anyone frees what was mapped.
            local.graph = None;
            local.peers.clear();
            if let Err(e) = rendezvous.all_gather(b"unmapped") {
                return Err(local.abandon(e.into()));
            }
            connected?;
            return Err(DistGemmError::Group(format!(
                "rank {r} failed to connect: {}",
                String::from_utf8_lossy(why)
            )));
        }
        local.into_rank_gemm(rendezvous)
    }

    /// Everything this rank can do alone: plan, kernels, memory (exclusive workspace zeroed
    /// and synchronised), exports.
    fn prepare(
        &self,
        rank: usize,
        world: usize,
        resolved: &Resolution,
    ) -> Result<Local, DistGemmError> {
        let plan = self.plan_of(world, resolved)?;
        validate_fp8_scales(&plan, self.fp8_scales)?;
        let gpu = self.gpu.clone().ok_or(DistGemmError::Missing("a GPU"))?;
        if rank >= world {
            return Err(DistGemmError::Group(format!(
                "the rendezvous says rank {rank} of {world}"
            )));
        }
        let module = match &self.module {
            Some(m) if m.gpu().ordinal() == gpu.ordinal() => Arc::clone(m),
            _ => Module::load(&gpu)?,
        };
        let kernels = DeviceKernels::new(&module, plan.problem.dtype)?;
        let setup = gpu.new_stream()?;
        let workspace = DeviceBuffer::<u8>::alloc(&gpu, plan.devices[rank].workspace_bytes)?;
        let mut exclusive = DeviceBuffer::<u32>::alloc(&gpu, plan.exclusive.bytes.div_ceil(4))?;
        exclusive.fill_bytes(&setup, 0)?;
        let gathered = gathered_operand(plan.schedule);
        let input = match gathered {
            Some(kind) => Some(DeviceBuffer::<u8>::alloc(
                &gpu,
                plan.devices[rank]
                    .buffer_elements(kind)
                    .saturating_mul(plan.element_bytes(kind)),
            )?),
            None => None,
        };
        crate::runtime::stream::synchronize(&setup)?;
        let export = |b: &DeviceBuffer<u8>| -> Result<Option<SharedMemory>, DistGemmError> {
            if b.is_empty() {
                return Ok(None);
            }
            Ok(Some(SharedMemory::CudaIpc {
                handle: IpcHandle::export(&gpu, b.device_ptr())?,
                bytes: b.size_bytes(),
            }))
        };
        let exports = Exports {
            workspace: export(&workspace)?,
            exclusive: SharedMemory::CudaIpc {
                handle: IpcHandle::export(&gpu, exclusive.device_ptr())?,
                bytes: exclusive.size_bytes(),
            },
            input: match &input {
                Some(b) => export(b)?,
                None => None,
            },
        };
        let sizes = ExportSizes {
            workspace: plan.devices.iter().map(|d| d.workspace_bytes).collect(),
            exclusive: plan.exclusive.bytes,
            input: plan
                .devices
                .iter()
                .map(|d| {
                    gathered.map_or(0, |k| {
                        d.buffer_elements(k).saturating_mul(plan.element_bytes(k))
                    })
                })
                .collect(),
        };
        let (done, status) = (StreamEvent::new(&gpu)?, PinnedWord::new(&gpu)?);
        Ok(Local {
            gpu,
            rank,
            plan,
            kernels,
            setup,
            done,
            status,
            workspace,
            exclusive,
            input,
            exports,
            sizes,
            peers: Vec::new(),
            ordinals: Vec::new(),
            graph: None,
            options: LowerOptions {
                timeout: self.timeout_or_default(),
                fp8_scales: self.fp8_scales,
                ..LowerOptions::default()
            },
        })
    }
}

/// A peer's memory mapped into this process.
#[derive(Debug)]
pub(super) struct PeerMemory {
    workspace: Option<IpcMapping>,
    exclusive: IpcMapping,
    input: Option<IpcMapping>,
}

/// A rank under construction (see [`RankGemmBuilder::build`]).
struct Local {
    gpu: Gpu,
    rank: usize,
    plan: Plan,
    kernels: DeviceKernels,
    setup: Arc<CudaStream>,
    /// Created before the exchange, so that nothing after it can fail on one rank alone.
    done: StreamEvent,
    status: PinnedWord,
    workspace: DeviceBuffer<u8>,
    exclusive: DeviceBuffer<u32>,
    input: Option<DeviceBuffer<u8>>,
    exports: Exports,
    sizes: ExportSizes,
    /// Index = rank; None for this rank.
    peers: Vec<Option<PeerMemory>>,
    /// Index = rank: the rank's GPU as this process numbers it (errors name it).
    ordinals: Vec<usize>,
    graph: Option<DeviceGraph>,
    options: LowerOptions,
}

/// The local ordinal of the GPU with `uuid`, if this process can see it.
fn visible_ordinal(uuid: &str) -> Result<Option<usize>, RuntimeError> {
    for ordinal in 0..crate::runtime::device::device_count()? {
        if device_uuid(ordinal)? == uuid {
            return Ok(Some(ordinal));
        }
    }
    Ok(None)
}

/// This rank's distgemm-owned memory, by address.
#[derive(Clone, Copy)]
pub(super) struct OwnAddresses {
    pub(super) workspace: u64,
    pub(super) exclusive: u64,
    pub(super) input: Option<u64>,
}

/// Every device's addresses for a launch of rank `rank` with `args`: the peers' shared memory
/// (their workspaces, exclusive workspaces and input slots: all a peer's plan nodes may
/// touch), this rank's own memory, the input slot in place of the gathered operand, and
/// `args` for the rest. A zero in `args` (before the first launch) becomes a placeholder, the
/// exclusive workspace's address: it only appears in a graph that is updated before it runs.
pub(super) fn rank_addresses(
    plan: &Plan,
    rank: usize,
    peers: &[Option<PeerMemory>],
    own: OwnAddresses,
    args: RankArgs,
) -> Vec<DeviceAddresses> {
    let gathered = gathered_operand(plan.schedule);
    let placeholder = |p: u64| if p == 0 { own.exclusive } else { p };
    // Row-wise FP8's scale vectors: placeholders too before the first launch; none otherwise.
    let row_wise = plan
        .problem
        .fp8
        .is_some_and(|f| f.scales == crate::fp8::ScaleMode::Rowwise);
    let scales = |p: u64| if row_wise { placeholder(p) } else { 0 };
    let operand = |kind: BufferKind, input: Option<u64>, other: u64| {
        if gathered == Some(kind) {
            input.unwrap_or(0)
        } else {
            other
        }
    };
    (0..plan.tp)
        .map(|q| match peers.get(q).and_then(Option::as_ref) {
            None if q == rank => DeviceAddresses {
                a: operand(BufferKind::A, own.input, placeholder(args.a)),
                b: operand(BufferKind::B, own.input, placeholder(args.b)),
                c: if plan.problem.has_c() {
                    placeholder(args.c)
                } else {
                    0
                },
                d: placeholder(args.d),
                workspace: own.workspace,
                exclusive: own.exclusive,
                a_scales: scales(args.a_scales),
                b_scales: scales(args.b_scales),
            },
            None => DeviceAddresses::default(),
            Some(p) => {
                let input = p.input.as_ref().map(IpcMapping::ptr);
                DeviceAddresses {
                    a: operand(BufferKind::A, input, 0),
                    b: operand(BufferKind::B, input, 0),
                    c: 0,
                    d: 0,
                    workspace: p.workspace.as_ref().map_or(0, IpcMapping::ptr),
                    exclusive: p.exclusive.ptr(),
                    a_scales: 0,
                    b_scales: 0,
                }
            }
        })
        .collect()
}

impl Local {
    /// Maps every peer's memory, checks the links, lowers and builds this rank's graph.
    fn connect(
        &mut self,
        hellos: &[Hello],
        group: &handshake::Group,
        timeout: Duration,
    ) -> Result<(), DistGemmError> {
        let my_uuid = &hellos[self.rank].gpu_uuid;
        for (q, hello) in hellos.iter().enumerate() {
            if q == self.rank {
                self.peers.push(None);
                self.ordinals.push(self.gpu.ordinal());
                continue;
            }
            if &hello.gpu_uuid == my_uuid {
                self.ordinals.push(self.gpu.ordinal());
            } else {
                let Some(ordinal) = visible_ordinal(&hello.gpu_uuid)? else {
                    return Err(DistGemmError::Group(format!(
                        "rank {q}'s GPU {} is not visible in rank {}'s process (check \
                         CUDA_VISIBLE_DEVICES: every rank must see every GPU of the group)",
                        hello.gpu_uuid, self.rank
                    )));
                };
                require_peer_link(self.gpu.ordinal(), ordinal)?;
                self.ordinals.push(ordinal);
            }
            let Ok(exports) = &hello.exports else {
                return Err(DistGemmError::Internal(format!("rank {q} has no exports")));
            };
            let open = |m: &SharedMemory| -> Result<IpcMapping, DistGemmError> {
                match m {
                    SharedMemory::CudaIpc { handle, .. } => {
                        Ok(IpcMapping::open(&self.gpu, handle)?)
                    }
                }
            };
            let peer = PeerMemory {
                workspace: exports.workspace.as_ref().map(open).transpose()?,
                exclusive: open(&exports.exclusive)?,
                input: exports.input.as_ref().map(open).transpose()?,
            };
            self.peers.push(Some(peer));
        }
        self.options.timeout = timeout;
        let addresses = rank_addresses(
            &self.plan,
            self.rank,
            &self.peers,
            OwnAddresses {
                workspace: self.workspace.device_ptr(),
                exclusive: self.exclusive.device_ptr(),
                input: self.input.as_ref().map(DeviceBuffer::device_ptr),
            },
            RankArgs::default(),
        );
        let lowered = lower_device(&self.plan, self.rank, &addresses, &self.options)?;
        check_gemms(&lowered)?;
        let share = GridShare::for_ranks(&self.gpu, group.ranks_on_gpu[self.rank]);
        // SAFETY: peers' addresses are mappings owned by `self` (sizes checked by
        // `check_group`); this rank's user buffers are placeholders (its exclusive workspace)
        // that every launch replaces before the graph runs (`RankGemm::launch_raw`).
        let graph = unsafe { DeviceGraph::build(&self.kernels, share, &self.setup, lowered)? };
        self.graph = Some(graph);
        Ok(())
    }

    /// Gives up after a failed rendezvous: unmaps the peers and leaks this rank's exported
    /// memory (a peer may map it, or run on it), returning `e`.
    fn abandon(self, e: DistGemmError) -> DistGemmError {
        let Local {
            graph,
            peers,
            workspace,
            exclusive,
            input,
            ..
        } = self;
        drop(graph);
        drop(peers);
        std::mem::forget((workspace, exclusive, input));
        e
    }

    fn into_rank_gemm(self, rendezvous: Arc<dyn Rendezvous>) -> Result<RankGemm, DistGemmError> {
        let graph = self
            .graph
            .ok_or_else(|| DistGemmError::Internal("connected without a graph".into()))?;
        Ok(RankGemm {
            done: self.done,
            status: self.status,
            graph: Some(graph),
            peers: self.peers,
            ordinals: self.ordinals,
            memory: OwnMemory {
                workspace: self.workspace,
                exclusive: self.exclusive,
                input: self.input,
            },
            kernels: self.kernels,
            gpu: self.gpu,
            rank: self.rank,
            plan: self.plan,
            options: self.options,
            launched_with: None,
            launches: 0,
            poisoned: Poison::default(),
            rendezvous: Some(rendezvous),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::auto::ScheduleSource;
    use crate::cuda::tuning::{Candidate, Provenance, TuningEntry, TuningKey, TuningTable};
    use crate::cuda::{DistGemm, ScheduleChoice};

    /// A table in which ag-a at TP 2 was measured faster for 256×512×512 (the rule picks
    /// ag-a-single: the problem is tiny).
    fn pipelined_faster(problem: &Problem) -> Arc<LoadedTable> {
        let candidate = |schedule, median_ms| Candidate {
            schedule,
            rs_partials: RsPartials::Read,
            median_ms,
            min_ms: median_ms,
            max_ms: median_ms,
            reps: 1,
        };
        let entry = TuningEntry::from_measurements(
            TuningKey::of(
                ASSUMED_GPU_NAME,
                2,
                ScheduleKind::AllGatherRotatingA,
                problem,
            ),
            vec![
                candidate(ScheduleKind::AllGatherRotatingA, 0.01),
                candidate(ScheduleKind::AllGatherSingleStageA, 0.02),
            ],
            Provenance {
                unix_seconds: 0,
                commit: "test".into(),
                machine: "test".into(),
                m: problem.m,
            },
        );
        let mut table = TuningTable::default();
        table.insert(entry.expect("two candidates"));
        Arc::new(LoadedTable {
            table,
            path: "t.json".into(),
            digest: 1,
        })
    }

    /// Rank 0 of a group of two whose peer echoes it: records what rank 0 sends.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<Vec<u8>>>);

    impl Rendezvous for Recording {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            2
        }
        fn all_gather(
            &self,
            mine: &[u8],
        ) -> Result<Vec<Vec<u8>>, crate::cuda::rank::RendezvousError> {
            self.0.lock().unwrap().push(mine.to_vec());
            Ok(vec![mine.to_vec(), mine.to_vec()])
        }
    }

    /// The handshake's schedule and its source come from one resolution: with a table that
    /// picks ag-a for `Auto(ag-a-single)`, a rank that cannot build (no GPU here) still says
    /// it would run ag-a, decided by the table, never the rule's schedule beside the table's
    /// source.
    #[test]
    fn the_hello_names_the_resolved_schedule_and_its_source() {
        let problem = Problem::new(256, 512, 512);
        let rendezvous = Arc::new(Recording::default());
        let err = RankGemmBuilder::default()
            .auto_schedule(ScheduleKind::AllGatherSingleStageA)
            .problem(problem)
            .tuning_table(pipelined_faster(&problem))
            .build(Arc::clone(&rendezvous) as Arc<dyn Rendezvous>)
            .err();
        assert!(
            matches!(err, Some(DistGemmError::Missing("a GPU"))),
            "{err:?}"
        );
        let sent = rendezvous.0.lock().unwrap();
        assert_eq!(sent.len(), 1);
        let hello: Hello = serde_json::from_slice(&sent[0]).unwrap();
        assert_eq!(hello.schedule, ScheduleKind::AllGatherRotatingA);
        assert!(
            hello.schedule_source.starts_with("tuned (table t.json#"),
            "{}",
            hello.schedule_source
        );
    }

    /// Both builders plan the table's choice for `Auto` (without a GPU), the rule's without
    /// a table, and a fixed schedule whatever the table says.
    #[test]
    fn both_builders_plan_the_tuned_choice() -> Result<(), DistGemmError> {
        let problem = Problem::new(256, 512, 512);
        let table = pipelined_faster(&problem);
        let rank = RankGemmBuilder::default()
            .auto_schedule(ScheduleKind::AllGatherSingleStageA)
            .problem(problem);
        assert_eq!(rank.plan(2)?.schedule, ScheduleKind::AllGatherSingleStageA);
        let rank = rank.tuning_table(Arc::clone(&table));
        assert_eq!(rank.plan(2)?.schedule, ScheduleKind::AllGatherRotatingA);
        let resolution = rank.resolution(2)?;
        assert!(
            matches!(resolution.source, ScheduleSource::Tuned { exact: true, .. }),
            "{}",
            resolution.source
        );
        let dist = DistGemm::builder()
            .tp(2)
            .auto_schedule(ScheduleKind::AllGatherRotatingA)
            .problem(problem)
            .tuning_table(Arc::clone(&table));
        assert_eq!(dist.plan()?.schedule, ScheduleKind::AllGatherRotatingA);
        let fixed = RankGemmBuilder::default()
            .schedule(ScheduleKind::AllGatherSingleStageA)
            .problem(problem)
            .tuning_table(table);
        assert_eq!(fixed.resolution(2)?.source, ScheduleSource::Fixed);
        assert_eq!(fixed.plan(2)?.schedule, ScheduleKind::AllGatherSingleStageA);
        // The rule alone, as before tuning tables.
        assert_eq!(
            ScheduleChoice::Auto(ScheduleKind::AllGatherRotatingA).resolve(&problem, 2, 132),
            ScheduleKind::AllGatherSingleStageA
        );
        Ok(())
    }
}
