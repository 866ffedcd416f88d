//! `distgemm tune`: measures which schedule of a family runs a problem faster on this
//! machine's GPUs and records it in a tuning table ([`crate::cuda::tuning`]) that `Auto` reads.
//!
//! Everything that can be refused without a GPU is refused first (exit status 2): the
//! arguments, a problem neither schedule of the family can run, an unusable existing table at
//! `--out`, an unusable `DISTGEMM_PTX`; then a machine without TP Hopper GPUs with peer
//! access. On the GPUs, every candidate (the family's pipelined schedule — for a
//! reduce-scatter with its partials read and pushed — and its single-stage schedule) is
//! built at once, each a [`DistGemm`] over its own random shards, and timed in
//! `--rounds` [`interleaved`] rounds (order reversed every other round): each block starts
//! with about `--settle-ms` of untimed runs (counted from the rule's estimate of one run),
//! then `--reps / --rounds` runs timed with CUDA events on every GPU
//! ([`time_on_streams`]), then a `wait` that turns a timed-out GPU wait into an error. A
//! candidate's time is the slowest GPU's median over all its rounds ([`Timing`]). The
//! fastest candidate becomes the entry of the problem's key (GPU, TP, dtype, family, token
//! bucket, N, K), merged into the table (an entry of the same key is replaced) and written
//! atomically (a temporary file renamed over the table).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::args::{MAX_BENCH_REPS, MAX_TUNE_ROUNDS, TuneArgs};
use super::{CliError, check_ptx_file, cuda_devices, memory};
use crate::cuda::tuning::{
    Candidate, LoadedTable, Provenance, TUNING_ENV_VAR, TuningEntry, TuningKey, TuningTable,
};
use crate::cuda::{AutoChoice, DistGemm, MachineModel, choose_schedule};
use crate::dtype::{Dtype, Element};
use crate::plan::{Plan, PlanOptions, RsPartials};
use crate::problem::Problem;
use crate::runtime::{DeviceCopy, Gpu, Module};
use crate::schedule::ScheduleKind;
use crate::testdata::random_operands;
use crate::timing::{Timing, TimingConfig, interleaved, time_on_streams};

/// The table written when neither `--out` nor `DISTGEMM_TUNING` names one.
const DEFAULT_TABLE: &str = "distgemm-tuning.json";

pub(super) fn tune(args: &TuneArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let problem = args.problem.problem()?;
    check_options(args)?;
    let tp = args.problem.tp;
    let family = args.problem.schedule.pipelined();
    let plans = candidate_plans(family, problem, tp)?;
    let path = table_path(args.out.as_deref());
    let mut table = existing_table(&path)?;
    check_ptx_file()?;
    let gpus = cuda_devices(tp).map_err(|reason| {
        CliError::CudaUnavailable(format!(
            "{reason}; distgemm tune times the candidates on the GPUs (no CPU fallback)"
        ))
    })?;
    for plan in &plans {
        memory::check_devices(plan, &gpus)?;
    }
    let model = MachineModel {
        sm_count: gpus[0].sm_count(),
        ..MachineModel::H200
    };
    let rule = choose_schedule(family, &problem, tp, &model);
    let candidates = match problem.dtype {
        Dtype::Bf16 => measure::<half::bf16>(args, problem, &plans, &gpus, &rule)?,
        Dtype::F16 => measure::<half::f16>(args, problem, &plans, &gpus, &rule)?,
    };
    let key = TuningKey::of(gpus[0].name(), tp, family, &problem);
    let entry = TuningEntry::from_measurements(key, candidates, provenance(&gpus, problem.m))
        .ok_or_else(|| CliError::Usage("no candidate was measured".into()))?;
    let report = render_report(&entry, &problem, rule.schedule);
    table.insert(entry);
    write_table(&path, &table)?;
    writeln!(
        out,
        "{report}wrote {} ({} entries); Auto reads it when {TUNING_ENV_VAR} names it",
        path.display(),
        table.entries.len()
    )?;
    Ok(())
}

/// `--reps`, `--rounds` and `--timeout-ms` within their ranges, and partials read (the mode
/// `Auto` runs, so the table's choice is what it measured).
fn check_options(args: &TuneArgs) -> Result<(), CliError> {
    if !(1..=MAX_BENCH_REPS).contains(&args.reps) {
        return Err(CliError::Usage(format!(
            "--reps must be between 1 and {MAX_BENCH_REPS}, got {}",
            args.reps
        )));
    }
    if !(1..=MAX_TUNE_ROUNDS).contains(&args.rounds) {
        return Err(CliError::Usage(format!(
            "--rounds must be between 1 and {MAX_TUNE_ROUNDS}, got {}",
            args.rounds
        )));
    }
    if args.timeout_ms == 0 {
        return Err(CliError::Usage(
            "--timeout-ms must be at least 1 (it bounds every GPU wait)".into(),
        ));
    }
    if args.problem.rs_partials.is_some() {
        return Err(CliError::Usage(
            "tune measures a reduce-scatter's partials both read and pushed; drop --rs-partials"
                .into(),
        ));
    }
    Ok(())
}

