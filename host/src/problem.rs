//! The global GEMM problem `D = alpha·A·Bᵀ + beta·C` and the LLaMA-3 presets.
//!
//! Layout convention (used by every module of this crate, stated once here):
//! - A is M×K, row-major with K contiguous (element `(i, k)` at `i·lda + k`);
//! - B is N×K, row-major with K contiguous (element `(j, k)` at `j·ldb + k`), so the math is
//!   `D = A·Bᵀ` (CUTLASS-3's "TN" convention: both operands K-major);
//! - C and D are M×N, row-major (element `(i, j)` at `i·ldd + j`).
//!
//! A matrix view is therefore always (base offset, rows, cols, leading dimension) with unit
//! stride along columns — exactly what the GPU kernel takes per operand.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::fp8::ScaleMode;

/// Default number of tokens (M) of the presets.
pub const DEFAULT_TOKENS: usize = 16384;

/// A global GEMM problem.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Rows of A, C and D (tokens).
    pub m: usize,
    /// Rows of B, columns of C and D.
    pub n: usize,
    /// The reduction dimension.
    pub k: usize,
    /// Element type of A, B, C and D; with [`Problem::fp8`], of C and D (and the
    /// reduce-scatter partials) only.
    pub dtype: Dtype,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C; 0 means C is not read (and has no buffer).
    pub beta: f32,
    /// A and B in e4m3 with scales (issue 24); absent (and not written to JSON) for a bf16 or
    /// f16 GEMM, so those problems and their plans read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<Fp8>,
}

/// The FP8 form of a problem: A and B are [`crate::fp8::E4m3`] codes (1 byte each) with
/// scales laid out as `scales` says, `D = alpha·(sa ⊙ A)·(sb ⊙ B)ᵀ + beta·C` with C and D in
/// the problem's `dtype` (see [`crate::fp8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fp8 {
    /// Tensor-wise or row-wise scales.
    pub scales: ScaleMode,
}

impl Problem {
    /// `D = A·Bᵀ` in bf16 (alpha = 1, beta = 0).
    #[must_use]
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Problem {
            m,
            n,
            k,
            dtype: Dtype::Bf16,
            alpha: 1.0,
            beta: 0.0,
            fp8: None,
        }
    }

    /// The same problem with A and B in e4m3 and `scales`; `dtype` stays the output type.
    #[must_use]
    pub fn with_fp8(self, scales: ScaleMode) -> Self {
        Problem {
            fp8: Some(Fp8 { scales }),
            ..self
        }
    }

    /// Bytes of one element of A and B: 1 with FP8, else the dtype's 2.
    #[must_use]
    pub fn operand_bytes(&self) -> usize {
        match self.fp8 {
            Some(_) => 1,
            None => self.dtype.size_bytes(),
        }
    }

    /// Bytes of one element of C, D and the reduce-scatter partials (the dtype's).
    #[must_use]
    pub fn output_bytes(&self) -> usize {
        self.dtype.size_bytes()
    }

    /// The same problem with another element type.
    #[must_use]
    pub fn with_dtype(self, dtype: Dtype) -> Self {
        Problem { dtype, ..self }
    }

    /// The same problem with other epilogue scalars.
    #[must_use]
    pub fn with_scalars(self, alpha: f32, beta: f32) -> Self {
        Problem {
            alpha,
            beta,
            ..self
        }
    }

    /// Whether C is read (beta ≠ 0).
    #[must_use]
    pub fn has_c(&self) -> bool {
        self.beta != 0.0
    }

    /// Floating-point operations of the whole GEMM: `2·M·N·K` (as f64: presets overflow nothing,
    /// but products of user input might).
    #[must_use]
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "M={} N={} K={} ", self.m, self.n, self.k)?;
        match self.fp8 {
            Some(fp8) => write!(f, "e4m3 ({} scales) -> {}", fp8.scales.name(), self.dtype)?,
            None => write!(f, "{}", self.dtype)?,
        }
        if self.alpha != 1.0 || self.beta != 0.0 {
            write!(f, " alpha={} beta={}", self.alpha, self.beta)?;
        }
        Ok(())
    }
}

