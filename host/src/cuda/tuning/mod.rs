//! Tuning tables: measured schedule choices that [`Auto`](super::auto) prefers to its cost
//! model.
//!
//! `distgemm tune` times the two schedules of a family (pipelined and single-stage) on the
//! GPUs in interleaved rounds and records, for one shape bucket, which was faster and every
//! candidate's times. `Auto` then looks the problem up: an entry of the same GPU, TP, problem
//! kind, family, N and K, with the problem's token bucket if there is one, else a neighbouring
//! token bucket (one octave, a factor of 2 in tokens, away; a farther entry says nothing about
//! this M); without a matching entry it uses the rule. The table is a file named by
//! [`TUNING_ENV_VAR`] (or given to a builder), read once per resolution, so every rank that
//! reads the same file makes the same choice.
//!
//! The format (version [`TABLE_VERSION`]):
//!
//! ```json
//! {
//!   "version": 1,
//!   "entries": [{
//!     "key": {"gpu": "NVIDIA H200", "tp": 2, "dtype": "bf16", "family": "rs-a",
//!             "tokens": 256, "n": 8192, "k": 28672},
//!     "choice": "rs-a-single",
//!     "candidates": [
//!       {"schedule": "rs-a", "median_ms": 0.194, "min_ms": 0.19, "max_ms": 0.2, "reps": 60},
//!       {"schedule": "rs-a-single", "median_ms": 0.12, "min_ms": 0.118, "max_ms": 0.13, "reps": 60}
//!     ],
//!     "provenance": {"unix_seconds": 1796132000, "commit": "c0987df", "machine": "node7: 2× NVIDIA H200", "m": 256}
//!   }]
//! }
//! ```
//!
//! - `dtype` is the problem kind ([`problem_kind`]): `bf16`, `f16`, or for an FP8 problem
//!   `e4m3-<scales>-<output type>` (`e4m3-row-bf16`);
//! - `family` is the family's pipelined schedule, `choice` and every candidate's `schedule`
//!   a schedule of that family (CLI names);
//! - `tokens` is the bucket of M ([`token_bucket`]: M rounded to the nearest power of two),
//!   N and K are exact;
//! - `choice` is normally the candidate with the smallest median (ties to the single-stage
//!   schedule, as the rule's); an edited table may name another candidate.
//!
//! Loading refuses, with a [`TuningError`] naming the file: anything but a regular file of at
//! most [`MAX_TABLE_BYTES`], malformed JSON or unknown fields, another version, and entries
//! that are invalid (times that are not positive and finite, a choice outside its family or
//! not among the candidates, a token bucket that is not a power of two, TP outside 1..=8, an
//! unknown problem kind) or duplicated.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dtype::Dtype;
use crate::fp8::ScaleMode;
use crate::problem::Problem;
use crate::schedule::ScheduleKind;

/// The environment variable naming the tuning table `Auto` reads (unset or empty: none).
pub const TUNING_ENV_VAR: &str = "DISTGEMM_TUNING";
/// Largest tuning table file read, in bytes (16 MiB: about 40,000 entries).
pub const MAX_TABLE_BYTES: u64 = 16 << 20;
/// How many octaves (factors of 2 in tokens) a table entry's bucket may lie from the
/// problem's for [`TuningTable::lookup`] to use it.
pub const MAX_BUCKET_OCTAVES: u32 = 1;
/// The format version this crate reads and writes.
pub const TABLE_VERSION: u32 = 1;
/// Largest tensor-parallel degree an entry may have (as the schedules).
const MAX_TP: usize = 8;

