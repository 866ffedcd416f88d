//! FP8 operands (issue 24): the e4m3 element type and the scales of a scaled GEMM.
//!
//! The scaled GEMM is `D = alpha·(sa ⊙ A)·(sb ⊙ B)ᵀ + beta·C`: A (M×K) and B (N×K) hold
//! [`E4m3`] codes, [`Scales`] hold f32 factors (one per operand, or one per row of A and one per
//! row of B, i.e. per output row and per output column), and C and D are bf16 or f16. Every
//! scale is finite and at least [`MIN_SCALE`] = 2^-63 ([`Scales::validate`], which every
//! entry point calls), so every product `sa·sb` is at least 2^-126, a normal f32. The f64
//! reference, the kernel's arithmetic and the error bound are in [`crate::reference`]
//! (`gemm_scaled_f64`, `gemm_scaled_f32`, `ErrorBound::scaled`, `check_scaled`).
//!
//! # The format
//!
//! [`E4m3`] is OCP FP8 E4M3 ("e4m3fn"), which is PTX's `.e4m3` and what Hopper's tensor cores
//! read: bit 7 the sign, bits 6–3 a biased exponent E (bias 7), bits 2–0 a mantissa M.
//! E = 0 is subnormal (`M·2^-9`), E = 1…15 normal (`(1 + M/8)·2^(E−7)`), except that
//! `E = 15, M = 7` (0x7F, 0xFF) is NaN. There are no infinities; the largest finite value is
//! 448 (0x7E), the smallest normal 2^-6, the smallest subnormal 2^-9. Widening to f32 is exact;
//! narrowing ([`E4m3::from_f32`]) rounds to nearest, ties to even, and saturates finite
//! overflow like PTX `cvt.rn.satfinite.e4m3x2.f32`.
//!
//! A nonzero product of two e4m3 values has at most 8 significant bits and a magnitude in
//! `[2^-18, 448²]`, so it is exact in f32; a sum of K of them is a multiple of 2^-18 below
//! `K·448² < 2^35` for K ≤ 171 196, so it is exact in f64 (every preset has K ≤ 53 248).
//!
//! # What runs now (CPU), and what the kernel and the lowering plug into
//!
//! A problem with [`crate::problem::Problem::fp8`] is an FP8 GEMM: A and B e4m3, `dtype` the
//! output type of C, D and the reduce-scatter partials. Every schedule plans it with the
//! bf16 DAG; what changes is the element size per buffer ([`crate::plan::Plan::element_bytes`]:
//! 1 byte for A, B and the all-gather workspace, 2 for C, D and partials), so copy `bytes`,
//! `workspace_bytes`, the 16-byte alignment of every view (16 e4m3 elements, 8 output
//! elements) and `can_implement`'s K and K/TP (multiples of 16) follow from it. Views and
//! copies of e4m3 buffers cover whole rows ([`crate::plan::Plan::operand_row_elements`]), so
//! a row-wise scale is found as `scales[offset / row]` and moves with its row. The CPU
//! executor runs these plans ([`crate::cpu::CpuExecutor::load_fp8_inputs`]): the stage GEMM
//! is [`crate::reference::gemm_scaled_f32`] on the views' rows and their scales, each
//! reduce-scatter hop stores its partial in the output type (P roundings pipelined, 2
//! single-stage, as for bf16: [`crate::reference::ErrorBound::scaled`] with those counts), and
//! `tests/cpu_executor.rs` checks every element at TP 1–8. The CUDA schedules run FP8 on the
//! e4m3 entry points with the operands as 16-bit pairs. Tensor-wise, the lowering folds
//! `sa·sb` into each stage GEMM's alpha. Row-wise, every device holds the *full* scale
//! vectors (M and N f32: `cuda::Fp8RowScales`, or `RankArgs::{a,b}_scales`) and each stage
//! GEMM reads the scales of the global rows it multiplies (`RowScales` at the stage's first
//! global row of A and of B): no scale moves between GPUs, unlike the CPU executor's model,
//! where scales travel with their rows (the results are the same: a row's scale is the same
//! wherever the row is).
//!
//! # How the GPU kernel runs it
//!
//! The e4m3 entry points (`gemm_e4m3_<tile>`, [`crate::gemm::Fp8GemmArgs`]) run the 16-bit
//! kernel's pipeline with `wgmma.m64nNk32.f32.e4m3.e4m3`, which takes both operands K-major —
//! distgemm's `A·Bᵀ` layout. A 32-byte `k32` step reads the bytes of a bf16 `k16` step, so the
//! host describes A and B to TMA as 16-bit pairs (K/2 columns; K and the leading dimensions
//! multiples of 16 elements) and every box, swizzle and descriptor is the bf16 kernel's.
//! The scales enter on the f32 accumulator in the epilogue: tensor-wise folded into alpha,
//! row-wise `sa_i·sb_j` per element. The accumulation is the tensor cores' own, without
//! DeepGEMM's promotion into f32 registers every 128 of K: on an H200 every FP8 test case
//! (K up to 4096) stays within 0.30 of [`crate::reference::ErrorBound::scaled`]
//! (`kernels-gpu/NOTES.md` step 35).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::plan::SizeError;

