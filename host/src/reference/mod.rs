//! Reference GEMMs and the error bound `--check` and the tests use.
//!
//! - [`gemm_f64`]: `A·Bᵀ` accumulated in f64 from element inputs (products of 16-bit floats
//!   are exact in f64, so this is the exact result up to ~K·2^-53 relative).
//! - [`gemm_f32`]: the stage kernel's arithmetic, shared with the CPU executor: f32
//!   accumulation in increasing k, epilogue `alpha·acc + beta·c` in f32, one rounding to the
//!   element type. An all-gather schedule must reproduce it bit for bit.
//! - [`check`]: compares an output against the f64 reference with the bound
//!   `|D − D_ref| ≤ 1.05·(r·u + (K + P + 2)·2^-24)·(|alpha|·Σ_k|a_ik·b_jk| + |beta·c_ij|) + r·s`,
//!   where r = number of roundings to the element type on the way to D (1 for all-gather, P for
//!   the pipelined reduce-scatter, 2 for the single-stage one), u the element type's unit
//!   roundoff, the 2^-24 term the f32 accumulation (K products, P partial additions) and s half
//!   the subnormal spacing. It is the standard forward-error bound, relative to the magnitude
//!   of the products rather than to |D|, so cancellation cannot make it fail spuriously.
//! - FP8 (issue 24, in `reference/scaled.rs`: A and B as [`E4m3`](crate::fp8::E4m3) codes with
//!   [`Scales`](crate::fp8::Scales), C and D bf16 or f16):
//!   [`gemm_scaled_f64`] is `(sa ⊙ A)·(sb ⊙ B)ᵀ` with exact sums (see [`crate::fp8`]),
//!   [`gemm_scaled_f32`] the FP8 stage kernel's arithmetic, and [`check_scaled`] /
//!   [`check_scaled_sampled`] apply the bound of [`ErrorBound::scaled`],
//!   `|D − D_ref| ≤ 1.05·(r·u + (K + P + 4)·2^-24)·(|alpha·sa_i·sb_j|·Σ_k|a_ik·b_jk| +
//!   |beta·c_ij|) + r·s + 5·2^-150`: two more f32 roundings than above (the scale product and
//!   its application), and f32 underflow in the five epilogue operations.

use serde::{Deserialize, Serialize};

use crate::dtype::{Dtype, Element};
use crate::plan::SizeError;
use crate::problem::Problem;

pub mod gpu;
mod scaled;

pub use scaled::{
    ScaledCheckInputs, check_scaled, check_scaled_each, check_scaled_products,
    check_scaled_sampled, gemm_scaled_f32, gemm_scaled_f64,
};

/// `A·Bᵀ` in f64: A is m×k (ld `lda`), B is n×k (ld `ldb`); returns m×n row-major.
#[must_use]
pub fn gemm_f64<T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
) -> Vec<f64> {
    let a64: Vec<f64> = (0..m)
        .flat_map(|i| {
            a[i * lda..i * lda + k]
                .iter()
                .map(|x| f64::from(x.to_f32()))
        })
        .collect();
    let b64: Vec<f64> = (0..n)
        .flat_map(|j| {
            b[j * ldb..j * ldb + k]
                .iter()
                .map(|x| f64::from(x.to_f32()))
        })
        .collect();
    let mut d = vec![0.0; m * n];
    for i in 0..m {
        let ai = &a64[i * k..(i + 1) * k];
        for j in 0..n {
            let bj = &b64[j * k..(j + 1) * k];
            d[i * n + j] = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
        }
    }
    d
}

/// The epilogue scalars and optional C (`(values, ldc)`, m×n) of [`gemm_f32`].
#[derive(Clone, Copy, Debug)]
pub struct EpilogueInput<'a> {
    /// Scale of the accumulator.
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
    /// C as f32 with its leading dimension, when beta ≠ 0.
    pub c: Option<(&'a [f32], usize)>,
}

