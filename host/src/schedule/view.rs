//! The vocabulary of a schedule: buffers, matrix views, flat regions, flags and epilogues.
//!
//! Every device owns five buffers, each a packed row-major matrix (or slot array) of elements:
//! its shards of A, B and C (inputs, never written during a run), its shard of D (the output),
//! and its workspace (stage slices of the rotating operand, or partial sums). A [`View`] is a
//! strided sub-block of one of them — base element offset, rows, cols, leading dimension — the
//! exact argument set of the GPU kernel per operand.

use serde::{Deserialize, Serialize};

/// One of a device's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferKind {
    /// The device's shard of A (input).
    A,
    /// The device's shard of B (input).
    B,
    /// The device's shard of C (input; exists only when beta ≠ 0).
    C,
    /// The device's shard of D (the user-visible output).
    D,
    /// The device's workspace: stage slots, see [`WorkspaceLayout`].
    Workspace,
}

impl BufferKind {
    /// Short lowercase name for tables and graphs.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            BufferKind::A => "A",
            BufferKind::B => "B",
            BufferKind::C => "C",
            BufferKind::D => "D",
            BufferKind::Workspace => "ws",
        }
    }
}

/// A row-major sub-matrix of one device's buffer: element `(r, c)` is at
/// `offset + r·ld + c` of buffer `buffer` on device `device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct View {
    /// The device that owns the buffer (a peer's for remote reads).
    pub device: usize,
    /// Which buffer of that device.
    pub buffer: BufferKind,
    /// Element offset of `(0, 0)`.
    pub offset: usize,
    /// Number of rows.
    pub rows: usize,
    /// Number of contiguous columns.
    pub cols: usize,
    /// Leading dimension: elements from one row to the next (≥ cols).
    pub ld: usize,
}

impl View {
    /// One past the last element the view touches (`offset` for an empty view). Saturates at
    /// `usize::MAX`, which no buffer reaches, so `end() > len` stays a correct bounds check
    /// for a view read from an edited plan whose numbers would overflow.
    #[must_use]
    pub fn end(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            self.offset
        } else {
            (self.rows - 1)
                .checked_mul(self.ld)
                .and_then(|last_row| last_row.checked_add(self.cols))
                .and_then(|span| span.checked_add(self.offset))
                .unwrap_or(usize::MAX)
        }
    }

    /// Number of elements in the view (saturating, like [`View::end`]).
    #[must_use]
    pub fn elements(&self) -> usize {
        self.rows.saturating_mul(self.cols)
    }
}

/// A contiguous run of elements of one device's buffer (what a peer copy moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    /// The device that owns the buffer.
    pub device: usize,
    /// Which buffer.
    pub buffer: BufferKind,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Region {
    /// One past the last element (saturating at `usize::MAX`, as [`View::end`]).
    #[must_use]
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.len)
    }
}

/// Stage flag `index` in the exclusive workspace of `device` (a u32; non-zero = set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlagRef {
    /// The device whose exclusive workspace holds the flag.
    pub device: usize,
    /// The flag index, `0..P`.
    pub index: usize,
}

/// The (m, n, k) of one GEMM launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmShape {
    /// Rows of A and D.
    pub m: usize,
    /// Rows of B, columns of D.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
}

impl GemmShape {
    /// `2·m·n·k`.
    #[must_use]
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Where the epilogue's C comes from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "view", rename_all = "lowercase")]
pub enum CSource {
    /// No C: `D = alpha·acc` (beta is 0 and C is never loaded).
    None,
    /// The device's own C (user C of an all-gather schedule).
    Local(View),
    /// A peer's buffer, read remotely (the left neighbour's partial sum in reduce-scatter).
    Peer(View),
}

impl CSource {
    /// The view C is read from, if any.
    #[must_use]
    pub fn view(&self) -> Option<&View> {
        match self {
            CSource::None => None,
            CSource::Local(v) | CSource::Peer(v) => Some(v),
        }
    }
}

/// The linear-combination epilogue `D = alpha·acc + beta·C`, computed in f32 and rounded once
/// to the element type at the store.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Epilogue {
    /// Scale of the accumulator.
    pub alpha: f32,
    /// Scale of C (0 exactly when `source` is [`CSource::None`]).
    pub beta: f32,
    /// Where C is read from.
    pub source: CSource,
}

