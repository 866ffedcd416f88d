//! `cargo xtask build-ptx`: kernels-gpu → nvptx64 PTX, checked and patched, at
//! `target/ptx/kernels_gpu.ptx`.
//!
//! The committed copy: `host/ptx/kernels_gpu.ptx` is what a crate that depends on distgemm
//! embeds (it has no `target/ptx`; see `host/build.rs`). `build-ptx --update-committed` copies
//! the fresh build there, and `check-ptx` fails when the committed copy no longer matches the
//! kernels' source ([`committed_ptx_mismatch`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kernels_gpu::meta::{KERNELS, KernelInfo};

use crate::bail;
use crate::ptx::{self, LaunchBounds, PatchAction};
use crate::util::{self, Result};

/// RUSTFLAGS for the nvptx build: every crate (also `core` from `-Zbuild-std`) must get the same
/// `target-cpu`; `+ptx86` is PTX ISA 8.6, which the H200 machines' driver (CUDA 13.0, ISA ≤ 9.0)
/// accepts and which the NVVM intrinsics we use require.
pub const RUSTFLAGS: &str = "-C target-cpu=sm_90a -C target-feature=+ptx86";
pub const TARGET: &str = "nvptx64-nvidia-cuda";
/// The newest PTX ISA the GPU machines' driver JIT accepts.
pub const MAX_PTX_ISA: (u32, u32) = (9, 0);
pub const SM: &str = "sm_90a";
/// The committed PTX, relative to the workspace root: embedded by `host/build.rs` when
/// `target/ptx/kernels_gpu.ptx` does not exist (a dependent crate, a packaged crate).
pub const COMMITTED_PTX_REL_PATH: &str = "host/ptx/kernels_gpu.ptx";
/// The command that brings the committed PTX up to date (quoted in check-ptx's failure).
pub const UPDATE_COMMITTED_CMD: &str = "cargo xtask build-ptx --update-committed";