/// The stage kernel's arithmetic on f32 operands (already widened from the element type):
/// `D[i][j] = round(alpha·Σ_k a[i][k]·b[j][k] + beta·c[i][j])`, the sum in f32 in increasing k.
/// Returns m×n row-major.
#[must_use]
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32<T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    epilogue: EpilogueInput<'_>,
) -> Vec<T> {
    let mut d = Vec::with_capacity(m * n);
    for i in 0..m {
        let ai = &a[i * lda..i * lda + k];
        for j in 0..n {
            let bj = &b[j * ldb..j * ldb + k];
            let acc = ai.iter().zip(bj).fold(0.0f32, |acc, (x, y)| acc + x * y);
            let mut v = epilogue.alpha * acc;
            if let Some((c, ldc)) = epilogue.c {
                v += epilogue.beta * c[i * ldc + j];
            }
            d.push(T::from_f32(v));
        }
    }
    d
}

/// Widens elements to f32.
#[must_use]
pub fn widen<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// [`gemm_f32`] on element inputs: the single-device GEMM "computed the same way as the stage
/// kernel" (A m×k ld lda, B n×k ld ldb, C m×n ld n when given).
#[must_use]
#[allow(clippy::too_many_arguments)]
pub fn gemm_like_stage<T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    alpha: f32,
    beta: f32,
    c: Option<&[T]>,
) -> Vec<T> {
    let c32 = c.map(widen);
    let epilogue = EpilogueInput {
        alpha,
        beta,
        c: c32.as_deref().map(|c| (c, n)),
    };
    gemm_f32(m, n, k, &widen(a), lda, &widen(b), ldb, epilogue)
}

/// The error bound of [`check`] for one dtype and path.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBound {
    /// Relative factor applied to `|alpha|·Σ|a·b| + |beta·c|`.
    pub relative: f64,
    /// Absolute floor (subnormal rounding).
    pub absolute: f64,
}

impl ErrorBound {
    /// The bound for `roundings` roundings to `dtype`, K = `k`, `p` devices.
    #[must_use]
    pub fn new(dtype: Dtype, roundings: usize, k: usize, p: usize) -> Self {
        let r = roundings as f64;
        let f32_terms = (k + p + 2) as f64 * 2f64.powi(-24);
        ErrorBound {
            relative: 1.05 * (r * dtype.unit_roundoff() + f32_terms),
            absolute: r * dtype.subnormal_half_spacing(),
        }
    }

    /// The bound of the FP8 path ([`check_scaled`]) for `roundings` roundings to the output
    /// type `out`, K = `k`, `p` devices: relative `1.05·(r·u + (K + P + 4)·2^-24)`, absolute
    /// `r·s + 5·2^-150`.
    ///
    /// The products of e4m3 values are exact in f32 (as bf16's are), and the K − 1 additions
    /// of the accumulation are rounded as in [`ErrorBound::new`]; the epilogue
    /// `alpha·((sa_i·sb_j)·acc) + beta·c` rounds five times in f32 where the unscaled one
    /// rounds three times (`alpha·acc`, `beta·c`, the sum), hence K + P + 4 instead of
    /// K + P + 2.
    ///
    /// Hypothesis: every scale is finite and at least [`crate::fp8::MIN_SCALE`] = 2^-63
    /// ([`Scales::validate`](crate::fp8::Scales::validate), called by [`check_scaled`] and [`gemm_scaled_f32`]), so
    /// `s = sa_i·sb_j ≥ 2^-126` is a normal f32 and its rounding is relative. (An underflow
    /// there would be multiplied by `acc·alpha`: with K = 16, every code 448 and
    /// `sa = sb = 1.5·2^-75`, the error is 8.4 times this bound.) The four other operations
    /// may underflow to an f32 subnormal, each with an absolute error of at most 2^-150
    /// instead of a relative one; that of `s·acc` is then multiplied by `|alpha|`, so the
    /// `5·2^-150` covers them for `|alpha| ≤ 2`. (Beyond, an underflowed `s·acc` may exceed
    /// it by up to `(|alpha| − 2)·2^-150`, less than a bf16 subnormal ulp for
    /// `|alpha| < 2^17`; the bound does not count that.)
    #[must_use]
    pub fn scaled(out: Dtype, roundings: usize, k: usize, p: usize) -> Self {
        let r = roundings as f64;
        let f32_terms = (k + p + 4) as f64 * 2f64.powi(-24);
        ErrorBound {
            relative: 1.05 * (r * out.unit_roundoff() + f32_terms),
            absolute: r * out.subnormal_half_spacing() + 5.0 * 2f64.powi(-150),
        }
    }
}

