//! GPU discovery: is there a driver, is it new enough, which GPUs are Hopper (CC 9.0).
//!
//! cudarc loads `libcuda` lazily, on the first driver call, and **panics** when no library
//! name loads (`cudarc::panic_no_lib_found`) or when a symbol is missing (`load` in
//! `cudarc::driver::sys`). distgemm must instead return an error a user can act on, so every
//! entry point here first runs [`probe_driver`]: cudarc's own `is_culib_present()` (which tries
//! the same library names cudarc will load), then `cuDriverGetVersion`, then a check that every
//! driver entry point distgemm calls is exported (so an old driver gives
//! [`RuntimeError::DriverSymbolMissing`] rather than a panic in the middle of a launch), and
//! only then `cuInit`.

use super::error::{MIN_DRIVER_API_VERSION, Result, RuntimeError};
use cudarc::driver::{
    CudaContext, CudaStream, DriverError, result,
    sys::{self, CUdevice_attribute},
};
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// Every driver entry point that distgemm reaches, directly or through cudarc, under the
/// name cudarc's dynamic loader asks for (`_v2` names are the CUDA 13 ABI). Checked once per
/// [`probe_driver`]; add a name here when the runtime starts calling a new one.
const REQUIRED_DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuLaunchKernelEx",
    "cuOccupancyMaxActiveClusters",
    "cuTensorMapEncodeTiled",
    "cuGraphCreate",
    "cuGraphAddKernelNode_v2",
    "cuGraphKernelNodeSetAttribute",
    "cuGraphAddMemcpyNode",
    "cuGraphAddBatchMemOpNode",
    "cuGraphAddDependencies_v2",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphExecMemcpyNodeSetParams",
    "cuGraphGetNodes",
    "cuGraphGetEdges_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// The CUDA version a driver implements (`cuDriverGetVersion`), e.g. 13.0 for driver 580.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DriverVersion {
    /// Major CUDA version.
    pub major: i32,
    /// Minor CUDA version.
    pub minor: i32,
}

