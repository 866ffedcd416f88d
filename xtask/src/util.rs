//! Small helpers shared by the tasks: errors, paths, running commands.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// A task failure: a message meant for the person running the task.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Error(s.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Returns early with a formatted [`Error`].
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => { return Err($crate::util::Error(format!($($arg)*))) };
}

/// The workspace root (the parent of the xtask crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Where `build-ptx` writes the final, patched PTX (relative to the workspace root).
pub const PTX_REL_PATH: &str = "target/ptx/kernels_gpu.ptx";

/// The cargo that runs this xtask (the pinned toolchain's), or `cargo` from PATH.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // An outer CARGO_ENCODED_RUSTFLAGS would override the RUSTFLAGS tasks set.
    cmd.env_remove("CARGO_ENCODED_RUSTFLAGS");
    cmd
}

/// `program args...` as one shell-like line, for logs.
pub fn display_cmd(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter(|(k, _)| *k != "PATH")
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), quote(v?))))
        .collect();
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_=./:+,@%".contains(&c))
    {
        s.into_owned()
    } else {
        format!("\"{}\"", s.replace('"', "\\\""))
    }
}

fn spawn_error(cmd: &Command, e: std::io::Error) -> Error {
    let program = cmd.get_program().to_string_lossy();
    if e.kind() == std::io::ErrorKind::NotFound {
        Error(format!(
            "`{program}` was not found (is it installed and on PATH?)"
        ))
    } else {
        Error(format!("could not start `{program}`: {e}"))
    }
}

/// Runs a command with inherited stdio; fails on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    println!("xtask: $ {}", display_cmd(cmd));
    let started = Instant::now();
    let status = cmd.status().map_err(|e| spawn_error(cmd, e))?;
    if !status.success() {
        bail!(
            "`{}` failed ({status}) after {:.1}s",
            display_cmd(cmd),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Runs a command capturing stdout and stderr (stdin closed); returns the output whatever the
/// exit status.
pub fn capture(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(std::process::Stdio::null());
    cmd.output().map_err(|e| spawn_error(cmd, e))
}

/// Runs a command capturing stdout while stderr goes to the terminal; fails on a non-zero exit.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    println!("xtask: $ {}", display_cmd(cmd));
    cmd.stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    let out = cmd.output().map_err(|e| spawn_error(cmd, e))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", display_cmd(cmd), out.status);
    }
    String::from_utf8(out.stdout)
        .map_err(|_| Error(format!("`{}` printed non-UTF-8 output", display_cmd(cmd))))
}

pub fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error(format!("cannot read {}: {e}", path.display())))
}

pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    if let Some(dir) = path.parent() {
        create_dir_all(dir)?;
    }
    std::fs::write(path, contents)
        .map_err(|e| Error(format!("cannot write {}: {e}", path.display())))
}

pub fn create_dir_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error(format!("cannot create directory {}: {e}", dir.display())))
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n as f64 >= MIB {
        format!("{:.1} MiB", n as f64 / MIB)
    } else if n >= 1024 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// `path` relative to the workspace root when it lies inside it (for shorter messages).
pub fn rel(path: &Path) -> String {
    let root = workspace_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}
