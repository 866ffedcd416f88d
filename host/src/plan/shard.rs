//! Moving between global matrices and per-device shards, as the plan's shard layouts say.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use thiserror::Error;

use super::Plan;
use crate::dtype::Element;
use crate::fp8::{E4m3, ScaleMode, Scales};
use crate::problem::Problem;
use crate::schedule::Block;

/// Operands or outputs whose sizes do not match the problem or the plan.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum SizeError {
    /// A matrix with the wrong number of elements.
    #[error("{matrix} has {got} elements, the problem needs {expected}")]
    Elements {
        /// Which matrix (e.g. "A", "D", "output shard of device 1").
        matrix: String,
        /// Elements given.
        got: usize,
        /// Elements needed.
        expected: usize,
    },
    /// The wrong number of per-device pieces.
    #[error("{got} {what} given, the plan has {expected} devices")]
    Count {
        /// What was counted (e.g. "output shards").
        what: &'static str,
        /// Pieces given.
        got: usize,
        /// Devices of the plan.
        expected: usize,
    },
    /// beta ≠ 0 but no C.
    #[error("beta={beta} needs C, but none was given")]
    MissingC {
        /// The problem's beta.
        beta: f32,
    },
    /// An FP8 scale that is not finite or is below [`crate::fp8::MIN_SCALE`].
    #[error(transparent)]
    ScaleValue(#[from] crate::fp8::ScaleValueError),
    /// FP8 scales of the other mode than the problem's.
    #[error("the scales are {} but the problem's are {}", got.name(), expected.name())]
    ScaleMode {
        /// The mode given.
        got: ScaleMode,
        /// The problem's.
        expected: ScaleMode,
    },
}

impl SizeError {
    /// The C to shard: `None` when beta is 0 (a C given is ignored), else `c`, which must be
    /// there ([`SizeError::MissingC`]) with M·N elements.
    fn checked_c<'c, T>(p: &Problem, c: Option<&'c [T]>) -> Result<Option<&'c [T]>, SizeError> {
        match (p.has_c(), c) {
            (false, _) => Ok(None),
            (true, None) => Err(SizeError::MissingC { beta: p.beta }),
            (true, Some(c)) => {
                SizeError::check("C", c.len(), p.m * p.n)?;
                Ok(Some(c))
            }
        }
    }

    /// `Ok` when `got == expected`, else [`SizeError::Elements`] naming `matrix`.
    pub(crate) fn check(matrix: &str, got: usize, expected: usize) -> Result<(), SizeError> {
        if got == expected {
            Ok(())
        } else {
            Err(SizeError::Elements {
                matrix: matrix.to_owned(),
                got,
                expected,
            })
        }
    }
}

/// The global operands: A (M×K), B (N×K) and C (M×N, when beta ≠ 0), packed row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalInputs<T> {
    /// A.
    pub a: Vec<T>,
    /// B.
    pub b: Vec<T>,
    /// C.
    pub c: Option<Vec<T>>,
}

/// `len` samples of N(0, 1) rounded to `T`, never exactly zero (a zero could hide a missing
/// contribution).
#[must_use]
pub fn random_normal<T: Element>(len: usize, rng: &mut StdRng) -> Vec<T> {
    (0..len)
        .map(|_| {
            loop {
                let x: f32 = StandardNormal.sample(rng);
                let v = T::from_f32(x);
                if v.to_f32() != 0.0 {
                    break v;
                }
            }
        })
        .collect()
}

impl<T: Element> GlobalInputs<T> {
    /// Random normal operands for `problem` (C only when beta ≠ 0), reproducible from `seed`.
    #[must_use]
    pub fn random(problem: &Problem, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let a = random_normal(problem.m * problem.k, &mut rng);
        let b = random_normal(problem.n * problem.k, &mut rng);
        let c = problem
            .has_c()
            .then(|| random_normal(problem.m * problem.n, &mut rng));
        GlobalInputs { a, b, c }
    }
}

