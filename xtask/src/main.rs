//! Build tasks of distgemm, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `build-ptx`: kernels-gpu → `target/ptx/kernels_gpu.ptx` (nvptx64, sm_90a, PTX ISA 8.6),
//!   with launch bounds from `kernels_gpu::meta::KERNELS` patched in.
//! - `check-ptx`: `ptxas -arch=sm_90a -v` (CUDA 13.0) + `cuobjdump --dump-sass`; per-kernel
//!   resource table; fails on C7508/C7510/C7511/C7515/C7517, on stack/spills in
//!   register-resident kernels, on wgmma kernels without `HGMMA`/`QGMMA`, and on a committed
//!   `host/ptx/kernels_gpu.ptx` that differs from the fresh build (`build-ptx --update-committed`).
//! - `bundle [--out DIR] [--only PARTS]`: PTX + host, test and bench binaries, the PyTorch
//!   wheel + `run-gpu-tests.sh` for a machine with only a CUDA driver (or the parts named).

mod build_ptx;
mod bundle;
mod check_ptx;
mod ptx;
mod ptxas;
mod tools;
mod util;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [options]

tasks:
  build-ptx [--update-committed]
                          compile kernels-gpu to PTX -> target/ptx/kernels_gpu.ptx; with
                          --update-committed also copy it to host/ptx/kernels_gpu.ptx (the
                          PTX that crates depending on distgemm embed; commit it)
  check-ptx [--no-build]  build-ptx, then ptxas -v / cuobjdump gates (CUDA 13.0 tools from
                          PATH or PyPI wheels cached in target/cuda-tools)
  bundle [--out DIR] [--only PARTS]
                          release build + PTX (gzipped) + the CLI, test and bench binaries,
                          the PyTorch wheel + run-gpu-tests.sh into DIR (default: bundle/ in
                          the workspace root); --only takes a comma-separated list of the
                          parts cli, tests, benches, python (e.g. --only tests,python)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> util::Result<()> {
    let Some((task, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        bail!("no task given");
    };
    match task.as_str() {
        "build-ptx" => {
            let mut update_committed = false;
            for a in rest {
                match a.as_str() {
                    "--update-committed" => update_committed = true,
                    other => bail!("build-ptx: unknown argument `{other}`\n{USAGE}"),
                }
            }
            let fresh = build_ptx::build_ptx()?;
            if update_committed {
                build_ptx::update_committed(&fresh)?;
            }
            Ok(())
        }
        "check-ptx" => {
            let mut no_build = false;
            for a in rest {
                match a.as_str() {
                    "--no-build" => no_build = true,
                    other => bail!("check-ptx: unknown argument `{other}`\n{USAGE}"),
                }
            }
            check_ptx::check_ptx(&check_ptx::Options { no_build })
        }
        "bundle" => {
            let mut out = None;
            let mut parts = bundle::Parts::ALL;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--out" => match it.next() {
                        Some(dir) => out = Some(PathBuf::from(dir)),
                        None => bail!("bundle: `--out` needs a directory"),
                    },
                    s if s.starts_with("--out=") => out = Some(PathBuf::from(&s[6..])),
                    "--only" => match it.next() {
                        Some(list) => parts = bundle::Parts::parse(list)?,
                        None => bail!("bundle: `--only` needs a list of parts"),
                    },
                    s if s.starts_with("--only=") => parts = bundle::Parts::parse(&s[7..])?,
                    other => bail!("bundle: unknown argument `{other}`\n{USAGE}"),
                }
            }
            bundle::bundle(&bundle::Options { out, parts })
        }
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown task `{other}`\n{USAGE}"),
    }
}
