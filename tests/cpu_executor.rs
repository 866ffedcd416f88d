//! The CPU executor against the f64 reference: every schedule, random TP 1..=8, random shapes
//! meeting the schedule's constraints, random normal data (never zero), outputs and workspace
//! poisoned with NaN before each run, several consecutive runs of one plan (fresh data each,
//! the last one two iterations back to back). Bound: `reference::check`'s
//! `|D − D_ref| ≤ 1.05·(r·u + (K+P+2)·2^-24)·(|alpha|·Σ|a·b| + |beta·c|)` per element.
//! All-gather schedules must also equal, bit for bit, a single-device GEMM computed the way the
//! stage kernel computes.

use std::time::Duration;

use distgemm::cpu::{CpuExecutor, ExecError};
use distgemm::dtype::{Dtype, Element};
use distgemm::fp8::{ScaleMode, Scales};
use distgemm::plan::{FLAG_SET_VALUE, Fp8Inputs, GlobalInputs, Node, Plan};
use distgemm::problem::Problem;
use distgemm::reference::{
    CheckInputs, CheckReport, EpilogueInput, ScaledCheckInputs, check, check_scaled,
    gemm_like_stage, gemm_scaled_f32, widen,
};
use distgemm::schedule::{Collective, FlagRef, ScheduleKind};
use distgemm_tests::cpu::{run_checked, shape};
use half::{bf16, f16};
use proptest::prelude::*;

/// Builds the plan and runs it 3 times (the last with 2 back-to-back iterations), checking
/// every element each time and, for all-gather, bit-identity with the single-device GEMM.
fn check_schedule<T: Element>(
    kind: ScheduleKind,
    tp: usize,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    beta: f32,
    seed: u64,
) {
    let beta = if kind.collective() == Collective::AllGather {
        beta
    } else {
        0.0
    };
    let problem = Problem::new(m, n, k)
        .with_dtype(T::DTYPE)
        .with_scalars(alpha, beta);
    let plan =
        Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{kind} TP={tp} {problem}: {e}"));
    let mut exec = CpuExecutor::<T>::new(plan).unwrap_or_else(|e| panic!("{e}"));
    for run in 0..3u64 {
        let iters = if run == 2 { 2 } else { 1 };
        let (inputs, d, report) = run_checked(&mut exec, seed.wrapping_add(run), iters);
        assert!(
            report.passed(),
            "{kind} TP={tp} {problem} run {run}: {report:?}"
        );
        if kind.collective() == Collective::AllGather {
            let single = gemm_like_stage(
                m,
                n,
                k,
                &inputs.a,
                k,
                &inputs.b,
                k,
                alpha,
                beta,
                inputs.c.as_deref(),
            );
            let differing = d
                .iter()
                .zip(&single)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "{kind} TP={tp} {problem}: not bit-identical to one device"
            );
        }
    }
    assert!(
        exec.exclusive_state().iter().all(|e| e.counter == 0),
        "barrier counters must return to 0"
    );
}

fn cases() -> impl Strategy<
    Value = (
        ScheduleKind,
        usize,
        (usize, usize, usize),
        bool,
        f32,
        f32,
        u64,
    ),
> {
    (
        proptest::sample::select(ScheduleKind::ALL.to_vec()),
        1..=8usize,
    )
        .prop_flat_map(|(kind, tp)| {
            (
                Just(kind),
                Just(tp),
                shape(kind, tp),
                any::<bool>(),
                proptest::sample::select(vec![1.0f32, 0.5, -1.25]),
                proptest::sample::select(vec![0.0f32, 0.75]),
                any::<u64>(),
            )
        })
}

proptest! {
    // 48 cases over 8 schedules × 8 TPs × 2 dtypes; each runs the plan 3 times (~4 s in debug).
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn every_schedule_matches_the_reference((kind, tp, dims, use_f16, alpha, beta, seed) in cases()) {
        if use_f16 {
            check_schedule::<f16>(kind, tp, dims, alpha, beta, seed);
        } else {
            check_schedule::<bf16>(kind, tp, dims, alpha, beta, seed);
        }
    }
}

