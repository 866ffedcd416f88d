//! Vendor baselines that distgemm's kernels are measured and checked against, in the same
//! process and on the same buffers.

pub mod cublaslt;

pub use cublaslt::{BaselineError, CublasLtElement, CublasLtGemm, TnGemmShape};
