//! `cargo xtask bundle [--out DIR] [--only PARTS]`: everything a machine with only a CUDA
//! driver needs to run the GPU tests and benches, in one folder (or the parts asked for).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::util::{self, Result};
use crate::{bail, build_ptx};

/// The scripts written into every bundle: the test runner, the whole check-and-bench matrix,
/// the sanitizer runs, the Nsight Compute durations at boost and base clocks, and the
/// environment they source.
pub const SCRIPTS: [(&str, &str); 5] = [
    (
        "run-gpu-tests.sh",
        include_str!("../assets/run-gpu-tests.sh"),
    ),
    (
        "run-gpu-matrix.sh",
        include_str!("../assets/run-gpu-matrix.sh"),
    ),
    (
        "run-sanitizers.sh",
        include_str!("../assets/run-sanitizers.sh"),
    ),
    (
        "run-ncu-durations.sh",
        include_str!("../assets/run-ncu-durations.sh"),
    ),
    ("gpu-env.sh", include_str!("../assets/gpu-env.sh")),
];
/// The carry limit of the GPU machines' file transfer: the bundle must stay well below it.
const LIMIT: u64 = 64 * 1024 * 1024;
/// Marker file that says a folder is a bundle (so `bundle` may clear it).
const MANIFEST: &str = "MANIFEST.txt";
/// The bundle's PTX, gzipped (`gpu-env.sh` unpacks it beside itself as `kernels_gpu.ptx`).
const PTX_GZ: &str = "kernels_gpu.ptx.gz";

pub struct Options {
    pub out: Option<PathBuf>,
    pub parts: Parts,
}

/// What a bundle holds besides the PTX and the scripts. `--only tests,python` leaves out the
/// CLI and the benches: a smaller folder to carry when only the checks are to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    /// `bin/distgemm`.
    pub cli: bool,
    /// `tests/`: every integration-test binary.
    pub tests: bool,
    /// `benches/` and the PyTorch peer scripts in `peers/`.
    pub benches: bool,
    /// `python/`: the abi3 wheel, its GPU checks and the MLP example.
    pub python: bool,
}

impl Parts {
    pub const ALL: Parts = Parts {
        cli: true,
        tests: true,
        benches: true,
        python: true,
    };

    /// The parts a comma-separated list names (`cli`, `tests`, `benches`, `python`).
    pub fn parse(list: &str) -> Result<Parts> {
        let mut parts = Parts {
            cli: false,
            tests: false,
            benches: false,
            python: false,
        };
        for name in list.split(',').map(str::trim) {
            match name {
                "cli" => parts.cli = true,
                "tests" => parts.tests = true,
                "benches" => parts.benches = true,
                "python" => parts.python = true,
                other => bail!(
                    "bundle: `--only` takes parts among cli, tests, benches, python \
                     (comma-separated), not `{other}`"
                ),
            }
        }
        Ok(parts)
    }
}

/// One executable cargo built, from `--message-format=json` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    pub target_name: String,
    pub kinds: Vec<String>,
    pub executable: PathBuf,
}

/// The executables among cargo's `compiler-artifact` messages whose target has one of `kinds`.
pub fn executables(json_lines: &str, kinds: &[&str]) -> Result<Vec<Artifact>> {
    let mut out = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let msg: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| util::Error(format!("cannot parse cargo's JSON message: {e}: {line}")))?;
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let target_kinds: Vec<String> = msg["target"]["kind"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !target_kinds.iter().any(|k| kinds.contains(&k.as_str())) {
            continue;
        }
        let Some(name) = msg["target"]["name"].as_str() else {
            continue;
        };
        out.push(Artifact {
            target_name: name.to_string(),
            kinds: target_kinds,
            executable: PathBuf::from(exe),
        });
    }
    Ok(out)
}

fn cargo_json(
    args: &[&str],
    env: &[(&str, &str)],
    what: &str,
    kinds: &[&str],
) -> Result<Vec<Artifact>> {
    let root = util::workspace_root();
    let mut cmd = util::cargo();
    cmd.current_dir(&root)
        .envs(env.iter().copied())
        .args(args)
        .arg("--message-format=json-render-diagnostics");
    let stdout = util::stdout_of(&mut cmd)
        .map_err(|e| util::Error(format!("building the {what} failed: {e}")))?;
    executables(&stdout, kinds)
}