/// Result of comparing an output with the f64 reference.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Elements compared (all of D, or the sample of [`check_sampled`]).
    pub elements: usize,
    /// Elements outside the bound (NaN counts as outside).
    pub mismatches: usize,
    /// Largest |D − D_ref|.
    pub max_abs_error: f64,
    /// Largest |D − D_ref| / bound (≤ 1 passes; infinite for NaN).
    pub worst_ratio: f64,
    /// Flat index (i·N + j) of the worst element.
    pub worst_index: usize,
    /// The bound used.
    pub bound: ErrorBound,
}

impl CheckReport {
    /// Whether every element is within the bound.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }

    /// An empty report with `bound`.
    fn new(bound: ErrorBound) -> Self {
        CheckReport {
            elements: 0,
            mismatches: 0,
            max_abs_error: 0.0,
            worst_ratio: 0.0,
            worst_index: 0,
            bound,
        }
    }

    /// Adds element `idx`: the output `out`, the exact `Σ a·b`, its magnitude `Σ |a·b|` and
    /// `c_ij` (0 without C), for `alpha`, `beta`.
    fn add(&mut self, idx: usize, out: f64, exact: f64, magnitude: f64, c: f64, ab: (f64, f64)) {
        let (alpha, beta) = ab;
        let want = alpha * exact + beta * c;
        let tol = self.bound.relative * (alpha.abs() * magnitude + (beta * c).abs())
            + self.bound.absolute;
        let err = (out - want).abs();
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else {
            err / tol.max(f64::MIN_POSITIVE)
        };
        self.elements += 1;
        if ratio > 1.0 {
            self.mismatches += 1;
        }
        if ratio > self.worst_ratio || (ratio.is_infinite() && self.worst_ratio.is_finite()) {
            self.worst_ratio = ratio;
            self.worst_index = idx;
        }
        if err.is_finite() {
            self.max_abs_error = self.max_abs_error.max(err);
        }
    }

    /// Adds the report of the elements that follow this one's (the same bound): the result is
    /// the report of one pass over both, in order.
    fn merge(&mut self, later: CheckReport) {
        self.elements += later.elements;
        self.mismatches += later.mismatches;
        self.max_abs_error = self.max_abs_error.max(later.max_abs_error);
        if later.worst_ratio > self.worst_ratio {
            self.worst_ratio = later.worst_ratio;
            self.worst_index = later.worst_index;
        }
    }
}

/// What [`compare`] needs of one element besides the outputs' values: the exact `Σ a·b`
/// (times the scales on the FP8 path), its magnitude `Σ |a·b|` (likewise) and `c_ij` (0
/// without C).
struct Expected {
    exact: f64,
    magnitude: f64,
    c: f64,
}

/// The elements to compare: all M·N of them, or a sample of flat indices.
#[derive(Clone, Copy)]
enum Elements<'a> {
    All(usize),
    Sample(&'a [usize]),
}

impl Elements<'_> {
    fn len(self) -> usize {
        match self {
            Elements::All(count) => count,
            Elements::Sample(indices) => indices.len(),
        }
    }

    /// The flat index of the `position`-th element compared.
    fn at(self, position: usize) -> usize {
        match self {
            Elements::All(_) => position,
            Elements::Sample(indices) => indices[position],
        }
    }
}

/// Elements below which a comparison runs on the calling thread only.
const ELEMENTS_PER_THREAD: usize = 1024;

