//! The PyTorch peer (`peers/torch_async_tp.py`): a subprocess run with a timeout, and the
//! parsing of what it printed (pure).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Times (or errors) of the PyTorch script, keyed by (preset, M, op).
#[derive(Debug, Default, Clone)]
pub struct TorchResults {
    /// Set when the script could not run at all.
    pub failure: Option<String>,
    pub entries: HashMap<(String, usize, String), Result<f64, String>>,
    pub info: Option<serde_json::Value>,
}

impl TorchResults {
    pub fn failed(reason: String) -> Self {
        TorchResults {
            failure: Some(reason),
            ..Default::default()
        }
    }

    /// Parses the script's stdout: one JSON object per line; other lines are ignored.
    pub fn parse(stdout: &str) -> Self {
        let mut r = TorchResults::default();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
                continue;
            };
            let op = v["op"].as_str().unwrap_or_default().to_owned();
            match op.as_str() {
                "info" => r.info = Some(v),
                "setup" => {
                    let e = v["error"].as_str().unwrap_or("setup failed").to_owned();
                    r.failure = Some(match r.failure.take() {
                        Some(prev) => format!("{prev}; {e}"),
                        None => e,
                    });
                }
                _ => {
                    let (Some(preset), Some(m)) = (v["preset"].as_str(), v["m"].as_u64()) else {
                        continue;
                    };
                    let value = match (v["ms"].as_f64(), v["error"].as_str()) {
                        (_, Some(e)) => Err(format!("PyTorch: {e}")),
                        (Some(t), None) => Ok(t),
                        (None, None) => Err("PyTorch record without ms".into()),
                    };
                    r.entries.insert((preset.to_owned(), m as usize, op), value);
                }
            }
        }
        r
    }

    pub fn get(&self, preset: &str, m: usize, op: &str) -> Result<f64, String> {
        if let Some(v) = self.entries.get(&(preset.to_owned(), m, op.to_owned())) {
            return v.clone();
        }
        Err(match &self.failure {
            Some(f) => format!("PyTorch peer did not run: {f}"),
            None => format!("PyTorch script printed no record for {preset} M={m} {op}"),
        })
    }
}

/// Runs a peer benchmark command (stdout piped, one JSON object per line, echoed with a
/// `torch:` prefix) and parses what it printed. The command gets its own process group, so
/// that after `timeout` the whole group (the script and every worker it spawned) is killed.
/// Never fails: a spawn error, a non-zero exit or a timeout is recorded in `failure`, and the
/// records printed before it are kept.
pub fn run_peer_command(mut cmd: Command, timeout: Duration, timeout_flag: &str) -> TorchResults {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    cmd.stdout(Stdio::piped());
    cmd.process_group(0);
    let program = cmd.get_program().to_string_lossy().into_owned();
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return TorchResults::failed(format!("cannot start {program}: {e}")),
    };
    let pid = child.id();
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return TorchResults::failed("no stdout pipe".into());
    };
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("   torch: {line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > timeout => {
                timed_out = true;
                // The whole process group this command leads (its id is the child's pid).
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => break None,
        }
    };
    let text = reader.join().unwrap_or_default();
    let mut r = TorchResults::parse(&text);
    let why = if timed_out {
        Some(format!(
            "timed out after {} s ({timeout_flag})",
            timeout.as_secs()
        ))
    } else {
        match status {
            Some(s) if s.success() => None,
            Some(s) => Some(format!("{program} exited with {s}")),
            None => Some(format!("could not wait for {program}")),
        }
    };
    if let Some(why) = why {
        r.failure = Some(match r.failure.take() {
            Some(prev) => format!("{prev}; {why}"),
            None => why,
        });
    }
    println!(
        "== peer finished in {:.1} s{}",
        started.elapsed().as_secs_f64(),
        r.failure
            .as_ref()
            .map_or(String::new(), |f| format!(" ({f})"))
    );
    r
}

