//! The FP8 reference (issue 24): A and B as [`E4m3`] codes with [`Scales`], C and D in bf16 or
//! f16. [`gemm_scaled_f64`] is `(sa ⊙ A)·(sb ⊙ B)ᵀ` with exact sums (see [`crate::fp8`]),
//! [`gemm_scaled_f32`] the FP8 stage kernel's arithmetic, and [`check_scaled`] /
//! [`check_scaled_sampled`] compare an output ([`check_scaled_each`] several) with the bound
//! of [`ErrorBound::scaled`], on the parent module's comparison machinery.

use super::{
    CheckReport, Elements, EpilogueInput, ErrorBound, Expected, Products, c_at,
    check_operand_sizes, check_output_sizes, check_sample, compare, compare_one, dot,
};
use crate::dtype::Element;
use crate::fp8::{E4m3, Scales};
use crate::plan::SizeError;
use crate::problem::Problem;

/// Elements a row-major `rows`×`cols` matrix with leading dimension `ld` spans.
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    match rows {
        0 => 0,
        _ => (rows - 1).saturating_mul(ld).saturating_add(cols),
    }
}

/// `Ok` when a strided `matrix` has the `expected` elements it spans (or more).
fn check_span(matrix: &str, got: usize, expected: usize) -> Result<(), SizeError> {
    if got >= expected {
        Ok(())
    } else {
        SizeError::check(matrix, got, expected)
    }
}

/// A (m×k, ld `lda`), B (n×k, ld `ldb`) and the scales cover an m×n product.
fn check_scaled_operands(
    (m, n, k): (usize, usize, usize),
    a: &[E4m3],
    lda: usize,
    b: &[E4m3],
    ldb: usize,
    scales: &Scales,
) -> Result<(), SizeError> {
    check_span("A", a.len(), span(m, k, lda))?;
    check_span("B", b.len(), span(n, k, ldb))?;
    scales.validate(m, n)
}

/// `Σ_k a_k·b_k` and `Σ_k |a_k·b_k|` in f64, both exact for K ≤ 171 196 (see [`crate::fp8`]).
fn dot_e4m3(a: &[E4m3], b: &[E4m3]) -> (f64, f64) {
    let widened = |x: &E4m3| f64::from(x.to_f32());
    dot(a.iter().map(widened).zip(b.iter().map(widened)))
}

/// `(sa ⊙ A)·(sb ⊙ B)ᵀ` in f64 from e4m3 operands: A is m×k (ld `lda`), B is n×k (ld `ldb`);
/// returns m×n row-major with element (i, j) = `sa_i·sb_j·Σ_k a_ik·b_jk`. The sum and the scale
/// product (two f32 factors) are exact in f64, so each element is one f64 rounding from the
/// exact value. Operands or scales too short for the shape are a [`SizeError`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_scaled_f64(
    m: usize,
    n: usize,
    k: usize,
    a: &[E4m3],
    lda: usize,
    b: &[E4m3],
    ldb: usize,
    scales: &Scales,
) -> Result<Vec<f64>, SizeError> {
    check_scaled_operands((m, n, k), a, lda, b, ldb, scales)?;
    let mut d = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (sum, _) = dot_e4m3(&a[i * lda..i * lda + k], &b[j * ldb..j * ldb + k]);
            let (sa, sb) = scales.pair(i, j);
            d.push(f64::from(sa) * f64::from(sb) * sum);
        }
    }
    Ok(d)
}