/// The plans of `family`'s pipelined schedule (a reduce-scatter's with partials read and
/// pushed; pushing only from TP 2, where there are partials to move) and its single-stage
/// schedule that can run `problem` (at least one, else the pipelined schedule's reason).
fn candidate_plans(
    family: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> Result<Vec<Plan>, CliError> {
    let (pipelined, single) = family.family();
    let build =
        |kind, rs_partials| Plan::build_with(kind, problem, tp, PlanOptions { rs_partials });
    let push = RsPartials::applies_to(pipelined) && tp > 1;
    let mut kinds = vec![(pipelined, RsPartials::Read)];
    if push {
        kinds.push((pipelined, RsPartials::Push));
    }
    kinds.push((single, RsPartials::Read));
    let plans: Vec<Plan> = kinds
        .into_iter()
        .filter_map(|(kind, partials)| build(kind, partials).ok())
        .collect();
    if plans.is_empty() {
        build(pipelined, RsPartials::Read)?;
    }
    Ok(plans)
}

/// `--out`, else the table `DISTGEMM_TUNING` names, else [`DEFAULT_TABLE`].
fn table_path(out: Option<&Path>) -> PathBuf {
    match out {
        Some(path) => path.to_owned(),
        None => std::env::var_os(TUNING_ENV_VAR)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_TABLE), PathBuf::from),
    }
}

/// The table at `path` to merge into: empty when there is no file, refused when there is
/// one that is not a valid table (it is never overwritten then).
fn existing_table(path: &Path) -> Result<TuningTable, CliError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TuningTable::default()),
        _ => Ok(LoadedTable::load(path)?.table),
    }
}

/// Writes `table` to `path` through a temporary file beside it, renamed over it: a reader
/// (another rank starting) sees the old table or the new one, never half of one.
fn write_table(path: &Path, table: &TuningTable) -> Result<(), CliError> {
    let mut text = serde_json::to_string_pretty(table)?;
    text.push('\n');
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// Warm-up and timed runs of one block of a candidate whose run takes about `seconds`: at
/// least `settle_ms` of untimed runs (at least 1), and `reps` spread over `rounds` (at least
/// 1 per round).
fn round_config(reps: usize, rounds: usize, settle_ms: u64, seconds: f64) -> TimingConfig {
    let run_ms = if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e3).max(1e-3)
    } else {
        1.0
    };
    let settle = (settle_ms as f64 / run_ms).ceil();
    TimingConfig {
        warmup: (settle as usize).clamp(1, MAX_BENCH_REPS),
        reps: reps.div_ceil(rounds.max(1)).max(1),
    }
}

/// The rule's estimate of one run of `schedule`, in seconds.
fn estimate(rule: &AutoChoice, schedule: ScheduleKind) -> f64 {
    if schedule.is_pipelined() {
        rule.pipelined_seconds
    } else {
        rule.single_stage_seconds
    }
}

/// Rounds a time to 0.1 µs, so that it reads back from JSON exactly.
fn round_ms(ms: f64) -> f64 {
    (ms * 1e4).round() / 1e4
}

/// A candidate's entry in the table from its timing over all rounds.
fn candidate(plan: &Plan, t: &Timing) -> Candidate {
    Candidate {
        schedule: plan.schedule,
        rs_partials: plan.rs_partials,
        median_ms: round_ms(t.median_ms),
        min_ms: round_ms(t.min_ms),
        max_ms: round_ms(t.max_ms),
        reps: t.samples_ms.len(),
    }
}

