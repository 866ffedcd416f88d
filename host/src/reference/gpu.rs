//! The reference's M·N·K part on a GPU: [`products`] runs the `reference_products_*` kernels
//! (`kernels_gpu::reference_abi`), which compute each element's `Σ a·b` and `Σ |a·b|` in f64
//! exactly as the host's loop does (the same sums, bit for bit), so [`check_products`] and
//! [`check_scaled_products`] can compare every element of D at any size.
//!
//! The operands are uploaded once; the outputs are computed and downloaded in chunks of rows
//! of at most [`CHUNK_BYTES`] of GPU memory, so a check of a large D needs little GPU memory
//! beyond A and B; the host holds the M·N pairs of f64 sums (16 bytes an element).
//!
//! [`check_products`]: super::check_products
//! [`check_scaled_products`]: super::check_scaled_products

use std::sync::Arc;

use kernels_gpu::reference_abi::{
    REFERENCE_SMEM_BYTES, REFERENCE_THREADS, REFERENCE_TILE, ReferenceParams,
};
use thiserror::Error;

use super::Products;
use crate::fp8::E4m3;
use crate::plan::SizeError;
use crate::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, KernelArgs, LaunchConfig, Module, RuntimeError, launch,
};

/// GPU memory the two f64 outputs of one launch may take: 16 bytes per element, so 32 Mi
/// elements a chunk (4096 rows of 8192 columns).
pub const CHUNK_BYTES: usize = 512 << 20;

/// Why [`products`] gave no products.
#[derive(Debug, Error)]
pub enum GpuReferenceError {
    /// An operand is shorter than its rows need.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// A leading dimension below K.
    #[error("{operand}'s leading dimension {ld} is below K = {k}")]
    LeadingDimension {
        /// "A" or "B".
        operand: &'static str,
        /// The leading dimension given.
        ld: usize,
        /// The problem's K.
        k: usize,
    },
    /// A dimension or grid beyond the kernel's 32-bit parameters.
    #[error("{what} = {value} exceeds the reference kernel's limit of {limit}")]
    TooLarge {
        /// "M", "N", "K" or "blocks".
        what: &'static str,
        /// The value asked for.
        value: usize,
        /// The largest the kernel takes.
        limit: usize,
    },
    /// The host memory for the M·N sums could not be had.
    #[error("no host memory for the reference's {bytes} bytes of f64 sums")]
    HostMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// Allocation, copy or launch failed on the GPU.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Operand element types the reference kernel reads: the 16-bit floats and e4m3 codes.
pub trait ReferenceOperand: DeviceCopy {
    /// The kernel that reads this type.
    const KERNEL: &'static str;
}

impl ReferenceOperand for half::bf16 {
    const KERNEL: &'static str = "reference_products_bf16";
}

impl ReferenceOperand for half::f16 {
    const KERNEL: &'static str = "reference_products_f16";
}

impl ReferenceOperand for E4m3 {
    const KERNEL: &'static str = "reference_products_e4m3";
}

/// One operand of [`products`]: `rows` rows of K elements, each `ld ≥ K` apart, row-major.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a, O> {
    /// The elements (at least `(rows − 1)·ld + K` of them when `rows > 0`).
    pub data: &'a [O],
    /// Elements from one row's start to the next's.
    pub ld: usize,
}

impl<O> Operand<'_, O> {
    /// `operand` holds `rows` rows of `k` elements `ld ≥ k` apart; returns the elements they
    /// span.
    fn span(
        &self,
        operand: &'static str,
        rows: usize,
        k: usize,
    ) -> Result<usize, GpuReferenceError> {
        if self.ld < k {
            return Err(GpuReferenceError::LeadingDimension {
                operand,
                ld: self.ld,
                k,
            });
        }
        let needed = match rows {
            0 => Some(0),
            rows => (rows - 1)
                .checked_mul(self.ld)
                .and_then(|x| x.checked_add(k)),
        };
        let needed = needed.ok_or(GpuReferenceError::TooLarge {
            what: "an operand's span",
            value: usize::MAX,
            limit: isize::MAX as usize,
        })?;
        if self.data.len() < needed {
            return Err(SizeError::Elements {
                matrix: operand.to_owned(),
                got: self.data.len(),
                expected: needed,
            }
            .into());
        }
        Ok(needed)
    }
}

/// `Ok` when `value` is at most `limit`.
fn within(what: &'static str, value: usize, limit: usize) -> Result<(), GpuReferenceError> {
    if value <= limit {
        Ok(())
    } else {
        Err(GpuReferenceError::TooLarge { what, value, limit })
    }
}

/// Largest M, N or K the kernel indexes (its parameters are 32-bit).
const MAX_DIMENSION: usize = u32::MAX as usize;

/// Largest 1-D grid a launch takes (`gridDim.x ≤ 2³¹ − 1`).
const MAX_BLOCKS: usize = i32::MAX as usize;

/// `len` zeros, or [`GpuReferenceError::HostMemory`] instead of an abort when the host has
/// not the memory.
fn zeros(len: usize) -> Result<Vec<f64>, GpuReferenceError> {
    let bytes = len.saturating_mul(8);
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| GpuReferenceError::HostMemory { bytes })?;
    v.resize(len, 0.0);
    Ok(v)
}