pub fn bundle(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let root = util::workspace_root();
    let out = opts.out.clone().unwrap_or_else(|| root.join("bundle"));
    let out = if out.is_absolute() {
        out
    } else {
        std::env::current_dir()
            .map_err(|e| util::Error(format!("no current dir: {e}")))?
            .join(out)
    };

    let parts = opts.parts;
    let ptx = build_ptx::build_ptx()?;
    println!("xtask bundle: building release binaries (stripped: [profile.release] strip)");
    let bins = if parts.cli {
        cargo_json(
            &["build", "--release", "-p", "distgemm", "--bins"],
            &[],
            "host binaries",
            &["bin"],
        )?
    } else {
        Vec::new()
    };
    let tests = if parts.tests {
        cargo_json(
            &["test", "--release", "--no-run", "-p", "distgemm-tests"],
            &[],
            "integration tests",
            &["test"],
        )?
    } else {
        Vec::new()
    };
    let benches = if parts.benches {
        // The benches record the commit they measure; the GPU machine has no repository to
        // ask.
        let commit = bench_commit();
        cargo_json(
            &["bench", "--no-run", "-p", "distgemm-benches"],
            &[("DISTGEMM_COMMIT", commit.as_str())],
            "benches",
            &["bench"],
        )?
    } else {
        Vec::new()
    };
    let python = if parts.python {
        python_package(&root)?
    } else {
        Vec::new()
    };

    prepare_out_dir(&out)?;
    // The PTX gzipped (a sixth of its size); `gpu-env.sh` unpacks it on the GPU machine. The
    // binaries embed the same PTX: this copy is what `DISTGEMM_PTX` points at, so another PTX
    // can be swapped in without rebuilding them.
    let ptx_gz = out.join(PTX_GZ);
    gzip(&ptx, &ptx_gz)?;
    let mut files: Vec<(String, u64)> = vec![(PTX_GZ.into(), file_len(&ptx_gz)?)];
    let mut copy = |from: &Path, to_rel: &str| -> Result<()> {
        let to = out.join(to_rel);
        if let Some(dir) = to.parent() {
            util::create_dir_all(dir)?;
        }
        let n = std::fs::copy(from, &to).map_err(|e| {
            util::Error(format!(
                "cannot copy {} to {}: {e}",
                from.display(),
                to.display()
            ))
        })?;
        files.push((to_rel.to_string(), n));
        Ok(())
    };
    for a in unique_names(&bins) {
        copy(&a.1.executable, &format!("bin/{}", a.0))?;
    }
    for a in unique_names(&tests) {
        copy(&a.1.executable, &format!("tests/{}", a.0))?;
    }
    for a in unique_names(&benches) {
        copy(&a.1.executable, &format!("benches/{}", a.0))?;
    }
    let peers = root.join("benches/peers");
    if let Some(dir) = parts
        .benches
        .then(|| std::fs::read_dir(&peers).ok())
        .flatten()
    {
        let mut scripts: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "py") && p.is_file())
            .collect();
        scripts.sort();
        for p in scripts {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            copy(&p, &format!("peers/{name}"))?;
        }
    }
    for (from, to_rel) in &python {
        copy(from, to_rel)?;
    }
    for (name, text) in SCRIPTS {
        let script = out.join(name);
        util::write(&script, text)?;
        set_executable(&script)?;
        files.push((name.into(), text.len() as u64));
    }

    let total: u64 = files.iter().map(|f| f.1).sum();
    let manifest = manifest(&files, total);
    util::write(&out.join(MANIFEST), &manifest)?;
    print!("{manifest}");
    if parts.tests && tests.is_empty() {
        println!(
            "xtask bundle: warning: package distgemm-tests has no integration-test targets yet"
        );
    }
    if parts.benches && benches.is_empty() {
        println!("xtask bundle: note: package distgemm-benches has no bench targets yet");
    }
    if total >= LIMIT {
        bail!(
            "the bundle is {} — over the 64 MiB that can be carried to a GPU machine",
            util::human_bytes(total)
        );
    }
    if let Some(tree) = tracked_tree_bytes() {
        // A device call carries the checkout's tracked files too, within the same limit.
        let carried = tree + total;
        println!(
            "xtask bundle: with the tracked tree ({}), a call that carries it moves {}{}",
            util::human_bytes(tree),
            util::human_bytes(carried),
            if carried >= LIMIT {
                " — over the 64 MiB a device call carries: build fewer parts (--only)"
            } else {
                " of the 64 MiB a device call carries"
            }
        );
    }
    let folder = out
        .file_name()
        .map_or("bundle".into(), |n| n.to_string_lossy().into_owned());
    println!(
        "xtask bundle: wrote {} ({} in {} files) in {:.1}s\n  on the GPU machine: {folder}/run-gpu-tests.sh [--benches] [FILTER], or {folder}/run-gpu-matrix.sh for the tests and every benchmark",
        out.display(),
        util::human_bytes(total),
        files.len() + 1,
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// The PyTorch package for the GPU machine (CPython 3.12, PyTorch, no Rust, no network): its
/// abi3 wheel, built by `python/build-wheel.sh` after the PTX (which the wheel embeds), with
/// the torchrun checks and the MLP example, as (source, path in the bundle). On the GPU
/// machine: `bundle/python/run.sh`.
fn python_package(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let script = root.join("python/build-wheel.sh");
    let stdout = util::stdout_of(&mut Command::new(&script))?;
    let Some(wheel) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else {
        bail!("{} printed no wheel path", script.display());
    };
    let wheel = PathBuf::from(wheel.trim());
    let Some(name) = wheel.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        bail!(
            "{} printed `{}`, not a wheel file",
            script.display(),
            wheel.display()
        );
    };
    Ok(vec![
        (wheel, format!("python/{name}")),
        (root.join("python/tests/gpu/run.sh"), "python/run.sh".into()),
        (
            root.join("python/tests/gpu/check_ops.py"),
            "python/check_ops.py".into(),
        ),
        (
            root.join("examples/torch_tp_mlp.py"),
            "python/torch_tp_mlp.py".into(),
        ),
    ])
}

