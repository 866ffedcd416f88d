//! Every way a (schedule, problem, TP) can be refused, with the message naming the constraint.

use distgemm::plan::{Plan, PlanError};
use distgemm::problem::Problem;
use distgemm::schedule::{ScheduleError, ScheduleKind, can_implement};

fn message(kind: ScheduleKind, problem: Problem, tp: usize) -> String {
    let err = can_implement(kind, &problem, tp).expect_err("must be refused");
    // Plan::build refuses with the same error.
    assert_eq!(
        Plan::build(kind, problem, tp).err(),
        Some(PlanError::Schedule(err.clone()))
    );
    err.to_string()
}

#[test]
fn tp_out_of_range() {
    for tp in [0, 9, 64] {
        let msg = message(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            tp,
        );
        assert_eq!(
            msg,
            format!("TP={tp} is out of range: TP must be between 1 and 8")
        );
    }
}

#[test]
fn zero_dimensions() {
    for (problem, dim) in [
        (Problem::new(0, 8, 8), "M"),
        (Problem::new(8, 0, 8), "N"),
        (Problem::new(8, 8, 0), "K"),
    ] {
        assert_eq!(
            message(ScheduleKind::ReduceScatterTilingB, problem, 1),
            format!("{dim}=0: every dimension must be at least 1")
        );
    }
}

#[test]
fn too_large() {
    let msg = message(
        ScheduleKind::AllGatherRotatingA,
        Problem::new(1 << 30, 1 << 30, 64),
        1,
    );
    assert!(
        msg.starts_with("C/D has 1073741824×1073741824 elements"),
        "{msg}"
    );
}

#[test]
fn indivisible_dimensions_name_dimension_tp_and_schedule() {
    let cases = [
        (
            ScheduleKind::AllGatherRotatingA,
            Problem::new(1001, 64, 64),
            8,
            "M=1001 is not divisible by TP=8 for AllGather1D_TilingCD_RotatingA",
        ),
        (
            ScheduleKind::AllGatherRotatingB,
            Problem::new(64, 100, 64),
            3,
            "M=64 is not divisible by TP=3 for AllGather1D_TilingCD_RotatingB",
        ),
        (
            ScheduleKind::AllGatherRotatingB,
            Problem::new(48, 100, 64),
            3,
            "N=100 is not divisible by TP=3 for AllGather1D_TilingCD_RotatingB",
        ),
        (
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(64, 64, 72),
            7,
            "M=64 is not divisible by TP=7 for ReduceScatter1D_TilingA_RotatingC",
        ),
        (
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(60, 64, 72),
            5,
            "K=72 is not divisible by TP=5 for ReduceScatter1D_TilingA_RotatingC",
        ),
        (
            ScheduleKind::ReduceScatterTilingB,
            Problem::new(5, 60, 64),
            8,
            "N=60 is not divisible by TP=8 for ReduceScatter1D_TilingB_RotatingC",
        ),
        (
            ScheduleKind::ReduceScatterSingleStageB,
            Problem::new(5, 64, 72),
            5,
            "N=64 is not divisible by TP=5 for ReduceScatter1D_SingleStage_TilingB",
        ),
    ];
    for (kind, problem, tp, want) in cases {
        assert_eq!(message(kind, problem, tp), want);
    }
}

#[test]
fn k_must_give_16_byte_rows() {
    assert_eq!(
        message(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 12),
            2
        ),
        "K=12 is not a multiple of 8: rows of A and B must be 16-byte aligned"
    );
}

#[test]
fn misaligned_views_name_the_quantity() {
    let cases = [
        (
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 96, 64),
            8,
            "N/TP=12",
        ),
        (
            ScheduleKind::AllGatherRotatingB,
            Problem::new(64, 96, 64),
            8,
            "N/TP=12",
        ),
        (
            ScheduleKind::AllGatherSingleStageB,
            Problem::new(64, 36, 64),
            2,
            "N=36",
        ),
        (
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(64, 64, 96),
            8,
            "K/TP=12",
        ),
        (
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(64, 20, 64),
            2,
            "N=20",
        ),
        (
            ScheduleKind::ReduceScatterSingleStageB,
            Problem::new(64, 48, 64),
            4,
            "N/TP=12",
        ),
    ];
    for (kind, problem, tp, quantity) in cases {
        let msg = message(kind, problem, tp);
        assert!(
            msg.starts_with(&format!("{quantity} is not a multiple of 8 for {kind}")),
            "{msg}"
        );
    }
}

#[test]
fn reduce_scatter_refuses_beta() {
    let err = can_implement(
        ScheduleKind::ReduceScatterTilingA,
        &Problem::new(64, 64, 64).with_scalars(1.0, 0.5),
        2,
    );
    assert!(matches!(err, Err(ScheduleError::BetaUnsupported { .. })));
    assert!(
        can_implement(
            ScheduleKind::AllGatherRotatingA,
            &Problem::new(64, 64, 64).with_scalars(1.0, 0.5),
            2
        )
        .is_ok()
    );
}
