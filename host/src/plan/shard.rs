//! Moving between global matrices and per-device shards, as the plan's shard layouts say.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};

use super::Plan;
use crate::dtype::Element;
use crate::problem::Problem;

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
    /// Splits global operands into every device's shards.
    #[must_use]
    pub fn shard_inputs<T: Element>(&self, inputs: &GlobalInputs<T>) -> Vec<DeviceInputs<T>> {
        let p = &self.problem;
        self.devices
            .iter()
            .map(|dev| DeviceInputs {
                a: dev.shards.a.extract(&inputs.a, p.k),
                b: dev.shards.b.extract(&inputs.b, p.k),
                c: dev
                    .shards
                    .c
                    .zip(inputs.c.as_ref())
                    .map(|(block, c)| block.extract(c, p.n)),
            })
            .collect()
    }

    /// Assembles the global D (M×N) from every device's output shard.
    #[must_use]
    pub fn gather_output<T: Element>(&self, outputs: &[Vec<T>]) -> Vec<T> {
        let p = &self.problem;
        let mut d = vec![T::nan(); p.m * p.n];
        for (dev, out) in self.devices.iter().zip(outputs) {
            dev.shards.d.insert(out, &mut d, p.n);
        }
        d
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
            let d = plan.gather_output(&outputs);
            assert!(d.iter().all(|x| !x.is_nan()), "{kind}: D not covered");
            let total: usize = plan.devices.iter().map(|d| d.shards.d.elements()).sum();
            assert_eq!(total, 48 * 48, "{kind}: shards overlap");
        }
    }

    #[test]
    fn random_inputs_have_no_zeros() {
        let inputs = GlobalInputs::<bf16>::random(&Problem::new(16, 16, 64), 7);
        assert!(inputs.a.iter().chain(&inputs.b).all(|x| x.to_f32() != 0.0));
        assert!(inputs.c.is_none());
    }
}
