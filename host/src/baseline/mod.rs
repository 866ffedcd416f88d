//! Vendor baselines that distgemm's kernels are measured and checked against, in the same
//! process and on the same buffers.

pub mod cublaslt;
pub mod nccl;

pub use cublaslt::{BaselineError, CublasLtElement, CublasLtGemm, TnGemmShape};
pub use nccl::{NcclComms, NcclElement, NcclError, NcclGemmBaseline, NcclGemmKind, NcclGemmLayout};
