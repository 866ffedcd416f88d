//! Keeps README.md true.
//!
//! - Every `distgemm …` command in the README's `sh` code blocks (also written as
//!   `./scripts/run.sh …` or `bundle/bin/distgemm …`, which run the same binary) either runs
//!   here and exits 0 (on the CPU: `plan`, and `run` without `--backend cuda`; a `--check`
//!   that fails exits non-zero), or, when it needs GPUs (`bench`, `run --backend cuda`,
//!   `run --ranks`), must
//!   parse (the same arguments with `--help` exit 0) and describe a problem its schedule
//!   accepts (`distgemm plan` with its schedule, TP and problem options exits 0).
//! - Every `rust` code block is an excerpt of `host/examples/distgemm_library.rs`, which CI
//!   compiles, so the README shows code that builds.
//! - Every `--example NAME` names an example that exists.
//! - `benches/results/README.md`'s index names every file in `benches/results/`, and no log
//!   there is over 20 KB uncompressed.

use std::process::{Command, Output};

const README: &str = include_str!("../../README.md");
const EXAMPLE: &str = include_str!("../examples/distgemm_library.rs");

/// How the README may spell the `distgemm` binary at the start of a command.
const PROGRAMS: [&str; 3] = ["distgemm", "./scripts/run.sh", "bundle/bin/distgemm"];

/// The options that define a problem, with the value each takes.
const PROBLEM_OPTIONS: [&str; 8] = [
    "--schedule",
    "--tp",
    "--m",
    "--n",
    "--k",
    "--preset",
    "--tokens",
    "--dtype",
];

/// One command of the README: its line number (1-based) and the arguments after the program.
#[derive(Debug)]
struct ReadmeCommand {
    line: usize,
    args: Vec<String>,
}

impl ReadmeCommand {
    /// Whether it needs GPUs: `bench`, `tune`, `--backend cuda`, or `--ranks` (one process
    /// per GPU).
    fn needs_gpu(&self) -> bool {
        self.args
            .first()
            .is_some_and(|sub| sub == "bench" || sub == "tune")
            || self.args.iter().any(|a| a == "--ranks")
            || self
                .args
                .windows(2)
                .any(|w| w[0] == "--backend" && w[1] == "cuda")
    }

    /// `plan` with only this command's problem options.
    fn plan_args(&self) -> Vec<String> {
        let mut plan = vec!["plan".to_owned()];
        for pair in self.args.windows(2) {
            if PROBLEM_OPTIONS.contains(&pair[0].as_str()) {
                plan.extend_from_slice(pair);
            }
        }
        plan
    }
}

/// Every `distgemm` command of the README's `sh` blocks.
fn readme_commands() -> Vec<ReadmeCommand> {
    let mut commands = Vec::new();
    for block in sh_blocks() {
        for (line, text) in block {
            let code = strip_comment(text);
            let mut words = code.split_whitespace();
            if words
                .next()
                .is_some_and(|program| PROGRAMS.contains(&program))
            {
                commands.push(ReadmeCommand {
                    line,
                    args: words.map(str::to_owned).collect(),
                });
            }
        }
    }
    commands
}

/// The README's `sh` blocks (only those: other blocks hold pictures and code).
fn sh_blocks() -> Vec<Vec<(usize, &'static str)>> {
    fenced_blocks(README)
        .into_iter()
        .filter(|(lang, _)| *lang == "sh")
        .map(|(_, lines)| lines)
        .collect()
}

/// Every fenced block of `markdown`: its info string and its lines with their numbers.
fn fenced_blocks(markdown: &str) -> Vec<(&str, Vec<(usize, &str)>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, Vec<(usize, &str)>)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (open.take(), line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim(), Vec::new())),
            (None, None) => {}
            (Some(block), Some(_)) => blocks.push(block),
            (Some((info, mut lines)), None) => {
                lines.push((i + 1, line));
                open = Some((info, lines));
            }
        }
    }
    assert!(open.is_none(), "README.md has an unclosed code block");
    blocks
}

/// `text` up to a shell comment (a `#` at the start of a word).
fn strip_comment(text: &str) -> &str {
    let mut prev_blank = true;
    for (i, c) in text.char_indices() {
        if c == '#' && prev_blank {
            return &text[..i];
        }
        prev_blank = c.is_whitespace();
    }
    text
}

/// Runs the binary with `args`; `None` when it was not built (the `cli` feature is off).
fn distgemm(args: &[String]) -> Option<Output> {
    let exe = option_env!("CARGO_BIN_EXE_distgemm")?;
    Some(
        Command::new(exe)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot start {exe}: {e}")),
    )
}

