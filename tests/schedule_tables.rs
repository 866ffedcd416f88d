//! The worked TP=4 tables of CUTLASS's DistGEMM schedules (which device computes which tile
//! with which operand block at each stage), reproduced from the plans.

use distgemm::plan::{Node, Plan};
use distgemm::problem::Problem;
use distgemm::schedule::{BufferKind, CSource, FlagRef, GemmStage, ScheduleKind};

const P: usize = 4;

/// All-gather: entry (d, t) = the shard used = the tile written.
const AG: [[usize; 4]; 4] = [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]];
/// Reduce-scatter: entry (d, t) = the block m computed.
const RS: [[usize; 4]; 4] = [[3, 2, 1, 0], [0, 3, 2, 1], [1, 0, 3, 2], [2, 1, 0, 3]];

fn plan(kind: ScheduleKind) -> Plan {
    Plan::build(kind, Problem::new(64, 64, 64), P).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn gemms(plan: &Plan, d: usize) -> Vec<GemmStage> {
    plan.devices[d].gemms().copied().collect()
}

#[test]
fn all_gather_rotating_a_and_b_tables() {
    for kind in [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherRotatingB,
    ] {
        let plan = plan(kind);
        let rotating = if kind == ScheduleKind::AllGatherRotatingA {
            BufferKind::A
        } else {
            BufferKind::B
        };
        for d in 0..P {
            let stages = gemms(&plan, d);
            assert_eq!(stages.len(), P);
            let copies: Vec<_> = plan.devices[d]
                .nodes
                .iter()
                .filter_map(|n| {
                    if let Node::PeerCopy(c) = n {
                        Some(*c)
                    } else {
                        None
                    }
                })
                .collect();
            assert_eq!(copies.len(), P - 1);
            for (t, g) in stages.iter().enumerate() {
                let p = AG[d][t];
                assert_eq!((g.peer, g.tile), (Some(p), Some(p)), "{kind} d={d} t={t}");
                assert_eq!((g.shape.m, g.shape.n, g.shape.k), (16, 16, 64));
                let operand = if rotating == BufferKind::A { g.a } else { g.b };
                // The D tile: row block p of the M×16 D (ag-a), column block p of the 16×M D (ag-b).
                let want_offset = if rotating == BufferKind::A {
                    p * 16 * 16
                } else {
                    p * 16
                };
                assert_eq!(g.d.offset, want_offset, "{kind} d={d} t={t}");
                if t == 0 {
                    assert_eq!(
                        (operand.device, operand.buffer),
                        (d, rotating),
                        "local shard at t=0"
                    );
                    assert_eq!(g.waits, None);
                } else {
                    assert_eq!(
                        (operand.buffer, operand.offset),
                        (BufferKind::Workspace, (t - 1) * 16 * 64)
                    );
                    assert_eq!(
                        g.waits,
                        Some(FlagRef {
                            device: d,
                            index: t
                        })
                    );
                    let copy = copies[t - 1];
                    assert_eq!(
                        (copy.stage, copy.src.device, copy.src.buffer),
                        (t, p, rotating)
                    );
                    assert_eq!(
                        (copy.dst.buffer, copy.dst.offset, copy.bytes),
                        (BufferKind::Workspace, operand.offset, 16 * 64 * 2)
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_tiling_a_and_b_tables() {
    for kind in [
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterTilingB,
    ] {
        let plan = plan(kind);
        for (d, row) in RS.iter().enumerate() {
            let left = (d + P - 1) % P;
            let right = (d + 1) % P;
            for (t, g) in gemms(&plan, d).iter().enumerate() {
                assert_eq!(
                    (g.peer, g.tile),
                    (Some(left), Some(row[t])),
                    "{kind} d={d} t={t}"
                );
                let tiled = if kind == ScheduleKind::ReduceScatterTilingA {
                    g.a
                } else {
                    g.b
                };
                assert_eq!(
                    tiled.offset,
                    row[t] * 16 * 16,
                    "uses K-shard rows of block m"
                );
                if t == 0 {
                    assert_eq!((g.epilogue.beta, g.epilogue.source), (0.0, CSource::None));
                    assert_eq!((g.signals, g.waits), (None, None));
                } else {
                    let CSource::Peer(c) = g.epilogue.source else {
                        panic!("{kind} d={d} t={t}: C must be a peer's")
                    };
                    assert_eq!(
                        (g.epilogue.beta, c.device, c.buffer, c.offset),
                        (1.0, left, BufferKind::Workspace, (t - 1) * 1024)
                    );
                    assert_eq!(
                        g.signals,
                        Some(FlagRef {
                            device: right,
                            index: t
                        })
                    );
                    assert_eq!(
                        g.waits,
                        Some(FlagRef {
                            device: d,
                            index: t
                        })
                    );
                }
                if t + 1 == P {
                    assert_eq!(
                        (g.d.buffer, g.tile),
                        (BufferKind::D, Some(d)),
                        "last stage writes own block"
                    );
                } else {
                    assert_eq!((g.d.buffer, g.d.offset), (BufferKind::Workspace, t * 1024));
                }
            }
        }
        // Chain of block m0: GPU1 (t0) → GPU2 (t1) → GPU3 (t2) → GPU0 (t3).
        for (t, d) in [1, 2, 3, 0].into_iter().enumerate() {
            assert_eq!(gemms(&plan, d)[t].tile, Some(0));
        }
    }
}

/// The same table with pushed partials: the same tiles and operand blocks; stage t > 0 reads
/// C from its own slot t−1 (1024 elements each), which the left neighbour's push after its
/// stage t−1 fills before setting flag t; stage t < 3 writes slot 3 (t = 0), 4 (t = 1) or
/// t−2 = 0 (t = 2, reusing `R_1`), and the push after it copies that slot into the right
/// neighbour's slot t. Nothing signals from a kernel.
#[test]
fn reduce_scatter_tables_with_pushed_partials() {
    use distgemm::plan::{PlanOptions, RsPartials};
    use distgemm::schedule::CopyDirection;
    let options = PlanOptions {
        rs_partials: RsPartials::Push,
    };
    const SEND: [usize; 3] = [3 * 1024, 4 * 1024, 0];
    for kind in [
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterTilingB,
    ] {
        let plan = Plan::build_with(kind, Problem::new(64, 64, 64), P, options)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (d, row) in RS.iter().enumerate() {
            let right = (d + 1) % P;
            assert_eq!(plan.devices[d].workspace.slots, 5);
            for (t, g) in gemms(&plan, d).iter().enumerate() {
                assert_eq!(g.tile, Some(row[t]), "{kind} d={d} t={t}");
                assert_eq!(g.signals, None);
                if t > 0 {
                    let CSource::Local(c) = g.epilogue.source else {
                        panic!("{kind} d={d} t={t}: C must be local")
                    };
                    assert_eq!(
                        (c.device, c.buffer, c.offset),
                        (d, BufferKind::Workspace, (t - 1) * 1024)
                    );
                    assert_eq!(
                        g.waits,
                        Some(FlagRef {
                            device: d,
                            index: t
                        })
                    );
                }
                if t + 1 < P {
                    assert_eq!((g.d.buffer, g.d.offset), (BufferKind::Workspace, SEND[t]));
                }
            }
            let pushes: Vec<(usize, usize, usize, usize, Option<FlagRef>)> = plan.devices[d]
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| match n {
                    Node::PeerCopy(c) => {
                        assert_eq!(c.direction, CopyDirection::Push);
                        let flag =
                            plan.devices[d]
                                .edges
                                .iter()
                                .find(|e| e.from == i)
                                .and_then(|e| match &plan.devices[d].nodes[e.to] {
                                    Node::FlagSet(f) => Some(f.flag),
                                    _ => None,
                                });
                        Some((c.stage, c.src.offset, c.dst.device, c.dst.offset, flag))
                    }
                    _ => None,
                })
                .collect();
            let expected: Vec<_> = (1..P)
                .map(|t| {
                    let flag = FlagRef {
                        device: right,
                        index: t,
                    };
                    (t, SEND[t - 1], right, (t - 1) * 1024, Some(flag))
                })
                .collect();
            assert_eq!(pushes, expected, "{kind} d={d}");
        }
    }
}
