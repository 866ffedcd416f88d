use kernels_gpu::collective_abi::MAX_PEERS;
use kernels_gpu::gemm_abi::{HOOK_DEFER_GRID_WAIT, HOOK_WAIT_BEFORE_C};

use super::*;
use crate::cuda::error::{TimeoutSite, WaitingNode};
use crate::plan::Node;
use crate::problem::Problem;
use crate::schedule::{Collective, GemmStage, Region, RsPartials, ScheduleKind, View};

/// Fake, well separated addresses: device q's buffers at q·2^40 + k·2^32.
fn addresses(tp: usize) -> Vec<DeviceAddresses> {
    (0..tp as u64)
        .map(|q| {
            let base = (q + 1) << 40;
            DeviceAddresses {
                a: base + (1 << 32),
                b: base + (2 << 32),
                c: base + (3 << 32),
                d: base + (4 << 32),
                workspace: base + (5 << 32),
                exclusive: base + (6 << 32),
                a_scales: base + (7 << 32),
                b_scales: base + (8 << 32),
            }
        })
        .collect()
}

fn options() -> LowerOptions {
    LowerOptions {
        timeout: Duration::from_millis(1500),
        fp8_scales: None,
        missing_signals: Vec::new(),
        diagnostics: TimingDiagnostics::default(),
    }
}

fn lowered(kind: ScheduleKind, tp: usize, d: usize) -> (Plan, Vec<DeviceAddresses>, LoweredGraph) {
    let problem = Problem::new(64 * tp, 64 * tp, 64 * tp);
    let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
    let addr = addresses(tp);
    let g = lower_device(&plan, d, &addr, &options()).unwrap_or_else(|e| panic!("{e}"));
    (plan, addr, g)
}

#[test]
fn every_schedule_lowers_one_graph_node_per_plan_node() {
    for kind in ScheduleKind::ALL {
        for tp in [1, 2, 4] {
            for (d, rs_partials) in (0..tp).zip(crate::plan::RsPartials::ALL.iter().cycle()) {
                let problem = Problem::new(64 * tp, 64 * tp, 64 * tp);
                let plan_options = crate::plan::PlanOptions {
                    rs_partials: *rs_partials,
                };
                let plan = Plan::build_with(kind, problem, tp, plan_options)
                    .unwrap_or_else(|e| panic!("{e}"));
                let g = lower_device(&plan, d, &addresses(tp), &options())
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(g.nodes.len(), plan.devices[d].nodes.len(), "{kind}");
                assert_eq!(g.edges.len(), plan.devices[d].edges.len(), "{kind}");
                // The wait moves to the first C load exactly where the flag guards only
                // C (pushed partials), and never together with a deferred grid wait.
                for (node, lowered) in plan.devices[d].nodes.iter().zip(&g.nodes) {
                    if let (Node::Gemm(s), LoweredNode::Gemm { hook, .. }) = (node, lowered) {
                        let pushed = kind.collective() == Collective::ReduceScatter
                            && plan.rs_partials == RsPartials::Push
                            && s.waits.is_some();
                        assert_eq!(hook.flags & HOOK_WAIT_BEFORE_C != 0, pushed, "{kind}");
                        assert_ne!(
                            hook.flags,
                            HOOK_WAIT_BEFORE_C | HOOK_DEFER_GRID_WAIT,
                            "{kind}"
                        );
                    }
                }
                for (e, pe) in g.edges.iter().zip(&plan.devices[d].edges) {
                    assert_eq!((e.from, e.to), (pe.from, pe.to));
                    assert_eq!(
                        e.kind == DependencyKind::Programmatic,
                        pe.kind.is_programmatic()
                    );
                }
            }
        }
    }
}

