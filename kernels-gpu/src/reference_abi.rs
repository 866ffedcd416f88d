//! The contract between the host and the reference kernel (`kernels::reference`): the f64
//! sums an output of a GEMM is checked against. Compiled for both sides so they cannot drift,
//! like [`crate::gemm_abi`].
//!
//! For every element `(i, j)` of an `m × n` block, the kernel writes
//! `exact[i·n + j] = Σ_k a_ik·b_jk` and `magnitude[i·n + j] = Σ_k |a_ik·b_jk|`, each summed in
//! f64 in increasing k. A product of two bf16, f16 or e4m3 values is exact in f64 (at most
//! 2·11 significant bits), so each sum is the one the host's f64 reference computes, bit for
//! bit: the host's `--check` bound then applies unchanged (it needs `Σ a·b` for the expected
//! value and `Σ |a·b|` for the tolerance), and the M·N·K work moves to the GPU.

/// Output elements a block computes along each side: a `TILE × TILE` square.
pub const REFERENCE_TILE: u32 = 64;

/// Threads per block: a 16 × 16 grid, each thread `(tx, ty)` computing the 4 × 4 elements
/// `(ty + 16·r, tx + 16·c)` of the tile.
pub const REFERENCE_THREADS: u32 = 256;

/// The k-elements of each operand staged in shared memory per step.
pub const REFERENCE_K_TILE: u32 = 32;

/// f64 words per shared-memory row of a staged operand tile: one more than
/// [`REFERENCE_K_TILE`], so that 16 threads reading the same k of 16 consecutive rows hit 16
/// different bank pairs (a row is 66 banks apart from the next, 2 modulo 32).
pub const REFERENCE_PITCH: u32 = REFERENCE_K_TILE + 1;

/// Dynamic shared memory of the reference kernel: A's and B's staged tiles, f64.
pub const REFERENCE_SMEM_BYTES: u32 = 2 * REFERENCE_TILE * REFERENCE_PITCH * 8;

/// Parameters of `reference_products_{bf16,f16,e4m3}`, launched on
/// `⌈m / TILE⌉ · ⌈n / TILE⌉` blocks of [`REFERENCE_THREADS`] with
/// [`REFERENCE_SMEM_BYTES`]; block `t` computes the tile `(t / ⌈n / TILE⌉, t mod ⌈n / TILE⌉)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReferenceParams {
    /// Element (0, 0) of A (`m × k`, row-major, leading dimension `lda`).
    pub a: u64,
    /// Element (0, 0) of B (`n × k`, row-major, leading dimension `ldb`).
    pub b: u64,
    /// The `m × n` f64 output `Σ a·b` (leading dimension `n`).
    pub exact: u64,
    /// The `m × n` f64 output `Σ |a·b|` (leading dimension `n`).
    pub magnitude: u64,
    /// Leading dimension of A, in elements.
    pub lda: u64,
    /// Leading dimension of B, in elements.
    pub ldb: u64,
    /// Rows of A and of the outputs.
    pub m: u32,
    /// Rows of B, columns of the outputs.
    pub n: u32,
    /// The reduction length.
    pub k: u32,
    /// Padding to a multiple of 8 bytes.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<ReferenceParams>() == 64);
const _: () = assert!(core::mem::align_of::<ReferenceParams>() == 8);
const _: () = assert!(REFERENCE_THREADS == (REFERENCE_TILE / 4) * (REFERENCE_TILE / 4));
