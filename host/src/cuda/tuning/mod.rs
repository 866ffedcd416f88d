//! Tuning tables: measured schedule choices that [`Auto`](super::auto) prefers to its cost
//! model.
//!
//! `distgemm tune` times the schedules of a family (pipelined and single-stage; a pipelined
//! reduce-scatter with its partials read and pushed) on the GPUs in interleaved rounds and
//! records, for one shape bucket, which was faster and every candidate's times. `Auto` then looks the problem up: an entry of the same GPU, TP, problem
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
//!     "choice": "rs-a-single", "rs_partials": "read",
//!     "candidates": [
//!       {"schedule": "rs-a", "rs_partials": "read", "median_ms": 0.194, "min_ms": 0.19, "max_ms": 0.2, "reps": 60},
//!       {"schedule": "rs-a", "rs_partials": "push", "median_ms": 0.201, "min_ms": 0.197, "max_ms": 0.21, "reps": 60},
//!       {"schedule": "rs-a-single", "rs_partials": "read", "median_ms": 0.12, "min_ms": 0.118, "max_ms": 0.13, "reps": 60}
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
//! - `choice` and `rs_partials` are normally the candidate with the smallest median (ties to
//!   the single-stage schedule, as the rule's, then to partials read); an edited table may
//!   name another candidate. `rs_partials` (`read` or `push`, only a pipelined reduce-scatter
//!   pushes) may be absent, meaning `read`: tables written before pushes were tuned load
//!   unchanged. `Auto` runs the entry's mode unless the builder sets one.
//!
//! Loading refuses, with a [`TuningError`] naming the file: anything but a regular file of at
//! most [`MAX_TABLE_BYTES`], malformed JSON or unknown fields, another version, and entries
//! that are invalid (times that are not positive and finite, a choice outside its family or
//! not among the candidates, a token bucket that is not a power of two, TP outside 1..=8, an
//! unknown problem kind) or duplicated.

mod load;
mod table;
#[cfg(test)]
pub(crate) mod tests;

use std::path::PathBuf;

use thiserror::Error;

pub use self::load::LoadedTable;
pub use self::table::{
    Candidate, Provenance, TableMatch, TuningEntry, TuningKey, TuningTable, problem_kind,
    token_bucket,
};

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