/// Row-wise FP8: every stage GEMM reads the full scale vectors from the first global
/// row of A and of B it multiplies (mb = M/P, nb = N/P, p = the stage's tile): ag-a A
/// rows p·mb and B rows d·nb; ag-b d·mb and p·nb; rs-a p·mb and 0; rs-b 0 and p·nb;
/// ag-a-single 0 and d·nb; ag-b-single d·mb and 0; the single-stage reduce-scatters 0, 0
/// (schedule/geometry's index formulas). Tensor-wise scales are refused for such a plan.
#[test]
fn row_wise_stages_read_the_scales_of_their_global_rows() {
    use crate::fp8::ScaleMode;
    use ScheduleKind as S;
    for kind in ScheduleKind::ALL {
        for tp in [1, 2, 3, 4] {
            for rs_partials in crate::plan::RsPartials::ALL {
                let problem = Problem::new(64 * tp, 32 * tp, 32 * tp).with_fp8(ScaleMode::Rowwise);
                let (mb, nb) = (64, 32);
                let plan_options = crate::plan::PlanOptions { rs_partials };
                let plan = Plan::build_with(kind, problem, tp, plan_options)
                    .unwrap_or_else(|e| panic!("{kind} TP={tp}: {e}"));
                let addr = addresses(tp);
                for d in 0..tp {
                    let g = lower_device(&plan, d, &addr, &options())
                        .unwrap_or_else(|e| panic!("{kind} TP={tp} d={d}: {e}"));
                    let mut gemms = 0;
                    for (node, lowered) in plan.devices[d].nodes.iter().zip(&g.nodes) {
                        let (Node::Gemm(s), LoweredNode::Gemm { fp8, .. }) = (node, lowered) else {
                            continue;
                        };
                        gemms += 1;
                        let p = s.tile.unwrap_or(0);
                        let (a_row, b_row) = match kind {
                            S::AllGatherRotatingA => (p * mb, d * nb),
                            S::AllGatherRotatingB => (d * mb, p * nb),
                            S::ReduceScatterTilingA => (p * mb, 0),
                            S::ReduceScatterTilingB => (0, p * nb),
                            S::AllGatherSingleStageA => (0, d * nb),
                            S::AllGatherSingleStageB => (d * mb, 0),
                            S::ReduceScatterSingleStageA | S::ReduceScatterSingleStageB => (0, 0),
                        };
                        let want = RowScales {
                            a: addr[d].a_scales + 4 * a_row as u64,
                            b: addr[d].b_scales + 4 * b_row as u64,
                        };
                        assert_eq!(*fp8, Some(want), "{kind} TP={tp} d={d} stage {}", s.stage);
                    }
                    assert!(gemms > 0, "{kind} TP={tp} d={d}");
                    let tensor = LowerOptions {
                        fp8_scales: Some([1.0, 1.0]),
                        ..options()
                    };
                    assert!(lower_device(&plan, d, &addr, &tensor).is_err());
                }
            }
        }
    }
}

#[test]
fn barrier_arrives_at_every_peer_counter_and_resets_own_flags() {
    let (plan, addr, g) = lowered(ScheduleKind::AllGatherRotatingA, 4, 2);
    let LoweredNode::Barrier(b) = &g.nodes[0] else {
        panic!("node 0 is not the barrier")
    };
    // The 4 stage flags and the 4 release flags.
    assert_eq!((b.reset_count, b.arrive_count, b.arrivals), (8, 3, 3));
    let counters: Vec<u64> = b.arrive[..3].to_vec();
    assert_eq!(
        counters,
        vec![addr[0].exclusive, addr[1].exclusive, addr[3].exclusive]
    );
    assert_eq!(b.counter, addr[2].exclusive);
    assert_eq!(b.error_word, addr[2].exclusive + 4);
    for (t, &flag) in b.reset.iter().take(8).enumerate() {
        assert_eq!(
            flag,
            addr[2].exclusive + plan.exclusive.flag_offset(t) as u64
        );
    }
    assert_eq!(b.timeout_ns, 1_500_000_000);
    assert_eq!(b.reset[8..], [0; 8]);
}

