//! PTX modules and kernel handles.
//!
//! The PTX comes from the file named by `DISTGEMM_PTX` when that is set (so a bundle or a
//! developer can swap kernels without rebuilding the host), else from the copy embedded at
//! build time: `host/build.rs` embeds `target/ptx/kernels_gpu.ptx` in a distgemm checkout
//! where `cargo xtask build-ptx` has written it, else the committed `host/ptx/kernels_gpu.ptx`
//! (what a crate that depends on distgemm gets). [`select_ptx_source`] makes that choice
//! without touching the driver, so it is unit-tested.
//!
//! Loading uses `cuModuleLoadDataEx` with `CU_JIT_INFO_LOG_BUFFER` / `CU_JIT_ERROR_LOG_BUFFER`
//! so that, when the driver's JIT (ptxas) rejects the PTX, its log ends up in
//! [`RuntimeError::PtxRejected`] instead of a bare `CUDA_ERROR_INVALID_PTX`. cudarc's
//! `CudaContext::load_module` uses `cuModuleLoadData`, which has no logs, hence this wrapper.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use cudarc::driver::{DriverError, result, sys};
use std::borrow::Cow;
use std::ffi::{CString, OsString, c_void};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// Environment variable naming a PTX file that replaces the embedded PTX.
pub const PTX_ENV_VAR: &str = "DISTGEMM_PTX";

/// Bytes reserved for each JIT log.
const JIT_LOG_BYTES: usize = 64 * 1024;

/// The embedded PTX, deflated by `host/build.rs`.
#[cfg(distgemm_embedded_ptx)]
const EMBEDDED_DEFLATED: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/kernels_gpu.ptx.deflate"
)));
/// `None`: when this crate was built, neither `target/ptx/kernels_gpu.ptx` (`cargo xtask
/// build-ptx`) nor the committed `host/ptx/kernels_gpu.ptx` existed.
#[cfg(not(distgemm_embedded_ptx))]
const EMBEDDED_DEFLATED: Option<&[u8]> = None;

/// Whether this build embeds PTX ([`embedded_ptx`] is `Some`), known at compile time.
pub const PTX_EMBEDDED: bool = EMBEDDED_DEFLATED.is_some();

/// The PTX embedded at build time: `target/ptx/kernels_gpu.ptx` of a distgemm checkout
/// (written by `cargo xtask build-ptx`), else the committed `host/ptx/kernels_gpu.ptx`. Stored
/// deflated in the binary and inflated once, on the first call (a few milliseconds). `None`
/// when the crate was built without either file.
pub fn embedded_ptx() -> Option<&'static str> {
    static PTX: OnceLock<Option<String>> = OnceLock::new();
    PTX.get_or_init(|| {
        // The bytes were deflated by our own build script from UTF-8 text: a failure here
        // would be a corrupt build, reported as "no embedded PTX" rather than a panic.
        let text = miniz_oxide::inflate::decompress_to_vec(EMBEDDED_DEFLATED?).ok()?;
        String::from_utf8(text).ok()
    })
    .as_deref()
}

/// Where a module's PTX came from (shown in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtxOrigin {
    /// A file named by `DISTGEMM_PTX`.
    EnvPath(PathBuf),
    /// The PTX embedded at build time.
    Embedded,
    /// PTX text handed to [`Module::from_ptx`], with a label.
    Custom(String),
}

impl fmt::Display for PtxOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PtxOrigin::EnvPath(p) => write!(f, "{PTX_ENV_VAR}={}", p.display()),
            PtxOrigin::Embedded => write!(
                f,
                "the PTX embedded at build time (target/ptx/kernels_gpu.ptx from `cargo xtask \
                 build-ptx`, else the committed host/ptx/kernels_gpu.ptx)"
            ),
            PtxOrigin::Custom(label) => write!(f, "{label}"),
        }
    }
}

/// Which PTX to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtxSource {
    /// Read this file (from `DISTGEMM_PTX`).
    File(PathBuf),
    /// Use the embedded text.
    Embedded(&'static str),
}