/// An OCP FP8 E4M3 value (PTX `.e4m3`), stored as its bit pattern `s eeee mmm`.
///
/// See the [module documentation](self) for the encoding. Equality (`==`) compares bit
/// patterns: +0 and −0 differ, and a NaN code equals itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct E4m3(u8);

impl E4m3 {
    /// The largest finite value, 448 = 1.75·2^8.
    pub const MAX: E4m3 = E4m3(0x7E);
    /// The smallest positive normal value, 2^-6.
    pub const MIN_POSITIVE: E4m3 = E4m3(0x08);
    /// The smallest positive subnormal value, 2^-9.
    pub const MIN_POSITIVE_SUBNORMAL: E4m3 = E4m3(0x01);
    /// The NaN that [`E4m3::from_f32`] returns (0x7F; 0xFF is the other NaN code).
    pub const NAN: E4m3 = E4m3(0x7F);

    /// The value with bit pattern `bits`.
    #[must_use]
    pub const fn from_bits(bits: u8) -> Self {
        E4m3(bits)
    }

    /// The bit pattern.
    #[must_use]
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// Whether this is one of the two NaN codes (0x7F, 0xFF).
    #[must_use]
    pub const fn is_nan(self) -> bool {
        self.0 & 0x7F == 0x7F
    }

    /// Widens to f32 (exact): a normal value re-biases its exponent (E − 7 + 127) and shifts
    /// its mantissa into f32's top mantissa bits; a subnormal one is `M·2^-9`; the NaN codes
    /// give a NaN of the same sign.
    #[must_use]
    pub fn to_f32(self) -> f32 {
        let exponent = u32::from((self.0 >> 3) & 0xF);
        let mantissa = self.0 & 0x7;
        let magnitude = if self.is_nan() {
            f32::NAN
        } else if exponent == 0 {
            // M · 2^-9; 2^-9 has the biased f32 exponent 127 − 9.
            f32::from(mantissa) * f32::from_bits((127 - 9) << 23)
        } else {
            f32::from_bits(((exponent + 120) << 23) | (u32::from(mantissa) << 20))
        };
        if self.0 & 0x80 == 0 {
            magnitude
        } else {
            -magnitude
        }
    }