/// One device's input shards (packed, as [`crate::schedule::ShardLayout`] describes).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInputs<T> {
    /// Shard of A.
    pub a: Vec<T>,
    /// Shard of B.
    pub b: Vec<T>,
    /// Shard of C.
    pub c: Option<Vec<T>>,
}

impl Plan {
    /// Splits global operands into every device's shards. A must have M·K elements, B N·K,
    /// and C M·N when beta ≠ 0 (C is ignored when beta = 0).
    pub fn shard_inputs<T: Element>(
        &self,
        inputs: &GlobalInputs<T>,
    ) -> Result<Vec<DeviceInputs<T>>, SizeError> {
        let p = &self.problem;
        SizeError::check("A", inputs.a.len(), p.m * p.k)?;
        SizeError::check("B", inputs.b.len(), p.n * p.k)?;
        let c = SizeError::checked_c(p, inputs.c.as_deref())?;
        Ok(self
            .devices
            .iter()
            .map(|dev| DeviceInputs {
                a: dev.shards.a.extract(&inputs.a, p.k),
                b: dev.shards.b.extract(&inputs.b, p.k),
                c: dev.shards.c.zip(c).map(|(block, c)| block.extract(c, p.n)),
            })
            .collect())
    }

    /// Assembles the global D (M×N) from every device's output shard (one per device, each
    /// with the elements of the device's D block).
    pub fn gather_output<T: Element>(&self, outputs: &[Vec<T>]) -> Result<Vec<T>, SizeError> {
        if outputs.len() != self.devices.len() {
            return Err(SizeError::Count {
                what: "output shards",
                got: outputs.len(),
                expected: self.devices.len(),
            });
        }
        for (dev, out) in self.devices.iter().zip(outputs) {
            let matrix = format!("the output shard of device {}", dev.device);
            SizeError::check(&matrix, out.len(), dev.shards.d.elements())?;
        }
        let p = &self.problem;
        let mut d = vec![T::nan(); p.m * p.n];
        for (dev, out) in self.devices.iter().zip(outputs) {
            dev.shards.d.insert(out, &mut d, p.n);
        }
        Ok(d)
    }
}

/// The global operands of an FP8 problem: A (M×K) and B (N×K) as e4m3 codes, their
/// [`Scales`] and C (M×N, output type, when beta ≠ 0), packed row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Inputs<T> {
    /// A.
    pub a: Vec<E4m3>,
    /// B.
    pub b: Vec<E4m3>,
    /// The scales of A and B.
    pub scales: Scales,
    /// C.
    pub c: Option<Vec<T>>,
}

/// `len` e4m3 codes of `16·x`, x from N(0, 1), never zero (16σ keeps typical values in the
/// normal range, well below the saturation at 448).
pub(crate) fn random_e4m3(len: usize, rng: &mut StdRng) -> Vec<E4m3> {
    (0..len)
        .map(|_| {
            loop {
                let x: f32 = StandardNormal.sample(rng);
                let v = E4m3::from_f32(16.0 * x);
                if v.to_f32() != 0.0 {
                    break v;
                }
            }
        })
        .collect()
}

/// `len` positive scales `2^u`, u uniform in [−6, −2): a product `sa·sb` of at most 2^-4
/// keeps `Σ_k a·b` of 16σ codes far inside f16's range for every preset's K.
pub(crate) fn random_scales(len: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..len)
        .map(|_| 2f32.powf(rng.random_range(-6.0f32..-2.0)))
        .collect()
}

