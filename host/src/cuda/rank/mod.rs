//! [`RankGemm`]: one rank of a tensor-parallel group that runs one process per GPU (torchrun,
//! Megatron, vLLM, SGLang), on the caller's stream.
//!
//! # The same plan, lowering and graphs as [`super::DistGemm`]
//! Every rank builds the group's [`Plan`] and lowers only its own device, exactly as the
//! single-process mode lowers each device; the graph is built and updated by the same code
//! (the `graphs` module). The one difference is where the peers' addresses come from: here each
//! rank exports the memory its peers touch and maps theirs.
//!
//! # What peers touch, and how it is shared
//! - the **exclusive workspace** (barrier counter, error word, flags), which peers' kernels and
//!   write nodes store into;
//! - the **workspace**: all-gather slots (written by the rank's own copies) and reduce-scatter
//!   partials (read by the right neighbour's epilogue or reduction);
//! - an **input slot** for the operand an all-gather schedule gathers (A for `ag-a`, B for
//!   `ag-b`): peers copy the rank's shard from it. The caller's tensor is copied into it in
//!   stream order before each run, or the caller writes its shard there directly
//!   ([`RankGemm::input_slot`], zero-copy). Either way the peers never touch the caller's
//!   memory, which a framework's allocator may hand out again as soon as the call returns.
//!
//! They are `cuMemAlloc` allocations exported as **legacy CUDA IPC handles**
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`, [`crate::runtime::ipc`]). Why not the VMM path
//! (`cuMemCreate` with POSIX file-descriptor handles, `cuMemExportToShareableHandle`, the fds
//! passed with `SCM_RIGHTS`, `cuMemImportFromShareableHandle` + `cuMemMap` + `cuMemSetAccess`),
//! which PyTorch's SymmetricMemory uses: the handles here are 64 plain bytes, so *any* byte
//! rendezvous carries them — `torch.distributed.all_gather_object` over NCCL or gloo included —
//! with no socket for file descriptors beside the framework's own; the memory is the same
//! `cuMemAlloc` memory the single-process mode uses (peer copies at full NVLink bandwidth);
//! and there are three allocations per instance, so VMM's fine-grained mapping buys nothing.
//!
//! **Fabric handles** (`CU_MEM_HANDLE_TYPE_FABRIC`, NVLink domains that span hosts such as
//! GB200 NVL72) are the one thing legacy IPC cannot do. They enter at one seam,
//! `handshake::SharedMemory`: a new variant whose export allocates with `cuMemCreate`
//! (fabric handle type) + `cuMemMap` + `cuMemSetAccess` and whose import calls
//! `cuMemImportFromShareableHandle` + `cuMemMap` + `cuMemSetAccess` for this GPU. The plan and
//! the lowering see device addresses only and do not change. The multi-host path also needs:
//! a rendezvous that spans hosts (torch.distributed already does), the GPU identity as
//! (host, UUID) rather than UUID, and peer checks through the fabric (IMEX channels) instead
//! of `cuDeviceGetP2PAttribute`, which only knows the GPUs this process can see.
//!
//! # Protocol across processes
//! - **Start-up.** Each rank zeroes its exclusive workspace and waits for that *before* it
//!   sends its handles; a peer can only arrive at this rank's barrier after it received them.
//!   So no rank's zeroing can wipe a peer's arrival.
//! - **Build is collective.** Two exchanges ([`Rendezvous::all_gather`]): the hellos (who,
//!   what, handles — `handshake::check_group` names any disagreement), then each rank's
//!   result of mapping and building. A failure on one rank is an error on all.
//! - **Runs** go on the caller's stream: the input shard is copied into the input slot, the
//!   graph is launched, and the error word is copied into pinned host memory, all in stream
//!   order; no host synchronisation. A run on another stream than the last one is ordered
//!   after the last one (`cuStreamWaitEvent`).
//! - **Errors.** A wait that times out leaves a code in the rank's error word (and the
//!   kernels push it to the peers' error words); [`RankGemm::check_errors`] reads the copy of
//!   a finished run without waiting, and the next launch refuses. The instance is then
//!   poisoned; recovery is a rebuild on every rank.
//! - **Teardown** (drop) is collective too: wait for this rank's last run, a rendezvous, and
//!   only then unmap and free, so no peer's late write lands in freed memory. If the
//!   rendezvous fails (a peer died), this rank's shared memory is leaked rather than freed.
//! - **Shared GPU** (tests, MPS): ranks that all allow it may share a GPU; each rank's kernels
//!   then get an equal share of the SMs, so every rank's kernels fit on the GPU together.

mod handshake;
mod rendezvous;

use std::sync::Arc;
use std::time::Duration;

pub use rendezvous::{LocalRendezvous, MAX_FRAME_BYTES, Rendezvous, RendezvousError};

use self::handshake::{
    ExportSizes, Exports, Hello, PROTOCOL_VERSION, SharedMemory, check_group, gathered_operand,
};
use super::dist::{DEFAULT_TIMEOUT, ScheduleChoice, check_gemms, error_of};
use super::error::DistGemmError;
use super::graphs::{DeviceGraph, DeviceKernels, GridShare, Poison};
use super::lower::{DeviceAddresses, LowerOptions, lower_device};
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::Problem;
use crate::runtime::caller_stream::copy_device_async;
use crate::runtime::{
    CudaStream, DeviceBuffer, Gpu, IpcHandle, IpcMapping, Module, PinnedWord, RawStream,
    RuntimeError, StreamEvent, device_uuid, peer_support,
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
    rs_partials: RsPartials,
}

/// A distgemm-owned, peer-visible buffer of the operand an all-gather schedule gathers: write
/// the rank's shard there and pass `ptr` as that operand to skip the copy-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputSlot {
    /// The operand (A or B).
    pub kind: BufferKind,
    /// Device address (this rank's GPU).
    pub ptr: u64,
    /// Bytes (the shard's packed size).
    pub bytes: usize,
}

/// Device addresses of this rank's shards for one launch (packed row-major, sizes from
/// [`RankGemm::shard_shape`]); `c` is 0 when the problem has no C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankArgs {
    /// Shard of A.
    pub a: u64,
    /// Shard of B.
    pub b: u64,
    /// Shard of C, or 0.
    pub c: u64,
    /// Shard of D.
    pub d: u64,
}

impl RankGemmBuilder {
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

    /// `Auto` within `family`'s shard layout (see [`super::auto`]); every rank resolves it
    /// the same way.
    pub fn auto_schedule(self, family: ScheduleKind) -> Self {
        RankGemmBuilder {
            schedule: Some(ScheduleChoice::Auto(family)),
            ..self
        }
    }

    /// How the pipelined reduce-scatter schedules move partial sums (default
    /// [`RsPartials::Read`]; ignored by other schedules); every rank must give the same.
    /// `Auto` never picks [`RsPartials::Push`]: it stays `Read` until pushing is measured.
    pub fn rs_partials(self, rs_partials: RsPartials) -> Self {
        RankGemmBuilder {
            rs_partials,
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
        let problem = self.problem.ok_or(DistGemmError::Missing("a problem"))?;
        let choice = self.schedule.ok_or(DistGemmError::Missing("a schedule"))?;
        if tp == 0 {
            return Err(DistGemmError::Missing("at least one rank"));
        }
        let sm_count = self
            .gpu
            .as_ref()
            .map_or(super::auto::MachineModel::H200.sm_count, Gpu::sm_count);
        let schedule = choice.resolve(&problem, tp, sm_count);
        let options = PlanOptions {
            rs_partials: self.rs_partials,
        };
        Ok(Plan::build_with(schedule, problem, tp, options)?)
    }

    /// Builds this rank's part of the group: collective over `rendezvous` (every rank calls
    /// `build` with the same schedule, problem and timeout). Returns an error on every rank
    /// if any rank fails or disagrees.
    pub fn build(self, rendezvous: Arc<dyn Rendezvous>) -> Result<RankGemm, DistGemmError> {
        let rank = rendezvous.rank();
        let world = rendezvous.world_size();
        let local = self.prepare(rank, world);
        let (plan_schedule, problem, rs_partials) = match &local {
            Ok(l) => (l.plan.schedule, l.plan.problem, l.plan.rs_partials),
            Err(_) => (
                self.schedule
                    .map_or(ScheduleKind::AllGatherRotatingA, |c| match c {
                        ScheduleChoice::Fixed(k) | ScheduleChoice::Auto(k) => k,
                    }),
                self.problem.unwrap_or(Problem::new(0, 0, 0)),
                self.rs_partials,
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
        let statuses = rendezvous.all_gather(status.as_bytes())?;
        if let Some((r, why)) = statuses.iter().enumerate().find(|(_, s)| !s.is_empty()) {
            // Every rank unmaps its peers before anyone frees what was mapped.
            local.graph = None;
            local.peers.clear();
            rendezvous.all_gather(b"unmapped")?;
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
    fn prepare(&self, rank: usize, world: usize) -> Result<Local, DistGemmError> {
        let plan = self.plan(world)?;
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
        let elem = plan.problem.dtype.size_bytes();
        let workspace = DeviceBuffer::<u8>::alloc(&gpu, plan.devices[rank].workspace_bytes)?;
        let mut exclusive = DeviceBuffer::<u32>::alloc(&gpu, plan.exclusive.bytes.div_ceil(4))?;
        exclusive.fill_bytes(&setup, 0)?;
        let gathered = gathered_operand(plan.schedule);
        let input = match gathered {
            Some(kind) => Some(DeviceBuffer::<u8>::alloc(
                &gpu,
                plan.devices[rank]
                    .buffer_elements(kind)
                    .saturating_mul(elem),
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
                .map(|d| gathered.map_or(0, |k| d.buffer_elements(k).saturating_mul(elem)))
                .collect(),
        };
        Ok(Local {
            gpu,
            rank,
            plan,
            kernels,
            setup,
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
                ..LowerOptions::default()
            },
        })
    }
}

/// A peer's memory mapped into this process.
#[derive(Debug)]
struct PeerMemory {
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
struct OwnAddresses {
    workspace: u64,
    exclusive: u64,
    input: Option<u64>,
}

/// Every device's addresses for a launch of rank `rank` with `args`: the peers' shared memory
/// (their workspaces, exclusive workspaces and input slots: all a peer's plan nodes may
/// touch), this rank's own memory, the input slot in place of the gathered operand, and
/// `args` for the rest. A zero in `args` (before the first launch) becomes a placeholder, the
/// exclusive workspace's address: it only appears in a graph that is updated before it runs.
fn rank_addresses(
    plan: &Plan,
    rank: usize,
    peers: &[Option<PeerMemory>],
    own: OwnAddresses,
    args: RankArgs,
) -> Vec<DeviceAddresses> {
    let gathered = gathered_operand(plan.schedule);
    let placeholder = |p: u64| if p == 0 { own.exclusive } else { p };
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
                let support = peer_support(self.gpu.ordinal(), ordinal)?;
                if !support.access {
                    return Err(RuntimeError::NoPeerAccess {
                        from: self.gpu.ordinal(),
                        to: ordinal,
                    }
                    .into());
                }
                if !support.native_atomics {
                    return Err(RuntimeError::NoPeerAtomics {
                        from: self.gpu.ordinal(),
                        to: ordinal,
                    }
                    .into());
                }
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

    fn into_rank_gemm(self, rendezvous: Arc<dyn Rendezvous>) -> Result<RankGemm, DistGemmError> {
        let graph = self
            .graph
            .ok_or_else(|| DistGemmError::Internal("connected without a graph".into()))?;
        Ok(RankGemm {
            done: StreamEvent::new(&self.gpu)?,
            status: PinnedWord::new(&self.gpu)?,
            graph: Some(graph),
            peers: self.peers,
            ordinals: self.ordinals,
            memory: OwnMemory {
                workspace: self.workspace,
                exclusive: self.exclusive,
                input: self.input,
            },
            kernels: self.kernels,
            _setup: self.setup,
            gpu: self.gpu,
            rank: self.rank,
            plan: self.plan,
            options: self.options,
            launched_with: None,
            last_stream: None,
            launches: 0,
            poisoned: Poison::default(),
            rendezvous: Some(rendezvous),
        })
    }
}

/// This rank's memory that peers map.
struct OwnMemory {
    workspace: DeviceBuffer<u8>,
    exclusive: DeviceBuffer<u32>,
    input: Option<DeviceBuffer<u8>>,
}

fn own_addresses(memory: &OwnMemory) -> OwnAddresses {
    OwnAddresses {
        workspace: memory.workspace.device_ptr(),
        exclusive: memory.exclusive.device_ptr(),
        input: memory.input.as_ref().map(DeviceBuffer::device_ptr),
    }
}

/// One rank of a per-rank distributed GEMM; see the module documentation.
pub struct RankGemm {
    // `teardown` releases the graph and the peers' mappings between its two rendezvous, so
    // this rank's memory (dropped after it) is freed only once every peer has stopped
    // running and unmapped it.
    /// None after teardown.
    graph: Option<DeviceGraph>,
    peers: Vec<Option<PeerMemory>>,
    /// Index = rank: the rank's GPU as this process numbers it.
    ordinals: Vec<usize>,
    memory: OwnMemory,
    done: StreamEvent,
    status: PinnedWord,
    kernels: DeviceKernels,
    _setup: Arc<CudaStream>,
    gpu: Gpu,
    rank: usize,
    plan: Plan,
    options: LowerOptions,
    /// The arguments of the last launch (None before the first).
    launched_with: Option<RankArgs>,
    last_stream: Option<RawStream>,
    launches: u64,
    poisoned: Poison,
    rendezvous: Option<Arc<dyn Rendezvous>>,
}

impl std::fmt::Debug for RankGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankGemm")
            .field("rank", &self.rank)
            .field("tp", &self.plan.tp)
            .field("schedule", &self.plan.schedule)
            .field("problem", &self.plan.problem)
            .field("launches", &self.launches)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl RankGemm {
    /// A builder.
    pub fn builder() -> RankGemmBuilder {
        RankGemmBuilder::default()
    }

    /// This rank.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group size (tensor-parallel degree).
    #[must_use]
    pub fn tp(&self) -> usize {
        self.plan.tp
    }

    /// The schedule that runs (after `Auto`).
    #[must_use]
    pub fn schedule(&self) -> ScheduleKind {
        self.plan.schedule
    }

    /// The group's plan.
    #[must_use]
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The bound of every GPU wait.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// `(rows, cols)` of this rank's packed row-major shard of A, B, C or D (C: (0, 0) when
    /// the problem has none; the workspace: (0, 0)).
    #[must_use]
    pub fn shard_shape(&self, kind: BufferKind) -> (usize, usize) {
        let shards = &self.plan.devices[self.rank].shards;
        let block = match kind {
            BufferKind::A => Some(shards.a),
            BufferKind::B => Some(shards.b),
            BufferKind::C => shards.c,
            BufferKind::D => Some(shards.d),
            BufferKind::Workspace => None,
        };
        block.map_or((0, 0), |b| (b.rows, b.cols))
    }

    /// The zero-copy input slot of all-gather schedules (None for reduce-scatter). Write this
    /// rank's shard of [`InputSlot::kind`] there (in stream order before the launch, and not
    /// while an earlier launch may still be running) and pass `ptr` as that operand.
    #[must_use]
    pub fn input_slot(&self) -> Option<InputSlot> {
        let kind = gathered_operand(self.plan.schedule)?;
        let buffer = self.memory.input.as_ref()?;
        Some(InputSlot {
            kind,
            ptr: buffer.device_ptr(),
            bytes: buffer.size_bytes(),
        })
    }

    /// An error of a finished launch, without waiting: the GPU's error word as copied at the
    /// end of the last launch, once that launch has finished. A timeout (this rank's, or one a
    /// peer pushed) poisons the instance.
    pub fn check_errors(&mut self) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        if !self.done.is_complete()? {
            return Ok(());
        }
        if let Some(e) = error_of(
            self.rank,
            &self.ordinals,
            self.status.get(),
            self.options.timeout,
        ) {
            return Err(self.poisoned.record(e));
        }
        Ok(())
    }

    /// Waits on the host for this rank's last launch, then [`RankGemm::check_errors`].
    pub fn synchronize(&mut self) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        if let Err(e) = self.done.synchronize() {
            return Err(self.poisoned.record(e.into()));
        }
        self.check_errors()
    }

    fn validate(&self, args: &RankArgs) -> Result<(), DistGemmError> {
        let bad = |reason: String| DistGemmError::BadLaunch {
            rank: self.rank,
            reason,
        };
        let mut operands = vec![("A", args.a), ("B", args.b), ("D", args.d)];
        if self.plan.problem.has_c() {
            operands.push(("C", args.c));
        } else if args.c != 0 {
            return Err(bad(format!(
                "a C operand was given but beta = {} (C is not read)",
                self.plan.problem.beta
            )));
        }
        for (name, ptr) in operands {
            if ptr == 0 || !ptr.is_multiple_of(16) {
                return Err(bad(format!(
                    "operand {name} at {ptr:#x} is not a 16-byte-aligned device address"
                )));
            }
        }
        Ok(())
    }

    /// Enqueues one run on `stream`, behind the caller's earlier work on it and with no host
    /// synchronisation: copy the gathered operand into the input slot (unless it is already
    /// there), update the graph if addresses changed, launch it, and copy the error word to
    /// the host. An error of an earlier launch that has finished is returned instead (and
    /// poisons the instance).
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's GPU (primary context) or the legacy
    /// default stream; `args` must be device addresses on this rank's GPU holding at least
    /// the shard sizes of [`RankGemm::shard_shape`], alive and not written by other streams
    /// until `stream` has passed this launch. Every rank of the group must launch the same
    /// number of times.
    pub unsafe fn launch_raw(
        &mut self,
        stream: RawStream,
        args: RankArgs,
    ) -> Result<(), DistGemmError> {
        self.check_errors()?;
        self.validate(&args)?;
        if let Some(last) = self.last_stream
            && last != stream
        {
            self.done.order_before(stream)?;
        }
        let result = self.enqueue(stream, args);
        if let Err(e) = result {
            return Err(self.poisoned.record(e));
        }
        self.launches += 1;
        Ok(())
    }

    fn enqueue(&mut self, stream: RawStream, args: RankArgs) -> Result<(), DistGemmError> {
        if self.graph.is_none() {
            return Err(DistGemmError::Poisoned("the instance was closed".into()));
        }
        if let (Some(slot), Some(input)) = (self.input_slot(), &self.memory.input) {
            let src = match slot.kind {
                BufferKind::A => args.a,
                _ => args.b,
            };
            if src != input.device_ptr() {
                // SAFETY: `src` holds the shard (launch_raw's contract); the slot is ours and
                // its previous readers are ordered before this copy by the end-of-run release.
                unsafe {
                    copy_device_async(&self.gpu, input.device_ptr(), src, slot.bytes, stream)?
                };
            }
        }
        let Some(graph) = self.graph.as_mut() else {
            return Err(DistGemmError::Poisoned("the instance was closed".into()));
        };
        if self.launched_with != Some(args) {
            let local = rank_addresses(
                &self.plan,
                self.rank,
                &self.peers,
                own_addresses(&self.memory),
                args,
            );
            let lowered = lower_device(&self.plan, self.rank, &local, &self.options)?;
            check_gemms(&lowered)?;
            // SAFETY: launch_raw's contract for the new addresses; every launch of this graph
            // goes through this function, ordered on one stream chain (order_before above).
            unsafe { graph.update(&self.kernels, lowered, stream)? };
            self.launched_with = Some(args);
        }
        graph.launch(stream)?;
        let error_word =
            self.memory.exclusive.device_ptr() + self.plan.exclusive.error_offset as u64;
        // SAFETY: the error word is ours; `status` lives as long as `done`, recorded below.
        unsafe { self.status.copy_from_device_async(error_word, stream)? };
        self.done.record(stream)?;
        self.last_stream = Some(stream);
        Ok(())
    }

    /// Collective teardown (what drop does), returning the rendezvous's error if a peer is
    /// gone: then this rank's shared memory is leaked, not freed.
    pub fn close(mut self) -> Result<(), DistGemmError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), DistGemmError> {
        let Some(rendezvous) = self.rendezvous.take() else {
            return Ok(());
        };
        let _ = self.done.synchronize();
        // First every rank has stopped running, then every rank has unmapped its peers'
        // memory (legacy IPC: an exporter must not free what an importer still maps); only
        // then does this rank free what the peers mapped.
        let stopped = rendezvous.all_gather(b"stopped");
        self.graph = None;
        self.peers.clear();
        if let Err(e) = stopped.and_then(|_| rendezvous.all_gather(b"unmapped")) {
            // A peer may still run, or still map our memory: never free it.
            let empty = OwnMemory {
                workspace: DeviceBuffer::alloc(&self.gpu, 0)?,
                exclusive: DeviceBuffer::alloc(&self.gpu, 0)?,
                input: None,
            };
            std::mem::forget(std::mem::replace(&mut self.memory, empty));
            return Err(e.into());
        }
        Ok(())
    }
}

impl Drop for RankGemm {
    /// [`RankGemm::close`], with its error ignored.
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// A rank's instance moves between threads (a Python object, a framework's worker).
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<RankGemm>();
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose ranks cannot build (here: no GPU given, as on a machine without one)
    /// fails on every rank, together and at once, instead of leaving a rank waiting in the
    /// rendezvous for a peer that gave up.
    #[test]
    fn a_rank_that_cannot_build_fails_the_whole_group_without_a_hang() {
        let socket =
            std::env::temp_dir().join(format!("distgemm-rank-build-{}.sock", std::process::id()));
        let start = std::time::Instant::now();
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let socket = socket.clone();
                std::thread::spawn(move || {
                    let rendezvous: Arc<dyn Rendezvous> = Arc::new(
                        LocalRendezvous::join(&socket, rank, 3, Duration::from_secs(10))
                            .expect("join"),
                    );
                    let mut builder = RankGemm::builder()
                        .schedule(ScheduleKind::AllGatherRotatingA)
                        .timeout(Duration::from_secs(1));
                    if rank != 1 {
                        builder = builder.problem(Problem::new(96, 96, 48));
                    }
                    builder.build(rendezvous).map(|_| ()).unwrap_err()
                })
            })
            .collect();
        let errors: Vec<DistGemmError> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(start.elapsed() < Duration::from_secs(5));
        for e in &errors {
            assert!(matches!(e, DistGemmError::Missing(_)), "{e}");
        }
        assert!(errors[1].to_string().contains("a problem"), "{}", errors[1]);
        assert!(errors[0].to_string().contains("a GPU"), "{}", errors[0]);
    }

    #[test]
    fn the_plan_of_a_group_needs_no_gpu() {
        let builder = RankGemm::builder()
            .auto_schedule(ScheduleKind::ReduceScatterTilingA)
            .problem(Problem::new(256, 512, 384));
        let plan = builder.plan(2).unwrap();
        assert_eq!(plan.tp, 2);
        assert!(matches!(
            plan.schedule,
            ScheduleKind::ReduceScatterTilingA | ScheduleKind::ReduceScatterSingleStageA
        ));
        assert!(builder.plan(0).is_err());
        assert!(RankGemm::builder().plan(2).is_err());
    }
}