/// `Σ_k a_ik·b_jk` and `Σ_k |a_ik·b_jk|` of every element of the `m × n` product of A
/// (`m × k`) and B (`n × k`), computed on `module`'s GPU in f64 and ordered on `stream`
/// (which this call waits for). For e4m3 the sums are of the codes, unscaled.
///
/// The result equals what the host's f64 loop gives (each product exact, the sums in
/// increasing k from 0), so a check on it is the host check. Short operands, a leading
/// dimension below K and dimensions above 2³² − 1 are errors, not launches.
pub fn products<O: ReferenceOperand>(
    module: &Arc<Module>,
    stream: &CudaStream,
    a: Operand<'_, O>,
    b: Operand<'_, O>,
    (m, n, k): (usize, usize, usize),
) -> Result<Products, GpuReferenceError> {
    let a_span = a.span("A", m, k)?;
    let b_span = b.span("B", n, k)?;
    for (what, value) in [("M", m), ("N", n), ("K", k)] {
        within(what, value, MAX_DIMENSION)?;
    }
    let mut out = Products {
        exact: zeros(m * n)?,
        magnitude: zeros(m * n)?,
    };
    if m == 0 || n == 0 {
        return Ok(out);
    }
    let gpu = module.gpu();
    let kernel = module.kernel(O::KERNEL)?;
    let a_dev = DeviceBuffer::from_host(gpu, stream, &a.data[..a_span])?;
    let b_dev = DeviceBuffer::from_host(gpu, stream, &b.data[..b_span])?;
    let tile = REFERENCE_TILE as usize;
    let chunk_rows = (CHUNK_BYTES / (16 * n)).max(1).min(m);
    for row0 in (0..m).step_by(chunk_rows) {
        let rows = chunk_rows.min(m - row0);
        // Poisoned (0xFF bytes: NaN), so an element the kernel missed fails the check.
        let mut exact = DeviceBuffer::<f64>::alloc(gpu, rows * n)?;
        let mut magnitude = DeviceBuffer::<f64>::alloc(gpu, rows * n)?;
        exact.fill_bytes(stream, 0xFF)?;
        magnitude.fill_bytes(stream, 0xFF)?;
        let blocks = rows.div_ceil(tile) * n.div_ceil(tile);
        within("blocks", blocks, MAX_BLOCKS)?;
        let element = std::mem::size_of::<O>() as u64;
        let params = ReferenceParams {
            a: a_dev.device_ptr() + (row0 * a.ld) as u64 * element,
            b: b_dev.device_ptr(),
            exact: exact.device_ptr(),
            magnitude: magnitude.device_ptr(),
            lda: a.ld as u64,
            ldb: b.ld as u64,
            m: rows as u32,
            n: n as u32,
            k: k as u32,
            reserved: 0,
        };
        let config = LaunchConfig::linear(blocks as u32, REFERENCE_THREADS)
            .with_dynamic_smem(REFERENCE_SMEM_BYTES);
        // SAFETY: A's rows row0..row0 + rows and B's n rows, each k elements `ld` apart, lie in
        // the uploaded buffers (sizes checked above); the outputs hold rows·n f64 each; the
        // launch has the block size, shared memory and ⌈rows/64⌉·⌈n/64⌉ blocks the kernel
        // needs (`ReferenceParams`), and every buffer outlives it (the downloads wait).
        unsafe {
            launch(
                &kernel,
                stream,
                &config,
                &mut KernelArgs::new().by_value(&params),
            )?
        };
        let range = row0 * n..(row0 + rows) * n;
        exact.download_into(stream, &mut out.exact[range.clone()])?;
        magnitude.download_into(stream, &mut out.magnitude[range])?;
    }
    Ok(out)
}

/// [`products`] of packed operands (A `m × k` and B `n × k`, each row K elements after the
/// last), on a stream of its own on `module`'s GPU.
pub fn packed_products<O: ReferenceOperand>(
    module: &Arc<Module>,
    a: &[O],
    b: &[O],
    (m, n, k): (usize, usize, usize),
) -> Result<Products, GpuReferenceError> {
    let stream = module.gpu().new_stream()?;
    let (a, b) = (Operand { data: a, ld: k }, Operand { data: b, ld: k });
    products(module, &stream, a, b, (m, n, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_are_checked_before_any_gpu_work() {
        let data = [half::bf16::ONE; 100];
        let op = |ld| Operand { data: &data, ld };
        // 10 rows of 8, 10 apart: 9·10 + 8 = 98 elements.
        assert_eq!(op(10).span("A", 10, 8).ok(), Some(98));
        assert_eq!(op(10).span("A", 0, 8).ok(), Some(0));
        assert!(matches!(
            op(7).span("B", 10, 8),
            Err(GpuReferenceError::LeadingDimension {
                operand: "B",
                ld: 7,
                k: 8
            })
        ));
        assert!(matches!(
            op(11).span("A", 10, 8),
            Err(GpuReferenceError::Size(SizeError::Elements {
                got: 100,
                expected: 107,
                ..
            }))
        ));
        assert!(matches!(
            op(usize::MAX / 2).span("A", 4, 8),
            Err(GpuReferenceError::TooLarge { .. })
        ));
        assert!(within("K", MAX_DIMENSION, MAX_DIMENSION).is_ok());
        assert!(within("K", MAX_DIMENSION + 1, MAX_DIMENSION).is_err());
        assert!(matches!(
            zeros(usize::MAX / 4),
            Err(GpuReferenceError::HostMemory { .. })
        ));
    }
}
