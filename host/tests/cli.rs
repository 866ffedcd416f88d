//! The `distgemm` binary: exit status 2 and exactly one stderr line for every bad input, the
//! plan renderings, `run --backend cpu --check` for every schedule at TP 1, 2, 3, 4, 8,
//! `bench` without GPUs (exit 2, one line naming the CUDA backend), the usage of bare
//! `distgemm`, hints that the command then accepts, and a closed pipe ending quietly.

use std::io::Read;
use std::process::{Command, Output, Stdio};

use distgemm::plan::{Node, Plan};
use distgemm::schedule::ScheduleKind;

fn distgemm(args: &[&str]) -> Output {
    distgemm_with_ptx(args, None)
}

/// Runs distgemm with `DISTGEMM_PTX` set to `ptx` (or unset).
fn distgemm_with_ptx(args: &[&str], ptx: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distgemm"));
    cmd.args(args).env_remove("DISTGEMM_PTX");
    if let Some(ptx) = ptx {
        cmd.env("DISTGEMM_PTX", ptx);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start distgemm: {e}"))
}

/// Asserts exit status 2, exactly one stderr line containing `want`, and no panic.
fn assert_one_line_exit_2(args: &[&str], out: &Output, want: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.lines().count(),
        1,
        "{args:?} must print one line: {err}"
    );
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    // Messages speak of the user's machine, not of the project's.
    assert!(!err.contains("GPU machines"), "{err}");
}

/// Runs `line` (a command line as one string), asserts exit status 0 and returns stdout.
fn succeeds(line: &str) -> String {
    let out = distgemm(&words(line));
    assert_eq!(out.status.code(), Some(0), "{line}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// A command line written as one string: its whitespace-separated words.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            words("plan --schedule ag-z --tp 4"),
            "invalid value 'ag-z' for '--schedule",
        ),
        (
            words("plan --schedule ag-a --tp 0 --m 64 --n 64 --k 64"),
            "TP=0 is out of range",
        ),
        (
            words("plan --schedule ag-a --tp 9 --m 64 --n 64 --k 64"),
            "TP=9 is out of range",
        ),
        (words("plan --schedule ag-a --tp -1"), "error:"),
        (
            words("plan --schedule ag-a --tp 4 --preset llama9"),
            "invalid value 'llama9' for '--preset",
        ),
        (
            words("plan --schedule ag-a --tp 8 --m 1001 --n 64 --k 64"),
            "M=1001 is not divisible by TP=8 for AllGather1D_TilingCD_RotatingA",
        ),
        (
            words("plan --schedule rs-a --tp 4 --m 64 --n 64 --k 66"),
            "K=66 is not divisible by TP=4",
        ),
        (
            words("plan --schedule ag-b --tp 8 --m 64 --n 96 --k 64"),
            "N/TP=12 is not a multiple of 8",
        ),
        (
            words("plan --schedule ag-a --tp 2 --m 0 --n 64 --k 64"),
            "M=0",
        ),
        (
            words("plan --schedule ag-a --tp 2 --m 64 --n 64"),
            "give either --m, --n and --k, or --preset",
        ),
        (words("plan --tp 2 --m 64 --n 64 --k 64"), "--schedule"),
        (
            words("plan --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --format svg"),
            "invalid value 'svg'",
        ),
        (
            words("run --schedule ag-a --tp 2 --backend cuda --m 64 --n 64 --k 64"),
            "CUDA backend unavailable",
        ),
        (
            words("run --schedule ag-a --tp 4 --backend cpu --preset llama3-70b-fc1"),
            "pass --tokens 4 or fewer",
        ),
        (
            words("run --schedule rs-b --tp 2 --backend cpu --dtype f32 --m 64 --n 64 --k 64"),
            "invalid value 'f32'",
        ),
    ];
    // `bench` checks its arguments and shapes before looking for GPUs: these are exit 2 on
    // every machine.
    let bench = |extra: &[&'static str]| {
        let mut args = words("bench --schedule ag-a --tp 2 --m 256 --n 256 --k 256");
        args.extend_from_slice(extra);
        args
    };
    let bench_cases: Vec<(Vec<&str>, &str)> = vec![
        (
            bench(&["--reps", "0"]),
            "--reps must be between 1 and 10000, got 0",
        ),
        (
            bench(&["--reps", "10001"]),
            "--reps must be between 1 and 10000, got 10001",
        ),
        (
            bench(&["--reps", "many"]),
            "invalid value 'many' for '--reps",
        ),
        (bench(&["--reps", "-3"]), "error:"),
        (
            bench(&["--warmup", "10001"]),
            "--warmup must be at most 10000",
        ),
        (
            bench(&["--timeout-ms", "0"]),
            "--timeout-ms must be at least 1",
        ),
        (
            words("bench --schedule ag-a --tp 2 --preset llama3-70b-fc1 --m 64"),
            "--preset cannot be combined with --m, --n or --k",
        ),
        (
            words("bench --schedule rs-a --tp 4 --m 64 --n 64 --k 66 --auto"),
            "K=66 is not divisible by TP=4",
        ),
        (words("bench --schedule ag-a --m 64 --n 64 --k 64"), "--tp"),
    ];
    // Issue 20 and 26: bounds, dimensions, memory and output options.
    let run = |extra: &'static str| {
        let mut args = words("run --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cpu");
        args.extend(words(extra));
        args
    };
    let run_cases: Vec<(Vec<&str>, &str)> = vec![
        (
            run("--iters 10001"),
            "--iters must be between 1 and 10000, got 10001",
        ),
        (
            run("--iters 0"),
            "--iters must be between 1 and 10000, got 0",
        ),
        (
            run("--iters 18446744073709551615"),
            "--iters must be between 1 and 10000",
        ),
        (run("--timeout-ms 0"), "--timeout-ms must be at least 1"),
        (run("--format dot"), "invalid value 'dot' for '--format"),
        (run("--json --format text"), "cannot be used with"),
        (
            words("plan --schedule ag-a --tp 1 --m 2147483648 --n 8 --k 8"),
            "M=2147483648 is too large: every dimension must be below 2^31",
        ),
        (
            // Refused before any input is generated or any GPU is looked for: ~10 TiB.
            words("run --schedule ag-a --tp 1 --m 1073741824 --n 1024 --k 1024 --backend cuda"),
            "of host memory, this machine has",
        ),
        (
            // Just above the cap: the numbers differ where they are printed.
            words("run --schedule ag-a-single --tp 1 --m 65544 --n 128 --k 256 --backend cpu"),
            "needs 4295491584 flop per iteration, above the CPU executor's cap of 4294967296",
        ),
        (
            // The default backend without GPUs: one line (no notice before the error).
            words("run --schedule ag-a --tp 8 --preset llama3-70b-fc1"),
            "no --tokens count of llama3-70b-fc1 fits the CPU at TP=8",
        ),
    ];
    for (args, want) in cases.into_iter().chain(bench_cases).chain(run_cases) {
        let out = distgemm(&args);
        assert_one_line_exit_2(&args, &out, want);
    }
}

