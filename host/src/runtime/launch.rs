//! Kernel launches through `cuLaunchKernelEx`.
//!
//! `cuLaunchKernelEx` (CUDA 12.0) takes launch attributes, which cudarc's launch builder does
//! not expose. distgemm needs two:
//! - `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`: thread-block clusters (TMA multicast, DSMEM);
//! - `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: programmatic dependent launch
//!   (PDL). The kernel launched with it may start once every CTA of the previous kernel in the
//!   stream has executed `griddepcontrol.launch_dependents` (or exited); it must execute
//!   `griddepcontrol.wait` before reading that kernel's output. Under stream capture the
//!   attribute becomes a programmatic graph edge.
//!
//! [`LaunchConfig::validate`] checks a configuration against the device limits without a
//! GPU, so bad configurations get a message instead of `CUDA_ERROR_INVALID_VALUE`.

use super::error::{Result, RuntimeError};
use super::memory::{DeviceBuffer, DeviceCopy};
use super::module::Kernel;
use cudarc::driver::{CudaStream, sys};
use std::ffi::c_void;

/// Grid, block, shared memory and attributes of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks per grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub dynamic_smem: u32,
    /// Thread-block cluster shape, if any; the grid must be a multiple of it.
    pub cluster: Option<(u32, u32, u32)>,
    /// Launch with programmatic stream serialization (PDL secondary).
    pub programmatic_serialization: bool,
}

/// The device limits a launch is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchLimits {
    /// Dynamic shared memory a launch may ask for (opt-in maximum minus static shared memory).
    pub max_dynamic_smem: u32,
}

/// Threads per block on every CUDA GPU.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Largest portable cluster (more needs `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`).
pub const MAX_PORTABLE_CLUSTER_SIZE: u32 = 8;

impl LaunchConfig {
    /// A 1-D launch: `grid_x` blocks of `block_x` threads, no shared memory, no attributes.
    #[must_use]
    pub fn linear(grid_x: u32, block_x: u32) -> Self {
        LaunchConfig {
            grid: (grid_x, 1, 1),
            block: (block_x, 1, 1),
            dynamic_smem: 0,
            cluster: None,
            programmatic_serialization: false,
        }
    }

    /// A 1-D launch covering `n` items with `block_x` threads per block (`ceil(n / block_x)`
    /// blocks).
    #[must_use]
    pub fn for_items(n: u32, block_x: u32) -> Self {
        Self::linear(n.div_ceil(block_x.max(1)), block_x)
    }

    /// The same launch with `bytes` of dynamic shared memory.
    #[must_use]
    pub fn with_dynamic_smem(self, bytes: u32) -> Self {
        LaunchConfig {
            dynamic_smem: bytes,
            ..self
        }
    }

    /// The same launch in clusters of `dims` blocks.
    #[must_use]
    pub fn with_cluster(self, dims: (u32, u32, u32)) -> Self {
        LaunchConfig {
            cluster: Some(dims),
            ..self
        }
    }

    /// The same launch with programmatic stream serialization on or off.
    #[must_use]
    pub fn with_programmatic_serialization(self, on: bool) -> Self {
        LaunchConfig {
            programmatic_serialization: on,
            ..self
        }
    }

