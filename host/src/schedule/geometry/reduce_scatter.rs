//! The reduce-scatter programs: `rs-a` and `rs-b`, pipelined over P stages with partials
//! read or pushed ([`RsPartials`]), and their single-stage variants (the parent module's
//! documentation gives the index maps and the slots of pushed partials).

use super::{
    CopyDirection, CopyStep, DeviceProgram, Dims, GemmStage, ReduceStep, RsPartials, whole,
};
use crate::problem::Problem;
use crate::schedule::view::{
    Block, BufferKind, CSource, Epilogue, FlagRef, GemmShape, Region, ShardLayout, View,
    WorkspaceLayout,
};
use crate::schedule::{ScheduleKind, ring};

/// The workspace slots of the pipelined reduce-scatter at P devices (the parent module's
/// documentation).
#[derive(Clone, Copy)]
struct RsSlots {
    p: usize,
    partials: RsPartials,
}

impl RsSlots {
    fn count(self) -> usize {
        match self.partials {
            RsPartials::Read => self.p - 1,
            RsPartials::Push => self.p - 1 + (self.p - 1).min(2),
        }
    }

    /// The slot stage t < P−1 writes its partial into.
    fn send(self, t: usize) -> usize {
        match (self.partials, t) {
            (RsPartials::Read, _) => t,
            (RsPartials::Push, 0) => self.p - 1,
            (RsPartials::Push, 1) => self.p,
            (RsPartials::Push, _) => self.receive(t - 1),
        }
    }

    /// The slot stage t > 0 reads C from (the left neighbour's when reading, the own when
    /// pushed).
    fn receive(self, t: usize) -> usize {
        match self.partials {
            RsPartials::Read => self.send(t - 1),
            RsPartials::Push => t - 1,
        }
    }
}

