//! The consumers: each warpgroup's main loop over the ring (`wgmma`), the slots' release,
//! and what its epilogue needs around the main loop (C's first chunk, the hook's flag).
use super::WARPGROUP_THREADS;
use super::config::Config;
use super::hook::wait_for_hook_flag;
use super::ring::Ring;
use super::row_scales::copy_row_scales;
use super::split::finish_split;
use super::tiles::Tiles;
use crate::device::mbarrier::PipelineState;
use crate::device::wgmma::{self, InputType};
use crate::device::{fence, index, sync, tma};
use crate::gemm_abi::*;
use crate::layout::descriptor;
use seq_macro::seq;

/// Consumer warpgroup `half` (0 or 1): main loop and epilogue for every tile (with split-K:
/// unit) of this block.
#[inline(always)]
pub(super) unsafe fn consume<T: InputType, C: Config>(
    p: &GemmParams,
    ring: Ring,
    tiles: Tiles,
    half: u32,
) {
    if C::TILE.split == ConsumerSplit::Single && half == 1 {
        // The other warpgroup computes every tile.
        return;
    }
    // (A configuration without staging buffers never stages: the host passes no D map.)
    let staged = C::TILE.staged && p.map_d != 0 && (p.beta == 0.0 || p.map_c != 0);
    // Chunks this warpgroup has staged so far (which buffer is next, and its use count).
    let mut chunks_staged = 0;
    let mut slot = PipelineState::new(C::TILE.stages);
    let mut acc = C::new_acc();
    // This warpgroup's share of each tile, and where its operand rows start in a slot.
    let (wg_row, wg_col) = C::TILE.wg_origin(half);
    // Whether C may be read yet: not before the hook's flag when it guards only C
    // (`HOOK_WAIT_BEFORE_C`), until this warpgroup's first epilogue acquires it.
    let mut c_ready = p.hook.flags & HOOK_WAIT_BEFORE_C == 0 || p.hook.wait_flag == 0;
    // Ping-pong ([`ConsumerSplit::Tiles`]): whether the next unit is this warpgroup's (the
    // block's tiles alternate, warpgroup 0 first), and how many main loops it has run.
    let pingpong = C::TILE.split == ConsumerSplit::Tiles;
    let mut mine = !pingpong || half == 0;
    let mut own = 0;
    let mut u = tiles.first;
    while u < tiles.end {
        let (t, kb0, kb1) = tiles.unit(u);
        if !mine {
            // Ping-pong: the other warpgroup's tile, whose ring slots pass this one by.
            slot.skip(C::TILE.stages_for(kb1 - kb0));
            mine = true;
            u = tiles.next(u, kb0, kb1);
            continue;
        }
        mine = !pingpong;
        let (row, col) = tiles.origin(t);
        // This warpgroup's share of the tile.
        let (row, col) = (row + wg_row, col + wg_col);
        let first = if pingpong { own == 0 } else { u == tiles.first };
        if staged && first && index::thread_in_warpgroup() == 0 {
            // This leader issues the TMA stores of D and the TMA loads of C: it acquires their
            // tensor maps itself before its first use; and since C may be a peer's partial
            // guarded by the hook's flag (acquired by thread 0, handed over by a CTA or
            // cluster barrier), it orders its own generic-proxy view of global memory before
            // its async-proxy reads of C. (Placed before this loop, these fences made ptxas
            // spill accumulators of the 128×256 and 192×192 tiles.)
            unsafe { fence::tensormap_acquire(p.map_d) };
            if p.beta != 0.0 {
                unsafe { fence::tensormap_acquire(p.map_c) };
                fence::proxy_async_global();
            }
        }
        // Whether this tile's first C chunk is loaded after its main loop (split-K: only the
        // tile's last split runs the epilogue; a C still to be waited for) instead of before.
        let c_after_main_loop = C::TILE.split_k || !c_ready;
        if !c_after_main_loop && staged && p.beta != 0.0 && index::thread_in_warpgroup() == 0 {
            // The tile's first C chunk goes into the buffer that the store of the previous
            // tile's last chunk but one reads: once it has, the load overlaps the main loop.
            tma::wait_group_read::<1>();
            unsafe { load_c_chunk(p, ring, half, chunks_staged, row, col, 0) };
        }
        if staged && T::FP8 && p.row_scales.a != 0 {
            unsafe { copy_row_scales::<C>(p, ring, half, row, col) };
        }
        if pingpong && (half == 1 || own > 0) {
            // The main loops take turns: warpgroup 0's n-th (n ≥ 1) follows warpgroup 1's
            // (n − 1)-th, warpgroup 1's n-th follows warpgroup 0's n-th. Besides sharing the
            // tensor cores, this keeps the slot waits below at most one phase ahead of each
            // slot's `full` barrier (the other warpgroup has waited out every earlier fill).
            let done = if half == 0 { own - 1 } else { own };
            unsafe { ring.order(half).wait_warp(done & 1) };
        }
        let mut previous = 0;
        let kps = C::TILE.k_blocks_per_stage;
        let (st0, st1) = (kb0 / kps, kb1.div_ceil(kps));
        for st in st0..st1 {
            unsafe { ring.full(slot.stage).wait_warp(slot.phase) };
            C::fence(&mut acc);
            wgmma::fence();
            let a = descriptor::k_major_sw128(ring.a_tile(slot.stage) + wg_row * BLOCK_K * 2);
            let b = descriptor::k_major_sw128(ring.b_tile(slot.stage) + wg_col * BLOCK_K * 2);
            // The unit's first k-block overwrites the accumulators (`scale-d` 0), every later
            // one adds to them.
            unsafe { mma_k_block::<T, C>(&mut acc, a, b, (st > st0) as u32) };
            // The stage's further k-blocks (zeros past K): each its own A and B tiles, whole
            // swizzle atoms on (`J < kps` is a constant: the untaken ones compile away).
            seq!(J in 1..4 {
                if J < kps {
                    let a = descriptor::advance_atoms(a, J * C::TILE.a_block_bytes());
                    let b = descriptor::advance_atoms(b, J * C::TILE.b_block_bytes());
                    unsafe { mma_k_block::<T, C>(&mut acc, a, b, 1) };
                }
            });
            wgmma::commit_group();
            wgmma::wait_group::<1>();
            C::fence(&mut acc);
            if st > st0 {
                unsafe { release(ring, previous) };
            }
            previous = slot.stage;
            slot.advance();
        }
        if pingpong {
            if index::lane_idx() == 0 {
                // The other warpgroup's main loop may start: this one has waited out its last
                // slot and issued its last `wgmma`s, so the other's first queue behind them on
                // the tensor cores instead of after the drain below.
                unsafe { ring.order(1 - half).arrive() };
            }
            own += 1;
        }
        wgmma::wait_group::<0>();
        C::fence(&mut acc);
        if kb1 > kb0 {
            unsafe { release(ring, previous) };
        }
        if C::TILE.split_k && !unsafe { finish_split::<C>(p, ring, &mut acc, t, half, row) } {
            u = tiles.next(u, kb0, kb1);
            continue;
        }
        if !c_ready {
            unsafe { await_c(p, half) };
            c_ready = true;
        }
        if c_after_main_loop && staged && p.beta != 0.0 && index::thread_in_warpgroup() == 0 {
            tma::wait_group_read::<1>();
            unsafe { load_c_chunk(p, ring, half, chunks_staged, row, col, 0) };
        }
        if staged {
            unsafe { C::epilogue_staged::<T>(p, &acc, ring, half, row, col, chunks_staged) };
            chunks_staged += C::TILE.chunks_per_tile();
        } else {
            unsafe { C::epilogue::<T>(p, &acc, row, col) };
        }
        u = tiles.next(u, kb0, kb1);
    }
    if staged && index::thread_in_warpgroup() == 0 {
        // The block's shared memory must outlive the reads of its last stores, and the
        // output must be complete when the grid is.
        tma::wait_group::<0>();
    }
}

