//! A crate that depends on distgemm gets the kernels.
//!
//! The test writes a scratch crate that depends on this one by path (without default features,
//! as a library user would) and whose only code is a compile-time assertion that
//! `distgemm::runtime::module::EMBEDDED_PTX` is `Some`, then runs `cargo check --offline` on it
//! with its own target directory under `CARGO_TARGET_TMPDIR`, kept between runs. The first run
//! checks every dependency (40–70 s on two cores), hence `#[ignore]`: run it with
//! `cargo test -p distgemm --test dependency -- --ignored`.
//!
//! `host/build.rs` embeds `target/ptx/kernels_gpu.ptx` when the workspace has built it, else
//! the committed `host/ptx/kernels_gpu.ptx`; the check fails when neither exists.

use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST: &str = r#"[package]
name = "distgemm-dependent"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
distgemm = { path = "HOST_DIR", default-features = false }

# Not a member of the distgemm workspace that holds this directory.
[workspace]
"#;

const LIB: &str = r#"//! Fails to compile unless distgemm embedded its kernels.
const _: () = assert!(
    distgemm::runtime::module::EMBEDDED_PTX.is_some(),
    "distgemm was built without its kernels"
);
"#;

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {dir:?}: {e}"));
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
}

#[test]
#[ignore = "checks a scratch crate's whole dependency tree, about a minute when cold: \
            cargo test -p distgemm --test dependency -- --ignored"]
fn a_crate_that_depends_on_distgemm_by_path_embeds_the_kernels() {
    let host = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("distgemm-dependent");
    let host_dir = host.to_string_lossy().replace('\\', "/");
    write(
        &dir.join("Cargo.toml"),
        &MANIFEST.replace("HOST_DIR", &host_dir),
    );
    write(&dir.join("src/lib.rs"), LIB);
    // The workspace's lock file pins the versions already in the local registry cache, so
    // `--offline` resolves.
    if let Ok(lock) = std::fs::read_to_string(host.join("../Cargo.lock")) {
        write(&dir.join("Cargo.lock"), &lock);
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "`cargo check` of a crate that depends on distgemm failed in {}{}:\n{stderr}",
        dir.display(),
        if stderr.contains("built without its kernels") {
            " (no PTX to embed: run `cargo xtask build-ptx`, and commit host/ptx/kernels_gpu.ptx \
             with `cargo xtask build-ptx --update-committed`)"
        } else {
            ""
        }
    );
}
