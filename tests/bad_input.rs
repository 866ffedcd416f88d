//! Every way a (schedule, problem, TP) can be refused, with the message naming the constraint;
//! and the library's bad-input table (issue 20): edited plans, short operands and outputs,
//! too few shards, dimensions beyond the kernel's, strides that would wrap, PTX files that
//! cannot be PTX — each a typed error, none a panic or a silently wrong result.

use distgemm::cpu::{CpuExecutor, ExecError};
use distgemm::cuda::{MachineModel, choose_schedule};
use distgemm::plan::{EdgeKind, GlobalInputs, Node, Plan, PlanError, SizeError};
use distgemm::problem::Problem;
use distgemm::reference::{CheckInputs, check};
use distgemm::runtime::RuntimeError;
use distgemm::runtime::module::{PtxSource, read_ptx};
use distgemm::runtime::tensor_map::{TensorMapDtype, TensorMapSpec};
use distgemm::schedule::{BufferKind, ScheduleError, ScheduleKind, can_implement};
use half::bf16;

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

#[test]
fn dimensions_the_kernel_cannot_index_are_refused_before_any_plan() {
    for (problem, dim) in [
        (Problem::new(1 << 31, 8, 8), "M"),
        (Problem::new(8, 1 << 31, 8), "N"),
        (Problem::new(8, 8, usize::MAX), "K"),
    ] {
        let msg = message(ScheduleKind::AllGatherSingleStageA, problem, 1);
        assert!(
            msg.starts_with(&format!("{dim}="))
                && msg.ends_with("every dimension must be below 2^31"),
            "{msg}"
        );
    }
}

/// A valid plan of `kind` edited by `edit`, written as JSON and read back: the error message.
fn edited(kind: ScheduleKind, problem: Problem, tp: usize, edit: impl FnOnce(&mut Plan)) -> String {
    let mut plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
    edit(&mut plan);
    let json = plan.to_json().unwrap_or_else(|e| panic!("{e}"));
    match Plan::from_json(&json) {
        Ok(_) => panic!("the edited {kind} plan was accepted"),
        Err(e) => e.to_string(),
    }
}

const AG_A: ScheduleKind = ScheduleKind::AllGatherRotatingA;

fn cube(n: usize) -> Problem {
    Problem::new(n, n, n)
}