/// Chooses the PTX: a non-empty `DISTGEMM_PTX` value wins, then the embedded PTX; with
/// neither, [`RuntimeError::PtxMissing`]. Pure: the caller passes the environment value.
pub fn select_ptx_source(
    env_value: Option<OsString>,
    embedded: Option<&'static str>,
) -> Result<PtxSource> {
    match (env_value.filter(|v| !v.is_empty()), embedded) {
        (Some(path), _) => Ok(PtxSource::File(PathBuf::from(path))),
        (None, Some(text)) => Ok(PtxSource::Embedded(text)),
        (None, None) => Err(RuntimeError::PtxMissing),
    }
}

/// Largest PTX file accepted from `DISTGEMM_PTX` (64 MiB; distgemm's PTX is about 1 MiB).
pub const MAX_PTX_FILE_BYTES: u64 = 64 << 20;

/// Reads the PTX a source designates. A file must be a regular file (not `/dev/zero`, which
/// never ends, nor `/dev/stdin`, which blocks) of at most [`MAX_PTX_FILE_BYTES`], non-empty
/// UTF-8 text without NUL bytes; anything else is refused before the driver sees it.
pub fn read_ptx(source: PtxSource) -> Result<(Cow<'static, str>, PtxOrigin)> {
    match source {
        PtxSource::Embedded(text) => Ok((Cow::Borrowed(text), PtxOrigin::Embedded)),
        PtxSource::File(path) => match read_ptx_file(&path) {
            Ok(text) => {
                if let Some(at) = text.find('\0') {
                    return Err(RuntimeError::PtxMalformed {
                        origin: PtxOrigin::EnvPath(path).to_string(),
                        reason: format!("it contains a NUL byte at offset {at}"),
                    });
                }
                Ok((Cow::Owned(text), PtxOrigin::EnvPath(path)))
            }
            Err(source) => Err(RuntimeError::PtxUnreadable { path, source }),
        },
    }
}

