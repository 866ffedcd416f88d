//! The Hopper GEMM stage kernel: `D = alpha · A · Bᵀ + beta · C` (see [`crate::gemm_abi`]).
//! `kernels-gpu/GUIDE.md` follows one tile through it, from the host's choice to the TMA store.
//!
//! Structure (one block of 384 threads per SM, persistent over output tiles):
//! - **warpgroup 0, the producer**: gives registers back (`setmaxnreg.dec 40`); one thread walks
//!   the block's tiles and, per 64-wide k-block, waits for a free ring slot (`empty` mbarrier),
//!   announces the stage's bytes on its `full` mbarrier and issues the TMA loads (A `BM`×64,
//!   in a partial last m-tile only the rows up to M: [`GemmParams::a_tail_box_rows`], and B
//!   `BN`×64, in a partial last n-tile only the rows up to N: [`GemmParams::b_tail_box_rows`];
//!   128-byte swizzle). Loads past K are zero-filled by TMA, and a slot's rows past a tail
//!   box feed only outputs past M or N, which are never stored, so ragged M, N and K need no
//!   special case in the main loop.
//! - **warpgroups 1 and 2, the consumers** (`setmaxnreg.inc 232`): warpgroup `1 + h` owns half
//!   of the tile ([`ConsumerSplit`]): rows `64h..64h+63` of a 128-row tile, or columns
//!   `96h..96h+95` of a 192×192 one, kept in registers as f32 accumulator *slabs* of 64 rows
//!   (one, or three). Per k-block it waits for the slot to be `full` (a warp-uniform wait, so
//!   the slot, parity and wgmma descriptors stay in uniform registers), issues one
//!   `m64nNk16` wgmma per slab and k16 step (k16 steps at +32 B in the swizzled rows), commits
//!   them, waits until only this batch is in flight and hands the *previous* slot back to the
//!   producer, so one batch of tensor-core work always overlaps the wait for the next slot.
//!   After the last k-block it drains, then runs the epilogue (`alpha·acc + beta·C`, rounded)
//!   while the producer already streams the next tile's operands: chunks of 64 rows × 64 (or
//!   32) columns staged in shared memory with `stmatrix` and written by TMA stores (with
//!   `beta != 0`, each chunk's C arrives in its staging buffer by a TMA load issued one chunk
//!   ahead, a tile's first before its main loop), or, when N is not a multiple of 8,
//!   bounds-checked stores straight from registers. Row-wise FP8 scales for a staged tile are
//!   copied into shared memory with `cp.async` while its main loop runs
//!   ([`row_scales::copy_row_scales`]).
//! - **the transposed product** (`*t` decode configurations, at most 16 rows:
//!   [`TileConfig::swap_ab`]): a consumer warpgroup multiplies its 64 rows of the stage's B
//!   tile, as the `wgmma`'s A operand, by the stage's 16 rows of A, as its B operand
//!   (`m64n16`), so its accumulator holds the share transposed and is stored element by
//!   element from registers ([`swapped`]); `16x64t` gives the whole 64-wide tile to
//!   warpgroup 1 and warpgroup 2 returns at once ([`ConsumerSplit::Single`]).
//! - **clusters** (`cluster_m == 2`): the two blocks of a cluster compute vertically adjacent
//!   tiles of the same n-tile. Each loads its own A tile and half of the shared B tile, which
//!   TMA multicasts into both blocks; a slot is free only when the consumers of *both* blocks
//!   have released it, so consumers arrive on the `empty` barrier of every block in the cluster.
//! - **split-K** (`*s` configurations, for problems whose tiles leave SMs idle): every block
//!   takes an equal range of the tiles' k-blocks laid end to end (stream-K,
//!   [`crate::layout::stream_k`]) instead of whole tiles; for a tile cut between blocks each
//!   consumer warpgroup writes its f32 partial to global memory and counts in on the tile's
//!   counter, and the one that arrives last adds all partials in k order (deterministic) and
//!   runs the epilogue ([`split::finish_split`], layout and hand-off in [`SplitParams`] and
//!   [`crate::device::grid`]).
//! - **prologue hook**: every thread executes `griddepcontrol.wait` (PDL) after the barrier set-up
//!   (unless [`HOOK_DEFER_GRID_WAIT`] moves it to the end, for thread 0); thread 0 then
//!   signals/waits on cross-GPU flags as [`StageHook`] says. The producer issues
//!   `griddepcontrol.launch_dependents` after its last load.
//! - **proxies**: A's and B's tensor maps come in the parameter block (nothing writes them in
//!   memory: no proxy fence); D's and C's live in device memory and are acquired for the
//!   tensormap proxy (`fence.proxy.tensormap::generic.acquire`) by every thread that uses one,
//!   before its first use: thread 0 (to prefetch them) and the consumer leaders. After the
//!   hook's flag acquire, thread 0 and each C-loading leader run their own
//!   `fence.proxy.async.global` before their TMA reads of what the flag guards.
//!
//! Files, one role each: this one holds the kernel body and its entry points ([`gemm`],
//! [`local_gemm`], `entries!`); [`config`] the seam to each tile configuration, whose
//! implementations [`slabs`] (64-row slabs) and [`swapped`] (the transposed product) spell
//! out; [`ring`] the shared-memory map; [`tiles`] which units a block takes; [`produce`] and
//! [`consume`] the two roles; [`split`] split-K's hand-off; [`store`] and [`row_scales`] the
//! register epilogue's stores and the FP8 scales; [`hook`] the stage's cross-GPU entry.
mod config;
mod consume;
mod hook;
mod produce;
mod ring;
mod row_scales;
mod slabs;
mod split;
mod store;
mod swapped;
mod tiles;

