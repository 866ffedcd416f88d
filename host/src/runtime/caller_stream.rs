//! Work on a stream that the caller owns (PyTorch's current stream, a framework's compute
//! stream): the raw stream handle, completion events, stream-ordered copies and a pinned host
//! word the GPU writes a status into.
//!
//! Everything here is asynchronous: nothing waits for the GPU unless its name says so
//! (`synchronize`). That is what lets a per-rank run queue behind the caller's kernels with no
//! host synchronisation.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use cudarc::driver::{CudaStream, sys};

/// A CUDA stream of this process by raw handle (`CUstream`); the null handle is the legacy
/// default stream, which PyTorch uses unless told otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStream(sys::CUstream);

// SAFETY: a stream handle is a plain token the driver accepts from any thread.
unsafe impl Send for RawStream {}
// SAFETY: as above; nothing is mutated through it.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// The stream with handle `handle` (e.g. `torch.cuda.current_stream().cuda_stream`).
    ///
    /// # Safety
    /// `handle` must be 0 or a live stream of the GPU's primary context in this process, and
    /// stay alive while work enqueued through this value may be pending.
    #[must_use]
    pub unsafe fn from_raw(handle: u64) -> RawStream {
        RawStream(handle as sys::CUstream)
    }

    /// The handle of a cudarc stream. Crate-private: the value has no lifetime, so only code
    /// that keeps `stream` alive while the value is used may make one (distgemm's own
    /// streams, held in an `Arc` by the instance that uses the handle). Outside the crate,
    /// [`RawStream::from_raw`] states that contract.
    #[must_use]
    pub(crate) fn of(stream: &CudaStream) -> RawStream {
        RawStream(stream.cu_stream())
    }

    /// The raw handle.
    #[must_use]
    pub fn raw(self) -> sys::CUstream {
        self.0
    }

    /// Waits on the host for all work on the stream (`cuStreamSynchronize` in `gpu`'s
    /// context).
    pub fn synchronize(self, gpu: &Gpu) -> Result<()> {
        gpu.bind()?;
        // SAFETY: the handle is live (`from_raw`'s contract or a live cudarc stream).
        unsafe { sys::cuStreamSynchronize(self.0) }
            .result()
            .map_err(RuntimeError::driver("cuStreamSynchronize"))
    }
}

/// A completion marker on a stream (`cuEventCreate` with `CU_EVENT_DISABLE_TIMING`);
/// destroyed on drop.
#[derive(Debug)]
pub struct StreamEvent {
    raw: sys::CUevent,
    gpu: Gpu,
    recorded: bool,
}

// SAFETY: event handles may be used from any thread; every call binds the context first.
unsafe impl Send for StreamEvent {}
// SAFETY: `&self` methods only query or wait.
unsafe impl Sync for StreamEvent {}

impl StreamEvent {
    /// A new event of `gpu`'s primary context.
    pub fn new(gpu: &Gpu) -> Result<StreamEvent> {
        gpu.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `raw` is an out-parameter.
        unsafe { sys::cuEventCreate(&mut raw, flags) }
            .result()
            .map_err(RuntimeError::driver("cuEventCreate"))?;
        Ok(StreamEvent {
            raw,
            gpu: gpu.clone(),
            recorded: false,
        })
    }

    /// Marks the current end of `stream` (`cuEventRecord`).
    pub fn record(&mut self, stream: RawStream) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: both handles are alive (RawStream's contract).
        unsafe { sys::cuEventRecord(self.raw, stream.raw()) }
            .result()
            .map_err(RuntimeError::driver("cuEventRecord"))?;
        self.recorded = true;
        Ok(())
    }

    /// Whether the work before the last `record` has finished (`cuEventQuery`; true if never
    /// recorded). Does not wait.
    pub fn is_complete(&self) -> Result<bool> {
        if !self.recorded {
            return Ok(true);
        }
        self.gpu.bind()?;
        // SAFETY: the event is alive.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(RuntimeError::driver("cuEventQuery")(
                other.result().unwrap_err(),
            )),
        }
    }

    /// Waits on the host until the work before the last `record` has finished
    /// (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        if !self.recorded {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the event is alive.
        unsafe { sys::cuEventSynchronize(self.raw) }
            .result()
            .map_err(RuntimeError::driver("cuEventSynchronize"))
    }

    /// Makes later work on `stream` wait for the last `record` (`cuStreamWaitEvent`), without
    /// blocking the host.
    pub fn order_before(&self, stream: RawStream) -> Result<()> {
        if !self.recorded {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: both handles are alive.
        unsafe { sys::cuStreamWaitEvent(stream.raw(), self.raw, 0) }
            .result()
            .map_err(RuntimeError::driver("cuStreamWaitEvent"))
    }
}