/// Why a tuning table was refused.
#[derive(Debug, Error)]
pub enum TuningError {
    /// The file could not be opened or read.
    #[error("tuning table {path}: cannot read it: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Not a regular file (a directory, a device such as `/dev/zero`, a pipe).
    #[error("tuning table {path}: not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Larger than [`MAX_TABLE_BYTES`].
    #[error(
        "tuning table {path}: {bytes} bytes, more than the {MAX_TABLE_BYTES} (16 MiB) a table may have"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (or the bytes read before giving up).
        bytes: u64,
    },
    /// Not JSON of the table's shape.
    #[error("tuning table {origin}: malformed: {reason}")]
    Malformed {
        /// The file (or another description of where the text came from).
        origin: String,
        /// The parser's message.
        reason: String,
    },
    /// Another format version.
    #[error("tuning table {origin}: version {found}, this distgemm reads version {TABLE_VERSION}")]
    Version {
        /// Where the table came from.
        origin: String,
        /// The version the file has.
        found: u32,
    },
    /// An entry breaks a rule of the format.
    #[error("tuning table {origin}: entry {index}: {reason}")]
    InvalidEntry {
        /// Where the table came from.
        origin: String,
        /// The entry's index in `entries`.
        index: usize,
        /// Which rule.
        reason: String,
    },
}

/// A tuning table: measured choices, one per key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningTable {
    /// [`TABLE_VERSION`].
    pub version: u32,
    /// The entries, sorted by key (see [`TuningTable::insert`]).
    pub entries: Vec<TuningEntry>,
}

impl Default for TuningTable {
    fn default() -> Self {
        TuningTable {
            version: TABLE_VERSION,
            entries: Vec::new(),
        }
    }
}

/// What an entry is about: the machine, the problem kind and shape bucket, and the family.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningKey {
    /// The GPU's name as the driver gives it ("NVIDIA H200").
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: usize,
    /// The problem kind ([`problem_kind`]).
    pub dtype: String,
    /// The family, as its pipelined schedule.
    #[serde(with = "schedule_name")]
    pub family: ScheduleKind,
    /// The token bucket ([`token_bucket`] of M).
    pub tokens: usize,
    /// N, exact.
    pub n: usize,
    /// K, exact.
    pub k: usize,
}

impl TuningKey {
    /// The key of `problem` for `family` at `tp` on a `gpu`.
    #[must_use]
    pub fn of(gpu: &str, tp: usize, family: ScheduleKind, problem: &Problem) -> TuningKey {
        TuningKey {
            gpu: gpu.to_owned(),
            tp,
            dtype: problem_kind(problem),
            family: family.pipelined(),
            tokens: token_bucket(problem.m),
            n: problem.n,
            k: problem.k,
        }
    }

    /// Whether `other` differs from this key in its token bucket at most.
    fn same_shape_family(&self, other: &TuningKey) -> bool {
        self.gpu == other.gpu
            && self.tp == other.tp
            && self.dtype == other.dtype
            && self.family == other.family
            && self.n == other.n
            && self.k == other.k
    }

    /// The order of entries in a table.
    fn sort_key(&self) -> (&str, usize, &str, &str, usize, usize, usize) {
        (
            &self.gpu,
            self.tp,
            &self.dtype,
            self.family.cli_name(),
            self.n,
            self.k,
            self.tokens,
        )
    }
}

impl std::fmt::Display for TuningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} TP={} {} {} M≈{} N={} K={}",
            self.gpu,
            self.tp,
            self.dtype,
            self.family.cli_name(),
            self.tokens,
            self.n,
            self.k
        )
    }
}

/// One measured candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// The schedule timed.
    #[serde(with = "schedule_name")]
    pub schedule: ScheduleKind,
    /// The slowest GPU's median repetition, over every round ([`crate::timing::Timing`]).
    pub median_ms: f64,
    /// Fastest repetition.
    pub min_ms: f64,
    /// Slowest repetition.
    pub max_ms: f64,
    /// Timed repetitions, over every round.
    pub reps: usize,
}

/// Where and when an entry was measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Seconds since the Unix epoch (UTC) when the measurement ended.
    pub unix_seconds: u64,
    /// The commit of distgemm measured.
    pub commit: String,
    /// The host and its GPUs ("node7: 2× NVIDIA H200").
    pub machine: String,
    /// The M measured (the key holds its bucket).
    pub m: usize,
}

