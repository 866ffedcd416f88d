//! What the host and the xtask need to know about each kernel entry point.
//!
//! One table, read by `cargo xtask build-ptx` (which adds `.maxntid`/`.minnctapersm` to the
//! PTX entries that ask for it, because rustc cannot express launch bounds), by
//! `cargo xtask check-ptx` (which gates register residency and `HGMMA` presence) and by the
//! host runtime (which looks kernels up by these names).

/// Static facts about one `extern "ptx-kernel"` entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelInfo {
    /// The exported (unmangled) symbol name.
    pub name: &'static str,
    /// Launch bounds to write into the PTX: (`.maxntid` x, `.minnctapersm`). `setmaxnreg` is
    /// only honoured by ptxas when the register count at entry is known, which these give.
    pub launch_bounds: Option<(u32, u32)>,
    /// The kernel must keep everything in registers: check-ptx fails on any stack frame or spill.
    pub register_resident: bool,
    /// The kernel issues `wgmma`: check-ptx fails unless its SASS contains `HGMMA`.
    pub uses_wgmma: bool,
}

const fn plain(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        launch_bounds: None,
        register_resident: false,
        uses_wgmma: false,
    }
}

/// A one-warpgroup `wgmma` smoke kernel: 128 threads, accumulators in registers.
const fn wgmma_smoke(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        launch_bounds: Some((128, 1)),
        register_resident: true,
        uses_wgmma: true,
    }
}

/// A GEMM stage kernel: 384 threads, one block per SM, consumers rebalanced to 232 registers.
const fn gemm(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        launch_bounds: Some((384, 1)),
        register_resident: true,
        uses_wgmma: true,
    }
}

/// Builds [`KERNELS`]: the GEMM entry points (bf16, f16 and, where compiled, e4m3) from the
/// rows of `gemm_abi::gemm_variants!`, then the other kernels.
macro_rules! kernel_table {
    ($($name:literal => $bf16:ident, $f16:ident, $tile:ident, $config:ident $(, e4m3 $e4m3:ident)?;)*) => {
        /// Every kernel in the PTX module.
        pub const KERNELS: &[KernelInfo] = &[
            $(gemm(stringify!($bf16)), gemm(stringify!($f16)), $(gemm(stringify!($e4m3)),)?)*
            plain("collective_barrier"),
            plain("collective_wait_flags"),
            plain("reduce_sum_bf16"),
            plain("reduce_sum_f16"),
            plain("fill_normal_bf16"),
            plain("fill_normal_f16"),
            plain("reference_products_bf16"),
            plain("reference_products_f16"),
            plain("reference_products_e4m3"),
            plain("smoke_vector_add"),
            plain("smoke_tma_roundtrip"),
            wgmma_smoke("smoke_wgmma_m64n64k16_bf16"),
            wgmma_smoke("smoke_wgmma_m64n64k16_f16"),
            wgmma_smoke("smoke_wgmma_m64n256k16_bf16"),
            wgmma_smoke("smoke_wgmma_m64n256k16_f16"),
            plain("smoke_pdl_primary"),
            plain("smoke_pdl_secondary"),
        ];
    };
}
crate::gemm_abi::gemm_variants!(kernel_table);

/// Looks a kernel up by name.
pub fn kernel(name: &str) -> Option<&'static KernelInfo> {
    KERNELS.iter().find(|k| k.name == name)
}
