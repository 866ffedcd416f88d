//! Embeds the kernels' PTX, so that the library and the `distgemm` binary carry their kernels.
//!
//! Two sources, in this order:
//! 1. `<workspace>/target/ptx/kernels_gpu.ptx`, written by `cargo xtask build-ptx` — looked for
//!    only in a distgemm checkout (next to `kernels-gpu/`), where it is the PTX of the kernels'
//!    current source;
//! 2. `host/ptx/kernels_gpu.ptx`, the committed copy (`cargo xtask build-ptx
//!    --update-committed`; `cargo xtask check-ptx` fails when it no longer matches the
//!    source) — what a crate that depends on distgemm by path, by git or from a registry gets.
//!
//! The one found is deflated into `OUT_DIR` (`kernels_gpu.ptx.deflate`: the PTX is 4 MB of
//! text, about a tenth of that compressed, and every binary and test carries it) and the cfg
//! `distgemm_embedded_ptx` is set, so that `runtime::module` can `include_bytes!` it and
//! inflate it on first use; with neither, the binary is built without PTX and says so at run
//! time (or reads `DISTGEMM_PTX`).
//!
//! Re-running: Cargo re-runs a build script whenever a `rerun-if-changed` path is *missing*, so
//! in the workspace the directory `target/ptx` is created if absent and watched (Cargo scans a
//! watched directory for modified files, which catches a later `build-ptx`); files are watched
//! only when they exist, so a committed PTX that appears after a build that found none is
//! picked up at the next change of `build.rs` or `target/ptx` (or after `cargo clean -p
//! distgemm`). Outside the workspace nothing is created.

use std::path::{Path, PathBuf};

/// The committed PTX, relative to this crate's root.
const COMMITTED_PTX: &str = "ptx/kernels_gpu.ptx";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(distgemm_embedded_ptx)");
    println!("cargo::rerun-if-changed=build.rs");

    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };

    let candidates = [
        workspace_ptx(&manifest_dir),
        Some(manifest_dir.join(COMMITTED_PTX)),
    ];
    let Some(ptx) = candidates.into_iter().flatten().find(|p| p.is_file()) else {
        return;
    };
    println!("cargo::rerun-if-changed={}", ptx.display());
    let deflated = std::fs::read(&ptx)
        .map(|text| miniz_oxide::deflate::compress_to_vec(&text, 9))
        .and_then(|bytes| std::fs::write(out_dir.join("kernels_gpu.ptx.deflate"), bytes));
    match deflated {
        Ok(()) => println!("cargo::rustc-cfg=distgemm_embedded_ptx"),
        Err(e) => println!(
            "cargo::warning=could not deflate {} into OUT_DIR ({e}); building without embedded PTX",
            ptx.display()
        ),
    }
}

/// In a distgemm checkout (this crate's parent holds `kernels-gpu/`): the path where
/// `cargo xtask build-ptx` writes the PTX, with its directory created and watched. Elsewhere
/// (a registry package, or Cargo's own checkout of a git dependency, which Cargo marks with a
/// `.cargo-ok` file and which no one runs `build-ptx` in): `None`.
fn workspace_ptx(manifest_dir: &Path) -> Option<PathBuf> {
    let root = manifest_dir.parent()?;
    if !root.join("kernels-gpu").join("Cargo.toml").is_file() || root.join(".cargo-ok").exists() {
        return None;
    }
    let dir = root.join("target").join("ptx");
    if std::fs::create_dir_all(&dir).is_ok() {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    Some(dir.join("kernels_gpu.ptx"))
}