impl<T: Element> Fp8Inputs<T> {
    /// Random operands for `problem` (e4m3 codes never zero, positive scales in the problem's
    /// mode, tensor-wise when it has no FP8 description; C only when beta ≠ 0), reproducible
    /// from `seed`.
    #[must_use]
    pub fn random(problem: &Problem, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let a = random_e4m3(problem.m * problem.k, &mut rng);
        let b = random_e4m3(problem.n * problem.k, &mut rng);
        let mode = problem.fp8.map_or(ScaleMode::Tensorwise, |f| f.scales);
        let scales = match mode {
            ScaleMode::Tensorwise => {
                let s = random_scales(2, &mut rng);
                Scales::Tensorwise { a: s[0], b: s[1] }
            }
            ScaleMode::Rowwise => Scales::Rowwise {
                a: random_scales(problem.m, &mut rng),
                b: random_scales(problem.n, &mut rng),
            },
        };
        let c = problem
            .has_c()
            .then(|| random_normal(problem.m * problem.n, &mut rng));
        Fp8Inputs { a, b, scales, c }
    }
}

/// One device's FP8 input shards: the codes of its A and B blocks, their scales (row-wise:
/// one per row of each block, in block order; tensor-wise: the global pair) and its C block.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8DeviceInputs<T> {
    /// Shard of A.
    pub a: Vec<E4m3>,
    /// Shard of B.
    pub b: Vec<E4m3>,
    /// The scales of the shards' rows.
    pub scales: Scales,
    /// Shard of C.
    pub c: Option<Vec<T>>,
}

/// The scales of the rows of blocks `a` and `b` (all of them when tensor-wise).
fn block_scales(scales: &Scales, a: &Block, b: &Block) -> Scales {
    match scales {
        Scales::Tensorwise { a, b } => Scales::Tensorwise { a: *a, b: *b },
        Scales::Rowwise { a: sa, b: sb } => Scales::Rowwise {
            a: sa[a.row0..a.row0 + a.rows].to_vec(),
            b: sb[b.row0..b.row0 + b.rows].to_vec(),
        },
    }
}

