//! The tensor-parallel schedules: which device owns which block of A, B, C and D, and what
//! every device computes and moves at every stage.
//!
//! A schedule is pure data: [`device_program`] turns (schedule, problem, TP) into one
//! [`DeviceProgram`] per device, made of the views of the `view` module. The plan module wires those
//! programs into per-device DAGs; nothing below the plan re-derives an index.
//!
//! The index maps (P = TP, d = device, t = stage, all `mod` non-negative):
//! - all-gather: device d at stage t uses the rotating operand's shard of peer `p = (d+t) mod P`
//!   and computes output tile `p`;
//! - reduce-scatter: device d at stage t computes tile `(d−1−t) mod P` of its K-shard's partial
//!   product and adds the partial of its left neighbour `(d−1) mod P` (stage t−1's output), so
//!   the last stage produces the device's own block `d`.
//!
//! The matrix layouts are those of [`crate::problem`].

mod constraints;
mod geometry;
mod view;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use constraints::{MAX_DIMENSION, ScheduleError, can_implement};
pub(crate) use constraints::{MAX_ELEMENTS, align_elements};
pub use geometry::{
    CopyDirection, CopyStep, DeviceProgram, GemmStage, ReduceStep, RsPartials, device_program,
    device_program_with,
};
pub use view::{
    Block, BufferKind, CSource, Epilogue, FlagRef, GemmShape, Region, ShardLayout, View,
    WorkspaceLayout,
};

/// The largest supported tensor-parallel degree (one NVLink/NVSwitch node).
pub const MAX_TP: usize = 8;

/// Which collective the schedule fuses with the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Collective {
    /// Gather a sharded operand (A or B); every device computes a block of D on its own.
    AllGather,
    /// Every device computes partial products over its K-shard; the partials are summed while
    /// they are scattered so that each device ends up with its block of D.
    ReduceScatter,
}

/// A tensor-parallel schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScheduleKind {
    /// CUTLASS `AllGather1D_TilingCD_RotatingA`: D is column-sharded; A rotates.
    #[serde(rename = "ag-a")]
    AllGatherRotatingA,
    /// CUTLASS `AllGather1D_TilingCD_RotatingB`: D is row-sharded; B rotates.
    #[serde(rename = "ag-b")]
    AllGatherRotatingB,
    /// CUTLASS `ReduceScatter1D_TilingA_RotatingC`: K-sharded, D row-sharded, partials rotate.
    #[serde(rename = "rs-a")]
    ReduceScatterTilingA,
    /// CUTLASS `ReduceScatter1D_TilingB_RotatingC`: K-sharded, D column-sharded, partials rotate.
    #[serde(rename = "rs-b")]
    ReduceScatterTilingB,
    /// Not pipelined: gather all of A (P copies), then one GEMM. Shards as `ag-a`.
    #[serde(rename = "ag-a-single")]
    AllGatherSingleStageA,
    /// Not pipelined: gather all of B (P copies), then one GEMM. Shards as `ag-b`.
    #[serde(rename = "ag-b-single")]
    AllGatherSingleStageB,
    /// Not pipelined: one GEMM over the K-shard (an M×N partial), then a reduce of the P
    /// partials' row block d. Shards as `rs-a`.
    #[serde(rename = "rs-a-single")]
    ReduceScatterSingleStageA,
    /// Not pipelined: one GEMM over the K-shard, then a reduce of the P partials' column
    /// block d. Shards as `rs-b`.
    #[serde(rename = "rs-b-single")]
    ReduceScatterSingleStageB,
}

impl ScheduleKind {
    /// All schedules, in CLI order.
    pub const ALL: [ScheduleKind; 8] = [
        ScheduleKind::AllGatherRotatingA,
        ScheduleKind::AllGatherRotatingB,
        ScheduleKind::ReduceScatterTilingA,
        ScheduleKind::ReduceScatterTilingB,
        ScheduleKind::AllGatherSingleStageA,
        ScheduleKind::AllGatherSingleStageB,
        ScheduleKind::ReduceScatterSingleStageA,
        ScheduleKind::ReduceScatterSingleStageB,
    ];

