//! The table itself: its entries (key, candidates, choice, provenance), their validation,
//! merging and lookup, the JSON form of each, and the key's token buckets and problem kinds.

use serde::{Deserialize, Serialize};

use super::{MAX_BUCKET_OCTAVES, MAX_TP, TABLE_VERSION, TuningError};
use crate::dtype::Dtype;
use crate::fp8::ScaleMode;
use crate::problem::Problem;
use crate::schedule::{RsPartials, ScheduleKind};

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
    /// How its partials moved (a pipelined reduce-scatter's read or push; `read` for every
    /// other schedule, and when absent, in tables written before pushes were tuned).
    #[serde(default)]
    pub rs_partials: RsPartials,
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
    /// How the choice moves partials (`read` when absent).
    #[serde(default)]
    pub rs_partials: RsPartials,
    /// Every candidate's times.
    pub candidates: Vec<Candidate>,
    /// Where and when.
    pub provenance: Provenance,
}

impl TuningEntry {
    /// The entry of a measurement: `choice` and `rs_partials` are the candidate's with the
    /// smallest median (on a tie the single-stage schedule, as the rule's, then partials
    /// read). `None` without candidates.
    #[must_use]
    pub fn from_measurements(
        key: TuningKey,
        candidates: Vec<Candidate>,
        provenance: Provenance,
    ) -> Option<TuningEntry> {
        let best = candidates.iter().min_by(|a, b| {
            a.median_ms
                .total_cmp(&b.median_ms)
                .then(a.schedule.is_pipelined().cmp(&b.schedule.is_pipelined()))
                .then((a.rs_partials == RsPartials::Push).cmp(&(b.rs_partials == RsPartials::Push)))
        })?;
        let (choice, rs_partials) = (best.schedule, best.rs_partials);
        Some(TuningEntry {
            key,
            choice,
            rs_partials,
            candidates,
            provenance,
        })
    }

    /// The measured median of `schedule` with partials `rs_partials`, if it was a candidate.
    #[must_use]
    pub fn median_ms(&self, schedule: ScheduleKind, rs_partials: RsPartials) -> Option<f64> {
        self.candidates
            .iter()
            .find(|c| c.schedule == schedule && c.rs_partials == rs_partials)
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
            let s = format!("{} ({})", c.schedule.cli_name(), c.rs_partials.cli_name());
            if c.rs_partials == RsPartials::Push && !RsPartials::applies_to(c.schedule) {
                return Some(format!(
                    "candidate {s}: only a pipelined reduce-scatter pushes"
                ));
            }
            if c.schedule.pipelined() != key.family {
                return Some(format!(
                    "candidate {s} is not of family {}",
                    key.family.cli_name()
                ));
            }
            if self.candidates[..i]
                .iter()
                .any(|d| d.schedule == c.schedule && d.rs_partials == c.rs_partials)
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
        if self.median_ms(self.choice, self.rs_partials).is_none() {
            return Some(format!(
                "choice {} ({}) is not among the candidates",
                self.choice.cli_name(),
                self.rs_partials.cli_name()
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
pub(super) fn all_problem_kinds() -> Vec<String> {
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
