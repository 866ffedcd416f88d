//! Locating `ptxas`, `cuobjdump` and `nvdisasm` (CUDA 13.0 ptxas, matching the GPU machines),
//! installing them from PyPI wheels into `target/cuda-tools` when no suitable toolkit is on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bail;
use crate::util::{self, Result};

/// PyPI wheels that provide the tools. `nvidia-cuda-nvcc` 13.0.88 is CUDA 13.0 (the GPU
/// machines' driver version); `cuobjdump`/`nvdisasm` were first published as wheels for 13.2,
/// and only disassemble the cubin, so the oldest 13.x release is used.
pub const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-cuobjdump==13.2.51",
    "nvidia-cuda-nvdisasm==13.2.51",
];
/// Where the wheels put the binaries, relative to the `--target` folder.
const WHEEL_BIN: &str = "nvidia/cu13/bin";
/// The cache folder, relative to the workspace root.
pub const CACHE_REL: &str = "target/cuda-tools";
const STAMP: &str = "installed-wheels.txt";

/// Paths to the three tools; `bin_dir` must be on PATH when running cuobjdump.
#[derive(Debug, Clone)]
pub struct CudaTools {
    pub ptxas: PathBuf,
    pub cuobjdump: PathBuf,
    pub nvdisasm: PathBuf,
    pub bin_dir: PathBuf,
    pub ptxas_version: String,
}

impl CudaTools {
    /// A command for `tool` with the tools' folder first on PATH (cuobjdump runs nvdisasm).
    pub fn command(&self, tool: &Path) -> Command {
        let mut cmd = Command::new(tool);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.bin_dir.clone()];
        dirs.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
        cmd
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The `release X.Y, VX.Y.Z` line of `ptxas --version`.
fn ptxas_version(ptxas: &Path) -> Option<String> {
    let out = util::capture(Command::new(ptxas).arg("--version")).ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_string())
}

/// Finds the tools on PATH (used only if that ptxas is CUDA 13.0), else in the wheel cache,
/// installing the wheels there first if needed.
pub fn find_or_install() -> Result<CudaTools> {
    if let (Some(ptxas), Some(cuobjdump), Some(nvdisasm)) =
        (which("ptxas"), which("cuobjdump"), which("nvdisasm"))
    {
        match ptxas_version(&ptxas) {
            Some(v) if v.contains("release 13.0") => {
                let bin_dir = nvdisasm.parent().map(Path::to_path_buf).unwrap_or_default();
                println!(
                    "xtask: using CUDA tools from PATH ({}; {v})",
                    ptxas.display()
                );
                return Ok(CudaTools {
                    ptxas,
                    cuobjdump,
                    nvdisasm,
                    bin_dir,
                    ptxas_version: v,
                });
            }
            v => println!(
                "xtask: ignoring {} on PATH ({}): check-ptx validates with CUDA 13.0, the GPU \
                 machines' version; using the PyPI wheels instead",
                ptxas.display(),
                v.as_deref().unwrap_or("version unknown")
            ),
        }
    }
    let cache = util::workspace_root().join(CACHE_REL);
    let bin_dir = cache.join(WHEEL_BIN);
    let tools = |bin_dir: &Path| {
        (
            bin_dir.join("ptxas"),
            bin_dir.join("cuobjdump"),
            bin_dir.join("nvdisasm"),
        )
    };
    let (ptxas, cuobjdump, nvdisasm) = tools(&bin_dir);
    let stamp = cache.join(STAMP);
    let wanted = WHEELS.join("\n");
    let cached = [&ptxas, &cuobjdump, &nvdisasm]
        .iter()
        .all(|p| is_executable(p))
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == wanted);
    if cached {
        println!("xtask: using cached CUDA tools in {}", util::rel(&bin_dir));
    } else {
        install_wheels(&cache)?;
        util::write(&stamp, format!("{wanted}\n"))?;
    }
    for p in [&ptxas, &cuobjdump, &nvdisasm] {
        if !is_executable(p) {
            bail!(
                "{} is missing after installing {}; delete {} and retry",
                p.display(),
                WHEELS.join(" "),
                cache.display()
            );
        }
    }
    let version = ptxas_version(&ptxas).ok_or_else(|| {
        util::Error(format!(
            "`{} --version` did not report a CUDA release",
            ptxas.display()
        ))
    })?;
    Ok(CudaTools {
        ptxas,
        cuobjdump,
        nvdisasm,
        bin_dir,
        ptxas_version: version,
    })
}

fn install_wheels(cache: &Path) -> Result<()> {
    println!(
        "xtask: no CUDA 13.0 ptxas/cuobjdump/nvdisasm on PATH; installing PyPI wheels into {}",
        util::rel(cache)
    );
    if cache.exists() {
        std::fs::remove_dir_all(cache)
            .map_err(|e| util::Error(format!("cannot clear {}: {e}", cache.display())))?;
    }
    util::create_dir_all(cache)?;
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| {
            util::capture(Command::new(p).args(["-m", "pip", "--version"]))
                .is_ok_and(|o| o.status.success())
        })
        .ok_or_else(|| {
            util::Error(
                "check-ptx needs CUDA 13.0's ptxas, cuobjdump and nvdisasm: none are on PATH and \
                 `python3 -m pip` is unavailable to install them. Install pip (e.g. \
                 `apt-get install python3-pip`) or put a CUDA 13.0 toolkit's bin/ on PATH."
                    .to_string(),
            )
        })?;
    util::run(
        Command::new(python)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .args([
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .args(["--no-input", "--quiet", "--target"])
            .arg(cache)
            .args(WHEELS),
    )
    .map_err(|e| {
        util::Error(format!(
            "{e}\n  (installing {} needs access to PyPI or a pip mirror)",
            WHEELS.join(" ")
        ))
    })
}
