//! Helpers of the CPU-executor tests (valid random shapes per schedule, and a checked run),
//! the shape units also used by the GPU tests' random shapes.

use distgemm::cpu::CpuExecutor;
use distgemm::dtype::Element;
use distgemm::plan::{GlobalInputs, Plan};
use distgemm::reference::{CheckInputs, CheckReport, check};
use distgemm::schedule::{Collective, ScheduleKind};
use proptest::prelude::*;

/// The units (M, N, K) of `kind`'s shapes at `tp`: each dimension must be a multiple of its
/// unit. A dimension TP splits is a multiple of TP (of 8·TP where its TP-slice is a view
/// offset or leading dimension); K and every leading dimension a multiple of 8.
pub fn shape_units(kind: ScheduleKind, tp: usize) -> (usize, usize, usize) {
    let splits_m = kind.collective() == Collective::AllGather || kind.tiles_rows();
    let m_unit = if splits_m { tp } else { 1 };
    let n_unit = match kind {
        ScheduleKind::ReduceScatterTilingA | ScheduleKind::ReduceScatterSingleStageA => 8,
        ScheduleKind::AllGatherSingleStageB => num_lcm(tp, 8),
        _ => 8 * tp,
    };
    let k_unit = if kind.collective() == Collective::ReduceScatter {
        8 * tp
    } else {
        8
    };
    (m_unit, n_unit, k_unit)
}

/// Random (M, N, K) meeting `kind`'s constraints at `tp` ([`shape_units`]), kept small for
/// debug builds.
pub fn shape(kind: ScheduleKind, tp: usize) -> impl Strategy<Value = (usize, usize, usize)> {
    let (m_unit, n_unit, k_unit) = shape_units(kind, tp);
    (1..=24 / m_unit.min(24) + 1, 1..=2usize, 1..=2usize)
        .prop_map(move |(m, n, k)| (m * m_unit, n * n_unit, k * k_unit))
}

/// Least common multiple of `tp` and 8: the smallest multiple of 8 that `tp` divides.
fn num_lcm(tp: usize, eight: usize) -> usize {
    (1..=tp)
        .map(|i| i * eight)
        .find(|x| x.is_multiple_of(tp))
        .unwrap_or(tp * eight)
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