    /// Rounds an f32 to e4m3 as PTX `cvt.rn.satfinite.e4m3x2.f32` does for each of its two
    /// inputs (PTX ISA, "Data Movement and Conversion Instructions: cvt": `.rn` rounds to
    /// nearest, ties to even; `.satfinite`, mandatory for the FP8 destination types, turns a NaN
    /// input into NaN and a result whose magnitude exceeds the largest finite value into that
    /// value with the input's sign):
    ///
    /// - NaN (any sign or payload) → [`E4m3::NAN`] (0x7F). PTX promises a NaN, not which of
    ///   the two codes: a GPU test compares NaN-ness, not the bits;
    /// - `|x| > 448`, ±∞ included → ±448 (rounding any `|x| > 464` would exceed 448, and
    ///   every `448 < |x| ≤ 464` rounds to 448 anyway, 464 being a tie to the even 448);
    /// - otherwise the nearest of the values `n·2^(e−3)`, e = max(⌊log2|x|⌋, −6), ties to even
    ///   `n`: the normal range keeps 4 significant bits, the subnormal range (below 2^-6) has the
    ///   fixed spacing 2^-9, `|x| ≤ 2^-10` (f32 subnormals included) gives a zero, and the sign of
    ///   a zero result is the input's.
    #[must_use]
    pub fn from_f32(x: f32) -> Self {
        if x.is_nan() {
            return E4m3::NAN;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let magnitude = x.abs();
        if magnitude > E4m3::MAX.to_f32() {
            return E4m3(sign | E4m3::MAX.0);
        }
        // e = ⌊log2|x|⌋ from f32's biased exponent (f32 subnormals and 0 give −127), clamped
        // to the subnormal binade's −6; the spacing there is 2^(e−3).
        let e = ((magnitude.to_bits() >> 23) as i32 - 127).max(-6);
        let spacing = f32::from_bits(((e - 3 + 127) as u32) << 23);
        // Exact (a power-of-two scaling), then rounded: n ∈ [0, 16].
        let n = (magnitude / spacing).round_ties_even() as i32;
        // Codes are monotone: n·2^(e−3) with 8 ≤ n ≤ 16 is ((e + 7) << 3) + (n − 8) (n = 16
        // is the next binade's first code), and the subnormal binade (e = −6) gives code n.
        let code = ((e + 7) << 3) + n - 8;
        E4m3(sign | code as u8)
    }
}

/// How [`Scales`] are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScaleMode {
    /// One f32 for all of A and one for all of B (cuBLASLt's and `torch._scaled_mm`'s
    /// per-tensor scaling).
    #[serde(rename = "tensor")]
    Tensorwise,
    /// One f32 per row of A (per output row) and one per row of B (per output column): torch's
    /// row-wise `_scaled_mm`, with scales of shapes `[M, 1]` and `[1, N]`.
    #[serde(rename = "row")]
    Rowwise,
}

impl ScaleMode {
    /// Both modes, in CLI order.
    pub const ALL: [ScaleMode; 2] = [ScaleMode::Tensorwise, ScaleMode::Rowwise];

    /// The name used on the command line and in JSON (`tensor`, `row`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            ScaleMode::Tensorwise => "tensor",
            ScaleMode::Rowwise => "row",
        }
    }
}

/// The smallest scale [`Scales::validate`] accepts, 2^-63: every product `sa·sb` of two
/// accepted scales is then at least 2^-126, the smallest normal f32, so the kernel's
/// `s = sa·sb` is rounded with a relative error (an underflow there would be multiplied by
/// the accumulator and alpha, beyond any absolute term of the error bound).
pub const MIN_SCALE: f32 = f32::from_bits(64 << 23);

/// A scale that [`Scales::validate`] refuses: not finite, not positive, or below
/// [`MIN_SCALE`].
#[derive(Clone, Copy, Debug, PartialEq, Error)]
#[error(
    "{} is {value:e}: FP8 scales must be finite and at least 2^-63 (so that every product \
     sa·sb is a normal f32)",
    match .index {
        Some(i) => format!("the row-wise scale {i} of {}", .operand),
        None => format!("the tensor-wise scale of {}", .operand),
    }
)]
pub struct ScaleValueError {
    /// Whose scale: `"A"` or `"B"`.
    pub operand: &'static str,
    /// The row of a row-wise scale; `None` for a tensor-wise one.
    pub index: Option<usize>,
    /// The refused value.
    pub value: f32,
}

/// `Ok` when `value` is finite and at least [`MIN_SCALE`] (which refuses NaN, zero, negative
/// and subnormal values too).
fn check_scale(operand: &'static str, index: Option<usize>, value: f32) -> Result<(), SizeError> {
    if value.is_finite() && value >= MIN_SCALE {
        Ok(())
    } else {
        Err(ScaleValueError {
            operand,
            index,
            value,
        }
        .into())
    }
}

/// The dequantization factors of a scaled GEMM: element `(i, j)` of the product is
/// `sa_i·sb_j·Σ_k a_ik·b_jk`. Every scale is finite and at least [`MIN_SCALE`] = 2^-63
/// ([`Scales::validate`]), so every `sa_i·sb_j` is a normal f32.
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// `sa_i = a`, `sb_j = b` for every row and column.
    Tensorwise {
        /// The scale of A.
        a: f32,
        /// The scale of B.
        b: f32,
    },
    /// `sa_i = a[i]` (M values), `sb_j = b[j]` (N values).
    Rowwise {
        /// One scale per row of A.
        a: Vec<f32>,
        /// One scale per row of B.
        b: Vec<f32>,
    },
}

