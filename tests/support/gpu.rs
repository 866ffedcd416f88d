//! Gating of GPU tests: run for real on a Hopper GPU, skip visibly anywhere else.
//!
//! Every GPU test starts with
//! ```ignore
//! let Some(session) = gpu::hopper_gpu("gpu_smoke::vector_add") else { return };
//! ```
//! Without a usable Hopper GPU (no driver, no GPU, wrong compute capability) this writes
//! `SKIPPED gpu_smoke::vector_add: no Hopper GPU (<reason>)` straight to stderr — not through
//! `eprintln!`, which libtest captures for passing tests — and the test returns, passing.
//! With `DISTGEMM_REQUIRE_GPU=1` (set by the bundle's run script on GPU machines) a missing
//! GPU fails the test instead, so a GPU run can never pass by skipping.
//!
//! The session holds a process-wide lock, so GPU tests never share the device concurrently,
//! whatever `--test-threads` says.

use distgemm::runtime::{Gpu, Module, RuntimeError};
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Environment variable that turns "skip without a GPU" into a failure.
pub const REQUIRE_GPU_ENV: &str = "DISTGEMM_REQUIRE_GPU";

/// Serialises GPU tests within the process.
static GPU_LOCK: Mutex<()> = Mutex::new(());

/// A Hopper GPU, held exclusively by one test.
#[derive(Debug)]
pub struct GpuSession {
    /// GPU 0.
    pub gpu: Gpu,
    _lock: MutexGuard<'static, ()>,
}

impl GpuSession {
    /// Loads distgemm's PTX module on the GPU (`DISTGEMM_PTX` or the embedded PTX).
    pub fn module(&self) -> Result<Arc<Module>, RuntimeError> {
        Module::load(&self.gpu)
    }
}

/// Whether a missing GPU must fail rather than skip.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

/// Writes a line to the real stderr, bypassing libtest's output capture.
pub fn visible_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Opens GPU 0 for `test` (e.g. `"gpu_smoke::vector_add"`), or reports the skip and returns
/// `None`. Panics instead of skipping when [`REQUIRE_GPU_ENV`] is `1`.
pub fn hopper_gpu(test: &str) -> Option<GpuSession> {
    let lock = GPU_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    match Gpu::open(0) {
        Ok(gpu) => Some(GpuSession { gpu, _lock: lock }),
        Err(e) => {
            assert!(
                !gpu_required(),
                "{test}: {REQUIRE_GPU_ENV}=1 but no Hopper GPU is usable: {e}"
            );
            visible_line(&format!("SKIPPED {test}: no Hopper GPU ({e})"));
            None
        }
    }
}

/// `count` Hopper GPUs with peer access between every pair, held exclusively by one test.
#[derive(Debug)]
pub struct PeerGpuSession {
    /// GPUs 0..count.
    pub gpus: Vec<Gpu>,
    _lock: MutexGuard<'static, ()>,
}

impl PeerGpuSession {
    /// Loads distgemm's PTX module on every GPU.
    pub fn modules(&self) -> Result<Vec<Arc<Module>>, RuntimeError> {
        self.gpus.iter().map(Module::load).collect()
    }
}

/// Opens the first `count` GPUs for `test` if they are Hopper GPUs with peer access between
/// every pair, or reports the skip and returns `None`.
///
/// With [`REQUIRE_GPU_ENV`]` = 1`, no usable GPU at all fails the test (as [`hopper_gpu`]
/// does), but a machine with fewer than `count` GPUs, or without peer access, only skips:
/// the bundle runs on 1-GPU machines too, where a multi-GPU test cannot run. The skip line
/// says which of the two it was.
pub fn peer_hopper_gpus(test: &str, count: usize) -> Option<PeerGpuSession> {
    let lock = GPU_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let all = match distgemm::runtime::hopper_gpus() {
        Ok(all) => all,
        Err(e) => {
            assert!(
                !gpu_required(),
                "{test}: {REQUIRE_GPU_ENV}=1 but no Hopper GPU is usable: {e}"
            );
            visible_line(&format!("SKIPPED {test}: no Hopper GPU ({e})"));
            return None;
        }
    };
    if all.len() < count {
        visible_line(&format!(
            "SKIPPED {test}: needs {count} Hopper GPUs with peer access, this machine has {} \
             (not a failure even with {REQUIRE_GPU_ENV}=1)",
            all.len()
        ));
        return None;
    }
    let gpus: Vec<Gpu> = all.into_iter().take(count).collect();
    for a in &gpus {
        for b in &gpus {
            match a.can_access_peer(b) {
                Ok(true) => {}
                Ok(false) | Err(_) => {
                    visible_line(&format!(
                        "SKIPPED {test}: GPU {} cannot access GPU {} (no peer access; not a \
                         failure even with {REQUIRE_GPU_ENV}=1)",
                        a.ordinal(),
                        b.ordinal()
                    ));
                    return None;
                }
            }
        }
    }
    Some(PeerGpuSession { gpus, _lock: lock })
}

/// The raw handle of a test's stream, for the APIs that take a caller's stream.
///
/// Sound as the tests use it: every caller keeps `stream` (an `Arc` it owns) alive until it
/// has synchronised the work it enqueued through the handle.
pub fn raw_stream(stream: &distgemm::runtime::CudaStream) -> distgemm::runtime::RawStream {
    // SAFETY: a live stream of this process's primary context (the caller keeps it alive).
    unsafe { distgemm::runtime::RawStream::from_raw(stream.cu_stream() as u64) }
}
