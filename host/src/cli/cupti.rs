//! CUPTI activity records of the kernels and copies the GPUs run, for `distgemm trace
//! --backend cuda` ([`crate::trace::activity`] turns them into node spans).
//!
//! CUPTI's activity API is process-global: the library hands out record buffers through two
//! callbacks registered once ([`buffer_requested`], [`buffer_completed`]), fills them while
//! the kinds enabled here are on (concurrent kernels, memcpy, peer-to-peer memcpy) and returns
//! each when it is full or flushed. [`Activity`] is the one collection at a time: it enables
//! the kinds, collects the parsed records ([`Activity::take`] flushes first), and disables
//! them when dropped. Nothing of this runs unless a trace is asked for: `libcupti` is loaded
//! then, not before, and a run without tracing is the plain `run` path.
//!
//! Graph node ids: CUPTI gives the nodes of an instantiated graph ids of their own (the
//! instance's nodes are clones), and its records carry those. A resource callback on
//! `CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED`, subscribed before any graph is instantiated, maps
//! each clone's id to its original's, which [`node_id`] gives for the nodes distgemm created;
//! [`Activity::take`] translates the records' ids.
//!
//! Record layouts: CUDA 13's (`CUpti_ActivityKernel10`, `CUpti_ActivityMemcpy6`,
//! `CUpti_ActivityMemcpyPtoP4`); later CUPTI versions append fields, so the fields read here
//! (start, end, graph node id) keep their offsets. Fields are read at their offsets as
//! integers, never as the bindgen structs, whose enum fields a newer library may fill with
//! values the bindings do not know.

use std::alloc::Layout;
use std::collections::HashMap;
use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::cupti::{result, sys};

use super::CliError;
use crate::runtime::GraphNode;
use crate::trace::activity::ActivityRecord;

/// Bytes of one record buffer handed to CUPTI.
const BUFFER_BYTES: usize = 8 << 20;

/// The kinds enabled while collecting.
const KINDS: [sys::CUpti_ActivityKind; 3] = [
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
    sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY2,
];

/// Records parsed by [`buffer_completed`] and not yet taken.
static RECORDS: Mutex<Vec<ActivityRecord>> = Mutex::new(Vec::new());
/// Graph node id of a clone (an instantiated graph's node) → its original's.
static CLONES: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
/// Records CUPTI dropped for want of buffer space.
static DROPPED: AtomicUsize = AtomicUsize::new(0);
/// Whether an [`Activity`] exists.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The outcome of loading `libcupti` and registering the buffer callbacks (once per process).
static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

/// The one activity collection of the process; see the module documentation.
#[derive(Debug)]
pub(super) struct Activity {
    _private: (),
}

impl Activity {
    /// Loads `libcupti` (a clear error if it is not found), registers the buffer callbacks
    /// and enables the kernel and copy kinds.
    pub(super) fn start() -> Result<Activity, CliError> {
        check_available()?;
        if ACTIVE.swap(true, Ordering::AcqRel) {
            return Err(CliError::Usage(
                "a CUPTI activity collection is already running in this process".into(),
            ));
        }
        let activity = Activity { _private: () };
        activity.resume()?;
        Ok(activity)
    }

    /// Turns the kinds on.
    pub(super) fn resume(&self) -> Result<(), CliError> {
        for kind in KINDS {
            result::activity::enable(kind).map_err(|e| cupti_error("cuptiActivityEnable", e))?;
        }
        Ok(())
    }

    /// Turns the kinds off (what is already recorded stays until [`Activity::take`]).
    pub(super) fn pause(&self) -> Result<(), CliError> {
        for kind in KINDS {
            result::activity::disable(kind).map_err(|e| cupti_error("cuptiActivityDisable", e))?;
        }
        Ok(())
    }

