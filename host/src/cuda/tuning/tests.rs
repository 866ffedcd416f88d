//! Tests of the table format, lookup and file reading; `fc2_entry` is shared with `Auto`'s tests.

use std::path::Path;

use super::load::fnv1a;
use super::table::all_problem_kinds;
use super::*;
use crate::dtype::Dtype;
use crate::fp8::ScaleMode;
use crate::problem::{Preset, Problem};
use crate::schedule::ScheduleKind::{
    AllGatherRotatingA, AllGatherSingleStageA, ReduceScatterSingleStageA, ReduceScatterTilingA,
};
use crate::schedule::{RsPartials, ScheduleKind};

fn candidate(schedule: ScheduleKind, median_ms: f64) -> Candidate {
    Candidate {
        schedule,
        rs_partials: RsPartials::Read,
        median_ms,
        // Times as `distgemm tune` records them, to 0.1 µs (they read back exactly).
        min_ms: ((median_ms * 0.9) * 1e4).round() / 1e4,
        max_ms: ((median_ms * 1.1) * 1e4).round() / 1e4,
        reps: 60,
    }
}

fn provenance(m: usize) -> Provenance {
    Provenance {
        unix_seconds: 1_796_132_000,
        commit: "c0987df".into(),
        machine: "node7: 2× NVIDIA H200".into(),
        m,
    }
}

/// An entry for 70B fc2 (rs-a) at `tokens`, with the given medians.
pub(crate) fn fc2_entry(tokens: usize, pipelined_ms: f64, single_ms: f64) -> TuningEntry {
    let problem = Preset::Llama3_70bFc2.problem(tokens);
    TuningEntry::from_measurements(
        TuningKey::of("NVIDIA H200", 2, ReduceScatterTilingA, &problem),
        vec![
            candidate(ReduceScatterTilingA, pipelined_ms),
            candidate(ReduceScatterSingleStageA, single_ms),
        ],
        provenance(tokens),
    )
    .unwrap()
}

fn table(entries: Vec<TuningEntry>) -> TuningTable {
    let mut t = TuningTable::default();
    for e in entries {
        t.insert(e);
    }
    t
}

#[test]
fn token_buckets_round_to_the_nearest_power_of_two_by_ratio() {
    let cases = [
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 4),
        (6, 8),
        (256, 256),
        (362, 256), // 256·√2 = 362.04
        (363, 512),
        (1000, 1024),
        (16384, 16384),
        (usize::MAX, 1 << (usize::BITS - 1)),
    ];
    for (m, bucket) in cases {
        assert_eq!(token_bucket(m), bucket, "M={m}");
    }
}

#[test]
fn problem_kinds_name_the_fp8_form() {
    let p = Problem::new(64, 64, 64);
    assert_eq!(problem_kind(&p), "bf16");
    assert_eq!(problem_kind(&p.with_dtype(Dtype::F16)), "f16");
    let fp8 = p.with_dtype(Dtype::F16).with_fp8(ScaleMode::Rowwise);
    assert_eq!(problem_kind(&fp8), "e4m3-row-f16");
    assert!(all_problem_kinds().contains(&problem_kind(&fp8)));
    assert_eq!(all_problem_kinds().len(), 6);
}

#[test]
fn the_fastest_candidate_is_chosen_and_ties_go_to_the_single_stage_schedule() {
    assert_eq!(
        fc2_entry(256, 0.194, 0.120).choice,
        ReduceScatterSingleStageA
    );
    assert_eq!(fc2_entry(4096, 1.484, 1.547).choice, ReduceScatterTilingA);
    assert_eq!(fc2_entry(1024, 0.5, 0.5).choice, ReduceScatterSingleStageA);
    let key = TuningKey::of("g", 2, AllGatherRotatingA, &Problem::new(64, 64, 64));
    assert!(TuningEntry::from_measurements(key, Vec::new(), provenance(64)).is_none());
}