use crate::device::wgmma::{Bf16, E4m3, F16, InputType};
use crate::device::{cluster, fence, gdc, index, regs, smem, tma};
use crate::gemm_abi::*;
use config::Config;
use consume::consume;
use hook::stage_prologue;
use produce::{operand_maps, produce};
use ring::Ring;
use slabs::*;
use swapped::*;
use tiles::Tiles;

/// Threads of one warpgroup.
const WARPGROUP_THREADS: u32 = 128;

/// The local GEMM, the part a single-GPU kernel would be: the warpgroups take their roles
/// (producer: warpgroup 0 gives registers back and its thread 0 streams the operands;
/// consumers: warpgroups 1 and 2 take registers and compute), then, in a cluster, both blocks
/// meet before either exits (the partner may still multicast into this block's shared memory
/// or arrive on its barriers).
#[inline(always)]
unsafe fn local_gemm<T: InputType, C: Config>(p: &GemmParams, ring: Ring, tid: u32) {
    let tiles = Tiles::new(p, C::TILE);
    if index::warpgroup_idx() == 0 {
        regs::decrease_to::<40>();
        if tid == 0 {
            unsafe { produce(p, ring, tiles) };
        }
    } else {
        regs::increase_to::<232>();
        unsafe { consume::<T, C>(p, ring, tiles, index::warpgroup_idx_uniform() - 1) };
    }
    if C::TILE.cluster_m > 1 {
        cluster::cluster_sync();
    }
}

/// The kernel body shared by every entry point, in four steps:
/// 1. block set-up (thread 0): acquire the D and C tensor maps (in device memory) for the
///    tensormap proxy, prefetch every map (A's and B's from the parameter block), initialise the ring's mbarriers (`full`: one arrival, the producer's, plus the TMA
///    bytes; `empty`: one arrival per consumer warp of every block in the cluster; one per
///    staging buffer for loads of C) and publish them to the async proxy (written out here
///    rather than in a function: so placed, the built PTX is byte-identical to the kernel's
///    measured form, where a helper function changed the branch layout of the PTX);
/// 2. [`stage_prologue`]: the PDL wait and the cross-GPU hook;
/// 3. [`local_gemm`]: producer and consumers over this block's tiles;
/// 4. when the host deferred the grid wait, thread 0 waits for the previous grid at the end,
///    so that whoever waits for this grid (the next stage) is ordered after the predecessor
///    too.
#[inline(always)]
unsafe fn gemm<T: InputType, C: Config>(p: &GemmParams) {
    let ring = Ring {
        base: smem::shared_addr(smem::dynamic_smem()),
        tile: C::TILE,
    };
    let tid = index::thread_idx();
    if tid == 0 {
        unsafe {
            // Thread 0 prefetches every map and issues the A and B loads. A and B come with
            // the launch, in the parameter block (no proxy fence: nothing writes them in
            // memory); the D and C maps live in device memory, so it acquires those first (the
            // consumer leaders acquire them again for themselves).
            if p.map_d != 0 {
                fence::tensormap_acquire(p.map_d);
            }
            if p.map_c != 0 {
                fence::tensormap_acquire(p.map_c);
            }
            let maps = operand_maps();
            tma::prefetch_descriptor(maps.a);
            tma::prefetch_descriptor(maps.b);
            tma::prefetch_descriptor(maps.a_tail);
            tma::prefetch_descriptor(maps.b_tail);
            if p.map_d != 0 {
                tma::prefetch_descriptor(p.map_d);
            }
            if p.map_c != 0 {
                tma::prefetch_descriptor(p.map_c);
            }
            for s in 0..C::TILE.stages {
                ring.full(s).init(1);
                ring.empty(s)
                    .init(C::TILE.warps_per_slot() * C::TILE.cluster_m);
            }
            if C::TILE.split == ConsumerSplit::Tiles {
                // Ping-pong: one arrival per warp of the warpgroup whose main loop ends.
                ring.order(0).init(4);
                ring.order(1).init(4);
            }
            for half in 0..2 {
                for buffer in 0..2 {
                    ring.c_loaded(half, buffer).init(1);
                }
            }
        }
        fence::mbarrier_init();
    }
    let defer_grid_wait = p.hook.flags & HOOK_DEFER_GRID_WAIT != 0;
    if unsafe { stage_prologue(p, ring, defer_grid_wait) } {
        unsafe { local_gemm::<T, C>(p, ring, tid) };
    }
    if defer_grid_wait && tid == 0 {
        gdc::wait_for_prerequisites();
    }
}

/// Defines a bf16 and an f16 entry point for each row of `gemm_abi::gemm_variants!`, and an
/// e4m3 one (bf16 output) where the row names it. Launch: block [`THREADS`], `smem_bytes()`
/// dynamic shared memory, a persistent grid of at most one block per SM (a multiple of
/// `cluster_m`, launched with that cluster size).
macro_rules! entries {
    ($($name:literal => $bf16:ident, $f16:ident, $tile:ident, $config:ty $(, e4m3 $e4m3:ident)?;)*) => {$(
        /// bf16 × bf16 → f32 accumulate → bf16.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bf16(p: GemmParams) {
            unsafe { gemm::<Bf16, $config>(&p) }
        }
        /// f16 × f16 → f32 accumulate → f16.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $f16(p: GemmParams) {
            unsafe { gemm::<F16, $config>(&p) }
        }
        $(
            /// e4m3 × e4m3 → f32 accumulate → bf16 (K, leading dimensions and TMA
            /// coordinates of A and B in 16-bit pairs of e4m3 elements).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $e4m3(p: GemmParams) {
                unsafe { gemm::<E4m3<Bf16>, $config>(&p) }
            }
        )?
    )*};
}

crate::gemm_abi::gemm_variants!(entries);
