//! The table's rows (a fixed schedule, or `Auto` within a family) and, per schedule, the
//! baselines that do the same job.

use distgemm::baseline::NcclGemmKind;
use distgemm::cuda::ScheduleChoice;
use distgemm::problem::Preset;
use distgemm::schedule::{Collective, ScheduleKind};

/// The rows of the table: the eight fixed schedules, then `Auto` within each of the four
/// families (the family is fixed by the shard layout the caller holds; `Auto` picks its
/// pipelined or its single-stage schedule). `Auto` carries the family's pipelined schedule.
pub fn all_rows() -> Vec<ScheduleChoice> {
    let mut v: Vec<ScheduleChoice> = ScheduleKind::ALL
        .iter()
        .map(|&k| ScheduleChoice::Fixed(k))
        .collect();
    v.extend(
        ScheduleKind::ALL
            .iter()
            .filter(|k| k.is_pipelined())
            .map(|&k| ScheduleChoice::Auto(k)),
    );
    v
}

/// `ag-a`, `rs-b-single`, `auto(ag-a)`, …
pub fn row_name(row: ScheduleChoice) -> String {
    match row {
        ScheduleChoice::Fixed(k) => k.cli_name().to_owned(),
        ScheduleChoice::Auto(f) => format!("auto({})", f.pipelined().cli_name()),
    }
}

/// The schedule family of a row (its pipelined schedule).
pub fn row_family(row: ScheduleChoice) -> ScheduleKind {
    match row {
        ScheduleChoice::Fixed(k) | ScheduleChoice::Auto(k) => k.pipelined(),
    }
}

/// A row's id, which FILTER is matched against: `distgemm/<preset>/<row name>`.
pub fn row_id(preset: Preset, row: ScheduleChoice) -> String {
    format!("distgemm/{}/{}", preset.name(), row_name(row))
}

/// The NCCL + cuBLAS pairing that does the same job as `kind` (column (e)).
pub fn nccl_kind_of(kind: ScheduleKind) -> NcclGemmKind {
    match (kind.collective(), kind.tiles_rows()) {
        (Collective::AllGather, true) => NcclGemmKind::AllGatherA,
        (Collective::AllGather, false) => NcclGemmKind::AllGatherB,
        (Collective::ReduceScatter, _) => NcclGemmKind::ReduceScatter,
    }
}

/// The PyTorch op doing the same collective as `kind` (column (f)); PyTorch's all-gather op
/// always gathers A and its reduce-scatter always scatters rows.
pub fn torch_op_of(kind: ScheduleKind) -> &'static str {
    match kind.collective() {
        Collective::AllGather => TORCH_AG,
        Collective::ReduceScatter => TORCH_RS,
    }
}

pub const TORCH_AG: &str = "fused_all_gather_matmul";
pub const TORCH_RS: &str = "fused_matmul_reduce_scatter";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_map_to_their_baselines_and_rows_to_their_families() {
        use ScheduleKind::*;
        assert_eq!(nccl_kind_of(AllGatherRotatingA), NcclGemmKind::AllGatherA);
        assert_eq!(
            nccl_kind_of(AllGatherSingleStageB),
            NcclGemmKind::AllGatherB
        );
        assert_eq!(
            nccl_kind_of(ReduceScatterTilingB),
            NcclGemmKind::ReduceScatter
        );
        assert_eq!(torch_op_of(ReduceScatterSingleStageA), TORCH_RS);
        assert_eq!(all_rows().len(), 12);
        assert_eq!(
            row_name(ScheduleChoice::Auto(AllGatherRotatingB)),
            "auto(ag-b)"
        );
        assert_eq!(
            row_name(ScheduleChoice::Fixed(ReduceScatterSingleStageB)),
            "rs-b-single"
        );
        assert_eq!(
            row_family(ScheduleChoice::Auto(ReduceScatterTilingA)),
            ReduceScatterTilingA
        );
        assert_eq!(
            row_family(ScheduleChoice::Fixed(AllGatherSingleStageA)),
            AllGatherRotatingA
        );
        assert_eq!(
            row_id(
                Preset::Llama3_70bFc1,
                ScheduleChoice::Auto(AllGatherRotatingA)
            ),
            "distgemm/llama3-70b-fc1/auto(ag-a)"
        );
    }
}