#[test]
fn all_gather_copies_pull_the_peer_shard_into_the_own_slot() {
    let (plan, addr, g) = lowered(ScheduleKind::AllGatherRotatingA, 2, 0);
    // Barrier, copy, stage flag set, release flag set, gemm 0, gemm 1, release wait.
    let LoweredNode::Copy { dst, src, bytes } = g.nodes[1] else {
        panic!("node 1 is not a copy")
    };
    assert_eq!(src, addr[1].a);
    assert_eq!(dst, addr[0].workspace);
    assert_eq!(bytes, plan.devices[0].workspace_bytes);
    assert_eq!(
        g.nodes[2],
        LoweredNode::FlagSet {
            dst: addr[0].exclusive + plan.exclusive.flag_offset(1) as u64,
            value: crate::plan::FLAG_SET_VALUE
        }
    );
    // Device 0 has finished reading device 1's A shard: it sets device 1's release flag 0.
    assert_eq!(
        g.nodes[3],
        LoweredNode::FlagSet {
            dst: addr[1].exclusive + plan.exclusive.flag_offset(2) as u64,
            value: crate::plan::FLAG_SET_VALUE
        }
    );
    let LoweredNode::Gemm { args, hook, .. } = &g.nodes[5] else {
        panic!("node 5 is not a gemm")
    };
    assert_eq!(args.a.ptr, addr[0].workspace);
    assert_eq!(hook.wait_flag, addr[0].exclusive + 36);
    assert_eq!(hook.signal_flag, 0);
    assert_eq!(
        super::super::error::decode_timeout(hook.error_code),
        Some(TimeoutSite {
            device: 0,
            node: WaitingNode::Gemm,
            stage: 1,
            flag: Some(FlagRef {
                device: 0,
                index: 1
            })
        })
    );
    // Stage 1 computes row block 1 of D (mb = 64 rows of nb = 64 columns).
    assert_eq!(args.d.ptr, addr[0].d + 2 * 64 * 64);
    // It waits for stage 0 before its main loop; stage 0 waits for the barrier at its end.
    assert_eq!(hook.flags, 0);
    let LoweredNode::Gemm { hook: first, .. } = &g.nodes[4] else {
        panic!("node 4 is not a gemm")
    };
    assert_eq!(first.flags, HOOK_DEFER_GRID_WAIT);
    assert_eq!((first.wait_flag, first.signal_flag), (0, 0));
    // The run ends when device 1 has released device 0's shard (release flag 2 + 1).
    let LoweredNode::WaitFlags(w) = &g.nodes[6] else {
        panic!("node 6 is not the release wait")
    };
    assert_eq!(w.count, 1);
    assert_eq!(
        w.flags[0],
        addr[0].exclusive + plan.exclusive.flag_offset(3) as u64
    );
    assert_eq!(w.flags[1..], [0; 7]);
    assert_eq!(
        super::super::error::decode_timeout(w.codes[0]),
        Some(TimeoutSite {
            device: 0,
            node: WaitingNode::Release,
            stage: 0,
            flag: Some(FlagRef {
                device: 0,
                index: 3
            })
        })
    );
    assert_eq!(
        g.edges.last().map(|e| (e.to, e.kind)),
        Some((6, DependencyKind::Default))
    );
}

#[test]
fn every_waiting_kernel_records_its_timeout_in_every_error_word() {
    let tp = 4;
    for kind in ScheduleKind::ALL {
        for d in 0..tp {
            let (_, addr, g) = lowered(kind, tp, d);
            let own = addr[d].exclusive + 4;
            let mut peers: Vec<u64> = (0..tp)
                .filter(|&q| q != d)
                .map(|q| addr[q].exclusive + 4)
                .collect();
            peers.resize(MAX_PEERS, 0);
            let mut kinds = std::collections::BTreeSet::new();
            for node in &g.nodes {
                let (error_word, peer_errors, code) = match node {
                    LoweredNode::Barrier(p) => (p.error_word, p.peer_errors, p.error_code),
                    LoweredNode::Gemm { hook, .. } => {
                        (hook.error_word, hook.peer_errors, hook.error_code)
                    }
                    LoweredNode::Reduce(p) => (p.error_word, p.peer_errors, p.wait_codes[0]),
                    LoweredNode::WaitFlags(p) => (p.error_word, p.peer_errors, p.codes[0]),
                    LoweredNode::Copy { .. } | LoweredNode::FlagSet { .. } => continue,
                };
                kinds.insert(node.name());
                assert_eq!((error_word, peer_errors.to_vec()), (own, peers.clone()));
                let site = super::super::error::decode_timeout(code);
                assert_eq!(site.map(|s| s.device), Some(d), "{kind}: {node:?}");
            }
            let expected: &[&str] = match (kind.collective(), kind.is_pipelined()) {
                (crate::schedule::Collective::AllGather, _) => &["barrier", "gemm", "release"],
                (_, true) => &["barrier", "gemm"],
                (_, false) => &["barrier", "gemm", "reduce"],
            };
            assert_eq!(kinds.into_iter().collect::<Vec<_>>(), expected, "{kind}");
        }
    }
}