#[test]
fn edited_plans_are_refused_with_the_reason() {
    type Edit = Box<dyn FnOnce(&mut Plan)>;
    let cases: Vec<(ScheduleKind, Problem, Edit, &str)> = vec![
        (
            AG_A,
            cube(48),
            Box::new(|p| p.tp = 3),
            "TP is 3 but the plan has 2 devices",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.tp = 0),
            "TP=0 is out of range",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.devices.swap(0, 1)),
            "device plan 0 is numbered 1",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.exclusive.flag_count = 1_000_000_000_000),
            "exclusive workspace layout",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.devices[1].workspace_bytes += 2),
            "workspace_bytes is",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.devices[0].shards.a.row0 = 40),
            "is not inside the 64×64 global A",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                if let Some(Node::PeerCopy(c)) = p.devices[0].nodes.get_mut(1) {
                    c.dst.len = 8;
                }
            }),
            "lengths must be equal",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                if let Some(Node::PeerCopy(c)) = p.devices[0].nodes.get_mut(1) {
                    c.src.offset = usize::MAX - 4;
                }
            }),
            "exceeds its buffer",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                // offset 8 + (2 − 1)·(2^64 − 8) + 8 wraps to 16: inside any buffer, wrong rows.
                for node in &mut p.devices[0].nodes {
                    if let Node::Gemm(g) = node {
                        g.a.offset = 8;
                        g.a.rows = 2;
                        g.a.ld = usize::MAX - 7;
                    }
                }
            }),
            "exceeds its buffer",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                if let Some(Node::Barrier(b)) = p.devices[0].nodes.get_mut(0) {
                    b.arrive_at = vec![5];
                }
            }),
            "it arrives at device 5",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                if let Some(Node::Barrier(b)) = p.devices[1].nodes.get_mut(0) {
                    b.arrivals = 5;
                }
            }),
            "has barriers waiting for [5] arrivals, the others send 1",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| p.devices[0].edges[0].to = 99),
            "edges must go forward between existing nodes",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                let e = p.devices[1].edges[0];
                p.devices[1].edges.push(distgemm::plan::Edge {
                    from: e.to,
                    to: e.from,
                    kind: EdgeKind::Full,
                });
            }),
            "edges must go forward",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                for node in &mut p.devices[1].nodes {
                    if let Node::Gemm(g) = node {
                        g.shape.k = 32;
                    }
                }
            }),
            "but the GEMM shape",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                for node in &mut p.devices[0].nodes {
                    if let Node::Gemm(g) = node {
                        g.epilogue.beta = 0.5;
                    }
                }
            }),
            "beta is 0.5 but the epilogue has no C",
        ),
        (
            AG_A,
            cube(64),
            Box::new(|p| {
                for node in &mut p.devices[0].nodes {
                    if let Node::Gemm(g) = node {
                        g.d.device = 1;
                    }
                }
            }),
            "a GEMM writes its own device's memory",
        ),
        (
            ScheduleKind::ReduceScatterSingleStageA,
            cube(64),
            Box::new(|p| {
                for node in &mut p.devices[0].nodes {
                    if let Node::Reduce(r) = node {
                        r.sources[1].rows = 8;
                    }
                }
            }),
            "but the destination is",
        ),
        (
            ScheduleKind::ReduceScatterTilingA,
            cube(64),
            Box::new(|p| {
                for node in &mut p.devices[0].nodes {
                    if let Node::Gemm(g) = node {
                        g.signals = g
                            .signals
                            .map(|f| distgemm::schedule::FlagRef { index: 7, ..f });
                    }
                }
            }),
            "flag 7 of device",
        ),
    ];
    let count = cases.len();
    let wrong: Vec<String> = cases
        .into_iter()
        .map(|(kind, problem, edit, want)| (kind, edited(kind, problem, 2, edit), want))
        .filter(|(_, msg, want)| !msg.contains(want))
        .map(|(kind, msg, want)| format!("{kind}: want {want:?} in {msg:?}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(count >= 18);
    let err = Plan::from_json("{\"schedule\": \"ag-a\"")
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.starts_with("not a distgemm plan")));
}

#[test]
fn short_operands_outputs_and_shards_are_typed_errors() {
    let problem = Problem::new(16, 16, 16).with_scalars(1.0, 0.5);
    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingB, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let inputs = GlobalInputs::<bf16>::random(&problem, 3);
    let short = GlobalInputs {
        b: inputs.b[..100].to_vec(),
        ..inputs.clone()
    };
    assert_eq!(
        plan.shard_inputs(&short).err().map(|e| e.to_string()),
        Some("B has 100 elements, the problem needs 256".to_owned())
    );
    assert!(matches!(
        plan.gather_output::<bf16>(&[vec![]]),
        Err(SizeError::Count {
            got: 1,
            expected: 2,
            ..
        })
    ));

    // Too few shard sets: before the fix the missing device silently computed on zeros.
    let mut exec = CpuExecutor::<bf16>::new(plan.clone()).unwrap_or_else(|e| panic!("{e}"));
    let mut shards = plan.shard_inputs(&inputs).unwrap_or_else(|e| panic!("{e}"));
    shards.truncate(1);
    assert_eq!(
        exec.load_inputs(&shards),
        Err(ExecError::ShardCount {
            got: 1,
            expected: 2
        })
    );
    shards.clear();
    assert!(exec.load_inputs(&shards).is_err());
    let mut shards = plan.shard_inputs(&inputs).unwrap_or_else(|e| panic!("{e}"));
    shards[1].a.pop();
    assert!(matches!(
        exec.load_inputs(&shards),
        Err(ExecError::InputSize {
            device: 1,
            buffer: BufferKind::A,
            ..
        })
    ));

    // check(): short D or A, and no C while beta ≠ 0 (a wrong verdict before the fix).
    let d = vec![bf16::ZERO; 16 * 16];
    let full = CheckInputs {
        a: &inputs.a,
        b: &inputs.b,
        c: inputs.c.as_deref(),
    };
    assert!(matches!(
        check(&problem, 1, 2, full, &d[..255]),
        Err(SizeError::Elements {
            got: 255,
            expected: 256,
            ..
        })
    ));
    let short_a = CheckInputs {
        a: &inputs.a[..8],
        ..full
    };
    assert!(check(&problem, 1, 2, short_a, &d).is_err());
    let no_c = CheckInputs { c: None, ..full };
    assert_eq!(
        check(&problem, 1, 2, no_c, &d).err(),
        Some(SizeError::MissingC { beta: 0.5 })
    );
}