#[test]
fn a_table_round_trips_through_json_with_cli_names() {
    let t = table(vec![
        fc2_entry(256, 0.194, 0.120),
        fc2_entry(4096, 1.484, 1.547),
    ]);
    let json = serde_json::to_string_pretty(&t).unwrap();
    assert!(json.contains(r#""family": "rs-a""#), "{json}");
    assert!(json.contains(r#""choice": "rs-a-single""#), "{json}");
    let back = TuningTable::from_json(&json, "test").unwrap();
    assert_eq!(back, t);
}

#[test]
fn merging_replaces_the_same_key_and_keeps_entries_sorted() {
    let mut t = table(vec![
        fc2_entry(4096, 1.484, 1.547),
        fc2_entry(256, 0.194, 0.120),
    ]);
    let tokens: Vec<usize> = t.entries.iter().map(|e| e.key.tokens).collect();
    assert_eq!(tokens, vec![256, 4096]);
    // A new measurement of 256 tokens (now pipelining wins) replaces the old one.
    let old = t.insert(fc2_entry(256, 0.100, 0.120)).unwrap();
    assert_eq!(old.choice, ReduceScatterSingleStageA);
    assert_eq!(t.entries.len(), 2);
    assert_eq!(t.entries[0].choice, ReduceScatterTilingA);
    // Another bucket is added beside them, in order.
    assert!(t.insert(fc2_entry(1024, 0.392, 0.388)).is_none());
    let tokens: Vec<usize> = t.entries.iter().map(|e| e.key.tokens).collect();
    assert_eq!(tokens, vec![256, 1024, 4096]);
    t.validate("merged").unwrap();
}

#[test]
fn lookup_takes_the_exact_bucket_else_a_neighbouring_one_of_the_same_shape() {
    let t = table(vec![
        fc2_entry(256, 0.194, 0.120),
        fc2_entry(4096, 1.484, 1.547),
    ]);
    let look = |gpu: &str, tp, family, p: Problem| {
        t.lookup(gpu, tp, family, &p)
            .map(|m| (m.entry.key.tokens, m.exact))
    };
    let fc2 = |m| Preset::Llama3_70bFc2.problem(m);
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(256)),
        Some((256, true))
    );
    // 300 tokens are in bucket 256; the single-stage name of the family finds it too.
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterSingleStageA, fc2(300)),
        Some((256, true))
    );
    // 16384 is two octaves from 4096: too far, no entry (the rule decides).
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(16384)),
        None
    );
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(8192)),
        Some((4096, false))
    );
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(128)),
        Some((256, false))
    );
    assert_eq!(look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(64)), None);
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(512)),
        Some((256, false))
    );
    // 1024 is two octaves from both: neither.
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(1024)),
        None
    );
    // One octave from both (a table of 256 and 1024, at 512): the smaller bucket.
    let both = table(vec![
        fc2_entry(256, 0.194, 0.120),
        fc2_entry(1024, 0.5, 0.6),
    ]);
    assert_eq!(
        both.lookup("NVIDIA H200", 2, ReduceScatterTilingA, &fc2(512))
            .map(|m| (m.entry.key.tokens, m.exact)),
        Some((256, false))
    );
    assert_eq!(
        look("NVIDIA H200", 2, ReduceScatterTilingA, fc2(2048)),
        Some((4096, false))
    );
    // Anything else of the key differs: no entry.
    assert_eq!(
        look("NVIDIA H100 80GB HBM3", 2, ReduceScatterTilingA, fc2(256)),
        None
    );
    assert_eq!(look("NVIDIA H200", 4, ReduceScatterTilingA, fc2(256)), None);
    assert_eq!(look("NVIDIA H200", 2, AllGatherRotatingA, fc2(256)), None);
    assert_eq!(
        look(
            "NVIDIA H200",
            2,
            ReduceScatterTilingA,
            fc2(256).with_dtype(Dtype::F16)
        ),
        None
    );
    let fp8 = fc2(256).with_fp8(ScaleMode::Tensorwise);
    assert_eq!(look("NVIDIA H200", 2, ReduceScatterTilingA, fp8), None);
    assert_eq!(
        look(
            "NVIDIA H200",
            2,
            ReduceScatterTilingA,
            Problem::new(256, 8192, 8192)
        ),
        None
    );
}

fn refused(json: &str) -> TuningError {
    TuningTable::from_json(json, "t.json").unwrap_err()
}

fn good_json() -> String {
    serde_json::to_string(&table(vec![fc2_entry(256, 0.194, 0.120)])).unwrap()
}