/// `DISTGEMM_PTX` must name a regular, non-empty, bounded text file; anything else is bad
/// input (exit 2, one line) before a GPU is looked for or the file is read unboundedly.
#[test]
fn unusable_ptx_files_are_bad_input() {
    let dir = std::env::temp_dir().join(format!("distgemm-cli-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let empty = dir.join("empty.ptx");
    std::fs::write(&empty, b"").unwrap_or_else(|e| panic!("{e}"));
    let binary = dir.join("binary.ptx");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap_or_else(|e| panic!("{e}"));
    let dir_name = dir.to_string_lossy().into_owned();
    let cases = [
        ("/dev/zero", "not a regular file"),
        ("/dev/stdin", "DISTGEMM_PTX"),
        (dir_name.as_str(), "not a regular file"),
        ("/nonexistent/kernels_gpu.ptx", "cannot read the PTX file"),
        (&*empty.to_string_lossy(), "it is empty"),
        (&*binary.to_string_lossy(), "not UTF-8"),
    ]
    .map(|(p, w)| (p.to_owned(), w));
    for (ptx, want) in &cases {
        for sub in ["run", "bench"] {
            let mut args = vec![sub];
            args.extend(words("--schedule ag-a --tp 2 --m 64 --n 64 --k 64"));
            if sub == "run" {
                args.extend(["--backend", "cuda"]);
            }
            let out = distgemm_with_ptx(&args, Some(ptx));
            assert_one_line_exit_2(&args, &out, want);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn bare_distgemm_prints_the_usage_with_the_subcommands() {
    let out = distgemm(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("Usage: distgemm"), "{err}");
    for sub in ["plan", "run", "bench"] {
        assert!(
            err.lines().any(|l| l.trim_start().starts_with(sub)),
            "{sub}: {err}"
        );
    }
    let help = text(&distgemm(&["--help"]).stdout);
    assert!(
        help.contains("Examples:") && help.contains("Exit status:"),
        "{help}"
    );
    for code in [
        "0  success",
        "1  the run failed",
        "2  bad input",
        "3  --check",
    ] {
        assert!(help.contains(code), "{code}: {help}");
    }
}

/// The CPU-cap hint names a token count the schedule accepts at that TP.
#[test]
fn the_too_large_hint_names_an_accepted_token_count() {
    for (schedule, tp) in [
        ("ag-a", 4),
        ("ag-a", 2),
        ("rs-a", 4),
        ("rs-b", 8),
        ("ag-b", 8),
    ] {
        let args = [
            "run",
            "--schedule",
            schedule,
            "--tp",
            &tp.to_string(),
            "--preset",
            "llama3-70b-fc2",
            "--backend",
            "cpu",
        ];
        let out = distgemm(&args);
        let err = text(&out.stderr);
        assert_one_line_exit_2(&args, &out, "above the CPU executor's cap");
        let Some(tokens) = err
            .split("--tokens ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        else {
            assert!(err.contains("no --tokens count"), "{err}");
            continue;
        };
        let plan = [
            "plan",
            "--schedule",
            schedule,
            "--tp",
            &tp.to_string(),
            "--preset",
            "llama3-70b-fc2",
            "--tokens",
            tokens,
        ];
        let out = distgemm(&plan);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{plan:?}: {}",
            text(&out.stderr)
        );
    }
}

/// `distgemm plan … | head -c 1`: the reader leaves early; distgemm exits 0 without a word.
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_distgemm"))
        .args(words(
            "plan --schedule ag-a --tp 8 --m 64 --n 64 --k 64 --format json",
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start distgemm: {e}"));
    let mut first = [0u8; 1];
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_exact(&mut first)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first, *b"{");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn run_and_bench_take_format_json() {
    let json = succeeds(
        "run --schedule ag-b --tp 2 --m 32 --n 32 --k 32 --backend cpu --check --format json",
    );
    assert!(
        json.starts_with('{')
            && json.contains("\"check_reference\":\"cpu\"")
            && json.contains("\"elements\":1024"),
        "{json}"
    );
    succeeds("plan --schedule ag-b --tp 2 --m 32 --n 32 --k 32 --format text");
}

#[test]
fn plan_table_shows_peers_and_tiles() {
    let table = succeeds("plan --schedule ag-a --tp 4 --m 64 --n 64 --k 64");
    assert!(
        table.contains("peer(d,t) = tile(d,t) = (d+t) mod 4"),
        "{table}"
    );
    assert!(
        table.contains("workspace per device: 3 slots × 1024 elements = 6.0 KiB"),
        "{table}"
    );
    assert!(
        table.contains("copy for stage 1: dev1:A[0..1024] → dev0:ws[0..1024] (2.0 KiB)"),
        "{table}"
    );
    // Device 1, stage 3: peer 0, tile 0, A from workspace slot 2, D row block 0.
    let dev1 = table.split("device 1:").nth(1).unwrap_or_default();
    assert!(
        dev1.lines()
            .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>() == ["3", "0", "0"]),
        "{dev1}"
    );

    let table = succeeds("plan --schedule rs-a --tp 4 --m 64 --n 64 --k 64");
    assert!(table.contains("tile(d,t) = (d-1-t) mod 4"), "{table}");
    assert!(
        table.contains("dev3:ws@0 16×64 ld64 (1)"),
        "device 0 stage 1 reads left neighbour 3's slot 0: {table}"
    );
}

/// The character offset at which `word` starts in `line`.
fn column_of(line: &str, word: &str) -> Option<usize> {
    line.find(word).map(|at| line[..at].chars().count())
}

#[test]
fn plan_table_columns_fit_their_widest_cell_and_sizes_read_in_binary_units() {
    // 70B fc2 at TP=2: views as long as `A@117440512 8192×14336 ld14336` beside `A@0 …`.
    let table = succeeds("plan --schedule rs-a --tp 2 --preset llama3-70b-fc2");
    assert!(
        table.contains("workspace per device: 1 slots × 67108864 elements = 128.0 MiB"),
        "{table}"
    );
    assert!(
        table.contains("exclusive workspace per device: 64 B"),
        "{table}"
    );
    let dev0 = table
        .split("device 0:")
        .nth(1)
        .and_then(|rest| rest.split("device 1:").next())
        .unwrap_or_default();
    let lines: Vec<&str> = dev0.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.trim_start().starts_with("stage"))
        .unwrap_or_else(|| panic!("no stage header: {table}"));
    let (head, rows) = (lines[header], &lines[header + 2..header + 4]);
    // Device 0 reads A's second half at stage 0 and its first at stage 1: every column starts
    // where its header does, however long the cell before it (cells found by their text, so
    // each is the first of its kind in its row).
    for (column, row, cell) in [
        ("A", 0, "A@117440512 8192×14336 ld14336"),
        ("A", 1, "A@0 8192×14336 ld14336"),
        ("B", 0, "B@0 8192×14336 ld14336"),
        ("C (beta)", 0, "-"),
        ("C (beta)", 1, "dev1:ws@0 8192×8192 ld8192 (1)"),
        ("D", 0, "ws@0 8192×8192 ld8192"),
        ("D", 1, "D@0 8192×8192 ld8192"),
        ("wait", 1, "dev0.flag1"),
        ("signal", 1, "dev1.flag1"),
    ] {
        let at = column_of(&format!("{head} "), &format!(" {column} ")).map(|c| c + 1);
        assert!(at.is_some(), "no column {column}: {head}");
        let row = rows[row];
        assert_eq!(
            column_of(row, &format!(" {cell}")).map(|c| c + 1),
            at,
            "{column}: `{cell}` not under its header:\n{head}\n{row}"
        );
    }
}

#[test]
fn plan_json_is_the_plan_and_dot_has_every_device() {
    let json = succeeds("plan --schedule rs-a --tp 4 --m 64 --n 64 --k 64 --format json");
    let plan = Plan::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (plan.schedule, plan.tp),
        (ScheduleKind::ReduceScatterTilingA, 4)
    );
    for (d, dev) in plan.devices.iter().enumerate() {
        let tiles: Vec<_> = dev.gemms().map(|g| (g.peer, g.tile)).collect();
        let want: Vec<_> = (0..4)
            .map(|t| (Some((d + 3) % 4), Some((d + 8 - 1 - t) % 4)))
            .collect();
        assert_eq!(tiles, want);
        assert!(matches!(dev.nodes[0], Node::Barrier(_)));
    }
    let dot = succeeds("plan --schedule ag-b --tp 3 --m 48 --n 48 --k 64 --format dot");
    assert!(
        dot.starts_with("digraph plan {") && dot.trim_end().ends_with('}'),
        "{dot}"
    );
    for d in 0..3 {
        assert!(dot.contains(&format!("subgraph cluster_dev{d}")), "{dot}");
    }
    assert!(
        dot.contains("style=dashed") && dot.contains("color=red"),
        "{dot}"
    );
}

#[test]
fn run_check_passes_for_every_schedule_and_tp() {
    for kind in ScheduleKind::ALL {
        for tp in [1usize, 2, 3, 4, 8] {
            let dim = (16 * tp).to_string();
            let args = [
                "run",
                "--schedule",
                kind.cli_name(),
                "--tp",
                &tp.to_string(),
                "--m",
                &dim,
                "--n",
                &dim,
                "--k",
                &dim,
                "--backend",
                "cpu",
                "--check",
                "--iters",
                "2",
                "--json",
            ];
            let out = distgemm(&args);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{args:?}: {}",
                text(&out.stderr)
            );
            let json = text(&out.stdout);
            assert!(json.contains("\"mismatches\":0"), "{json}");
        }
    }
}

#[test]
fn auto_backend_says_it_uses_the_cpu_and_text_output_reports_the_check() {
    let out = distgemm(&words(
        "run --schedule ag-a-single --tp 2 --m 32 --n 32 --k 32 --check --dtype f16",
    ));
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    // Without two Hopper GPUs with peer access: one notice line saying why, then the CPU.
    // With them (a GPU machine), the run goes to CUDA silently.
    if !text(&out.stdout).contains(" on cuda:") {
        assert_eq!(err.lines().count(), 1);
        assert!(
            err.starts_with("notice: ") && err.contains("; running on the CPU executor (cap:"),
            "{err}"
        );
    }
    assert!(
        text(&out.stdout).contains("check: passed"),
        "{}",
        text(&out.stdout)
    );
}

/// `bench` needs the CUDA backend and has no CPU fallback. Without two Hopper GPUs with peer
/// access (CI, laptops): exit 2 and one stderr line naming the CUDA backend, never a panic.
/// On a machine that has them the tiny problem really runs (milliseconds; every GPU wait is
/// bounded by --timeout-ms), so the no-GPU assertion is skipped with a message and the report
/// is checked instead.
#[test]
fn bench_without_gpus_exits_2_naming_the_cuda_backend() {
    for json in [false, true] {
        let mut args = words(
            "bench --schedule ag-a --tp 2 --m 256 --n 256 --k 256 --warmup 1 --reps 3 --timeout-ms 2000",
        );
        if json {
            args.push("--json");
        }
        let out = distgemm(&args);
        let (stdout, err) = (text(&out.stdout), text(&out.stderr));
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        match out.status.code() {
            Some(2) => {
                assert_eq!(
                    err.lines().count(),
                    1,
                    "{args:?} must print one line: {err}"
                );
                assert!(
                    err.starts_with("error: CUDA backend unavailable: ")
                        && err.contains("distgemm bench times the CUDA backend only"),
                    "{args:?}: {err}"
                );
                assert!(stdout.is_empty(), "{args:?}: {stdout}");
            }
            Some(0) => {
                eprintln!(
                    "cli::bench_without_gpus: skipping the no-GPU assertion: this machine has 2 \
                     Hopper GPUs with peer access, so `distgemm bench` ran; checking its report"
                );
                if json {
                    let v: serde_json::Value =
                        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
                    assert_eq!(v["schedule"], "ag-a", "{stdout}");
                    assert_eq!(v["reps"], 3, "{stdout}");
                    assert_eq!(v["samples_ms"].as_array().map(Vec::len), Some(3));
                } else {
                    assert_eq!(stdout.lines().count(), 2, "{stdout}");
                    assert!(
                        stdout.starts_with("ag-a TP=2 M=256 N=256 K=256 bf16 on 2× ")
                            && stdout.contains("TFLOP/s per GPU (3 reps after 1 warm-up"),
                        "{stdout}"
                    );
                }
            }
            other => panic!("{args:?}: exit status {other:?}, stderr: {err}"),
        }
    }
}

/// On a machine with a Hopper GPU: `run --check` far above the CPU cap compares every element
/// of D with the f64 reference computed on the GPU (bf16, and FP8 with row-wise scales) and
/// passes, and a PTX file the driver rejects is bad input (exit 2, one line). Elsewhere both
/// are refused for want of a GPU (exit 2) and the test says it skipped.
#[test]
fn gpu_runs_above_the_cap_are_checked_in_full_on_the_gpu_and_bad_ptx_is_bad_input() {
    // 2·2048·4096·4096 ≈ 6.9e10 flop: 16 times the CPU's cap; D has 8 388 608 elements.
    for extra in ["", " --dtype e4m3 --scales row"] {
        let line = format!(
            "run --schedule ag-a --tp 1 --m 2048 --n 4096 --k 4096 --backend cuda --check \
             --format json{extra}"
        );
        let args = words(&line);
        let out = distgemm(&args);
        let err = text(&out.stderr);
        if out.status.code() == Some(2) && err.contains("CUDA backend unavailable") {
            println!(
                "SKIPPED cli::gpu_runs_above_the_cap: no Hopper GPU ({})",
                err.trim()
            );
            return;
        }
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        let json = text(&out.stdout);
        assert!(
            json.contains("\"check_reference\":\"gpu\"")
                && json.contains("\"elements\":8388608")
                && json.contains("\"mismatches\":0"),
            "{json}"
        );
    }

    let dir = std::env::temp_dir().join(format!("distgemm-cli-jit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let garbage = dir.join("garbage.ptx");
    std::fs::write(&garbage, "this is not PTX\n").unwrap_or_else(|e| panic!("{e}"));
    let args = words("run --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cuda");
    let out = distgemm_with_ptx(&args, Some(&garbage.to_string_lossy()));
    assert_one_line_exit_2(&args, &out, "rejected the PTX");
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
}

/// On a machine with a Hopper GPU: `run --ranks 2 --share-gpu --check` above the CPU cap
/// compares every element of each rank's block of D with the f64 reference computed on the
/// rank's GPU (bf16, and FP8 with row-wise scales, whose block takes its part of the scale
/// vectors). Elsewhere the run is refused (exit 2) and the test says it skipped.
#[test]
fn ranks_check_every_element_of_their_blocks_on_the_gpu() {
    // 2·2048·2048·4096 ≈ 3.4e10 flop, 4 times the CPU's cap per rank; blocks of 2 097 152.
    for extra in ["", " --dtype e4m3 --scales row"] {
        let line = format!(
            "run --schedule rs-a --tp 2 --m 2048 --n 2048 --k 4096 --ranks 2 --share-gpu \
             --check{extra}"
        );
        let args = words(&line);
        let out = distgemm(&args);
        let err = text(&out.stderr);
        if out.status.code() == Some(2) && err.contains("CUDA backend unavailable") {
            println!(
                "SKIPPED cli::ranks_check_every_element: no Hopper GPU ({})",
                err.trim()
            );
            return;
        }
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        let stdout = text(&out.stdout);
        let checked = stdout
            .matches("check ok (2097152 elements of its block)")
            .count();
        assert_eq!(checked, 2, "{stdout}");
    }
}

#[test]
fn run_ranks_refuses_what_it_cannot_run() {
    let base = "run --schedule ag-a --tp 2 --m 256 --n 512 --k 384";
    let cases = [
        (format!("{base} --ranks 3"), "--ranks 3 must equal --tp 2"),
        (
            format!("{base} --ranks 2 --backend cpu"),
            "drop --backend cpu",
        ),
        (format!("{base} --share-gpu"), "--ranks"),
    ];
    for (line, want) in &cases {
        let args = words(line);
        assert_one_line_exit_2(&args, &distgemm(&args), want);
    }
    // Without GPUs (CI), a per-rank run is a one-line refusal, not a hang or a crash.
    let line = format!("{base} --ranks 2");
    let args = words(&line);
    let out = distgemm(&args);
    if out.status.code() == Some(2) {
        assert_one_line_exit_2(&args, &out, "CUDA backend unavailable");
    }
}

#[test]
fn checked_cpu_runs_vary_their_inputs_and_check_every_run() {
    for kind in ScheduleKind::ALL {
        let line = format!(
            "run --schedule {} --tp 3 --m 96 --n 96 --k 48 --backend cpu --check --iters 6",
            kind.cli_name()
        );
        assert!(succeeds(&line).contains("check: passed"), "{line}");
    }
}

/// `distgemm trace --backend cpu` writes the four files: the Chrome trace has one slice per
/// executed node, the summary's parts add up to each device's wall time, the SVG is one
/// document; `--backend cuda` and a bad `--iters` are one-line refusals.
#[test]
fn trace_writes_the_timeline_and_the_summary() {
    let dir = std::env::temp_dir().join(format!("distgemm-cli-trace-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let line = "trace --schedule rs-a --tp 2 --m 64 --n 64 --k 64 --backend cpu --iters 2 --out";
    let mut args = words(line);
    args.push(&dir_arg);
    let out = distgemm(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("device 1: wall"),
        "{}",
        text(&out.stdout)
    );
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let plan = Plan::build(
        ScheduleKind::ReduceScatterTilingA,
        distgemm::problem::Problem::new(64, 64, 64),
        2,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let nodes: usize = plan.devices.iter().map(|d| d.nodes.len()).sum();
    let trace: serde_json::Value =
        serde_json::from_str(&read("trace.json")).unwrap_or_else(|e| panic!("{e}"));
    let slices = trace["traceEvents"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["cat"] != "wait")
                .count()
        })
        .unwrap_or(0);
    assert_eq!(slices, 2 * nodes);
    let summary: serde_json::Value =
        serde_json::from_str(&read("summary.json")).unwrap_or_else(|e| panic!("{e}"));
    let devices = summary["devices"].as_array().map_or(&[][..], Vec::as_slice);
    assert_eq!(devices.len(), 2);
    for d in devices {
        let ns = |key: &str| d[key].as_u64().unwrap_or_else(|| panic!("{key}: {d}"));
        assert_eq!(
            ns("compute_ns") + ns("exposed_ns") + ns("idle_ns"),
            ns("wall_ns")
        );
        assert!(ns("compute_ns") > 0);
    }
    assert_eq!(read("summary.txt"), {
        let stdout = text(&out.stdout);
        stdout[..stdout.find("wrote ").unwrap_or(stdout.len())].to_string()
    });
    let svg = read("timeline.svg");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<svg").count(), 1);
    let _ = std::fs::remove_dir_all(&dir);

    let cuda = "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cuda --out x";
    assert_one_line_exit_2(&words(cuda), &distgemm(&words(cuda)), "; use --backend cpu");
    for (line, want) in [
        (
            "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cpu --ranks 2 --out x",
            "use --backend cuda",
        ),
        (
            "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --dtype e4m3 --backend cuda \
             --ranks 2 --out x",
            "takes bf16 and f16 for now",
        ),
        (
            "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cuda --ranks 3 --out x",
            "--ranks 3 must equal --tp 2",
        ),
        // Without CUPTI (or without GPUs): one line before any rank starts.
        (
            "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cuda --ranks 2 --out x",
            "CUDA backend unavailable",
        ),
    ] {
        assert_one_line_exit_2(&words(line), &distgemm(&words(line)), want);
    }
    let iters = "trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --backend cpu --iters 0 --out x";
    assert_one_line_exit_2(&words(iters), &distgemm(&words(iters)), "--iters must be");
}

/// FP8 (issue 24) on the CPU executor: every schedule at TP 1, 2, 4, 8, both scale modes,
/// bf16 and f16 output, every element within `check_scaled`'s bound; the JSON report carries
/// the problem's `fp8` description.
#[test]
fn fp8_runs_check_every_schedule_on_the_cpu() {
    for kind in ScheduleKind::ALL {
        for tp in [1usize, 2, 4, 8] {
            for (scales, out_dtype) in [("tensor", "bf16"), ("row", "f16")] {
                let line = format!(
                    "run --schedule {} --tp {tp} --m {} --n {} --k {} --dtype e4m3 --scales \
                     {scales} --out-dtype {out_dtype} --backend cpu --check --json",
                    kind.cli_name(),
                    8 * tp,
                    8 * tp,
                    32 * tp
                );
                let json = succeeds(&line);
                assert!(json.contains("\"mismatches\":0"), "{line}: {json}");
                let fp8 = format!(
                    r#""dtype":"{out_dtype}","alpha":1.0,"beta":0.0,"fp8":{{"scales":"{scales}"}}"#
                );
                assert!(json.contains(&fp8), "{line}: {json}");
            }
        }
    }
}

/// `bench` takes FP8 (on GPUs only: one line and exit 2 without them); FP8-only flags
/// without e4m3, and FP8's 16-element K, are bad input; without GPUs `auto` runs row-wise FP8
/// on the CPU with a notice.
#[test]
fn fp8_flags_are_checked_and_auto_runs_row_wise_fp8_on_the_cpu_without_gpus() {
    let shape = "--schedule ag-a --tp 2 --m 64 --n 64 --k 64";
    let cases = [
        (
            format!("bench {shape} --dtype e4m3 --scales row"),
            "distgemm bench times the CUDA backend only",
        ),
        (
            "plan --schedule ag-a --tp 2 --m 64 --n 64 --k 40 --dtype e4m3".to_owned(),
            "K=40 is not a multiple of 16",
        ),
        (
            "plan --schedule rs-b --tp 2 --m 64 --n 64 --k 48 --dtype e4m3".to_owned(),
            "K/TP=24 is not a multiple of 16",
        ),
        (
            format!("plan {shape} --scales row"),
            "--scales applies to --dtype e4m3 only",
        ),
        (
            format!("plan {shape} --dtype f16 --out-dtype bf16"),
            "--out-dtype applies to --dtype e4m3 only",
        ),
        (
            format!("plan {shape} --dtype e4m3 --scales block"),
            "invalid value 'block' for '--scales",
        ),
    ];
    for (line, want) in &cases {
        let args = words(line);
        assert_one_line_exit_2(&args, &distgemm(&args), want);
    }
    // The bf16 shape K/TP = 24 is fine.
    succeeds("plan --schedule rs-b --tp 2 --m 64 --n 64 --k 48");

    let out = distgemm(&words(&format!(
        "run {shape} --dtype e4m3 --scales row --check"
    )));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let notice = text(&out.stderr);
    assert!(
        notice.starts_with("notice: ")
            && notice.ends_with("running on the CPU executor (cap: 2·M·N·K ≤ 4.295e9 flop)\n"),
        "{notice}"
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("M=64 N=64 K=64 e4m3 (row scales) -> bf16 on cpu")
            && stdout.contains("check: passed")
            && stdout.contains("|alpha·sa_i·sb_j|·Σ|a·b|"),
        "{stdout}"
    );
}

/// `plan --dtype e4m3`: the JSON plan records the FP8 problem, its all-gather copies move one
/// byte per element and it reads back; a bf16 plan's JSON has no `fp8` key. `trace` runs FP8
/// plans on the CPU.
#[test]
fn fp8_plans_and_traces() {
    let json = succeeds(
        "plan --schedule ag-b --tp 2 --m 64 --n 64 --k 64 --dtype e4m3 --scales row --format json",
    );
    let plan = Plan::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        plan.problem,
        distgemm::problem::Problem::new(64, 64, 64).with_fp8(distgemm::fp8::ScaleMode::Rowwise)
    );
    let copies: Vec<(usize, usize)> = plan
        .devices
        .iter()
        .flat_map(|d| &d.nodes)
        .filter_map(|n| match n {
            Node::PeerCopy(c) => Some((c.src.len, c.bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(copies, vec![(32 * 64, 32 * 64); 2]);
    let plain = succeeds("plan --schedule ag-b --tp 2 --m 64 --n 64 --k 64 --format json");
    assert!(!plain.contains("fp8"));
    let table =
        succeeds("plan --schedule ag-b --tp 2 --m 64 --n 64 --k 64 --dtype e4m3 --scales row");
    assert!(
        table.contains(
            "FP8: A, B and ws hold e4m3 (1 byte per element), C and D bf16; one f32 scale per row"
        ) && table.contains("dev1:B[0..2048] → dev0:ws[0..2048] (2.0 KiB)"),
        "{table}"
    );

    let dir = std::env::temp_dir().join(format!("distgemm-cli-fp8-trace-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let mut args =
        words("trace --schedule ag-a --tp 2 --m 64 --n 64 --k 64 --dtype e4m3 --backend cpu --out");
    args.push(&dir_arg);
    let out = distgemm(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("device 1: wall"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs distgemm with `DISTGEMM_TUNING` set to `table` (or unset).
fn distgemm_with_table(args: &[&str], table: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distgemm"));
    cmd.args(args)
        .env_remove("DISTGEMM_PTX")
        .env_remove("DISTGEMM_TUNING");
    if let Some(table) = table {
        cmd.env("DISTGEMM_TUNING", table);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start distgemm: {e}"))
}

/// A tuning table with one entry: ag-a at TP 2 on an H200, 256 tokens, N = K = 512, where the
/// pipelined schedule was measured faster (the rule picks the single-stage one: the problem
/// is tiny).
const PIPELINED_AT_256: &str = r#"{"version": 1, "entries": [{
  "key": {"gpu": "NVIDIA H200", "tp": 2, "dtype": "bf16", "family": "ag-a",
          "tokens": 256, "n": 512, "k": 512},
  "choice": "ag-a",
  "candidates": [
    {"schedule": "ag-a", "median_ms": 0.01, "min_ms": 0.009, "max_ms": 0.02, "reps": 60},
    {"schedule": "ag-a-single", "median_ms": 0.02, "min_ms": 0.019, "max_ms": 0.03, "reps": 60}
  ],
  "provenance": {"unix_seconds": 0, "commit": "test", "machine": "test: 2× NVIDIA H200", "m": 256}
}]}"#;

/// A tuning table in which rs-a at TP 2 (256 tokens, N = K = 512) ran fastest with its
/// partials pushed.
const PUSH_AT_256: &str = r#"{"version": 1, "entries": [{
  "key": {"gpu": "NVIDIA H200", "tp": 2, "dtype": "bf16", "family": "rs-a",
          "tokens": 256, "n": 512, "k": 512},
  "choice": "rs-a", "rs_partials": "push",
  "candidates": [
    {"schedule": "rs-a", "rs_partials": "read", "median_ms": 0.02, "min_ms": 0.019, "max_ms": 0.03, "reps": 60},
    {"schedule": "rs-a", "rs_partials": "push", "median_ms": 0.01, "min_ms": 0.009, "max_ms": 0.02, "reps": 60},
    {"schedule": "rs-a-single", "median_ms": 0.03, "min_ms": 0.029, "max_ms": 0.04, "reps": 60}
  ],
  "provenance": {"unix_seconds": 0, "commit": "test", "machine": "test: 2× NVIDIA H200", "m": 256}
}]}"#;

/// `plan --auto` with a table whose entry pushed: the plan pushes and the note says so;
/// `--rs-partials read` wins over the table; without `--auto` the table is not read.
#[test]
fn plan_auto_takes_a_tuned_push_unless_rs_partials_is_given() {
    let dir = std::env::temp_dir().join(format!("distgemm-cli-push-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("tuning.json");
    std::fs::write(&table, PUSH_AT_256).unwrap();
    let partials_of = |line: &str| -> (String, String) {
        let out = distgemm_with_table(&words(line), Some(&table));
        assert_eq!(out.status.code(), Some(0), "{line}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let p = v["rs_partials"].as_str().unwrap_or("read").to_owned();
        (p, text(&out.stderr))
    };
    let base = "plan --schedule rs-a --tp 2 --m 256 --n 512 --k 512 --format json";
    let (p, note) = partials_of(&format!("{base} --auto"));
    assert_eq!(p, "push");
    assert!(
        note.starts_with("note: --auto runs rs-a with pushed partials (family rs-a"),
        "{note}"
    );
    let (p, _) = partials_of(&format!("{base} --auto --rs-partials read"));
    assert_eq!(p, "read");
    let (p, note) = partials_of(base);
    assert_eq!((p.as_str(), note.as_str()), ("read", ""));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `plan --auto` says which schedule `Auto` runs and who decided: the rule without a table,
/// the table's entry when `DISTGEMM_TUNING` names one that matches (a token bucket one
/// octave away too), the rule again for a shape or a bucket the table does not have; an
/// unusable table is a one-line refusal, and a fixed schedule never reads it.
#[test]
fn plan_auto_reports_the_tuned_source_when_a_table_matches() {
    let dir = std::env::temp_dir().join(format!("distgemm-cli-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("tuning.json");
    std::fs::write(&table, PIPELINED_AT_256).unwrap();
    let schedule_of = |out: &Output| -> String {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["schedule"].as_str().unwrap().to_owned()
    };
    let line = |m: usize| {
        format!("plan --schedule ag-a-single --tp 2 --m {m} --n 512 --k 512 --auto --format json")
    };

    let l = line(256);
    let rule = distgemm_with_table(&words(&l), None);
    assert_eq!(schedule_of(&rule), "ag-a-single");
    assert_eq!(
        text(&rule.stderr),
        "note: --auto runs ag-a-single (family ag-a, for an NVIDIA H200): rule\n"
    );

    let tuned = distgemm_with_table(&words(&l), Some(&table));
    assert_eq!(schedule_of(&tuned), "ag-a");
    let note = text(&tuned.stderr);
    assert!(
        note.starts_with(&format!(
            "note: --auto runs ag-a (family ag-a, for an NVIDIA H200): tuned (table {}#",
            table.display()
        )) && note.ends_with(
            ": NVIDIA H200 TP=2 bf16 ag-a M≈256 N=512 K=512); the rule picks ag-a-single\n"
        ),
        "{note}"
    );
    // 192 tokens are in bucket 256; 512 tokens take the neighbouring bucket, 256; 1024
    // tokens are two octaves away: the rule.
    let l = line(192);
    let near = distgemm_with_table(&words(&l), Some(&table));
    assert_eq!(schedule_of(&near), "ag-a");
    let l = line(512);
    let next = distgemm_with_table(&words(&l), Some(&table));
    assert_eq!(schedule_of(&next), "ag-a");
    assert!(text(&next.stderr).contains("nearest token bucket"));
    let l = line(1024);
    let far = distgemm_with_table(&words(&l), Some(&table));
    assert!(
        text(&far.stderr).ends_with(": rule\n"),
        "{}",
        text(&far.stderr)
    );
    // Another N: no entry, the rule.
    let l = "plan --schedule ag-a --tp 2 --m 256 --n 1024 --k 512 --auto --format json";
    let other = distgemm_with_table(&words(l), Some(&table));
    assert_eq!(schedule_of(&other), "ag-a-single");
    assert!(text(&other.stderr).ends_with(": rule\n"));

    // Unusable tables: one line, exit 2, naming the file and why.
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        PIPELINED_AT_256.replace("\"version\": 1", "\"version\": 7"),
    )
    .unwrap();
    let l = line(256);
    let args = words(&l);
    let out = distgemm_with_table(&args, Some(&bad));
    assert_one_line_exit_2(&args, &out, "version 7, this distgemm reads version 1");
    let out = distgemm_with_table(&args, Some(std::path::Path::new("/dev/zero")));
    assert_one_line_exit_2(&args, &out, "tuning table /dev/zero: not a regular file");
    // A fixed schedule does not read the table.
    let fixed = distgemm_with_table(
        &words("plan --schedule ag-a-single --tp 2 --m 256 --n 512 --k 512 --format json"),
        Some(std::path::Path::new("/dev/zero")),
    );
    assert_eq!(schedule_of(&fixed), "ag-a-single");
    assert!(fixed.stderr.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `distgemm tune` without GPUs is a one-line refusal naming the CUDA backend (exit 2) that
/// leaves the table alone; an unusable table at `--out`, an FP8 problem and bad counts are
/// refused first, on every machine. On a machine with two Hopper GPUs it tunes the small
/// problem and writes the table.
#[test]
fn tune_without_gpus_exits_2_and_bad_tables_are_refused_first() {
    let dir = std::env::temp_dir().join(format!("distgemm-cli-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("tuning.json");
    let table_arg = table.to_string_lossy().into_owned();
    let base = "tune --schedule ag-a --tp 2 --m 256 --n 512 --k 512 --reps 3 --rounds 1 \
                --settle-ms 0 --timeout-ms 2000 --out";
    let mut args = words(base);
    args.push(&table_arg);
    let out = distgemm_with_table(&args, None);
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    match out.status.code() {
        Some(2) => {
            assert_one_line_exit_2(&args, &out, "error: CUDA backend unavailable: ");
            assert!(
                err.contains("distgemm tune times the candidates on the GPUs"),
                "{err}"
            );
            assert!(stdout.is_empty(), "{stdout}");
            assert!(!table.exists(), "nothing written without a measurement");
        }
        Some(0) => {
            eprintln!(
                "cli::tune_without_gpus: this machine has 2 Hopper GPUs with peer access, so \
                 `distgemm tune` ran; checking the table it wrote"
            );
            assert!(stdout.contains("chosen: ag-a"), "{stdout}");
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
            assert_eq!(v["entries"].as_array().unwrap().len(), 1, "{v}");
        }
        other => panic!("{args:?} exited with {other:?}: {err}"),
    }

    std::fs::write(&table, "{\"version\": 1, \"entries\": [").unwrap();
    let out = distgemm_with_table(&args, None);
    assert_one_line_exit_2(&args, &out, "malformed");
    assert_eq!(
        std::fs::read_to_string(&table).unwrap(),
        "{\"version\": 1, \"entries\": [",
        "an unusable table is never overwritten"
    );
    let cases = [
        ("--reps 0", "--reps must be between 1 and"),
        ("--rounds 0", "--rounds must be between 1 and"),
        ("--rs-partials push", "drop --rs-partials"),
        ("--scales row", "--scales applies to --dtype e4m3 only"),
    ];
    for (extra, want) in cases {
        let line = format!(
            "tune --schedule rs-a --tp 2 --m 256 --n 512 --k 512 --out {table_arg} {extra}"
        );
        let args = words(&line);
        assert_one_line_exit_2(&args, &distgemm_with_table(&args, None), want);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
