//! cuBLASLt GEMM for the "TN" problem used throughout distgemm.
//!
//! Problem (row-major, as distgemm stores everything):
//! `D (M×N) = alpha · A · Bᵀ + beta · C`, with A M×K (K contiguous, leading dimension `lda`),
//! B N×K (K contiguous, `ldb`), C and D M×N (`ldc`, `ldd`); bf16 or f16 inputs and outputs,
//! f32 accumulation and f32 scalars.
//!
//! cuBLASLt is column-major. A row-major R×C matrix with leading dimension `ld` *is* the
//! column-major C×R matrix with the same `ld`, i.e. its transpose. So we ask cuBLASLt for
//! `Dᵀ (N×M) = B · Aᵀ`: its "A" is our B seen as column-major K×N with `ld = ldb` and
//! `transa = T` (giving N×K), its "B" is our A seen as column-major K×M with `ld = lda` and
//! `transb = N`, `m = N`, `n = M`, `k = K`, and C/D are column-major N×M with `ldc`/`ldd`.
//!
//! [`CublasLtGemm::new`] creates the handle, descriptors and layouts once, asks the heuristic
//! for its best algorithm with a 32 MiB workspace (NVIDIA's recommendation for Hopper) and
//! keeps all of it, so [`CublasLtGemm::run`] is one `cublasLtMatmul` call — what a benchmark
//! should time. cudarc's safe `CudaBlasLT` is not used: it re-plans on every call, allocates its
//! workspace from the stream-ordered pool and panics (`unwrap`/`expect`) in places.
//!
//! cudarc loads `libcublasLt` lazily and panics if it is missing; [`CublasLtGemm::new`] checks
//! with cudarc's `is_culib_present()` first and returns [`BaselineError::CublasLtNotFound`].

use crate::runtime::{CudaStream, DeviceBuffer, DeviceCopy, Gpu, RuntimeError};
use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

/// Workspace handed to cuBLASLt: 32 MiB, NVIDIA's recommendation for Hopper.
pub const WORKSPACE_BYTES: usize = 32 * 1024 * 1024;

/// `cublasOperation_t` values (an `int32` attribute; cudarc's cublaslt bindings lack the enum).
const CUBLAS_OP_N: i32 = 0;
/// Transposed operand.
const CUBLAS_OP_T: i32 = 1;

/// Errors of the cuBLASLt baseline.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    /// `libcublasLt.so` could not be loaded.
    #[error(
        "cuBLASLt (libcublasLt.so) could not be loaded, so the cuBLAS baseline cannot run. Add the \
         folder that holds it to LD_LIBRARY_PATH: a CUDA toolkit's lib64, or the \
         site-packages/nvidia/cublas/lib folder of an installed PyTorch"
    )]
    CublasLtNotFound {
        /// Library names tried (cudarc's candidates).
        searched: Vec<String>,
    },
    /// A cuBLASLt call failed.
    #[error("{call} failed: {source:?}")]
    Cublas {
        /// The cuBLASLt entry point.
        call: &'static str,
        /// Its status.
        source: CublasError,
    },
    /// The heuristic found no algorithm for this problem.
    #[error(
        "cuBLASLt has no algorithm for the {dtype} TN GEMM {shape:?} with a {WORKSPACE_BYTES}-byte \
         workspace (leading dimensions must allow 16-byte aligned rows for tensor cores)"
    )]
    NoAlgorithm {
        /// Element type name.
        dtype: &'static str,
        /// The problem.
        shape: TnGemmShape,
    },
    /// Shape, leading dimensions or buffers that do not describe a valid problem.
    #[error("invalid TN GEMM: {0}")]
    InvalidProblem(String),
    /// A runtime (driver) error.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

fn cublas(call: &'static str) -> impl FnOnce(CublasError) -> BaselineError {
    move |source| BaselineError::Cublas { call, source }
}

/// Input/output element types cuBLASLt runs the TN GEMM in.
pub trait CublasLtElement: DeviceCopy {
    /// The `cudaDataType` of A, B, C and D.
    const DATA_TYPE: sys::cudaDataType;
    /// Name for messages.
    const NAME: &'static str;
}

impl CublasLtElement for half::bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
    const NAME: &'static str = "bf16";
}

impl CublasLtElement for half::f16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType::CUDA_R_16F;
    const NAME: &'static str = "f16";
}