/// Compares `elements` of each of `outputs` with `bound` and `alpha`, `beta` (`scalars`),
/// `expected(idx)` giving each element's reference values, on every core (at most 32 threads):
/// each element is a K-long f64 dot product, and checking all of D is M·N·K of them (8·10⁹
/// for 2048³), computed once however many outputs share it. Contiguous runs of positions go to
/// the threads and their reports are merged in order, so each output's report is the one a
/// single pass would give (the worst element is the first of the largest ratio).
fn compare<T: Element>(
    bound: ErrorBound,
    scalars: (f64, f64),
    elements: Elements<'_>,
    outputs: &[&[T]],
    expected: impl Fn(usize) -> Expected + Sync,
) -> Vec<CheckReport> {
    let count = elements.len();
    let run = |positions: std::ops::Range<usize>| {
        let mut reports = vec![CheckReport::new(bound); outputs.len()];
        for position in positions {
            let idx = elements.at(position);
            let e = expected(idx);
            for (report, d) in reports.iter_mut().zip(outputs) {
                let out = f64::from(d[idx].to_f32());
                report.add(idx, out, e.exact, e.magnitude, e.c, scalars);
            }
        }
        reports
    };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = cores
        .min(32)
        .min(count.div_ceil(ELEMENTS_PER_THREAD))
        .max(1);
    if threads == 1 {
        return run(0..count);
    }
    let per = count.div_ceil(threads);
    std::thread::scope(|s| {
        let run = &run;
        let handles: Vec<_> = (0..count)
            .step_by(per)
            .map(|start| s.spawn(move || run(start..(start + per).min(count))))
            .collect();
        let mut reports = vec![CheckReport::new(bound); outputs.len()];
        for handle in handles {
            match handle.join() {
                Ok(parts) => {
                    for (report, part) in reports.iter_mut().zip(parts) {
                        report.merge(part);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        reports
    })
}

/// [`compare`] on one output.
fn compare_one<T: Element>(
    bound: ErrorBound,
    scalars: (f64, f64),
    elements: Elements<'_>,
    d: &[T],
    expected: impl Fn(usize) -> Expected + Sync,
) -> CheckReport {
    let reports = compare(bound, scalars, elements, &[d], expected);
    reports
        .into_iter()
        .next()
        .unwrap_or_else(|| CheckReport::new(bound))
}

/// The operand lengths of a check (elements of A, B, optional C, D) against `problem`: A is
/// M×K, B N×K, C and D M×N, and C is required when beta ≠ 0.
fn check_operand_sizes(
    problem: &Problem,
    a: usize,
    b: usize,
    c: Option<usize>,
    d: usize,
) -> Result<(), SizeError> {
    let (m, n, k) = (problem.m, problem.n, problem.k);
    SizeError::check("A", a, m * k)?;
    SizeError::check("B", b, n * k)?;
    check_output_sizes(problem, c, d)
}

/// The M×N lengths of a check's optional C and D against `problem` (C required when
/// beta ≠ 0).
fn check_output_sizes(problem: &Problem, c: Option<usize>, d: usize) -> Result<(), SizeError> {
    let elements = problem.m * problem.n;
    match c {
        Some(c) => SizeError::check("C", c, elements)?,
        None if problem.beta != 0.0 => {
            return Err(SizeError::MissingC { beta: problem.beta });
        }
        None => {}
    }
    SizeError::check("D", d, elements)
}

/// Element `idx` of an optional C, widened (0 without C).
fn c_at<T: Element>(c: Option<&[T]>, idx: usize) -> f64 {
    c.map_or(0.0, |c| f64::from(c[idx].to_f32()))
}

/// `(Σ x·y, Σ |x·y|)` over `pairs` in f64, in order, from 0: the two sums of each element of
/// the reference. Products of 16-bit or e4m3 values are exact in f64, so only the additions
/// round.
fn dot(pairs: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    pairs.fold((0.0, 0.0), |(exact, magnitude), (x, y)| {
        let product = x * y;
        (exact + product, magnitude + product.abs())
    })
}

/// Global operands of a check: A (M×K), B (N×K), optional C (M×N), all packed row-major.
#[derive(Clone, Copy, Debug)]
pub struct CheckInputs<'a, T> {
    /// A.
    pub a: &'a [T],
    /// B.
    pub b: &'a [T],
    /// C (when beta ≠ 0).
    pub c: Option<&'a [T]>,
}

impl<T: Element> CheckInputs<'_, T> {
    /// A, B, C (required when beta ≠ 0) and `d` have the sizes of `problem`.
    fn check_sizes(&self, problem: &Problem, d: &[T]) -> Result<(), SizeError> {
        check_operand_sizes(
            problem,
            self.a.len(),
            self.b.len(),
            self.c.map(<[T]>::len),
            d.len(),
        )
    }

    /// Compares `elements` of `d` (sizes checked) with the bound of [`ErrorBound::new`].
    fn compare(
        &self,
        problem: &Problem,
        roundings: usize,
        tp: usize,
        d: &[T],
        elements: Elements<'_>,
    ) -> CheckReport {
        let (n, k) = (problem.n, problem.k);
        let bound = ErrorBound::new(problem.dtype, roundings, k, tp);
        let scalars = (f64::from(problem.alpha), f64::from(problem.beta));
        compare_one(bound, scalars, elements, d, |idx| {
            let (i, j) = (idx / n, idx % n);
            let (row, col) = (&self.a[i * k..(i + 1) * k], &self.b[j * k..(j + 1) * k]);
            let widened = |x: &T| f64::from(x.to_f32());
            let (exact, magnitude) = dot(row.iter().map(widened).zip(col.iter().map(widened)));
            Expected {
                exact,
                magnitude,
                c: c_at(self.c, idx),
            }
        })
    }
}

/// `Ok` when every flat index of a sample is inside `problem`'s M×N output.
fn check_sample(problem: &Problem, indices: &[usize]) -> Result<(), SizeError> {
    let elements = problem.m * problem.n;
    match indices.iter().find(|&&i| i >= elements) {
        Some(&bad) => Err(SizeError::Elements {
            matrix: format!("the sample (index {bad})"),
            got: bad + 1,
            expected: elements,
        }),
        None => Ok(()),
    }
}

/// Compares `d` (global M×N) against `alpha·A·Bᵀ + beta·C` computed in f64, element by element,
/// with the bound of the module documentation. Operands of the wrong size, or no C while
/// beta ≠ 0, are a [`SizeError`] (never a verdict computed on missing data).
pub fn check<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    inputs: CheckInputs<'_, T>,
    d: &[T],
) -> Result<CheckReport, SizeError> {
    inputs.check_sizes(problem, d)?;
    Ok(inputs.compare(
        problem,
        roundings,
        tp,
        d,
        Elements::All(problem.m * problem.n),
    ))
}

/// As [`check`], on the elements `indices` (flat `i·N + j`, each below M·N) only: each costs
/// one f64 dot product of length K, so a few thousand elements check a problem of any size in
/// milliseconds with the same per-element bound. It proves those elements right, and finds a
/// wrong tile, stage or shard only if an index falls in it (choose the indices accordingly).
pub fn check_sampled<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    inputs: CheckInputs<'_, T>,
    d: &[T],
    indices: &[usize],
) -> Result<CheckReport, SizeError> {
    inputs.check_sizes(problem, d)?;
    check_sample(problem, indices)?;
    Ok(inputs.compare(problem, roundings, tp, d, Elements::Sample(indices)))
}