    /// Checks the configuration against the CUDA limits and `limits`; the error says which
    /// rule failed.
    pub fn validate(&self, limits: &LaunchLimits) -> Result<(), String> {
        let (gx, gy, gz) = self.grid;
        let (bx, by, bz) = self.block;
        if gx == 0 || gy == 0 || gz == 0 {
            return Err(format!("grid {:?} has a zero dimension", self.grid));
        }
        if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return Err(format!(
                "grid {:?} exceeds (2^31 − 1, 65535, 65535)",
                self.grid
            ));
        }
        if bx == 0 || by == 0 || bz == 0 {
            return Err(format!("block {:?} has a zero dimension", self.block));
        }
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if threads > u64::from(MAX_THREADS_PER_BLOCK) || bz > 64 {
            return Err(format!(
                "block {:?} has {threads} threads: at most {MAX_THREADS_PER_BLOCK} per block \
                 (and z ≤ 64)",
                self.block
            ));
        }
        if self.dynamic_smem > limits.max_dynamic_smem {
            return Err(format!(
                "{} bytes of dynamic shared memory exceed the {} bytes this kernel may use \
                 (the device's opt-in maximum minus the kernel's static shared memory)",
                self.dynamic_smem, limits.max_dynamic_smem
            ));
        }
        if let Some((cx, cy, cz)) = self.cluster {
            if cx == 0 || cy == 0 || cz == 0 {
                return Err(format!("cluster {:?} has a zero dimension", (cx, cy, cz)));
            }
            let size = u64::from(cx) * u64::from(cy) * u64::from(cz);
            if size > u64::from(MAX_PORTABLE_CLUSTER_SIZE) {
                return Err(format!(
                    "cluster {:?} has {size} blocks: at most {MAX_PORTABLE_CLUSTER_SIZE} (portable size)",
                    (cx, cy, cz)
                ));
            }
            if gx % cx != 0 || gy % cy != 0 || gz % cz != 0 {
                return Err(format!(
                    "grid {:?} is not divisible by cluster {:?}",
                    self.grid,
                    (cx, cy, cz)
                ));
            }
        }
        Ok(())
    }
}

/// One kernel parameter, stored by value until launch.
#[derive(Debug, Clone, PartialEq)]
enum Arg {
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    /// A `#[repr(C)]` struct passed by value, stored as 8-byte words so its address is aligned.
    Struct(Box<[u64]>),
}

/// The parameters of a launch, in the kernel's order. Pointers are device addresses (`u64`),
/// which is how every distgemm kernel takes them (including tensor maps, §2.4 method A).
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use]
pub struct KernelArgs {
    args: Vec<Arg>,
}

impl KernelArgs {
    /// No parameters yet.
    pub fn new() -> Self {
        KernelArgs::default()
    }

    /// Appends a `u32`.
    pub fn u32(mut self, v: u32) -> Self {
        self.args.push(Arg::U32(v));
        self
    }

    /// Appends an `i32`.
    pub fn i32(mut self, v: i32) -> Self {
        self.args.push(Arg::I32(v));
        self
    }

    /// Appends a `u64` (also: a raw device address, a tensor map's address).
    pub fn u64(mut self, v: u64) -> Self {
        self.args.push(Arg::U64(v));
        self
    }

    /// Appends an `f32`.
    pub fn f32(mut self, v: f32) -> Self {
        self.args.push(Arg::F32(v));
        self
    }

    /// Appends a `#[repr(C)]` plain-data struct passed by value (e.g. `kernels_gpu::gemm_abi::GemmParams`).
    /// Its alignment must be at most 16 bytes, as rustc declares the kernel's `.param` (the
    /// build may raise it further: `xtask` `patch_entry_param_0`); the driver copies the bytes,
    /// so the host copy's own alignment does not matter.
    pub fn by_value<T: Copy>(mut self, v: &T) -> Self {
        const { assert!(std::mem::align_of::<T>() <= 16) };
        let words = std::mem::size_of::<T>().div_ceil(8);
        let mut storage = vec![0u64; words].into_boxed_slice();
        // SAFETY: `storage` has at least size_of::<T>() bytes and is only written bytewise (never
        // read as a T here); T is Copy (plain data, no drop).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (v as *const T).cast::<u8>(),
                storage.as_mut_ptr().cast::<u8>(),
                std::mem::size_of::<T>(),
            )
        };
        self.args.push(Arg::Struct(storage));
        self
    }

    /// Appends the device address of `buffer` (for `*const T` / `*mut T` parameters).
    pub fn ptr<T: DeviceCopy>(self, buffer: &DeviceBuffer<T>) -> Self {
        self.u64(buffer.device_ptr())
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The `void**` array `cuLaunchKernelEx` takes: one pointer to each stored value. The
    /// pointers borrow `self` mutably, so the values cannot move while the array is alive.
    pub(super) fn param_pointers(&mut self) -> Vec<*mut c_void> {
        self.args
            .iter_mut()
            .map(|a| match a {
                Arg::U32(v) => (v as *mut u32).cast(),
                Arg::I32(v) => (v as *mut i32).cast(),
                Arg::U64(v) => (v as *mut u64).cast(),
                Arg::F32(v) => (v as *mut f32).cast(),
                Arg::Struct(words) => words.as_mut_ptr().cast(),
            })
            .collect()
    }
}