/// Device `d`'s program of the reduce-scatter schedule `kind`, its partials moved as
/// `partials` says when `kind` is pipelined.
pub(super) fn reduce_scatter(
    kind: ScheduleKind,
    problem: &Problem,
    g: Dims,
    d: usize,
    partials: RsPartials,
) -> DeviceProgram {
    let tiles_m = kind.tiles_rows();
    let a = Block {
        row0: 0,
        col0: d * g.kb,
        rows: g.m,
        cols: g.kb,
    };
    let b = Block {
        row0: 0,
        col0: d * g.kb,
        rows: g.n,
        cols: g.kb,
    };
    let out = if tiles_m {
        Block {
            row0: d * g.mb,
            col0: 0,
            rows: g.mb,
            cols: g.n,
        }
    } else {
        Block {
            row0: 0,
            col0: d * g.nb,
            rows: g.m,
            cols: g.nb,
        }
    };
    let shards = ShardLayout {
        a,
        b,
        c: None,
        d: out,
    };
    let no_c = Epilogue {
        alpha: problem.alpha,
        beta: 0.0,
        source: CSource::None,
    };
    let a_all = whole(d, BufferKind::A, &a);
    let b_all = whole(d, BufferKind::B, &b);

    if kind.is_pipelined() {
        let left = ring(d, -1, g.p);
        let right = ring(d, 1, g.p);
        // One slot = one output tile (mb×N or M×nb), packed.
        let slots = RsSlots { p: g.p, partials };
        let workspace = WorkspaceLayout {
            slots: slots.count(),
            slot_elements: out.elements(),
        };
        let pushed = partials == RsPartials::Push;
        let slot = |device: usize, j: usize| View {
            device,
            buffer: BufferKind::Workspace,
            offset: workspace.slot_offset(j),
            rows: out.rows,
            cols: out.cols,
            ld: out.cols,
        };
        let gemms = (0..g.p)
            .map(|t| {
                let tile = ring(d, -1 - t as isize, g.p);
                let (a_view, b_view, shape) = if tiles_m {
                    let rows = View {
                        offset: tile * g.mb * g.kb,
                        rows: g.mb,
                        ..a_all
                    };
                    (
                        rows,
                        b_all,
                        GemmShape {
                            m: g.mb,
                            n: g.n,
                            k: g.kb,
                        },
                    )
                } else {
                    let rows = View {
                        offset: tile * g.nb * g.kb,
                        rows: g.nb,
                        ..b_all
                    };
                    (
                        a_all,
                        rows,
                        GemmShape {
                            m: g.m,
                            n: g.nb,
                            k: g.kb,
                        },
                    )
                };
                let d_view = if t + 1 == g.p {
                    whole(d, BufferKind::D, &out)
                } else {
                    slot(d, slots.send(t))
                };
                let epilogue = if t == 0 {
                    no_c
                } else {
                    Epilogue {
                        alpha: problem.alpha,
                        beta: 1.0,
                        source: match partials {
                            RsPartials::Read => CSource::Peer(slot(left, slots.receive(t))),
                            RsPartials::Push => CSource::Local(slot(d, slots.receive(t))),
                        },
                    }
                };
                GemmStage {
                    stage: t,
                    tile: Some(tile),
                    peer: Some(left),
                    shape,
                    a: a_view,
                    b: b_view,
                    d: d_view,
                    epilogue,
                    // Reading: "my previous stage's partial is complete" (the left
                    // neighbour's push sets the flag instead).
                    signals: (t > 0 && !pushed).then_some(FlagRef {
                        device: right,
                        index: t,
                    }),
                    waits: (t > 0).then_some(FlagRef {
                        device: d,
                        index: t,
                    }),
                }
            })
            .collect();
        // Pushing: after stage t < P−1, S_t into the right neighbour's R_{t+1}, then its
        // flag t+1.
        let region = |device: usize, j: usize| Region {
            device,
            buffer: BufferKind::Workspace,
            offset: workspace.slot_offset(j),
            len: workspace.slot_elements,
        };
        let copies = if pushed {
            (1..g.p)
                .map(|t| CopyStep {
                    stage: t,
                    src: region(d, slots.send(t - 1)),
                    dst: region(right, slots.receive(t)),
                    sets_flag: Some(FlagRef {
                        device: right,
                        index: t,
                    }),
                    direction: CopyDirection::Push,
                })
                .collect()
        } else {
            Vec::new()
        };
        DeviceProgram {
            device: d,
            shards,
            workspace,
            copies,
            gemms,
            reduce: None,
        }
    } else {
        // The whole M×N partial, ld N: slot q is output block q when tiling M; when tiling N
        // the blocks are column blocks of it (the slot count is still P).
        let workspace = WorkspaceLayout {
            slots: g.p,
            slot_elements: out.elements(),
        };
        let partial = View {
            device: d,
            buffer: BufferKind::Workspace,
            offset: 0,
            rows: g.m,
            cols: g.n,
            ld: g.n,
        };
        let gemm = GemmStage {
            stage: 0,
            tile: None,
            peer: None,
            shape: GemmShape {
                m: g.m,
                n: g.n,
                k: g.kb,
            },
            a: a_all,
            b: b_all,
            d: partial,
            epilogue: no_c,
            signals: None,
            waits: None,
        };
        let block_of = |q: usize| {
            let offset = if tiles_m { d * g.mb * g.n } else { d * g.nb };
            View {
                device: q,
                offset,
                rows: out.rows,
                cols: out.cols,
                ..partial
            }
        };
        let peers = (0..g.p).filter(|&q| q != d);
        let reduce = ReduceStep {
            stage: 1,
            sources: (0..g.p).map(block_of).collect(),
            dst: whole(d, BufferKind::D, &out),
            signals: peers
                .clone()
                .map(|q| FlagRef {
                    device: q,
                    index: d,
                })
                .collect(),
            waits: peers
                .map(|q| FlagRef {
                    device: d,
                    index: q,
                })
                .collect(),
        };
        DeviceProgram {
            device: d,
            shards,
            workspace,
            copies: Vec::new(),
            gemms: vec![gemm],
            reduce: Some(reduce),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{device_program, device_program_with};

    #[test]
    fn reduce_scatter_last_stage_owns_its_block() {
        let problem = Problem::new(64, 64, 64);
        for d in 0..4 {
            let prog = device_program(ScheduleKind::ReduceScatterTilingA, &problem, 4, d);
            let last = prog.gemms.last().map(|g| (g.tile, g.d.buffer));
            assert_eq!(last, Some((Some(d), BufferKind::D)));
        }
    }

    /// Pushing: every stage's C is the own slot the left neighbour's push for that stage
    /// fills, every push reads the slot its stage wrote, and the slots are P−1 + min(P−1, 2).
    #[test]
    fn pushed_partials_land_where_the_next_stage_reads_them() {
        for kind in [
            ScheduleKind::ReduceScatterTilingA,
            ScheduleKind::ReduceScatterTilingB,
        ] {
            for p in 1..=8 {
                let problem = Problem::new(64 * p, 64 * p, 64 * p);
                let progs: Vec<DeviceProgram> = (0..p)
                    .map(|d| device_program_with(kind, &problem, p, d, RsPartials::Push))
                    .collect();
                for prog in &progs {
                    let d = prog.device;
                    assert_eq!(prog.workspace.slots, p - 1 + (p - 1).min(2), "P={p}");
                    assert_eq!(prog.copies.len(), p - 1);
                    for copy in &prog.copies {
                        let t = copy.stage;
                        assert_eq!(copy.direction, CopyDirection::Push);
                        // The source is what the own stage t−1 wrote.
                        let producer = &prog.gemms[t - 1];
                        assert_eq!(
                            (copy.src.device, copy.src.offset, copy.src.len),
                            (d, producer.d.offset, producer.d.elements())
                        );
                        assert_eq!(producer.d.buffer, BufferKind::Workspace);
                        // The destination is what the right neighbour's stage t reads, after
                        // the flag this push sets.
                        let consumer = &progs[copy.dst.device].gemms[t];
                        let c = consumer.epilogue.source;
                        assert!(matches!(c, CSource::Local(v) if v.offset == copy.dst.offset));
                        assert_eq!(copy.sets_flag, consumer.waits);
                        assert_eq!(copy.dst.device, ring(d, 1, p));
                        assert_eq!(consumer.tile, producer.tile, "the same tile moves on");
                    }
                    assert!(prog.gemms.iter().all(|g| g.signals.is_none()));
                }
            }
        }
    }
}