/// One measured choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningEntry {
    /// What it is about.
    pub key: TuningKey,
    /// The schedule `Auto` runs for the key.
    #[serde(with = "schedule_name")]
    pub choice: ScheduleKind,
    /// Every candidate's times.
    pub candidates: Vec<Candidate>,
    /// Where and when.
    pub provenance: Provenance,
}

impl TuningEntry {
    /// The entry of a measurement: `choice` is the candidate with the smallest median (on a
    /// tie the single-stage schedule, as the rule's). `None` without candidates.
    #[must_use]
    pub fn from_measurements(
        key: TuningKey,
        candidates: Vec<Candidate>,
        provenance: Provenance,
    ) -> Option<TuningEntry> {
        let best = candidates
            .iter()
            .min_by(|a, b| {
                a.median_ms
                    .total_cmp(&b.median_ms)
                    .then(a.schedule.is_pipelined().cmp(&b.schedule.is_pipelined()))
            })?
            .schedule;
        Some(TuningEntry {
            key,
            choice: best,
            candidates,
            provenance,
        })
    }

    /// The measured median of `schedule`, if it was a candidate.
    #[must_use]
    pub fn median_ms(&self, schedule: ScheduleKind) -> Option<f64> {
        self.candidates
            .iter()
            .find(|c| c.schedule == schedule)
            .map(|c| c.median_ms)
    }

    /// Why the entry breaks a rule of the format, if it does.
    fn invalid(&self) -> Option<String> {
        let key = &self.key;
        if key.family != key.family.pipelined() {
            return Some(format!(
                "family {} is not a family's pipelined schedule (use {})",
                key.family.cli_name(),
                key.family.pipelined().cli_name()
            ));
        }
        if !(1..=MAX_TP).contains(&key.tp) {
            return Some(format!("tp {} is outside 1..={MAX_TP}", key.tp));
        }
        if !key.tokens.is_power_of_two() {
            return Some(format!("tokens {} is not a power of two", key.tokens));
        }
        if key.n == 0 || key.k == 0 {
            return Some("n and k must be positive".into());
        }
        if !all_problem_kinds().contains(&key.dtype) {
            return Some(format!(
                "unknown dtype {:?} (one of {})",
                key.dtype,
                all_problem_kinds().join(", ")
            ));
        }
        if self.candidates.is_empty() {
            return Some("no candidates".into());
        }
        for (i, c) in self.candidates.iter().enumerate() {
            let s = c.schedule.cli_name();
            if c.schedule.pipelined() != key.family {
                return Some(format!(
                    "candidate {s} is not of family {}",
                    key.family.cli_name()
                ));
            }
            if self.candidates[..i]
                .iter()
                .any(|d| d.schedule == c.schedule)
            {
                return Some(format!("candidate {s} is listed twice"));
            }
            let times = [c.min_ms, c.median_ms, c.max_ms];
            if times.iter().any(|t| !t.is_finite() || *t <= 0.0) {
                return Some(format!(
                    "candidate {s}: times must be positive and finite, got min {} median {} max {}",
                    c.min_ms, c.median_ms, c.max_ms
                ));
            }
            if !(c.min_ms <= c.median_ms && c.median_ms <= c.max_ms) {
                return Some(format!(
                    "candidate {s}: min {} ≤ median {} ≤ max {} does not hold",
                    c.min_ms, c.median_ms, c.max_ms
                ));
            }
            if c.reps == 0 {
                return Some(format!("candidate {s}: 0 repetitions"));
            }
        }
        if self.median_ms(self.choice).is_none() {
            return Some(format!(
                "choice {} is not among the candidates",
                self.choice.cli_name()
            ));
        }
        None
    }
}

/// The entry `Auto` uses for a problem, and how it matched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TableMatch<'t> {
    /// The entry.
    pub entry: &'t TuningEntry,
    /// Whether its token bucket is the problem's (else it is a neighbouring one, a factor of
    /// 2 away).
    pub exact: bool,
}

