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
//!   order, and every launch is ordered after the previous one (`cuStreamWaitEvent` on its
//!   completion event), whatever stream that was on. The host does not wait for the GPU,
//!   with one exception: a launch at new addresses re-encodes tensor maps and copies them
//!   from pageable host memory, which the driver may stage synchronously.
//! - **Errors.** A wait that times out leaves a code in the rank's error word (and the
//!   kernels push it to the peers' error words); [`RankGemm::check_errors`] reads the copy of
//!   a finished run without waiting, so the first launch after the failed run has finished
//!   refuses (and [`RankGemm::synchronize`] waits and reports it). The instance is then
//!   poisoned; recovery is a rebuild on every rank. A failed run does not wait for the
//!   peers' release of this rank's input slot (the poisoned kernels drain their waits), so
//!   after an error the slot, and this rank's workspaces, stay in use by peers' copy engines
//!   until every rank has synchronised or dropped its instance; the collective teardown
//!   orders that.
//! - **Teardown** (drop) is collective too: wait for this rank's last run; a rendezvous (every
//!   rank has stopped); unmap the peers; a second rendezvous (every rank has unmapped); only
//!   then free — legacy IPC forbids freeing what an importer still maps, and no peer's late
//!   write may land in freed memory. If a rendezvous fails (a peer died), this rank's shared
//!   memory is leaked rather than freed. The rendezvous's own timeout should exceed the GPU
//!   wait bound, or a slow but healthy peer's teardown counts as dead.
//! - **Shared GPU** (tests, MPS): ranks that all allow it may share a GPU; each rank's kernels
//!   then get an equal share of the SMs, so every rank's kernels fit on the GPU together.

mod builder;
mod handshake;
mod rendezvous;

use std::sync::Arc;
use std::time::Duration;

pub use builder::RankGemmBuilder;
pub use rendezvous::{LocalRendezvous, MAX_FRAME_BYTES, Rendezvous, RendezvousError};

use self::builder::{OwnAddresses, PeerMemory, rank_addresses};

