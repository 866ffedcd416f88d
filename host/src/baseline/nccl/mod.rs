//! The "plain" tensor-parallel baseline: an NCCL collective and a cuBLASLt GEMM, one after the
//! other on each GPU's stream, driven by one process for all GPUs.
//!
//! Two shapes of it, matching the two families of distgemm schedules (global problem
//! `D (M×N) = A (M×K) · Bᵀ (B is N×K)`, P GPUs):
//! - [`NcclGemmKind::AllGatherA`] (fc1-style, the all-gather schedules with A rotating): every
//!   GPU holds a row block of A (M/P × K) and a row block of B (N/P × K); `ncclAllGather` makes
//!   the whole A, then cuBLASLt computes the GPU's M × N/P column block of D.
//! - [`NcclGemmKind::AllGatherB`] (the all-gather schedules with B rotating): A row block
//!   (M/P × K), B row block gathered to N × K, then the GPU's M/P × N row block of D.
//! - [`NcclGemmKind::ReduceScatter`] (fc2-style, the reduce-scatter schedules): every GPU holds a
//!   K-shard of A (M × K/P) and of B (N × K/P); cuBLASLt computes the M × N partial product, then
//!   `ncclReduceScatter` (sum) leaves row block d of D (M/P × N) on GPU d. NCCL scatters
//!   contiguous chunks, i.e. row blocks; the column-sharded variant (`rs-b`) does the same work.
//!
//! Pieces: `library.rs` loads NCCL and resolves its entry points, `comms.rs` owns the
//! communicators and enqueues the collectives, `layout.rs` sizes the buffers (pure), and this
//! module runs the baseline ([`NcclGemmBaseline`]).
//!
//! **Why a small loader of our own rather than cudarc's `nccl` (`sys`, or the safe `Comm` built
//! on it):** cudarc loads `libnccl` lazily and panics when it is missing, and the names it
//! tries (`libnccl.so`, `libnccl.so.13`, `.12`, …, `.1`) do not include `libnccl.so.2`, the
//! only name under which the NCCL of a PyTorch install
//! (`site-packages/nvidia/nccl/lib/libnccl.so.2`) and of the NCCL deb packages exists. So
//! [`NcclLibrary::load`] opens the library itself (libloading, as cudarc does) under cudarc's
//! candidate names, then `libnccl.so.2`, or the file named by `DISTGEMM_NCCL_LIB`, and returns
//! [`NcclError::NotFound`] instead of panicking. The
//! types and enum values are cudarc's (`cudarc::nccl::sys`), checked against `nccl.h` in the
//! tests.
//!
//! Communicators come from `ncclCommInitAll` (one process, one communicator per GPU); every
//! collective call is wrapped in `ncclGroupStart`/`ncclGroupEnd`, which a single thread
//! driving several GPUs must do.

mod comms;
mod layout;
mod library;

pub use comms::{NcclComms, NcclElement};
pub use layout::{NcclGemmKind, NcclGemmLayout};
pub use library::{
    NCCL_LIB_ENV_VAR, NcclLibrary, nccl_hint, nccl_library_candidates, nccl_result_name,
    nccl_version_string,
};

use super::cublaslt::{BaselineError, CublasLtGemm};
use crate::runtime::{CudaStream, DeviceBuffer, Gpu, Module, RuntimeError};
use crate::testdata::fill_normal;
use std::sync::Arc;

