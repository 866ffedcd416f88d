//! Building a [`DistGemm`]: the schedule to run ([`ScheduleChoice`], `Auto` resolved by the
//! rule or a tuning table), the builder that collects devices, problem and buffers, and the
//! validation of the devices (Hopper, peer access, no shared GPU unless allowed) before the
//! workspaces are allocated and one graph per device is built (step 1 of the life cycle in
//! [the module documentation](super)).

use std::sync::Arc;
use std::time::Duration;

use super::{DistGemm, Rank, check_gemms};
use crate::cuda::args::{DeviceArgs, validate_args, validate_fp8_scales};
use crate::cuda::auto::{
    ASSUMED_GPU_NAME, MachineModel, Resolution, ScheduleSource, choose_schedule_tuned,
};
use crate::cuda::error::DistGemmError;
use crate::cuda::graphs::{DeviceGraph, GridShare, Poison};
use crate::cuda::lower::{LowerOptions, lower_device};
use crate::cuda::tuning::LoadedTable;
use crate::dtype::Dtype;
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::Problem;
use crate::runtime::{Gpu, Module, RawStream, RuntimeError, require_peer_link};
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
                rs_partials: None,
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
    /// [`TUNING_ENV_VAR`]: crate::cuda::tuning::TUNING_ENV_VAR
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
    rs_partials: Option<RsPartials>,
    tuning: Option<Arc<LoadedTable>>,
    fp8_scales: Option<[f32; 2]>,
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

    /// `Auto` within `family`'s shard layout (see [`crate::cuda::auto`]).
    pub fn auto_schedule(self, family: ScheduleKind) -> Self {
        DistGemmBuilder {
            schedule: Some(ScheduleChoice::Auto(family)),
            ..self
        }
    }

    /// How the pipelined reduce-scatter schedules move partial sums (ignored by other
    /// schedules, also when `Auto` picks one). Unset: a tuning table's measured choice where
    /// `Auto` found an entry, else [`RsPartials::Read`] (the rule has no model of pushes yet).
    pub fn rs_partials(self, rs_partials: RsPartials) -> Self {
        DistGemmBuilder {
            rs_partials: Some(rs_partials),
            ..self
        }
    }

    /// The tuning table `Auto` reads (default: the file `DISTGEMM_TUNING` names, if set; see
    /// [`crate::cuda::tuning`]). Ignored by a fixed schedule.
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

    /// An FP8 problem's tensor-wise scales: `D = alpha · (sa·A) · (sb·B)ᵀ + beta · C` with A
    /// and B the e4m3 shards. Required for an FP8 problem, refused for a 16-bit one; change
    /// them between runs with [`DistGemm::set_fp8_scales`].
    pub fn fp8_scales(self, sa: f32, sb: f32) -> Self {
        DistGemmBuilder {
            fp8_scales: Some([sa, sb]),
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
        let resolution = self.resolution()?;
        Ok(Plan::build_with(
            resolution.schedule,
            self.resolved_problem()?,
            tp,
            PlanOptions {
                rs_partials: resolution.rs_partials_with(self.rs_partials),
            },
        )?)
    }

    fn lower_options(&self) -> LowerOptions {
        #[allow(unused_mut)]
        let mut options = LowerOptions {
            timeout: self.timeout.unwrap_or(DEFAULT_TIMEOUT),
            fp8_scales: self.fp8_scales,
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
        validate_fp8_scales(&plan, self.fp8_scales)?;

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
