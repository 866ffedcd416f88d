//! Element types: the two 16-bit floating-point formats the GPU kernel takes.
//!
//! Every element is 2 bytes, so "16-byte aligned" (what TMA and the vectorised copies need)
//! means "a multiple of 8 elements" everywhere in this crate.
//!
//! FP8 operands (e4m3, 1 byte: 16 elements per 16 bytes) are [`crate::fp8::E4m3`]; they are
//! operands only (C and D stay bf16 or f16), so they are not a [`Dtype`]: a problem with
//! [`crate::problem::Problem::fp8`] has e4m3 A and B and its `dtype` names the output type.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of A, B, C and D (one type for all four; accumulation is always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// bfloat16: 8 exponent bits, 8 significand bits (7 stored).
    Bf16,
    /// IEEE binary16: 5 exponent bits, 11 significand bits (10 stored).
    F16,
}

impl Dtype {
    /// Both dtypes, in CLI order.
    pub const ALL: [Dtype; 2] = [Dtype::Bf16, Dtype::F16];

    /// Bytes per element (2 for both).
    #[must_use]
    pub const fn size_bytes(self) -> usize {
        2
    }

    /// The lowercase name used on the command line and in JSON.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// Unit roundoff `u = 2^-p` of round-to-nearest (p = significand bits incl. the hidden one):
    /// `|fl(x) − x| ≤ u·|x|` for normal results.
    #[must_use]
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Dtype::Bf16 => 2f64.powi(-8),
            Dtype::F16 => 2f64.powi(-11),
        }
    }

    /// Half the spacing of subnormals: the absolute rounding error near zero.
    #[must_use]
    pub fn subnormal_half_spacing(self) -> f64 {
        match self {
            Dtype::Bf16 => 2f64.powi(-134),
            Dtype::F16 => 2f64.powi(-25),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A 16-bit element type (`half::bf16` or `half::f16`).
///
/// Conversions are exact in the f32 direction and round-to-nearest-even towards the element.
pub trait Element: Copy + Send + Sync + Default + PartialEq + fmt::Debug + 'static {
    /// The dtype tag of this type.
    const DTYPE: Dtype;
    /// Rounds an f32 to the nearest element (ties to even).
    fn from_f32(x: f32) -> Self;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// A quiet NaN, used to poison output buffers so that unwritten elements show up.
    fn nan() -> Self;
    /// The raw bit pattern (for bit-identity checks).
    fn to_bits(self) -> u16;
}

impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn nan() -> Self {
        half::bf16::NAN
    }
    fn to_bits(self) -> u16 {
        half::bf16::to_bits(self)
    }
}

impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn nan() -> Self {
        half::f16::NAN
    }
    fn to_bits(self) -> u16 {
        half::f16::to_bits(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_tags() {
        assert_eq!(<half::bf16 as Element>::from_f32(1.5).to_f32(), 1.5);
        assert_eq!(<half::f16 as Element>::from_f32(-0.25).to_f32(), -0.25);
        assert_eq!(<half::bf16 as Element>::DTYPE, Dtype::Bf16);
        assert_eq!(<half::f16 as Element>::DTYPE, Dtype::F16);
        assert!(<half::f16 as Element>::nan().to_f32().is_nan());
        assert_eq!(Dtype::F16.size_bytes(), std::mem::size_of::<half::f16>());
    }

    #[test]
    fn unit_roundoff_bounds_rounding() {
        let x = 1.0f32 + 1.0 / 3.0;
        for dtype in Dtype::ALL {
            let rounded = match dtype {
                Dtype::Bf16 => <half::bf16 as Element>::from_f32(x).to_f32(),
                Dtype::F16 => <half::f16 as Element>::from_f32(x).to_f32(),
            };
            let err = (f64::from(rounded) - f64::from(x)).abs();
            assert!(
                err <= dtype.unit_roundoff() * f64::from(x),
                "{dtype}: {err}"
            );
        }
    }
}
