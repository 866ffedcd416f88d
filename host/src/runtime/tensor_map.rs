//! TMA tensor maps for row-major 2-D matrices, built with `cuTensorMapEncodeTiled` and kept
//! in device memory.
//!
//! A `CUtensorMap` is a 128-byte opaque descriptor that `cp.async.bulk.tensor` reads through
//! the tensormap proxy. Passing it by value from Rust does not work today (rustc emits the
//! `.param` with `.align 16` or ICEs on larger alignment), so we use
//! method A: the map is copied into a 128-byte-aligned `cuMemAlloc` block and the kernel gets
//! that block's device address as a `u64`. Create a map once per (pointer, shape) and do not
//! rewrite it while kernels that use it may be running.
//!
//! Geometry of a matrix of `rows × cols` elements with leading dimension `ld` (elements):
//! `globalDim = {cols, rows}` (innermost first), `globalStrides = {ld · elem_bytes}`,
//! `boxDim = {box_cols, box_rows}`, `elementStrides = {1, 1}`. Coordinates given to the TMA
//! instruction are element coordinates `{col, row}`. Out-of-bounds elements of a box are read
//! as zero and clipped on store (`OOB_FILL_NONE`).

use super::caller_stream::{RawStream, upload_async};
use super::device::Gpu;
use super::error::{Result, RuntimeError};
use super::memory::{DeviceBuffer, DeviceCopy};
use cudarc::driver::{CudaStream, sys};
use std::ffi::c_void;

/// Element type of the matrix a map describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMapDtype {
    /// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16`.
    Bf16,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT16`.
    F16,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT32`.
    F32,
}