/// Each element's `Σ_k a_ik·b_jk` (`exact`) and `Σ_k |a_ik·b_jk|` (`magnitude`) of an M×N
/// product, row-major, in f64: the M·N·K part of a check. Given them (from the GPU by
/// [`gpu::products`], at sizes where the host's loop would take minutes), [`check_products`]
/// and [`check_scaled_products`] compare every element of D in M·N steps with the bounds of
/// [`check`] and [`check_scaled`]. On the FP8 path the sums are of the e4m3 codes, unscaled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Products {
    /// `Σ_k a_ik·b_jk` at `i·N + j`.
    pub exact: Vec<f64>,
    /// `Σ_k |a_ik·b_jk|` at `i·N + j`.
    pub magnitude: Vec<f64>,
}

impl Products {
    /// Both sums have M·N elements.
    fn check_sizes(&self, problem: &Problem) -> Result<(), SizeError> {
        let elements = problem.m * problem.n;
        SizeError::check("the products' exact sums", self.exact.len(), elements)?;
        SizeError::check("the products' magnitudes", self.magnitude.len(), elements)
    }

    /// Element `idx`'s values for the comparison, its sums times `scale` (1 unscaled).
    fn expected(&self, idx: usize, scale: f64, c: f64) -> Expected {
        Expected {
            exact: scale * self.exact[idx],
            magnitude: scale.abs() * self.magnitude[idx],
            c,
        }
    }
}