/// Builds the attribute list for `cuLaunchKernelEx`.
fn launch_attributes(cfg: &LaunchConfig) -> Vec<sys::CUlaunchAttribute> {
    let mut attrs = Vec::new();
    if let Some((x, y, z)) = cfg.cluster {
        // SAFETY: CUlaunchAttribute is plain data (an id and a union of plain data); all-zero
        // is a valid value that we then overwrite field by field.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
        attrs.push(a);
    }
    if cfg.programmatic_serialization {
        // SAFETY: as above.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        a.value.programmaticStreamSerializationAllowed = 1;
        attrs.push(a);
    }
    attrs
}

/// The driver's launch configuration for `cfg` on `stream` (null for occupancy queries); it
/// points into `attrs`, which must outlive it.
fn raw_config(
    cfg: &LaunchConfig,
    stream: sys::CUstream,
    attrs: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: cfg.grid.0,
        gridDimY: cfg.grid.1,
        gridDimZ: cfg.grid.2,
        blockDimX: cfg.block.0,
        blockDimY: cfg.block.1,
        blockDimZ: cfg.block.2,
        sharedMemBytes: cfg.dynamic_smem,
        hStream: stream,
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: attrs.len() as u32,
    }
}

/// How many clusters of `cfg.cluster` blocks (with `cfg`'s block size and dynamic shared
/// memory) the GPU can hold at once (`cuOccupancyMaxActiveClusters`). A persistent kernel
/// launched in clusters must not have more: clusters beyond it run as a second wave. Not every
/// SM can join a cluster (a GPC's SM count need not be a multiple of the cluster size), so this
/// can be below `SMs / cluster size`.
pub fn max_active_clusters(kernel: &Kernel, cfg: &LaunchConfig) -> Result<u32> {
    kernel.reserve_dynamic_smem(cfg.dynamic_smem)?;
    let mut attrs = launch_attributes(cfg);
    let raw_cfg = raw_config(cfg, std::ptr::null_mut(), &mut attrs);
    let mut clusters = 0;
    kernel.gpu().bind()?;
    // SAFETY: `raw_cfg` and the attributes it points to live across the call; one int is written.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, kernel.cu_function(), &raw_cfg) }
        .result()
        .map_err(RuntimeError::driver("cuOccupancyMaxActiveClusters"))?;
    Ok(clusters.max(0) as u32)
}

