//! `can_implement`: which (schedule, problem, TP) triples a plan exists for.
//!
//! Constraints, in the order they are checked:
//! 1. `1 ≤ TP ≤ 8`;
//! 2. 0 < M, N, K < 2^31 (the GEMM kernel's 32-bit index arithmetic), and every global matrix
//!    has at most 2^40 elements (so no index overflows);
//! 3. TP divides the dimensions the schedule splits: M and N for all-gather, M (TilingA) or
//!    N (TilingB) and K for reduce-scatter;
//! 4. K is a multiple of 8 (16 for FP8's 1-byte operands): every row of A and B is 16-byte
//!    aligned;
//! 5. every view's element offset and leading dimension is 16-byte aligned: a multiple of 8
//!    elements of a 2-byte type, 16 of e4m3 (A, B and the all-gathered slots of an FP8
//!    problem; C, D and partials keep the output type). Per schedule that is one or two
//!    quantities (see [`alignment_quantities`]);
//! 6. reduce-scatter schedules need beta = 0: C's place in the epilogue carries the partials.

use thiserror::Error;

use super::{Collective, MAX_TP, ScheduleKind};
use crate::problem::Problem;

/// The alignment TMA and the vectorised copies need, in bytes.
pub(crate) const ALIGN_BYTES: usize = 16;

/// Elements of `element_bytes` bytes per [`ALIGN_BYTES`]: 8 for bf16/f16, 16 for e4m3.
#[must_use]
pub(crate) const fn align_elements(element_bytes: usize) -> usize {
    ALIGN_BYTES / element_bytes
}

/// Largest number of elements of one global matrix (2^40: indices stay far from overflow).
pub(crate) const MAX_ELEMENTS: usize = 1 << 40;

/// Every dimension must be below this (2^31): the GEMM kernel indexes rows and columns with
/// 32-bit arithmetic (`crate::gemm::check` enforces the same bound per launch). Refusing here
/// means a too-long dimension is bad input before any plan, input or upload exists.
pub const MAX_DIMENSION: usize = 1 << 31;

/// Why a (schedule, problem, TP) triple has no plan.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ScheduleError {
    /// TP outside `1..=8`.
    #[error("TP={tp} is out of range: TP must be between 1 and {max}")]
    TpOutOfRange {
        /// The requested TP.
        tp: usize,
        /// The largest supported TP.
        max: usize,
    },
    /// A zero dimension.
    #[error("{dim}=0: every dimension must be at least 1")]
    ZeroDimension {
        /// "M", "N" or "K".
        dim: &'static str,
    },
    /// A dimension the GEMM kernel's 32-bit indices cannot reach.
    #[error("{dim}={value} is too large: every dimension must be below 2^31")]
    DimensionTooLarge {
        /// "M", "N" or "K".
        dim: &'static str,
        /// Its value.
        value: usize,
    },
    /// A global matrix too large to index.
    #[error("{matrix} has {rows}×{cols} elements, more than the supported 2^40")]
    TooLarge {
        /// "A", "B" or "C/D".
        matrix: &'static str,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
    },
    /// TP does not divide a dimension the schedule splits.
    #[error("{dim}={value} is not divisible by TP={tp} for {schedule}")]
    NotDivisible {
        /// "M", "N" or "K".
        dim: &'static str,
        /// Its value.
        value: usize,
        /// The TP.
        tp: usize,
        /// The schedule.
        schedule: ScheduleKind,
    },
    /// K is not a multiple of 8 (16 for FP8).
    #[error("K={k} is not a multiple of {multiple}: rows of A and B must be 16-byte aligned")]
    KNotAligned {
        /// The K.
        k: usize,
        /// Elements of A and B per 16 bytes (8, or 16 for FP8).
        multiple: usize,
    },
    /// A quantity that becomes a view offset or leading dimension is not 16-byte aligned.
    #[error(
        "{quantity}={value} is not a multiple of {multiple} for {schedule}: it is a view offset or \
         leading dimension, which must be 16-byte aligned"
    )]
    Misaligned {
        /// E.g. "N/TP".
        quantity: &'static str,
        /// Its value.
        value: usize,
        /// Elements of its buffer's type per 16 bytes.
        multiple: usize,
        /// The schedule.
        schedule: ScheduleKind,
    },
    /// beta ≠ 0 with a reduce-scatter schedule.
    #[error(
        "beta={beta} is not supported by {schedule}: reduce-scatter uses C for the partial sums, \
         so beta must be 0"
    )]
    BetaUnsupported {
        /// The beta.
        beta: f32,
        /// The schedule.
        schedule: ScheduleKind,
    },
}