impl Drop for StreamEvent {
    /// `cuEventDestroy` (the driver defers the release until the event's work is done).
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: created by cuEventCreate, destroyed once.
        ctx.record_err(unsafe { sys::cuEventDestroy_v2(self.raw) }.result());
    }
}

/// Copies `bytes` bytes from `src` to `dst` in stream order (`cuMemcpyDtoDAsync`).
///
/// # Safety
/// Both ranges must be device memory reachable from `gpu`'s context that stays valid until
/// `stream` has passed the copy, and nothing else may write `dst` meanwhile.
pub unsafe fn copy_device_async(
    gpu: &Gpu,
    dst: u64,
    src: u64,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    gpu.bind()?;
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.raw()) }
        .result()
        .map_err(RuntimeError::driver("cuMemcpyDtoDAsync"))
}

/// Copies host `data` to device address `dst` in stream order (`cuMemcpyHtoDAsync` from
/// pageable memory: the driver stages the bytes before returning, so `data` may be dropped
/// at once; the CUDA documentation allows it to synchronise with the stream to do so, so the
/// host may wait for earlier work on `stream`).
///
/// # Safety
/// `dst..dst + data.len()` must be device memory of `gpu` that stays valid until `stream` has
/// passed the copy and that no kernel enqueued before it on another stream still reads.
pub unsafe fn upload_async(gpu: &Gpu, dst: u64, data: &[u8], stream: RawStream) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    gpu.bind()?;
    // SAFETY: the caller's contract; `data` is read during the call.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), stream.raw()) }
        .result()
        .map_err(RuntimeError::driver("cuMemcpyHtoDAsync"))
}

/// One u32 of page-locked host memory that stream-ordered copies write
/// (`cuMemHostAlloc`, freed with `cuMemFreeHost` on drop): a status the host reads without
/// synchronising, once an event says the copy is done.
#[derive(Debug)]
pub struct PinnedWord {
    ptr: *mut u32,
    gpu: Gpu,
}

// SAFETY: the word is only read with volatile loads and written by the GPU's copy engine.
unsafe impl Send for PinnedWord {}
// SAFETY: as above.
unsafe impl Sync for PinnedWord {}

impl PinnedWord {
    /// A zeroed word.
    pub fn new(gpu: &Gpu) -> Result<PinnedWord> {
        gpu.bind()?;
        let mut ptr: *mut core::ffi::c_void = std::ptr::null_mut();
        // SAFETY: out-parameter; 4 bytes, portable across contexts.
        unsafe { sys::cuMemHostAlloc(&mut ptr, 4, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .result()
            .map_err(RuntimeError::driver("cuMemHostAlloc"))?;
        let ptr = ptr.cast::<u32>();
        // SAFETY: a fresh, aligned 4-byte allocation.
        unsafe { ptr.write_volatile(0) };
        Ok(PinnedWord {
            ptr,
            gpu: gpu.clone(),
        })
    }

    /// The value (the last one a finished copy wrote).
    #[must_use]
    pub fn get(&self) -> u32 {
        // SAFETY: a live, aligned allocation.
        unsafe { self.ptr.read_volatile() }
    }

    /// Copies the device word at `src` into this word in stream order (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// `src` must be 4 bytes of device memory valid until `stream` has passed the copy, and
    /// `self` must outlive the copy (keep it until an event after the copy completed).
    pub unsafe fn copy_from_device_async(&self, src: u64, stream: RawStream) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the caller's contract; the destination is our pinned word.
        unsafe { sys::cuMemcpyDtoHAsync_v2(self.ptr.cast(), src, 4, stream.raw()) }
            .result()
            .map_err(RuntimeError::driver("cuMemcpyDtoHAsync"))
    }
}

impl Drop for PinnedWord {
    /// `cuMemFreeHost`; errors are recorded in the cudarc context.
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        ctx.record_err(unsafe { sys::cuMemFreeHost(self.ptr.cast()) }.result());
    }
}