#[test]
fn auto_validates_before_its_cost_model_multiplies() {
    // (usize::MAX·64 + …)·2 overflowed ("attempt to multiply with overflow") in test builds.
    let choice = choose_schedule(
        ScheduleKind::AllGatherRotatingA,
        &Problem::new(usize::MAX, 64, 64),
        2,
        &MachineModel::H200,
    );
    assert!(choice.pipelined_seconds.is_nan());
}

#[test]
fn a_tensor_map_stride_that_would_wrap_is_refused() {
    // ld = 2^63 + 8: ld·2 wraps to 16 bytes, passed the 2^40 check and encoded overlapping rows.
    let spec = TensorMapSpec::new(TensorMapDtype::Bf16, 64, 64, (1 << 63) + 8, 64, 64);
    let e = spec.validate(0x1000).unwrap_err();
    assert!(e.contains("overflows 64 bits"), "{e}");
}

#[test]
fn ptx_files_that_are_not_files_are_refused_without_reading_them() {
    // /dev/zero would be read until memory runs out; a directory or a device is never PTX.
    for path in ["/dev/zero", "/dev/null", "/"] {
        let e = read_ptx(PtxSource::File(path.into())).err();
        assert!(
            matches!(&e, Some(RuntimeError::PtxUnreadable { .. }))
                && e.as_ref()
                    .is_some_and(|e| e.to_string().contains("not a regular file")),
            "{path}: {e:?}"
        );
    }
}

/// Edited FP8 plans (issue 24): a bf16 plan relabelled FP8 keeps its 2-byte copy and
/// workspace sizes, an FP8 plan relabelled bf16 its 1-byte ones, a gathered copy that splits
/// rows would leave row-wise scales behind, and an FP8 problem's K must be a multiple of 16:
/// each refused with the reason. An FP8 plan's GEMM cannot run on bf16 shards either.
#[test]
fn edited_fp8_plans_are_refused_with_the_reason() {
    use distgemm::fp8::ScaleMode;
    let fp8 = cube(64).with_fp8(ScaleMode::Rowwise);
    type Edit = Box<dyn FnOnce(&mut Plan)>;
    let cases: Vec<(Problem, Edit, &str)> = vec![
        (
            cube(64),
            Box::new(|p| p.problem = p.problem.with_fp8(ScaleMode::Tensorwise)),
            "workspace_bytes is 4096 but 2048 elements take 2048 (1 per element)",
        ),
        (
            fp8,
            Box::new(|p| p.problem.fp8 = None),
            "workspace_bytes is 2048 but 2048 elements take 4096 (2 per element)",
        ),
        (
            fp8,
            Box::new(|p| {
                for node in &mut p.devices[0].nodes {
                    if let Node::PeerCopy(c) = node {
                        c.bytes *= 2;
                    }
                }
            }),
            "bytes = length × element size",
        ),
        (
            fp8,
            Box::new(|p| {
                for node in &mut p.devices[1].nodes {
                    if let Node::PeerCopy(c) = node {
                        c.src.offset += 16;
                        c.src.len -= 16;
                        c.dst.len -= 16;
                        c.bytes -= 16;
                    }
                }
            }),
            "not whole rows of 64 e4m3 elements",
        ),
        (
            fp8,
            Box::new(|p| p.problem.k = 40),
            "K=40 is not a multiple of 16",
        ),
    ];
    for (problem, edit, want) in cases {
        let msg = edited(AG_A, problem, 2, edit);
        assert!(msg.contains(want), "want {want:?} in {msg:?}");
    }
    let plan = Plan::build(AG_A, fp8, 2).unwrap_or_else(|e| panic!("{e}"));
    let shards = plan
        .shard_inputs(&GlobalInputs::<bf16>::random(&fp8, 1))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut exec = CpuExecutor::<bf16>::new(plan).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        exec.load_inputs(&shards),
        Err(ExecError::OperandMismatch { plan: "e4m3", .. })
    ));
}