impl DriverVersion {
    /// Decodes the driver's `1000 * major + 10 * minor` encoding.
    pub fn from_encoded(encoded: i32) -> Self {
        DriverVersion {
            major: encoded / 1000,
            minor: (encoded % 1000) / 10,
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {}.{}", self.major, self.minor)
    }
}

/// Makes sure driver calls cannot panic, then initialises the driver.
///
/// Order matters: nothing in cudarc's `sys` may be called before `is_culib_present()` says the
/// library loads, because the first call would otherwise panic inside cudarc.
pub fn probe_driver() -> Result<DriverVersion> {
    // SAFETY: `is_culib_present` only tries `dlopen` on cudarc's candidate names.
    if !unsafe { sys::is_culib_present() } {
        let searched = ["cuda", "nvcuda"]
            .iter()
            .flat_map(|l| cudarc::get_lib_name_candidates(l))
            .collect();
        return Err(RuntimeError::DriverNotFound { searched });
    }
    // SAFETY: the library loads (checked above), so `culib` returns it instead of panicking;
    // looking a symbol up does not call it.
    let lib = unsafe { sys::culib() };
    let has = |name: &str| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok();
    if !has("cuDriverGetVersion") {
        return Err(RuntimeError::DriverSymbolMissing {
            symbol: "cuDriverGetVersion",
            major: 0,
            minor: 0,
        });
    }
    let mut encoded = 0;
    // SAFETY: cuDriverGetVersion writes one int and needs no cuInit.
    unsafe { sys::cuDriverGetVersion(&mut encoded) }
        .result()
        .map_err(RuntimeError::driver("cuDriverGetVersion"))?;
    let version = DriverVersion::from_encoded(encoded);
    if encoded < MIN_DRIVER_API_VERSION {
        return Err(RuntimeError::DriverTooOld {
            major: version.major,
            minor: version.minor,
        });
    }
    if let Some(symbol) = REQUIRED_DRIVER_SYMBOLS.iter().find(|s| !has(s)) {
        return Err(RuntimeError::DriverSymbolMissing {
            symbol,
            major: version.major,
            minor: version.minor,
        });
    }
    // cuInit fails with CUDA_ERROR_NO_DEVICE on a machine with a driver but no GPU, and with
    // other codes when the kernel module is not loaded or mismatched: all mean "no usable GPU".
    result::init().map_err(|e| RuntimeError::NoGpu {
        reason: format!("cuInit failed: {e}"),
    })?;
    Ok(version)
}

/// The CUDA version the installed driver implements (probes the driver first).
pub fn driver_version() -> Result<DriverVersion> {
    probe_driver()
}

/// Number of GPUs the driver sees (after [`probe_driver`]).
pub fn device_count() -> Result<usize> {
    probe_driver()?;
    let count = result::device::get_count().map_err(RuntimeError::driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// One Hopper GPU: its primary context (retained through cudarc, one per device) and the
/// properties the planner and the launcher need.
#[derive(Debug, Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    name: String,
    compute_capability: (i32, i32),
    sm_count: u32,
    max_shared_memory_per_block_optin: u32,
    l2_cache_bytes: u32,
    pci_bus_id: String,
}

/// Reads one integer device attribute (`cuDeviceGetAttribute`, no context needed).
fn attribute(dev: sys::CUdevice, attr: CUdevice_attribute) -> Result<i32> {
    // SAFETY: `dev` came from cuDeviceGet after cuInit.
    unsafe { result::device::get_attribute(dev, attr) }
        .map_err(RuntimeError::driver("cuDeviceGetAttribute"))
}

fn attribute_u32(dev: sys::CUdevice, attr: CUdevice_attribute) -> Result<u32> {
    Ok(u32::try_from(attribute(dev, attr)?).unwrap_or(0))
}

impl Gpu {
    /// Opens GPU `ordinal`: checks the driver, that the ordinal exists and that the GPU has
    /// compute capability 9.0, and only then retains its primary context (`cuDevicePrimaryCtxRetain`
    /// through `CudaContext::new`). Properties are read with `cuDeviceGetAttribute` before any
    /// context exists, so a wrong GPU costs no context creation.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let count = device_count()?;
        if count == 0 {
            return Err(RuntimeError::NoGpu {
                reason: "the driver loaded but reports 0 devices".into(),
            });
        }
        if ordinal >= count {
            return Err(RuntimeError::NoSuchGpu { ordinal, count });
        }
        let index =
            i32::try_from(ordinal).map_err(|_| RuntimeError::NoSuchGpu { ordinal, count })?;
        let dev = result::device::get(index).map_err(RuntimeError::driver("cuDeviceGet"))?;
        let name =
            result::device::get_name(dev).map_err(RuntimeError::driver("cuDeviceGetName"))?;
        let major = attribute(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        if (major, minor) != (9, 0) {
            return Err(RuntimeError::NotHopper {
                ordinal,
                name,
                major,
                minor,
            });
        }
        let sm_count = attribute_u32(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let max_shared_memory_per_block_optin = attribute_u32(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        let l2_cache_bytes =
            attribute_u32(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
        let pci_bus_id = format!(
            "{:08X}:{:02X}:{:02X}.0",
            attribute(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attribute(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attribute(dev, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        );
        let ctx =
            CudaContext::new(ordinal).map_err(RuntimeError::driver("cuDevicePrimaryCtxRetain"))?;
        Ok(Gpu {
            ctx,
            name,
            compute_capability: (major, minor),
            sm_count,
            max_shared_memory_per_block_optin,
            l2_cache_bytes,
            pci_bus_id,
        })
    }

    /// The GPU's UUID, as [`device_uuid`] gives it.
    pub fn uuid(&self) -> Result<String> {
        device_uuid(self.ordinal())
    }

    /// PCI address `DDDDDDDD:BB:DD.0` (hex), the key NVML and `nvidia-smi` know the GPU by.
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// The cudarc context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Device name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (always (9, 0) for an opened `Gpu`).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Number of streaming multiprocessors (132 on H200).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Largest dynamic shared memory a block may opt in to (232 448 B on H200).
    pub fn max_shared_memory_per_block_optin(&self) -> u32 {
        self.max_shared_memory_per_block_optin
    }

    /// L2 cache size in bytes (60 MiB on H200).
    pub fn l2_cache_bytes(&self) -> u32 {
        self.l2_cache_bytes
    }

    /// Makes this GPU's context current on the calling thread (needed before raw driver calls).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(RuntimeError::driver("cuCtxSetCurrent"))
    }

    /// A new non-blocking stream on this GPU (cudarc `CudaContext::new_stream`).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(RuntimeError::driver("cuStreamCreate"))
    }

    /// Waits for all work on this GPU's context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(RuntimeError::driver("cuCtxSynchronize"))
    }

    /// `(free, total)` bytes of device memory (`cuMemGetInfo`), as the driver sees them for
    /// every process on the GPU.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(RuntimeError::driver("cuMemGetInfo"))
    }

    /// Whether this GPU can read and write `peer`'s memory directly (`cuDeviceCanAccessPeer`).
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        if self.ordinal() == peer.ordinal() {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: both devices are valid handles from cuDeviceGet; one int is written.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device()) }
            .result()
            .map_err(RuntimeError::driver("cuDeviceCanAccessPeer"))?;
        Ok(can != 0)
    }

    /// Lets kernels and copies in this GPU's context access `peer`'s `cuMemAlloc` memory
    /// (`cuCtxEnablePeerAccess(peer_ctx)` with this context current). One direction only; see
    /// [`enable_peer_access_between`]. Enabling twice is not an error. Peer access covers
    /// `cuMemAlloc` memory, not stream-ordered pools: that is why [`super::DeviceBuffer`] uses
    /// `cuMemAlloc`.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if self.ordinal() == peer.ordinal() {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(RuntimeError::NoPeerAccess {
                from: self.ordinal(),
                to: peer.ordinal(),
            });
        }
        self.bind()?;
        // SAFETY: this context is current and `peer`'s context is alive (we hold its Arc).
        match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) }.result() {
            Ok(()) => Ok(()),
            Err(DriverError(sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) => Ok(()),
            Err(source) => Err(RuntimeError::Driver {
                call: "cuCtxEnablePeerAccess",
                source,
            }),
        }
    }
}