    /// Every record of work that has completed (the caller synchronises first), taken out of
    /// the collection; an error if CUPTI dropped any.
    pub(super) fn take(&self) -> Result<Vec<ActivityRecord>, CliError> {
        flush()?;
        let mut records =
            std::mem::take(&mut *RECORDS.lock().unwrap_or_else(PoisonError::into_inner));
        if let Some(clones) = CLONES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            for r in &mut records {
                if let Some(&original) = clones.get(&r.graph_node_id) {
                    r.graph_node_id = original;
                }
            }
        }
        let dropped = DROPPED.swap(0, Ordering::AcqRel);
        if dropped > 0 {
            return Err(CliError::CudaUnavailable(format!(
                "CUPTI dropped {dropped} activity records (buffers full); trace fewer --iters"
            )));
        }
        Ok(records)
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        let _ = self.pause();
        let _ = flush();
        RECORDS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        DROPPED.store(0, Ordering::Release);
        ACTIVE.store(false, Ordering::Release);
    }
}

/// Loads `libcupti` and registers the callbacks (once per process): a clear error when the
/// library is missing, before anything else is started.
pub(super) fn check_available() -> Result<(), CliError> {
    REGISTERED
        .get_or_init(register)
        .clone()
        .map_err(|e| CliError::CudaUnavailable(format!("the GPU trace needs CUPTI: {e}")))
}

/// CUPTI's id of a graph node (what its records of the node's work carry).
pub(super) fn node_id(node: GraphNode) -> Result<u64, CliError> {
    let mut id = 0u64;
    // SAFETY: `node` is a live node handle (its graph outlives the call); `id` is writable.
    unsafe { result::get_graph_node_id(node.raw(), &raw mut id) }
        .map_err(|e| cupti_error("cuptiGetGraphNodeId", e))?;
    Ok(id)
}

/// Hands every filled buffer back through [`buffer_completed`].
fn flush() -> Result<(), CliError> {
    let forced = sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32;
    result::activity::flush_all(forced).map_err(|e| cupti_error("cuptiActivityFlushAll", e))
}

/// A failed CUPTI call as a CLI error naming it.
fn cupti_error(call: &str, e: result::CuptiError) -> CliError {
    CliError::CudaUnavailable(format!("{call} failed: {e:?}"))
}

/// Loads `libcupti` under one of the names cudarc tries (so that cudarc's own loader, which
/// panics when it finds none, is only reached when one exists) and registers the callbacks.
fn register() -> Result<(), String> {
    let names = cudarc::get_lib_name_candidates("cupti");
    // SAFETY: loading CUPTI runs its initialisers, which have no preconditions.
    let found = names
        .iter()
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok());
    if !found {
        return Err(format!(
            "libcupti was not found (tried {}); add the directory holding it (the CUDA \
             toolkit's extras/CUPTI/lib64, or the nvidia-cuda-cupti wheel's lib) to \
             LD_LIBRARY_PATH",
            names.join(", ")
        ));
    }
    result::activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
        .map_err(|e| format!("cuptiActivityRegisterCallbacks failed: {e:?}"))?;
    let mut subscriber: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: `subscriber` is writable; the callback is a `'static` function that needs no
    // user data. The subscription lives as long as the process (CUPTI allows one).
    unsafe { result::subscribe(&raw mut subscriber, Some(on_resource), std::ptr::null_mut()) }
        .map_err(|e| format!("cuptiSubscribe failed: {e:?}"))?;
    // SAFETY: a live subscriber handle.
    unsafe {
        result::enable_callback(
            1,
            subscriber,
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RESOURCE,
            sys::CUpti_CallbackIdResource::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED as u32,
        )
    }
    .map_err(|e| format!("cuptiEnableCallback (graph node clones) failed: {e:?}"))
}

/// CUPTI's resource callback: a graph node was cloned (a graph instantiated); remember the
/// clone's id → the original's.
///
/// # Safety
/// Called by CUPTI; for `CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED`, `data` points at a
/// `CUpti_ResourceData` whose descriptor is a `CUpti_GraphData`.
unsafe extern "C" fn on_resource(
    _user: *mut std::ffi::c_void,
    _domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    data: *const std::ffi::c_void,
) {
    let cloned = sys::CUpti_CallbackIdResource::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED as u32;
    if cbid != cloned || data.is_null() {
        return;
    }
    // SAFETY: the function's contract.
    let graph = unsafe { (*data.cast::<sys::CUpti_ResourceData>()).resourceDescriptor };
    if graph.is_null() {
        return;
    }
    // SAFETY: as above.
    let graph = unsafe { &*graph.cast::<sys::CUpti_GraphData>() };
    let (mut clone, mut original) = (0u64, 0u64);
    // SAFETY: live node handles CUPTI passed; the ids are writable.
    let ok = unsafe {
        result::get_graph_node_id(graph.node, &raw mut clone).is_ok()
            && result::get_graph_node_id(graph.originalNode, &raw mut original).is_ok()
    };
    if ok {
        CLONES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(clone, original);
    }
}

