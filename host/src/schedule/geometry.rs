//! Per-device programs: the shards, workspace, copies, stage GEMMs and reduction of every
//! schedule. Notation: P = TP, d = device, t = stage, `mb = M/P`, `nb = N/P`, `kb = K/P`,
//! `left = (d−1) mod P`, `right = (d+1) mod P`.
//!
//! **All-gather, rotating A** (`ag-a`): device d holds A rows `[d·mb, +mb)` (mb×K), B rows
//! `[d·nb, +nb)` (nb×K) and D columns `[d·nb, +nb)` (M×nb, ld nb). At stage t it uses the A shard
//! of `p = (d+t) mod P` — its own at t = 0, else workspace slot t−1, filled by a copy from p —
//! and computes the row block p of its D: offset `p·mb·nb`, mb×nb, ld nb. GEMM (mb, nb, K).
//!
//! **All-gather, rotating B** (`ag-b`): the transpose: D rows `[d·mb, +mb)` (mb×N, ld N); stage t
//! uses B shard p and writes D's column block p: offset `p·nb`, mb×nb, ld N.
//!
//! **Reduce-scatter, tiling A** (`rs-a`): device d holds the K-shard d of A (M×kb) and of B
//! (N×kb) and D rows `[d·mb, +mb)`. At stage t it computes tile `m = (d−1−t) mod P`: A rows
//! `[m·mb, +mb)` (offset `m·mb·kb`, ld kb) times its whole B shard, GEMM (mb, N, kb). For t > 0
//! it adds C = the left neighbour's workspace slot t−1 (beta = 1); for t < P−1 it writes its own
//! slot t, at t = P−1 its D. The left neighbour's slot t−1 holds tile `(d−1−1−(t−1)) mod P = m`,
//! the same tile: each partial moves one hop right per stage and ends on device m.
//!
//! **Reduce-scatter, tiling B** (`rs-b`): the transpose, with column tiles of N: B rows
//! `[n·nb, +nb)` (offset `n·nb·kb`), GEMM (M, nb, kb), slots and D M×nb with ld nb.
//!
//! **Single-stage variants**: `ag-x-single` copies all P shards of the rotating operand (its own
//! too) into P workspace slots in global order — the gathered M×K (or N×K) operand — and runs
//! one GEMM into the whole local D. `rs-x-single` runs one GEMM of the K-shard into an M×N
//! partial in the workspace (P slots = P output blocks), then a reduction sums block d of all P
//! devices' partials into D, in device order 0..P.

use serde::{Deserialize, Serialize};

use super::view::{
    Block, BufferKind, CSource, Epilogue, FlagRef, GemmShape, Region, ShardLayout, View,
    WorkspaceLayout,
};
use super::{Collective, ScheduleKind, ring};
use crate::problem::Problem;

/// A copy of a peer's shard into this device's workspace, optionally followed by a flag set.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyStep {
    /// The stage whose GEMM consumes the copied data.
    pub stage: usize,
    /// Source (a peer's input shard; the device's own for the single-stage gather).
    pub src: Region,
    /// Destination (a slot of this device's workspace).
    pub dst: Region,
    /// The flag set (to 0xFFFF_FFFF) once the copy is complete, if any.
    pub sets_flag: Option<FlagRef>,
}

/// One stage GEMM `D = alpha·A·Bᵀ + beta·C` of a device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmStage {
    /// Stage index t.
    pub stage: usize,
    /// The output tile computed (`(d+t) mod P` for all-gather, `(d−1−t) mod P` for
    /// reduce-scatter); `None` for a single-stage GEMM, which computes everything at once.
    pub tile: Option<usize>,
    /// The peer the stage communicates with: the source of the rotating operand (all-gather;
    /// `d` itself at t = 0) or the left neighbour whose partial is added (reduce-scatter).
    pub peer: Option<usize>,
    /// Problem size of this launch.
    pub shape: GemmShape,
    /// A operand (shape.m × shape.k).
    pub a: View,
    /// B operand (shape.n × shape.k).
    pub b: View,
    /// Output (shape.m × shape.n).
    pub d: View,
    /// Epilogue (alpha, beta, C).
    pub epilogue: Epilogue,
    /// Flags stored (release) at the start of the stage, before any wait.
    pub signals: Option<FlagRef>,
    /// Own flag waited on (acquire, until non-zero) before any operand is read.
    pub waits: Option<FlagRef>,
}

