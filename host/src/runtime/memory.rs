//! Device memory: [`DeviceBuffer<T>`], a typed `cuMemAlloc` allocation freed on drop.
//!
//! Why not cudarc's `CudaStream::alloc` / `CudaSlice`: on devices with memory pools it uses
//! `cuMemAllocAsync` (stream-ordered pools), and `cuCtxEnablePeerAccess` does **not** cover pool
//! memory — a peer GPU's UVA copy into a pool allocation fails with `CUDA_ERROR_INVALID_VALUE`
//! and `cuMemcpyPeerAsync` between pools is staged at ~37 GB/s instead of ~400 GB/s over NVLink
//! (measured on 2 × H200 when the project began). Every buffer a peer may touch must be plain
//! `cuMemAlloc` memory, so all of distgemm's buffers are.
//!
//! Transfers take the stream the kernels run on, so they are ordered with those kernels even
//! though the stream is non-blocking; host-side copies wait for completion before returning.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use cudarc::driver::{CudaContext, CudaStream, result, sys};
use std::marker::PhantomData;
use std::sync::Arc;

/// Element types a [`DeviceBuffer`] may hold.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (downloads reinterpret
/// device bytes), and the type must have no padding and no pointers.
pub unsafe trait DeviceCopy: Copy + Default + Send + Sync + 'static {}

// SAFETY: plain integers and IEEE floats: every bit pattern is a value, no padding.
unsafe impl DeviceCopy for u8 {}
unsafe impl DeviceCopy for u16 {}
unsafe impl DeviceCopy for u32 {}
unsafe impl DeviceCopy for u64 {}
unsafe impl DeviceCopy for i8 {}
unsafe impl DeviceCopy for i16 {}
unsafe impl DeviceCopy for i32 {}
unsafe impl DeviceCopy for i64 {}
unsafe impl DeviceCopy for f32 {}
unsafe impl DeviceCopy for f64 {}
unsafe impl DeviceCopy for half::f16 {}
unsafe impl DeviceCopy for half::bf16 {}
// SAFETY: `repr(transparent)` over a u8, and every byte is an e4m3 code (NaN included).
unsafe impl DeviceCopy for crate::fp8::E4m3 {}

/// `len` elements of `T` in device memory of one GPU, allocated with `cuMemAlloc`
/// (256-byte aligned or better) and freed with `cuMemFree` on drop.
#[derive(Debug)]
pub struct DeviceBuffer<T: DeviceCopy> {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
    marker: PhantomData<T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates `len` elements (`cuMemAlloc`); the contents are whatever the memory held.
    /// A zero-length buffer allocates nothing and has address 0.
    pub fn alloc(gpu: &Gpu, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or(RuntimeError::SizeOverflow {
                what: "DeviceBuffer::alloc",
                count: len,
                elem_bytes: size_of::<T>(),
            })?;
        let ptr = if bytes == 0 {
            0
        } else {
            gpu.bind()?;
            // SAFETY: the context is current; the memory is only read as `T: DeviceCopy`.
            unsafe { result::malloc_sync(bytes) }.map_err(RuntimeError::driver("cuMemAlloc"))?
        };
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: gpu.context().clone(),
            marker: PhantomData,
        })
    }

    /// Allocates a buffer and copies `data` into it, ordered on `stream`.
    pub fn from_host(gpu: &Gpu, stream: &CudaStream, data: &[T]) -> Result<Self> {
        let mut buffer = Self::alloc(gpu, data.len())?;
        buffer.upload(stream, data)?;
        Ok(buffer)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device address, as kernels take it (`u64`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Ordinal of the GPU that owns the memory.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn check_len(&self, op: &'static str, host_len: usize) -> Result<()> {
        if host_len == self.len {
            Ok(())
        } else {
            Err(RuntimeError::LengthMismatch {
                op,
                device_len: self.len,
                host_len,
            })
        }
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(RuntimeError::driver("cuCtxSetCurrent"))
    }

    /// Copies `data` (same length) into the buffer after the work already on `stream`
    /// (`cuMemcpyHtoDAsync`), then waits for the stream so `data` may be dropped.
    pub fn upload(&mut self, stream: &CudaStream, data: &[T]) -> Result<()> {
        self.check_len("DeviceBuffer::upload", data.len())?;
        if self.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `self.ptr` holds exactly `data.len()` elements of `T`; we wait below, so
        // `data` outlives the copy.
        unsafe { result::memcpy_htod_async(self.ptr, data, stream.cu_stream()) }
            .map_err(RuntimeError::driver("cuMemcpyHtoDAsync"))?;
        stream
            .synchronize()
            .map_err(RuntimeError::driver("cuStreamSynchronize"))
    }

    /// Copies the buffer into `out` (same length) after the work on `stream`
    /// (`cuMemcpyDtoHAsync`), waiting for completion.
    pub fn download_into(&self, stream: &CudaStream, out: &mut [T]) -> Result<()> {
        self.check_len("DeviceBuffer::download", out.len())?;
        if self.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: sizes match; we wait below, so `out` is written before we return; any bit
        // pattern is a valid `T` (`DeviceCopy`).
        unsafe { result::memcpy_dtoh_async(out, self.ptr, stream.cu_stream()) }
            .map_err(RuntimeError::driver("cuMemcpyDtoHAsync"))?;
        stream
            .synchronize()
            .map_err(RuntimeError::driver("cuStreamSynchronize"))
    }

    /// Copies the buffer to a new `Vec` after the work on `stream`.
    pub fn download(&self, stream: &CudaStream) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        self.download_into(stream, &mut out)?;
        Ok(out)
    }

    /// Sets every byte to `byte`, ordered on `stream` (`cuMemsetD8Async`; does not wait).
    /// Used to poison outputs (e.g. `0xFF`: NaN for floats, `0xFFFF` for 16-bit patterns).
    pub fn fill_bytes(&mut self, stream: &CudaStream, byte: u8) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range is this allocation; every byte pattern is a valid `T`.
        unsafe { result::memset_d8_async(self.ptr, byte, self.size_bytes(), stream.cu_stream()) }
            .map_err(RuntimeError::driver("cuMemsetD8Async"))
    }

    /// Sets every element to `value` (one upload of a host vector; waits).
    pub fn fill(&mut self, stream: &CudaStream, value: T) -> Result<()> {
        let host = vec![value; self.len];
        self.upload(stream, &host)
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    /// `cuMemFree`, which waits for the context's outstanding work before freeing (implicit
    /// synchronization), so queued kernels never see freed memory. Errors cannot be returned
    /// from `drop`, so they are recorded in the cudarc context (its `check_err` reports them on
    /// the next call), as cudarc does for its own types.
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by `cuMemAlloc` in this context, freed once.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}
