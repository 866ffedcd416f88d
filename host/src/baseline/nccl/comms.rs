//! One NCCL communicator per GPU of this process, and the two collectives the baseline uses.

use super::NcclError;
use super::library::{NCCL_BFLOAT16, NCCL_FLOAT16, NCCL_SUM, NcclLibrary};
use crate::baseline::cublaslt::CublasLtElement;
use crate::dtype::Element;
use crate::runtime::{CudaStream, DeviceCopy, Gpu};
use cudarc::nccl::sys as nccl_sys;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// One NCCL communicator per GPU of a single process (`ncclCommInitAll`), destroyed on drop.
pub struct NcclComms {
    lib: &'static NcclLibrary,
    comms: Vec<nccl_sys::ncclComm_t>,
    gpus: Vec<Gpu>,
}

// SAFETY: NCCL communicators may be used from any thread as long as calls on one communicator
// are not concurrent; `NcclComms` is only used through `&mut self` / one thread at a time.
unsafe impl Send for NcclComms {}

impl std::fmt::Debug for NcclComms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComms")
            .field("ranks", &self.comms.len())
            .field("nccl", &self.lib)
            .finish()
    }
}

impl NcclComms {
    /// Communicators over `gpus` (rank r = `gpus[r]`). Fails with
    /// [`NcclError::NotFound`] when no NCCL library loads.
    pub fn new(gpus: &[Gpu]) -> Result<Self, NcclError> {
        if gpus.is_empty() {
            return Err(NcclError::InvalidProblem(
                "NCCL needs at least one GPU".into(),
            ));
        }
        let lib = NcclLibrary::load()?;
        let ordinals: Vec<c_int> = gpus
            .iter()
            .map(|g| {
                c_int::try_from(g.ordinal())
                    .map_err(|_| NcclError::InvalidProblem("GPU ordinal overflows".into()))
            })
            .collect::<Result<_, _>>()?;
        let mut comms = vec![std::ptr::null_mut(); gpus.len()];
        let n = c_int::try_from(gpus.len())
            .map_err(|_| NcclError::InvalidProblem("too many GPUs".into()))?;
        // SAFETY: `comms` has room for `n` handles; `ordinals` holds `n` device ordinals.
        let rc = unsafe { (lib.comm_init_all)(comms.as_mut_ptr(), n, ordinals.as_ptr()) };
        lib.check("ncclCommInitAll", rc)?;
        Ok(NcclComms {
            lib,
            comms,
            gpus: gpus.to_vec(),
        })
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    /// Whether there are no ranks (never).
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// The NCCL library in use.
    pub fn library(&self) -> &'static NcclLibrary {
        self.lib
    }

    /// Runs `per_rank(rank)` for every rank between `ncclGroupStart` and `ncclGroupEnd`; the
    /// group is always ended, and the first error is returned.
    fn grouped(
        &self,
        mut per_rank: impl FnMut(usize) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        self.lib
            .check("ncclGroupStart", unsafe { (self.lib.group_start)() })?;
        let mut result = Ok(());
        for (rank, gpu) in self.gpus.iter().enumerate() {
            let r = gpu
                .bind()
                .map_err(NcclError::from)
                .and_then(|()| per_rank(rank));
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        // SAFETY: no arguments; pairs with the start above.
        let ended = self
            .lib
            .check("ncclGroupEnd", unsafe { (self.lib.group_end)() });
        result.and(ended)
    }

    /// Enqueues `ncclAllGather` on every rank: rank r contributes `count` elements at
    /// `send[r]` and receives `P·count` at `recv[r]` (rank q's block at offset `q·count`).
    ///
    /// # Safety
    /// `send[r]`/`recv[r]` must be device memory of GPU r holding `count` / `P·count` elements
    /// of `T`, alive until the streams have run the collective.
    pub unsafe fn all_gather<T: NcclElement>(
        &self,
        send: &[u64],
        recv: &[u64],
        count: usize,
        streams: &[Arc<CudaStream>],
    ) -> Result<(), NcclError> {
        self.collective(
            "ncclAllGather",
            send,
            recv,
            streams,
            |s, d, comm, stream| {
                // SAFETY: the caller's contract; communicator r is alive.
                unsafe { (self.lib.all_gather)(s, d, count, T::NCCL_TYPE, comm, stream) }
            },
        )
    }

    /// Enqueues `ncclReduceScatter` (sum) on every rank: rank r reduces `P·count` elements at
    /// `send[r]` and receives the sum of block r (`count` elements) at `recv[r]`.
    ///
    /// # Safety
    /// As [`NcclComms::all_gather`], with sizes `P·count` / `count`.
    pub unsafe fn reduce_scatter<T: NcclElement>(
        &self,
        send: &[u64],
        recv: &[u64],
        count: usize,
        streams: &[Arc<CudaStream>],
    ) -> Result<(), NcclError> {
        self.collective(
            "ncclReduceScatter",
            send,
            recv,
            streams,
            |s, d, comm, stream| {
                // SAFETY: the caller's contract; communicator r is alive.
                unsafe {
                    (self.lib.reduce_scatter)(s, d, count, T::NCCL_TYPE, NCCL_SUM, comm, stream)
                }
            },
        )
    }

    /// One collective on every rank, in one group: `call(send[r], recv[r], comm[r],
    /// stream[r])` returns rank r's `ncclResult_t`, which `name` labels in errors. `send`,
    /// `recv` and `streams` must have one entry per rank.
    fn collective(
        &self,
        name: &'static str,
        send: &[u64],
        recv: &[u64],
        streams: &[Arc<CudaStream>],
        call: impl Fn(*const c_void, *mut c_void, nccl_sys::ncclComm_t, *mut c_void) -> u32,
    ) -> Result<(), NcclError> {
        let lens = [send.len(), recv.len(), streams.len()];
        if lens.iter().any(|&l| l != self.comms.len()) {
            return Err(NcclError::InvalidProblem(format!(
                "NCCL call with {lens:?} buffers/streams for {} ranks",
                self.comms.len()
            )));
        }
        self.grouped(|r| {
            let rc = call(
                send[r] as *const c_void,
                recv[r] as *mut c_void,
                self.comms[r],
                streams[r].cu_stream().cast(),
            );
            self.lib.check(name, rc)
        })
    }
}

impl Drop for NcclComms {
    fn drop(&mut self) {
        for (comm, gpu) in self.comms.iter().zip(&self.gpus) {
            let _ = gpu.bind();
            // SAFETY: created by ncclCommInitAll, destroyed once; errors cannot be reported
            // from drop (cudarc's Comm panics here, which we avoid).
            let _ = unsafe { (self.lib.comm_destroy)(*comm) };
        }
    }
}

/// Element types NCCL reduces and gathers for the baseline.
pub trait NcclElement: CublasLtElement + Element + DeviceCopy {
    /// The `ncclDataType_t` value.
    const NCCL_TYPE: c_int;
}

impl NcclElement for half::bf16 {
    const NCCL_TYPE: c_int = NCCL_BFLOAT16;
}

impl NcclElement for half::f16 {
    const NCCL_TYPE: c_int = NCCL_FLOAT16;
}