/// Sizes and leading dimensions (elements) of `D = alpha·A·Bᵀ + beta·C`, all row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TnGemmShape {
    /// Rows of A, C, D.
    pub m: u64,
    /// Rows of B, columns of C, D.
    pub n: u64,
    /// Columns of A and B (the reduction).
    pub k: u64,
    /// Leading dimension of A (≥ k).
    pub lda: u64,
    /// Leading dimension of B (≥ k).
    pub ldb: u64,
    /// Leading dimension of C (≥ n).
    pub ldc: u64,
    /// Leading dimension of D (≥ n).
    pub ldd: u64,
}

impl TnGemmShape {
    /// Densely packed operands: `lda = ldb = k`, `ldc = ldd = n`.
    pub fn packed(m: u64, n: u64, k: u64) -> Self {
        TnGemmShape {
            m,
            n,
            k,
            lda: k,
            ldb: k,
            ldc: n,
            ldd: n,
        }
    }

    /// Floating-point operations of one GEMM: `2·M·N·K`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Elements a row-major `rows × cols` matrix with leading dimension `ld` spans.
    fn span(rows: u64, cols: u64, ld: u64) -> u64 {
        rows.saturating_sub(1)
            .saturating_mul(ld)
            .saturating_add(cols)
    }

    /// Elements A, B, C and D must hold.
    pub fn required_elements(&self) -> [u64; 4] {
        [
            Self::span(self.m, self.k, self.lda),
            Self::span(self.n, self.k, self.ldb),
            Self::span(self.m, self.n, self.ldc),
            Self::span(self.m, self.n, self.ldd),
        ]
    }

    /// Checks dimensions and leading dimensions (pure).
    pub fn validate(&self) -> Result<(), String> {
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return Err(format!(
                "M, N, K = {}, {}, {}: all must be non-zero",
                self.m, self.n, self.k
            ));
        }
        let max = i64::MAX as u64;
        if [
            self.m, self.n, self.k, self.lda, self.ldb, self.ldc, self.ldd,
        ]
        .iter()
        .any(|&v| v > max)
        {
            return Err("dimensions must fit in i64".into());
        }
        for (name, ld, min) in [
            ("lda", self.lda, self.k),
            ("ldb", self.ldb, self.k),
            ("ldc", self.ldc, self.n),
            ("ldd", self.ldd, self.n),
        ] {
            if ld < min {
                return Err(format!("{name} = {ld} is smaller than the {min} columns"));
            }
        }
        Ok(())
    }
}

/// Owns one cuBLASLt object and destroys it on drop (errors there can only be ignored).
struct LtHandle(sys::cublasLtHandle_t);
struct LtDesc(sys::cublasLtMatmulDesc_t);
struct LtLayout(sys::cublasLtMatrixLayout_t);
struct LtPref(sys::cublasLtMatmulPreference_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}
impl Drop for LtDesc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}
impl Drop for LtLayout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}
impl Drop for LtPref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// A planned cuBLASLt TN GEMM on one GPU and stream: descriptors, layouts, the heuristic's
/// best algorithm and a 32 MiB workspace (`cuMemAlloc`).
pub struct CublasLtGemm<T: CublasLtElement> {
    /// A and B's element type: `T`'s, or e4m3 ([`CublasLtGemm::new_e4m3`]).
    inputs: sys::cudaDataType,
    // Field order is drop order: cuBLASLt objects go before the handle.
    desc: LtDesc,
    layout_a: LtLayout,
    layout_b: LtLayout,
    layout_c: LtLayout,
    layout_d: LtLayout,
    algo: sys::cublasLtMatmulAlgo_t,
    handle: LtHandle,
    workspace: DeviceBuffer<u8>,
    stream: Arc<CudaStream>,
    gpu: Gpu,
    shape: TnGemmShape,
    marker: PhantomData<T>,
}

// SAFETY: the cuBLASLt handle and descriptors are only used through `&self` in `run`, which
// cuBLASLt allows from any thread (the context is bound first); nothing is mutated after `new`.
unsafe impl<T: CublasLtElement> Send for CublasLtGemm<T> {}
// SAFETY: as above.
unsafe impl<T: CublasLtElement> Sync for CublasLtGemm<T> {}

impl<T: CublasLtElement> std::fmt::Debug for CublasLtGemm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CublasLtGemm")
            .field("dtype", &T::NAME)
            .field("shape", &self.shape)
            .finish()
    }
}

/// Sets one attribute of a matmul descriptor.
fn set_desc<V>(
    desc: &LtDesc,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &V,
) -> Result<(), BaselineError> {
    // SAFETY: `value` is the type the attribute expects and lives across the call.
    unsafe {
        lt::set_matmul_desc_attribute(desc.0, attr, (value as *const V).cast(), size_of::<V>())
    }
    .map_err(cublas("cublasLtMatmulDescSetAttribute"))
}