/// As [`check`], with each element's sums taken from `products` instead of computed from A
/// and B: every element of `d` against `alpha·Σ a·b + beta·c` with the same bound.
/// Products, C or D of the wrong size, or no C while beta ≠ 0, are a [`SizeError`].
pub fn check_products<T: Element>(
    problem: &Problem,
    roundings: usize,
    tp: usize,
    products: &Products,
    c: Option<&[T]>,
    d: &[T],
) -> Result<CheckReport, SizeError> {
    products.check_sizes(problem)?;
    check_output_sizes(problem, c.map(<[T]>::len), d.len())?;
    let bound = ErrorBound::new(problem.dtype, roundings, problem.k, tp);
    let scalars = (f64::from(problem.alpha), f64::from(problem.beta));
    let all = Elements::All(problem.m * problem.n);
    Ok(compare_one(bound, scalars, all, d, |idx| {
        products.expected(idx, 1.0, c_at(c, idx))
    }))
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    fn el(v: &[f32]) -> Vec<bf16> {
        v.iter().map(|&x| bf16::from_f32(x)).collect()
    }

    #[test]
    fn f64_reference_is_a_times_b_transposed() {
        // A = [[1,2],[3,4]], B = [[5,6],[7,8]] → A·Bᵀ = [[17,23],[39,53]].
        let d = gemm_f64(
            2,
            2,
            2,
            &el(&[1., 2., 3., 4.]),
            2,
            &el(&[5., 6., 7., 8.]),
            2,
        );
        assert_eq!(d, vec![17.0, 23.0, 39.0, 53.0]);
    }

    #[test]
    fn stage_arithmetic_matches_f64_on_exact_values_and_check_catches_errors() {
        let (a, b, c) = (
            el(&[1., 2., 3., 4.]),
            el(&[5., 6., 7., 8.]),
            el(&[1., 1., 1., 1.]),
        );
        let d = gemm_like_stage(2, 2, 2, &a, 2, &b, 2, 0.5, 2.0, Some(&c));
        let want: Vec<bf16> = el(&[10.5, 13.5, 21.5, 28.5]);
        assert_eq!(d, want);
        let problem = Problem::new(2, 2, 2).with_scalars(0.5, 2.0);
        let inputs = CheckInputs {
            a: &a,
            b: &b,
            c: Some(&c),
        };
        let run = |d: &[bf16]| check(&problem, 1, 1, inputs, d).unwrap_or_else(|e| panic!("{e}"));
        assert!(run(&d).passed());
        let mut wrong = d.clone();
        wrong[3] = bf16::from_f32(29.0);
        let report = run(&wrong);
        assert_eq!((report.mismatches, report.worst_index), (1, 3));
        let sampled = check_sampled(&problem, 1, 1, inputs, &wrong, &[0, 3])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (sampled.elements, sampled.mismatches, sampled.worst_index),
            (2, 1, 3)
        );
        assert_eq!(sampled.worst_ratio, report.worst_ratio);
        let clean = check_sampled(&problem, 1, 1, inputs, &wrong, &[0, 1, 2])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(clean.passed());
        wrong[3] = bf16::NAN;
        assert!(run(&wrong).worst_ratio.is_infinite());
    }

    #[test]
    fn a_check_spread_over_threads_reports_what_one_pass_would() {
        // 96×80 outputs (7 680, several threads' worth): the stage arithmetic's D with two
        // wrong elements of one ratio (NaN) and one smaller error between them in index order.
        let (m, n, k) = (96, 80, 24);
        let value = |i: usize| ((i * 37 % 101) as f32 - 50.0) / 16.0;
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(value(i))).collect();
        let b: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(value(i + 7))).collect();
        let mut d = gemm_like_stage(m, n, k, &a, k, &b, k, 1.0, 0.0, None);
        let problem = Problem::new(m, n, k);
        let inputs = CheckInputs {
            a: &a,
            b: &b,
            c: None,
        };
        let (first, off, last) = (1500, 4000, 7000);
        d[first] = bf16::NAN;
        d[off] = bf16::from_f32(d[off].to_f32() + 64.0);
        d[last] = bf16::NAN;
        let report = check(&problem, 1, 1, inputs, &d).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (report.elements, report.mismatches, report.worst_index),
            (m * n, 3, first)
        );
        assert!(report.worst_ratio.is_infinite());
        let every: Vec<usize> = (0..m * n).rev().collect();
        let reversed =
            check_sampled(&problem, 1, 1, inputs, &d, &every).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                reversed.mismatches,
                reversed.worst_index,
                reversed.max_abs_error
            ),
            (3, last, report.max_abs_error)
        );
    }

    /// The products of packed A (m×k) and B (n×k) by the host's loop.
    fn host_products<T: Element>(m: usize, n: usize, k: usize, a: &[T], b: &[T]) -> Products {
        let widened = |x: &T| f64::from(x.to_f32());
        let (exact, magnitude) = (0..m * n)
            .map(|idx| {
                let (row, col) = (&a[idx / n * k..][..k], &b[idx % n * k..][..k]);
                dot(row.iter().map(widened).zip(col.iter().map(widened)))
            })
            .unzip();
        Products { exact, magnitude }
    }

    #[test]
    fn a_check_on_given_products_is_the_check_on_the_operands() {
        // 40×24×56 with C and a wrong element: the report is the one `check` gives.
        let (m, n, k) = (40, 24, 56);
        let value = |i: usize| ((i * 53 % 97) as f32 - 48.0) / 8.0;
        let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(value(i))).collect();
        let b: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(value(i + 11))).collect();
        let c: Vec<bf16> = (0..m * n).map(|i| bf16::from_f32(value(i + 5))).collect();
        let mut d = gemm_like_stage(m, n, k, &a, k, &b, k, 0.75, -1.5, Some(&c));
        d[m * n / 2] = bf16::from_f32(d[m * n / 2].to_f32() * 2.0 + 1.0);
        let problem = Problem::new(m, n, k).with_scalars(0.75, -1.5);
        let inputs = CheckInputs {
            a: &a,
            b: &b,
            c: Some(&c),
        };
        let products = host_products(m, n, k, &a, &b);
        let want = check(&problem, 1, 2, inputs, &d).unwrap_or_else(|e| panic!("{e}"));
        let got = check_products(&problem, 1, 2, &products, Some(&c), &d)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want);
        assert_eq!((got.mismatches, got.worst_index), (1, m * n / 2));
        // Wrong sizes are errors: products, C, D; and no C while beta ≠ 0.
        let short = Products {
            exact: products.exact[1..].to_vec(),
            ..products.clone()
        };
        assert!(check_products(&problem, 1, 2, &short, Some(&c), &d).is_err());
        assert!(check_products(&problem, 1, 2, &products, Some(&c[1..]), &d).is_err());
        assert!(check_products(&problem, 1, 2, &products, Some(&c), &d[1..]).is_err());
        assert_eq!(
            check_products(&problem, 1, 2, &products, None, &d).err(),
            Some(SizeError::MissingC { beta: -1.5 })
        );
    }

    #[test]
    fn short_operands_and_missing_c_are_errors_not_verdicts() {
        let (a, b, c) = (el(&[1., 2., 3., 4.]), el(&[5., 6., 7., 8.]), el(&[1.; 4]));
        let problem = Problem::new(2, 2, 2).with_scalars(1.0, 1.0);
        let d = el(&[18., 24., 40., 54.]);
        let inputs = CheckInputs {
            a: &a,
            b: &b,
            c: None,
        };
        assert_eq!(
            check(&problem, 1, 1, inputs, &d).err(),
            Some(SizeError::MissingC { beta: 1.0 })
        );
        let inputs = CheckInputs {
            c: Some(&c),
            ..inputs
        };
        assert!(check(&problem, 1, 1, inputs, &d).is_ok_and(|r| r.passed()));
        let short = CheckInputs {
            a: &a[..3],
            ..inputs
        };
        assert!(matches!(
            check(&problem, 1, 1, short, &d),
            Err(SizeError::Elements {
                got: 3,
                expected: 4,
                ..
            })
        ));
        assert!(check(&problem, 1, 1, inputs, &d[..3]).is_err());
        assert!(check_sampled(&problem, 1, 1, inputs, &d, &[4]).is_err());
    }
}
