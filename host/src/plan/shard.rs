//! Moving between global matrices and per-device shards, as the plan's shard layouts say.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};
use thiserror::Error;

use super::Plan;
use crate::dtype::Element;
use crate::problem::Problem;

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
}

impl SizeError {
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
        let c = match (p.has_c(), &inputs.c) {
            (false, _) => None,
            (true, None) => return Err(SizeError::MissingC { beta: p.beta }),
            (true, Some(c)) => {
                SizeError::check("C", c.len(), p.m * p.n)?;
                Some(c)
            }
        };
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

    #[test]
    fn random_inputs_have_no_zeros() {
        let inputs = GlobalInputs::<bf16>::random(&Problem::new(16, 16, 64), 7);
        assert!(inputs.a.iter().chain(&inputs.b).all(|x| x.to_f32() != 0.0));
        assert!(inputs.c.is_none());
    }
}