impl TensorMapDtype {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            TensorMapDtype::Bf16 | TensorMapDtype::F16 => 2,
            TensorMapDtype::F32 => 4,
        }
    }

    fn raw(self) -> sys::CUtensorMapDataType {
        match self {
            TensorMapDtype::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TensorMapDtype::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            TensorMapDtype::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// Shared-memory swizzle the TMA applies (see `kernels_gpu::layout::swizzle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swizzle {
    /// No swizzle.
    None,
    /// 32-byte swizzle span.
    B32,
    /// 64-byte swizzle span.
    B64,
    /// 128-byte swizzle span: what the wgmma SW128 K-major descriptors expect.
    B128,
}

impl Swizzle {
    /// Bytes the innermost box dimension may span under this swizzle (`None`: unlimited).
    pub fn span_bytes(self) -> Option<u64> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    /// The swizzle whose span is `bytes` (32, 64 or 128), if any.
    #[must_use]
    pub fn with_span_bytes(bytes: u32) -> Option<Self> {
        [Swizzle::B32, Swizzle::B64, Swizzle::B128]
            .into_iter()
            .find(|s| s.span_bytes() == Some(u64::from(bytes)))
    }

    fn raw(self) -> sys::CUtensorMapSwizzle {
        match self {
            Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// How wide the L2 makes a TMA load's requests (`CUtensorMapL2promotion`): a miss fetches the
/// whole aligned span around the requested sectors from DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Promotion {
    /// 128-byte spans: for a 16-bit operand in 64-column boxes, exactly one box row.
    B128,
    /// 256-byte spans: a box row's miss also brings the next 128 bytes of the row (for the GEMM
    /// operands, the same row of the next k-block) into L2: a one-k-block prefetch.
    B256,
}

impl L2Promotion {
    fn raw(self) -> sys::CUtensorMapL2promotion {
        match self {
            L2Promotion::B128 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            L2Promotion::B256 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        }
    }
}

/// What a [`TensorMap2d`] describes: a row-major matrix and the box one TMA copy moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// Element type.
    pub dtype: TensorMapDtype,
    /// Rows of the matrix.
    pub rows: u64,
    /// Columns of the matrix (the contiguous dimension).
    pub cols: u64,
    /// Leading dimension: elements between the starts of consecutive rows (≥ `cols`).
    pub ld: u64,
    /// Box width in elements (innermost).
    pub box_cols: u32,
    /// Box height in rows.
    pub box_rows: u32,
    /// Shared-memory swizzle.
    pub swizzle: Swizzle,
    /// L2 promotion of the loads.
    pub l2_promotion: L2Promotion,
}

impl TensorMapSpec {
    /// A map of a `rows × cols` row-major matrix with leading dimension `ld`, moved in boxes of
    /// `box_cols × box_rows`, with the 128-byte swizzle and 256-byte L2 promotion (DeepGEMM's
    /// choice; NOTES step 40a).
    #[must_use]
    pub fn new(
        dtype: TensorMapDtype,
        rows: u64,
        cols: u64,
        ld: u64,
        box_cols: u32,
        box_rows: u32,
    ) -> Self {
        TensorMapSpec {
            dtype,
            rows,
            cols,
            ld,
            box_cols,
            box_rows,
            swizzle: Swizzle::B128,
            l2_promotion: L2Promotion::B256,
        }
    }

    /// The same spec with another swizzle.
    #[must_use]
    pub fn with_swizzle(self, swizzle: Swizzle) -> Self {
        TensorMapSpec { swizzle, ..self }
    }

    /// The same spec with another L2 promotion.
    #[must_use]
    pub fn with_l2_promotion(self, l2_promotion: L2Promotion) -> Self {
        TensorMapSpec {
            l2_promotion,
            ..self
        }
    }

    /// Elements a buffer must hold for this matrix: `(rows − 1) · ld + cols`.
    pub fn required_elements(&self) -> u64 {
        self.rows
            .saturating_sub(1)
            .saturating_mul(self.ld)
            .saturating_add(self.cols)
    }

    /// Checks what `cuTensorMapEncodeTiled` requires (the CUDA driver API documentation)
    /// for a matrix starting at device address `base`, so that bad input gets a message naming
    /// the rule rather than `CUDA_ERROR_INVALID_VALUE`.
    pub fn validate(&self, base: u64) -> Result<(), String> {
        let elem = self.dtype.size_bytes();
        if self.rows == 0 || self.cols == 0 {
            return Err(format!(
                "matrix is {}×{}: both dimensions must be non-zero",
                self.rows, self.cols
            ));
        }
        if self.rows > 1 << 32 || self.cols > 1 << 32 {
            return Err(format!(
                "matrix is {}×{}: each dimension must be ≤ 2^32",
                self.rows, self.cols
            ));
        }
        if self.ld < self.cols {
            return Err(format!(
                "leading dimension {} is smaller than the {} columns",
                self.ld, self.cols
            ));
        }
        if !base.is_multiple_of(16) {
            return Err(format!("base address {base:#x} is not 16-byte aligned"));
        }
        // Checked: an ld of 2^63 or more would wrap to a small pitch that passes the 2^40
        // check below and encodes rows that overlap.
        let Some(pitch) = self.ld.checked_mul(elem) else {
            return Err(format!(
                "row pitch of ld {} × {elem} B overflows 64 bits: it must be below 2^40 bytes",
                self.ld
            ));
        };
        if !pitch.is_multiple_of(16) {
            return Err(format!(
                "row pitch {pitch} bytes (ld {} × {elem} B) is not a multiple of 16: the leading \
                 dimension must be a multiple of {}",
                self.ld,
                16 / elem
            ));
        }
        if pitch >= 1 << 40 {
            return Err(format!("row pitch {pitch} bytes must be below 2^40"));
        }
        for (what, v) in [("box_cols", self.box_cols), ("box_rows", self.box_rows)] {
            if v == 0 || v > 256 {
                return Err(format!("{what} = {v}: box dimensions must be in 1..=256"));
            }
        }
        let box_bytes = u64::from(self.box_cols) * elem;
        if !box_bytes.is_multiple_of(16) {
            return Err(format!(
                "box width {} × {elem} B = {box_bytes} B is not a multiple of 16 bytes",
                self.box_cols
            ));
        }
        if let Some(span) = self.swizzle.span_bytes()
            && box_bytes > span
        {
            return Err(format!(
                "box width {} × {elem} B = {box_bytes} B exceeds the {span}-byte swizzle span \
                 (for 2-byte elements and SWIZZLE_128B, box_cols ≤ 64)",
                self.box_cols
            ));
        }
        Ok(())
    }
}

/// Encodes a map of the matrix at device address `base` (`cuTensorMapEncodeTiled`) after
/// validating `spec` against it. Encoding only records the address.
fn encode(gpu: &Gpu, base: u64, spec: &TensorMapSpec) -> Result<sys::CUtensorMap> {
    spec.validate(base)
        .map_err(RuntimeError::InvalidTensorMap)?;
    let global_dim = [spec.cols, spec.rows];
    let global_strides = [spec.ld * spec.dtype.size_bytes()];
    let box_dim = [spec.box_cols, spec.box_rows];
    let element_strides = [1u32, 1];
    let mut host = sys::CUtensorMap { opaque: [0; 16] };
    gpu.bind()?;
    // SAFETY: all arrays have rank (2) entries, strides rank − 1; `host` is a properly
    // aligned CUtensorMap that the call fills. The address is only recorded.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut host,
            spec.dtype.raw(),
            2,
            base as *mut c_void,
            global_dim.as_ptr(),
            global_strides.as_ptr(),
            box_dim.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            spec.swizzle.raw(),
            spec.l2_promotion.raw(),
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(RuntimeError::driver("cuTensorMapEncodeTiled"))?;
    Ok(host)
}

/// A `CUtensorMap` for one matrix, encoded on the host: the 128 bytes a kernel receives by
/// value in its parameter block (read by TMA from parameter space, as CUDA C++ passes a
/// `__grid_constant__` map). Holds no device memory; [`TensorMap2d`] keeps a device copy for
/// kernels that take a map's address instead.
#[derive(Debug, Clone)]
pub struct TensorMapEncoding {
    spec: TensorMapSpec,
    words: [u64; 16],
}

impl TensorMapEncoding {
    /// Encodes a map of the matrix at device address `base` (`cuTensorMapEncodeTiled`).
    ///
    /// Encoding only records the address; whether `base` really holds the matrix matters when
    /// a kernel uses the map (launches are `unsafe`).
    pub fn new(gpu: &Gpu, base: u64, spec: TensorMapSpec) -> Result<Self> {
        let words = encode(gpu, base, &spec)?.opaque;
        Ok(TensorMapEncoding { spec, words })
    }

    /// The 128-byte encoding.
    pub fn words(&self) -> [u64; 16] {
        self.words
    }

    /// Re-encodes the map for the same matrix shape at a new `base` (host only: a kernel
    /// sees the new encoding in the parameter blocks built after this call).
    pub fn retarget(&mut self, gpu: &Gpu, base: u64) -> Result<()> {
        self.words = encode(gpu, base, &self.spec)?.opaque;
        Ok(())
    }

    /// What this map describes.
    pub fn spec(&self) -> &TensorMapSpec {
        &self.spec
    }

    /// The encoding as the 128 bytes a device copy holds.
    fn bytes(&self) -> &[u8] {
        // SAFETY: 16 u64 are 128 initialised bytes with no padding, borrowed from `self`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), MAP_BYTES) }
    }
}

/// A [`TensorMapEncoding`] uploaded to a 128-byte device block, for kernels that take the
/// map's device address (a `u64` parameter).
#[derive(Debug)]
pub struct TensorMap2d {
    map: TensorMapEncoding,
    device: DeviceBuffer<u8>,
}

/// Bytes of a `CUtensorMap`.
const MAP_BYTES: usize = size_of::<sys::CUtensorMap>();

impl TensorMap2d {
    /// Encodes a map of the matrix at device address `base` (`cuTensorMapEncodeTiled`) and
    /// uploads it to device memory on `stream`.
    ///
    /// Encoding only records the address; whether `base` really holds the matrix matters when
    /// a kernel uses the map (launches are `unsafe`). Prefer [`TensorMap2d::for_buffer`], which
    /// checks the buffer is large enough.
    pub fn new(gpu: &Gpu, stream: &CudaStream, base: u64, spec: TensorMapSpec) -> Result<Self> {
        let map = TensorMapEncoding::new(gpu, base, spec)?;
        let mut device = DeviceBuffer::<u8>::alloc(gpu, MAP_BYTES)?;
        if device.device_ptr() % 128 != 0 {
            return Err(RuntimeError::InvalidTensorMap(format!(
                "cuMemAlloc returned {:#x}, which is not 128-byte aligned",
                device.device_ptr()
            )));
        }
        device.upload(stream, map.bytes())?;
        Ok(TensorMap2d { map, device })
    }

    /// A map of the matrix held in `buffer` (checked: element size matches `spec.dtype` and the
    /// buffer holds `(rows − 1) · ld + cols` elements).
    pub fn for_buffer<T: DeviceCopy>(
        gpu: &Gpu,
        stream: &CudaStream,
        buffer: &DeviceBuffer<T>,
        spec: TensorMapSpec,
    ) -> Result<Self> {
        if size_of::<T>() as u64 != spec.dtype.size_bytes() {
            return Err(RuntimeError::InvalidTensorMap(format!(
                "buffer elements are {} bytes but the map's {:?} elements are {}",
                size_of::<T>(),
                spec.dtype,
                spec.dtype.size_bytes()
            )));
        }
        if (buffer.len() as u64) < spec.required_elements() {
            return Err(RuntimeError::InvalidTensorMap(format!(
                "a {}×{} matrix with ld {} needs {} elements but the buffer holds {}",
                spec.rows,
                spec.cols,
                spec.ld,
                spec.required_elements(),
                buffer.len()
            )));
        }
        Self::new(gpu, stream, buffer.device_ptr(), spec)
    }

    /// Device address of the 128-byte map: the `u64` kernel parameter.
    pub fn device_address(&self) -> u64 {
        self.device.device_ptr()
    }

    /// Re-encodes the map for the same matrix shape at a new `base` and overwrites the device
    /// copy in stream order on `stream` ([`upload_async`]: the host waits only if the driver
    /// stages the copy synchronously; the device address stays the same, so parameter blocks
    /// that point to it stay valid).
    ///
    /// # Safety
    /// Every kernel that reads this map must be enqueued on `stream` (so it runs before or
    /// after the overwrite, never during it), and `base` must hold the matrix for the kernels
    /// enqueued after this call.
    pub unsafe fn retarget_async(&mut self, gpu: &Gpu, base: u64, stream: RawStream) -> Result<()> {
        self.map.retarget(gpu, base)?;
        // SAFETY: our 128-byte block; ordering is the caller's contract (the driver stages
        // the bytes before returning).
        unsafe { upload_async(gpu, self.device.device_ptr(), self.map.bytes(), stream) }
    }

    /// What this map describes.
    pub fn spec(&self) -> &TensorMapSpec {
        self.map.spec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(rows: u64, cols: u64, ld: u64, bc: u32, br: u32) -> TensorMapSpec {
        TensorMapSpec::new(TensorMapDtype::Bf16, rows, cols, ld, bc, br)
    }

    #[test]
    fn gemm_operand_maps_are_valid() {
        assert_eq!(
            bf16(8192, 8192, 8192, 64, 128).validate(0x7f00_0000_0000),
            Ok(())
        );
        assert_eq!(bf16(256, 192, 192, 64, 64).validate(0x1000), Ok(()));
        assert_eq!(bf16(256, 192, 192, 64, 256).validate(0x1000), Ok(()));
        let f32_map = TensorMapSpec::new(TensorMapDtype::F32, 128, 256, 256, 32, 64);
        assert_eq!(f32_map.validate(0x2000), Ok(()));
    }

    #[test]
    fn misaligned_base_is_rejected() {
        let e = bf16(64, 64, 64, 64, 64).validate(0x1008).unwrap_err();
        assert!(e.contains("16-byte aligned"), "{e}");
    }

    #[test]
    fn row_pitch_must_be_a_multiple_of_16_bytes() {
        let e = bf16(64, 60, 60, 32, 64).validate(0).unwrap_err();
        assert!(e.contains("multiple of 8"), "{e}");
        assert_eq!(bf16(64, 60, 64, 32, 64).validate(0), Ok(()));
    }

    #[test]
    fn sw128_limits_box_width_to_64_two_byte_elements() {
        let e = bf16(256, 256, 256, 128, 64).validate(0).unwrap_err();
        assert!(e.contains("swizzle span"), "{e}");
        assert_eq!(
            bf16(256, 256, 256, 128, 64)
                .with_swizzle(Swizzle::None)
                .validate(0),
            Ok(())
        );
        let e = bf16(256, 256, 256, 64, 64)
            .with_swizzle(Swizzle::B64)
            .validate(0)
            .unwrap_err();
        assert!(e.contains("64-byte swizzle"), "{e}");
    }

    #[test]
    fn box_dimensions_are_bounded() {
        assert!(
            bf16(512, 512, 512, 64, 257)
                .validate(0)
                .unwrap_err()
                .contains("1..=256")
        );
        assert!(
            bf16(512, 512, 512, 0, 64)
                .validate(0)
                .unwrap_err()
                .contains("1..=256")
        );
        assert!(
            bf16(512, 512, 512, 4, 64)
                .validate(0)
                .unwrap_err()
                .contains("multiple of 16")
        );
    }

    #[test]
    fn degenerate_matrices_are_rejected() {
        assert!(bf16(0, 64, 64, 64, 64).validate(0).is_err());
        assert!(
            bf16(64, 64, 32, 64, 64)
                .validate(0)
                .unwrap_err()
                .contains("leading dimension")
        );
    }

    #[test]
    fn a_pitch_that_would_wrap_is_rejected() {
        // 2^63 + 8 elements × 2 B wraps to 16 B in u64 arithmetic.
        let e = bf16(64, 64, (1 << 63) + 8, 64, 64).validate(0).unwrap_err();
        assert!(e.contains("overflows 64 bits"), "{e}");
        let e = bf16(64, 64, 1 << 39, 64, 64).validate(0).unwrap_err();
        assert!(e.contains("below 2^40"), "{e}");
    }

    #[test]
    fn required_elements_counts_the_last_row_only_up_to_cols() {
        assert_eq!(bf16(4, 10, 16, 8, 4).required_elements(), 3 * 16 + 10);
    }
}
