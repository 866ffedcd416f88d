//! The one error type of the runtime.
//!
//! Every message says what went wrong *and* what the user can do about it: install or expose a
//! driver, pick another GPU, build the PTX, fix a launch configuration. Driver failures keep the
//! name of the driver call and cudarc's [`DriverError`] (whose text is `cuGetErrorString`'s).

use cudarc::driver::DriverError;
use std::path::PathBuf;

/// Result alias of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Oldest driver API version distgemm accepts: 12.6, shipped with driver 560.
pub const MIN_DRIVER_API_VERSION: i32 = 12060;

/// Everything that can go wrong between distgemm and the CUDA driver.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// `libcuda.so` could not be loaded under any of the names cudarc tries.
    #[error(
        "no CUDA driver (libcuda.so) found: distgemm needs an NVIDIA driver ≥ 560 (CUDA 12.6 or \
         newer; it is tested with 580 / CUDA 13.0). Install the driver, or add the folder \
         that holds libcuda.so.1 to LD_LIBRARY_PATH"
    )]
    DriverNotFound {
        /// The library names that were tried (cudarc's candidates).
        searched: Vec<String>,
    },

    /// The driver is older than [`MIN_DRIVER_API_VERSION`].
    #[error(
        "the CUDA driver is too old: it implements CUDA {major}.{minor}, distgemm needs CUDA 12.6 \
         or newer (NVIDIA driver ≥ 560); update the NVIDIA driver"
    )]
    DriverTooOld {
        /// Major CUDA version the driver implements.
        major: i32,
        /// Minor CUDA version the driver implements.
        minor: i32,
    },

    /// The driver library loaded but lacks an entry point distgemm calls.
    #[error(
        "the CUDA driver (CUDA {major}.{minor}) has no entry point `{symbol}`, which distgemm \
         calls; update the NVIDIA driver (≥ 580 / CUDA 13.0 is what distgemm is tested with)"
    )]
    DriverSymbolMissing {
        /// The missing symbol.
        symbol: &'static str,
        /// Major CUDA version the driver implements.
        major: i32,
        /// Minor CUDA version the driver implements.
        minor: i32,
    },

    /// The driver is there but sees no GPU.
    #[error(
        "no CUDA GPU is usable: {reason}. Check `nvidia-smi`, and that CUDA_VISIBLE_DEVICES \
         (if set) names a GPU"
    )]
    NoGpu {
        /// What the driver said.
        reason: String,
    },

    /// A device ordinal beyond the number of visible GPUs.
    #[error("GPU {ordinal} does not exist: the driver sees {count} GPU(s) (ordinals 0..{count})")]
    NoSuchGpu {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many GPUs the driver sees.
        count: usize,
    },

    /// The GPU is not a Hopper GPU of compute capability 9.0.
    #[error(
        "GPU {ordinal} ({name}) has compute capability {major}.{minor}, but distgemm's kernels are \
         sm_90a PTX, which runs only on compute capability 9.0 (H100, H200, GH200); pick a Hopper \
         GPU with CUDA_VISIBLE_DEVICES"
    )]
    NotHopper {
        /// Device ordinal.
        ordinal: usize,
        /// Device name as the driver reports it.
        name: String,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
    },

    /// Two GPUs cannot reach each other's memory directly.
    #[error(
        "GPU {from} cannot access the memory of GPU {to} (cuDeviceCanAccessPeer = 0): \
         distgemm's multi-GPU path needs NVLink (or PCIe P2P) peer access between every pair"
    )]
    NoPeerAccess {
        /// The accessing device.
        from: usize,
        /// The device whose memory would be accessed.
        to: usize,
    },

    /// Two GPUs whose atomics on each other's memory are not native.
    #[error(
        "GPU {from} cannot perform atomics on the memory of GPU {to} natively \
         (CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED = 0): distgemm's cross-GPU flags and \
         barrier need native peer atomics (NVLink) between every pair"
    )]
    NoPeerAtomics {
        /// The device performing the atomics.
        from: usize,
        /// The device whose memory they target.
        to: usize,
    },

    /// No PTX: neither embedded at build time nor given through `DISTGEMM_PTX`.
    #[error(
        "no PTX for the GPU kernels: this binary was built with neither \
         target/ptx/kernels_gpu.ptx (written by `cargo xtask build-ptx`) nor the committed \
         host/ptx/kernels_gpu.ptx, and DISTGEMM_PTX is not set. Run `cargo xtask build-ptx` and \
         rebuild, or set DISTGEMM_PTX=<path to kernels_gpu.ptx>"
    )]
    PtxMissing,

    /// `DISTGEMM_PTX` names a file that cannot be read.
    #[error(
        "cannot read the PTX file {path} named by DISTGEMM_PTX: {source}. Point DISTGEMM_PTX at \
         the kernels_gpu.ptx written by `cargo xtask build-ptx`, or unset it to use the embedded PTX"
    )]
    PtxUnreadable {
        /// The path from the environment.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },

    /// The PTX text cannot be handed to the driver at all (e.g. it contains a NUL byte).
    #[error("the PTX from {origin} is not valid PTX text: {reason}")]
    PtxMalformed {
        /// Where the PTX came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The driver's JIT (ptxas) rejected the PTX.
    #[error(
        "the CUDA driver rejected the PTX from {origin} ({source}); the JIT said:\n{log}\n\
         Rebuild it with `cargo xtask build-ptx` (and check it with `cargo xtask check-ptx`)"
    )]
    PtxRejected {
        /// Where the PTX came from.
        origin: String,
        /// The `cuModuleLoadDataEx` error.
        source: DriverError,
        /// The JIT error log (and info log), or a note that it was empty.
        log: String,
    },

    /// A kernel name that the loaded module does not define.
    #[error(
        "kernel `{name}` is not in the PTX module from {origin}; kernels-gpu declares: {known}. \
         Rebuild the PTX with `cargo xtask build-ptx` if the kernel was added recently"
    )]
    KernelNotInModule {
        /// The name asked for.
        name: String,
        /// Where the PTX came from.
        origin: String,
        /// The names in `kernels_gpu::meta::KERNELS`, comma-separated.
        known: String,
    },

    /// A launch configuration the hardware or the kernel cannot run.
    #[error("invalid launch of kernel `{kernel}`: {reason}")]
    InvalidLaunch {
        /// The kernel.
        kernel: String,
        /// What is wrong with the configuration.
        reason: String,
    },

    /// Tensor-map parameters `cuTensorMapEncodeTiled` would refuse (checked before calling it).
    #[error("invalid tensor map: {0}")]
    InvalidTensorMap(String),

    /// A host/device copy whose lengths do not match.
    #[error(
        "{op}: the device buffer holds {device_len} elements but the host slice has {host_len}"
    )]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Elements in the device buffer.
        device_len: usize,
        /// Elements in the host slice.
        host_len: usize,
    },

    /// A byte size that overflows `usize`.
    #[error("{what}: {count} elements of {elem_bytes} bytes overflow the address space")]
    SizeOverflow {
        /// What was being sized.
        what: &'static str,
        /// Element count.
        count: usize,
        /// Bytes per element.
        elem_bytes: usize,
    },

    /// A CUDA graph that does not have the shape the caller expected.
    #[error("CUDA graph: {0}")]
    Graph(String),

    /// Memory shared between processes (CUDA IPC) that cannot be used as given.
    #[error("CUDA IPC: {0}")]
    Ipc(String),

    /// Any other driver call that failed.
    #[error("{call} failed: {source}")]
    Driver {
        /// The driver entry point (or cudarc wrapper) that failed.
        call: &'static str,
        /// The driver's error.
        source: DriverError,
    },
}

impl RuntimeError {
    /// Wraps a driver error with the name of the call that returned it.
    pub fn driver(call: &'static str) -> impl FnOnce(DriverError) -> RuntimeError {
        move |source| RuntimeError::Driver { call, source }
    }
}
