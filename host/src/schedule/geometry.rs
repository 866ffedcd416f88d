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
//! **Pushed partials** ([`RsPartials::Push`], either reduce-scatter above): the same tiles,
//! A and B views, but no GEMM touches a peer's memory. Stage t < P−1 writes its partial into
//! the own *send slot* `S_t`; the device's copy engine then pushes `S_t` into the right
//! neighbour's *receive slot* `R_{t+1}` and sets the neighbour's flag t+1 (the copy and the
//! flag set follow the stage GEMM in the device's own DAG). Stage t > 0 waits for its own flag
//! t and adds C = its own `R_t`. Slots: `R_t` = slot t−1 (t = 1..P−1), `S_0` = slot P−1,
//! `S_1` = slot P (P ≥ 3), and `S_t` = `R_{t−1}` for 2 ≤ t ≤ P−2: a stage writes its
//! partial into the slot whose C the previous stage consumed. P−1 + min(P−1, 2) slots in all
//! (2 at P = 2, P+1 from P = 3 on) against the P−1 of reading; why each reuse is safe is part
//! of the plan's contract ([`crate::plan`], "Slots of pushed partials").
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

/// How the pipelined reduce-scatter schedules hand a partial sum to the right neighbour.
///
/// Both compute the same tiles with the same roundings; they differ in what crosses NVLink
/// and who moves it. Only [`RsPartials::applies_to`] schedules have partials to move; every
/// other schedule's program is the same for both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RsPartials {
    /// The receiving stage's epilogue reads the left neighbour's partial from the neighbour's
    /// workspace (remote loads), after waiting for the flag the neighbour's next stage
    /// signals. The default: measured, and no extra workspace.
    #[default]
    Read,
    /// The left neighbour's copy engine pushes its finished partial into the device's own
    /// workspace after its stage, then sets the device's stage flag; the epilogue reads C
    /// locally. Costs P−1 pushes per device and more workspace slots (see the module
    /// documentation); not yet measured on GPUs.
    Push,
}

impl RsPartials {
    /// Both, in CLI order.
    pub const ALL: [RsPartials; 2] = [RsPartials::Read, RsPartials::Push];

    /// The command-line name (`read`, `push`).
    #[must_use]
    pub const fn cli_name(self) -> &'static str {
        match self {
            RsPartials::Read => "read",
            RsPartials::Push => "push",
        }
    }

    /// Whether the choice changes `kind`'s program: the pipelined reduce-scatter schedules
    /// (`rs-a`, `rs-b`). The single-stage ones reduce in one kernel and the all-gather ones
    /// move no partials.
    #[must_use]
    pub const fn applies_to(kind: ScheduleKind) -> bool {
        matches!(kind.collective(), Collective::ReduceScatter) && kind.is_pipelined()
    }

    /// What `kind` runs when this is asked for: `self` where it applies, else
    /// [`RsPartials::Read`] (the plan records what runs).
    #[must_use]
    pub const fn effective(self, kind: ScheduleKind) -> RsPartials {
        if Self::applies_to(kind) {
            self
        } else {
            RsPartials::Read
        }
    }
}

/// Which way a copy moves data, and so where it hangs in its device's DAG.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyDirection {
    /// Into the own workspace, from a peer's (or the own) input shard: the all-gather copies,
    /// in the copy chain after the start-of-run barrier.
    #[default]
    Pull,
    /// From the own workspace into a peer's workspace: a pushed partial, after the own stage
    /// GEMM that wrote it (stage `stage − 1`).
    Push,
}

/// A copy between workspaces and shards, optionally followed by a flag set.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyStep {
    /// The stage whose GEMM consumes the copied data (on the destination's device).
    pub stage: usize,
    /// Source: a peer's input shard (the device's own for the single-stage gather) when
    /// pulling, the own send slot when pushing.
    pub src: Region,
    /// Destination: a slot of this device's workspace when pulling, of the right neighbour's
    /// when pushing.
    pub dst: Region,
    /// The flag set (to 0xFFFF_FFFF) once the copy is complete, if any.
    pub sets_flag: Option<FlagRef>,
    /// Pull or push (absent in plans written before pushes existed: pull).
    #[serde(default)]
    pub direction: CopyDirection,
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

/// The program of `device` for a problem that passed [`super::can_implement`] at `tp`, with
/// partials read remotely ([`RsPartials::Read`]).
#[must_use]
pub fn device_program(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
    device: usize,
) -> DeviceProgram {
    device_program_with(kind, problem, tp, device, RsPartials::Read)
}

/// As [`device_program`], with the pipelined reduce-scatter's partials moved as `partials`
/// says (ignored by the other schedules).
#[must_use]
pub fn device_program_with(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
    device: usize,
    partials: RsPartials,
) -> DeviceProgram {
    let g = Dims::new(problem, tp);
    match kind.collective() {
        Collective::AllGather => all_gather(kind, problem, g, device),
        Collective::ReduceScatter => reduce_scatter(kind, problem, g, device, partials),
    }
}

/// The workspace slots of the pipelined reduce-scatter at P devices (module documentation).
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

fn reduce_scatter(
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

    #[test]
    fn the_partials_choice_changes_only_the_pipelined_reduce_scatter() {
        let problem = Problem::new(64, 64, 64);
        for kind in ScheduleKind::ALL {
            let read = device_program(kind, &problem, 4, 1);
            let push = device_program_with(kind, &problem, 4, 1, RsPartials::Push);
            assert_eq!(read == push, !RsPartials::applies_to(kind), "{kind}");
            assert_eq!(
                RsPartials::Push.effective(kind) == RsPartials::Push,
                read != push
            );
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