impl Scales {
    /// The layout of these scales.
    #[must_use]
    pub fn mode(&self) -> ScaleMode {
        match self {
            Scales::Tensorwise { .. } => ScaleMode::Tensorwise,
            Scales::Rowwise { .. } => ScaleMode::Rowwise,
        }
    }

    /// `Ok` when the scales fit an M×N output (row-wise, A has M scales and B has N) and
    /// every scale is finite and at least [`MIN_SCALE`] = 2^-63, so that every product
    /// `sa_i·sb_j` is at least 2^-126, a normal f32 (the hypothesis of
    /// [`crate::reference::ErrorBound::scaled`]); a refused value is a
    /// [`SizeError::ScaleValue`] naming the operand, the row and the value.
    pub fn validate(&self, m: usize, n: usize) -> Result<(), SizeError> {
        match self {
            Scales::Tensorwise { a, b } => {
                check_scale("A", None, *a)?;
                check_scale("B", None, *b)
            }
            Scales::Rowwise { a, b } => {
                SizeError::check("the row-wise scales of A", a.len(), m)?;
                SizeError::check("the row-wise scales of B", b.len(), n)?;
                for (operand, scales) in [("A", a), ("B", b)] {
                    for (i, &value) in scales.iter().enumerate() {
                        check_scale(operand, Some(i), value)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// `(sa_i, sb_j)`. For a row-wise pair, `i` and `j` must be below the M and N that
    /// [`Scales::validate`] accepted.
    pub(crate) fn pair(&self, i: usize, j: usize) -> (f32, f32) {
        match self {
            Scales::Tensorwise { a, b } => (*a, *b),
            Scales::Rowwise { a, b } => (a[i], b[j]),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The value of `code` straight from the definition, in f64 (NaN for 0x7F and 0xFF).
    fn value_from_definition(code: u8) -> f64 {
        let (sign, exponent, mantissa) = (code >> 7, (code >> 3) & 0xF, code & 0x7);
        let magnitude = match (exponent, mantissa) {
            (15, 7) => return f64::NAN,
            (0, m) => f64::from(m) / 8.0 * 2f64.powi(-6),
            (e, m) => (1.0 + f64::from(m) / 8.0) * 2f64.powi(i32::from(e) - 7),
        };
        if sign == 1 { -magnitude } else { magnitude }
    }

    /// The slow reference of narrowing: NaN → 0x7F, saturation beyond 448, otherwise the
    /// nearest of all 127 non-negative finite codes by exhaustive search (ties to the even
    /// code, i.e. mantissa bit 0 clear), with the input's sign.
    fn nearest_by_search(x: f32) -> u8 {
        if x.is_nan() {
            return 0x7F;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let target = f64::from(x.abs());
        if target > 448.0 {
            return sign | 0x7E;
        }
        let mut best = 0u8;
        for code in 1..=0x7Eu8 {
            let (d, best_d) = (
                (target - value_from_definition(code)).abs(),
                (target - value_from_definition(best)).abs(),
            );
            if d < best_d || (d == best_d && code % 2 == 0) {
                best = code;
            }
        }
        sign | best
    }

    fn narrow(x: f32) -> u8 {
        E4m3::from_f32(x).to_bits()
    }

    #[test]
    fn the_device_widening_of_every_code_is_the_hosts() {
        for bits in 0..=u8::MAX {
            let (host, device) = (
                f64::from(E4m3::from_bits(bits).to_f32()),
                kernels_gpu::widen::e4m3_to_f64(bits),
            );
            let same = (host.is_nan() && device.is_nan()) || host.to_bits() == device.to_bits();
            assert!(same, "{bits:#04x}: host {host}, device {device}");
        }
    }

    #[test]
    fn every_code_widens_to_its_defined_value() {
        for code in 0..=255u8 {
            let got = E4m3::from_bits(code).to_f32();
            let want = value_from_definition(code);
            if want.is_nan() {
                assert!(
                    got.is_nan() && E4m3::from_bits(code).is_nan(),
                    "{code:#04x}"
                );
                assert_eq!(got.is_sign_negative(), code & 0x80 != 0, "{code:#04x}");
            } else {
                assert!(!E4m3::from_bits(code).is_nan(), "{code:#04x}");
                // Bit equality: ±0 keep their signs, and f64 → f32 is exact for these values.
                assert_eq!(got.to_bits(), (want as f32).to_bits(), "{code:#04x}");
                assert_eq!(f64::from(got), want, "{code:#04x}");
            }
        }
        let anchors: [(u8, f32); 12] = [
            (0x00, 0.0),
            (0x80, -0.0),
            (0x01, 0.001_953_125), // 2^-9
            (0x07, 0.013_671_875), // 7·2^-9, the largest subnormal
            (0x08, 0.015_625),     // 2^-6
            (0x30, 0.5),
            (0x38, 1.0),
            (0x39, 1.125),
            (0x3F, 1.875),
            (0x40, 2.0),
            (0x7E, 448.0),
            (0xFE, -448.0),
        ];
        for (code, value) in anchors {
            assert_eq!(E4m3::from_bits(code).to_f32().to_bits(), value.to_bits());
        }
        assert_eq!(E4m3::MAX.to_f32(), 448.0);
        assert_eq!(E4m3::MIN_POSITIVE.to_f32(), 2f32.powi(-6));
        assert_eq!(E4m3::MIN_POSITIVE_SUBNORMAL.to_f32(), 2f32.powi(-9));
        assert!(E4m3::NAN.is_nan());
        // The positive finite codes are strictly increasing in value.
        for code in 0..0x7Eu8 {
            assert!(E4m3::from_bits(code).to_f32() < E4m3::from_bits(code + 1).to_f32());
        }
    }

    #[test]
    fn every_finite_code_survives_a_round_trip_and_nan_stays_nan() {
        for code in 0..=255u8 {
            let e = E4m3::from_bits(code);
            if e.is_nan() {
                assert_eq!(E4m3::from_f32(e.to_f32()), E4m3::NAN);
            } else {
                assert_eq!(narrow(e.to_f32()), code, "{code:#04x}");
            }
        }
        for nan in [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFC0_1234),
        ] {
            assert_eq!(E4m3::from_f32(nan), E4m3::NAN);
        }
    }

    #[test]
    fn half_way_cases_round_to_even_and_neighbours_to_nearest() {
        // All 126 gaps between adjacent non-negative finite codes, both signs: the midpoint
        // (exact in f32) goes to the even code, one f32 ulp below it to the lower code, one
        // above to the upper code.
        let mut cases = 0;
        for low in 0..0x7Eu8 {
            let high = low + 1;
            let even = if low % 2 == 0 { low } else { high };
            let mid = (E4m3::from_bits(low).to_f32() + E4m3::from_bits(high).to_f32()) / 2.0;
            assert_eq!(
                f64::from(mid),
                (value_from_definition(low) + value_from_definition(high)) / 2.0
            );
            for (sign, x) in [(0u8, mid), (0x80, -mid)] {
                assert_eq!(narrow(x), sign | even, "midpoint {x}");
                let (below, above) = (x.abs().next_down(), x.abs().next_up());
                let signed = |v: f32| if sign == 0 { v } else { -v };
                assert_eq!(narrow(signed(below)), sign | low, "below {x}");
                assert_eq!(narrow(signed(above)), sign | high, "above {x}");
                cases += 3;
            }
        }
        assert_eq!(cases, 126 * 6);
    }

    #[test]
    fn underflow_subnormals_and_saturation() {
        let cases: [(f32, u8); 22] = [
            // Underflow: half the smallest subnormal ties to the even zero.
            (2f32.powi(-10), 0x00),
            (-(2f32.powi(-10)), 0x80),
            (2f32.powi(-10).next_up(), 0x01),
            (f32::MIN_POSITIVE, 0x00),
            (f32::from_bits(1), 0x00),
            (-f32::from_bits(1), 0x80),
            (-0.0, 0x80),
            // Subnormal range: spacing 2^-9, ties to even.
            (3.0 * 2f32.powi(-10), 0x02),
            (5.0 * 2f32.powi(-10), 0x02),
            (7.0 * 2f32.powi(-10), 0x04),
            (15.0 * 2f32.powi(-10), 0x08), // 7.5·2^-9 → 2^-6, the smallest normal
            (2f32.powi(-6).next_down(), 0x08),
            // Saturation (satfinite): every |x| > 448 is ±448, infinities included.
            (448.0, 0x7E),
            (448f32.next_up(), 0x7E),
            (464.0, 0x7E),
            (480.0, 0x7E),
            (1.0e30, 0x7E),
            (f32::MAX, 0x7E),
            (f32::INFINITY, 0x7E),
            (f32::NEG_INFINITY, 0xFE),
            (-464.0, 0xFE),
            // Top binade: spacing 32, 432 = 13.5·32 ties to 14·32 = 448.
            (432.0, 0x7E),
        ];
        for (x, code) in cases {
            assert_eq!(narrow(x), code, "{x:e}");
            assert_eq!(nearest_by_search(x), code, "reference at {x:e}");
        }
    }

    #[test]
    fn narrowing_matches_exhaustive_nearest_search_on_random_values() {
        let mut rng = StdRng::seed_from_u64(24);
        // 20 000 log-uniform magnitudes from below the underflow threshold (2^-12) to beyond
        // saturation (2^10), random signs.
        for _ in 0..20_000 {
            let magnitude = 2f32.powf(rng.random_range(-12.0f32..10.0));
            let x = if rng.random::<bool>() {
                magnitude
            } else {
                -magnitude
            };
            assert_eq!(narrow(x), nearest_by_search(x), "{x:e}");
        }
        // 5 000 arbitrary f32 bit patterns (NaNs, infinities, subnormals, huge values).
        for _ in 0..5_000 {
            let x = f32::from_bits(rng.random::<u32>());
            assert_eq!(narrow(x), nearest_by_search(x), "{:#010x}", x.to_bits());
        }
    }

    #[test]
    fn scales_validate_their_lengths() {
        let tensor = Scales::Tensorwise { a: 2.0, b: 0.5 };
        assert_eq!(tensor.mode(), ScaleMode::Tensorwise);
        assert!(tensor.validate(3, 5).is_ok());
        assert_eq!(tensor.pair(2, 4), (2.0, 0.5));
        let row = Scales::Rowwise {
            a: vec![1.0, 2.0, 3.0],
            b: vec![0.5; 5],
        };
        assert_eq!(row.mode(), ScaleMode::Rowwise);
        assert!(row.validate(3, 5).is_ok());
        assert_eq!(row.pair(1, 4), (2.0, 0.5));
        assert_eq!(
            row.validate(4, 5),
            Err(SizeError::Elements {
                matrix: "the row-wise scales of A".into(),
                got: 3,
                expected: 4,
            })
        );
        assert!(matches!(
            row.validate(3, 6),
            Err(SizeError::Elements {
                got: 5,
                expected: 6,
                ..
            })
        ));
        assert_eq!(ScaleMode::ALL.map(ScaleMode::name), ["tensor", "row"]);
    }

    #[test]
    fn scales_must_be_finite_and_at_least_2_pow_minus_63() {
        let min = MIN_SCALE;
        assert_eq!(f64::from(min), 2f64.powi(-63));
        assert!(Scales::Tensorwise { a: min, b: min }.validate(1, 1).is_ok());
        let below = f32::from_bits(min.to_bits() - 1);
        for bad in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            -1.0,
            f32::from_bits(1),
            below,
            1.5 * 2f32.powi(-75),
        ] {
            let refused = |operand, index| {
                Err(SizeError::ScaleValue(ScaleValueError {
                    operand,
                    index,
                    value: bad,
                }))
            };
            // NaN ≠ NaN: compare the error's text for it.
            let same = |got: Result<(), SizeError>, want: Result<(), SizeError>| {
                format!("{got:?}") == format!("{want:?}")
            };
            let tensor = Scales::Tensorwise { a: 1.0, b: bad };
            assert!(same(tensor.validate(1, 1), refused("B", None)), "{bad:e}");
            let row = Scales::Rowwise {
                a: vec![1.0, 2.0, bad],
                b: vec![bad],
            };
            assert!(same(row.validate(3, 1), refused("A", Some(2))), "{bad:e}");
        }
        let row = Scales::Rowwise {
            a: vec![1.0],
            b: vec![0.5, -0.0],
        };
        assert_eq!(
            row.validate(1, 2).map_err(|e| e.to_string()),
            Err(
                "the row-wise scale 1 of B is -0e0: FP8 scales must be finite and at least \
                 2^-63 (so that every product sa·sb is a normal f32)"
                    .into()
            )
        );
        assert_eq!(
            Scales::Tensorwise {
                a: f32::NAN,
                b: 1.0
            }
            .validate(1, 1)
            .map_err(|e| e.to_string()),
            Err(
                "the tensor-wise scale of A is NaN: FP8 scales must be finite and at least \
                 2^-63 (so that every product sa·sb is a normal f32)"
                    .into()
            )
        );
    }
}
