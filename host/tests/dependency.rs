//! A crate that depends on distgemm gets the kernels.
//!
//! Each test writes a scratch crate that depends on distgemm by path (without default
//! features, as a library user would) and whose only code is a compile-time assertion that
//! `distgemm::runtime::module::PTX_EMBEDDED` holds, then runs `cargo check --offline` on
//! it. `host/build.rs` embeds `target/ptx/kernels_gpu.ptx` in a distgemm checkout where
//! `cargo xtask build-ptx` has written it, else the committed `host/ptx/kernels_gpu.ptx`:
//!
//! - [`a_crate_that_depends_on_this_checkout_embeds_the_kernels`] depends on this checkout's
//!   `host/`, so it gets the built PTX when there is one, else the committed one, and fails
//!   when there is neither;
//! - [`a_crate_that_depends_on_a_fresh_checkout_embeds_the_committed_kernels`] depends on a
//!   copy of the workspace's manifest, lock file, `host/` and `kernels-gpu/` in a scratch
//!   directory: a checkout in which nobody ran `build-ptx`, so the only PTX it can embed is the
//!   committed one (what a git or registry dependency gets). While `host/ptx/kernels_gpu.ptx`
//!   does not exist it skips, with a `SKIPPED` line on stderr.
//!
//! `--offline` resolves because the scratch crates get the workspace's `Cargo.lock`, whose
//! versions the main build has already downloaded. Both share one target directory under
//! `CARGO_TARGET_TMPDIR`, kept between runs. The first run checks every dependency (40–70 s on
//! two cores), hence `#[ignore]`: `cargo test -p distgemm --test dependency -- --ignored`
//! (`scripts/test.sh` runs it after `cargo xtask build-ptx`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The committed PTX, relative to `host/`.
const COMMITTED_PTX: &str = "ptx/kernels_gpu.ptx";

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
    distgemm::runtime::module::PTX_EMBEDDED,
    "distgemm was built without its kernels"
);
"#;

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {dir:?}: {e}"));
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
}

/// This crate's directory (`host/`).
fn host_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace root (the parent of `host/`).
fn workspace_dir() -> PathBuf {
    host_dir()
        .parent()
        .unwrap_or_else(|| panic!("host/ has no parent directory"))
        .to_path_buf()
}

/// Copies the directory `from` to `to`, recursively, skipping `target` directories.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("cannot create {to:?}: {e}"));
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("cannot list {from:?}: {e}"));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("cannot list {from:?}: {e}"));
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("cannot stat {src:?}: {e}"));
        if kind.is_dir() {
            if entry.file_name() != "target" {
                copy_tree(&src, &dst);
            }
        } else if kind.is_file() {
            std::fs::copy(&src, &dst)
                .unwrap_or_else(|e| panic!("cannot copy {src:?} to {dst:?}: {e}"));
        }
    }
}

/// Writes the scratch crate `name` depending on the distgemm crate in `host`, runs `cargo
/// check --offline` on it and fails with its output unless it succeeds.
fn check_dependent(name: &str, host: &Path) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(name);
    let host_dir = host.to_string_lossy().replace('\\', "/");
    write(
        &dir.join("Cargo.toml"),
        &MANIFEST.replace("HOST_DIR", &host_dir),
    );
    write(&dir.join("src/lib.rs"), LIB);
    // The workspace's lock file pins the versions already in the local registry cache, so
    // `--offline` resolves.
    if let Ok(lock) = std::fs::read_to_string(workspace_dir().join("Cargo.lock")) {
        write(&dir.join("Cargo.lock"), &lock);
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", tmp.join("distgemm-dependent-target"))
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "`cargo check` of a crate that depends on {} failed in {}{}:\n{stderr}",
        host.display(),
        dir.display(),
        if stderr.contains("built without its kernels") {
            " (no PTX to embed: run `cargo xtask build-ptx`, and commit host/ptx/kernels_gpu.ptx \
             with `cargo xtask build-ptx --update-committed`)"
        } else {
            ""
        }
    );
}

#[test]
#[ignore = "checks a scratch crate's whole dependency tree, about a minute when cold: \
            cargo test -p distgemm --test dependency -- --ignored"]
fn a_crate_that_depends_on_this_checkout_embeds_the_kernels() {
    check_dependent("distgemm-dependent", &host_dir());
}

#[test]
#[ignore = "checks a scratch crate's whole dependency tree, about a minute when cold: \
            cargo test -p distgemm --test dependency -- --ignored"]
fn a_crate_that_depends_on_a_fresh_checkout_embeds_the_committed_kernels() {
    if !host_dir().join(COMMITTED_PTX).is_file() {
        // Straight to stderr: libtest captures `eprintln!` of a passing test.
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED dependency::a_crate_that_depends_on_a_fresh_checkout_embeds_the_committed_kernels: \
             no committed host/{COMMITTED_PTX} (`cargo xtask build-ptx --update-committed` writes it)"
        );
        return;
    }
    // A checkout without target/ptx: the workspace manifest and lock file, the library and the
    // kernels' crate (whose Cargo.toml marks the copy as a distgemm checkout for build.rs).
    let root = workspace_dir();
    let copy = Path::new(env!("CARGO_TARGET_TMPDIR")).join("distgemm-fresh-checkout");
    if copy.exists() {
        std::fs::remove_dir_all(&copy).unwrap_or_else(|e| panic!("cannot remove {copy:?}: {e}"));
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        let text = std::fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
        write(&copy.join(file), &text);
    }
    copy_tree(&host_dir(), &copy.join("host"));
    copy_tree(&root.join("kernels-gpu"), &copy.join("kernels-gpu"));
    assert!(
        !copy.join("target/ptx/kernels_gpu.ptx").exists(),
        "the copy must have no built PTX"
    );
    check_dependent("distgemm-dependent-fresh", &copy.join("host"));
}