/// Target names, made unique (`name`, `name-2`, ...) if two artifacts share one.
fn unique_names(artifacts: &[Artifact]) -> Vec<(String, &Artifact)> {
    let mut seen: Vec<String> = Vec::new();
    artifacts
        .iter()
        .map(|a| {
            let mut name = a.target_name.clone();
            let mut i = 2;
            while seen.contains(&name) {
                name = format!("{}-{i}", a.target_name);
                i += 1;
            }
            seen.push(name.clone());
            (name, a)
        })
        .collect()
}

/// Creates `out`, or empties it if it is a previous bundle; refuses to clear anything else.
fn prepare_out_dir(out: &Path) -> Result<()> {
    if out.exists() {
        let is_empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !is_empty && !out.join(MANIFEST).exists() {
            bail!(
                "{} exists and is not a bundle (no {MANIFEST}); refusing to overwrite it — pass \
                 another --out",
                out.display()
            );
        }
        std::fs::remove_dir_all(out)
            .map_err(|e| util::Error(format!("cannot clear {}: {e}", out.display())))?;
    }
    util::create_dir_all(out)
}

/// The size of the files git tracks in the workspace, or `None` without git.
fn tracked_tree_bytes() -> Option<u64> {
    let root = util::workspace_root();
    let listed = util::capture(
        Command::new("git")
            .current_dir(&root)
            .args(["ls-files", "-z"]),
    )
    .ok()
    .filter(|o| o.status.success())?;
    let bytes = listed
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum();
    Some(bytes)
}

/// `from` compressed into `to` by `gzip -9n` (no name or time stamp in the header).
fn gzip(from: &Path, to: &Path) -> Result<()> {
    let output = util::capture(Command::new("gzip").args(["-9n", "-c"]).arg(from))?;
    if !output.status.success() {
        bail!(
            "gzip {} failed: {}",
            from.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    util::write(to, output.stdout)
}

fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| util::Error(format!("cannot stat {}: {e}", path.display())))
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| util::Error(format!("cannot chmod {}: {e}", path.display())))
}