#[test]
fn every_node_kind_lowers_to_its_graph_node() {
    // TP = 3: one schedule of each shape, every plan node kind.
    let mut seen = std::collections::BTreeSet::new();
    for kind in ScheduleKind::ALL {
        let (plan, addr, g) = lowered(kind, 3, 1);
        for (node, lowered) in plan.devices[1].nodes.iter().zip(&g.nodes) {
            let expected = match node {
                Node::Barrier(_) => "barrier",
                Node::PeerCopy(_) => "copy",
                Node::FlagSet(_) => "flag",
                Node::Gemm(_) => "gemm",
                Node::Reduce(_) => "reduce",
                Node::AwaitRelease(_) => "release",
            };
            assert_eq!(lowered.name(), expected, "{kind}");
            seen.insert(expected);
            if let (Node::FlagSet(f), LoweredNode::FlagSet { dst, value }) = (node, lowered) {
                let owner = &addr[f.flag.device];
                let at = owner.exclusive + plan.exclusive.flag_offset(f.flag.index) as u64;
                assert_eq!((*dst, *value), (at, f.value), "{kind}");
            }
        }
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
}

#[test]
fn a_deferred_stage_may_not_touch_what_the_barrier_guards() {
    let problem = Problem::new(128, 128, 128);
    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingB, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let first = plan.devices[0]
        .nodes
        .iter()
        .position(|n| matches!(n, Node::Gemm(_)))
        .unwrap_or_else(|| panic!("no gemm"));
    assert!(
        plan.devices[0]
            .predecessors(first)
            .any(|(_, k)| k == EdgeKind::ProgrammaticDeferred)
    );
    let flag = FlagRef {
        device: 0,
        index: 1,
    };
    let peer_view = |g: &mut GemmStage| g.b.device = 1;
    let edits: [&dyn Fn(&mut GemmStage); 3] = [
        &|g| g.waits = Some(flag),
        &|g| g.signals = Some(flag),
        &peer_view,
    ];
    for edit in edits {
        let mut plan = plan.clone();
        if let Node::Gemm(g) = &mut plan.devices[0].nodes[first] {
            edit(g);
        }
        assert!(matches!(
            lower_device(&plan, 0, &addresses(2), &options()),
            Err(DistGemmError::Internal(_))
        ));
    }
    assert!(lower_device(&plan, 0, &addresses(2), &options()).is_ok());
}

/// A reduce-scatter stage 0 reads only its own device's memory and uses no flag, but it
/// writes a workspace slot that the right neighbour's previous run may still read: behind
/// a deferred edge (an edited plan) it is refused, as is an all-gather stage 0 whose D view
/// is moved into the workspace.
#[test]
fn a_deferred_stage_writes_only_its_own_d() {
    let problem = Problem::new(128, 128, 128);
    let defer_first_gemm = |plan: &mut Plan| {
        let dev = &mut plan.devices[0];
        let first = dev
            .nodes
            .iter()
            .position(|n| matches!(n, Node::Gemm(_)))
            .unwrap_or_else(|| panic!("no gemm"));
        for e in dev.edges.iter_mut().filter(|e| e.to == first) {
            e.kind = EdgeKind::ProgrammaticDeferred;
        }
        first
    };
    let refused = |plan: &Plan| {
        matches!(
            lower_device(plan, 0, &addresses(2), &options()),
            Err(DistGemmError::Internal(what)) if what.contains("not its D")
        )
    };
    for partials in crate::plan::RsPartials::ALL {
        let plan_options = crate::plan::PlanOptions {
            rs_partials: partials,
        };
        let mut plan =
            Plan::build_with(ScheduleKind::ReduceScatterTilingA, problem, 2, plan_options)
                .unwrap_or_else(|e| panic!("{e}"));
        let first = defer_first_gemm(&mut plan);
        assert!(
            matches!(&plan.devices[0].nodes[first], Node::Gemm(g) if g.stage == 0
                && g.d.buffer == BufferKind::Workspace)
        );
        assert!(refused(&plan), "{}", partials.cli_name());
    }
    let mut plan =
        Plan::build(ScheduleKind::AllGatherRotatingA, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let first = defer_first_gemm(&mut plan);
    assert!(lower_device(&plan, 0, &addresses(2), &options()).is_ok());
    if let Node::Gemm(g) = &mut plan.devices[0].nodes[first] {
        g.d.buffer = BufferKind::Workspace;
    }
    assert!(refused(&plan));
}

/// In an FP8 plan the e4m3 buffers (A, B, an all-gather workspace) have 1-byte elements
/// and C, D and partials 2-byte ones: every view and copy address steps by its own
/// buffer's size. The stage GEMMs are in pair form (`Fp8GemmArgs::as_pairs`): A and B
/// with half the columns and leading dimension, alpha times both tensor-wise scales, the
/// e4m3 entry points.
#[test]
fn fp8_addresses_step_by_each_buffers_element_size() {
    let problem = Problem::new(256, 256, 256)
        .with_scalars(0.75, 0.0)
        .with_fp8(crate::fp8::ScaleMode::Tensorwise);
    let options = LowerOptions {
        fp8_scales: Some([0.5, 0.125]),
        ..options()
    };
    let addr = addresses(4);
    let bytes = |kind: ScheduleKind, buffer: BufferKind| -> u64 {
        let operands = matches!(buffer, BufferKind::A | BufferKind::B)
            || (buffer == BufferKind::Workspace
                && kind.collective() == crate::schedule::Collective::AllGather);
        if operands { 1 } else { 2 }
    };
    let at = |kind: ScheduleKind, v: &View| {
        addr[v.device].of(v.buffer) + v.offset as u64 * bytes(kind, v.buffer)
    };
    let mut offsets = std::collections::HashSet::new();
    for kind in [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherRotatingB,
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterSingleStageB,
    ] {
        let plan = Plan::build(kind, problem, 4).unwrap_or_else(|e| panic!("{e}"));
        let g = lower_device(&plan, 1, &addr, &options).unwrap_or_else(|e| panic!("{e}"));
        for (node, lowered) in plan.devices[1].nodes.iter().zip(&g.nodes) {
            match (node, lowered) {
                (Node::Gemm(s), LoweredNode::Gemm { args, fp8, .. }) => {
                    for (view, got) in [(&s.a, args.a), (&s.b, args.b), (&s.d, args.d)] {
                        assert_eq!(got.ptr, at(kind, view), "{kind} stage {}", s.stage);
                        if view.offset > 0 {
                            offsets.insert(bytes(kind, view.buffer));
                        }
                    }
                    for (view, got) in [(&s.a, args.a), (&s.b, args.b)] {
                        let pairs = (view.cols as u64 / 2, view.ld as u64 / 2);
                        assert_eq!((got.cols, got.ld), pairs, "{kind} stage {}", s.stage);
                    }
                    assert_eq!(args.alpha, s.epilogue.alpha * 0.5 * 0.125, "{kind}");
                    assert_eq!(*fp8, Some(RowScales::default()), "{kind}");
                    if let (Some(c), Some(got)) = (s.epilogue.source.view(), args.c) {
                        assert_eq!(got.ptr, at(kind, c), "{kind} stage {}", s.stage);
                    }
                }
                (Node::PeerCopy(c), LoweredNode::Copy { dst, src, .. }) => {
                    let region = |r: &Region| {
                        addr[r.device].of(r.buffer) + r.offset as u64 * bytes(kind, r.buffer)
                    };
                    assert_eq!((*src, *dst), (region(&c.src), region(&c.dst)), "{kind}");
                    if c.dst.offset > 0 {
                        offsets.insert(bytes(kind, c.dst.buffer));
                    }
                }
                (Node::Reduce(red), LoweredNode::Reduce(p)) => {
                    assert_eq!(p.dst, at(kind, &red.dst), "{kind}");
                    for (s, &ptr) in red.sources.iter().zip(&p.sources) {
                        assert_eq!(ptr, at(kind, s), "{kind}");
                    }
                }
                _ => {}
            }
        }
    }
    // Nonzero offsets into buffers of both sizes were checked.
    assert_eq!(offsets, [1, 2].into_iter().collect());
}

/// A stage GEMM needs scales exactly when the plan is FP8, and tensor-wise ones: the
/// lowering refuses the other combinations instead of running the wrong kernel.
#[test]
fn fp8_stages_need_tensor_wise_scales_and_16_bit_ones_none() {
    use crate::fp8::ScaleMode;
    let kind = ScheduleKind::AllGatherRotatingA;
    let plan = |p: Problem| Plan::build(kind, p, 2).unwrap_or_else(|e| panic!("{e}"));
    let scaled = LowerOptions {
        fp8_scales: Some([1.0, 1.0]),
        ..options()
    };
    let base = Problem::new(256, 256, 256);
    for (problem, options) in [
        (base.with_fp8(ScaleMode::Tensorwise), options()),
        (base.with_fp8(ScaleMode::Rowwise), scaled.clone()),
        (base, scaled.clone()),
    ] {
        let result = lower_device(&plan(problem), 0, &addresses(2), &options);
        assert!(result.is_err(), "{problem:?} {:?}", options.fp8_scales);
    }
    let fp8 = plan(base.with_fp8(ScaleMode::Tensorwise));
    assert!(lower_device(&fp8, 0, &addresses(2), &scaled).is_ok());
}

#[test]
fn reduce_scatter_stages_read_the_left_slot_and_signal_the_right_flag() {
    let (plan, addr, g) = lowered(ScheduleKind::ReduceScatterTilingA, 2, 1);
    let LoweredNode::Gemm { args, hook, .. } = &g.nodes[2] else {
        panic!("node 2 is not a gemm")
    };
    assert_eq!(args.c.map(|c| c.ptr), Some(addr[0].workspace));
    assert_eq!(args.beta, 1.0);
    assert_eq!(
        hook.signal_flag,
        addr[0].exclusive + plan.exclusive.flag_offset(1) as u64
    );
    assert_eq!(
        hook.wait_flag,
        addr[1].exclusive + plan.exclusive.flag_offset(1) as u64
    );
    assert_eq!(g.edges[1].kind, DependencyKind::Programmatic);
    // Stage 0 writes the slot the right neighbour reads: it waits for the barrier first.
    let LoweredNode::Gemm { hook: first, .. } = &g.nodes[1] else {
        panic!("node 1 is not a gemm")
    };
    assert_eq!(first.flags, 0);
}

/// Pushed partials at TP = 3, device 1: the push after stage 0 copies the own send slot
/// `S_0` (slot 2) into device 2's receive slot `R_1` (slot 0) on this GPU's copy engine,
/// then sets device 2's flag 1; the push after stage 1 moves `S_1` (slot 3) into `R_2`
/// (slot 1). Stages t > 0 signal nothing, wait for their own flag t and read C from their
/// own `R_t` (slot t − 1).
#[test]
fn a_push_copies_the_own_slot_into_the_right_neighbours_and_sets_its_flag() {
    let tp = 3;
    let problem = Problem::new(64 * tp, 64 * tp, 64 * tp);
    let push = crate::plan::PlanOptions {
        rs_partials: crate::plan::RsPartials::Push,
    };
    let plan = Plan::build_with(ScheduleKind::ReduceScatterTilingA, problem, tp, push)
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = addresses(tp);
    let g = lower_device(&plan, 1, &addr, &options()).unwrap_or_else(|e| panic!("{e}"));
    let dev = &plan.devices[1];
    assert_eq!(g.nodes.len(), dev.nodes.len());
    // mb×N = 64×192 elements of 2 bytes per slot.
    let slot = 64 * 192 * 2;
    assert_eq!(dev.workspace_bytes, 4 * slot);
    let flag = |q: usize, i: usize| addr[q].exclusive + plan.exclusive.flag_offset(i) as u64;
    let mut pushes = Vec::new();
    for (i, (node, lowered)) in dev.nodes.iter().zip(&g.nodes).enumerate() {
        match (node, lowered) {
            (Node::PeerCopy(c), LoweredNode::Copy { dst, src, bytes }) => {
                pushes.push((c.stage, *src, *dst, *bytes));
                // After the GEMM that wrote the source, on a default edge.
                let into: Vec<_> = g.edges.iter().filter(|e| e.to == i).collect();
                assert_eq!(into.len(), 1);
                assert_eq!(into[0].kind, DependencyKind::Default);
                assert!(
                    matches!(&g.nodes[into[0].from], LoweredNode::Gemm { stage, .. } if stage + 1 == c.stage)
                );
                // Then the flag set of device 2's stage flag.
                let next = g.edges.iter().find(|e| e.from == i).map(|e| &g.nodes[e.to]);
                assert_eq!(
                    next,
                    Some(&LoweredNode::FlagSet {
                        dst: flag(2, c.stage),
                        value: crate::plan::FLAG_SET_VALUE
                    })
                );
            }
            (Node::Gemm(s), LoweredNode::Gemm { args, hook, .. }) if s.stage > 0 => {
                assert_eq!(hook.signal_flag, 0);
                assert_eq!(hook.wait_flag, flag(1, s.stage));
                // The flag guards only C: the kernel waits at its first C load.
                assert_eq!(hook.flags, HOOK_WAIT_BEFORE_C);
                // R_t = slot t−1 of the own workspace.
                let r = addr[1].workspace + (s.stage as u64 - 1) * slot as u64;
                assert_eq!(args.c.map(|c| c.ptr), Some(r));
            }
            _ => {}
        }
    }
    let (ws1, ws2) = (addr[1].workspace, addr[2].workspace);
    let slot = slot as u64;
    assert_eq!(
        pushes,
        vec![
            (1, ws1 + 2 * slot, ws2, 64 * 192 * 2),
            (2, ws1 + 3 * slot, ws2 + slot, 64 * 192 * 2),
        ]
    );
    // A dropped flag store keeps the node and stores 0.
    let missing = LowerOptions {
        missing_signals: vec![FlagRef {
            device: 2,
            index: 1,
        }],
        ..options()
    };
    let g = lower_device(&plan, 1, &addr, &missing).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        g.nodes
            .iter()
            .any(|n| matches!(n, LoweredNode::FlagSet { dst, value: 0 } if *dst == flag(2, 1)))
    );
}

#[test]
fn local_c_diagnostic_reads_the_same_slot_on_the_own_device() {
    let (plan, addr, _) = lowered(ScheduleKind::ReduceScatterTilingA, 2, 1);
    let mut opts = options();
    opts.diagnostics.local_c = true;
    let g = lower_device(&plan, 1, &addr, &opts).unwrap_or_else(|e| panic!("{e}"));
    let LoweredNode::Gemm { args, hook, .. } = &g.nodes[2] else {
        panic!("node 2 is not a gemm")
    };
    // Device 1's own workspace where the plan reads device 0's; flags unchanged.
    assert_eq!(args.c.map(|c| c.ptr), Some(addr[1].workspace));
    assert_eq!(
        hook.wait_flag,
        addr[1].exclusive + plan.exclusive.flag_offset(1) as u64
    );
}

#[test]
fn single_stage_reduction_reads_block_d_of_every_partial() {
    let (plan, addr, g) = lowered(ScheduleKind::ReduceScatterSingleStageB, 2, 1);
    let LoweredNode::Reduce(p) = &g.nodes[2] else {
        panic!("node 2 is not the reduction")
    };
    // N = 128, nb = 64: block 1 starts 64 columns into each M×N partial.
    assert_eq!(p.source_count, 2);
    assert_eq!(p.sources[0], addr[0].workspace + 2 * 64);
    assert_eq!(p.sources[1], addr[1].workspace + 2 * 64);
    assert_eq!(p.source_ld[..2], [128, 128]);
    assert_eq!((p.rows, p.cols, p.dst_ld), (128, 64, 64));
    assert_eq!(
        p.signals[0],
        addr[0].exclusive + plan.exclusive.flag_offset(1) as u64
    );
    assert_eq!(
        p.waits[0],
        addr[1].exclusive + plan.exclusive.flag_offset(0) as u64
    );
    assert_eq!((p.signal_count, p.wait_count), (1, 1));
}

#[test]
fn missing_signals_keep_the_node_but_drop_the_store() {
    let problem = Problem::new(128, 128, 128);
    let plan = Plan::build(ScheduleKind::ReduceScatterTilingA, problem, 2)
        .unwrap_or_else(|e| panic!("{e}"));
    let missing = FlagRef {
        device: 0,
        index: 1,
    };
    let opts = LowerOptions {
        missing_signals: vec![missing],
        ..options()
    };
    let g = lower_device(&plan, 1, &addresses(2), &opts).unwrap_or_else(|e| panic!("{e}"));
    let LoweredNode::Gemm { hook, .. } = &g.nodes[2] else {
        panic!("node 2 is not a gemm")
    };
    assert_eq!(hook.signal_flag, 0);
    assert_ne!(hook.wait_flag, 0);

    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingB, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let g = lower_device(&plan, 0, &addresses(2), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(g.nodes[2], LoweredNode::FlagSet { value: 0, .. }));
}

#[test]
fn uncoupled_runs_skip_the_rendezvous_and_no_flag_waits_skip_the_waits() {
    let problem = Problem::new(256, 256, 256);
    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingB, problem, 2).unwrap_or_else(|e| panic!("{e}"));
    let opts = LowerOptions {
        diagnostics: TimingDiagnostics {
            no_rendezvous: true,
            no_flag_waits: true,
            ..TimingDiagnostics::default()
        },
        ..options()
    };
    let full = lower_device(&plan, 0, &addresses(2), &options()).unwrap();
    let cut = lower_device(&plan, 0, &addresses(2), &opts).unwrap();
    assert_eq!(full.edges, cut.edges);
    let (mut barriers, mut waits) = (0, 0);
    for (f, c) in full.nodes.iter().zip(&cut.nodes) {
        match (f, c) {
            (LoweredNode::Barrier(f), LoweredNode::Barrier(c)) => {
                barriers += 1;
                assert_eq!((f.arrive_count, f.arrivals), (1, 1));
                assert_eq!((c.arrive_count, c.arrivals), (0, 0));
                assert_eq!((c.reset, c.reset_count), (f.reset, f.reset_count));
            }
            (LoweredNode::Gemm { hook: f, .. }, LoweredNode::Gemm { hook: c, .. }) => {
                waits += usize::from(f.wait_flag != 0);
                assert_eq!(c.wait_flag, 0);
            }
            _ => assert_eq!(f, c),
        }
    }
    assert_eq!((barriers, waits), (1, 1));
}