    /// The short name used on the command line (`ag-a`, `rs-b-single`, …).
    #[must_use]
    pub const fn cli_name(self) -> &'static str {
        match self {
            ScheduleKind::AllGatherRotatingA => "ag-a",
            ScheduleKind::AllGatherRotatingB => "ag-b",
            ScheduleKind::ReduceScatterTilingA => "rs-a",
            ScheduleKind::ReduceScatterTilingB => "rs-b",
            ScheduleKind::AllGatherSingleStageA => "ag-a-single",
            ScheduleKind::AllGatherSingleStageB => "ag-b-single",
            ScheduleKind::ReduceScatterSingleStageA => "rs-a-single",
            ScheduleKind::ReduceScatterSingleStageB => "rs-b-single",
        }
    }

    /// The full name (CUTLASS's for the four pipelined schedules).
    #[must_use]
    pub const fn full_name(self) -> &'static str {
        match self {
            ScheduleKind::AllGatherRotatingA => "AllGather1D_TilingCD_RotatingA",
            ScheduleKind::AllGatherRotatingB => "AllGather1D_TilingCD_RotatingB",
            ScheduleKind::ReduceScatterTilingA => "ReduceScatter1D_TilingA_RotatingC",
            ScheduleKind::ReduceScatterTilingB => "ReduceScatter1D_TilingB_RotatingC",
            ScheduleKind::AllGatherSingleStageA => "AllGather1D_SingleStage_GatherA",
            ScheduleKind::AllGatherSingleStageB => "AllGather1D_SingleStage_GatherB",
            ScheduleKind::ReduceScatterSingleStageA => "ReduceScatter1D_SingleStage_TilingA",
            ScheduleKind::ReduceScatterSingleStageB => "ReduceScatter1D_SingleStage_TilingB",
        }
    }

    /// The collective this schedule fuses.
    #[must_use]
    pub const fn collective(self) -> Collective {
        match self {
            ScheduleKind::AllGatherRotatingA
            | ScheduleKind::AllGatherRotatingB
            | ScheduleKind::AllGatherSingleStageA
            | ScheduleKind::AllGatherSingleStageB => Collective::AllGather,
            ScheduleKind::ReduceScatterTilingA
            | ScheduleKind::ReduceScatterTilingB
            | ScheduleKind::ReduceScatterSingleStageA
            | ScheduleKind::ReduceScatterSingleStageB => Collective::ReduceScatter,
        }
    }

    /// Whether the output is split along M (row blocks) — the "A" family — rather than N.
    ///
    /// For all-gather this is the rotating operand (A rotates ⇒ stage tiles are row blocks of
    /// the device's D); for reduce-scatter it is the axis of the scattered output blocks.
    #[must_use]
    pub const fn tiles_rows(self) -> bool {
        matches!(
            self,
            ScheduleKind::AllGatherRotatingA
                | ScheduleKind::ReduceScatterTilingA
                | ScheduleKind::AllGatherSingleStageA
                | ScheduleKind::ReduceScatterSingleStageA
        )
    }

    /// How many times a value of D is rounded to the element type on its way to the output:
    /// once for all-gather (the store), P times for the pipelined reduce-scatter (every hop
    /// stores a partial), twice for the single-stage one (the partial, then the sum).
    #[must_use]
    pub const fn roundings(self, tp: usize) -> usize {
        match (self.collective(), self.is_pipelined()) {
            (Collective::AllGather, _) => 1,
            (Collective::ReduceScatter, true) => tp,
            (Collective::ReduceScatter, false) => 2,
        }
    }

    /// Whether communication is overlapped with P stage GEMMs (CUTLASS's schedules), rather
    /// than done in one bulk step before or after a single GEMM.
    #[must_use]
    pub const fn is_pipelined(self) -> bool {
        matches!(
            self,
            ScheduleKind::AllGatherRotatingA
                | ScheduleKind::AllGatherRotatingB
                | ScheduleKind::ReduceScatterTilingA
                | ScheduleKind::ReduceScatterTilingB
        )
    }

    /// This schedule's family: its pipelined and its single-stage schedule, the two with its
    /// collective and shard layout (`ag-a` and `ag-a-single` for either of them).
    #[must_use]
    pub const fn family(self) -> (ScheduleKind, ScheduleKind) {
        use ScheduleKind as S;
        match self {
            S::AllGatherRotatingA | S::AllGatherSingleStageA => {
                (S::AllGatherRotatingA, S::AllGatherSingleStageA)
            }
            S::AllGatherRotatingB | S::AllGatherSingleStageB => {
                (S::AllGatherRotatingB, S::AllGatherSingleStageB)
            }
            S::ReduceScatterTilingA | S::ReduceScatterSingleStageA => {
                (S::ReduceScatterTilingA, S::ReduceScatterSingleStageA)
            }
            S::ReduceScatterTilingB | S::ReduceScatterSingleStageB => {
                (S::ReduceScatterTilingB, S::ReduceScatterSingleStageB)
            }
        }
    }

    /// The pipelined schedule of this schedule's family (itself when pipelined).
    #[must_use]
    pub const fn pipelined(self) -> ScheduleKind {
        self.family().0
    }

    /// The single-stage schedule of this schedule's family (itself when single-stage).
    #[must_use]
    pub const fn single_stage(self) -> ScheduleKind {
        self.family().1
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.full_name())
    }
}

