//! The host side of the Hopper GEMM stage kernel (`kernels_gpu::kernels::gemm`).
//!
//! [`GemmArgs`] describes one GEMM over operand *views* (device pointer, rows, cols, leading
//! dimension), so a distributed stage can read a sub-block of a shard or a workspace slot and
//! write a sub-block of an output in place. [`check()`] validates it without a GPU;
//! [`GemmKernel::prepare`] builds the TMA tensor maps and the kernel's parameter block, and
//! [`PreparedGemm::launch`] launches it (optionally with PDL). The same prepared parameter
//! block is what the CUDA-graph lowering puts into its kernel nodes. [`Fp8GemmArgs`] and
//! [`GemmKernel::prepare_fp8`] run A and B in e4m3 with tensor-wise or row-wise scales.
mod check;
mod choose;
mod fp8;
mod launch;
mod sectors;
mod weight_stream;

pub use check::{GemmError, check};
pub use choose::{
    choose_fp8_variant, choose_variant, choose_variant_for, estimated_cost, raster_group_m,
    split_grid, variant_named,
};
pub use fp8::{Fp8GemmArgs, Fp8Scales};
pub use kernels_gpu::gemm_abi::{GemmVariant, VARIANTS};
#[cfg(test)]
pub(crate) use launch::rule_variant;
pub use launch::{GemmKernel, GemmLaunchError, PreparedGemm};
pub use sectors::SectorAlignment;

use crate::dtype::Dtype;

/// A row-major matrix view in device memory: `rows × cols` elements, row `r` starting
/// `r · ld` elements after `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixView {
    /// Device address of element (0, 0) (may be a peer GPU's memory for C).
    pub ptr: u64,
    pub rows: u64,
    pub cols: u64,
    /// Leading dimension in elements (≥ `cols`).
    pub ld: u64,
}

impl MatrixView {
    /// A dense `rows × cols` matrix at `ptr` (`ld == cols`).
    #[must_use]
    pub fn dense(ptr: u64, rows: u64, cols: u64) -> Self {
        Self {
            ptr,
            rows,
            cols,
            ld: cols,
        }
    }
}

/// One GEMM `D = alpha · A · Bᵀ + beta · C`: A is M×K and B is N×K (both K-contiguous), C and
/// D are M×N row-major. `c` may be `None` only when `beta == 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmArgs {
    pub dtype: Dtype,
    pub a: MatrixView,
    pub b: MatrixView,
    pub c: Option<MatrixView>,
    pub d: MatrixView,
    pub alpha: f32,
    pub beta: f32,
}

impl GemmArgs {
    /// `D = A · Bᵀ` over dense operands: A `m × k` at `a`, B `n × k` at `b`, D `m × n` at `d`.
    #[must_use]
    pub fn dense(dtype: Dtype, a: u64, b: u64, d: u64, (m, n, k): (u64, u64, u64)) -> Self {
        Self {
            dtype,
            a: MatrixView::dense(a, m, k),
            b: MatrixView::dense(b, n, k),
            c: None,
            d: MatrixView::dense(d, m, n),
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// `(m, n, k)` of the product.
    #[must_use]
    pub fn shape(&self) -> (u64, u64, u64) {
        (self.a.rows, self.b.rows, self.a.cols)
    }

    /// Floating-point operations of the product (`2·M·N·K`).
    #[must_use]
    pub fn flops(&self) -> f64 {
        let (m, n, k) = self.shape();
        2.0 * m as f64 * n as f64 * k as f64
    }
}