/// The text of a regular, non-empty PTX file of at most [`MAX_PTX_FILE_BYTES`]. The read is
/// bounded too, so a file that grows after the size check cannot make it unbounded.
fn read_ptx_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let invalid = |what: String| Error::new(ErrorKind::InvalidInput, what);
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(invalid("it is not a regular file".into()));
    }
    let too_large = |bytes: u64| {
        invalid(format!(
            "it has {bytes} bytes, more than the {MAX_PTX_FILE_BYTES} (64 MiB) a PTX file may have"
        ))
    };
    if meta.len() > MAX_PTX_FILE_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_PTX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_PTX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    if bytes.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    String::from_utf8(bytes).map_err(|e| {
        Error::new(
            ErrorKind::InvalidData,
            format!(
                "it is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The PTX distgemm runs: `DISTGEMM_PTX` if set, else the embedded PTX.
pub fn default_ptx() -> Result<(Cow<'static, str>, PtxOrigin)> {
    read_ptx(select_ptx_source(
        std::env::var_os(PTX_ENV_VAR),
        embedded_ptx(),
    )?)
}

/// The kernel names kernels-gpu declares, for error messages.
fn known_kernels() -> String {
    kernels_gpu::meta::KERNELS
        .iter()
        .map(|k| k.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Turns a NUL-terminated log buffer of which the driver filled `len` bytes into text.
fn log_text(buffer: &[u8], len: usize) -> String {
    let filled = &buffer[..len.min(buffer.len())];
    let end = filled.iter().position(|&b| b == 0).unwrap_or(filled.len());
    String::from_utf8_lossy(&filled[..end])
        .trim_end()
        .to_owned()
}

/// A loaded PTX module (`CUmodule`) on one GPU; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    gpu: Gpu,
    origin: PtxOrigin,
}

// SAFETY: a CUmodule may be used from any thread once its context is current, which every
// method ensures with `bind`.
unsafe impl Send for Module {}
// SAFETY: as above; the module is immutable after loading.
unsafe impl Sync for Module {}

impl Module {
    /// Loads distgemm's PTX ([`default_ptx`]) on `gpu`.
    pub fn load(gpu: &Gpu) -> Result<Arc<Module>> {
        let (ptx, origin) = default_ptx()?;
        Self::from_ptx(gpu, &ptx, origin)
    }

    /// JIT-compiles `ptx` for `gpu` (`cuModuleLoadDataEx` with info and error log buffers).
    pub fn from_ptx(gpu: &Gpu, ptx: &str, origin: PtxOrigin) -> Result<Arc<Module>> {
        let image = CString::new(ptx).map_err(|e| RuntimeError::PtxMalformed {
            origin: origin.to_string(),
            reason: format!("it contains a NUL byte at offset {}", e.nul_position()),
        })?;
        let mut info = vec![0u8; JIT_LOG_BYTES];
        let mut error = vec![0u8; JIT_LOG_BYTES];
        use sys::CUjit_option as O;
        let mut options = [
            O::CU_JIT_INFO_LOG_BUFFER,
            O::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            O::CU_JIT_ERROR_LOG_BUFFER,
            O::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            O::CU_JIT_LOG_VERBOSE,
        ];
        // Option values are pointer-sized slots: buffers by address, sizes and flags by value.
        // The driver writes the number of log bytes it used back into the size slots.
        let mut values: [*mut c_void; 5] = [
            info.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(JIT_LOG_BYTES),
            error.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(JIT_LOG_BYTES),
            std::ptr::without_provenance_mut(1),
        ];
        gpu.bind()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is NUL-terminated PTX; options and values have the same length; the
        // log buffers are JIT_LOG_BYTES long and outlive the call.
        let status = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr().cast(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        let info_log = log_text(&info, values[1].addr());
        let error_log = log_text(&error, values[3].addr());
        if let Err(source) = status.result() {
            let log = match (error_log.is_empty(), info_log.is_empty()) {
                (true, true) => "(the JIT wrote no log)".to_owned(),
                (false, true) => error_log,
                (true, false) => info_log,
                (false, false) => format!("{error_log}\n{info_log}"),
            };
            return Err(RuntimeError::PtxRejected {
                origin: origin.to_string(),
                source,
                log,
            });
        }
        Ok(Arc::new(Module {
            raw,
            gpu: gpu.clone(),
            origin,
        }))
    }

    /// Looks a kernel up by its exported name (`cuModuleGetFunction`) and reads its static
    /// shared memory and current dynamic-shared-memory limit (`cuFuncGetAttribute`; the limit
    /// starts at 48 KiB minus the static part).
    pub fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let not_found = || RuntimeError::KernelNotInModule {
            name: name.to_owned(),
            origin: self.origin.to_string(),
            known: known_kernels(),
        };
        let c_name = CString::new(name).map_err(|_| not_found())?;
        self.gpu.bind()?;
        // SAFETY: the module is loaded and its context current.
        let func = match unsafe { result::module::get_function(self.raw, c_name) } {
            Ok(func) => func,
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND)) => return Err(not_found()),
            Err(source) => {
                return Err(RuntimeError::Driver {
                    call: "cuModuleGetFunction",
                    source,
                });
            }
        };
        let attribute = |attr| {
            // SAFETY: `func` was just returned by cuModuleGetFunction; the module is alive.
            unsafe { result::function::get_function_attribute(func, attr) }
                .map(|v| u32::try_from(v).unwrap_or(0))
                .map_err(RuntimeError::driver("cuFuncGetAttribute"))
        };
        use sys::CUfunction_attribute as A;
        let static_smem = attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        let dynamic_limit = attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        Ok(Kernel {
            func,
            name: name.to_owned(),
            module: Arc::clone(self),
            static_smem,
            dynamic_smem_limit: Arc::new(AtomicU32::new(dynamic_limit)),
        })
    }

    /// Where the PTX came from.
    pub fn origin(&self) -> &PtxOrigin {
        &self.origin
    }

    /// The GPU the module is loaded on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for Module {
    /// `cuModuleUnload`; errors are recorded in the cudarc context (cannot return from drop).
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: loaded by cuModuleLoadDataEx, unloaded once; Kernels hold an Arc<Module>.
        ctx.record_err(unsafe { result::module::unload(self.raw) });
    }
}

/// A kernel of a loaded [`Module`] (`CUfunction`), launched with [`super::launch()`].
/// Clones share the handle and its shared-memory opt-in state.
#[derive(Debug, Clone)]
pub struct Kernel {
    func: sys::CUfunction,
    name: String,
    module: Arc<Module>,
    /// Static shared memory of the function (`.shared` variables), bytes.
    static_smem: u32,
    /// Dynamic shared memory the function is currently allowed (`MAX_DYNAMIC_SHARED_SIZE_BYTES`),
    /// shared by clones because the attribute belongs to the `CUfunction`.
    dynamic_smem_limit: Arc<AtomicU32>,
}

// SAFETY: a CUfunction is a handle valid in any thread with its context current.
unsafe impl Send for Kernel {}
// SAFETY: the only mutable state is an atomic.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// The exported name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GPU the kernel's module is loaded on.
    pub fn gpu(&self) -> &Gpu {
        &self.module.gpu
    }

    /// The raw handle (valid while this `Kernel` lives).
    pub fn cu_function(&self) -> sys::CUfunction {
        self.func
    }

    /// Static shared memory of the kernel, bytes (counts against the per-block maximum).
    pub fn static_smem(&self) -> u32 {
        self.static_smem
    }

    /// Largest dynamic shared memory a launch of this kernel may ask for on its GPU: the
    /// device's opt-in maximum minus the kernel's static shared memory.
    pub fn max_dynamic_smem(&self) -> u32 {
        self.gpu()
            .max_shared_memory_per_block_optin()
            .saturating_sub(self.static_smem)
    }

    /// Makes sure a launch may use `bytes` of dynamic shared memory. Without opting in, static
    /// plus dynamic shared memory is limited to 48 KiB; above that the kernel must raise its
    /// limit with `cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`. Done
    /// once per increase; `bytes` beyond [`Kernel::max_dynamic_smem`] is an error.
    pub fn reserve_dynamic_smem(&self, bytes: u32) -> Result<()> {
        if bytes <= self.dynamic_smem_limit.load(Ordering::Acquire) {
            return Ok(());
        }
        if bytes > self.max_dynamic_smem() {
            return Err(RuntimeError::InvalidLaunch {
                kernel: self.name.clone(),
                reason: format!(
                    "{bytes} bytes of dynamic shared memory plus {} static exceed the device's \
                     opt-in maximum of {} bytes per block",
                    self.static_smem,
                    self.gpu().max_shared_memory_per_block_optin()
                ),
            });
        }
        let value = i32::try_from(bytes).map_err(|_| RuntimeError::InvalidLaunch {
            kernel: self.name.clone(),
            reason: format!("{bytes} bytes of dynamic shared memory is not a valid size"),
        })?;
        self.gpu().bind()?;
        // SAFETY: the function handle is alive (we hold its module) and the context current.
        unsafe {
            result::function::set_function_attribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
        }
        .map_err(RuntimeError::driver(
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        ))?;
        self.dynamic_smem_limit.fetch_max(bytes, Ordering::AcqRel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_ptx_inflates_to_the_file_it_was_built_from() {
        // In this checkout build.rs embeds target/ptx/kernels_gpu.ptx when `build-ptx` wrote
        // it, else the committed copy: whichever it was, the inflated text is that file.
        let ptx = embedded_ptx().expect("this checkout embeds PTX");
        assert_eq!(PTX_EMBEDDED, embedded_ptx().is_some());
        assert!(
            ptx.contains(".target sm_90a"),
            "not PTX: {}",
            &ptx[..ptx.len().min(200)]
        );
        let host = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let built = host.join("../target/ptx/kernels_gpu.ptx");
        let source = if built.is_file() {
            built
        } else {
            host.join("ptx/kernels_gpu.ptx")
        };
        let text = std::fs::read_to_string(&source).expect("the embedded file");
        assert!(
            text == ptx,
            "{} differs from the embedded PTX",
            source.display()
        );
        // Inflated once: every call returns the same text.
        assert!(std::ptr::eq(ptx, embedded_ptx().unwrap()));
    }

    #[test]
    fn env_path_wins_over_embedded_ptx() {
        let s = select_ptx_source(Some("/tmp/k.ptx".into()), Some(".version 8.0")).unwrap();
        assert_eq!(s, PtxSource::File("/tmp/k.ptx".into()));
    }

    #[test]
    fn embedded_ptx_is_used_without_env_and_empty_env_counts_as_unset() {
        assert_eq!(
            select_ptx_source(None, Some("x")).unwrap(),
            PtxSource::Embedded("x")
        );
        assert_eq!(
            select_ptx_source(Some("".into()), Some("x")).unwrap(),
            PtxSource::Embedded("x")
        );
    }

    #[test]
    fn no_ptx_at_all_says_how_to_get_some() {
        let e = select_ptx_source(None, None).unwrap_err();
        assert!(matches!(e, RuntimeError::PtxMissing));
        let msg = e.to_string();
        assert!(
            msg.contains("cargo xtask build-ptx") && msg.contains("DISTGEMM_PTX"),
            "{msg}"
        );
    }

    #[test]
    fn unreadable_env_path_is_named_in_the_error() {
        let path = PathBuf::from("/nonexistent/distgemm/kernels_gpu.ptx");
        let e = read_ptx(PtxSource::File(path.clone())).unwrap_err();
        assert!(matches!(&e, RuntimeError::PtxUnreadable { path: p, .. } if *p == path));
        assert!(
            e.to_string()
                .contains("/nonexistent/distgemm/kernels_gpu.ptx")
        );
    }

    #[test]
    fn ptx_files_must_be_regular_bounded_nonempty_text() {
        let refused = |path: &str| match read_ptx(PtxSource::File(path.into())) {
            Err(e @ RuntimeError::PtxUnreadable { .. }) => e.to_string(),
            other => panic!("{path}: expected PtxUnreadable, got {other:?}"),
        };
        // /dev/zero never ends and /dev/stdin blocks: neither is read at all.
        assert!(refused("/dev/zero").contains("not a regular file"));
        assert!(refused("/dev/stdin").contains("not a regular file") || !is_regular("/dev/stdin"));
        assert!(refused("/").contains("not a regular file"));
        let dir = std::env::temp_dir().join(format!("distgemm-ptx-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
            path.to_string_lossy().into_owned()
        };
        assert!(refused(&file("empty.ptx", b"")).contains("it is empty"));
        assert!(refused(&file("binary.ptx", b"\xff\xfe")).contains("not UTF-8"));
        let nul = read_ptx(PtxSource::File(file("nul.ptx", b".version 8.0\0").into()));
        assert!(
            matches!(nul, Err(RuntimeError::PtxMalformed { .. })),
            "{nul:?}"
        );
        let big = std::fs::File::create(dir.join("big.ptx")).unwrap_or_else(|e| panic!("{e}"));
        big.set_len(MAX_PTX_FILE_BYTES + 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(refused(&dir.join("big.ptx").to_string_lossy()).contains("64 MiB"));
        let ok = read_ptx(PtxSource::File(file("ok.ptx", b".version 8.0").into()));
        assert!(matches!(ok, Ok((text, PtxOrigin::EnvPath(_))) if text == ".version 8.0"));
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    }

    fn is_regular(path: &str) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_file())
    }

    #[test]
    fn jit_logs_stop_at_nul_and_at_the_reported_length() {
        assert_eq!(log_text(b"ptxas error\0garbage", 19), "ptxas error");
        assert_eq!(log_text(b"abcdef", 3), "abc");
        assert_eq!(log_text(b"abc", 99), "abc");
        assert_eq!(log_text(b"\0", 1), "");
    }

    #[test]
    fn known_kernels_lists_the_metadata_table() {
        assert!(known_kernels().contains("smoke_vector_add"));
    }
}
