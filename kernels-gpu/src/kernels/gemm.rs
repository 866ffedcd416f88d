//! The Hopper GEMM stage kernel: `D = alpha · A · Bᵀ + beta · C` (see [`crate::gemm_abi`]).
//!
//! Structure (one block of 384 threads per SM, persistent over output tiles):
//! - **warpgroup 0, the producer**: gives registers back (`setmaxnreg.dec 40`); one thread walks
//!   the block's tiles and, per 64-wide k-block, waits for a free ring slot (`empty` mbarrier),
//!   announces the stage's bytes on its `full` mbarrier and issues two TMA loads (A 128×64 and
//!   B 256×64, 128-byte swizzle). Loads past the matrix edge are zero-filled by TMA, so ragged
//!   M, N and K need no special case in the main loop.
//! - **warpgroups 1 and 2, the consumers** (`setmaxnreg.inc 232`): warpgroup `1 + h` owns rows
//!   `64h..64h+63` of the 128×256 tile and keeps its 64×256 f32 accumulator in 128 registers per
//!   thread. Per k-block it waits for the slot to be `full`, issues four `m64n256k16` wgmmas
//!   (k16 steps at +32 B in the swizzled rows), commits them, waits until only this batch is in
//!   flight and hands the *previous* slot back to the producer, so one batch of tensor-core work
//!   always overlaps the wait for the next slot. After the last k-block it drains, then runs the
//!   epilogue straight from registers: `alpha·acc + beta·C`, rounded and stored with bounds
//!   checks, while the producer already streams the next tile's operands.
//! - **prologue hook**: every thread executes `griddepcontrol.wait` (PDL) after the barrier set-up;
//!   thread 0 then signals/waits on cross-GPU flags as [`StageHook`] says. The producer issues
//!   `griddepcontrol.launch_dependents` after its last load.
use crate::device::flags::{self, WaitOutcome};
use crate::device::mbarrier::{MBarrier, PipelineState};
use crate::device::wgmma::{self, Bf16, F16, InputType};
use crate::device::{fence, gdc, index, regs, smem, sync, tma};
use crate::gemm_abi::*;
use crate::layout::{descriptor, raster};
use seq_macro::seq;

/// Consumer warps: each arrives once on a slot's `empty` barrier when it is done reading it.
const CONSUMER_WARPS: u32 = 8;

/// Shared-memory addresses of the ring.
#[derive(Clone, Copy)]
struct Ring {
    base: u32,
}

impl Ring {
    #[inline(always)]
    fn a_tile(self, stage: u32) -> u32 {
        self.base + stage * A_TILE_BYTES
    }
    #[inline(always)]
    fn b_tile(self, stage: u32) -> u32 {
        self.base + STAGES * A_TILE_BYTES + stage * B_TILE_BYTES
    }
    #[inline(always)]
    fn full(self, stage: u32) -> MBarrier {
        MBarrier(self.base + BARRIER_OFFSET + 8 * stage)
    }
    #[inline(always)]
    fn empty(self, stage: u32) -> MBarrier {
        MBarrier(self.base + BARRIER_OFFSET + 8 * (STAGES + stage))
    }
    #[inline(always)]
    fn abort_flag(self) -> u32 {
        self.base + ABORT_FLAG_OFFSET
    }
}

/// The block's share of the output: tiles `block, block + grid, …` in raster order.
#[derive(Clone, Copy)]
struct Tiles {
    num_m: u32,
    num_n: u32,
    total: u32,
}

impl Tiles {
    #[inline(always)]
    fn new(p: &GemmParams) -> Self {
        let (num_m, num_n) = (p.m.div_ceil(BLOCK_M), p.n.div_ceil(BLOCK_N));
        Self {
            num_m,
            num_n,
            total: num_m * num_n,
        }
    }
    /// Top-left element `(row, col)` of linear tile `tile`.
    #[inline(always)]
    fn origin(self, tile: u32) -> (u32, u32) {
        let (mt, nt) = raster::tile_coord(tile, self.num_m, self.num_n, RASTER_GROUP_M);
        (mt * BLOCK_M, nt * BLOCK_N)
    }
}