#[test]
fn a_copy_limit_shortens_the_copies_and_keeps_the_graph() {
    let problem = Problem::new(256, 256, 256);
    let plan =
        Plan::build(ScheduleKind::AllGatherRotatingA, problem, 4).unwrap_or_else(|e| panic!("{e}"));
    let full = lower_device(&plan, 1, &addresses(4), &options()).unwrap();
    let opts = LowerOptions {
        diagnostics: TimingDiagnostics {
            copy_limit: Some(4096),
            ..TimingDiagnostics::default()
        },
        ..options()
    };
    let capped = lower_device(&plan, 1, &addresses(4), &opts).unwrap();
    assert_eq!(full.edges, capped.edges);
    let mut copies = 0;
    for (f, c) in full.nodes.iter().zip(&capped.nodes) {
        match (f, c) {
            (
                LoweredNode::Copy { dst, src, bytes },
                LoweredNode::Copy {
                    dst: d2,
                    src: s2,
                    bytes: b2,
                },
            ) => {
                copies += 1;
                assert_eq!((dst, src), (d2, s2));
                assert!(*bytes > 4096);
                assert_eq!(*b2, 4096);
            }
            _ => assert_eq!(f, c),
        }
    }
    assert_eq!(copies, 3);
}

#[test]
fn a_missing_buffer_address_is_an_error_not_a_null_pointer() {
    let plan = Plan::build(
        ScheduleKind::AllGatherRotatingA,
        Problem::new(64, 64, 64),
        2,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut addr = addresses(2);
    addr[1].a = 0;
    assert!(matches!(
        lower_device(&plan, 0, &addr, &options()),
        Err(DistGemmError::Internal(_))
    ));
    assert!(matches!(
        lower_device(&plan, 5, &addr, &options()),
        Err(DistGemmError::NoSuchDevice { .. })
    ));
}

/// The configurations the rule picks for `kind`'s stage GEMMs of `problem` at `tp`
/// (device by device, stage by stage), on an H200's 132 SMs.
fn stage_variants(
    kind: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> Vec<&'static crate::gemm::GemmVariant> {
    let plan = Plan::build(kind, problem, tp).unwrap_or_else(|e| panic!("{e}"));
    let addr = addresses(tp);
    (0..tp)
        .flat_map(|d| {
            let g = lower_device(&plan, d, &addr, &options()).unwrap_or_else(|e| panic!("{e}"));
            g.nodes.into_iter().filter_map(|node| match node {
                LoweredNode::Gemm { args, fp8, .. } => {
                    Some(crate::gemm::rule_variant(&args, fp8, 132))
                }
                _ => None,
            })
        })
        .collect()
}

/// `gpu_distributed`'s one-GPU tests (`tp1_plans_on_one_gpu`, `two_ranks_on_one_gpu`) run
/// every kind of tile configuration the rule has in stage GEMMs, under the stages' waits
/// and signals and inside their graphs: here every stage of the schedules named takes the
/// kind of configuration each of those problems is there for, so the tests cover it.
/// - 2-block clusters: rows off 32-byte boundaries (K ≡ 8 mod 16 pitches at TP = 1 and in
///   the all-gathers; at TP = 2 the reduce-scatters need K/2 a multiple of 8, so there a
///   view that starts K/2 columns in, 16 bytes off).
/// - split-K (stream-K grids, f32 partials and arrival counters): 64 tokens of narrow
///   weights with long K in the all-gathers.
/// - the transposed decode tiles (the weights on the `wgmma`'s M side), split or with four
///   k-blocks a stage: 16 tokens.
#[test]
fn the_one_gpu_test_problems_cover_every_kind_of_stage_configuration() {
    use crate::gemm::GemmVariant;
    use Collective::{AllGather, ReduceScatter};
    type Wanted = fn(&GemmVariant) -> bool;
    let clustered: Wanted = |v| v.config.cluster_m == 2;
    let split: Wanted = |v| v.config.split_k;
    let transposed: Wanted = |v| v.config.swap_ab;
    let transposed_split: Wanted = |v| v.config.swap_ab && v.config.split_k;
    let cases = [
        (1, Problem::new(2048, 2048, 4104), None, clustered),
        (
            2,
            Problem::new(2048, 4096, 4104),
            Some(AllGather),
            clustered,
        ),
        (
            2,
            Problem::new(2048, 2048, 4112),
            Some(ReduceScatter),
            clustered,
        ),
        (2, Problem::new(64, 2048, 8192), Some(AllGather), split),
        (1, Problem::new(16, 2304, 16384), None, transposed_split),
        (2, Problem::new(16, 4608, 16384), None, transposed),
    ];
    for (tp, problem, collective, wanted) in cases {
        let kinds = ScheduleKind::ALL.into_iter();
        for kind in kinds.filter(|k| collective.is_none_or(|c| c == k.collective())) {
            let variants = stage_variants(kind, problem, tp);
            assert!(
                !variants.is_empty(),
                "{kind} TP={tp} {problem}: no stage GEMM"
            );
            for v in variants {
                assert!(wanted(v), "{kind} TP={tp} {problem}: {}", v.name);
            }
        }
    }
}