/// Both CUDA builders plan FP8 problems in either scale mode, without a GPU.
#[test]
fn the_cuda_builders_plan_fp8_in_both_scale_modes() {
    use distgemm::cuda::{DistGemm, rank::RankGemm};
    use distgemm::fp8::ScaleMode;
    for problem in [
        cube(64),
        cube(64).with_fp8(ScaleMode::Tensorwise),
        cube(64).with_fp8(ScaleMode::Rowwise),
    ] {
        let dist = DistGemm::builder().tp(2).schedule(AG_A).problem(problem);
        assert!(dist.plan().is_ok(), "{problem}");
        let rank = RankGemm::builder().schedule(AG_A).problem(problem);
        assert!(rank.plan(2).is_ok(), "{problem}");
    }
}

/// In an FP8 plan a GEMM reads A and B as 1-byte e4m3 and writes D (and reads C) in the
/// output type, and a reduction sums output-typed partials: an edited view pointing at a
/// buffer of the other element type is refused by `validate` and `from_json` with
/// [`PlanError::ElementType`] (it used to pass both and panic a CPU device thread).
#[test]
fn fp8_views_of_the_wrong_element_type_are_refused() {
    use distgemm::fp8::ScaleMode;
    let fp8 = cube(64).with_fp8(ScaleMode::Rowwise);
    /// Applies `edit` to device 0's stage-0 GEMM and its reduction (if any).
    fn on_device_0(plan: &mut Plan, edit: fn(&mut Node)) {
        for node in &mut plan.devices[0].nodes {
            if matches!(node, Node::Gemm(g) if g.stage == 0) || matches!(node, Node::Reduce(_)) {
                edit(node);
            }
        }
    }
    type Edit = fn(&mut Node);
    // (schedule, edit, role, element bytes of the buffer, element bytes the role needs)
    let cases: [(ScheduleKind, Edit, &str, usize, usize); 4] = [
        (
            AG_A,
            |n| {
                if let Node::Gemm(g) = n {
                    g.a.buffer = BufferKind::D;
                }
            },
            "A",
            2,
            1,
        ),
        (
            ScheduleKind::AllGatherRotatingB,
            |n| {
                if let Node::Gemm(g) = n {
                    g.b.buffer = BufferKind::D;
                }
            },
            "B",
            2,
            1,
        ),
        (
            AG_A,
            |n| {
                if let Node::Gemm(g) = n {
                    g.d.buffer = BufferKind::A;
                }
            },
            "D",
            1,
            2,
        ),
        (
            ScheduleKind::ReduceScatterSingleStageA,
            |n| {
                if let Node::Reduce(r) = n {
                    r.dst.buffer = BufferKind::B;
                }
            },
            "reduction destination",
            1,
            2,
        ),
    ];
    for (kind, edit, role, got, expected) in cases {
        let mut plan = Plan::build(kind, fp8, 2).unwrap_or_else(|e| panic!("{e}"));
        on_device_0(&mut plan, edit);
        let err = plan.validate().err();
        assert!(
            matches!(
                &err,
                Some(PlanError::ElementType { device: 0, view_device: 0, role: r, got: g, expected: e, .. })
                    if *r == role && (*g, *e) == (got, expected)
            ),
            "{kind} {role}: {err:?}"
        );
        let msg = edited(kind, fp8, 2, |p| on_device_0(p, edit));
        let want = format!(
            "its {role} view points at device 0's {} buffer of {got}-byte elements; {role} views \
             need {expected}-byte elements",
            match err {
                Some(PlanError::ElementType { buffer, .. }) => buffer.name(),
                _ => "",
            }
        );
        assert!(msg.contains(&want), "want {want:?} in {msg:?}");
    }
}