/// The layout of every record buffer (CUPTI needs 8-byte alignment).
fn buffer_layout() -> Layout {
    Layout::from_size_align(BUFFER_BYTES, 8).unwrap_or(Layout::new::<u64>())
}

/// CUPTI asks for an empty buffer.
///
/// # Safety
/// Called by CUPTI with writable out-pointers.
unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    let layout = buffer_layout();
    // SAFETY: the layout has a non-zero size.
    let memory = unsafe { std::alloc::alloc(layout) };
    // SAFETY: CUPTI's out-pointers are writable; a null buffer (allocation failure) makes
    // CUPTI drop records, which `Activity::take` reports.
    unsafe {
        *buffer = memory;
        *size = if memory.is_null() { 0 } else { layout.size() };
        *max_records = 0;
    }
}

/// CUPTI returns a buffer holding `valid` bytes of records: parse them, count what was
/// dropped, free the buffer.
///
/// # Safety
/// Called by CUPTI with a buffer from [`buffer_requested`].
unsafe extern "C" fn buffer_completed(
    context: cudarc::driver::sys::CUcontext,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let mut parsed = Vec::new();
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    // SAFETY: `buffer` holds `valid` bytes of records; CUPTI walks them.
    while unsafe { result::activity::get_next_record(buffer, valid, &raw mut record) }.is_ok() {
        // SAFETY: `record` points at a whole record inside the buffer.
        if let Some(r) = unsafe { parse(record.cast::<u8>()) } {
            parsed.push(r);
        }
    }
    let mut dropped = 0usize;
    // SAFETY: the context and stream CUPTI gave; `dropped` is writable.
    if unsafe { result::activity::get_num_dropped_records(context, stream, &raw mut dropped) }
        .is_ok()
    {
        DROPPED.fetch_add(dropped, Ordering::AcqRel);
    }
    RECORDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(parsed);
    // SAFETY: allocated by `buffer_requested` with this layout.
    unsafe { std::alloc::dealloc(buffer, buffer_layout()) };
}

/// The record at `p` if it is a kernel or a copy launched by a graph node.
///
/// # Safety
/// `p` must point at a whole CUPTI activity record.
unsafe fn parse(p: *const u8) -> Option<ActivityRecord> {
    use sys::CUpti_ActivityKind as Kind;
    // SAFETY: every field read lies inside the record of its kind (module documentation).
    let read = |offset: usize| unsafe { p.add(offset).cast::<u64>().read_unaligned() };
    // SAFETY: every record starts with its kind (a 32-bit enum).
    let kind = unsafe { p.cast::<u32>().read_unaligned() };
    let (start, end, node) = if kind == Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32
        || kind == Kind::CUPTI_ACTIVITY_KIND_KERNEL as u32
    {
        type K = sys::CUpti_ActivityKernel10;
        (
            offset_of!(K, start),
            offset_of!(K, end),
            offset_of!(K, graphNodeId),
        )
    } else if kind == Kind::CUPTI_ACTIVITY_KIND_MEMCPY as u32 {
        type M = sys::CUpti_ActivityMemcpy6;
        (
            offset_of!(M, start),
            offset_of!(M, end),
            offset_of!(M, graphNodeId),
        )
    } else if kind == Kind::CUPTI_ACTIVITY_KIND_MEMCPY2 as u32 {
        type P = sys::CUpti_ActivityMemcpyPtoP4;
        (
            offset_of!(P, start),
            offset_of!(P, end),
            offset_of!(P, graphNodeId),
        )
    } else {
        return None;
    };
    let graph_node_id = read(node);
    (graph_node_id != 0).then(|| ActivityRecord {
        graph_node_id,
        start_ns: read(start),
        end_ns: read(end),
    })
}
