//! Where the rows of a GEMM's operands start against the L2's 32-byte sectors.
//!
//! The kernel loads A and B in TMA boxes of 128-byte rows (64 16-bit elements). A row whose
//! first byte sits 16 bytes past a 32-byte boundary — every other row where the pitch is
//! ≡ 16 mod 32 bytes (K ≡ 8 mod 16 for 2-byte elements), or every row where the base is —
//! straddles five sectors instead of four and two 128-byte lines, and the TMA unit splits it
//! into several L2 requests: at 7000 × 3000 × 5000 (bf16, `128x256`) ncu counted 4.2 times the
//! L2 requests and 1.8 times the sectors of K = 4992 for 1.14 times the bytes delivered, the
//! L2 at 85 % of its peak instead of 51 %, and 1.47 times the run time
//! (`benches/results/ncu-2026-12-04-cc712bf-offsector-7000x3000x5000.md`; kernels-gpu/NOTES.md
//! step 93). The tile rule prices those requests ([`SectorAlignment`]); the tensor maps drop
//! their 256-byte L2 promotion for such rows (`launch::l2_promotion`).
use super::{GemmArgs, MatrixView};

/// Whether every row of A and of B starts on a 32-byte boundary: the input the tile rule
/// takes besides the shape (`choose_variant_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectorAlignment {
    /// Every row of A starts on a 32-byte boundary.
    pub a: bool,
    /// Every row of B starts on a 32-byte boundary.
    pub b: bool,
}

impl SectorAlignment {
    /// Both operands' rows on 32-byte boundaries (every dense operand with K a multiple of 16
    /// and a 32-byte-aligned base).
    pub const ALIGNED: Self = Self { a: true, b: true };

    /// Dense operands of `row_bytes` bytes a row at 32-byte-aligned bases.
    #[cfg(test)]
    pub(super) fn dense(row_bytes: u64) -> Self {
        let on = row_bytes.is_multiple_of(32);
        Self { a: on, b: on }
    }

    /// Where the rows of `args`' A and B start.
    #[must_use]
    pub fn of(args: &GemmArgs) -> Self {
        let bytes = args.dtype.size_bytes() as u64;
        Self {
            a: args.a.rows_on_sectors(bytes),
            b: args.b.rows_on_sectors(bytes),
        }
    }

    /// Whether either operand has rows off 32-byte boundaries.
    #[must_use]
    pub(crate) fn any_off(self) -> bool {
        !(self.a && self.b)
    }

    /// Of `a_rows` rows of A and `b_rows` of B, those that start off 32-byte boundaries
    /// (a whole operand counts where any of its rows does: they alternate).
    #[must_use]
    pub(crate) fn off_sector_rows(self, a_rows: f64, b_rows: f64) -> f64 {
        let count = |aligned: bool, rows: f64| if aligned { 0.0 } else { rows };
        count(self.a, a_rows) + count(self.b, b_rows)
    }
}

impl MatrixView {
    /// Whether every row of this view of `element_bytes`-byte elements starts on a 32-byte
    /// boundary: its base and its pitch both multiples of 32 bytes.
    #[must_use]
    pub(crate) fn rows_on_sectors(&self, element_bytes: u64) -> bool {
        self.ptr.is_multiple_of(32) && (self.ld * element_bytes).is_multiple_of(32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    #[test]
    fn a_pitch_or_a_base_16_bytes_off_puts_an_operand_off_sectors() {
        let args = |a: u64, ld_a: u64, b: u64| {
            let mut args = GemmArgs::dense(Dtype::Bf16, a, b, 0x10_0000, (64, 64, 64));
            args.a.ld = ld_a;
            args
        };
        let aligned = SectorAlignment::ALIGNED;
        assert_eq!(SectorAlignment::of(&args(0x1000, 4992, 0x2000)), aligned);
        assert!(!aligned.any_off());
        // K ≡ 8 mod 16: every other row of A 16 bytes off.
        let a_off = SectorAlignment::of(&args(0x1000, 5000, 0x2000));
        assert_eq!(a_off, SectorAlignment { a: false, b: true });
        assert_eq!(a_off.off_sector_rows(128.0, 256.0), 128.0);
        // A base 16 bytes off.
        let b_off = SectorAlignment::of(&args(0x1000, 64, 0x2010));
        assert_eq!(b_off, SectorAlignment { a: true, b: false });
        assert_eq!(b_off.off_sector_rows(128.0, 256.0), 256.0);
    }
}