/// Builds, checks and patches the PTX; returns the path of the written file.
pub fn build_ptx() -> Result<PathBuf> {
    let root = util::workspace_root();
    let target_dir = root.join("target/ptx-build");
    let started = Instant::now();
    println!("xtask build-ptx: compiling kernels-gpu for {TARGET} ({RUSTFLAGS})");
    util::run(
        util::cargo()
            .current_dir(&root)
            .env("RUSTFLAGS", RUSTFLAGS)
            .env("CARGO_TARGET_DIR", &target_dir)
            .args([
                "rustc",
                "-p",
                "kernels-gpu",
                "--release",
                "--target",
                TARGET,
            ])
            .args(["-Zbuild-std=core", "--crate-type", "cdylib"]),
    )
    .map_err(|e| {
        util::Error(format!(
            "{e}\n  (the nvptx build needs the pinned toolchain with the `rust-src` and \
             `llvm-bitcode-linker` components: run `rustup toolchain install` in {})",
            root.display()
        ))
    })?;
    let built = target_dir.join(TARGET).join("release/kernels_gpu.ptx");
    let text = util::read_to_string(&built).map_err(|e| {
        util::Error(format!(
            "{e}\n  (cargo succeeded but rustc wrote no PTX where expected)"
        ))
    })?;

    let (patched, actions) = check_and_patch(&text, KERNELS)?;
    for action in &actions {
        match action {
            PatchAction::Inserted {
                kernel,
                maxntid,
                minnctapersm,
            } => println!(
                "xtask build-ptx: patched `.entry {kernel}`: added `.maxntid {maxntid}, 1, 1` \
                 and `.minnctapersm {minnctapersm}` (rustc cannot emit launch bounds; ptxas \
                 needs them to honour setmaxnreg)"
            ),
            PatchAction::AlreadyPresent { kernel } => {
                println!("xtask build-ptx: `.entry {kernel}` already has its launch bounds")
            }
        }
    }
    if actions.is_empty() {
        println!("xtask build-ptx: no kernel in meta::KERNELS has launch bounds; PTX unpatched");
    }
    let out = root.join(util::PTX_REL_PATH);
    // Rewrite only on change: host/build.rs embeds this file and reruns when it is touched.
    let changed = std::fs::read_to_string(&out).ok().as_deref() != Some(patched.as_str());
    if changed {
        util::write(&out, &patched)?;
    }
    let entries = ptx::entries(&patched).map_err(|e| util::Error(e.0))?;
    let (major, minor) = ptx::version(&patched).unwrap_or((0, 0));
    println!(
        "xtask build-ptx: {} {} ({}, PTX ISA {major}.{minor}, .target {SM}, {} entries: {}) in {:.1}s",
        if changed { "wrote" } else { "unchanged:" },
        util::rel(&out),
        util::human_bytes(patched.len() as u64),
        entries.len(),
        entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// `build-ptx --update-committed`: copies the freshly built PTX at `fresh` to
/// [`COMMITTED_PTX_REL_PATH`] (rewritten only when it differs), for the maintainer to commit.
pub fn update_committed(fresh: &Path) -> Result<()> {
    let committed = util::workspace_root().join(COMMITTED_PTX_REL_PATH);
    let text = util::read_to_string(fresh)?;
    if std::fs::read_to_string(&committed).ok().as_deref() == Some(text.as_str()) {
        println!(
            "xtask build-ptx: {} is already up to date",
            util::rel(&committed)
        );
        return Ok(());
    }
    if let Some(dir) = committed.parent() {
        util::create_dir_all(dir)?;
    }
    util::write(&committed, &text)?;
    println!(
        "xtask build-ptx: updated {} ({}); commit it so that crates depending on distgemm get \
         these kernels",
        util::rel(&committed),
        util::human_bytes(text.len() as u64)
    );
    Ok(())
}

/// Compares the committed PTX ([`COMMITTED_PTX_REL_PATH`] under `root`) with `fresh`, the PTX
/// just built from the kernels' source. `None` when they agree; otherwise a message naming
/// the first differing line (or the missing file) and the command that fixes it.
///
/// The comparison ignores the hashes in compiler-generated symbol names ([`without_symbol_hashes`]):
/// `core`'s crate disambiguator in `_R…` names depends on where the toolchain's `rust-src`
/// is installed, so two machines that build the same source may differ there and nowhere else.
pub fn committed_ptx_mismatch(root: &Path, fresh: &str) -> Result<Option<String>> {
    let path = root.join(COMMITTED_PTX_REL_PATH);
    let committed = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Some(format!(
                "{COMMITTED_PTX_REL_PATH} (the PTX that crates depending on distgemm embed) is \
                 missing: run `{UPDATE_COMMITTED_CMD}` and commit it"
            )));
        }
        Err(e) => bail!("cannot read {}: {e}", path.display()),
    };
    let (ours, theirs) = (
        without_symbol_hashes(fresh),
        without_symbol_hashes(&committed),
    );
    if ours == theirs {
        return Ok(None);
    }
    let line = ours
        .lines()
        .zip(theirs.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| ours.lines().count().min(theirs.lines().count()))
        + 1;
    Ok(Some(format!(
        "{COMMITTED_PTX_REL_PATH} (the PTX that crates depending on distgemm embed) differs from \
         the PTX built from kernels-gpu ({}) from line {line} on: run `{UPDATE_COMMITTED_CMD}` \
         and commit {COMMITTED_PTX_REL_PATH}",
        util::PTX_REL_PATH
    )))
}