impl<T: CublasLtElement> CublasLtGemm<T> {
    /// Plans the GEMM `shape` on `gpu`, to run on `stream`.
    pub fn new(
        gpu: &Gpu,
        stream: Arc<CudaStream>,
        shape: TnGemmShape,
    ) -> Result<Self, BaselineError> {
        Self::plan(gpu, stream, shape, T::DATA_TYPE)
    }

    /// Plans an FP8 GEMM: A and B in e4m3 (one byte per element; `shape`'s K and leading
    /// dimensions in elements), C and D in `T`, f32 accumulation, no scale pointers (fold the
    /// tensor-wise scales into alpha). Run it with [`Self::run_raw`].
    pub fn new_e4m3(
        gpu: &Gpu,
        stream: Arc<CudaStream>,
        shape: TnGemmShape,
    ) -> Result<Self, BaselineError> {
        Self::plan(gpu, stream, shape, sys::cudaDataType::CUDA_R_8F_E4M3)
    }

    fn plan(
        gpu: &Gpu,
        stream: Arc<CudaStream>,
        shape: TnGemmShape,
        inputs: sys::cudaDataType,
    ) -> Result<Self, BaselineError> {
        shape.validate().map_err(BaselineError::InvalidProblem)?;
        // SAFETY: only tries dlopen on cudarc's candidate names; nothing in cublaslt::sys is
        // called before this says the library loads (cudarc would panic otherwise).
        if !unsafe { sys::is_culib_present() } {
            return Err(BaselineError::CublasLtNotFound {
                searched: cudarc::get_lib_name_candidates("cublasLt"),
            });
        }
        gpu.bind()?;
        let handle = LtHandle(lt::create_handle().map_err(cublas("cublasLtCreate"))?);
        let desc = LtDesc(
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
            .map_err(cublas("cublasLtMatmulDescCreate"))?,
        );
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        set_desc(&desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &CUBLAS_OP_T)?;
        set_desc(&desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &CUBLAS_OP_N)?;

        // Column-major views (see the module docs): rows, cols, ld of the *stored* matrices.
        let layout = |ty, rows: u64, cols: u64, ld: u64| -> Result<LtLayout, BaselineError> {
            Ok(LtLayout(
                lt::create_matrix_layout(ty, rows, cols, ld as i64)
                    .map_err(cublas("cublasLtMatrixLayoutCreate"))?,
            ))
        };
        let layout_a = layout(inputs, shape.k, shape.n, shape.ldb)?; // our B, K×N column-major
        let layout_b = layout(inputs, shape.k, shape.m, shape.lda)?; // our A, K×M column-major
        let layout_c = layout(T::DATA_TYPE, shape.n, shape.m, shape.ldc)?;
        let layout_d = layout(T::DATA_TYPE, shape.n, shape.m, shape.ldd)?;

        let pref =
            LtPref(lt::create_matmul_pref().map_err(cublas("cublasLtMatmulPreferenceCreate"))?);
        // SAFETY: the attribute takes a u64/size_t byte count.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&WORKSPACE_BYTES as *const usize).cast(),
                size_of::<usize>(),
            )
        }
        .map_err(cublas("cublasLtMatmulPreferenceSetAttribute"))?;
        // SAFETY: all objects are alive and describe the same problem.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                handle.0, desc.0, layout_a.0, layout_b.0, layout_c.0, layout_d.0, pref.0,
            )
        };
        let algo = match heuristic {
            Ok(h) => h.algo,
            Err(CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => {
                let dtype = if inputs == T::DATA_TYPE {
                    T::NAME
                } else {
                    "e4m3"
                };
                return Err(BaselineError::NoAlgorithm { dtype, shape });
            }
            Err(e) => return Err(cublas("cublasLtMatmulAlgoGetHeuristic")(e)),
        };
        let workspace = DeviceBuffer::<u8>::alloc(gpu, WORKSPACE_BYTES)?;
        Ok(CublasLtGemm {
            inputs,
            desc,
            layout_a,
            layout_b,
            layout_c,
            layout_d,
            algo,
            handle,
            workspace,
            stream,
            gpu: gpu.clone(),
            shape,
            marker: PhantomData,
        })
    }

    /// The planned problem.
    pub fn shape(&self) -> &TnGemmShape {
        &self.shape
    }

    /// The stream the GEMM is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Enqueues `D = alpha·A·Bᵀ + beta·C` (`cublasLtMatmul`) on the planned stream. With
    /// `c = None`, C is D itself (in-place accumulate; any `beta` is allowed). Buffer sizes are
    /// checked against the shape, so this is safe.
    pub fn run(
        &self,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        c: Option<&DeviceBuffer<T>>,
        d: &mut DeviceBuffer<T>,
        alpha: f32,
        beta: f32,
    ) -> Result<(), BaselineError> {
        if self.inputs != T::DATA_TYPE {
            return Err(BaselineError::InvalidProblem(
                "an e4m3 GEMM's A and B are not buffers of T: use run_raw".into(),
            ));
        }
        let [need_a, need_b, need_c, need_d] = self.shape.required_elements();
        let check = |name: &str, have: usize, need: u64| {
            if (have as u64) < need {
                Err(BaselineError::InvalidProblem(format!(
                    "{name} holds {have} elements but {:?} needs {need}",
                    self.shape
                )))
            } else {
                Ok(())
            }
        };
        check("A", a.len(), need_a)?;
        check("B", b.len(), need_b)?;
        check("D", d.len(), need_d)?;
        if let Some(c) = c {
            check("C", c.len(), need_c)?;
        }
        for (name, ordinal) in [("A", a.ordinal()), ("B", b.ordinal()), ("D", d.ordinal())] {
            if ordinal != self.gpu.ordinal() {
                return Err(BaselineError::InvalidProblem(format!(
                    "{name} lives on GPU {ordinal} but the GEMM was planned on GPU {}",
                    self.gpu.ordinal()
                )));
            }
        }
        let c_ptr = c.map_or(d.device_ptr(), |c| c.device_ptr());
        // SAFETY: the buffers hold the operands of the planned shape (checked) and live on
        // this GPU. The GEMM runs later on `stream`; a buffer dropped before that is freed by
        // `cuMemFree`, which waits for the context's outstanding work (implicit
        // synchronization, relied upon by CUDA code generally), so the GEMM never sees freed
        // memory.
        unsafe {
            self.run_raw(
                a.device_ptr(),
                b.device_ptr(),
                c_ptr,
                d.device_ptr(),
                alpha,
                beta,
            )
        }
    }

    /// [`CublasLtGemm::run`] on raw device addresses (e.g. views into larger buffers).
    ///
    /// # Safety
    /// Each address must point to device memory of this GPU that holds the operand for the
    /// planned shape, alive until the GEMM has run.
    pub unsafe fn run_raw(
        &self,
        a: u64,
        b: u64,
        c: u64,
        d: u64,
        alpha: f32,
        beta: f32,
    ) -> Result<(), BaselineError> {
        self.gpu.bind()?;
        let ptr = |p: u64| p as *const c_void;
        // SAFETY: descriptors, layouts, algorithm and workspace were built for this problem
        // and are alive; the operands are the caller's contract. cuBLASLt's "A" is our B and
        // its "B" our A (module docs).
        unsafe {
            lt::matmul(
                self.handle.0,
                self.desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                ptr(b),
                self.layout_a.0,
                ptr(a),
                self.layout_b.0,
                ptr(c),
                self.layout_c.0,
                d as *mut c_void,
                self.layout_d.0,
                &self.algo,
                self.workspace.device_ptr() as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream().cast(),
            )
        }
        .map_err(cublas("cublasLtMatmul"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_shapes_are_valid_and_count_flops() {
        let s = TnGemmShape::packed(128, 256, 64);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.flops(), 2.0 * 128.0 * 256.0 * 64.0);
        assert_eq!(
            s.required_elements(),
            [128 * 64, 256 * 64, 128 * 256, 128 * 256]
        );
    }

    #[test]
    fn leading_dimensions_must_cover_the_rows() {
        let s = TnGemmShape {
            lda: 32,
            ..TnGemmShape::packed(128, 256, 64)
        };
        assert!(s.validate().unwrap_err().contains("lda"));
        let s = TnGemmShape {
            ldd: 255,
            ..TnGemmShape::packed(128, 256, 64)
        };
        assert!(s.validate().unwrap_err().contains("ldd"));
        assert!(TnGemmShape::packed(0, 1, 1).validate().is_err());
    }

    #[test]
    fn strided_operands_need_their_full_span() {
        let s = TnGemmShape {
            lda: 100,
            ..TnGemmShape::packed(4, 8, 64)
        };
        assert_eq!(s.required_elements()[0], 3 * 100 + 64);
    }
}