/// The FP8 stage kernel's arithmetic (the kernel of issue 24 is to compute exactly this; a
/// fused multiply-add there changes bits, not the bound): `acc = Σ_k a_ik·b_jk` in f32 in
/// increasing k (each product exact), then
/// `D[i][j] = round(alpha·((sa_i·sb_j)·acc) + beta·c_ij)` with each operation in f32 and one
/// rounding to `T` (the `beta·c` term only with C). A (m×k, ld `lda`) and B (n×k, ld `ldb`)
/// are e4m3 codes, C is f32 with its leading dimension; returns m×n row-major. Operands,
/// scales or C too short for the shape are a [`SizeError`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_scaled_f32<T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: &[E4m3],
    lda: usize,
    b: &[E4m3],
    ldb: usize,
    scales: &Scales,
    epilogue: EpilogueInput<'_>,
) -> Result<Vec<T>, SizeError> {
    check_scaled_operands((m, n, k), a, lda, b, ldb, scales)?;
    if let Some((c, ldc)) = epilogue.c {
        check_span("C", c.len(), span(m, n, ldc))?;
    }
    let mut d = Vec::with_capacity(m * n);
    for i in 0..m {
        let ai = &a[i * lda..i * lda + k];
        for j in 0..n {
            let bj = &b[j * ldb..j * ldb + k];
            let acc = ai
                .iter()
                .zip(bj)
                .fold(0.0f32, |acc, (x, y)| acc + x.to_f32() * y.to_f32());
            let (sa, sb) = scales.pair(i, j);
            let mut v = epilogue.alpha * ((sa * sb) * acc);
            if let Some((c, ldc)) = epilogue.c {
                v += epilogue.beta * c[i * ldc + j];
            }
            d.push(T::from_f32(v));
        }
    }
    Ok(d)
}

/// Global operands of [`check_scaled`]: A (M×K) and B (N×K) as e4m3 codes, their scales, and
/// optional C (M×N) in the output type, all packed row-major.
#[derive(Clone, Copy, Debug)]
pub struct ScaledCheckInputs<'a, T> {
    /// A.
    pub a: &'a [E4m3],
    /// B.
    pub b: &'a [E4m3],
    /// The scales of A and B.
    pub scales: &'a Scales,
    /// C (when beta ≠ 0).
    pub c: Option<&'a [T]>,
}

impl<T: Element> ScaledCheckInputs<'_, T> {
    /// A, B, the scales, C (required when beta ≠ 0) and `d` have the sizes of `problem`.
    fn check_sizes(&self, problem: &Problem, d: &[T]) -> Result<(), SizeError> {
        self.scales.validate(problem.m, problem.n)?;
        check_operand_sizes(
            problem,
            self.a.len(),
            self.b.len(),
            self.c.map(<[T]>::len),
            d.len(),
        )
    }

    /// Each element's reference values (`alpha`, `beta` apart) for the comparison.
    fn expected(&self, problem: &Problem) -> impl Fn(usize) -> Expected + Sync {
        let (n, k) = (problem.n, problem.k);
        move |idx| {
            let (i, j) = (idx / n, idx % n);
            let (sum, magnitude) =
                dot_e4m3(&self.a[i * k..(i + 1) * k], &self.b[j * k..(j + 1) * k]);
            let scale = scale_of(self.scales, i, j);
            Expected {
                exact: scale * sum,
                magnitude: scale.abs() * magnitude,
                c: c_at(self.c, idx),
            }
        }
    }
}

/// `sa_i·sb_j` in f64 (exact: a product of two f32).
fn scale_of(scales: &Scales, i: usize, j: usize) -> f64 {
    let (sa, sb) = scales.pair(i, j);
    f64::from(sa) * f64::from(sb)
}

/// The bound and `(alpha, beta)` of a scaled check with output type `T`.
fn bound_and_scalars<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
) -> (ErrorBound, (f64, f64)) {
    (
        ErrorBound::scaled(T::DTYPE, roundings, problem.k, tp),
        (f64::from(problem.alpha), f64::from(problem.beta)),
    )
}

/// Compares `d` (global M×N, output type `T`) against `alpha·(sa ⊙ A)·(sb ⊙ B)ᵀ + beta·C`
/// computed in f64, element by element, with the bound of [`ErrorBound::scaled`] for `T`
/// (for an FP8 problem, [`Problem::fp8`] set, that is its `dtype`; `problem.dtype` and
/// `problem.fp8` are not read here). Operands or scales of the wrong size, or no C while
/// beta ≠ 0, are a [`SizeError`].
pub fn check_scaled<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    inputs: ScaledCheckInputs<'_, T>,
    d: &[T],
) -> Result<CheckReport, SizeError> {
    inputs.check_sizes(problem, d)?;
    let (bound, scalars) = bound_and_scalars::<T>(problem, roundings, tp);
    let all = Elements::All(problem.m * problem.n);
    Ok(compare_one(
        bound,
        scalars,
        all,
        d,
        inputs.expected(problem),
    ))
}

