//! Helpers of the CPU-executor tests: valid random shapes per schedule, and a checked run.

use distgemm::cpu::CpuExecutor;
use distgemm::dtype::Element;
use distgemm::plan::{GlobalInputs, Plan};
use distgemm::reference::{CheckInputs, CheckReport, check};
use distgemm::schedule::ScheduleKind;
use proptest::prelude::*;

use crate::shapes::shape_units;

/// Random (M, N, K) meeting `kind`'s constraints at `tp` ([`shape_units`]), kept small for
/// debug builds.
pub fn shape(kind: ScheduleKind, tp: usize) -> impl Strategy<Value = (usize, usize, usize)> {
    let (m_unit, n_unit, k_unit) = shape_units(kind, tp);
    (1..=24 / m_unit.min(24) + 1, 1..=2usize, 1..=2usize)
        .prop_map(move |(m, n, k)| (m * m_unit, n * n_unit, k * k_unit))
}

/// Loads fresh random inputs (from `seed`), poisons outputs and workspace with NaN, runs
/// `iters` back-to-back iterations and checks every element of D against the f64 reference.
/// Returns the inputs, the gathered D and the report.
pub fn run_checked<T: Element>(
    exec: &mut CpuExecutor<T>,
    seed: u64,
    iters: usize,
) -> (GlobalInputs<T>, Vec<T>, CheckReport) {
    let plan: &Plan = exec.plan();
    let problem = plan.problem;
    let inputs = GlobalInputs::<T>::random(&problem, seed);
    let shards = plan
        .shard_inputs(&inputs)
        .unwrap_or_else(|e| panic!("shard: {e}"));
    exec.load_inputs(&shards)
        .unwrap_or_else(|e| panic!("load: {e}"));
    exec.poison();
    exec.run(iters).unwrap_or_else(|e| panic!("run: {e}"));
    let d = exec
        .gathered_output()
        .unwrap_or_else(|e| panic!("gather: {e}"));
    let plan = exec.plan();
    let report = check(
        &problem,
        plan.schedule.roundings(plan.tp),
        plan.tp,
        CheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            c: inputs.c.as_deref(),
        },
        &d,
    )
    .unwrap_or_else(|e| panic!("check: {e}"));
    (inputs, d, report)
}
