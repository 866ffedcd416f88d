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

mod builder;

use std::sync::Arc;
use std::time::Duration;

pub use self::builder::{DEFAULT_TIMEOUT, DistGemmBuilder, ScheduleChoice};
use super::args::{DeviceArgs, validate_args, validate_fp8_scales};
use super::error::{DistGemmError, decode_timeout};
use super::graphs::{DeviceGraph, DeviceKernels, GridShare, Poison};
#[cfg(feature = "diagnostics")]
use super::lower::TimingDiagnostics;
use super::lower::{DeviceAddresses, LowerOptions, LoweredGraph, lower_device};
use crate::gemm::check;
use crate::plan::Plan;
#[cfg(feature = "cli")]
use crate::runtime::GraphNode;
#[cfg(feature = "testing")]
use crate::runtime::stream::GraphTopology;
use crate::runtime::{CudaStream, DeviceBuffer, Gpu, Module, RawStream};
use crate::schedule::ScheduleKind;

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

    #[cfg(any(feature = "testing", feature = "cli"))]
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

    /// Device `rank`'s graph node handles in plan order (node i runs plan node i), for the
    /// profiler's mapping of activity records to plan nodes.
    #[cfg(feature = "cli")]
    pub(crate) fn graph_nodes(&self, rank: usize) -> Result<&[GraphNode], DistGemmError> {
        Ok(self.graph(rank)?.nodes())
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
                a_scales: a.row_scales.map_or(0, |s| s.a.ptr()),
                b_scales: a.row_scales.map_or(0, |s| s.b.ptr()),
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

    /// An FP8 problem's tensor-wise scales for the runs from now on (see
    /// [`DistGemmBuilder::fp8_scales`]): waits for any run in flight, then rewrites the stage
    /// GEMMs' alpha in place. Out-of-range scales, or scales for a 16-bit problem, are an
    /// error that changes nothing.
    pub fn set_fp8_scales(&mut self, sa: f32, sb: f32) -> Result<(), DistGemmError> {
        self.poisoned.check()?;
        validate_fp8_scales(&self.plan, Some([sa, sb]))?;
        if self.in_flight {
            self.wait()?;
        }
        let previous = self.options.fp8_scales.replace([sa, sb]);
        let args = self.args.clone();
        let result = self.relower(&args);
        if result.is_err() {
            self.options.fp8_scales = previous;
        }
        result
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
