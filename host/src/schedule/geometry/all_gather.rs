//! The all-gather programs: `ag-a` and `ag-b`, pipelined over P stages, and their
//! single-stage variants (the parent module's documentation gives the index maps).

use super::{CopyDirection, CopyStep, DeviceProgram, Dims, GemmStage, whole};
use crate::problem::Problem;
use crate::schedule::view::{
    Block, BufferKind, CSource, Epilogue, FlagRef, GemmShape, Region, ShardLayout, View,
    WorkspaceLayout,
};
use crate::schedule::{ScheduleKind, ring};

/// Device `d`'s program of the all-gather schedule `kind`.
pub(super) fn all_gather(
    kind: ScheduleKind,
    problem: &Problem,
    g: Dims,
    d: usize,
) -> DeviceProgram {
    let rotates_a = kind.tiles_rows();
    let a = Block {
        row0: d * g.mb,
        col0: 0,
        rows: g.mb,
        cols: g.k,
    };
    let b = Block {
        row0: d * g.nb,
        col0: 0,
        rows: g.nb,
        cols: g.k,
    };
    let out = if rotates_a {
        Block {
            row0: 0,
            col0: d * g.nb,
            rows: g.m,
            cols: g.nb,
        }
    } else {
        Block {
            row0: d * g.mb,
            col0: 0,
            rows: g.mb,
            cols: g.n,
        }
    };
    let shards = ShardLayout {
        a,
        b,
        c: problem.has_c().then_some(out),
        d: out,
    };
    let (rotating_buffer, rotating) = if rotates_a {
        (BufferKind::A, a)
    } else {
        (BufferKind::B, b)
    };
    let slice = rotating.elements();
    // The C view is always the D view on the C buffer: C is tiled exactly like D.
    let epilogue = |d_view: View| Epilogue {
        alpha: problem.alpha,
        beta: problem.beta,
        source: if problem.has_c() {
            CSource::Local(View {
                buffer: BufferKind::C,
                ..d_view
            })
        } else {
            CSource::None
        },
    };
    let peer_shard = |p: usize| Region {
        device: p,
        buffer: rotating_buffer,
        offset: 0,
        len: slice,
    };

    if kind.is_pipelined() {
        let workspace = WorkspaceLayout {
            slots: g.p - 1,
            slot_elements: slice,
        };
        let slot_view = |t: usize| View {
            device: d,
            buffer: BufferKind::Workspace,
            offset: workspace.slot_offset(t - 1),
            rows: rotating.rows,
            cols: g.k,
            ld: g.k,
        };
        let copies = (1..g.p)
            .map(|t| CopyStep {
                stage: t,
                src: peer_shard(ring(d, t as isize, g.p)),
                dst: Region {
                    device: d,
                    buffer: BufferKind::Workspace,
                    offset: workspace.slot_offset(t - 1),
                    len: slice,
                },
                sets_flag: Some(FlagRef {
                    device: d,
                    index: t,
                }),
                direction: CopyDirection::Pull,
            })
            .collect();
        let gemms = (0..g.p)
            .map(|t| {
                let p = ring(d, t as isize, g.p);
                let rotating_view = if t == 0 {
                    whole(d, rotating_buffer, &rotating)
                } else {
                    slot_view(t)
                };
                let (a_view, b_view, d_view) = if rotates_a {
                    let tile = View {
                        device: d,
                        buffer: BufferKind::D,
                        offset: p * g.mb * g.nb,
                        rows: g.mb,
                        cols: g.nb,
                        ld: g.nb,
                    };
                    (rotating_view, whole(d, BufferKind::B, &b), tile)
                } else {
                    let tile = View {
                        device: d,
                        buffer: BufferKind::D,
                        offset: p * g.nb,
                        rows: g.mb,
                        cols: g.nb,
                        ld: g.n,
                    };
                    (whole(d, BufferKind::A, &a), rotating_view, tile)
                };
                GemmStage {
                    stage: t,
                    tile: Some(p),
                    peer: Some(p),
                    shape: GemmShape {
                        m: g.mb,
                        n: g.nb,
                        k: g.k,
                    },
                    a: a_view,
                    b: b_view,
                    d: d_view,
                    epilogue: epilogue(d_view),
                    signals: None,
                    waits: (t > 0).then_some(FlagRef {
                        device: d,
                        index: t,
                    }),
                }
            })
            .collect();
        DeviceProgram {
            device: d,
            shards,
            workspace,
            copies,
            gemms,
            reduce: None,
        }
    } else {
        // Slot p holds shard p: the workspace is the gathered operand in global row order.
        let workspace = WorkspaceLayout {
            slots: g.p,
            slot_elements: slice,
        };
        let copies = (0..g.p)
            .map(|t| {
                let p = ring(d, t as isize, g.p);
                CopyStep {
                    stage: 0,
                    src: peer_shard(p),
                    dst: Region {
                        device: d,
                        buffer: BufferKind::Workspace,
                        offset: workspace.slot_offset(p),
                        len: slice,
                    },
                    sets_flag: None,
                    direction: CopyDirection::Pull,
                }
            })
            .collect();
        let gathered_rows = rotating.rows * g.p;
        let gathered = View {
            device: d,
            buffer: BufferKind::Workspace,
            offset: 0,
            rows: gathered_rows,
            cols: g.k,
            ld: g.k,
        };
        let d_view = whole(d, BufferKind::D, &out);
        let (a_view, b_view) = if rotates_a {
            (gathered, whole(d, BufferKind::B, &b))
        } else {
            (whole(d, BufferKind::A, &a), gathered)
        };
        let gemm = GemmStage {
            stage: 0,
            tile: None,
            peer: None,
            shape: GemmShape {
                m: out.rows,
                n: out.cols,
                k: g.k,
            },
            a: a_view,
            b: b_view,
            d: d_view,
            epilogue: epilogue(d_view),
            signals: None,
            waits: None,
        };
        DeviceProgram {
            device: d,
            shards,
            workspace,
            copies,
            gemms: vec![gemm],
            reduce: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::problem::Problem;
    use crate::schedule::{ScheduleKind, device_program};

    #[test]
    fn all_gather_copies_are_a_permutation_per_stage() {
        let problem = Problem::new(64, 64, 64);
        for t in 1..4 {
            let mut sources: Vec<_> = (0..4)
                .map(|d| {
                    device_program(ScheduleKind::AllGatherRotatingB, &problem, 4, d).copies[t - 1]
                        .src
                        .device
                })
                .collect();
            sources.sort_unstable();
            assert_eq!(sources, vec![0, 1, 2, 3]);
        }
    }
}