/// Times every candidate plan on `gpus` in interleaved rounds (module documentation).
fn measure<T: Element + DeviceCopy>(
    args: &TuneArgs,
    problem: Problem,
    plans: &[Plan],
    gpus: &[Gpu],
    rule: &AutoChoice,
) -> Result<Vec<Candidate>, CliError> {
    let tp = args.problem.tp;
    let modules = gpus
        .iter()
        .map(Module::load)
        .collect::<Result<Vec<Arc<Module>>, _>>()?;
    // The shards must outlive the DistGemms that borrow them.
    let operands = plans
        .iter()
        .map(|plan| random_operands::<T>(plan, gpus, &modules, 1))
        .collect::<Result<Vec<_>, _>>()?;
    let mut dists = Vec::with_capacity(plans.len());
    for (plan, operands) in plans.iter().zip(&operands) {
        let builder = DistGemm::builder()
            .devices(gpus.to_vec())
            .tp(tp)
            .schedule(plan.schedule)
            .rs_partials(plan.rs_partials)
            .problem(problem)
            .dtype(T::DTYPE)
            .timeout(Duration::from_millis(args.timeout_ms))
            .modules(modules.clone())
            .args(operands.device_args());
        let builder = match operands.tensor_scales() {
            Some((sa, sb)) => builder.fp8_scales(sa, sb),
            None => builder,
        };
        dists.push(builder.build()?);
    }
    let configs: Vec<TimingConfig> = plans
        .iter()
        .map(|p| {
            let seconds = estimate(rule, p.schedule);
            round_config(args.reps, args.rounds, args.settle_ms, seconds)
        })
        .collect();
    let bar = ProgressBar::new((plans.len() * args.rounds) as u64);
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} blocks ({elapsed})") {
        bar.set_style(style);
    }
    let samples = interleaved(
        dists.len(),
        args.rounds,
        |c, _round| -> Result<_, CliError> {
            let dist = &mut dists[c];
            let streams = dist.streams();
            let measured: Result<Timing, CliError> =
                time_on_streams(gpus, &streams, configs[c], |_| Ok(dist.run()?));
            // Always wait (it reads every GPU's error word), also after a failed launch.
            let waited = dist.wait();
            let timing = measured?;
            waited?;
            bar.inc(1);
            Ok(timing.per_device_ms)
        },
    );
    bar.finish_and_clear();
    plans
        .iter()
        .zip(samples)
        .map(|(plan, s)| Ok(candidate(plan, &Timing::from_devices(s?)?)))
        .collect()
}