impl TuningTable {
    /// Parses and validates the JSON text of a table; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<TuningTable, TuningError> {
        let malformed = |e: serde_json::Error| TuningError::Malformed {
            origin: origin.to_owned(),
            reason: e.to_string(),
        };
        // The version first, so that a table of another version says so rather than failing
        // on a field this version does not know.
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let Versioned { version } = serde_json::from_str(text).map_err(malformed)?;
        if version != TABLE_VERSION {
            return Err(TuningError::Version {
                origin: origin.to_owned(),
                found: version,
            });
        }
        let table: TuningTable = serde_json::from_str(text).map_err(malformed)?;
        table.validate(origin)?;
        Ok(table)
    }

    /// Checks every entry and that no key appears twice.
    pub fn validate(&self, origin: &str) -> Result<(), TuningError> {
        let invalid = |index, reason| TuningError::InvalidEntry {
            origin: origin.to_owned(),
            index,
            reason,
        };
        if self.version != TABLE_VERSION {
            return Err(TuningError::Version {
                origin: origin.to_owned(),
                found: self.version,
            });
        }
        let mut seen = std::collections::HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(reason) = e.invalid() {
                return Err(invalid(i, reason));
            }
            if let Some(first) = seen.insert(&e.key, i) {
                return Err(invalid(i, format!("same key as entry {first} ({})", e.key)));
            }
        }
        Ok(())
    }

    /// Adds `entry`, replacing the entry of the same key (returned); keeps the entries sorted
    /// by key, so a table written after merging is the same whatever the order of the runs.
    pub fn insert(&mut self, entry: TuningEntry) -> Option<TuningEntry> {
        let replaced = match self.entries.iter().position(|e| e.key == entry.key) {
            Some(i) => Some(std::mem::replace(&mut self.entries[i], entry)),
            None => {
                self.entries.push(entry);
                None
            }
        };
        self.entries
            .sort_by(|a, b| a.key.sort_key().cmp(&b.key.sort_key()));
        replaced
    }

    /// The entry for `problem` in `family` at `tp` on a `gpu`: the one of its token bucket,
    /// else the one of a neighbouring token bucket (half or twice it; with both, the smaller)
    /// of the same GPU, TP, problem kind, family, N and K, else none: a measurement further
    /// than one octave away in M is no evidence for this problem, so the rule decides.
    #[must_use]
    pub fn lookup(
        &self,
        gpu: &str,
        tp: usize,
        family: ScheduleKind,
        problem: &Problem,
    ) -> Option<TableMatch<'_>> {
        let key = TuningKey::of(gpu, tp, family, problem);
        let log2 = |t: usize| t.max(1).ilog2();
        self.entries
            .iter()
            .filter(|e| e.key.same_shape_family(&key))
            .filter(|e| log2(e.key.tokens).abs_diff(log2(key.tokens)) <= MAX_BUCKET_OCTAVES)
            .min_by_key(|e| (log2(e.key.tokens).abs_diff(log2(key.tokens)), e.key.tokens))
            .map(|entry| TableMatch {
                entry,
                exact: entry.key.tokens == key.tokens,
            })
    }
}

/// A table read from a file, with what identifies it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedTable {
    /// The table.
    pub table: TuningTable,
    /// The file it was read from.
    pub path: PathBuf,
    /// FNV-1a hash of the file's bytes: two ranks whose tables differ at the same path are
    /// told apart.
    pub digest: u64,
}