/// The single-stage reduce-scatter's reduction: `dst = Σ_q sources[q]` (f32, in source order,
/// one rounding at the store).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReduceStep {
    /// Stage index (after the GEMM).
    pub stage: usize,
    /// Block d of every device's partial (device order 0..P).
    pub sources: Vec<View>,
    /// The device's D.
    pub dst: View,
    /// Flags stored (release) first: flag `d` of every peer ("my partial is complete").
    pub signals: Vec<FlagRef>,
    /// Own flags waited on next (acquire): flag `q` for every peer q.
    pub waits: Vec<FlagRef>,
}

/// Everything one device holds and does in one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProgram {
    /// The device index d.
    pub device: usize,
    /// The blocks of A, B, C, D this device holds.
    pub shards: ShardLayout,
    /// Its workspace.
    pub workspace: WorkspaceLayout,
    /// Copies into the workspace, in issue order.
    pub copies: Vec<CopyStep>,
    /// Stage GEMMs, in stage order.
    pub gemms: Vec<GemmStage>,
    /// The reduction of a single-stage reduce-scatter.
    pub reduce: Option<ReduceStep>,
}

/// The sizes every device shares.
#[derive(Clone, Copy)]
struct Dims {
    p: usize,
    m: usize,
    n: usize,
    k: usize,
    mb: usize,
    nb: usize,
    kb: usize,
}

impl Dims {
    fn new(problem: &Problem, p: usize) -> Self {
        let (m, n, k) = (problem.m, problem.n, problem.k);
        Dims {
            p,
            m,
            n,
            k,
            mb: m / p,
            nb: n / p,
            kb: k / p,
        }
    }
}

/// The program of `device` for a problem that passed [`super::can_implement`] at `tp`.
#[must_use]
pub fn device_program(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
    device: usize,
) -> DeviceProgram {
    let g = Dims::new(problem, tp);
    match kind.collective() {
        Collective::AllGather => all_gather(kind, problem, g, device),
        Collective::ReduceScatter => reduce_scatter(kind, problem, g, device),
    }
}

/// A packed-shard view of a whole buffer.
fn whole(device: usize, buffer: BufferKind, block: &Block) -> View {
    View {
        device,
        buffer,
        offset: 0,
        rows: block.rows,
        cols: block.cols,
        ld: block.cols,
    }
}

fn all_gather(kind: ScheduleKind, problem: &Problem, g: Dims, d: usize) -> DeviceProgram {
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

fn reduce_scatter(kind: ScheduleKind, problem: &Problem, g: Dims, d: usize) -> DeviceProgram {
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
        let workspace = WorkspaceLayout {
            slots: g.p - 1,
            slot_elements: out.elements(),
        };
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
                    slot(d, t)
                };
                let epilogue = if t == 0 {
                    no_c
                } else {
                    Epilogue {
                        alpha: problem.alpha,
                        beta: 1.0,
                        source: CSource::Peer(slot(left, t - 1)),
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
                    signals: (t > 0).then_some(FlagRef {
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
        DeviceProgram {
            device: d,
            shards,
            workspace,
            copies: Vec::new(),
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

    #[test]
    fn reduce_scatter_last_stage_owns_its_block() {
        let problem = Problem::new(64, 64, 64);
        for d in 0..4 {
            let prog = device_program(ScheduleKind::ReduceScatterTilingA, &problem, 4, d);
            let last = prog.gemms.last().map(|g| (g.tile, g.d.buffer));
            assert_eq!(last, Some((Some(d), BufferKind::D)));
        }
    }

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