/// As [`check_scaled`], for several outputs of the same problem and inputs (say, every kernel
/// configuration's D): one report per output, in order, each the one [`check_scaled`] gives,
/// while the f64 reference — the cost of a full check, M·N·K products — is computed once.
pub fn check_scaled_each<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    inputs: ScaledCheckInputs<'_, T>,
    outputs: &[&[T]],
) -> Result<Vec<CheckReport>, SizeError> {
    for d in outputs {
        inputs.check_sizes(problem, d)?;
    }
    let (bound, scalars) = bound_and_scalars::<T>(problem, roundings, tp);
    let all = Elements::All(problem.m * problem.n);
    Ok(compare(
        bound,
        scalars,
        all,
        outputs,
        inputs.expected(problem),
    ))
}

/// As [`check_scaled`], on the elements `indices` (flat `i·N + j`, each below M·N) only, as
/// [`check_sampled`](super::check_sampled) does for the unscaled GEMM.
pub fn check_scaled_sampled<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    inputs: ScaledCheckInputs<'_, T>,
    d: &[T],
    indices: &[usize],
) -> Result<CheckReport, SizeError> {
    inputs.check_sizes(problem, d)?;
    check_sample(problem, indices)?;
    let (bound, scalars) = bound_and_scalars::<T>(problem, roundings, tp);
    let sample = Elements::Sample(indices);
    Ok(compare_one(
        bound,
        scalars,
        sample,
        d,
        inputs.expected(problem),
    ))
}