/// `git ARGS` in the workspace, trimmed, or "unknown".
fn git(args: &[&str]) -> String {
    util::capture(
        Command::new("git")
            .current_dir(util::workspace_root())
            .args(args),
    )
    .ok()
    .filter(|o| o.status.success())
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    .unwrap_or_else(|| "unknown".into())
}

/// Whether tracked files differ from HEAD.
fn is_dirty() -> bool {
    let status = git(&["status", "--porcelain", "--untracked-files=no"]);
    !(status.is_empty() || status == "unknown")
}

/// The commit the bench binaries report: HEAD's short hash, with `-dirty` for uncommitted
/// changes to tracked files.
fn bench_commit() -> String {
    let short = git(&["rev-parse", "--short=7", "HEAD"]);
    if is_dirty() {
        format!("{short}-dirty")
    } else {
        short
    }
}

fn manifest(files: &[(String, u64)], total: u64) -> String {
    let commit = git(&["rev-parse", "HEAD"]);
    let date = util::capture(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut s = format!(
        "distgemm GPU bundle (cargo xtask bundle)\ncommit: {commit}{}\nbuilt: {date}\n\n",
        if is_dirty() {
            " (+ uncommitted changes)"
        } else {
            ""
        }
    );
    for (name, size) in files {
        s.push_str(&format!("{:>10}  {name}\n", util::human_bytes(*size)));
    }
    s.push_str(&format!("{:>10}  total\n", util::human_bytes(total)));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_test_executables_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","package_id":"p","target":{"kind":["lib"],"crate_types":["lib"],"name":"distgemm_tests","src_path":"/x/support/lib.rs","test":true},"profile":{"test":true},"executable":"/t/release/deps/distgemm_tests-1"}
{"reason":"compiler-artifact","target":{"kind":["test"],"name":"gpu_smoke"},"profile":{"test":true},"executable":"/t/release/deps/gpu_smoke-abc","fresh":true}
{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"half"},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}
"#;
        let tests = executables(json, &["test"]).expect("parses");
        assert_eq!(
            tests,
            [Artifact {
                target_name: "gpu_smoke".into(),
                kinds: vec!["test".into()],
                executable: "/t/release/deps/gpu_smoke-abc".into()
            }]
        );
        assert!(executables(json, &["bench"]).expect("parses").is_empty());
        assert!(
            executables("garbage\n", &["test"])
                .expect("non-JSON lines skipped")
                .is_empty()
        );
        assert!(executables("{not json\n", &["test"]).is_err());
    }

    #[test]
    fn only_names_the_parts_it_lists() {
        let parts = Parts::parse("tests,python").expect("parses");
        assert_eq!(
            parts,
            Parts {
                cli: false,
                tests: true,
                benches: false,
                python: true
            }
        );
        assert_eq!(
            Parts::parse("cli, tests,benches,python").expect("parses"),
            Parts::ALL
        );
        for bad in ["", "tests,", "docs", "tests;python"] {
            let err = Parts::parse(bad).expect_err(bad).to_string();
            assert!(err.contains("cli, tests, benches, python"), "{bad}: {err}");
        }
    }

    #[test]
    fn names_are_unique() {
        let a = |n: &str| Artifact {
            target_name: n.into(),
            kinds: vec![],
            executable: "/x".into(),
        };
        let arts = [a("t"), a("u"), a("t")];
        let names: Vec<String> = unique_names(&arts).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["t", "u", "t-2"]);
    }

    #[test]
    fn scripts_are_bash_and_keep_nvls_off() {
        for (name, text) in SCRIPTS {
            assert!(
                text.starts_with("#!/usr/bin/env bash\n") || name == "gpu-env.sh",
                "{name}"
            );
        }
        let (_, env) = SCRIPTS
            .iter()
            .find(|(name, _)| *name == "gpu-env.sh")
            .expect("gpu-env.sh");
        assert!(env.contains("DISTGEMM_PTX="));
        assert!(env.contains("NCCL_NVLS_ENABLE=0"));
        for (name, text) in SCRIPTS.iter().filter(|(name, _)| *name != "gpu-env.sh") {
            assert!(text.contains("source \"$HERE/gpu-env.sh\""), "{name}");
        }
    }
}