/// The dimensions TP must divide, as (name, value).
fn split_dimensions(kind: ScheduleKind, p: &Problem) -> [(&'static str, usize); 2] {
    match (kind.collective(), kind.tiles_rows()) {
        (Collective::AllGather, _) => [("M", p.m), ("N", p.n)],
        (Collective::ReduceScatter, true) => [("M", p.m), ("K", p.k)],
        (Collective::ReduceScatter, false) => [("N", p.n), ("K", p.k)],
    }
}

/// The quantities that appear as view offsets or leading dimensions beyond K (checked first),
/// as (name, value, whether it indexes A or B rather than C, D or partials); `tp` divides the
/// split dimensions when this is called.
///
/// - ag-a, ag-a-single: D is M×(N/P) with column-block leading dimension N/P;
/// - ag-b: D column blocks start at p·N/P; ag-b-single: D (M/P×N) has leading dimension N;
/// - rs-a, rs-a-single: A is M×(K/P) (leading dimension K/P); partials and D have ld N;
/// - rs-b, rs-b-single: A and B have ld K/P; D blocks have ld N/P (and start at d·N/P).
fn alignment_quantities(
    kind: ScheduleKind,
    p: &Problem,
    tp: usize,
) -> Vec<(&'static str, usize, bool)> {
    match kind {
        ScheduleKind::AllGatherRotatingA
        | ScheduleKind::AllGatherRotatingB
        | ScheduleKind::AllGatherSingleStageA => vec![("N/TP", p.n / tp, false)],
        ScheduleKind::AllGatherSingleStageB => vec![("N", p.n, false)],
        ScheduleKind::ReduceScatterTilingA | ScheduleKind::ReduceScatterSingleStageA => {
            vec![("K/TP", p.k / tp, true), ("N", p.n, false)]
        }
        ScheduleKind::ReduceScatterTilingB | ScheduleKind::ReduceScatterSingleStageB => {
            vec![("K/TP", p.k / tp, true), ("N/TP", p.n / tp, false)]
        }
    }
}

/// Checks that `kind` can run `problem` on `tp` devices; the error names the first violated
/// constraint (see the module documentation for the list).
pub fn can_implement(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
) -> Result<(), ScheduleError> {
    if tp == 0 || tp > MAX_TP {
        return Err(ScheduleError::TpOutOfRange { tp, max: MAX_TP });
    }
    for (dim, value) in [("M", problem.m), ("N", problem.n), ("K", problem.k)] {
        if value == 0 {
            return Err(ScheduleError::ZeroDimension { dim });
        }
        if value >= MAX_DIMENSION {
            return Err(ScheduleError::DimensionTooLarge { dim, value });
        }
    }
    for (matrix, rows, cols) in [
        ("A", problem.m, problem.k),
        ("B", problem.n, problem.k),
        ("C/D", problem.m, problem.n),
    ] {
        if rows.checked_mul(cols).is_none_or(|e| e > MAX_ELEMENTS) {
            return Err(ScheduleError::TooLarge { matrix, rows, cols });
        }
    }
    for (dim, value) in split_dimensions(kind, problem) {
        if !value.is_multiple_of(tp) {
            return Err(ScheduleError::NotDivisible {
                dim,
                value,
                tp,
                schedule: kind,
            });
        }
    }
    let operand = align_elements(problem.operand_bytes());
    if !problem.k.is_multiple_of(operand) {
        return Err(ScheduleError::KNotAligned {
            k: problem.k,
            multiple: operand,
        });
    }
    for (quantity, value, of_operand) in alignment_quantities(kind, problem, tp) {
        let multiple = if of_operand {
            operand
        } else {
            align_elements(problem.output_bytes())
        };
        if !value.is_multiple_of(multiple) {
            return Err(ScheduleError::Misaligned {
                quantity,
                value,
                multiple,
                schedule: kind,
            });
        }
    }
    if kind.collective() == Collective::ReduceScatter && problem.has_c() {
        return Err(ScheduleError::BetaUnsupported {
            beta: problem.beta,
            schedule: kind,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_dimension_tp_and_schedule() {
        let err = can_implement(
            ScheduleKind::AllGatherRotatingA,
            &Problem::new(1001, 64, 64),
            8,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "M=1001 is not divisible by TP=8 for AllGather1D_TilingCD_RotatingA"
        );
    }

    #[test]
    fn reduce_scatter_splits_k() {
        let p = Problem::new(48, 64, 24);
        assert!(matches!(
            can_implement(ScheduleKind::ReduceScatterTilingA, &p, 2),
            Err(ScheduleError::Misaligned {
                quantity: "K/TP",
                value: 12,
                ..
            })
        ));
        assert!(can_implement(ScheduleKind::ReduceScatterTilingA, &p, 3).is_ok());
    }

    /// FP8 operands are 1 byte: K and K/TP need multiples of 16, while N's quantities (C and
    /// D columns) keep the output type's 8.
    #[test]
    fn fp8_operands_need_sixteen_element_rows() {
        use crate::fp8::ScaleMode;
        let fp8 = |m, n, k| Problem::new(m, n, k).with_fp8(ScaleMode::Tensorwise);
        let err = can_implement(ScheduleKind::AllGatherRotatingA, &fp8(64, 64, 40), 2);
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("K=40 is not a multiple of 16: rows of A and B must be 16-byte aligned".into())
        );
        assert!(
            can_implement(
                ScheduleKind::AllGatherRotatingA,
                &Problem::new(64, 64, 40),
                2
            )
            .is_ok()
        );
        // K/TP = 24 is fine for bf16, not for e4m3.
        assert!(
            can_implement(
                ScheduleKind::ReduceScatterTilingB,
                &Problem::new(64, 32, 48),
                2
            )
            .is_ok()
        );
        assert!(matches!(
            can_implement(ScheduleKind::ReduceScatterTilingB, &fp8(64, 32, 48), 2),
            Err(ScheduleError::Misaligned {
                quantity: "K/TP",
                value: 24,
                multiple: 16,
                ..
            })
        ));
        // N/TP = 8 (output columns) is aligned for both.
        assert!(can_implement(ScheduleKind::AllGatherRotatingA, &fp8(64, 16, 32), 2).is_ok());
        assert!(can_implement(ScheduleKind::ReduceScatterTilingB, &fp8(64, 16, 64), 2).is_ok());
    }
}
