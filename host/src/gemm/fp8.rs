//! FP8 GEMMs on the stage kernel: A and B in e4m3, C and D in bf16.
//!
//! The kernel's e4m3 entry points run the 16-bit kernel's pipeline unchanged: a 128-byte
//! swizzled shared-memory row holds 64 bf16 or 128 e4m3 elements, and a `wgmma` `k32` step
//! over e4m3 reads the same 32 bytes per row as a `k16` step over bf16. So the host describes
//! A and B to TMA (and to the kernel's K) as matrices of 16-bit *pairs* of e4m3 elements —
//! K/2 columns, leading dimension ld/2 — and every box, swizzle and byte offset is the one
//! the bf16 kernel uses. TMA's zero fill past the edge is a pair of e4m3 zeros.
//!
//! Scales ([`Fp8Scales`]): tensor-wise, `D = alpha · sa · sb · (A·Bᵀ) + beta · C` with one f32
//! per operand, `alpha · sa · sb` folded into the kernel's alpha on the host; or row-wise, one
//! f32 per row of A and per row of B in device memory, which the e4m3 entry points' epilogue
//! multiplies in (`sa[i] · sb[j]` per element). Either way a few more f32 roundings than a
//! 16-bit GEMM, which [`crate::reference::ErrorBound::scaled`] counts.

use super::{GemmArgs, GemmError, MatrixView};
use crate::dtype::Dtype;
use crate::fp8::{ScaleMode, Scales};
use kernels_gpu::gemm_abi::RowScales;

/// The scales of an FP8 GEMM's operands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fp8Scales {
    /// One f32 per operand (finite, at least 2^-63: [`Scales::validate`]'s rule).
    Tensorwise { a: f32, b: f32 },
    /// Device addresses (this GPU, 4-byte aligned) of M f32 for the rows of A and N f32 for
    /// the rows of B, read by the kernel: their values are the caller's to keep in
    /// [`Scales::validate`]'s range (the host cannot check them without a copy).
    Rowwise { a: u64, b: u64 },
}

impl Fp8Scales {
    /// Which scale mode these are.
    #[must_use]
    pub fn mode(&self) -> ScaleMode {
        match self {
            Fp8Scales::Tensorwise { .. } => ScaleMode::Tensorwise,
            Fp8Scales::Rowwise { .. } => ScaleMode::Rowwise,
        }
    }
}

/// One FP8 GEMM `D = alpha · (sa ⊙ A) · (sb ⊙ B)ᵀ + beta · C`: A is M×K and B is N×K in e4m3
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
    /// The operands' scales.
    pub scales: Fp8Scales,
}

impl Fp8GemmArgs {
    /// The 16-bit GEMM the kernel runs — A and B as pairs of e4m3 (K/2 columns, ld/2), C and
    /// D as given (bf16), tensor-wise scales folded into alpha — and the row-wise scales for
    /// the kernel's epilogue (none for tensor-wise). Checks what the pair view needs, with
    /// messages in e4m3 elements: K and the leading dimensions of A and B multiples of 16
    /// (16-byte rows), valid tensor-wise scales, non-null 4-byte-aligned row-wise scale
    /// addresses; the rest is [`super::check()`]'s.
    pub fn as_pairs(&self) -> Result<(GemmArgs, RowScales), GemmError> {
        let (m, n) = (self.a.rows, self.b.rows);
        let (alpha, row_scales) = match self.scales {
            Fp8Scales::Tensorwise { a, b } => {
                Scales::Tensorwise { a, b }
                    .validate(m as usize, n as usize)
                    .map_err(|e| GemmError::Shape(e.to_string()))?;
                (self.alpha * a * b, RowScales::default())
            }
            Fp8Scales::Rowwise { a, b } => {
                for (operand, ptr) in [("row-wise scales of A", a), ("row-wise scales of B", b)] {
                    if ptr == 0 || !ptr.is_multiple_of(4) {
                        return Err(GemmError::Alignment {
                            operand,
                            rule: format!("address {ptr:#x} must be non-null and 4-byte aligned"),
                        });
                    }
                }
                (self.alpha, RowScales { a, b })
            }
        };
        let k = self.a.cols;
        if !k.is_multiple_of(16) {
            return Err(GemmError::Range {
                name: "K",
                value: k,
                rule: "must be a multiple of 16 for e4m3 (16-byte rows)",
            });
        }
        if self.b.cols != k {
            return Err(GemmError::Shape(format!(
                "A is {m}x{k} but B is {}x{} (B must be N x K)",
                self.b.rows, self.b.cols
            )));
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
        let args = GemmArgs {
            dtype: Dtype::Bf16,
            a: pairs(&self.a),
            b: pairs(&self.b),
            c: self.c,
            d: self.d,
            alpha,
            beta: self.beta,
        };
        Ok((args, row_scales))
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
            scales: Fp8Scales::Tensorwise { a: 0.5, b: 0.25 },
        }
    }

    #[test]
    fn operands_become_pairs_and_the_scales_fold_into_alpha() {
        let (p, rows) = args(7, 256, 1024).as_pairs().expect("valid");
        assert_eq!(rows, RowScales::default());
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
    fn bad_scales_are_refused_and_row_wise_ones_go_to_the_epilogue() {
        let mut a = args(8, 256, 1024);
        a.scales = Fp8Scales::Tensorwise { a: 0.0, b: 1.0 };
        assert!(a.as_pairs().is_err());
        a.scales = Fp8Scales::Tensorwise {
            a: f32::NAN,
            b: 1.0,
        };
        assert!(a.as_pairs().is_err());
        a.scales = Fp8Scales::Rowwise { a: 0, b: 0x100 };
        let e = a.as_pairs().unwrap_err();
        assert!(e.to_string().contains("row-wise scales of A"), "{e}");
        a.scales = Fp8Scales::Rowwise { a: 0x100, b: 0x102 };
        let e = a.as_pairs().unwrap_err();
        assert!(e.to_string().contains("row-wise scales of B"), "{e}");
        a.scales = Fp8Scales::Rowwise { a: 0x100, b: 0x200 };
        let (p, rows) = a.as_pairs().expect("valid");
        assert_eq!(rows, RowScales { a: 0x100, b: 0x200 });
        assert_eq!(p.alpha, 2.0, "row-wise scales stay out of alpha");
    }
}
