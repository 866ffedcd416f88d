//! Per-GPU buffer sizes and GEMM shape of each baseline pairing (pure).

use crate::baseline::cublaslt::TnGemmShape;

/// Which collective the baseline pairs with the GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclGemmKind {
    /// All-gather of A's row blocks, then `M × N/P × K` (fc1-style, `ag-a`).
    AllGatherA,
    /// All-gather of B's row blocks, then `M/P × N × K` (`ag-b`).
    AllGatherB,
    /// `M × N × K/P` partial, then reduce-scatter of its row blocks (fc2-style, `rs-a`/`rs-b`).
    ReduceScatter,
}

impl NcclGemmKind {
    /// Short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            NcclGemmKind::AllGatherA => "nccl-allgather(A)+cublaslt",
            NcclGemmKind::AllGatherB => "nccl-allgather(B)+cublaslt",
            NcclGemmKind::ReduceScatter => "cublaslt+nccl-reducescatter",
        }
    }
}

/// Per-GPU buffer sizes and GEMM shape of the baseline (pure; unit-tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclGemmLayout {
    /// The GEMM each GPU runs.
    pub gemm: TnGemmShape,
    /// Elements of the collective's per-rank input (A/B shard, or the partial).
    pub shard_elements: u64,
    /// Elements of the collective's per-rank output (gathered operand, or D block).
    pub collective_out_elements: u64,
    /// Elements per rank handed to NCCL (`sendcount` / `recvcount`).
    pub nccl_count: u64,
    /// Elements of the GEMM operand that does not move (B for all-gather A, …).
    pub stationary_elements: u64,
    /// Elements of the GEMM output.
    pub gemm_out_elements: u64,
}

impl NcclGemmLayout {
    /// The layout of `kind` for the global problem `m × n × k` on `tp` GPUs; every split
    /// dimension must divide by `tp`.
    pub fn new(kind: NcclGemmKind, m: u64, n: u64, k: u64, tp: u64) -> Result<Self, String> {
        if tp == 0 {
            return Err("TP must be at least 1".into());
        }
        let split = |name: &str, v: u64| {
            if v.is_multiple_of(tp) && v / tp > 0 {
                Ok(v / tp)
            } else {
                Err(format!(
                    "{name} = {v} does not divide into {tp} non-empty shards"
                ))
            }
        };
        Ok(match kind {
            NcclGemmKind::AllGatherA => {
                let (ml, nl) = (split("M", m)?, split("N", n)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(m, nl, k),
                    shard_elements: ml * k,
                    collective_out_elements: m * k,
                    nccl_count: ml * k,
                    stationary_elements: nl * k,
                    gemm_out_elements: m * nl,
                }
            }
            NcclGemmKind::AllGatherB => {
                let (ml, nl) = (split("M", m)?, split("N", n)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(ml, n, k),
                    shard_elements: nl * k,
                    collective_out_elements: n * k,
                    nccl_count: nl * k,
                    stationary_elements: ml * k,
                    gemm_out_elements: ml * n,
                }
            }
            NcclGemmKind::ReduceScatter => {
                let (ml, kl) = (split("M", m)?, split("K", k)?);
                NcclGemmLayout {
                    gemm: TnGemmShape::packed(m, n, kl),
                    // The collective's input is the GEMM output (the partial).
                    shard_elements: m * n,
                    collective_out_elements: ml * n,
                    nccl_count: ml * n,
                    stationary_elements: n * kl,
                    gemm_out_elements: m * n,
                }
            }
        })
    }

    /// Bytes each GPU allocates for this layout with `elem_bytes`-byte elements.
    pub fn bytes_per_gpu(&self, kind: NcclGemmKind, elem_bytes: u64) -> u64 {
        let elems = match kind {
            // shard + gathered + stationary + D
            NcclGemmKind::AllGatherA | NcclGemmKind::AllGatherB => {
                self.shard_elements
                    + self.collective_out_elements
                    + self.stationary_elements
                    + self.gemm_out_elements
            }
            // A K-shard (m·kl = gemm.m·gemm.k) + B K-shard + partial + D block
            NcclGemmKind::ReduceScatter => {
                self.gemm.m * self.gemm.k
                    + self.stationary_elements
                    + self.gemm_out_elements
                    + self.collective_out_elements
            }
        };
        elems * elem_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_the_70b_presets_at_tp2() {
        // fc1: 16384 × 57344 × 8192.
        let l = NcclGemmLayout::new(NcclGemmKind::AllGatherA, 16384, 57344, 8192, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(16384, 28672, 8192));
        assert_eq!(l.nccl_count, 8192 * 8192);
        assert_eq!(l.collective_out_elements, 2 * l.nccl_count);
        let l = NcclGemmLayout::new(NcclGemmKind::AllGatherB, 16384, 57344, 8192, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(8192, 57344, 8192));
        assert_eq!(l.nccl_count, 28672 * 8192);
        // fc2: 16384 × 8192 × 28672.
        let l = NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 16384, 8192, 28672, 2).unwrap();
        assert_eq!(l.gemm, TnGemmShape::packed(16384, 8192, 14336));
        assert_eq!(l.nccl_count, 8192 * 8192);
        assert_eq!(l.shard_elements, 2 * l.nccl_count);
        assert_eq!(
            l.bytes_per_gpu(NcclGemmKind::ReduceScatter, 2),
            2 * (16384 * 14336 + 8192 * 14336 + 16384 * 8192 + 8192 * 8192)
        );
    }

    #[test]
    fn layouts_reject_indivisible_shapes() {
        assert!(NcclGemmLayout::new(NcclGemmKind::AllGatherA, 3, 4, 8, 2).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 4, 4, 6, 4).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::ReduceScatter, 4, 4, 8, 0).is_err());
        assert!(NcclGemmLayout::new(NcclGemmKind::AllGatherB, 2, 2, 8, 4).is_err());
    }
}