/// Enables peer access in both directions between `a` and `b`, or says which direction the
/// hardware does not allow.
pub fn enable_peer_access_between(a: &Gpu, b: &Gpu) -> Result<()> {
    a.enable_peer_access(b)?;
    b.enable_peer_access(a)
}

/// The UUID of GPU `ordinal` (`cuDeviceGetUuid`) as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
/// as `nvidia-smi -L` prints it: the name by which processes with different
/// `CUDA_VISIBLE_DEVICES` agree on a GPU. Needs no context.
pub fn device_uuid(ordinal: usize) -> Result<String> {
    let dev = cu_device(ordinal)?;
    let mut raw = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: `raw` is an out-parameter; `dev` came from cuDeviceGet.
    unsafe { sys::cuDeviceGetUuid_v2(&mut raw, dev) }
        .result()
        .map_err(RuntimeError::driver("cuDeviceGetUuid"))?;
    let bytes: Vec<u8> = raw.bytes.iter().map(|&x| x as u8).collect();
    let hex = |r: std::ops::Range<usize>| -> String {
        bytes[r].iter().map(|x| format!("{x:02x}")).collect()
    };
    Ok(format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    ))
}

/// What GPU `from` can do with GPU `to`'s memory (`cuDeviceGetP2PAttribute`; no context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSupport {
    /// Loads, stores and copies (`CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`).
    pub access: bool,
    /// Atomics performed natively over the link (`…_NATIVE_ATOMIC_SUPPORTED`), which the
    /// flags and the barrier counter need.
    pub native_atomics: bool,
}

/// [`PeerSupport`] of GPU ordinal `from` towards `to` (distinct GPUs).
pub fn peer_support(from: usize, to: usize) -> Result<PeerSupport> {
    let (src, dst) = (cu_device(from)?, cu_device(to)?);
    let query = |attr: sys::CUdevice_P2PAttribute| -> Result<bool> {
        let mut value = 0;
        // SAFETY: out-parameter; both devices came from cuDeviceGet.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attr, src, dst) }
            .result()
            .map_err(RuntimeError::driver("cuDeviceGetP2PAttribute"))?;
        Ok(value != 0)
    };
    Ok(PeerSupport {
        access: query(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?,
        native_atomics: query(
            sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
        )?,
    })
}

/// Checks that GPU `from` can use GPU `to`'s memory the way distgemm's cross-GPU protocol
/// does: loads, stores and copies ([`RuntimeError::NoPeerAccess`] otherwise) and native
/// atomics for the flags and the barrier counter ([`RuntimeError::NoPeerAtomics`]).
pub fn require_peer_link(from: usize, to: usize) -> Result<()> {
    let support = peer_support(from, to)?;
    if !support.access {
        return Err(RuntimeError::NoPeerAccess { from, to });
    }
    if !support.native_atomics {
        return Err(RuntimeError::NoPeerAtomics { from, to });
    }
    Ok(())
}

/// The driver's handle of GPU `ordinal`, after checking the driver and the ordinal.
fn cu_device(ordinal: usize) -> Result<sys::CUdevice> {
    let count = device_count()?;
    let index = i32::try_from(ordinal)
        .ok()
        .filter(|_| ordinal < count)
        .ok_or(RuntimeError::NoSuchGpu { ordinal, count })?;
    result::device::get(index).map_err(RuntimeError::driver("cuDeviceGet"))
}

/// Opens every visible GPU; fails (naming the GPU) unless all are compute capability 9.0, and
/// fails if there is none. Restrict the set with `CUDA_VISIBLE_DEVICES`.
pub fn hopper_gpus() -> Result<Vec<Gpu>> {
    let count = device_count()?;
    if count == 0 {
        return Err(RuntimeError::NoGpu {
            reason: "the driver loaded but reports 0 devices".into(),
        });
    }
    (0..count).map(Gpu::open).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_version_decodes_the_driver_encoding() {
        assert_eq!(
            DriverVersion::from_encoded(13000),
            DriverVersion {
                major: 13,
                minor: 0
            }
        );
        assert_eq!(
            DriverVersion::from_encoded(12060),
            DriverVersion {
                major: 12,
                minor: 6
            }
        );
        assert_eq!(DriverVersion::from_encoded(12080).to_string(), "CUDA 12.8");
    }

    #[test]
    fn discovery_returns_an_error_or_gpus_but_never_panics() {
        match hopper_gpus() {
            Ok(gpus) => assert!(gpus.iter().all(|g| g.compute_capability() == (9, 0))),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
