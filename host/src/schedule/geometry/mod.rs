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

mod all_gather;
mod reduce_scatter;

use serde::{Deserialize, Serialize};

use self::all_gather::all_gather;
use self::reduce_scatter::reduce_scatter;
use super::view::{
    Block, BufferKind, Epilogue, FlagRef, GemmShape, Region, ShardLayout, View, WorkspaceLayout,
};
use super::{Collective, ScheduleKind};
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
