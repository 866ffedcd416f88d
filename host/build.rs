//! Embeds the kernels' PTX when `cargo xtask build-ptx` has written it.
//!
//! If `<workspace>/target/ptx/kernels_gpu.ptx` exists it is copied to `OUT_DIR` and the cfg
//! `distgemm_embedded_ptx` is set, so `runtime::module` can `include_str!` it. Otherwise the
//! binary is built without PTX and says so at run time (or reads `DISTGEMM_PTX`).
//!
//! Re-running: Cargo re-runs a build script whenever a `rerun-if-changed` path is *missing*,
//! so the directory `target/ptx` is created if absent and watched (Cargo scans a watched
//! directory for modified files, which catches a later `build-ptx`); the file itself is
//! watched only when it exists.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(distgemm_embedded_ptx)");
    println!("cargo::rerun-if-changed=build.rs");

    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let ptx_dir = manifest_dir.join("..").join("target").join("ptx");
    let ptx = ptx_dir.join("kernels_gpu.ptx");

    if std::fs::create_dir_all(&ptx_dir).is_ok() {
        println!("cargo::rerun-if-changed={}", ptx_dir.display());
    }
    if ptx.is_file() {
        println!("cargo::rerun-if-changed={}", ptx.display());
        match std::fs::copy(&ptx, out_dir.join("kernels_gpu.ptx")) {
            Ok(_) => println!("cargo::rustc-cfg=distgemm_embedded_ptx"),
            Err(e) => println!(
                "cargo::warning=could not copy {} into OUT_DIR ({e}); building without embedded PTX",
                ptx.display()
            ),
        }
    }
}
