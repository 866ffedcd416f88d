//! FP8 GEMMs on the stage kernel: A and B in e4m3, tensor-wise scales, C and D in bf16.
//!
//! The kernel's e4m3 entry points run the 16-bit kernel's pipeline unchanged: a 128-byte
//! swizzled shared-memory row holds 64 bf16 or 128 e4m3 elements, and a `wgmma` `k32` step
//! over e4m3 reads the same 32 bytes per row as a `k16` step over bf16. So the host describes
//! A and B to TMA (and to the kernel's K) as matrices of 16-bit *pairs* of e4m3 elements —
//! K/2 columns, leading dimension ld/2 — and every box, swizzle and byte offset is the one
//! the bf16 kernel uses. TMA's zero fill past the edge is a pair of e4m3 zeros.
//!
//! Scales: `D = alpha · sa · sb · (A·Bᵀ) + beta · C` with one f32 per operand; `alpha · sa · sb`
//! is folded into the kernel's alpha on the host (one more f32 rounding, which
//! [`crate::reference::ErrorBound::scaled`] counts). Row-wise scales need the row-wise
//! epilogue, which is not built yet: they are refused with that reason.

use super::{GemmArgs, GemmError, MatrixView};
use crate::dtype::Dtype;
use crate::fp8::Scales;

/// One FP8 GEMM `D = alpha · (sa·A) · (sb·B)ᵀ + beta · C`: A is M×K and B is N×K in e4m3
/// (one byte per element, K-contiguous; views in elements), C and D are M×N bf16. `c` may be
/// `None` only when `beta == 0`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8GemmArgs {
    pub a: MatrixView,
    pub b: MatrixView,
    pub c: Option<MatrixView>,
    pub d: MatrixView,
    pub alpha: f32,
    pub beta: f32,
    /// The operands' scales (tensor-wise only, for now).
    pub scales: Scales,
}

impl Fp8GemmArgs {
    /// The 16-bit GEMM the kernel runs: A and B as pairs of e4m3 (K/2 columns, ld/2), alpha
    /// times both scales, C and D as given (bf16). Checks what the pair view needs, with
    /// messages in e4m3 elements: K and the leading dimensions of A and B multiples of 16
    /// (16-byte rows), valid tensor-wise scales; the rest is [`super::check`]'s.
    pub fn as_pairs(&self) -> Result<GemmArgs, GemmError> {
        let (m, n) = (self.a.rows, self.b.rows);
        let (sa, sb) = match &self.scales {
            Scales::Tensorwise { a, b } => (*a, *b),
            Scales::Rowwise { .. } => {
                return Err(GemmError::Shape(
                    "row-wise FP8 scales need the row-wise epilogue, which is not built yet: \
                     use tensor-wise scales"
                        .into(),
                ));
            }
        };
        self.scales
            .validate(m as usize, n as usize)
            .map_err(|e| GemmError::Shape(e.to_string()))?;
        let k = self.a.cols;
        if !k.is_multiple_of(16) {
            return Err(GemmError::Range {
                name: "K",
                value: k,
                rule: "must be a multiple of 16 for e4m3 (16-byte rows)",
            });
        }
        for (operand, view) in [("A", &self.a), ("B", &self.b)] {
            if !view.ld.is_multiple_of(16) {
                return Err(GemmError::Alignment {
                    operand,
                    rule: format!(
                        "leading dimension {} must be a multiple of 16 e4m3 elements (16 bytes)",
                        view.ld
                    ),
                });
            }
        }
        let pairs = |v: &MatrixView| MatrixView {
            ptr: v.ptr,
            rows: v.rows,
            cols: v.cols / 2,
            ld: v.ld / 2,
        };
        let b = pairs(&self.b);
        // B's K must match A's in elements, not only in pairs.
        if self.b.cols != k {
            return Err(GemmError::Shape(format!(
                "A is {m}x{k} but B is {}x{} (B must be N x K)",
                self.b.rows, self.b.cols
            )));
        }
        Ok(GemmArgs {
            dtype: Dtype::Bf16,
            a: pairs(&self.a),
            b,
            c: self.c,
            d: self.d,
            alpha: self.alpha * sa * sb,
            beta: self.beta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(m: u64, n: u64, k: u64) -> Fp8GemmArgs {
        Fp8GemmArgs {
            a: MatrixView::dense(0x1000, m, k),
            b: MatrixView::dense(0x2000_0000, n, k),
            c: None,
            d: MatrixView::dense(0x4000_0000, m, n),
            alpha: 2.0,
            beta: 0.0,
            scales: Scales::Tensorwise { a: 0.5, b: 0.25 },
        }
    }

    #[test]
    fn operands_become_pairs_and_the_scales_fold_into_alpha() {
        let p = args(7, 256, 1024).as_pairs().expect("valid");
        assert_eq!((p.a.cols, p.a.ld, p.b.cols, p.b.ld), (512, 512, 512, 512));
        assert_eq!((p.a.rows, p.b.rows), (7, 256));
        assert_eq!(p.d, MatrixView::dense(0x4000_0000, 7, 256));
        assert_eq!(p.alpha, 0.25);
        assert_eq!(p.dtype, Dtype::Bf16);
        assert!(super::super::check(&p).is_ok());
    }

    #[test]
    fn fp8_rules_are_stated_in_e4m3_elements() {
        let e = args(8, 256, 1000).as_pairs().unwrap_err();
        assert!(e.to_string().contains("multiple of 16 for e4m3"), "{e}");
        let mut a = args(8, 256, 1024);
        a.a.ld = 1032;
        let e = a.as_pairs().unwrap_err();
        assert!(
            e.to_string().contains("multiple of 16 e4m3 elements"),
            "{e}"
        );
        let mut b = args(8, 256, 1024);
        b.b.cols = 1040;
        b.b.ld = 1040;
        let e = b.as_pairs().unwrap_err();
        assert!(e.to_string().contains("B must be N x K"), "{e}");
    }

    #[test]
    fn bad_or_row_wise_scales_are_refused() {
        let mut a = args(8, 256, 1024);
        a.scales = Scales::Tensorwise { a: 0.0, b: 1.0 };
        assert!(a.as_pairs().is_err());
        a.scales = Scales::Tensorwise {
            a: f32::NAN,
            b: 1.0,
        };
        assert!(a.as_pairs().is_err());
        a.scales = Scales::Rowwise {
            a: vec![1.0; 8],
            b: vec![1.0; 256],
        };
        let e = a.as_pairs().unwrap_err();
        assert!(e.to_string().contains("row-wise"), "{e}");
    }
}