/// Where `peers/torch_async_tp.py` is.
pub fn find_peer_script() -> Result<PathBuf, String> {
    let name = "torch_async_tp.py";
    let mut tried = Vec::new();
    if let Some(dir) = std::env::var_os("DISTGEMM_PEERS_DIR").filter(|d| !d.is_empty()) {
        tried.push(PathBuf::from(dir).join(name));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join("../peers").join(name));
    }
    tried.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("peers")
            .join(name),
    );
    tried.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "{name} not found (tried {}); set DISTGEMM_PEERS_DIR",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distgemm_report::{TORCH_AG, TORCH_RS};
    #[test]
    fn torch_output_is_parsed_with_errors_and_junk() {
        let out = r#"{"op": "info", "torch": "2.11.0"}
NCCL INFO something
{"preset": "llama3-70b-fc1", "m": 16384, "op": "fused_all_gather_matmul", "ms": 12.5}
{"preset": "llama3-70b-fc2", "m": 16384, "op": "fused_matmul_reduce_scatter", "error": "RuntimeError: no"}
"#;
        let t = TorchResults::parse(out);
        assert_eq!(t.get("llama3-70b-fc1", 16384, TORCH_AG), Ok(12.5));
        assert!(
            t.get("llama3-70b-fc2", 16384, TORCH_RS)
                .unwrap_err()
                .contains("RuntimeError: no")
        );
        assert!(
            t.get("llama3-405b-fc1", 16384, TORCH_AG)
                .unwrap_err()
                .contains("no record")
        );
        assert!(t.info.is_some() && t.failure.is_none());
        let t = TorchResults::parse(r#"{"op": "setup", "error": "cannot import torch"}"#);
        assert!(
            t.get("llama3-70b-fc1", 16384, TORCH_AG)
                .unwrap_err()
                .contains("cannot import torch")
        );
    }

    #[test]
    fn peer_command_output_exit_status_and_timeout() {
        let sh = |script: &str| {
            let mut c = Command::new("sh");
            c.arg("-c").arg(script);
            c
        };
        let r = run_peer_command(
            sh(r#"echo '{"preset": "p", "m": 8, "op": "fused_all_gather_matmul", "ms": 1.5}'"#),
            Duration::from_secs(20),
            "--t",
        );
        assert_eq!(r.get("p", 8, TORCH_AG), Ok(1.5));
        assert!(r.failure.is_none());
        let r = run_peer_command(
            sh(
                r#"echo '{"preset": "p", "m": 8, "op": "fused_all_gather_matmul", "ms": 2}'; exit 3"#,
            ),
            Duration::from_secs(20),
            "--t",
        );
        assert_eq!(r.get("p", 8, TORCH_AG), Ok(2.0));
        assert!(r.failure.as_deref().unwrap().contains("exit"), "{r:?}");
        // A hung script with a hung child (like torch.multiprocessing workers): both are
        // killed, and the records printed before the hang are kept.
        let started = Instant::now();
        let r = run_peer_command(
            sh(
                r#"echo '{"preset": "p", "m": 8, "op": "fused_matmul_reduce_scatter", "ms": 3}'; sleep 60 & sleep 60"#,
            ),
            Duration::from_secs(1),
            "--t",
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(r.get("p", 8, TORCH_RS), Ok(3.0));
        assert!(
            r.failure
                .as_deref()
                .unwrap()
                .contains("timed out after 1 s (--t)")
        );
        let r = run_peer_command(
            Command::new("/nonexistent/python3"),
            Duration::from_secs(1),
            "--t",
        );
        assert!(r.failure.as_deref().unwrap().contains("cannot start"));
    }

    #[test]
    fn the_peer_script_is_found_in_the_source_tree() {
        if std::env::var_os("DISTGEMM_PEERS_DIR").is_none() {
            let p = find_peer_script().unwrap();
            assert!(p.ends_with("peers/torch_async_tp.py"), "{}", p.display());
        }
    }
}
