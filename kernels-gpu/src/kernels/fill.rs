//! Filling large buffers with pseudo-random data on the device, so benchmarks of multi-GiB
//! operands do not spend minutes generating them on the host.
use crate::device::index;

/// A 32-bit hash of (index, seed) (the "lowbias32" integer mixer), uniform enough for test data.
#[inline(always)]
fn hash(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// An approximately standard-normal value for element `i`: the sum of four uniforms on [0, 1)
/// has mean 2 and variance 1/3 (Irwin–Hall), so `(sum − 2)·√3` has mean 0 and variance 1.
#[inline(always)]
fn normal(i: u64, seed: u32) -> f32 {
    let base = hash((i as u32) ^ hash(seed ^ ((i >> 32) as u32).wrapping_mul(0x9e37_79b9)));
    let mut sum = 0.0f32;
    let mut h = base;
    for _ in 0..4 {
        h = hash(h.wrapping_add(0x6a09_e667));
        sum += (h >> 8) as f32 * (1.0 / 16_777_216.0);
    }
    (sum - 2.0) * 1.732_050_8
}

/// Fills `n` 16-bit elements at `out` with approximately N(0, 1) values converted by `pack`.
#[inline(always)]
unsafe fn fill(out: *mut u16, n: u64, seed: u32, pack: impl Fn(f32) -> u16) {
    let stride = (index::grid_dim() * index::block_dim()) as u64;
    let mut i = index::global_thread_idx() as u64;
    while i < n {
        unsafe { *out.add(i as usize) = pack(normal(i, seed)) };
        i += stride;
    }
}

/// bf16 N(0, 1)-like fill (grid-stride loop; any grid).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fill_normal_bf16(out: *mut u16, n: u64, seed: u32) {
    use crate::device::wgmma::{Bf16, InputType};
    unsafe { fill(out, n, seed, |x| Bf16::pack2(x, 0.0) as u16) }
}

/// f16 N(0, 1)-like fill (grid-stride loop; any grid).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fill_normal_f16(out: *mut u16, n: u64, seed: u32) {
    use crate::device::wgmma::{F16, InputType};
    unsafe { fill(out, n, seed, |x| F16::pack2(x, 0.0) as u16) }
}
