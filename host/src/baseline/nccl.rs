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
//! **Why NCCL is loaded here rather than through cudarc's `nccl::sys`:** cudarc loads
//! `libnccl` lazily and panics when it is missing, and the names it tries (`libnccl.so`,
//! `libnccl.so.13`, `.12`, …, `.1`) do not include `libnccl.so.2`, the only name under which
//! the NCCL of a PyTorch install (`site-packages/nvidia/nccl/lib/libnccl.so.2`) and of the
//! NCCL deb packages exists. So [`NcclLibrary::load`] opens the library itself (libloading,
//! as cudarc does) under cudarc's candidate names, then `libnccl.so.2`, or the file named by
//! `DISTGEMM_NCCL_LIB`, and returns [`NcclError::NotFound`] instead of panicking. The
//! types and enum values are cudarc's (`cudarc::nccl::sys`), checked against `nccl.h` in the
//! tests.
//!
//! Communicators come from `ncclCommInitAll` (one process, one communicator per GPU); every
//! collective call is wrapped in `ncclGroupStart`/`ncclGroupEnd`, which a single thread
//! driving several GPUs must do.

use super::cublaslt::{BaselineError, CublasLtElement, CublasLtGemm, TnGemmShape};
use crate::dtype::Element;
use crate::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, Module, RuntimeError};
use crate::testdata::fill_normal;
use cudarc::nccl::sys as nccl_sys;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Environment variable naming the NCCL library file to load (overrides the search).
pub const NCCL_LIB_ENV_VAR: &str = "DISTGEMM_NCCL_LIB";

