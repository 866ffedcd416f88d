//! Element bit patterns widened to f64, exactly: bf16, IEEE half and OCP e4m3.
//!
//! Pure integer and float arithmetic (no PTX), so the host's unit tests check every bit
//! pattern against the `half` crate and the host's `E4m3`. The reference kernel
//! (`kernels::reference`, device builds only) reads its operands through these.
//!
//! Each format is a sign bit, `E` exponent bits of bias `2^(E−1) − 1` and `M` mantissa bits. A
//! normal value `(1 + m/2^M)·2^(e − bias)` becomes the f64 with biased exponent
//! `e − bias + 1023` and the mantissa in f64's top `M` mantissa bits (f64's exponent range and
//! 52-bit mantissa hold every one of these formats exactly); a subnormal one is
//! `m·2^(1 − bias − M)`, an integer times a power of two, exact in f64.

/// `2^e` as an f64 for `−1022 ≤ e ≤ 1023` (a normal f64: biased exponent `e + 1023`, mantissa 0).
#[inline(always)]
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Applies the sign bit `negative` to a magnitude (also to ±0 and NaN).
#[inline(always)]
fn signed(negative: bool, magnitude: f64) -> f64 {
    if negative { -magnitude } else { magnitude }
}

/// A normal value of a format with `mantissa_bits` mantissa bits and exponent `bias`, from its
/// biased exponent field and mantissa field.
#[inline(always)]
fn normal(exponent: u32, mantissa: u32, bias: i32, mantissa_bits: u32) -> f64 {
    let biased = (exponent as i32 - bias + 1023) as u64;
    f64::from_bits((biased << 52) | ((mantissa as u64) << (52 - mantissa_bits)))
}

/// bfloat16 (1-8-7, bias 127): the upper half of an f32, so the f32 widening is exact and so
/// is the f64 one (subnormals, infinities and NaN included).
#[inline(always)]
pub fn bf16_to_f64(bits: u16) -> f64 {
    f32::from_bits((bits as u32) << 16) as f64
}

/// IEEE half (1-5-10, bias 15): exponent field 0 is `m·2^-24`, 31 is ±infinity (`m = 0`) or
/// NaN.
#[inline(always)]
pub fn f16_to_f64(bits: u16) -> f64 {
    let exponent = ((bits >> 10) & 0x1F) as u32;
    let mantissa = (bits & 0x3FF) as u32;
    let magnitude = match exponent {
        0 => mantissa as f64 * pow2(-24),
        0x1F if mantissa == 0 => f64::INFINITY,
        0x1F => f64::NAN,
        _ => normal(exponent, mantissa, 15, 10),
    };
    signed(bits & 0x8000 != 0, magnitude)
}

/// OCP e4m3 (1-4-3, bias 7, PTX `.e4m3`): no infinities; `s 1111 111` is NaN, the other codes
/// of exponent field 15 are normal (up to 448); exponent field 0 is `m·2^-9`.
#[inline(always)]
pub fn e4m3_to_f64(bits: u8) -> f64 {
    let exponent = ((bits >> 3) & 0xF) as u32;
    let mantissa = (bits & 0x7) as u32;
    let magnitude = if bits & 0x7F == 0x7F {
        f64::NAN
    } else if exponent == 0 {
        mantissa as f64 * pow2(-9)
    } else {
        normal(exponent, mantissa, 7, 3)
    };
    signed(bits & 0x80 != 0, magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal as values, with NaN only for NaN and the sign of zero kept.
    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
    }

    #[test]
    fn every_bf16_and_f16_pattern_widens_as_half_does() {
        for bits in 0..=u16::MAX {
            let bf = half::bf16::from_bits(bits).to_f64();
            assert!(same(bf16_to_f64(bits), bf), "bf16 {bits:#06x}");
            let h = half::f16::from_bits(bits).to_f64();
            assert!(same(f16_to_f64(bits), h), "f16 {bits:#06x}");
        }
    }

    #[test]
    fn e4m3_landmarks() {
        let cases: [(u8, f64); 9] = [
            (0x00, 0.0),
            (0x01, 2f64.powi(-9)),
            (0x07, 7.0 * 2f64.powi(-9)),
            (0x08, 2f64.powi(-6)),
            (0x38, 1.0),
            (0x3C, 1.5),
            (0x7E, 448.0),
            (0xB8, -1.0),
            (0xFE, -448.0),
        ];
        for (bits, want) in cases {
            assert!(same(e4m3_to_f64(bits), want), "e4m3 {bits:#04x}");
        }
        assert!(same(e4m3_to_f64(0x80), -0.0));
        assert!(e4m3_to_f64(0x7F).is_nan() && e4m3_to_f64(0xFF).is_nan());
        // Monotone over the positive codes, and each negative code mirrors its positive one.
        for bits in 1..0x7Fu8 {
            assert!(e4m3_to_f64(bits) > e4m3_to_f64(bits - 1), "{bits:#04x}");
            assert!(same(e4m3_to_f64(bits | 0x80), -e4m3_to_f64(bits)));
        }
    }
}