/// `ptx` with the machine-dependent hashes in symbol names blanked: the crate disambiguator
/// `Cs<base62>_` inside v0-mangled names (`_R…`) becomes `Cs_`, and the hash of an anonymous
/// global `anon_$_<hex>_$_N` becomes `anon_$__$_N`. Everything else is kept byte for byte.
pub fn without_symbol_hashes(ptx: &str) -> String {
    const ANON: &str = "anon_$_";
    let bytes = ptx.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'$';
    let mut out = String::with_capacity(ptx.len());
    let mut i = 0;
    while i < bytes.len() {
        let starts_ident = i == 0 || !is_ident(bytes[i - 1]);
        if starts_ident && ptx[i..].starts_with("_R") {
            let end = i + bytes[i..]
                .iter()
                .position(|&b| !is_ident(b))
                .unwrap_or(bytes.len() - i);
            let name = &ptx[i..end];
            let mut rest = name;
            while let Some(at) = rest.find("Cs") {
                let after = &rest[at + 2..];
                match after.find(|c: char| !c.is_ascii_alphanumeric()) {
                    Some(len) if after.as_bytes()[len] == b'_' => {
                        out.push_str(&rest[..at]);
                        out.push_str("Cs_");
                        rest = &after[len + 1..];
                    }
                    _ => {
                        out.push_str(&rest[..at + 2]);
                        rest = after;
                    }
                }
            }
            out.push_str(rest);
            i = end;
        } else if starts_ident && ptx[i..].starts_with(ANON) {
            let after = &ptx[i + ANON.len()..];
            let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
            out.push_str(ANON);
            i += ANON.len() + hex;
        } else {
            let ch = ptx[i..].chars().next().unwrap_or_default();
            out.push(ch);
            i += ch.len_utf8().max(1);
        }
    }
    out
}