impl LoadedTable {
    /// Reads and validates the table at `path`: a regular file of at most
    /// [`MAX_TABLE_BYTES`] (the read is bounded too, so a file that grows after the check
    /// cannot make it unbounded).
    ///
    /// The file that is read is the one checked: the checks are made on the opened file's
    /// metadata, not on the path again. The path is checked once before opening as well, so
    /// that a FIFO (whose opening blocks until a writer comes) is refused without opening it;
    /// only a file swapped for a FIFO between that check and the opening could still block
    /// (opening without blocking needs `O_NONBLOCK`, which would take a `libc` dependency).
    pub fn load(path: &Path) -> Result<LoadedTable, TuningError> {
        let unreadable = |source| TuningError::Unreadable {
            path: path.to_owned(),
            source,
        };
        let not_a_file = || TuningError::NotAFile {
            path: path.to_owned(),
        };
        if !std::fs::metadata(path).map_err(unreadable)?.is_file() {
            return Err(not_a_file());
        }
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() {
            return Err(not_a_file());
        }
        let too_large = |bytes| TuningError::TooLarge {
            path: path.to_owned(),
            bytes,
        };
        if meta.len() > MAX_TABLE_BYTES {
            return Err(too_large(meta.len()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_TABLE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > MAX_TABLE_BYTES {
            return Err(too_large(bytes.len() as u64));
        }
        let origin = path.display().to_string();
        let text = std::str::from_utf8(&bytes).map_err(|e| TuningError::Malformed {
            origin: origin.clone(),
            reason: format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.valid_up_to()
            ),
        })?;
        Ok(LoadedTable {
            table: TuningTable::from_json(text, &origin)?,
            path: path.to_owned(),
            digest: fnv1a(&bytes),
        })
    }

    /// The table [`TUNING_ENV_VAR`] names, or `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<LoadedTable>, TuningError> {
        match std::env::var_os(TUNING_ENV_VAR).filter(|v| !v.is_empty()) {
            Some(path) => LoadedTable::load(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// `path#digest`: names the file and its contents.
    #[must_use]
    pub fn identity(&self) -> String {
        format!("{}#{:016x}", self.path.display(), self.digest)
    }
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The token bucket of `m`: the power of two nearest to `m` by ratio (`m` ≥ 2^(j+½) rounds
/// up to 2^(j+1)); 1 for `m` ≤ 1.
#[must_use]
pub fn token_bucket(m: usize) -> usize {
    if m <= 1 {
        return 1;
    }
    let Some(up) = m.checked_next_power_of_two() else {
        return 1 << (usize::BITS - 1);
    };
    let down = up / 2;
    // m ≥ down·√2 ⇔ m² ≥ 2·down² (in u128: no overflow).
    if (m as u128) * (m as u128) >= 2 * (down as u128) * (down as u128) {
        up
    } else {
        down
    }
}

/// The problem kind of a table key: the dtype's name for bf16 and f16, and
/// `e4m3-<scales>-<output dtype>` for an FP8 problem.
#[must_use]
pub fn problem_kind(problem: &Problem) -> String {
    match problem.fp8 {
        None => problem.dtype.name().to_owned(),
        Some(fp8) => format!("e4m3-{}-{}", fp8.scales.name(), problem.dtype.name()),
    }
}

/// Every problem kind a table may name.
fn all_problem_kinds() -> Vec<String> {
    let plain = Dtype::ALL.iter().map(|d| d.name().to_owned());
    let fp8 = ScaleMode::ALL.iter().flat_map(|s| {
        Dtype::ALL
            .iter()
            .map(move |d| format!("e4m3-{}-{}", s.name(), d.name()))
    });
    plain.chain(fp8).collect()
}

/// Schedules in a table by their CLI names (`ag-a-single`).
mod schedule_name {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::schedule::ScheduleKind;

    pub(super) fn serialize<S: Serializer>(kind: &ScheduleKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.cli_name())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ScheduleKind, D::Error> {
        let name = String::deserialize(d)?;
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.cli_name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.cli_name()).collect();
                D::Error::custom(format!(
                    "unknown schedule {name:?} (one of {})",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::problem::Preset;
    use crate::schedule::ScheduleKind::{
        AllGatherRotatingA, AllGatherSingleStageA, ReduceScatterSingleStageA, ReduceScatterTilingA,
    };

    fn candidate(schedule: ScheduleKind, median_ms: f64) -> Candidate {
        Candidate {
            schedule,
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
}
