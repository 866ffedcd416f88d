//! `distgemm._distgemm`: the extension module of the `distgemm` Python package.
//!
//! It exposes one class, [`rank::PyRankGemm`] (Python name `RankGemm`), a thin wrapper of
//! [`distgemm::cuda::RankGemm`] — one rank of a tensor-parallel GEMM in a group of processes
//! — and the exception `distgemm.DistGemmError(RuntimeError)`. Everything a user calls lives in
//! the Python package (`distgemm/_ops.py`): it checks the torch tensors, keeps them alive, and
//! passes raw device addresses here, which is what makes [`rank::PyRankGemm::launch`]'s call
//! of the unsafe `launch_raw` sound (see its comment).
//!
//! Errors: a shape or argument the schedule cannot run, and FP8 scales that are missing or out
//! of range, raise `ValueError`; everything else raised by distgemm (CUDA errors, a peer that
//! timed out, a rendezvous that failed) raises `DistGemmError`. A Rust panic never unwinds into
//! the interpreter: every entry point runs inside [`guard`], which turns one into a
//! `DistGemmError`.

mod rank;
mod rendezvous;

use std::panic::{AssertUnwindSafe, catch_unwind};

use distgemm::cuda::DistGemmError as RustError;
use distgemm::plan::PlanError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    distgemm,
    DistGemmError,
    PyRuntimeError,
    "An error of distgemm's CUDA runtime: a CUDA failure, a peer rank that did not arrive \
     within the timeout (the message names rank, device, stage and flag), a failed rendezvous \
     or an instance used after close(). Recovery is a rebuild on every rank \
     (distgemm.clear_cache() on all ranks)."
);

/// Maps a distgemm error to the Python exception a caller can act on.
fn to_py_err(err: RustError) -> PyErr {
    match err {
        RustError::Plan(PlanError::Schedule(e)) => PyValueError::new_err(e.to_string()),
        e @ RustError::Fp8Scales(_) => PyValueError::new_err(e.to_string()),
        other => DistGemmError::new_err(other.to_string()),
    }
}

/// Runs `f`, turning a Rust panic into a `DistGemmError` instead of unwinding into Python.
fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        Err(DistGemmError::new_err(format!(
            "internal error in distgemm during {what}: {msg}"
        )))
    })
}

#[pymodule]
fn _distgemm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DistGemmError", m.py().get_type::<DistGemmError>())?;
    m.add_class::<rank::PyRankGemm>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // How many bytes of kernel PTX the library carries (0: built without; then only
    // DISTGEMM_PTX=<file> makes it usable). The GPU checks and CI assert it.
    m.add(
        "embedded_ptx_bytes",
        distgemm::runtime::module::embedded_ptx().map_or(0, str::len),
    )?;
    Ok(())
}
