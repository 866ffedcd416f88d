//! The CUDA backend: a [`Plan`](crate::plan::Plan) lowered to one CUDA graph per GPU, built
//! once and replayed.
//!
//! - `lower` (private): the pure part — every plan node becomes one graph node (barrier / GEMM /
//!   reduce / release-wait kernels, peer memcpy, flag write-value) with all addresses, prologue hooks and error
//!   codes resolved, every plan edge one graph edge (programmatic between kernels where the
//!   plan says so): `lower::resolve` the addresses, `lower::nodes` one method per node kind.
//!   Unit-tested without a GPU.
//! - [`DistGemm`]: one process drives every GPU — validation, peer access, workspaces, graph
//!   construction and instantiation, `run` / `wait`, pointer updates through
//!   `cuGraphExec*SetParams`, and errors that name the device, stage and flag of a wait that
//!   timed out.
//! - [`RankGemm`] ([`rank`]): one process per GPU (torchrun, Megatron, vLLM): peer memory
//!   over CUDA IPC, a rendezvous the caller supplies, runs on the caller's stream.
//! - `graphs` (private): one device's graph, built and updated in place — the code both modes
//!   share; `args`: the user's buffers ([`BufferRef`] borrows them).
//! - [`auto`]: the deterministic `Auto` schedule rule; [`tuning`]: the measured choices
//!   (`distgemm tune`'s tables) it prefers where it has them.
//! - [`error`]: [`DistGemmError`] and the timeout codes the kernels write.
//!
//! Cross-GPU protocol (kernels in `kernels_gpu::kernels::collective` and the GEMM's prologue
//! hook): the start-of-run barrier resets the device's flags and meets every peer on a running
//! counter; flags are set with system-scope release stores (kernels) or by write-value nodes
//! after their copy (all-gather; the driver fences before the write) and awaited with
//! system-scope acquire loads; an all-gather device's run ends waiting until every peer has
//! released its input shard, so its own stream order makes the shard reusable. Every wait is
//! bounded by the configured timeout; on expiry it leaves a code in its own and every peer's
//! error word (the first code stays), a poisoned barrier arrives nowhere, and
//! [`DistGemm::wait`] / [`RankGemm::check_errors`] turn the code into
//! [`DistGemmError::Timeout`] naming the device, node, stage and flag.

mod args;
pub mod auto;
mod dist;
pub mod error;
mod graphs;
mod lower;
pub mod rank;
pub mod tuning;

pub use args::{BufferRef, DeviceArgs, Fp8RowScales};
pub use auto::{
    ASSUMED_GPU_NAME, AutoChoice, MachineModel, Resolution, ScheduleSource, choose_schedule,
    choose_schedule_tuned,
};
pub use dist::{DEFAULT_TIMEOUT, DistGemm, DistGemmBuilder, ScheduleChoice};
pub use error::{DistGemmError, TimeoutSite, WaitingNode};
/// The barrier kernel's parameter block (a barrier node's launch argument).
#[cfg(feature = "diagnostics")]
pub use kernels_gpu::collective_abi::BarrierParams;
/// The reduction kernel's parameter block (a reduce node's launch argument) and its launch
/// shape.
#[cfg(feature = "diagnostics")]
pub use kernels_gpu::collective_abi::{REDUCE_SMEM_BYTES, REDUCE_THREADS, ReduceParams};
#[cfg(feature = "diagnostics")]
pub use lower::TimingDiagnostics;
pub use rank::{
    InputSlot, LocalRendezvous, RankArgs, RankGemm, RankGemmBuilder, Rendezvous, RendezvousError,
};
pub use tuning::{LoadedTable, TUNING_ENV_VAR, TuningError, TuningTable};