impl Plan {
    /// Splits global FP8 operands into every device's shards, as [`Plan::shard_inputs`] does,
    /// with each shard's row-wise scales beside its rows. A must have M·K codes, B N·K, the
    /// scales the problem's mode (row-wise: M and N of them), and C M·N elements when
    /// beta ≠ 0.
    pub fn shard_fp8_inputs<T: Element>(
        &self,
        inputs: &Fp8Inputs<T>,
    ) -> Result<Vec<Fp8DeviceInputs<T>>, SizeError> {
        let p = &self.problem;
        SizeError::check("A", inputs.a.len(), p.m * p.k)?;
        SizeError::check("B", inputs.b.len(), p.n * p.k)?;
        let mode = p.fp8.map_or(ScaleMode::Tensorwise, |f| f.scales);
        if inputs.scales.mode() != mode {
            return Err(SizeError::ScaleMode {
                got: inputs.scales.mode(),
                expected: mode,
            });
        }
        inputs.scales.validate(p.m, p.n)?;
        let c = SizeError::checked_c(p, inputs.c.as_deref())?;
        Ok(self
            .devices
            .iter()
            .map(|dev| Fp8DeviceInputs {
                a: dev.shards.a.extract(&inputs.a, p.k),
                b: dev.shards.b.extract(&inputs.b, p.k),
                scales: block_scales(&inputs.scales, &dev.shards.a, &dev.shards.b),
                c: dev.shards.c.zip(c).map(|(block, c)| block.extract(c, p.n)),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::schedule::ScheduleKind;

    #[test]
    fn output_shards_tile_d_exactly_once() {
        for kind in ScheduleKind::ALL {
            let plan =
                Plan::build(kind, Problem::new(48, 48, 48), 3).unwrap_or_else(|e| panic!("{e}"));
            let outputs: Vec<Vec<bf16>> = plan
                .devices
                .iter()
                .map(|d| vec![bf16::from_f32(d.device as f32); d.shards.d.elements()])
                .collect();
            let d = plan
                .gather_output(&outputs)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(d.iter().all(|x| !x.is_nan()), "{kind}: D not covered");
            let total: usize = plan.devices.iter().map(|d| d.shards.d.elements()).sum();
            assert_eq!(total, 48 * 48, "{kind}: shards overlap");
        }
    }

    #[test]
    fn short_inputs_and_outputs_are_size_errors() {
        let problem = Problem::new(16, 16, 16).with_scalars(1.0, 0.5);
        let plan = Plan::build(ScheduleKind::AllGatherRotatingA, problem, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut inputs = GlobalInputs::<bf16>::random(&problem, 1);
        assert!(plan.shard_inputs(&inputs).is_ok());
        let c = inputs.c.take();
        assert_eq!(
            plan.shard_inputs(&inputs).err(),
            Some(SizeError::MissingC { beta: 0.5 })
        );
        inputs.c = c;
        inputs.a.truncate(8);
        assert_eq!(
            plan.shard_inputs(&inputs).err().map(|e| e.to_string()),
            Some("A has 8 elements, the problem needs 256".to_owned())
        );
        let one = vec![vec![bf16::ONE; 128]];
        assert_eq!(
            plan.gather_output(&one).err().map(|e| e.to_string()),
            Some("1 output shards given, the plan has 2 devices".to_owned())
        );
        let short = vec![vec![bf16::ONE; 128], vec![bf16::ONE; 127]];
        assert!(matches!(
            plan.gather_output(&short),
            Err(SizeError::Elements {
                got: 127,
                expected: 128,
                ..
            })
        ));
    }

    /// Row-wise scales go with their rows: device d's scales are those of its blocks' global
    /// rows; tensor-wise ones are the global pair everywhere. A mode other than the problem's
    /// is refused.
    #[test]
    fn fp8_shards_carry_the_scales_of_their_rows() {
        for mode in ScaleMode::ALL {
            let problem = Problem::new(48, 32, 32).with_fp8(mode);
            let plan = Plan::build(ScheduleKind::AllGatherRotatingB, problem, 4)
                .unwrap_or_else(|e| panic!("{e}"));
            let inputs = Fp8Inputs::<bf16>::random(&problem, 5);
            assert!(
                inputs
                    .a
                    .iter()
                    .chain(&inputs.b)
                    .all(|x| x.to_f32() != 0.0 && !x.is_nan())
            );
            let shards = plan
                .shard_fp8_inputs(&inputs)
                .unwrap_or_else(|e| panic!("{e}"));
            for (dev, shard) in plan.devices.iter().zip(&shards) {
                let (a, b) = (dev.shards.a, dev.shards.b);
                assert_eq!(shard.a, a.extract(&inputs.a, 32));
                assert_eq!(shard.b, b.extract(&inputs.b, 32));
                match (&inputs.scales, &shard.scales) {
                    (Scales::Rowwise { a: ga, b: gb }, Scales::Rowwise { a: sa, b: sb }) => {
                        assert_eq!(sa.as_slice(), &ga[a.row0..a.row0 + a.rows]);
                        assert_eq!(sb.as_slice(), &gb[b.row0..b.row0 + b.rows]);
                        assert!(ga.iter().chain(gb).all(|&s| s > 0.0));
                    }
                    (global, shard) => assert_eq!(global, shard),
                }
            }
            let other = ScaleMode::ALL.into_iter().find(|&m| m != mode);
            let wrong = Fp8Inputs::<bf16>::random(&problem.with_fp8(other.unwrap_or(mode)), 5);
            assert!(matches!(
                plan.shard_fp8_inputs(&wrong),
                Err(SizeError::ScaleMode { .. })
            ));
        }
    }

    #[test]
    fn random_inputs_have_no_zeros() {
        let inputs = GlobalInputs::<bf16>::random(&Problem::new(16, 16, 64), 7);
        assert!(inputs.a.iter().chain(&inputs.b).all(|x| x.to_f32() != 0.0));
        assert!(inputs.c.is_none());
    }
}