/// Checks rustc's PTX (ISA version, target, entries against `meta::KERNELS`) and applies the
/// launch-bound patch.
fn check_and_patch(text: &str, kernels: &[KernelInfo]) -> Result<(String, Vec<PatchAction>)> {
    match ptx::version(text) {
        Some(v) if v <= MAX_PTX_ISA => {}
        Some((major, minor)) => bail!(
            "the PTX has `.version {major}.{minor}`, newer than ISA {}.{} that the GPU machines' \
             driver (CUDA 13.0) accepts; lower `+ptxNN` in build_ptx::RUSTFLAGS",
            MAX_PTX_ISA.0,
            MAX_PTX_ISA.1
        ),
        None => bail!("the PTX has no `.version` directive: not a PTX module?"),
    }
    match ptx::target(text) {
        Some(t) if t == SM => {}
        other => bail!(
            "the PTX targets `{}`, expected `.target {SM}` (is `-C target-cpu={SM}` in RUSTFLAGS?)",
            other.as_deref().unwrap_or("<none>")
        ),
    }
    let entries = ptx::entries(text).map_err(|e| util::Error(e.0))?;
    let in_ptx: BTreeSet<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let in_meta: BTreeSet<&str> = kernels.iter().map(|k| k.name).collect();
    let missing: Vec<&str> = in_meta.difference(&in_ptx).copied().collect();
    if !missing.is_empty() {
        bail!(
            "kernel(s) listed in kernels-gpu/src/meta.rs (KERNELS) but not found as `.entry` in \
             the PTX: {}\n  (is each one `#[unsafe(no_mangle)] pub unsafe extern \"ptx-kernel\" fn` \
             in a module compiled for nvptx64?)",
            missing.join(", ")
        );
    }
    let unlisted: Vec<&str> = entries
        .iter()
        .filter(|e| e.visible && !in_meta.contains(e.name.as_str()))
        .map(|e| e.name.as_str())
        .collect();
    if !unlisted.is_empty() {
        bail!(
            "kernel(s) exported by the PTX (`.visible .entry`) but missing from \
             kernels-gpu/src/meta.rs (KERNELS): {}\n  (add a KernelInfo for each so the host, \
             build-ptx and check-ptx know about it)",
            unlisted.join(", ")
        );
    }
    let bounds: Vec<LaunchBounds<'_>> = kernels
        .iter()
        .filter_map(|k| {
            let (maxntid, minnctapersm) = k.launch_bounds?;
            Some(LaunchBounds {
                kernel: k.name,
                maxntid,
                minnctapersm,
            })
        })
        .collect();
    let (text, _) = ptx::patch_entry_param_0(text).map_err(|e| util::Error(e.0))?;
    ptx::patch_launch_bounds(&text, &bounds).map_err(|e| util::Error(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn info(name: &'static str, launch_bounds: Option<(u32, u32)>) -> KernelInfo {
        KernelInfo {
            name,
            launch_bounds,
            register_resident: false,
            uses_wgmma: false,
        }
    }

    const PTX: &str = ".version 8.6\n.target sm_90a\n.address_size 64\n\
                       .visible .entry gemm(\n.param .u64 gemm_param_0\n)\n{\nret;\n}\n\
                       .visible .entry add()\n{\nret;\n}\n";

    #[test]
    fn patches_kernels_with_bounds() {
        let table = [info("gemm", Some((384, 1))), info("add", None)];
        let (out, actions) = check_and_patch(PTX, &table).expect("ok");
        assert_eq!(actions.len(), 1);
        assert!(out.contains("gemm_param_0\n)\n.maxntid 384, 1, 1\n.minnctapersm 1\n{"));
        assert!(out.contains(".visible .entry add()\n{"));
    }

    #[test]
    fn meta_and_ptx_must_agree() {
        let err = check_and_patch(PTX, &[info("gemm", None)]).expect_err("add not in meta");
        assert!(err.0.contains("missing from kernels-gpu/src/meta.rs") && err.0.contains("add"));
        let table = [info("gemm", None), info("add", None), info("gone", None)];
        let err = check_and_patch(PTX, &table).expect_err("gone not in PTX");
        assert!(
            err.0.contains("not found as `.entry`") && err.0.contains("gone"),
            "{err}"
        );
    }

    #[test]
    fn symbol_hashes_are_ignored_and_code_is_not() {
        let a = ".func _RNvNtCs34ojFt4RIcT_4core9panicking9panic_fmt\n\
                 .extern .shared .b8 anon_$_22926aad92799c81_$_0[];\nadd.s32 %r1, %r2, 1;\n";
        let b = a
            .replace("Cs34ojFt4RIcT_", "CsZZ9Yq_")
            .replace("22926aad92799c81", "0123abcd");
        assert_eq!(
            without_symbol_hashes(a),
            ".func _RNvNtCs_4core9panicking9panic_fmt\n\
             .extern .shared .b8 anon_$__$_0[];\nadd.s32 %r1, %r2, 1;\n"
        );
        assert_eq!(without_symbol_hashes(a), without_symbol_hashes(&b));
        let c = a.replace("%r2, 1;", "%r2, 2;");
        assert_ne!(without_symbol_hashes(a), without_symbol_hashes(&c));
        // Names that merely contain `Cs` or `_R` elsewhere are left alone.
        let plain = "mov.u32 %rCs1, 0; // x_R y\n";
        assert_eq!(without_symbol_hashes(plain), plain);
    }

    #[test]
    fn committed_ptx_must_exist_and_match() {
        let root = std::env::temp_dir().join(format!("xtask-committed-{}", std::process::id()));
        let committed = root.join(COMMITTED_PTX_REL_PATH);
        let _ = std::fs::remove_dir_all(&root);
        let absent = committed_ptx_mismatch(&root, PTX)
            .expect("absent")
            .expect("a missing committed PTX is a failure");
        assert!(absent.contains("missing") && absent.contains(UPDATE_COMMITTED_CMD));
        std::fs::create_dir_all(committed.parent().expect("parent")).expect("mkdir");
        std::fs::write(&committed, PTX).expect("write");
        assert_eq!(committed_ptx_mismatch(&root, PTX).expect("same"), None);
        let newer = PTX.replace("add()", "add2()");
        let msg = committed_ptx_mismatch(&root, &newer)
            .expect("read")
            .expect("differs");
        assert!(
            msg.contains(UPDATE_COMMITTED_CMD) && msg.contains("line 10"),
            "{msg}"
        );
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn rejects_new_isa_and_wrong_target() {
        let table = [info("gemm", None), info("add", None)];
        let newer = PTX.replace(".version 8.6", ".version 9.1");
        assert!(
            check_and_patch(&newer, &table)
                .expect_err("9.1")
                .0
                .contains("9.1")
        );
        assert!(check_and_patch(&PTX.replace(".version 8.6", ".version 9.0"), &table).is_ok());
        let sm80 = PTX.replace("sm_90a", "sm_80");
        assert!(
            check_and_patch(&sm80, &table)
                .expect_err("sm_80")
                .0
                .contains("sm_80")
        );
    }
}