/// `ncclSuccess`.
const NCCL_SUCCESS: u32 = 0;
/// `ncclInProgress` (non-blocking communicators only; ours are blocking).
const NCCL_IN_PROGRESS: u32 = 7;
/// `ncclFloat16` in `nccl.h`.
const NCCL_FLOAT16: c_int = 6;
/// `ncclBfloat16` in `nccl.h`.
const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum` in `nccl.h`.
const NCCL_SUM: c_int = 0;

/// The library names tried, in order: cudarc's candidates for "nccl", then the soname real
/// installs use. `DISTGEMM_NCCL_LIB`, when set, is tried alone.
pub fn nccl_library_candidates() -> Vec<String> {
    if let Some(path) = std::env::var_os(NCCL_LIB_ENV_VAR).filter(|v| !v.is_empty()) {
        return vec![path.to_string_lossy().into_owned()];
    }
    let mut names = cudarc::get_lib_name_candidates("nccl");
    for extra in ["libnccl.so.2", "libnccl.so"] {
        if !names.iter().any(|n| n == extra) {
            names.push(extra.to_owned());
        }
    }
    names
}

/// Human-readable text of an `ncclResult_t` code (when the library gives none).
pub fn nccl_result_name(code: u32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown ncclResult_t",
    }
}

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

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> u32;
type CommInitAllFn = unsafe extern "C" fn(*mut nccl_sys::ncclComm_t, c_int, *const c_int) -> u32;
type CommDestroyFn = unsafe extern "C" fn(nccl_sys::ncclComm_t) -> u32;
type AllGatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    nccl_sys::ncclComm_t,
    *mut c_void,
) -> u32;
type ReduceScatterFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    nccl_sys::ncclComm_t,
    *mut c_void,
) -> u32;
type GroupFn = unsafe extern "C" fn() -> u32;
type ErrorStringFn = unsafe extern "C" fn(u32) -> *const c_char;

/// The NCCL entry points the baseline calls, resolved once from the loaded library.
pub struct NcclLibrary {
    /// The name or path that loaded.
    pub loaded_from: String,
    /// `ncclGetVersion`, e.g. 22708 for 2.27.8.
    pub version: i32,
    comm_init_all: CommInitAllFn,
    comm_destroy: CommDestroyFn,
    all_gather: AllGatherFn,
    reduce_scatter: ReduceScatterFn,
    group_start: GroupFn,
    group_end: GroupFn,
    error_string: Option<ErrorStringFn>,
    // Keeps the symbols above valid; never unloaded (stored in a static).
    _lib: libloading::Library,
}

impl std::fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLibrary")
            .field("loaded_from", &self.loaded_from)
            .field("version", &self.version)
            .finish()
    }
}

/// `2.27.8` from NCCL's `major*10000 + minor*100 + patch` encoding (≥ 2.9).
pub fn nccl_version_string(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
}

static NCCL: OnceLock<Result<NcclLibrary, String>> = OnceLock::new();

impl NcclLibrary {
    /// Loads NCCL once per process (later calls return the same result).
    pub fn load() -> Result<&'static NcclLibrary, NcclError> {
        NCCL.get_or_init(Self::open)
            .as_ref()
            .map_err(|detail| NcclError::NotFound {
                searched: nccl_library_candidates(),
                detail: format!("{detail}; {}", nccl_hint()),
            })
    }

    fn open() -> Result<NcclLibrary, String> {
        let mut errors = Vec::new();
        for name in nccl_library_candidates() {
            // SAFETY: loading NCCL runs its (trusted) initialisers only.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => return Self::resolve(lib, name),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(errors.last().cloned().unwrap_or_default())
    }

    fn resolve(lib: libloading::Library, name: String) -> Result<NcclLibrary, String> {
        fn sym<F: Copy>(lib: &libloading::Library, name: &str) -> Result<F, String> {
            // SAFETY: `F` is the C signature of `name` in nccl.h (with enums as ints).
            unsafe { lib.get::<F>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| format!("{name}: {e}"))
        }
        let get_version: GetVersionFn = sym(&lib, "ncclGetVersion")?;
        let mut version = 0;
        // SAFETY: writes one int.
        let rc = unsafe { get_version(&mut version) };
        if rc != NCCL_SUCCESS {
            return Err(format!("ncclGetVersion returned {}", nccl_result_name(rc)));
        }
        Ok(NcclLibrary {
            loaded_from: name,
            version,
            comm_init_all: sym(&lib, "ncclCommInitAll")?,
            comm_destroy: sym(&lib, "ncclCommDestroy")?,
            all_gather: sym(&lib, "ncclAllGather")?,
            reduce_scatter: sym(&lib, "ncclReduceScatter")?,
            group_start: sym(&lib, "ncclGroupStart")?,
            group_end: sym(&lib, "ncclGroupEnd")?,
            error_string: sym(&lib, "ncclGetErrorString").ok(),
            _lib: lib,
        })
    }

    /// Turns an `ncclResult_t` into a result naming the call.
    fn check(&self, call: &'static str, code: u32) -> Result<(), NcclError> {
        if code == NCCL_SUCCESS || code == NCCL_IN_PROGRESS {
            return Ok(());
        }
        let text = self
            .error_string
            // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null).
            .map(|f| unsafe { f(code) })
            .filter(|p| !p.is_null())
            // SAFETY: non-null, NUL-terminated, static.
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_else(|| nccl_result_name(code).to_owned());
        Err(NcclError::Call { call, code, text })
    }
}

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
        self.check_ranks(&[send.len(), recv.len(), streams.len()])?;
        self.grouped(|r| {
            // SAFETY: the caller's contract; communicator r is alive.
            let rc = unsafe {
                (self.lib.all_gather)(
                    send[r] as *const c_void,
                    recv[r] as *mut c_void,
                    count,
                    T::NCCL_TYPE,
                    self.comms[r],
                    streams[r].cu_stream().cast(),
                )
            };
            self.lib.check("ncclAllGather", rc)
        })
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
        self.check_ranks(&[send.len(), recv.len(), streams.len()])?;
        self.grouped(|r| {
            // SAFETY: the caller's contract; communicator r is alive.
            let rc = unsafe {
                (self.lib.reduce_scatter)(
                    send[r] as *const c_void,
                    recv[r] as *mut c_void,
                    count,
                    T::NCCL_TYPE,
                    NCCL_SUM,
                    self.comms[r],
                    streams[r].cu_stream().cast(),
                )
            };
            self.lib.check("ncclReduceScatter", rc)
        })
    }

    fn check_ranks(&self, lens: &[usize]) -> Result<(), NcclError> {
        if lens.iter().any(|&l| l != self.comms.len()) {
            return Err(NcclError::InvalidProblem(format!(
                "NCCL call with {lens:?} buffers/streams for {} ranks",
                self.comms.len()
            )));
        }
        Ok(())
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

/// Which collective the baseline pairs with the GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclGemmKind {
    /// All-gather of A's row blocks, then `M × N/P × K` (fc1-style, `ag-a`).
    AllGatherA,
    /// All-gather of B's row blocks, then `M/P × N × K` (`ag-b`).
    AllGatherB,
    /// `M × N × K/P` partial, then reduce-scatter of its row blocks (fc2-style, `rs-a`/`rs-b`).
    ReduceScatter,
}

impl NcclGemmKind {
    /// Short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            NcclGemmKind::AllGatherA => "nccl-allgather(A)+cublaslt",
            NcclGemmKind::AllGatherB => "nccl-allgather(B)+cublaslt",
            NcclGemmKind::ReduceScatter => "cublaslt+nccl-reducescatter",
        }
    }
}

/// Per-GPU buffer sizes and GEMM shape of the baseline (pure; unit-tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclGemmLayout {
    /// The GEMM each GPU runs.
    pub gemm: TnGemmShape,
    /// Elements of the collective's per-rank input (A/B shard, or the partial).
    pub shard_elements: u64,
    /// Elements of the collective's per-rank output (gathered operand, or D block).
    pub collective_out_elements: u64,
    /// Elements per rank handed to NCCL (`sendcount` / `recvcount`).
    pub nccl_count: u64,
    /// Elements of the GEMM operand that does not move (B for all-gather A, …).
    pub stationary_elements: u64,
    /// Elements of the GEMM output.
    pub gemm_out_elements: u64,
}

impl NcclGemmLayout {
    /// The layout of `kind` for the global problem `m × n × k` on `tp` GPUs; every split
    /// dimension must divide by `tp`.
    pub fn new(kind: NcclGemmKind, m: u64, n: u64, k: u64, tp: u64) -> Result<Self, String> {
        if tp == 0 {
            return Err("TP must be at least 1".into());
        }
        let split = |name: &str, v: u64| {
            if v.is_multiple_of(tp) && v / tp > 0 {
                Ok(v / tp)
            } else {
                Err(format!(
                    "{name} = {v} does not divide into {tp} non-empty shards"
                ))
            }
        };
        Ok(match kind {
            NcclGemmKind::AllGatherA => {
                let (ml, nl) = (split("M", m)?, split("N", n)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(m, nl, k),
                    shard_elements: ml * k,
                    collective_out_elements: m * k,
                    nccl_count: ml * k,
                    stationary_elements: nl * k,
                    gemm_out_elements: m * nl,
                }
            }
            NcclGemmKind::AllGatherB => {
                let (ml, nl) = (split("M", m)?, split("N", n)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(ml, n, k),
                    shard_elements: nl * k,
                    collective_out_elements: n * k,
                    nccl_count: nl * k,
                    stationary_elements: ml * k,
                    gemm_out_elements: ml * n,
                }
            }
            NcclGemmKind::ReduceScatter => {
                let (ml, kl) = (split("M", m)?, split("K", k)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(m, n, kl),
                    // The collective's input is the GEMM output (the partial).
                    shard_elements: m * n,
                    collective_out_elements: ml * n,
                    nccl_count: ml * n,
                    stationary_elements: n * kl,
                    gemm_out_elements: m * n,
                }
            }
        })
    }

    /// Bytes each GPU allocates for this layout with `elem_bytes`-byte elements.
    pub fn bytes_per_gpu(&self, kind: NcclGemmKind, elem_bytes: u64) -> u64 {
        let elems = match kind {
            // shard + gathered + stationary + D
            NcclGemmKind::AllGatherA | NcclGemmKind::AllGatherB => {
                self.shard_elements
                    + self.collective_out_elements
                    + self.stationary_elements
                    + self.gemm_out_elements
            }
            // A K-shard (m·kl = gemm.m·gemm.k) + B K-shard + partial + D block
            NcclGemmKind::ReduceScatter => {
                self.gemm.m * self.gemm.k
                    + self.stationary_elements
                    + self.gemm_out_elements
                    + self.collective_out_elements
            }
        };
        elems * elem_bytes
    }
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

/// Where an NCCL library could be looked for, for error messages.
pub fn nccl_hint() -> String {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join("libnccl.so.2").exists() || d.join("libnccl.so").exists());
    if dirs.is_empty() {
        "no folder on LD_LIBRARY_PATH holds libnccl.so.2".into()
    } else {
        format!(
            "libnccl.so.2 exists in {} but could not be loaded",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_agree_with_cudarc_bindings() {
        assert_eq!(
            nccl_sys::ncclDataType_t::ncclBfloat16 as c_int,
            NCCL_BFLOAT16
        );
        assert_eq!(nccl_sys::ncclDataType_t::ncclFloat16 as c_int, NCCL_FLOAT16);
        assert_eq!(nccl_sys::ncclRedOp_t::ncclSum as c_int, NCCL_SUM);
        assert_eq!(nccl_sys::ncclResult_t::ncclSuccess as u32, NCCL_SUCCESS);
        assert_eq!(
            nccl_sys::ncclResult_t::ncclInProgress as u32,
            NCCL_IN_PROGRESS
        );
        assert_eq!(nccl_result_name(4), "ncclInvalidArgument");
    }

    #[test]
    fn candidates_include_the_pytorch_soname() {
        let c = nccl_library_candidates();
        if std::env::var_os(NCCL_LIB_ENV_VAR).is_none() {
            assert!(c.iter().any(|n| n == "libnccl.so.2"), "{c:?}");
            assert!(c.iter().any(|n| n == "libnccl.so"), "{c:?}");
        }
    }

    #[test]
    fn version_decodes() {
        assert_eq!(nccl_version_string(22708), "2.27.8");
        assert_eq!(nccl_version_string(21903), "2.19.3");
    }

    #[test]
    fn loading_never_panics() {
        match NcclLibrary::load() {
            Ok(lib) => assert!(lib.version > 0),
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("NCCL") && text.contains("LD_LIBRARY_PATH"),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn layouts_of_the_70b_presets_at_tp2() {
        // fc1: 16384 × 57344 × 8192.
        let l = NcclGemmLayout::new(NcclGemmKind::AllGatherA, 16384, 57344, 8192, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(16384, 28672, 8192));
        assert_eq!(l.nccl_count, 8192 * 8192);
        assert_eq!(l.collective_out_elements, 2 * l.nccl_count);
        let l = NcclGemmLayout::new(NcclGemmKind::AllGatherB, 16384, 57344, 8192, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(8192, 57344, 8192));
        assert_eq!(l.nccl_count, 28672 * 8192);
        // fc2: 16384 × 8192 × 28672.
        let l = NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 16384, 8192, 28672, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(16384, 8192, 14336));
        assert_eq!(l.nccl_count, 8192 * 8192);
        assert_eq!(l.shard_elements, 2 * l.nccl_count);
        assert_eq!(
            l.bytes_per_gpu(NcclGemmKind::ReduceScatter, 2),
            2 * (16384 * 14336 + 8192 * 14336 + 16384 * 8192 + 8192 * 8192)
        );
    }

    #[test]
    fn layouts_reject_indivisible_shapes() {
        assert!(NcclGemmLayout::new(NcclGemmKind::AllGatherA, 3, 4, 8, 2).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 4, 4, 6, 4).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 4, 4, 8, 0).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::AllGatherB, 2, 2, 8, 4).is_err());
    }
}