/// Issues one 64-deep k-block's `wgmma`s: four k16 steps, 32 bytes apart inside the 128-byte
/// swizzle atoms of the A and B tiles that `a` and `b` describe; the first step scales the
/// accumulators by `scale_d` (0: start from zero, 1: add), the others add.
///
/// # Safety
/// Between `wgmma.fence` and `commit_group`, with `a` and `b` describing k-major, 128-byte
/// swizzled tiles of a full ring slot (the contract of [`Config::mma`]).
#[inline(always)]
unsafe fn mma_k_block<T: InputType, C: Config>(acc: &mut C::Acc, a: u64, b: u64, scale_d: u32) {
    seq!(K in 0..4 {
        unsafe {
            C::mma::<T>(
                acc,
                descriptor::offset_in_atom(a, K * descriptor::K16_STEP_BYTES),
                descriptor::offset_in_atom(b, K * descriptor::K16_STEP_BYTES),
                if K == 0 { scale_d } else { 1 },
            )
        };
    });
}

/// Hands slot `stage` back: one arrival per consumer warp on the slot's `empty` barrier of
/// every block in the cluster.
#[inline(always)]
unsafe fn release(ring: Ring, stage: u32) {
    if index::lane_idx() != 0 {
        return;
    }
    if ring.tile.cluster_m == 1 {
        unsafe { ring.empty(stage).arrive() };
    } else {
        for rank in 0..ring.tile.cluster_m {
            unsafe { ring.empty(stage).arrive_cluster(rank) };
        }
    }
}