/// As [`check_scaled`], with each element's sums of the e4m3 codes taken from `products`
/// (unscaled; the scales are applied here) instead of computed from A and B. Products,
/// scales, C or D of the wrong size, or no C while beta ≠ 0, are a [`SizeError`].
pub fn check_scaled_products<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    products: &Products,
    scales: &Scales,
    c: Option<&[T]>,
    d: &[T],
) -> Result<CheckReport, SizeError> {
    scales.validate(problem.m, problem.n)?;
    products.check_sizes(problem)?;
    check_output_sizes(problem, c.map(<[T]>::len), d.len())?;
    let (bound, scalars) = bound_and_scalars::<T>(problem, roundings, tp);
    let n = problem.n;
    let all = Elements::All(problem.m * n);
    Ok(compare_one(bound, scalars, all, d, |idx| {
        products.expected(idx, scale_of(scales, idx / n, idx % n), c_at(c, idx))
    }))
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use half::f16;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, StandardNormal};

    use super::*;
    use crate::dtype::Dtype;
    use crate::fp8::ScaleMode;
    use crate::reference::widen;

    fn el(v: &[f32]) -> Vec<bf16> {
        v.iter().map(|&x| bf16::from_f32(x)).collect()
    }

    fn codes(v: &[f32]) -> Vec<E4m3> {
        v.iter().map(|&x| E4m3::from_f32(x)).collect()
    }

    #[test]
    fn scaled_reference_by_hand() -> Result<(), SizeError> {
        // A = [[1, 2], [0.5, −3]], B = [[4, 0.25], [−1, 1.5]] (exact in e4m3):
        // A·Bᵀ = [[4.5, 2], [1.25, −5]].
        let (a, b) = (codes(&[1., 2., 0.5, -3.]), codes(&[4., 0.25, -1., 1.5]));
        let tensor = Scales::Tensorwise { a: 2.0, b: 0.25 };
        let d = gemm_scaled_f64(2, 2, 2, &a, 2, &b, 2, &tensor)?;
        assert_eq!(d, vec![2.25, 1.0, 0.625, -2.5]);
        // Row-wise sa = [1, 4], sb = [0.5, 2]: sa_i·sb_j = [[0.5, 2], [2, 8]].
        let row = Scales::Rowwise {
            a: vec![1.0, 4.0],
            b: vec![0.5, 2.0],
        };
        assert_eq!(
            gemm_scaled_f64(2, 2, 2, &a, 2, &b, 2, &row)?,
            vec![2.25, 4.0, 2.5, -40.0]
        );
        // alpha = 0.5, beta = 2, C = 1: D = [[3.125, 4], [3.25, −18]], exact in bf16.
        let c = el(&[1.0; 4]);
        let c32 = widen(&c);
        let epilogue = EpilogueInput {
            alpha: 0.5,
            beta: 2.0,
            c: Some((&c32, 2)),
        };
        let d: Vec<bf16> = gemm_scaled_f32(2, 2, 2, &a, 2, &b, 2, &row, epilogue)?;
        assert_eq!(d, el(&[3.125, 4.0, 3.25, -18.0]));
        let problem = Problem::new(2, 2, 2).with_scalars(0.5, 2.0);
        let inputs = ScaledCheckInputs {
            a: &a,
            b: &b,
            scales: &row,
            c: Some(&c),
        };
        let report = check_scaled(&problem, 1, 1, inputs, &d)?;
        assert!(report.passed());
        assert_eq!((report.elements, report.max_abs_error), (4, 0.0));
        assert_eq!(report.bound, ErrorBound::scaled(Dtype::Bf16, 1, 2, 1));
        let mut wrong = d.clone();
        wrong[3] = bf16::from_f32(-17.0);
        let report = check_scaled(&problem, 1, 1, inputs, &wrong)?;
        assert_eq!((report.mismatches, report.worst_index), (1, 3));
        assert_eq!(report.max_abs_error, 1.0);
        let sampled = check_scaled_sampled(&problem, 1, 1, inputs, &wrong, &[3, 0])?;
        assert_eq!((sampled.elements, sampled.mismatches), (2, 1));
        assert_eq!(sampled.worst_ratio, report.worst_ratio);
        assert!(check_scaled_sampled(&problem, 1, 1, inputs, &wrong, &[0, 1, 2])?.passed());
        // The same check on the unscaled sums of the codes (A·Bᵀ above; |a·b| summed).
        let products = Products {
            exact: vec![4.5, 2.0, 1.25, -5.0],
            magnitude: vec![4.5, 2.0, 2.75, 5.0],
        };
        let given = check_scaled_products(&problem, 1, 1, &products, &row, Some(&c), &wrong)?;
        assert_eq!(given, report);
        // Other scales are another reference, which this D misses.
        assert!(!check_scaled_products(&problem, 1, 1, &products, &tensor, Some(&c), &d)?.passed());
        wrong[3] = bf16::NAN;
        assert!(
            check_scaled(&problem, 1, 1, inputs, &wrong)?
                .worst_ratio
                .is_infinite()
        );
        Ok(())
    }

    #[test]
    fn scaled_f64_sums_are_exact() -> Result<(), SizeError> {
        // 131 072 products 448·448 = 49·2^29 in all, plus 2^-9·2^-9: the sum spans the 53 bits
        // from 2^34 down to 2^-18, which f64 holds (and f32 would not).
        let k = 131_073;
        let mut a = vec![E4m3::MAX; k];
        a[k - 1] = E4m3::MIN_POSITIVE_SUBNORMAL;
        let ones = Scales::Tensorwise { a: 1.0, b: 1.0 };
        let d = gemm_scaled_f64(1, 1, k, &a, k, &a, k, &ones)?;
        assert_eq!(d[0] - 131_072.0 * 448.0 * 448.0, 2f64.powi(-18));
        Ok(())
    }

    #[test]
    fn scaled_bound_counts_two_more_f32_roundings() {
        for dtype in Dtype::ALL {
            for (r, k, p) in [(1, 4096, 1), (2, 8192, 8)] {
                let plain = ErrorBound::new(dtype, r, k, p);
                let scaled = ErrorBound::scaled(dtype, r, k, p);
                let extra = scaled.relative - plain.relative;
                assert!((extra - 1.05 * 2.0 * 2f64.powi(-24)).abs() < 1e-3 * extra);
                assert!(scaled.absolute >= plain.absolute);
            }
        }
    }

    /// An output type and its bit patterns, to step by one output ulp.
    trait Output: Element {
        fn from_bits(bits: u16) -> Self;
    }

    impl Output for bf16 {
        fn from_bits(bits: u16) -> Self {
            bf16::from_bits(bits)
        }
    }

    impl Output for f16 {
        fn from_bits(bits: u16) -> Self {
            f16::from_bits(bits)
        }
    }

    /// The neighbour of the finite `x` one ulp up (`up`) or down.
    fn step<T: Output>(x: T, up: bool) -> T {
        let bits = x.to_bits();
        if x.to_f32() == 0.0 {
            return T::from_bits(if up { 0x0001 } else { 0x8001 });
        }
        let positive = bits & 0x8000 == 0;
        T::from_bits(if positive == up { bits + 1 } else { bits - 1 })
    }

    /// `(inside, outside)`: the last `T` at or before `limit` and the first beyond it, going up
    /// (`up`) or down.
    fn around<T: Output>(limit: f64, up: bool) -> (T, T) {
        let beyond = |x: T| {
            let x = f64::from(x.to_f32());
            if up { x > limit } else { x < limit }
        };
        let mut x = T::from_f32(limit as f32);
        while beyond(x) {
            x = step(x, !up);
        }
        while !beyond(step(x, up)) {
            x = step(x, up);
        }
        (x, step(x, up))
    }

    /// A scale of magnitude 2^-6…1 (the outputs stay within f16's range), negative one time
    /// in four.
    fn random_scale(rng: &mut StdRng) -> f32 {
        2f32.powf(rng.random_range(-6.0f32..0.0))
    }

    /// The f32 path of the kernel ([`gemm_scaled_f32`]) on random e4m3 inputs stays within
    /// the bound, and one output ulp beyond the bound, on either side, is a mismatch.
    fn simulated_kernel_within_bound_and_one_ulp_beyond_rejected<T: Output>() {
        let mut rng = StdRng::seed_from_u64(24);
        let (m, n, alpha) = (4, 6, 0.75);
        for k in [1, 16, 100, 1024, 4096] {
            for mode in ScaleMode::ALL {
                for beta in [0.0, 1.0] {
                    let mut random_codes = |len: usize| -> Vec<E4m3> {
                        (0..len)
                            .map(|_| {
                                let x: f32 = StandardNormal.sample(&mut rng);
                                E4m3::from_f32(16.0 * x)
                            })
                            .collect()
                    };
                    let (a, b) = (random_codes(m * k), random_codes(n * k));
                    let scales = match mode {
                        ScaleMode::Tensorwise => Scales::Tensorwise {
                            a: random_scale(&mut rng),
                            b: random_scale(&mut rng),
                        },
                        ScaleMode::Rowwise => Scales::Rowwise {
                            a: (0..m).map(|_| random_scale(&mut rng)).collect(),
                            b: (0..n).map(|_| random_scale(&mut rng)).collect(),
                        },
                    };
                    let c: Vec<T> = crate::plan::random_normal(m * n, &mut rng);
                    let c = (beta != 0.0).then_some(c);
                    let c32 = c.as_deref().map(widen);
                    let epilogue = EpilogueInput {
                        alpha,
                        beta,
                        c: c32.as_deref().map(|c| (c, n)),
                    };
                    let d = gemm_scaled_f32::<T>(m, n, k, &a, k, &b, k, &scales, epilogue)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let problem = Problem::new(m, n, k).with_scalars(alpha, beta);
                    let inputs = ScaledCheckInputs {
                        a: &a,
                        b: &b,
                        scales: &scales,
                        c: c.as_deref(),
                    };
                    let run = |d: &[T]| {
                        check_scaled(&problem, 1, 1, inputs, d).unwrap_or_else(|e| panic!("{e}"))
                    };
                    let case = format!("{} K={k} {} beta={beta}", T::DTYPE, mode.name());
                    let report = run(&d);
                    assert!(report.passed(), "{case}: {report:?}");
                    assert_eq!(report.bound, ErrorBound::scaled(T::DTYPE, 1, k, 1));
                    // The oracle: want = alpha·s·Σab + beta·c (the f64 reference), tol from
                    // |alpha·s|·Σ|ab| + |beta·c|.
                    let exact = gemm_scaled_f64(m, n, k, &a, k, &b, k, &scales)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let magnitude = |i: usize, j: usize| {
                        let (row, col) = (&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
                        let (sa, sb) = scales.pair(i, j);
                        let sum: f64 = row
                            .iter()
                            .zip(col)
                            .map(|(x, y)| f64::from(x.to_f32() * y.to_f32()).abs())
                            .sum();
                        (f64::from(sa) * f64::from(sb)).abs() * sum
                    };
                    for idx in [0, 7, m * n - 1] {
                        let beta_c = c32
                            .as_ref()
                            .map_or(0.0, |c| f64::from(beta) * f64::from(c[idx]));
                        let want = f64::from(alpha) * exact[idx] + beta_c;
                        let tol = report.bound.relative
                            * (f64::from(alpha).abs() * magnitude(idx / n, idx % n) + beta_c.abs())
                            + report.bound.absolute;
                        for up in [true, false] {
                            let limit = if up { want + tol } else { want - tol };
                            let (inside, outside) = around::<T>(limit, up);
                            let mut perturbed = d.clone();
                            perturbed[idx] = inside;
                            assert!(run(&perturbed).passed(), "{case} [{idx}] inside, up={up}");
                            perturbed[idx] = outside;
                            let rejected = run(&perturbed);
                            assert_eq!(
                                (rejected.mismatches, rejected.worst_index),
                                (1, idx),
                                "{case} [{idx}] outside, up={up}"
                            );
                            // Several outputs at once: each the report it gets alone.
                            let each = check_scaled_each(&problem, 1, 1, inputs, &[&d, &perturbed])
                                .unwrap_or_else(|e| panic!("{e}"));
                            assert_eq!(each, [report, rejected], "{case} [{idx}] each");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn simulated_kernel_bf16_within_bound_and_one_ulp_beyond_rejected() {
        simulated_kernel_within_bound_and_one_ulp_beyond_rejected::<bf16>();
    }

    #[test]
    fn simulated_kernel_f16_within_bound_and_one_ulp_beyond_rejected() {
        simulated_kernel_within_bound_and_one_ulp_beyond_rejected::<f16>();
    }

    #[test]
    fn scaled_checks_refuse_wrong_sizes() {
        let (a, b) = (codes(&[1., 2., 3., 4.]), codes(&[5., 6., 7., 8.]));
        let (c, d) = (el(&[1.; 4]), el(&[18., 24., 40., 54.]));
        let row = Scales::Rowwise {
            a: vec![1.0; 2],
            b: vec![1.0; 2],
        };
        let problem = Problem::new(2, 2, 2).with_scalars(1.0, 1.0);
        let inputs = ScaledCheckInputs {
            a: &a,
            b: &b,
            scales: &row,
            c: Some(&c),
        };
        assert!(check_scaled(&problem, 1, 1, inputs, &d).is_ok_and(|r| r.passed()));
        // Several outputs: any of the wrong size refuses them all.
        assert!(matches!(
            check_scaled_each(&problem, 1, 1, inputs, &[&d, &d[..3]]),
            Err(SizeError::Elements {
                got: 3,
                expected: 4,
                ..
            })
        ));
        let no_c = ScaledCheckInputs { c: None, ..inputs };
        assert_eq!(
            check_scaled(&problem, 1, 1, no_c, &d).err(),
            Some(SizeError::MissingC { beta: 1.0 })
        );
        let short_a = ScaledCheckInputs {
            a: &a[..3],
            ..inputs
        };
        assert!(matches!(
            check_scaled(&problem, 1, 1, short_a, &d),
            Err(SizeError::Elements {
                got: 3,
                expected: 4,
                ..
            })
        ));
        let short_b = ScaledCheckInputs {
            b: &b[..3],
            ..inputs
        };
        assert!(check_scaled(&problem, 1, 1, short_b, &d).is_err());
        let one_row = Scales::Rowwise {
            a: vec![1.0],
            b: vec![1.0; 2],
        };
        let short_scales = ScaledCheckInputs {
            scales: &one_row,
            ..inputs
        };
        assert_eq!(
            check_scaled(&problem, 1, 1, short_scales, &d).err(),
            Some(SizeError::Elements {
                matrix: "the row-wise scales of A".into(),
                got: 1,
                expected: 2,
            })
        );
        assert!(check_scaled(&problem, 1, 1, inputs, &d[..3]).is_err());
        assert!(check_scaled_sampled(&problem, 1, 1, inputs, &d, &[4]).is_err());
        assert!(gemm_scaled_f64(2, 2, 2, &a[..3], 2, &b, 2, &row).is_err());
        assert!(gemm_scaled_f64(2, 2, 2, &a, 2, &b, 2, &one_row).is_err());
        let c32 = widen(&c);
        let epilogue = EpilogueInput {
            alpha: 1.0,
            beta: 1.0,
            c: Some((&c32[..3], 2)),
        };
        assert!(gemm_scaled_f32::<bf16>(2, 2, 2, &a, 2, &b, 2, &row, epilogue).is_err());
    }

    /// Scales below 2^-63 are refused: their product would underflow in f32, and the error
    /// of `s = sa·sb`, multiplied by `acc·alpha`, would exceed the bound (the reviewer's
    /// repro: K = 16, every code 448, `sa = sb = 1.5·2^-75`, worst ratio 8.43). Scales of
    /// exactly 2^-63 give `s = 2^-126`, a normal f32, and pass the check.
    #[test]
    fn scales_whose_product_would_underflow_are_refused_and_2_pow_minus_63_passes() {
        let k = 16;
        let (a, b) = (vec![E4m3::MAX; 2 * k], vec![E4m3::MAX; 3 * k]);
        let problem = Problem::new(2, 3, k);
        let run = |scales: &Scales| -> Result<CheckReport, SizeError> {
            let epilogue = EpilogueInput {
                alpha: 1.0,
                beta: 0.0,
                c: None,
            };
            let d = gemm_scaled_f32::<bf16>(2, 3, k, &a, k, &b, k, scales, epilogue)?;
            let inputs = ScaledCheckInputs {
                a: &a,
                b: &b,
                scales,
                c: None,
            };
            check_scaled(&problem, 1, 1, inputs, &d)
        };
        let tiny = 1.5 * 2f32.powi(-75);
        let refused = crate::fp8::ScaleValueError {
            operand: "A",
            index: None,
            value: tiny,
        };
        assert_eq!(
            run(&Scales::Tensorwise { a: tiny, b: tiny }).err(),
            Some(SizeError::ScaleValue(refused))
        );
        assert_eq!(
            gemm_scaled_f64(
                2,
                3,
                k,
                &a,
                k,
                &b,
                k,
                &Scales::Tensorwise { a: 1.0, b: tiny }
            )
            .err(),
            Some(SizeError::ScaleValue(crate::fp8::ScaleValueError {
                operand: "B",
                ..refused
            }))
        );
        let min = crate::fp8::MIN_SCALE;
        assert_eq!(min, 2f32.powi(-63));
        for scales in [
            Scales::Tensorwise { a: min, b: min },
            Scales::Rowwise {
                a: vec![min, 1.0],
                b: vec![min, 0.5, min],
            },
        ] {
            let report = run(&scales).unwrap_or_else(|e| panic!("{e}"));
            assert!(report.passed(), "{scales:?}: {report:?}");
        }
    }
}