/// Where and when: now, the commit (`DISTGEMM_COMMIT` at run or build time, as the bundle
/// sets it), this host and its GPUs, the M measured.
fn provenance(gpus: &[Gpu], m: usize) -> Provenance {
    let unix_seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let commit = std::env::var("DISTGEMM_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| option_env!("DISTGEMM_COMMIT").map(str::to_owned))
        .unwrap_or_else(|| format!("unknown (distgemm {})", env!("CARGO_PKG_VERSION")));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".into());
    let gpu = gpus.first().map_or("no GPU", Gpu::name);
    Provenance {
        unix_seconds,
        commit,
        machine: format!("{host}: {}× {gpu}", gpus.len()),
        m,
    }
}

/// How much less time the entry's choice takes than the rule's (its schedule with partials
/// read, as `Auto` runs it without a table), as a fraction of the rule's (0 when they agree;
/// `None` when the rule's schedule was not measured).
fn gain_over_rule(entry: &TuningEntry, rule: ScheduleKind) -> Option<f64> {
    let chosen = entry.median_ms(entry.choice, entry.rs_partials)?;
    let ruled = entry.median_ms(rule, RsPartials::Read)?;
    Some((ruled - chosen) / ruled)
}

/// A candidate's name in the report: the schedule, and for a pipelined reduce-scatter how
/// its partials move.
fn candidate_name(schedule: ScheduleKind, rs_partials: RsPartials) -> String {
    if RsPartials::applies_to(schedule) {
        format!("{} ({})", schedule.cli_name(), rs_partials.cli_name())
    } else {
        schedule.cli_name().to_owned()
    }
}

/// The text report: one line per candidate, then the choice against the rule's.
fn render_report(entry: &TuningEntry, problem: &Problem, rule: ScheduleKind) -> String {
    let mut text = format!(
        "tune {} TP={} {problem} on {} (token bucket {}):\n",
        entry.key.family.cli_name(),
        entry.key.tp,
        entry.key.gpu,
        entry.key.tokens
    );
    for c in &entry.candidates {
        let mark = if c.schedule == entry.choice && c.rs_partials == entry.rs_partials {
            "  <- fastest"
        } else {
            ""
        };
        text.push_str(&format!(
            "  {:<12} median {:.4} ms, min {:.4} ms, max {:.4} ms ({} reps){mark}\n",
            candidate_name(c.schedule, c.rs_partials),
            c.median_ms,
            c.min_ms,
            c.max_ms,
            c.reps
        ));
    }
    let chosen = candidate_name(entry.choice, entry.rs_partials);
    let verdict = match gain_over_rule(entry, rule) {
        _ if rule == entry.choice && entry.rs_partials == RsPartials::Read => {
            "the rule picks the same".to_owned()
        }
        Some(gain) => format!(
            "the rule picks {}; the tuned choice takes {:.1} % less time",
            rule.cli_name(),
            gain * 100.0
        ),
        None => format!("the rule picks {} (not measured)", rule.cli_name()),
    };
    text.push_str(&format!("chosen: {chosen}; {verdict}\n"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Preset;
    use crate::schedule::ScheduleKind::{ReduceScatterSingleStageA, ReduceScatterTilingA};

    fn timing(per_device: Vec<Vec<f64>>) -> Timing {
        Timing::from_devices(per_device).unwrap()
    }

    /// 70B fc2 at 256 tokens as measured on 2×H200 (distgemm-sweep-2026-11-30-3b382b1):
    /// rs-a 0.194 ms, rs-a-single 0.120 ms.
    fn measured_entry() -> TuningEntry {
        let problem = Preset::Llama3_70bFc2.problem(256);
        let key = TuningKey::of("NVIDIA H200", 2, ReduceScatterTilingA, &problem);
        let piped = timing(vec![vec![0.19, 0.194, 0.2], vec![0.193, 0.195, 0.1941]]);
        let single = timing(vec![vec![0.12, 0.121, 0.119], vec![0.118, 0.12, 0.125]]);
        let plan = |kind| Plan::build_with(kind, problem, 2, PlanOptions::default()).unwrap();
        let candidates = vec![
            candidate(&plan(ReduceScatterTilingA), &piped),
            candidate(&plan(ReduceScatterSingleStageA), &single),
        ];
        let provenance = Provenance {
            unix_seconds: 0,
            commit: "test".into(),
            machine: "host: 2× NVIDIA H200".into(),
            m: 256,
        };
        TuningEntry::from_measurements(key, candidates, provenance).unwrap()
    }

    #[test]
    fn candidates_keep_the_slowest_gpus_median_to_a_tenth_of_a_microsecond() {
        let e = measured_entry();
        let piped = &e.candidates[0];
        // Device medians 0.194 and 0.1941: the slowest device's.
        assert_eq!(piped.median_ms, 0.1941);
        assert_eq!((piped.min_ms, piped.max_ms, piped.reps), (0.193, 0.2, 3));
        assert_eq!(round_ms(0.123_456_78), 0.1235);
        assert_eq!(e.choice, ReduceScatterSingleStageA);
    }

    #[test]
    fn the_report_names_the_choice_and_its_gain_over_the_rule() {
        let e = measured_entry();
        let problem = Preset::Llama3_70bFc2.problem(256);
        let gain = gain_over_rule(&e, ReduceScatterTilingA).unwrap();
        assert!((gain - (0.1941 - 0.12) / 0.1941).abs() < 1e-12, "{gain}");
        assert_eq!(gain_over_rule(&e, ReduceScatterSingleStageA), Some(0.0));
        let text = render_report(&e, &problem, ReduceScatterTilingA);
        assert_eq!(
            text,
            "tune rs-a TP=2 M=256 N=8192 K=28672 bf16 on NVIDIA H200 (token bucket 256):\n  \
             rs-a (read)  median 0.1941 ms, min 0.1930 ms, max 0.2000 ms (3 reps)\n  \
             rs-a-single  median 0.1200 ms, min 0.1200 ms, max 0.1250 ms (3 reps)  <- fastest\n\
             chosen: rs-a-single; the rule picks rs-a; the tuned choice takes 38.2 % less time\n"
        );
        let same = render_report(&e, &problem, ReduceScatterSingleStageA);
        assert!(
            same.ends_with("chosen: rs-a-single; the rule picks the same\n"),
            "{same}"
        );
    }

    #[test]
    fn a_faster_push_is_the_choice_and_its_gain_is_over_the_rules_read() {
        let problem = Preset::Llama3_70bFc2.problem(4096);
        let plans = candidate_plans(ReduceScatterTilingA, problem, 2).unwrap();
        let times = [
            timing(vec![vec![1.0, 1.0, 1.0]]),
            timing(vec![vec![0.9, 0.9, 0.9]]),
            timing(vec![vec![1.2, 1.2, 1.2]]),
        ];
        let candidates = plans
            .iter()
            .zip(&times)
            .map(|(p, t)| candidate(p, t))
            .collect();
        let key = TuningKey::of("NVIDIA H200", 2, ReduceScatterTilingA, &problem);
        let provenance = Provenance {
            unix_seconds: 0,
            commit: "test".into(),
            machine: "host: 2× NVIDIA H200".into(),
            m: 4096,
        };
        let e = TuningEntry::from_measurements(key, candidates, provenance).unwrap();
        assert_eq!(
            (e.choice, e.rs_partials),
            (ReduceScatterTilingA, RsPartials::Push)
        );
        let gain = gain_over_rule(&e, ReduceScatterTilingA).unwrap();
        assert!((gain - 0.1).abs() < 1e-12, "{gain}");
        let text = render_report(&e, &problem, ReduceScatterTilingA);
        assert!(text.contains("rs-a (push)  median 0.9000 ms"), "{text}");
        assert!(text.contains("(3 reps)  <- fastest"), "{text}");
        assert!(
            text.ends_with(
                "chosen: rs-a (push); the rule picks rs-a; the tuned choice takes 10.0 % less time\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn blocks_settle_for_the_given_time_and_share_the_repetitions() {
        // 0.25 ms runs: 1000 ms of settling is 4000 runs; 60 reps over 3 rounds are 20 each.
        let c = round_config(60, 3, 1000, 0.25e-3);
        assert_eq!((c.warmup, c.reps), (4000, 20));
        // 61 reps over 3 rounds: 21 each (never fewer than asked); at least 1 of each.
        assert_eq!(round_config(61, 3, 1000, 0.25e-3).reps, 21);
        assert_eq!(
            round_config(1, 3, 0, 1.0),
            TimingConfig { warmup: 1, reps: 1 }
        );
        // Tiny or unknown estimates are bounded.
        assert_eq!(round_config(3, 1, 1000, 1e-9).warmup, MAX_BENCH_REPS);
        assert_eq!(round_config(3, 1, 1000, f64::NAN).warmup, 1000);
    }

    #[test]
    fn a_measurement_merges_into_the_table_on_disk() {
        let dir = std::env::temp_dir().join(format!("distgemm-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuning.json");
        // No file: an empty table.
        assert_eq!(existing_table(&path).unwrap(), TuningTable::default());
        let mut table = existing_table(&path).unwrap();
        table.insert(measured_entry());
        write_table(&path, &table).unwrap();
        // A second measurement of the same key replaces the first; the file reads back.
        let mut again = existing_table(&path).unwrap();
        assert_eq!(again, table);
        let mut newer = measured_entry();
        newer.provenance.unix_seconds = 1;
        assert!(again.insert(newer).is_some());
        write_table(&path, &again).unwrap();
        let back = LoadedTable::load(&path).unwrap().table;
        assert_eq!(back.entries.len(), 1);
        assert_eq!(back.entries[0].provenance.unix_seconds, 1);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        // A file that is not a table is refused, never overwritten.
        std::fs::write(&path, "not json").unwrap();
        assert!(matches!(existing_table(&path), Err(CliError::Tuning(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn both_schedules_of_the_family_are_candidates_when_both_run() {
        let problem = Preset::Llama3_70bFc2.problem(256);
        let kinds = |family, tp| -> Vec<(ScheduleKind, RsPartials)> {
            let plans = candidate_plans(family, problem, tp).unwrap();
            plans.iter().map(|p| (p.schedule, p.rs_partials)).collect()
        };
        // A pipelined reduce-scatter with partials read and pushed, from TP 2.
        let (read, push) = (RsPartials::Read, RsPartials::Push);
        assert_eq!(
            kinds(ReduceScatterTilingA, 2),
            vec![
                (ReduceScatterTilingA, read),
                (ReduceScatterTilingA, push),
                (ReduceScatterSingleStageA, read)
            ]
        );
        assert_eq!(
            kinds(ReduceScatterTilingA, 1),
            vec![
                (ReduceScatterTilingA, read),
                (ReduceScatterSingleStageA, read)
            ]
        );
        assert_eq!(
            kinds(ScheduleKind::AllGatherRotatingA, 2),
            vec![
                (ScheduleKind::AllGatherRotatingA, read),
                (ScheduleKind::AllGatherSingleStageA, read)
            ]
        );
        assert!(matches!(
            candidate_plans(ReduceScatterTilingA, Preset::Llama3_70bFc2.problem(201), 2),
            Err(CliError::Plan(_))
        ));
    }

    #[test]
    fn the_table_is_out_else_the_environment_else_the_default() {
        assert_eq!(
            table_path(Some(Path::new("/tmp/t.json"))),
            PathBuf::from("/tmp/t.json")
        );
        // The environment is not changed by tests (other tests read it concurrently).
        let expected = std::env::var_os(TUNING_ENV_VAR)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_TABLE), PathBuf::from);
        assert_eq!(table_path(None), expected);
    }
}