#[test]
fn bad_tables_are_refused_with_the_reason() {
    assert!(matches!(
        refused("{\"version\": 1, "),
        TuningError::Malformed { .. }
    ));
    assert!(matches!(refused("[]"), TuningError::Malformed { .. }));
    let v2 = good_json().replace("\"version\":1", "\"version\":2");
    let e = refused(&v2);
    assert!(matches!(e, TuningError::Version { found: 2, .. }), "{e}");
    assert!(e.to_string().contains("reads version 1"), "{e}");
    let unknown = good_json().replace("\"version\":1", "\"version\":1,\"extra\":0");
    assert!(matches!(refused(&unknown), TuningError::Malformed { .. }));
    let schedule = good_json().replace("\"rs-a-single\"", "\"rs-c\"");
    let e = refused(&schedule);
    assert!(e.to_string().contains("unknown schedule \"rs-c\""), "{e}");
    let cases = [
        (
            "\"median_ms\":0.12,",
            "\"median_ms\":-0.12,",
            "positive and finite",
        ),
        ("\"min_ms\":0.108", "\"min_ms\":0.5", "does not hold"),
        ("\"reps\":60", "\"reps\":0", "0 repetitions"),
        ("\"tokens\":256", "\"tokens\":300", "not a power of two"),
        ("\"tp\":2", "\"tp\":9", "outside 1..=8"),
        ("\"dtype\":\"bf16\"", "\"dtype\":\"fp4\"", "unknown dtype"),
        (
            "\"family\":\"rs-a\"",
            "\"family\":\"rs-a-single\"",
            "pipelined schedule",
        ),
        (
            "\"choice\":\"rs-a-single\"",
            "\"choice\":\"ag-a\"",
            "not among the candidates",
        ),
        (
            "{\"schedule\":\"rs-a\"",
            "{\"schedule\":\"ag-a\"",
            "not of family rs-a",
        ),
        (
            "{\"schedule\":\"rs-a-single\",\"rs_partials\":\"read\"",
            "{\"schedule\":\"rs-a-single\",\"rs_partials\":\"push\"",
            "only a pipelined reduce-scatter pushes",
        ),
        (
            "\"choice\":\"rs-a-single\",\"rs_partials\":\"read\"",
            "\"choice\":\"rs-a-single\",\"rs_partials\":\"push\"",
            "(push) is not among the candidates",
        ),
    ];
    for (from, to, needle) in cases {
        let json = good_json();
        assert!(json.contains(from), "{from} not in {json}");
        let e = refused(&json.replacen(from, to, 1));
        assert!(
            matches!(&e, TuningError::InvalidEntry { index: 0, .. }),
            "{to}: {e:?}"
        );
        assert!(e.to_string().contains(needle), "{needle:?} not in {e}");
    }
    let mut twice = table(vec![fc2_entry(256, 0.194, 0.120)]);
    twice.entries.push(twice.entries[0].clone());
    let e = refused(&serde_json::to_string(&twice).unwrap());
    assert!(
        e.to_string().contains("entry 1: same key as entry 0"),
        "{e}"
    );
}

