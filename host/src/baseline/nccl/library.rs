//! Loading NCCL: the library names tried (cudarc's candidates, then `libnccl.so.2`), the entry
//! points the baseline calls, and `ncclResult_t` → [`NcclError`].

use super::NcclError;
use cudarc::nccl::sys as nccl_sys;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Environment variable naming the NCCL library file to load (overrides the search).
pub const NCCL_LIB_ENV_VAR: &str = "DISTGEMM_NCCL_LIB";

/// `ncclSuccess`.
const NCCL_SUCCESS: u32 = 0;
/// `ncclInProgress` (non-blocking communicators only; ours are blocking).
const NCCL_IN_PROGRESS: u32 = 7;
/// `ncclFloat16` in `nccl.h`.
pub(super) const NCCL_FLOAT16: c_int = 6;
/// `ncclBfloat16` in `nccl.h`.
pub(super) const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum` in `nccl.h`.
pub(super) const NCCL_SUM: c_int = 0;

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
    pub(super) comm_init_all: CommInitAllFn,
    pub(super) comm_destroy: CommDestroyFn,
    pub(super) all_gather: AllGatherFn,
    pub(super) reduce_scatter: ReduceScatterFn,
    pub(super) group_start: GroupFn,
    pub(super) group_end: GroupFn,
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
    pub(super) fn check(&self, call: &'static str, code: u32) -> Result<(), NcclError> {
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
}