/// Runs the prologue hook on thread 0 and tells every thread whether to go on.
/// Must be reached by all threads of the block (it contains a CTA barrier).
#[inline(always)]
unsafe fn prologue_hook(hook: &StageHook, ring: Ring) -> bool {
    if index::thread_idx() == 0 {
        let mut abort = 0;
        if hook.signal_flag != 0 && index::block_idx() == 0 {
            fence::acq_rel_sys();
            unsafe { flags::store_release_sys(hook.signal_flag as *mut u32, hook.signal_value) };
        }
        if hook.wait_flag != 0 {
            let outcome = unsafe {
                flags::wait_at_least(
                    hook.wait_flag as *const u32,
                    hook.wait_value,
                    hook.timeout_ns,
                )
            };
            if outcome == WaitOutcome::TimedOut {
                unsafe { flags::store_relaxed_sys(hook.error_word as *mut u32, hook.error_code) };
                abort = 1;
            }
            // TMA reads what the flag guards through the async proxy.
            fence::proxy_async_global();
        }
        unsafe { smem::store_u32(ring.abort_flag(), abort) };
    }
    sync::sync_threads();
    unsafe { smem::load_u32(ring.abort_flag()) == 0 }
}

/// Producer: one thread streams (A, B) k-blocks of every tile of this block into the ring.
#[inline(always)]
unsafe fn produce(p: &GemmParams, ring: Ring, tiles: Tiles) {
    let k_blocks = p.k.div_ceil(BLOCK_K);
    let mut slot = PipelineState::<STAGES>::new();
    let mut tile = index::block_idx();
    while tile < tiles.total {
        let (row, col) = tiles.origin(tile);
        for kb in 0..k_blocks {
            let k = (kb * BLOCK_K) as i32;
            unsafe {
                ring.empty(slot.stage).wait(slot.phase ^ 1);
                let full = ring.full(slot.stage);
                full.arrive_expect_tx(STAGE_BYTES);
                tma::load_2d(ring.a_tile(slot.stage), p.map_a, k, row as i32, full.0);
                tma::load_2d(ring.b_tile(slot.stage), p.map_b, k, col as i32, full.0);
            }
            slot.advance();
        }
        tile += index::grid_dim();
    }
    gdc::launch_dependents();
}

/// One k-block of a consumer: four k16 wgmmas of its 64×256 slice, reading slot `stage`.
/// `accumulate == 0` starts the tile (the first wgmma overwrites the accumulators).
#[inline(always)]
unsafe fn mma_k_block<T: InputType>(
    acc: &mut [f32; 128],
    ring: Ring,
    stage: u32,
    half: u32,
    accumulate: u32,
) {
    let a = ring.a_tile(stage) + half * (64 * 128);
    let b = ring.b_tile(stage);
    seq!(K in 0..4 {
        unsafe {
            T::mma_n256(
                acc,
                descriptor::k_major_sw128(a + K * descriptor::K16_STEP_BYTES),
                descriptor::k_major_sw128(b + K * descriptor::K16_STEP_BYTES),
                if K == 0 { accumulate } else { 1 },
            )
        };
    });
}

/// Consumer warpgroup `half` (0 or 1): main loop and epilogue for every tile of this block.
#[inline(always)]
unsafe fn consume<T: InputType>(p: &GemmParams, ring: Ring, tiles: Tiles, half: u32) {
    let k_blocks = p.k.div_ceil(BLOCK_K);
    let lane_leader = index::lane_idx() == 0;
    let mut slot = PipelineState::<STAGES>::new();
    let mut acc = [0f32; 128];
    let mut tile = index::block_idx();
    while tile < tiles.total {
        let (row, col) = tiles.origin(tile);
        let mut previous = 0;
        for kb in 0..k_blocks {
            unsafe { ring.full(slot.stage).wait(slot.phase) };
            wgmma::fence_operands_128(&mut acc);
            wgmma::fence();
            unsafe { mma_k_block::<T>(&mut acc, ring, slot.stage, half, (kb > 0) as u32) };
            wgmma::commit_group();
            wgmma::wait_group::<1>();
            wgmma::fence_operands_128(&mut acc);
            if kb > 0 && lane_leader {
                unsafe { ring.empty(previous).arrive() };
            }
            previous = slot.stage;
            slot.advance();
        }
        wgmma::wait_group::<0>();
        wgmma::fence_operands_128(&mut acc);
        if k_blocks > 0 && lane_leader {
            unsafe { ring.empty(previous).arrive() };
        }
        unsafe { epilogue::<T>(p, &acc, row + half * 64, col) };
        tile += index::grid_dim();
    }
}