/// A rectangular block of a global matrix: rows `row0..row0+rows`, cols `col0..col0+cols`.
/// A shard holding a block is stored packed (leading dimension = `cols`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Block {
    /// First global row.
    pub row0: usize,
    /// First global column.
    pub col0: usize,
    /// Number of rows.
    pub rows: usize,
    /// Number of columns (= the shard's leading dimension).
    pub cols: usize,
}

impl Block {
    /// Elements of the packed shard (saturating, so an edited plan's block cannot overflow
    /// it; validation then refuses the size).
    #[must_use]
    pub fn elements(&self) -> usize {
        self.rows.saturating_mul(self.cols)
    }

    /// Copies this block out of a row-major global matrix with leading dimension `global_ld`.
    #[must_use]
    pub fn extract<T: Copy>(&self, global: &[T], global_ld: usize) -> Vec<T> {
        let mut shard = Vec::with_capacity(self.elements());
        for r in 0..self.rows {
            let start = (self.row0 + r) * global_ld + self.col0;
            shard.extend_from_slice(&global[start..start + self.cols]);
        }
        shard
    }

    /// Writes a packed shard back into its place in a row-major global matrix.
    pub fn insert<T: Copy>(&self, shard: &[T], global: &mut [T], global_ld: usize) {
        for r in 0..self.rows {
            let start = (self.row0 + r) * global_ld + self.col0;
            global[start..start + self.cols]
                .copy_from_slice(&shard[r * self.cols..(r + 1) * self.cols]);
        }
    }
}

/// Which block of each global matrix a device holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardLayout {
    /// Block of A (M×K).
    pub a: Block,
    /// Block of B (N×K).
    pub b: Block,
    /// Block of C (M×N), when beta ≠ 0 (always tiled like D).
    pub c: Option<Block>,
    /// Block of D (M×N): the device's output.
    pub d: Block,
}

/// A device's workspace: `slots` back-to-back slots of `slot_elements` elements each; slot `j`
/// starts at element `j·slot_elements`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkspaceLayout {
    /// Number of slots (P−1 for the pipelined schedules, P for the single-stage ones, 0 at TP=1
    /// of a pipelined schedule).
    pub slots: usize,
    /// Elements per slot (one stage slice of the rotating operand or of a partial sum).
    pub slot_elements: usize,
}

impl WorkspaceLayout {
    /// Total elements (saturating, as [`Block::elements`]).
    #[must_use]
    pub fn elements(&self) -> usize {
        self.slots.saturating_mul(self.slot_elements)
    }

    /// Element offset of slot `j`.
    #[must_use]
    pub fn slot_offset(&self, j: usize) -> usize {
        j * self.slot_elements
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_extract_insert_roundtrip() {
        let global: Vec<u32> = (0..6 * 5).collect();
        let block = Block {
            row0: 1,
            col0: 2,
            rows: 3,
            cols: 2,
        };
        let shard = block.extract(&global, 5);
        assert_eq!(shard, vec![7, 8, 12, 13, 17, 18]);
        let mut back = vec![0; 30];
        block.insert(&shard, &mut back, 5);
        assert_eq!(back[12], 12);
        assert_eq!(back[11], 0);
    }

    #[test]
    fn view_end_is_one_past_last_element() {
        let v = View {
            device: 0,
            buffer: BufferKind::D,
            offset: 8,
            rows: 2,
            cols: 3,
            ld: 16,
        };
        assert_eq!(v.end(), 8 + 16 + 3);
        assert_eq!(View { rows: 0, ..v }.end(), 8);
    }

    #[test]
    fn view_and_region_ends_saturate_instead_of_wrapping() {
        // offset 8 + (2 − 1)·(2^64 − 8) + 8 wraps to 16 in plain arithmetic: a view that
        // passes a `end() ≤ len` check and reads the wrong rows.
        let v = View {
            device: 0,
            buffer: BufferKind::A,
            offset: 8,
            rows: 2,
            cols: 8,
            ld: usize::MAX - 7,
        };
        assert_eq!(v.end(), usize::MAX);
        let r = Region {
            device: 0,
            buffer: BufferKind::A,
            offset: usize::MAX - 4,
            len: 8,
        };
        assert_eq!(r.end(), usize::MAX);
        let huge = Block {
            row0: 0,
            col0: 0,
            rows: usize::MAX,
            cols: 2,
        };
        assert_eq!(huge.elements(), usize::MAX);
    }
}