/// Enqueues `kernel` on `stream` with `cfg` and `args` (`cuLaunchKernelEx`).
///
/// Checks first: the configuration against the device ([`LaunchConfig::validate`]), that the
/// stream belongs to the kernel's GPU, and raises the kernel's dynamic-shared-memory limit when
/// `cfg` needs more than 48 KiB.
///
/// # Safety
/// The kernel runs with whatever `args` say: their number and types must match the kernel's
/// signature, and every address must point to live device memory of the right size (or a
/// tensor map over such memory) for as long as the kernel runs.
pub unsafe fn launch(
    kernel: &Kernel,
    stream: &CudaStream,
    cfg: &LaunchConfig,
    args: &mut KernelArgs,
) -> Result<()> {
    let gpu = kernel.gpu();
    let invalid = |reason: String| RuntimeError::InvalidLaunch {
        kernel: kernel.name().to_owned(),
        reason,
    };
    let limits = LaunchLimits {
        max_dynamic_smem: kernel.max_dynamic_smem(),
    };
    cfg.validate(&limits).map_err(invalid)?;
    if stream.context().ordinal() != gpu.ordinal() {
        return Err(invalid(format!(
            "the stream belongs to GPU {} but the kernel is loaded on GPU {}",
            stream.context().ordinal(),
            gpu.ordinal()
        )));
    }
    kernel.reserve_dynamic_smem(cfg.dynamic_smem)?;
    let mut attrs = launch_attributes(cfg);
    let raw_cfg = raw_config(cfg, stream.cu_stream(), &mut attrs);
    let mut params = args.param_pointers();
    gpu.bind()?;
    // SAFETY: `raw_cfg`, `attrs` and `params` (pointing into `args`) live across the call; the
    // driver copies parameters before returning. Argument validity is the caller's contract.
    unsafe {
        sys::cuLaunchKernelEx(
            &raw_cfg,
            kernel.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(RuntimeError::driver("cuLaunchKernelEx"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: LaunchLimits = LaunchLimits {
        max_dynamic_smem: 232_448,
    };

    #[test]
    fn ordinary_launches_are_valid() {
        assert_eq!(LaunchConfig::for_items(1_000_003, 256).grid, (3907, 1, 1));
        assert_eq!(
            LaunchConfig::for_items(1_000_003, 256).validate(&H200),
            Ok(())
        );
        let gemm = LaunchConfig::linear(132, 384)
            .with_dynamic_smem(227 * 1024)
            .with_cluster((2, 1, 1))
            .with_programmatic_serialization(true);
        assert_eq!(gemm.validate(&H200), Ok(()));
    }

    #[test]
    fn grid_must_divide_by_cluster() {
        let e = LaunchConfig::linear(133, 128)
            .with_cluster((2, 1, 1))
            .validate(&H200)
            .unwrap_err();
        assert!(e.contains("not divisible by cluster"), "{e}");
        let e = LaunchConfig::linear(16, 128)
            .with_cluster((16, 1, 1))
            .validate(&H200)
            .unwrap_err();
        assert!(e.contains("portable"), "{e}");
        assert!(
            LaunchConfig::linear(16, 128)
                .with_cluster((0, 1, 1))
                .validate(&H200)
                .is_err()
        );
    }

    #[test]
    fn blocks_are_limited_to_1024_threads() {
        let mut cfg = LaunchConfig::linear(1, 1025);
        assert!(cfg.validate(&H200).unwrap_err().contains("1024"));
        cfg.block = (32, 32, 2);
        assert!(cfg.validate(&H200).is_err());
        cfg.block = (32, 32, 1);
        assert_eq!(cfg.validate(&H200), Ok(()));
        cfg.block = (0, 1, 1);
        assert!(cfg.validate(&H200).unwrap_err().contains("zero"));
    }

    #[test]
    fn shared_memory_is_limited_to_the_opt_in_maximum() {
        let e = LaunchConfig::linear(1, 128)
            .with_dynamic_smem(232_449)
            .validate(&H200)
            .unwrap_err();
        assert!(e.contains("232448"), "{e}");
    }

    #[test]
    fn grid_limits() {
        assert!(LaunchConfig::linear(0, 128).validate(&H200).is_err());
        let mut cfg = LaunchConfig::linear(1, 128);
        cfg.grid = (1, 65536, 1);
        assert!(cfg.validate(&H200).is_err());
    }

    #[test]
    fn params_point_at_their_values() {
        let mut args = KernelArgs::new()
            .u32(7)
            .u64(0xdead_beef_0000)
            .f32(1.5)
            .i32(-3);
        assert_eq!(args.len(), 4);
        let p = args.param_pointers();
        // SAFETY: the pointers point into `args`, which is alive and unchanged.
        unsafe {
            assert_eq!(*(p[0] as *const u32), 7);
            assert_eq!(*(p[1] as *const u64), 0xdead_beef_0000);
            assert_eq!(*(p[2] as *const f32), 1.5);
            assert_eq!(*(p[3] as *const i32), -3);
        }
    }

    #[test]
    fn attributes_follow_the_config() {
        assert!(launch_attributes(&LaunchConfig::linear(1, 1)).is_empty());
        let cfg = LaunchConfig::linear(4, 1)
            .with_cluster((2, 1, 1))
            .with_programmatic_serialization(true);
        let attrs = launch_attributes(&cfg);
        assert_eq!(attrs.len(), 2);
        assert_eq!(
            attrs[0].id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        );
        // SAFETY: reading the union field that was written.
        assert_eq!(unsafe { attrs[0].value.clusterDim }.x, 2);
        assert_eq!(
            attrs[1].id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
        // SAFETY: as above.
        assert_eq!(
            unsafe { attrs[1].value.programmaticStreamSerializationAllowed },
            1
        );
    }
}