#[test]
fn every_schedule_at_every_tp() {
    for kind in ScheduleKind::ALL {
        for tp in 1..=8 {
            check_schedule::<bf16>(kind, tp, (8 * tp, 8 * tp, 8 * tp), 1.0, 0.5, tp as u64);
        }
    }
}

fn executor(kind: ScheduleKind, tp: usize) -> CpuExecutor<bf16> {
    let plan = Plan::build(kind, Problem::new(16 * tp, 16 * tp, 16 * tp), tp)
        .unwrap_or_else(|e| panic!("{e}"));
    CpuExecutor::new(plan)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_timeout(Duration::from_millis(300))
}

fn mutate(exec: CpuExecutor<bf16>, f: impl FnOnce(&mut Plan)) -> CpuExecutor<bf16> {
    let mut plan = exec.plan().clone();
    f(&mut plan);
    CpuExecutor::new(plan)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_timeout(Duration::from_millis(300))
}

#[test]
fn a_misdirected_flag_set_is_a_deadlock_naming_device_stage_and_flag() {
    let exec = mutate(executor(ScheduleKind::AllGatherRotatingA, 4), |plan| {
        for node in &mut plan.devices[1].nodes {
            if let Node::FlagSet(f) = node
                && f.stage == 2
                && f.flag.device == 1
            {
                f.flag.index = 1;
            }
        }
    });
    let err = exec.run(1).expect_err("must deadlock");
    assert!(
        matches!(
            err,
            ExecError::FlagTimeout {
                device: 1,
                stage: 2,
                node: "gemm",
                flag: FlagRef {
                    device: 1,
                    index: 2
                },
                timeout,
                ..
            } if timeout == Duration::from_millis(300)
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("device 1, stage 2 (gemm)")
            && err.to_string().contains("flag 2 of device 1"),
        "{err}"
    );
}

#[test]
fn a_missing_reduce_signal_is_a_deadlock() {
    let exec = mutate(
        executor(ScheduleKind::ReduceScatterSingleStageA, 3),
        |plan| {
            if let Some(Node::Reduce(r)) = plan.devices[2].nodes.last_mut() {
                r.signals.retain(|f| f.device != 0);
            }
        },
    );
    let err = exec.run(1).expect_err("must deadlock");
    assert!(
        matches!(
            err,
            ExecError::FlagTimeout {
                device: 0,
                node: "reduce",
                flag: FlagRef {
                    device: 0,
                    index: 2
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_missing_barrier_arrival_is_a_deadlock() {
    let exec = mutate(executor(ScheduleKind::ReduceScatterTilingB, 2), |plan| {
        if let Node::Barrier(b) = &mut plan.devices[0].nodes[0] {
            b.arrive_at.clear();
        }
    });
    let result = exec.run(1);
    assert!(
        matches!(
            result,
            Err(ExecError::BarrierTimeout {
                device: 1,
                counter: 0,
                arrivals: 1,
                ..
            })
        ),
        "{result:?}"
    );
}

#[test]
fn a_wrong_slot_or_peer_fails_the_check() {
    // Reading the left neighbour's slot t instead of t−1: stale (NaN-poisoned) data.
    let mut wrong_slot = mutate(executor(ScheduleKind::ReduceScatterTilingA, 4), |plan| {
        for node in &mut plan.devices[2].nodes {
            if let Node::Gemm(g) = node
                && g.stage == 1
                && let distgemm::schedule::CSource::Peer(c) = &mut g.epilogue.source
            {
                c.offset += c.rows * c.cols;
            }
        }
    });
    assert!(!run_checked(&mut wrong_slot, 1, 1).2.passed());
    // Copying from the wrong peer: wrong A rows.
    let mut wrong_peer = mutate(executor(ScheduleKind::AllGatherRotatingA, 3), |plan| {
        for node in &mut plan.devices[0].nodes {
            if let Node::PeerCopy(c) = node
                && c.stage == 1
            {
                c.src.device = 2;
            }
        }
    });
    assert!(!run_checked(&mut wrong_peer, 1, 1).2.passed());
}

#[test]
fn many_back_to_back_iterations_keep_the_running_counter_consistent() {
    let mut exec = executor(ScheduleKind::ReduceScatterTilingA, 8);
    let (_, _, report) = run_checked(&mut exec, 3, 25);
    assert!(report.passed(), "{report:?}");
    assert!(exec.exclusive_state().iter().all(|e| e.counter == 0));
}

#[test]
fn plans_roundtrip_through_json() {
    for kind in ScheduleKind::ALL {
        let plan = Plan::build(kind, Problem::new(48, 48, 48).with_dtype(Dtype::F16), 3)
            .unwrap_or_else(|e| panic!("{e}"));
        let json = plan.to_json().unwrap_or_else(|e| panic!("{e}"));
        let back = Plan::from_json(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, plan, "{kind}");
    }
}

/// Every run of a sequence gets new inputs, which each device loads right after its own
/// previous run (the plan's ordering contract for input shards): all-gather peers may still be
/// copying a device's old shard then, unless the end-of-run release holds the device back.
#[test]
fn every_run_of_a_sequence_sees_its_own_inputs() {
    for kind in ScheduleKind::ALL {
        for tp in [2, 3, 5] {
            let problem = Problem::new(8 * tp, 8 * tp, 8 * tp).with_scalars(1.0, 0.0);
            let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
            let exec = CpuExecutor::<bf16>::new(plan).unwrap_or_else(|e| panic!("{e}"));
            let runs: Vec<GlobalInputs<bf16>> = (0..4)
                .map(|i| GlobalInputs::random(&problem, 100 * tp as u64 + i))
                .collect();
            let shards: Vec<_> = runs
                .iter()
                .map(|g| {
                    exec.plan()
                        .shard_inputs(g)
                        .unwrap_or_else(|e| panic!("{e}"))
                })
                .collect();
            let outputs = exec
                .run_sequence(&shards)
                .unwrap_or_else(|e| panic!("{kind} TP={tp}: {e}"));
            for (i, (inputs, out)) in runs.iter().zip(&outputs).enumerate() {
                let report = check_run(exec.plan(), inputs, out);
                assert!(report.passed(), "{kind} TP={tp} run {i}: {report:?}");
            }
            assert!(exec.exclusive_state().iter().all(|e| e.counter == 0));
        }
    }
}

/// All-gather: after a run every device holds a release flag from each peer (flag P + q), none
/// from itself; reduce-scatter plans have no release flags in use.
#[test]
fn every_peer_releases_the_shards_it_copied() {
    for kind in ScheduleKind::ALL {
        let tp = 4;
        let mut exec = executor(kind, tp);
        let (_, _, report) = run_checked(&mut exec, 5, 1);
        assert!(report.passed(), "{kind}: {report:?}");
        let base = exec.plan().exclusive.release_base;
        for (d, state) in exec.exclusive_state().iter().enumerate() {
            let released: Vec<u32> = state.flags[base..].to_vec();
            let expected: Vec<u32> = (0..tp)
                .map(|q| match kind.collective() {
                    Collective::AllGather if q != d => FLAG_SET_VALUE,
                    _ => 0,
                })
                .collect();
            assert_eq!(released, expected, "{kind} device {d}");
            let awaits = exec.plan().devices[d]
                .nodes
                .iter()
                .any(|n| matches!(n, Node::AwaitRelease(_)));
            assert_eq!(awaits, kind.collective() == Collective::AllGather, "{kind}");
        }
    }
}

#[test]
fn a_missing_release_is_a_deadlock_at_the_end_of_the_run() {
    let tp = 3;
    let exec = mutate(executor(ScheduleKind::AllGatherRotatingB, tp), |plan| {
        let base = plan.exclusive.release_base;
        // Device 1 releases device 0's shard into its own flag instead.
        for node in &mut plan.devices[1].nodes {
            if let Node::FlagSet(f) = node
                && f.flag.device == 0
                && f.flag.index == base + 1
            {
                f.flag.device = 1;
            }
        }
    });
    let err = exec.run(1).expect_err("must deadlock");
    assert!(
        matches!(
            err,
            ExecError::FlagTimeout {
                device: 0,
                node: "release",
                flag: FlagRef {
                    device: 0,
                    index: 4
                },
                ..
            }
        ),
        "{err}"
    );
}

/// Runs `plan` on four input sets back to back (`run_sequence`: each device loads its next
/// inputs as soon as its own run ends) with `delays` injected, and returns, per run, whether
/// D is within the f64 bound (with the report).
fn sequence_with_delays(
    plan: Plan,
    delays: Vec<distgemm::cpu::InjectedDelay>,
    seed: u64,
) -> Vec<(bool, String)> {
    let problem = plan.problem;
    let tp = plan.tp;
    let mut exec = CpuExecutor::<bf16>::new(plan)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_delays(delays);
    exec.poison();
    let runs: Vec<GlobalInputs<bf16>> = (0..4)
        .map(|i| GlobalInputs::random(&problem, seed + i))
        .collect();
    let shards: Vec<_> = runs
        .iter()
        .map(|g| {
            exec.plan()
                .shard_inputs(g)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let outputs = exec
        .run_sequence(&shards)
        .unwrap_or_else(|e| panic!("TP={tp}: {e}"));
    assert!(exec.exclusive_state().iter().all(|e| e.counter == 0));
    runs.iter()
        .zip(&outputs)
        .map(|(inputs, out)| {
            let report = check_run(exec.plan(), inputs, out);
            (report.passed(), format!("{report:?}"))
        })
        .collect()
}

/// The delays that stress the pushed partials' slot reuse on `plan`: none; one device slow
/// in every node (its left neighbour runs ahead within the run, everyone waits for it at the
/// next barrier); one device's pushes late (its right neighbour waits for its flags); one
/// device's receiving stages late (its left neighbour pushes everything before they read).
fn push_delays(plan: &Plan) -> Vec<Vec<distgemm::cpu::InjectedDelay>> {
    use distgemm::cpu::InjectedDelay;
    let tp = plan.tp;
    let ms = Duration::from_millis;
    let nodes_of = |d: usize, pick: &dyn Fn(&Node) -> bool| -> Vec<InjectedDelay> {
        plan.devices[d]
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| pick(n))
            .map(|(i, _)| InjectedDelay {
                device: d,
                node: Some(i),
                delay: ms(3),
            })
            .collect()
    };
    vec![
        Vec::new(),
        vec![InjectedDelay {
            device: tp / 2,
            node: None,
            delay: ms(1),
        }],
        nodes_of(0, &|n| matches!(n, Node::PeerCopy(_))),
        nodes_of(1 % tp, &|n| matches!(n, Node::Gemm(g) if g.stage > 0)),
    ]
}

/// Every reduce-scatter schedule built with pushed partials (the single-stage ones ignore
/// it), at every TP 1..=8, against the f64 reference, four runs back to back with new inputs,
/// under each delay pattern of `push_delays`.
#[test]
fn pushed_partials_match_the_reference_with_delayed_devices() {
    use distgemm::plan::{PlanOptions, RsPartials};
    let options = PlanOptions {
        rs_partials: RsPartials::Push,
    };
    for kind in ScheduleKind::ALL {
        if kind.collective() != Collective::ReduceScatter {
            continue;
        }
        for tp in 1..=8 {
            let problem = Problem::new(8 * tp, 8 * tp, 8 * tp);
            let plan =
                Plan::build_with(kind, problem, tp, options).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                plan.rs_partials == RsPartials::Push,
                kind.is_pipelined(),
                "{kind}"
            );
            for (pattern, delays) in push_delays(&plan).into_iter().enumerate() {
                let results = sequence_with_delays(plan.clone(), delays, 10 * tp as u64);
                for (run, (passed, report)) in results.iter().enumerate() {
                    assert!(
                        passed,
                        "{kind} TP={tp} delays {pattern} run {run}: {report}"
                    );
                }
            }
        }
    }
}

/// The delays matter: with device 1's stage 1 writing its partial into `R_2` (a slot its left
/// neighbour pushes into at any time, instead of `S_1`), and that stage 100 ms late, device
/// 0's push lands first and is overwritten: D is wrong. The plan's race checker finds the
/// same edit (`plan::tests::a_send_slot_the_left_neighbour_pushes_into_is_a_race`).
#[test]
fn a_slot_reused_too_early_is_caught_with_a_late_stage() {
    use distgemm::cpu::InjectedDelay;
    use distgemm::plan::{PlanOptions, RsPartials};
    let options = PlanOptions {
        rs_partials: RsPartials::Push,
    };
    let mut plan = Plan::build_with(
        ScheduleKind::ReduceScatterTilingA,
        Problem::new(32, 32, 32),
        4,
        options,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let r2 = plan.devices[1].workspace.slot_offset(1);
    let mut stage1 = None;
    for (i, node) in plan.devices[1].nodes.iter_mut().enumerate() {
        match node {
            Node::Gemm(g) if g.stage == 1 => {
                g.d.offset = r2;
                stage1 = Some(i);
            }
            Node::PeerCopy(c) if c.stage == 2 => c.src.offset = r2,
            _ => {}
        }
    }
    let late = vec![InjectedDelay {
        device: 1,
        node: stage1,
        delay: Duration::from_millis(100),
    }];
    let results = sequence_with_delays(plan, late, 7);
    assert!(results.iter().any(|(passed, _)| !passed), "{results:?}");
}

// FP8 (issue 24): e4m3 A and B with tensor-wise or row-wise scales, bf16/f16 output.

/// Runs `kind` at `tp` on random FP8 inputs (outputs and gathered slots poisoned first) and
/// checks every element of D with `check_scaled` (the f64 reference; roundings to the output
/// type as for bf16: 1 for all-gather, P for the pipelined reduce-scatter, whose partials are
/// stored in the output type at every hop, 2 for the single-stage one). All-gather must also
/// equal, bit for bit, one device's `gemm_scaled_f32` over the global operands: with
/// row-wise scales that shows each gathered row arrived with its own scale.
fn check_fp8_schedule<T: Element>(
    kind: ScheduleKind,
    tp: usize,
    scales: ScaleMode,
    beta: f32,
    seed: u64,
) {
    let all_gather = kind.collective() == Collective::AllGather;
    let (m, n, k) = if all_gather {
        (8 * tp, 8 * tp, 48)
    } else {
        (8 * tp, 8 * tp, 32 * tp)
    };
    let problem = Problem::new(m, n, k)
        .with_dtype(T::DTYPE)
        .with_scalars(0.75, beta)
        .with_fp8(scales);
    let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{kind} TP={tp}: {e}"));
    let mut exec = CpuExecutor::<T>::new(plan).unwrap_or_else(|e| panic!("{e}"));
    let inputs = Fp8Inputs::<T>::random(&problem, seed);
    let shards = exec
        .plan()
        .shard_fp8_inputs(&inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    exec.load_fp8_inputs(&shards)
        .unwrap_or_else(|e| panic!("{e}"));
    exec.poison();
    exec.run(2)
        .unwrap_or_else(|e| panic!("{kind} TP={tp}: {e}"));
    let d = exec.gathered_output().unwrap_or_else(|e| panic!("{e}"));
    let case = format!("{kind} TP={tp} {problem}");
    let report = check_scaled(
        &problem,
        kind.roundings(tp),
        tp,
        ScaledCheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            scales: &inputs.scales,
            c: inputs.c.as_deref(),
        },
        &d,
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(report.passed(), "{case}: {report:?}");
    assert_eq!(report.elements, m * n);
    if all_gather {
        let c32 = inputs.c.as_deref().map(widen);
        let epilogue = EpilogueInput {
            alpha: 0.75,
            beta,
            c: c32.as_deref().map(|c| (c, n)),
        };
        let single: Vec<T> = gemm_scaled_f32(
            m,
            n,
            k,
            &inputs.a,
            k,
            &inputs.b,
            k,
            &inputs.scales,
            epilogue,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let differing = d
            .iter()
            .zip(&single)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differing, 0, "{case}: not bit-identical to one device");
    }
    assert!(exec.exclusive_state().iter().all(|e| e.counter == 0));
}

/// Every schedule at TP 1–8, both scale modes, beta 0 and 1 (reduce-scatter: 0), bf16 and
/// f16 output.
#[test]
fn fp8_every_schedule_at_every_tp_in_both_scale_modes() {
    for kind in ScheduleKind::ALL {
        for tp in 1..=8 {
            for scales in ScaleMode::ALL {
                let betas: &[f32] = if kind.collective() == Collective::AllGather {
                    &[0.0, 1.0]
                } else {
                    &[0.0]
                };
                for &beta in betas {
                    let seed = 24 * tp as u64 + u64::from(beta != 0.0);
                    check_fp8_schedule::<bf16>(kind, tp, scales, beta, seed);
                    check_fp8_schedule::<f16>(kind, tp, scales, beta, seed + 1);
                }
            }
        }
    }
}

/// An FP8 plan takes FP8 inputs only, with the problem's scale mode and one scale per shard
/// row; a bf16 plan takes no FP8 inputs.
#[test]
fn fp8_inputs_and_plans_must_match() {
    let problem = Problem::new(32, 32, 32).with_fp8(ScaleMode::Rowwise);
    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingA, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let mut exec = CpuExecutor::<bf16>::new(plan).unwrap_or_else(|e| panic!("{e}"));
    let mut bf16_exec = executor(ScheduleKind::AllGatherRotatingA, 2);
    let plain = GlobalInputs::<bf16>::random(&bf16_exec.plan().problem, 1);
    let plain_shards = bf16_exec
        .plan()
        .shard_inputs(&plain)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        exec.load_inputs(&plain_shards),
        Err(ExecError::OperandMismatch {
            plan: "e4m3",
            inputs: "bf16"
        })
    );
    let inputs = Fp8Inputs::<bf16>::random(&problem, 2);
    let mut shards = exec
        .plan()
        .shard_fp8_inputs(&inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    if let Scales::Rowwise { a, .. } = &mut shards[1].scales {
        a.pop();
    }
    assert!(matches!(
        exec.load_fp8_inputs(&shards),
        Err(ExecError::Scales { device: 1, .. })
    ));
    let fp8_shards = exec
        .plan()
        .shard_fp8_inputs(&inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        bf16_exec.load_fp8_inputs(&fp8_shards),
        Err(ExecError::OperandMismatch { plan: "bf16", .. })
    ));
}

/// One run's gathered D (`outputs`, one shard per device) against the f64 reference of its
/// inputs (beta = 0), with the plan's roundings.
fn check_run(plan: &Plan, inputs: &GlobalInputs<bf16>, outputs: &[Vec<bf16>]) -> CheckReport {
    let d = plan
        .gather_output(outputs)
        .unwrap_or_else(|e| panic!("{e}"));
    check(
        &plan.problem,
        plan.schedule.roundings(plan.tp),
        plan.tp,
        CheckInputs {
            a: &inputs.a,
            b: &inputs.b,
            c: None,
        },
        &d,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}