/// Errors of the NCCL + cuBLASLt baseline.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// No NCCL library could be loaded.
    #[error(
        "NCCL could not be loaded ({detail}), so the NCCL + cuBLAS baseline cannot run. Tried: \
         {searched:?}. Add the folder holding libnccl.so.2 to LD_LIBRARY_PATH (a PyTorch install \
         has it in site-packages/nvidia/nccl/lib; run-gpu-tests.sh adds that folder), or set \
         DISTGEMM_NCCL_LIB to the library file"
    )]
    NotFound {
        /// Library names tried.
        searched: Vec<String>,
        /// The loader's last error.
        detail: String,
    },
    /// An NCCL call failed.
    #[error("{call} failed: {text} (ncclResult_t {code})")]
    Call {
        /// The NCCL entry point.
        call: &'static str,
        /// Its `ncclResult_t`.
        code: u32,
        /// `ncclGetErrorString`'s text.
        text: String,
    },
    /// Sizes that do not describe a valid baseline.
    #[error("invalid NCCL baseline: {0}")]
    InvalidProblem(String),
    /// The cuBLASLt GEMM failed.
    #[error(transparent)]
    Gemm(#[from] BaselineError),
    /// A runtime (driver) error.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// One GPU's share of the baseline.
struct Rank<T: NcclElement> {
    stream: Arc<CudaStream>,
    gemm: CublasLtGemm<T>,
    /// All-gather: the local shard of the moving operand. Reduce-scatter: A's K-shard.
    input: DeviceBuffer<T>,
    /// All-gather: the gathered operand. Reduce-scatter: unused (empty).
    gathered: DeviceBuffer<T>,
    /// The GEMM operand that does not move (B, A, or B's K-shard).
    stationary: DeviceBuffer<T>,
    /// The GEMM output (D block, or the M×N partial).
    gemm_out: DeviceBuffer<T>,
    /// Reduce-scatter: the GPU's D block. All-gather: unused (empty).
    scattered: DeviceBuffer<T>,
}

/// NCCL collective + cuBLASLt GEMM in sequence on every GPU, ready to be enqueued repeatedly.
pub struct NcclGemmBaseline<T: NcclElement> {
    kind: NcclGemmKind,
    layout: NcclGemmLayout,
    ranks: Vec<Rank<T>>,
    // Declared after `ranks`: communicators are destroyed after the buffers' last use
    // (buffer drops synchronise their contexts first).
    comms: NcclComms,
}

impl<T: NcclElement> std::fmt::Debug for NcclGemmBaseline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclGemmBaseline")
            .field("kind", &self.kind)
            .field("layout", &self.layout)
            .field("comms", &self.comms)
            .finish()
    }
}

impl<T: NcclElement> NcclGemmBaseline<T> {
    /// Sets up `kind` for the global `m × n × k` problem on the GPUs of `modules` (one loaded
    /// module per GPU, rank r = `modules[r]`'s GPU): communicators, one new stream per GPU, a
    /// planned cuBLASLt GEMM per GPU, and operands filled with N(0,1)-like data on the GPU.
    /// Waits until the fills are done.
    pub fn new(
        modules: &[Arc<Module>],
        kind: NcclGemmKind,
        (m, n, k): (u64, u64, u64),
        seed: u32,
    ) -> Result<Self, NcclError> {
        let tp = modules.len() as u64;
        let layout = NcclGemmLayout::new(kind, m, n, k, tp).map_err(NcclError::InvalidProblem)?;
        let gpus: Vec<Gpu> = modules.iter().map(|m| m.gpu().clone()).collect();
        // Load NCCL before allocating gigabytes, so a missing library fails fast.
        NcclLibrary::load()?;
        let elems = |v: u64| {
            usize::try_from(v).map_err(|_| NcclError::InvalidProblem("size overflow".into()))
        };
        let mut ranks = Vec::with_capacity(modules.len());
        for (r, module) in modules.iter().enumerate() {
            let gpu = module.gpu();
            let stream = gpu.new_stream()?;
            let gemm = CublasLtGemm::<T>::new(gpu, stream.clone(), layout.gemm)?;
            let (input_len, gathered_len, scattered_len) = match kind {
                NcclGemmKind::AllGatherA | NcclGemmKind::AllGatherB => {
                    (layout.shard_elements, layout.collective_out_elements, 0)
                }
                NcclGemmKind::ReduceScatter => (
                    layout.gemm.m * layout.gemm.k,
                    0,
                    layout.collective_out_elements,
                ),
            };
            let mut input = DeviceBuffer::<T>::alloc(gpu, elems(input_len)?)?;
            let gathered = DeviceBuffer::<T>::alloc(gpu, elems(gathered_len)?)?;
            let mut stationary = DeviceBuffer::<T>::alloc(gpu, elems(layout.stationary_elements)?)?;
            let gemm_out = DeviceBuffer::<T>::alloc(gpu, elems(layout.gemm_out_elements)?)?;
            let scattered = DeviceBuffer::<T>::alloc(gpu, elems(scattered_len)?)?;
            let s = seed.wrapping_add(16 * r as u32);
            fill_normal(module, &stream, &mut input, s)?;
            fill_normal(module, &stream, &mut stationary, s + 1)?;
            ranks.push(Rank {
                stream,
                gemm,
                input,
                gathered,
                stationary,
                gemm_out,
                scattered,
            });
        }
        for r in &ranks {
            r.stream
                .synchronize()
                .map_err(RuntimeError::driver("cuStreamSynchronize"))?;
        }
        let comms = NcclComms::new(&gpus)?;
        Ok(NcclGemmBaseline {
            kind,
            layout,
            ranks,
            comms,
        })
    }