#[test]
fn files_are_read_bounded_and_only_when_regular() {
    let dir = std::env::temp_dir().join(format!("distgemm-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.json");
    std::fs::write(&good, good_json()).unwrap();
    let loaded = LoadedTable::load(&good).unwrap();
    assert_eq!(loaded.table.entries.len(), 1);
    assert_eq!(loaded.digest, fnv1a(good_json().as_bytes()));
    assert!(
        loaded
            .identity()
            .starts_with(&format!("{}#", good.display()))
    );
    let big = dir.join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(MAX_TABLE_BYTES + 1).unwrap();
    let e = LoadedTable::load(&big).unwrap_err();
    assert!(matches!(e, TuningError::TooLarge { .. }), "{e:?}");
    assert!(matches!(
        LoadedTable::load(&dir).unwrap_err(),
        TuningError::NotAFile { .. }
    ));
    if Path::new("/dev/zero").exists() {
        assert!(matches!(
            LoadedTable::load(Path::new("/dev/zero")).unwrap_err(),
            TuningError::NotAFile { .. }
        ));
    }
    // A FIFO is refused without being opened (opening one blocks until a writer comes).
    let fifo = dir.join("fifo.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        assert!(matches!(
            LoadedTable::load(&fifo).unwrap_err(),
            TuningError::NotAFile { .. }
        ));
    }
    let e = LoadedTable::load(&dir.join("missing.json")).unwrap_err();
    assert!(matches!(e, TuningError::Unreadable { .. }), "{e:?}");
    let binary = dir.join("binary.json");
    std::fs::write(&binary, [0xff, 0xfe]).unwrap();
    assert!(matches!(
        LoadedTable::load(&binary).unwrap_err(),
        TuningError::Malformed { .. }
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fnv1a_matches_the_reference_values() {
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn an_unmatched_family_name_is_its_pipelined_schedule() {
    let key = TuningKey::of("g", 2, AllGatherSingleStageA, &Problem::new(100, 64, 64));
    assert_eq!(key.family, AllGatherRotatingA);
    assert_eq!(key.tokens, 128);
    assert_eq!(key.to_string(), "g TP=2 bf16 ag-a M≈128 N=64 K=64");
}

/// A tuned push: the entry records the fastest candidate's partials mode, `Auto` takes it
/// unless the builder sets one, and tables written before pushes were tuned read as `read`.
#[test]
fn a_measured_push_is_autos_partials_unless_the_builder_sets_them() {
    let problem = Preset::Llama3_70bFc2.problem(4096);
    let mut push = candidate(ReduceScatterTilingA, 0.9);
    push.rs_partials = RsPartials::Push;
    let entry = TuningEntry::from_measurements(
        TuningKey::of("NVIDIA H200", 2, ReduceScatterTilingA, &problem),
        vec![
            candidate(ReduceScatterTilingA, 1.0),
            push,
            candidate(ReduceScatterSingleStageA, 1.2),
        ],
        provenance(4096),
    )
    .unwrap();
    assert_eq!(
        (entry.choice, entry.rs_partials),
        (ReduceScatterTilingA, RsPartials::Push)
    );
    // (rs-a, read) and (rs-a, push) are two candidates, not one listed twice.
    let t = table(vec![entry]);
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(TuningTable::from_json(&json, "t.json").unwrap(), t);
    let loaded = std::sync::Arc::new(LoadedTable {
        table: t,
        path: "t.json".into(),
        digest: 1,
    });
    let resolved = crate::cuda::choose_schedule_tuned(
        ReduceScatterTilingA,
        &problem,
        2,
        "NVIDIA H200",
        &crate::cuda::MachineModel::H200,
        Some(&loaded),
    );
    assert_eq!(resolved.schedule, ReduceScatterTilingA);
    assert_eq!(resolved.rs_partials, Some(RsPartials::Push));
    assert_eq!(resolved.rs_partials_with(None), RsPartials::Push);
    assert_eq!(
        resolved.rs_partials_with(Some(RsPartials::Read)),
        RsPartials::Read
    );
    // The builders' plans: the table's push under Auto, the builder's setting over it, and
    // read for a fixed schedule.
    let builder = || {
        crate::cuda::DistGemm::builder()
            .tp(2)
            .problem(problem)
            .auto_schedule(ReduceScatterTilingA)
            .tuning_table(std::sync::Arc::clone(&loaded))
    };
    // (The builder looks the table up under the name of an H200, as `tune` wrote it.)
    let plan = builder().plan().unwrap();
    assert_eq!(plan.rs_partials, RsPartials::Push);
    let plan = builder().rs_partials(RsPartials::Read).plan().unwrap();
    assert_eq!(plan.rs_partials, RsPartials::Read);
    let fixed = crate::cuda::DistGemm::builder()
        .tp(2)
        .problem(problem)
        .schedule(ReduceScatterTilingA)
        .plan()
        .unwrap();
    assert_eq!(fixed.rs_partials, RsPartials::Read);
    let rank = crate::cuda::RankGemm::builder()
        .problem(problem)
        .auto_schedule(ReduceScatterTilingA)
        .tuning_table(std::sync::Arc::clone(&loaded))
        .plan(2)
        .unwrap();
    assert_eq!(rank.rs_partials, RsPartials::Push);
    // A table written before pushes were tuned: no `rs_partials` anywhere reads as read.
    let old = serde_json::to_string(&table(vec![fc2_entry(256, 0.194, 0.120)]))
        .unwrap()
        .replace(",\"rs_partials\":\"read\"", "");
    assert!(!old.contains("rs_partials"), "{old}");
    let back = TuningTable::from_json(&old, "t.json").unwrap();
    assert!(
        back.entries[0]
            .candidates
            .iter()
            .all(|c| c.rs_partials == RsPartials::Read)
    );
    assert_eq!(back.entries[0].rs_partials, RsPartials::Read);
}