fn describe(cmd: &ReadmeCommand, args: &[String], out: &Output) -> String {
    format!(
        "README.md line {}: `distgemm {}` exited with {}\nstdout:\n{}\nstderr:\n{}",
        cmd.line,
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn readme_commands_run_or_parse() {
    let commands = readme_commands();
    let gpu = commands.iter().filter(|c| c.needs_gpu()).count();
    // The README shows the CLI on both sides; finding fewer means the extraction broke.
    assert!(
        commands.len() - gpu >= 5 && gpu >= 3,
        "found {} CPU and {gpu} GPU commands in README.md: {commands:?}",
        commands.len() - gpu
    );
    for cmd in &commands {
        let runs: Vec<Vec<String>> = if cmd.needs_gpu() {
            let mut help = cmd.args.clone();
            help.push("--help".to_owned());
            vec![help, cmd.plan_args()]
        } else {
            vec![cmd.args.clone()]
        };
        for args in runs {
            let Some(out) = distgemm(&args) else {
                println!(
                    "SKIPPED README commands: the distgemm binary was not built (feature `cli`)"
                );
                return;
            };
            assert!(out.status.success(), "{}", describe(cmd, &args, &out));
            assert!(!out.stdout.is_empty(), "{}", describe(cmd, &args, &out));
        }
    }
}

#[test]
fn readme_rust_blocks_are_excerpts_of_the_example() {
    let example: Vec<&str> = EXAMPLE.lines().map(str::trim).collect();
    let blocks: Vec<_> = fenced_blocks(README)
        .into_iter()
        .filter(|(lang, _)| *lang == "rust")
        .collect();
    assert!(!blocks.is_empty(), "README.md shows no Rust code");
    for (_, lines) in blocks {
        let excerpt: Vec<&str> = lines
            .iter()
            .map(|(_, l)| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        let found = example
            .windows(excerpt.len())
            .any(|window| window == excerpt.as_slice());
        assert!(
            found,
            "the Rust block at README.md line {} is not a verbatim excerpt of \
             host/examples/distgemm_library.rs (which CI compiles):\n{}",
            lines.first().map_or(0, |(n, _)| n - 1),
            excerpt.join("\n")
        );
    }
}

#[test]
fn readme_examples_exist() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut named = 0;
    for block in sh_blocks() {
        for (line, text) in block {
            let words: Vec<&str> = strip_comment(text).split_whitespace().collect();
            for pair in words.windows(2).filter(|w| w[0] == "--example") {
                named += 1;
                let file = dir.join(format!("{}.rs", pair[1]));
                assert!(
                    file.is_file(),
                    "README.md line {line}: `--example {}` but {} does not exist",
                    pair[1],
                    file.display()
                );
            }
        }
    }
    assert!(named > 0, "README.md runs no example");
}

#[test]
fn comments_and_blocks_are_recognised() {
    assert_eq!(
        strip_comment("distgemm run --tp 2   # a comment"),
        "distgemm run --tp 2   "
    );
    assert_eq!(strip_comment("a#b c"), "a#b c");
    let md = "text\n```sh\ndistgemm plan --tp 2\n```\n```rust\nlet x = 1;\n```\n";
    let blocks = fenced_blocks(md);
    assert_eq!(
        blocks,
        vec![
            ("sh", vec![(3, "distgemm plan --tp 2")]),
            ("rust", vec![(6, "let x = 1;")])
        ]
    );
    let cmd = ReadmeCommand {
        line: 1,
        args: "bench --schedule rs-a --tp 8 --preset llama3-405b-fc2 --auto --reps 5"
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    };
    assert!(cmd.needs_gpu());
    assert_eq!(
        cmd.plan_args().join(" "),
        "plan --schedule rs-a --tp 8 --preset llama3-405b-fc2"
    );
}

#[test]
fn the_results_index_lists_every_result_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/results");
    let index = std::fs::read_to_string(dir.join("README.md"))
        .unwrap_or_else(|e| panic!("cannot read benches/results/README.md: {e}"));
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut missing: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name != "README.md" && !index.contains(&format!("`{name}`")))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "benches/results/README.md's index does not list {missing:?}: add one line per result, \
         \"- `FILE.md`, `FILE.json`: what it measured. machine, date, commit.\""
    );
}

/// Largest uncompressed log in `benches/results/`: the tracked tree travels to the GPU machine
/// with every device call, within 64 MiB, so a larger log is stored as `.log.gz`.
const MAX_PLAIN_LOG_BYTES: u64 = 20_000;

#[test]
fn large_result_logs_are_gzipped() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/results");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut large: Vec<String> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let bytes = entry.metadata().ok()?.len();
            (name.ends_with(".log") && bytes > MAX_PLAIN_LOG_BYTES).then_some(name)
        })
        .collect();
    large.sort();
    assert!(
        large.is_empty(),
        "logs over {MAX_PLAIN_LOG_BYTES} bytes in benches/results: {large:?}; store them as \
         `gzip -9n FILE.log` and index `FILE.log.gz` in benches/results/README.md"
    );
}