/// Starts the TMA load of C for staged chunk `i` ([`TileConfig::chunk_offset`]) of a
/// warpgroup's tile share whose top-left element is `(row, col)` into staging buffer `g % 2` of
/// warpgroup `half`, `g` being the chunk's number among all the chunks the warpgroup stages.
/// It completes on the buffer's `c_loaded` mbarrier. The buffer must be free: no store still
/// reading it, no thread still touching it.
#[inline(always)]
pub(super) unsafe fn load_c_chunk(
    p: &GemmParams,
    ring: Ring,
    half: u32,
    g: u32,
    row: u32,
    col: u32,
    i: u32,
) {
    let (dr, dc) = ring.tile.chunk_offset(i);
    let loaded = ring.c_loaded(half, g % 2);
    unsafe {
        loaded.arrive_expect_tx(ring.tile.epilogue_cols() * EPILOGUE_CHUNK * 2);
        tma::load_2d(
            ring.staging(half, g % 2),
            p.map_c,
            (col + dc) as i32,
            (row + dr) as i32,
            loaded.0,
        );
    }
}

/// [`HOOK_WAIT_BEFORE_C`]: consumer warpgroup `half`'s leader waits for the hook's flag (the
/// neighbour's pushed partial, this stage's C) before the warpgroup's first C load, as the
/// prologue would have: system-scope acquire, bounded, the error recorded on a timeout; then
/// it orders the acquire before its own TMA reads of C, and the warpgroup barrier before the
/// other threads' generic reads (the unstaged epilogue).
///
/// # Safety
/// `p.hook` must hold the flag, error words and code the lowering fills (valid global memory
/// of this GPU or a peer's).
#[inline(always)]
unsafe fn await_c(p: &GemmParams, half: u32) {
    if index::thread_in_warpgroup() == 0 {
        // On a timeout the block finishes its tiles anyway (see `HOOK_WAIT_BEFORE_C`).
        let _timed_out = unsafe { wait_for_hook_flag(&p.hook) };
        fence::proxy_async_global();
    }
    sync::named_sync(1 + half, WARPGROUP_THREADS);
}