/// The projection GEMMs of LLaMA-3's MLP (N and K fixed; M = tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Preset {
    /// LLaMA-3 70B fused gate+up projection: N = 2·28672, K = 8192.
    Llama3_70bFc1,
    /// LLaMA-3 70B down projection: N = 8192, K = 28672.
    Llama3_70bFc2,
    /// LLaMA-3 405B fused gate+up projection: N = 2·53248, K = 16384.
    Llama3_405bFc1,
    /// LLaMA-3 405B down projection: N = 16384, K = 53248.
    Llama3_405bFc2,
}

impl Preset {
    /// All presets, in CLI order.
    pub const ALL: [Preset; 4] = [
        Preset::Llama3_70bFc1,
        Preset::Llama3_70bFc2,
        Preset::Llama3_405bFc1,
        Preset::Llama3_405bFc2,
    ];

    /// The CLI name, e.g. `llama3-70b-fc1`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Preset::Llama3_70bFc1 => "llama3-70b-fc1",
            Preset::Llama3_70bFc2 => "llama3-70b-fc2",
            Preset::Llama3_405bFc1 => "llama3-405b-fc1",
            Preset::Llama3_405bFc2 => "llama3-405b-fc2",
        }
    }

    /// `(N, K)` of the preset.
    #[must_use]
    pub const fn n_k(self) -> (usize, usize) {
        match self {
            Preset::Llama3_70bFc1 => (57344, 8192),
            Preset::Llama3_70bFc2 => (8192, 28672),
            Preset::Llama3_405bFc1 => (106496, 16384),
            Preset::Llama3_405bFc2 => (16384, 53248),
        }
    }

    /// The problem for `tokens` rows (bf16, alpha = 1, beta = 0).
    #[must_use]
    pub fn problem(self, tokens: usize) -> Problem {
        let (n, k) = self.n_k();
        Problem::new(tokens, n, k)
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_match_the_model_shapes() {
        assert_eq!(Preset::Llama3_70bFc1.problem(DEFAULT_TOKENS).n, 2 * 28672);
        let p = Preset::Llama3_405bFc2.problem(128);
        assert_eq!((p.m, p.n, p.k), (128, 16384, 53248));
        assert_eq!(Preset::Llama3_405bFc1.name(), "llama3-405b-fc1");
    }

    /// An FP8 problem shows its operand type, scales and output type, and writes `fp8` to JSON;
    /// a bf16 problem's JSON has no `fp8` key and reads back unchanged.
    #[test]
    fn fp8_is_shown_and_absent_from_plain_json() -> Result<(), serde_json::Error> {
        let plain = Problem::new(64, 32, 16);
        let json = serde_json::to_string(&plain)?;
        assert!(!json.contains("fp8"), "{json}");
        assert_eq!(serde_json::from_str::<Problem>(&json)?, plain);
        assert_eq!((plain.operand_bytes(), plain.output_bytes()), (2, 2));
        let fp8 = plain.with_dtype(Dtype::F16).with_fp8(ScaleMode::Rowwise);
        assert_eq!(fp8.to_string(), "M=64 N=32 K=16 e4m3 (row scales) -> f16");
        assert_eq!(plain.to_string(), "M=64 N=32 K=16 bf16");
        assert_eq!((fp8.operand_bytes(), fp8.output_bytes()), (1, 2));
        let json = serde_json::to_string(&fp8)?;
        assert!(json.contains(r#""fp8":{"scales":"row"}"#), "{json}");
        assert_eq!(serde_json::from_str::<Problem>(&json)?, fp8);
        Ok(())
    }

    #[test]
    fn flops_is_two_mnk() {
        assert_eq!(Problem::new(2, 3, 8).flops(), 96.0);
    }
}