/// Stores one pair of horizontally adjacent outputs `(row, col)`, `(row, col + 1)`.
#[inline(always)]
unsafe fn store_pair<T: InputType>(p: &GemmParams, row: u32, col: u32, x0: f32, x1: f32) {
    if row >= p.m || col >= p.n {
        return;
    }
    let mut v0 = p.alpha * x0;
    let mut v1 = p.alpha * x1;
    let d = p.d as *mut u16;
    let at_d = (row as usize) * (p.ldd as usize) + col as usize;
    if col + 1 < p.n {
        if p.beta != 0.0 {
            let at_c = (row as usize) * (p.ldc as usize) + col as usize;
            let (c0, c1) = T::unpack2(unsafe { *((p.c as *const u16).add(at_c) as *const u32) });
            v0 += p.beta * c0;
            v1 += p.beta * c1;
        }
        unsafe { *(d.add(at_d) as *mut u32) = T::pack2(v0, v1) };
    } else {
        // Last column of an odd N: a single element.
        if p.beta != 0.0 {
            let at_c = (row as usize) * (p.ldc as usize) + col as usize;
            v0 += p.beta * T::unpack2(unsafe { *(p.c as *const u16).add(at_c) } as u32).0;
        }
        unsafe { *d.add(at_d) = T::pack2(v0, 0.0) as u16 };
    }
}

/// Writes a consumer's 64×256 accumulator slice whose top-left output element is `(row, col)`.
/// Register `4j + {0,1}` holds row `r0`, columns `8j + 2(lane % 4) + {0,1}`; `4j + {2,3}` the
/// same columns of row `r0 + 8`, where `r0 = 16·warp + lane / 4` (the wgmma fragment layout).
#[inline(always)]
unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &[f32; 128], row: u32, col: u32) {
    let t = index::thread_in_warpgroup();
    let r0 = row + 16 * (t / 32) + (t % 32) / 4;
    let c0 = col + 2 * (t % 4);
    seq!(J in 0..32 {
        unsafe {
            store_pair::<T>(p, r0, c0 + 8 * J, acc[4 * J], acc[4 * J + 1]);
            store_pair::<T>(p, r0 + 8, c0 + 8 * J, acc[4 * J + 2], acc[4 * J + 3]);
        }
    });
}

/// The kernel body shared by the bf16 and f16 entry points.
#[inline(always)]
unsafe fn gemm<T: InputType>(p: &GemmParams) {
    let ring = Ring {
        base: smem::shared_addr(smem::dynamic_smem()),
    };
    let tid = index::thread_idx();
    if tid == 0 {
        unsafe {
            tma::prefetch_descriptor(p.map_a);
            tma::prefetch_descriptor(p.map_b);
            for s in 0..STAGES {
                ring.full(s).init(1);
                ring.empty(s).init(CONSUMER_WARPS);
            }
        }
        fence::mbarrier_init();
    }
    // Everything above touched only this block's shared memory; from here on we read
    // what earlier grids wrote (and may write what they read).
    gdc::wait_for_prerequisites();
    if !unsafe { prologue_hook(&p.hook, ring) } {
        return;
    }
    let tiles = Tiles::new(p);
    if index::warpgroup_idx() == 0 {
        regs::decrease_to::<40>();
        if tid == 0 {
            unsafe { produce(p, ring, tiles) };
        }
    } else {
        regs::increase_to::<232>();
        unsafe { consume::<T>(p, ring, tiles, index::warpgroup_idx() - 1) };
    }
}

/// bf16 × bf16 → f32 accumulate → bf16. Launch: block [`THREADS`], [`SMEM_BYTES`] dynamic
/// shared memory, grid ≤ number of SMs (persistent).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gemm_bf16(p: GemmParams) {
    unsafe { gemm::<Bf16>(&p) }
}

/// f16 × f16 → f32 accumulate → f16. Launch as [`gemm_bf16`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gemm_f16(p: GemmParams) {
    unsafe { gemm::<F16>(&p) }
}