use self::handshake::gathered_operand;
use super::args::{address_problem, output_overlap, validate_fp8_scales};
use super::dist::{check_gemms, error_of};
use super::error::DistGemmError;
use super::graphs::{DeviceGraph, DeviceKernels, Poison};
use super::lower::{LowerOptions, lower_device};
use crate::plan::Plan;
use crate::runtime::caller_stream::copy_device_async;
use crate::runtime::{DeviceBuffer, Gpu, PinnedWord, RawStream, StreamEvent};
use crate::schedule::{BufferKind, ScheduleKind};

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
    /// Row-wise FP8 only (0 otherwise): M f32, the scales of every row of the global A
    /// ([`crate::cuda::Fp8RowScales`]), on this rank's GPU.
    pub a_scales: u64,
    /// Row-wise FP8 only (0 otherwise): N f32, the scales of every row of the global B.
    pub b_scales: u64,
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
    gpu: Gpu,
    rank: usize,
    plan: Plan,
    options: LowerOptions,
    /// The arguments of the last launch (None before the first).
    launched_with: Option<RankArgs>,
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

    /// This rank's graph node handles in plan order (none after teardown), for the
    /// profiler's mapping of activity records to plan nodes.
    #[cfg(feature = "cli")]
    pub(crate) fn graph_nodes(&self) -> &[crate::runtime::GraphNode] {
        self.graph.as_ref().map_or(&[], DeviceGraph::nodes)
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

    /// An FP8 problem's tensor-wise scales for the launches from now on (see
    /// [`RankGemmBuilder::fp8_scales`]; every rank should set the same): the next launch
    /// rewrites the stage GEMMs' alpha in stream order. Out-of-range scales, or scales for a
    /// 16-bit problem, are an error that changes nothing.
    pub fn set_fp8_scales(&mut self, sa: f32, sb: f32) -> Result<(), DistGemmError> {
        validate_fp8_scales(&self.plan, Some([sa, sb]))?;
        if self.options.fp8_scales != Some([sa, sb]) {
            self.options.fp8_scales = Some([sa, sb]);
            // The next launch lowers again and updates the graph in place.
            self.launched_with = None;
        }
        Ok(())
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
        let bytes = |kind: BufferKind| {
            let (rows, cols) = self.shard_shape(kind);
            rows.saturating_mul(cols)
                .saturating_mul(self.plan.element_bytes(kind))
        };
        let mut inputs = vec![
            ("A", args.a, bytes(BufferKind::A)),
            ("B", args.b, bytes(BufferKind::B)),
        ];
        if self.plan.problem.has_c() {
            inputs.push(("C", args.c, bytes(BufferKind::C)));
        } else if args.c != 0 {
            return Err(bad(format!(
                "a C operand was given but beta = {} (C is not read)",
                self.plan.problem.beta
            )));
        }
        let row_wise = self
            .plan
            .problem
            .fp8
            .is_some_and(|f| f.scales == crate::fp8::ScaleMode::Rowwise);
        for (name, ptr) in [("A", args.a_scales), ("B", args.b_scales)] {
            match (row_wise, ptr) {
                (false, 0) => {}
                (false, _) => {
                    return Err(bad(format!(
                        "scales of {name} were given but the problem has no row-wise scales"
                    )));
                }
                (true, p) if p == 0 || !p.is_multiple_of(4) => {
                    return Err(bad(format!(
                        "row-wise FP8 needs the scales of {name} at a 4-byte-aligned device \
                         address, got {p:#x}"
                    )));
                }
                (true, _) => {}
            }
        }
        for (name, ptr, _) in inputs.iter().chain([&("D", args.d, 0)]) {
            if let Some(why) = address_problem(*ptr) {
                return Err(bad(format!("operand {name}: {why}")));
            }
        }
        if let Some(slot) = self.input_slot() {
            inputs.push(("input slot", slot.ptr, slot.bytes));
        }
        if let Some(other) = output_overlap((args.d, bytes(BufferKind::D)), &inputs) {
            return Err(bad(format!(
                "operand D overlaps {other}; D must be separate memory"
            )));
        }
        Ok(())
    }

    /// Enqueues one run on `stream`, behind the caller's earlier work on it and this
    /// instance's previous launch, without waiting for the GPU (see the module documentation
    /// for the one exception): copy the gathered operand into the input slot (unless it is already
    /// there), update the graph if addresses changed, launch it, and copy the error word to
    /// the host. An error of an earlier launch that has finished is returned instead (and
    /// poisons the instance).
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's GPU (primary context) or the legacy
    /// default stream; `args` must be device addresses on this rank's GPU holding at least
    /// the shard sizes of [`RankGemm::shard_shape`] (and, for row-wise FP8, M and N f32 of
    /// scales), alive and not written by other streams until `stream` has passed this
    /// launch. Every rank of the group must launch the same
    /// number of times.
    pub unsafe fn launch_raw(
        &mut self,
        stream: RawStream,
        args: RankArgs,
    ) -> Result<(), DistGemmError> {
        self.check_errors()?;
        self.validate(&args)?;
        if self.graph.is_none() {
            return Err(DistGemmError::Poisoned("the instance was closed".into()));
        }
        // Everything below is ordered after the last launch, whatever stream that was on (a
        // stream handle can be destroyed and handed out again, so handles are not compared);
        // on the same stream this is a no-op for the GPU.
        self.done.order_before(stream)?;
        let result = self.enqueue(stream, args);
        if let Err(e) = result {
            return Err(self.poisoned.record(e));
        }
        self.launches += 1;
        Ok(())
    }

    fn enqueue(&mut self, stream: RawStream, args: RankArgs) -> Result<(), DistGemmError> {
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
        let copied = unsafe { self.status.copy_from_device_async(error_word, stream) };
        // Recorded even if the copy failed: teardown waits on `done`, so it must cover every
        // graph launch that reached the stream.
        self.done.record(stream)?;
        Ok(copied?)
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
    use crate::problem::Problem;

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