impl BufferKind {
    /// Whether this buffer holds operand elements (A's or B's type) when `kind` runs: A, B,
    /// and the workspace of an all-gather schedule (gathered slices of A or B); C, D and the
    /// reduce-scatter workspace (partial sums) hold the output type.
    #[must_use]
    pub fn holds_operands(self, kind: ScheduleKind) -> bool {
        match self {
            BufferKind::A | BufferKind::B => true,
            BufferKind::C | BufferKind::D => false,
            BufferKind::Workspace => kind.collective() == Collective::AllGather,
        }
    }

    /// Bytes of one element of this buffer when `kind` runs `problem`: the operand type's
    /// (1 for FP8) or the output type's (see [`BufferKind::holds_operands`]).
    #[must_use]
    pub fn element_bytes(self, kind: ScheduleKind, problem: &crate::problem::Problem) -> usize {
        if self.holds_operands(kind) {
            problem.operand_bytes()
        } else {
            problem.output_bytes()
        }
    }
}

/// `(a + b) mod p` for device indices, written once so that no caller subtracts in `usize`.
#[must_use]
pub(crate) fn ring(device: usize, offset: isize, p: usize) -> usize {
    // p ≤ MAX_TP, so the casts are lossless.
    (device as isize + offset).rem_euclid(p as isize) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_non_negative_mod() {
        assert_eq!(ring(0, -1, 4), 3);
        assert_eq!(ring(3, 1, 4), 0);
        assert_eq!(ring(1, -5, 4), 0);
        assert_eq!(ring(0, 0, 1), 0);
    }

    #[test]
    fn a_family_is_one_pipelined_and_one_single_stage_schedule_with_the_same_layout() {
        for k in ScheduleKind::ALL {
            let (piped, single) = (k.pipelined(), k.single_stage());
            assert!(piped.is_pipelined() && !single.is_pipelined(), "{k}");
            for member in [piped, single] {
                assert_eq!(member.collective(), k.collective(), "{k}");
                assert_eq!(member.tiles_rows(), k.tiles_rows(), "{k}");
                assert_eq!(member.family(), (piped, single));
            }
            assert!(k == piped || k == single, "{k}");
        }
        assert_eq!(
            ScheduleKind::AllGatherSingleStageA.pipelined(),
            ScheduleKind::AllGatherRotatingA
        );
        assert_eq!(
            ScheduleKind::ReduceScatterTilingB.single_stage(),
            ScheduleKind::ReduceScatterSingleStageB
        );
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = ScheduleKind::ALL.iter().map(|k| k.cli_name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ScheduleKind::ALL.len());
    }
}