    /// The collective/GEMM pairing.
    pub fn kind(&self) -> NcclGemmKind {
        self.kind
    }

    /// Sizes and the per-GPU GEMM.
    pub fn layout(&self) -> &NcclGemmLayout {
        &self.layout
    }

    /// The stream of each rank (the one everything is enqueued on).
    pub fn streams(&self) -> Vec<Arc<CudaStream>> {
        self.ranks.iter().map(|r| r.stream.clone()).collect()
    }

    /// The loaded NCCL ("2.27.8 from libnccl.so.2").
    pub fn nccl_description(&self) -> String {
        let lib = self.comms.library();
        format!(
            "NCCL {} from {}",
            nccl_version_string(lib.version),
            lib.loaded_from
        )
    }

    /// Enqueues one run on every GPU's stream: collective then GEMM (all-gather) or GEMM then
    /// collective (reduce-scatter). Does not wait.
    pub fn enqueue(&self) -> Result<(), NcclError> {
        let streams = self.streams();
        let count = usize::try_from(self.layout.nccl_count)
            .map_err(|_| NcclError::InvalidProblem("count overflow".into()))?;
        match self.kind {
            NcclGemmKind::AllGatherA | NcclGemmKind::AllGatherB => {
                let send: Vec<u64> = self.ranks.iter().map(|r| r.input.device_ptr()).collect();
                let recv: Vec<u64> = self.ranks.iter().map(|r| r.gathered.device_ptr()).collect();
                // SAFETY: input holds `count` elements and gathered `P·count` on each GPU
                // (layout); the buffers live as long as `self`, and dropping them waits for
                // the contexts' work.
                unsafe { self.comms.all_gather::<T>(&send, &recv, count, &streams)? };
                for r in &self.ranks {
                    let (a, b) = match self.kind {
                        NcclGemmKind::AllGatherA => (&r.gathered, &r.stationary),
                        _ => (&r.stationary, &r.gathered),
                    };
                    // SAFETY: A, B and D hold the planned shape's operands (layout) on r's GPU.
                    unsafe {
                        r.gemm.run_raw(
                            a.device_ptr(),
                            b.device_ptr(),
                            r.gemm_out.device_ptr(),
                            r.gemm_out.device_ptr(),
                            1.0,
                            0.0,
                        )?
                    };
                }
            }
            NcclGemmKind::ReduceScatter => {
                for r in &self.ranks {
                    // SAFETY: as above: A K-shard, B K-shard, the M×N partial.
                    unsafe {
                        r.gemm.run_raw(
                            r.input.device_ptr(),
                            r.stationary.device_ptr(),
                            r.gemm_out.device_ptr(),
                            r.gemm_out.device_ptr(),
                            1.0,
                            0.0,
                        )?
                    };
                }
                let send: Vec<u64> = self.ranks.iter().map(|r| r.gemm_out.device_ptr()).collect();
                let recv: Vec<u64> = self
                    .ranks
                    .iter()
                    .map(|r| r.scattered.device_ptr())
                    .collect();
                // SAFETY: the partial holds `P·count` elements, the D block `count`.
                unsafe {
                    self.comms
                        .reduce_scatter::<T>(&send, &recv, count, &streams)?
                };
            }
        }
        Ok(())
    }

    /// Waits for every rank's stream.
    pub fn synchronize(&self) -> Result<(), NcclError> {
        for r in &self.ranks {
            r.stream
                .synchronize()
                .map_err(RuntimeError::driver("cuStreamSynchronize"))?;
        }
        Ok(())
    }
}
