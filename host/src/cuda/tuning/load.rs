//! Reading a table from a file: bounded, regular files only, identified by path and digest.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::table::TuningTable;
use super::{MAX_TABLE_BYTES, TUNING_ENV_VAR, TuningError};

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
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
