//! Smoke-test kernels: each exercises one piece of the device layer on real hardware, small
//! enough that a host test can check every output element.
use crate::device::{fence, flags, gdc, index, mbarrier::MBarrier, smem, sync, tma, wgmma};
use crate::layout::{descriptor, swizzle};
use seq_macro::seq;

/// `c[i] = a[i] + b[i]` for `i < n`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_vector_add(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u32,
) {
    let i = index::global_thread_idx();
    if i < n {
        let i = i as usize;
        unsafe { *c.add(i) = *a.add(i) + *b.add(i) };
    }
}

/// Side of the square bf16 box the TMA smoke test moves: 64 × 64 elements, 128-byte rows.
const TMA_BOX: u32 = 64;
const TMA_BOX_BYTES: u32 = TMA_BOX * TMA_BOX * 2;

/// Loads the 64×64 box at `(col, row)` through `src_map` (128-byte swizzle) into shared memory,
/// copies the raw swizzled bytes to `raw` (4096 × u16, shared-memory order), then stores the box
/// back to `(col, row)` through `dst_map`. One block of 128 threads; 16 KiB dynamic smem.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_tma_roundtrip(
    src_map: u64,
    dst_map: u64,
    raw: *mut u16,
    col: u32,
    row: u32,
) {
    let base = smem::dynamic_smem();
    let tile = smem::shared_addr(base);
    let bar = MBarrier(tile + TMA_BOX_BYTES);
    let tid = index::thread_idx();
    if tid == 0 {
        unsafe {
            tma::prefetch_descriptor(src_map);
            bar.init(1);
        }
        fence::mbarrier_init();
    }
    sync::sync_threads();
    if tid == 0 {
        unsafe {
            bar.arrive_expect_tx(TMA_BOX_BYTES);
            tma::load_2d(tile, src_map, col as i32, row as i32, bar.0);
        }
    }
    unsafe { bar.wait(0) };
    let mut i = tid;
    while i < TMA_BOX * TMA_BOX {
        unsafe { *raw.add(i as usize) = *(base as *const u16).add(i as usize) };
        i += index::block_dim();
    }
    sync::sync_threads();
    if tid == 0 {
        unsafe { tma::store_2d(dst_map, col as i32, row as i32, tile) };
        tma::commit_group();
        tma::wait_group::<0>();
    }
}

/// Copies a row-major `rows × 64` matrix of 16-bit elements from global memory into shared
/// memory at `dst` in the 128-byte swizzled layout TMA would produce, then fences so that
/// `wgmma` (async proxy) may read it after a barrier.
#[inline(always)]
unsafe fn stage_sw128(src: *const u16, rows: u32, dst: *mut u8) {
    let mut i = index::thread_idx();
    while i < rows * 64 {
        let (r, c) = (i / 64, i % 64);
        unsafe {
            *(dst.add(swizzle::sw128_offset_16bit(r, c) as usize) as *mut u16) =
                *src.add(i as usize)
        };
        i += index::block_dim();
    }
    fence::proxy_async_shared();
}

/// Row and column of accumulator register `i` of the calling thread in a 64×N wgmma tile.
#[inline(always)]
pub fn accumulator_coord(i: u32) -> (u32, u32) {
    let t = index::thread_in_warpgroup();
    let (w, l) = (t / 32, t % 32);
    (
        16 * w + l / 4 + 8 * ((i / 2) % 2),
        8 * (i / 4) + 2 * (l % 4) + i % 2,
    )
}

/// Defines a one-warpgroup kernel computing `d (64×N f32) = a (64×64) · bᵀ (b: N×64)`, staging
/// both operands in the 128-byte swizzled layout and issuing four `k16` steps.
macro_rules! smoke_wgmma {
    ($name:ident, $ty:ty, $n:literal, $regs:literal, $mma:ident, $fence:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(a: *const u16, b: *const u16, d: *mut f32) {
            let base = smem::dynamic_smem();
            let a_tile = base;
            let b_tile = unsafe { base.add(64 * 128) };
            unsafe {
                stage_sw128(a, 64, a_tile);
                stage_sw128(b, $n, b_tile);
            }
            sync::sync_threads();
            let (a_addr, b_addr) = (smem::shared_addr(a_tile), smem::shared_addr(b_tile));
            let mut acc = [0f32; $regs];
            wgmma::$fence(&mut acc);
            wgmma::fence();
            seq!(K in 0..4 {
                unsafe {
                    <$ty as wgmma::InputType>::$mma(
                        &mut acc,
                        descriptor::k_major_sw128(a_addr + K * descriptor::K16_STEP_BYTES),
                        descriptor::k_major_sw128(b_addr + K * descriptor::K16_STEP_BYTES),
                        K,
                    )
                };
            });
            wgmma::commit_group();
            wgmma::wait_group::<0>();
            wgmma::$fence(&mut acc);
            seq!(I in 0..$regs {
                let (r, c) = accumulator_coord(I);
                unsafe { *d.add((r * $n + c) as usize) = acc[I] };
            });
        }
    };
}

smoke_wgmma!(
    smoke_wgmma_m64n64k16_bf16,
    wgmma::Bf16,
    64,
    32,
    mma_n64,
    fence_operands_32
);
smoke_wgmma!(
    smoke_wgmma_m64n64k16_f16,
    wgmma::F16,
    64,
    32,
    mma_n64,
    fence_operands_32
);
smoke_wgmma!(
    smoke_wgmma_m64n256k16_bf16,
    wgmma::Bf16,
    256,
    128,
    mma_n256,
    fence_operands_128
);
smoke_wgmma!(
    smoke_wgmma_m64n256k16_f16,
    wgmma::F16,
    256,
    128,
    mma_n256,
    fence_operands_128
);

/// PDL primary: lets its dependent launch at once, spins for about `spin_ns`, then writes
/// `out[i] = 3i + 1`. The dependent must not see these writes before its
/// `griddepcontrol.wait` returns.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_pdl_primary(out: *mut u32, n: u32, spin_ns: u32) {
    gdc::launch_dependents();
    let start = flags::global_timer_ns();
    while flags::global_timer_ns().wrapping_sub(start) < spin_ns as u64 {
        flags::nanosleep(1000);
    }
    let i = index::global_thread_idx();
    if i < n {
        unsafe { *out.add(i as usize) = 3 * i + 1 };
    }
}

/// PDL secondary: waits for its prerequisite grid, then writes `out[i] = inp[i] + 7`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_pdl_secondary(inp: *const u32, out: *mut u32, n: u32) {
    gdc::wait_for_prerequisites();
    let i = index::global_thread_idx();
    if i < n {
        let i = i as usize;
        unsafe { *out.add(i) = *inp.add(i) + 7 };
    }
}
