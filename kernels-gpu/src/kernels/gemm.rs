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
//!   copied into shared memory with `cp.async` while its main loop runs ([`copy_row_scales`]).
//! - **the transposed product** (`*t` decode configurations, at most 16 rows:
//!   [`TileConfig::swap_ab`]): a consumer warpgroup multiplies its 64 rows of the stage's B
//!   tile, as the `wgmma`'s A operand, by the stage's 16 rows of A, as its B operand
//!   (`m64n16`), so its accumulator holds the share transposed and is stored element by
//!   element from registers ([`swapped_config!`]); `16x64t` gives the whole 64-wide tile to
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
//!   runs the epilogue ([`finish_split`], layout and hand-off in [`SplitParams`] and
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
use crate::device::flags::{self, WaitOutcome};
use crate::device::mbarrier::{MBarrier, PipelineState};
use crate::device::wgmma::{self, Bf16, E4m3, F16, InputType};
use crate::device::{cluster, cp_async, fence, gdc, grid, index, regs, smem, stmatrix, sync, tma};
use crate::gemm_abi::*;
use crate::layout::stream_k::{self, StreamK};
use crate::layout::{descriptor, fragment, raster, swizzle};
use seq_macro::seq;

/// Threads of one warpgroup.
const WARPGROUP_THREADS: u32 = 128;

/// A compiled tile configuration: its [`TileConfig`] and the code that depends on the shape of
/// a consumer warpgroup's share (accumulator size, wgmma shape, epilogue), generated with
/// literal register indices.
trait Config {
    const TILE: TileConfig;
    type Acc;
    fn new_acc() -> Self::Acc;
    fn fence(acc: &mut Self::Acc);
    /// One k16 step into every slab: `desc_a` addresses the warpgroup's first 64 A rows, each
    /// further slab's rows start [`SLAB_A_BYTES`] later; all slabs multiply the same B rows.
    unsafe fn mma<T: InputType>(acc: &mut Self::Acc, desc_a: u64, desc_b: u64, scale_d: u32);
    /// Stores the warpgroup's share from registers; `(row, col)` is its top-left element.
    unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &Self::Acc, row: u32, col: u32);
    /// Split-K: writes the accumulators to the warpgroup's partial-sum slot `slot` (layout:
    /// [`SplitParams`]), skipping rows at or past `m`; `row` is the share's top row.
    unsafe fn store_partial(acc: &Self::Acc, slot: *mut f32, row: u32, m: u32);
    /// Split-K: `acc = slot 0 + slot 1 + … + slot splits−1`, added in that order, the slots
    /// `stride` floats apart from `first`; rows at or past `m` keep what they held.
    unsafe fn sum_partials(
        acc: &mut Self::Acc,
        first: *const f32,
        stride: usize,
        splits: u32,
        row: u32,
        m: u32,
    );
    /// Stores the warpgroup's share through the staging buffers; `(row, col)` is its top-left
    /// element.
    unsafe fn epilogue_staged<T: InputType>(
        p: &GemmParams,
        acc: &Self::Acc,
        ring: Ring,
        half: u32,
        row: u32,
        col: u32,
        chunks_before: u32,
    );
}

// `seq!(G in 0..4)` and, for the transposed tiles, `seq!(G in 0..8)` in `sum_partials` spell
// the bounds of their group loops as literals.
const _: () = assert!(MAX_SUM_GROUP == 4 && SWAPPED_SUM_GROUP == 8);

/// Split-K: adds split `x` to the running sum `acc`, or starts it with split 0 (`first`).
#[inline(always)]
fn add_split(acc: &mut f32, x: f32, first: bool) {
    *acc = if first { x } else { *acc + x };
}

/// Bytes between the A rows of consecutive 64-row slabs in a stage's A tile (128-byte rows).
const SLAB_A_BYTES: u32 = SLAB_M * BLOCK_K * 2;

/// Implements [`Config`] as type `$name` for each tile configuration `$name: TILE` listed
/// (configurations of one tile shape share the counts below), whose consumer
/// warpgroup share is `slabs` slabs of 64 × `WN` outputs (`WN = TileConfig::wg_cols()`):
/// `regs = WN / 2` accumulators per slab and thread, `blocks = WN / 8` column blocks, and an
/// epilogue of `chunks = WN / W` staged chunks per slab of `W = TileConfig::epilogue_cols()`
/// columns, each written as `pairs = W / 16` `stmatrix.x4` (16 columns each) per warp (a tile
/// stored from registers, `!staged`, leaves those two unused); `mma` and
/// `fence` name the `wgmma` wrappers of width `WN`. The counts are literals because `seq!`
/// unrolls over them (every register index is then a constant); a compile-time assertion
/// checks each against the tile.
macro_rules! config {
    (
        $($name:ident: $tile:ident),+ {
            slabs: $slabs:literal,
            regs: $regs:literal,
            blocks: $blocks:literal,
            chunks: $chunks:literal,
            pairs: $pairs:literal,
            mma: $mma:ident,
            fence: $fence:ident $(,)?
        }
    ) => {$(
        struct $name;
        // The literal counts `seq!` needs, checked against the tile they are derived from.
        const _: () = {
            let t = $tile;
            assert!($slabs == t.slabs() && $regs == t.wg_cols() / 2 && $blocks == t.wg_cols() / 8);
            assert!(
                !t.staged
                    || ($chunks * t.epilogue_cols() == t.wg_cols() && $pairs * 16 == t.epilogue_cols())
            );
        };
        impl Config for $name {
            const TILE: TileConfig = $tile;
            type Acc = [[f32; $regs]; $slabs];
            #[inline(always)]
            fn new_acc() -> Self::Acc {
                [[0.0; $regs]; $slabs]
            }
            #[inline(always)]
            fn fence(acc: &mut Self::Acc) {
                seq!(S in 0..$slabs {
                    wgmma::$fence(&mut acc[S]);
                });
            }
            #[inline(always)]
            unsafe fn mma<T: InputType>(acc: &mut Self::Acc, desc_a: u64, desc_b: u64, scale_d: u32) {
                seq!(S in 0..$slabs {
                    unsafe {
                        T::$mma(
                            &mut acc[S],
                            descriptor::advance_atoms(desc_a, S * SLAB_A_BYTES),
                            desc_b,
                            scale_d,
                        )
                    };
                });
            }
            /// Register `4j + {0,1}` of a slab holds its row `r0`, columns
            /// `8j + 2(lane % 4) + {0,1}`; `4j + {2,3}` the same columns of row `r0 + 8`, where
            /// `r0 = 16·warp + lane / 4` (the wgmma accumulator layout).
            #[inline(always)]
            unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &Self::Acc, row: u32, col: u32) {
                let t = index::thread_in_warpgroup();
                let c0 = col + 2 * (t % 4);
                seq!(S in 0..$slabs {
                    let r0 = row + S * SLAB_M + 16 * (t / 32) + (t % 32) / 4;
                    seq!(J in 0..$blocks {
                        unsafe {
                            store_pair::<T>(p, r0, c0 + 8 * J, acc[S][4 * J], acc[S][4 * J + 1]);
                            store_pair::<T>(p, r0 + 8, c0 + 8 * J, acc[S][4 * J + 2], acc[S][4 * J + 3]);
                        }
                    });
                });
            }
            /// Register `r` of slab `S` is float `(S·regs + r)·128 + t` of the slot (thread
            /// `t` of the warpgroup); its row is `r0` or `r0 + 8` as in `epilogue`.
            #[inline(always)]
            unsafe fn store_partial(acc: &Self::Acc, slot: *mut f32, row: u32, m: u32) {
                let t = index::thread_in_warpgroup();
                seq!(S in 0..$slabs {
                    let r0 = row + S * SLAB_M + 16 * (t / 32) + (t % 32) / 4;
                    let rows = [r0 < m, r0 + 8 < m];
                    seq!(R in 0..$regs {
                        if rows[(R % 4) / 2] {
                            let at = ((S * $regs + R) * 128 + t) as usize;
                            unsafe { grid::store_f32(slot.add(at), acc[S][R]) };
                        }
                    });
                });
            }
            /// The loads of `TileConfig::sum_group` splits are issued together, then added in
            /// split order: the sum is the same, bit for bit, as one split at a time, but a
            /// group costs one L2 round trip instead of one per split.
            #[inline(always)]
            unsafe fn sum_partials(
                acc: &mut Self::Acc,
                first: *const f32,
                stride: usize,
                splits: u32,
                row: u32,
                m: u32,
            ) {
                const SUM_GROUP: u32 = $tile.sum_group();
                let t = index::thread_in_warpgroup();
                for j0 in (0..splits).step_by(SUM_GROUP as usize) {
                    seq!(G in 0..4 {
                        let mut v~G = [[0.0f32; $regs]; $slabs];
                        if G < SUM_GROUP && j0 + G < splits {
                            let slot = unsafe { first.add((j0 + G) as usize * stride) };
                            seq!(S in 0..$slabs {
                                let r0 = row + S * SLAB_M + 16 * (t / 32) + (t % 32) / 4;
                                let rows = [r0 < m, r0 + 8 < m];
                                seq!(R in 0..$regs {
                                    if rows[(R % 4) / 2] {
                                        let at = ((S * $regs + R) * 128 + t) as usize;
                                        let x = unsafe { grid::load_f32_cg(slot.add(at)) };
                                        // One split at a time (the wide tiles, whose registers
                                        // cannot hold a second split): add as it arrives.
                                        if SUM_GROUP == 1 {
                                            add_split(&mut acc[S][R], x, j0 == 0);
                                        } else {
                                            v~G[S][R] = x;
                                        }
                                    }
                                });
                            });
                        }
                    });
                    if SUM_GROUP > 1 {
                        seq!(G in 0..4 {
                            if G < SUM_GROUP && j0 + G < splits {
                                seq!(S in 0..$slabs {
                                    let r0 = row + S * SLAB_M + 16 * (t / 32) + (t % 32) / 4;
                                    let rows = [r0 < m, r0 + 8 < m];
                                    seq!(R in 0..$regs {
                                        if rows[(R % 4) / 2] {
                                            add_split(&mut acc[S][R], v~G[S][R], j0 + G == 0);
                                        }
                                    });
                                });
                            }
                        });
                    }
                }
            }
            /// Writes the consumer's share slab by slab as chunks of 64 rows × `W` columns
            /// (`W = TileConfig::epilogue_cols()`): `stmatrix` packs each chunk into a staging
            /// buffer with `2W`-byte swizzled rows (the layout the D tensor map's TMA store
            /// reads), then one thread stores it with TMA and goes on. Two buffers alternate, so
            /// filling one overlaps the store of the other, and the last stores overlap the next
            /// tile's main loop. `stmatrix.x4` lane `l` addresses row `l % 8` of matrix `l / 8`;
            /// matrices 0–3 are (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8) of a 16×16
            /// block, whose registers are accumulators `4j..4j+8` of column blocks `j, j + 1`.
            ///
            /// `chunks_before` counts the chunks this warpgroup staged for earlier tiles: chunk
            /// `g` overall uses buffer `g % 2` for the `g / 2`-th time (a tile may have an odd
            /// number of chunks). With `beta != 0` the chunk's C is already on its way into the
            /// buffer (a TMA load completing on the buffer's mbarrier, whose phase parity is that
            /// use count's): the leader issued it one chunk earlier, or for a tile's first chunk
            /// before the tile's main loop, so that it arrives while the tensor cores work
            /// ([`load_c_chunk`]). Each chunk but the tile's last therefore starts by issuing
            /// the next chunk's load into the other buffer, once the store that last read that
            /// buffer is done with it, and then waits for its own. Every lane reads its C
            /// fragment back with `ldmatrix`, and the sum `alpha·acc + beta·C` goes back with
            /// `stmatrix`. Each warp touches only its own 16 rows, so the read and the overwrite
            /// need no barrier between them.
            #[inline(always)]
            unsafe fn epilogue_staged<T: InputType>(
                p: &GemmParams,
                acc: &Self::Acc,
                ring: Ring,
                half: u32,
                row: u32,
                col: u32,
                chunks_before: u32,
            ) {
                const CHUNKS: u32 = $tile.chunks_per_tile();
                const ROW_BYTES: u32 = $tile.epilogue_row_bytes();
                let t = index::thread_in_warpgroup();
                let (warp, lane) = (t / 32, t % 32);
                let matrix = lane / 8;
                let srow = 16 * warp + lane % 8 + 8 * (matrix % 2);
                let leader = t == 0;
                let barrier = 1 + half;
                let a = p.alpha;
                let with_c = p.beta != 0.0;
                let row_wise = T::FP8 && p.row_scales.a != 0;
                // Row-wise FP8: the scales came into the warpgroup's scale area during the
                // main loop ([`copy_row_scales`]): `sb` of the share's columns, then `sa` of
                // its rows.
                let scales = ring.row_scales(half);
                if row_wise {
                    stage_row_scales_ready(barrier);
                }
                seq!(S in 0..$slabs {
                    // Row-wise FP8: the scales of this lane's two rows in the slab, r0 and
                    // r0 + 8 of the share (the accumulator layout), read once for all its
                    // chunks.
                    let r0 = S * SLAB_M + 16 * warp + lane / 4;
                    let sa = if row_wise {
                        let at = |r: u32| scales + 4 * ($tile.wg_cols() + r);
                        unsafe { [smem::load_f32(at(r0)), smem::load_f32(at(r0 + 8))] }
                    } else {
                        [1.0; 2]
                    };
                    seq!(CH in 0..$chunks {
                        // Chunk i of this share (slab S, column chunk CH), g of all.
                        let i = S * $chunks + CH;
                        let g = chunks_before + i;
                        let (dr, dc) = $tile.chunk_offset(i);
                        let (slab_row, chunk_col) = ((row + dr) as i32, (col + dc) as i32);
                        let buffer = ring.staging(half, g % 2);
                        let sb_chunk = if row_wise {
                            unsafe { chunk_scales_b::<$pairs>(scales, dc + 2 * (lane % 4)) }
                        } else {
                            [[1.0; 4]; $pairs]
                        };
                        if with_c {
                            if leader && i + 1 < CHUNKS {
                                // Chunk g + 1 goes into the other buffer, which the store of
                                // chunk g − 1 (the last one issued) reads: wait until it has.
                                tma::wait_group_read::<0>();
                                unsafe { load_c_chunk(p, ring, half, g + 1, row, col, i + 1) };
                            }
                            unsafe { ring.c_loaded(half, g % 2).wait_warp((g / 2) & 1) };
                        } else {
                            if leader {
                                // The store issued two chunks ago read this buffer: wait until
                                // it has.
                                tma::wait_group_read::<1>();
                            }
                            sync::named_sync(barrier, WARPGROUP_THREADS);
                        }
                        seq!(PR in 0..$pairs {
                            let scol = 8 * (2 * PR + matrix / 2);
                            let addr = buffer + swizzle::offset_16bit(ROW_BYTES, srow, scol);
                            // Column block of this pair's first 8 columns.
                            let j = CH * $pairs * 2 + 2 * PR;
                            let x = &acc[S];
                            let mut v = [
                                (a * x[4 * j], a * x[4 * j + 1]),
                                (a * x[4 * j + 2], a * x[4 * j + 3]),
                                (a * x[4 * j + 4], a * x[4 * j + 5]),
                                (a * x[4 * j + 6], a * x[4 * j + 7]),
                            ];
                            if row_wise {
                                // v[i] holds (row, col), (row, col + 1) of the accumulator
                                // layout: rows r0, r0 + 8 (`sa`), columns c0, c0 + 1 of
                                // block j and c0 + 8, c0 + 9 of block j + 1 (`sb`).
                                let sb = sb_chunk[PR];
                                seq!(R in 0..4 {
                                    let (ra, cb) = (R % 2, 2 * (R / 2));
                                    v[R].0 *= sa[ra] * sb[cb];
                                    v[R].1 *= sa[ra] * sb[cb + 1];
                                });
                            }
                            if with_c {
                                let c = unsafe { stmatrix::load_x4(addr) };
                                seq!(R in 0..4 {
                                    let (c0, c1) = T::unpack2(c[R]);
                                    v[R].0 += p.beta * c0;
                                    v[R].1 += p.beta * c1;
                                });
                            }
                            unsafe {
                                stmatrix::store_x4(
                                    addr,
                                    T::pack2(v[0].0, v[0].1),
                                    T::pack2(v[1].0, v[1].1),
                                    T::pack2(v[2].0, v[2].1),
                                    T::pack2(v[3].0, v[3].1),
                                )
                            };
                        });
                        // Generic-proxy writes, read next by the TMA (async proxy).
                        fence::proxy_async_shared();
                        sync::named_sync(barrier, WARPGROUP_THREADS);
                        if leader {
                            unsafe { tma::store_2d(p.map_d, chunk_col, slab_row, buffer) };
                            tma::commit_group();
                        }
                    });
                });
            }
        }
    )+};
}

config!(
    Tile128x256: TILE_128X256,
    Tile128x256C2: TILE_128X256_CLUSTER2,
    Tile128x256S: TILE_128X256_SPLITK {
        slabs: 1,
        regs: 128,
        blocks: 32,
        chunks: 4,
        pairs: 4,
        mma: mma_n256,
        fence: fence_operands_128,
    }
);
config!(
    Tile192x192: TILE_192X192,
    Tile192x192C2: TILE_192X192_CLUSTER2 {
        slabs: 3,
        regs: 48,
        blocks: 12,
        chunks: 3,
        pairs: 2,
        mma: mma_n96,
        fence: fence_operands_48,
    }
);
config!(
    Tile128x224: TILE_128X224,
    Tile128x224C2: TILE_128X224_CLUSTER2 {
        slabs: 1,
        regs: 112,
        blocks: 28,
        chunks: 7,
        pairs: 2,
        mma: mma_n224,
        fence: fence_operands_112,
    }
);
config!(
    Tile128x192: TILE_128X192,
    Tile128x192C2: TILE_128X192_CLUSTER2 {
        slabs: 1,
        regs: 96,
        blocks: 24,
        chunks: 3,
        pairs: 4,
        mma: mma_n192,
        fence: fence_operands_96,
    }
);
config!(
    Tile128x160: TILE_128X160,
    Tile128x160C2: TILE_128X160_CLUSTER2,
    Tile128x160S: TILE_128X160_SPLITK {
        slabs: 1,
        regs: 80,
        blocks: 20,
        chunks: 5,
        pairs: 2,
        mma: mma_n160,
        fence: fence_operands_80,
    }
);
// Stored from registers: `chunks` and `pairs` are unused.
config!(Tile128x144S: TILE_128X144_SPLITK {
    slabs: 1,
    regs: 72,
    blocks: 18,
    chunks: 1,
    pairs: 2,
    mma: mma_n144,
    fence: fence_operands_72,
});
config!(Tile128x96: TILE_128X96 {
    slabs: 1,
    regs: 48,
    blocks: 12,
    chunks: 3,
    pairs: 2,
    mma: mma_n96,
    fence: fence_operands_48,
});
// Stored from registers: `chunks` and `pairs` are unused.
config!(Tile128x80: TILE_128X80 {
    slabs: 1,
    regs: 40,
    blocks: 10,
    chunks: 1,
    pairs: 2,
    mma: mma_n80,
    fence: fence_operands_40,
});
config!(
    Tile128x128: TILE_128X128,
    Tile64x128W1: TILE_64X128_ONE_WARPGROUP,
    Tile128x128C2: TILE_128X128_CLUSTER2,
    Tile128x128S: TILE_128X128_SPLITK {
        slabs: 1,
        regs: 64,
        blocks: 16,
        chunks: 2,
        pairs: 4,
        mma: mma_n128,
        fence: fence_operands_64,
    }
);
config!(Tile128x128P: TILE_128X128_PINGPONG {
    slabs: 2,
    regs: 64,
    blocks: 16,
    chunks: 2,
    pairs: 4,
    mma: mma_n128,
    fence: fence_operands_64,
});
config!(
    Tile64x128: TILE_64X128,
    Tile64x128S: TILE_64X128_SPLITK,
    Tile64x64K2W1: TILE_64X64_DEEP_ONE_WARPGROUP,
    Tile16x128: TILE_16X128,
    Tile16x128S: TILE_16X128_SPLITK {
        slabs: 1,
        regs: 32,
        blocks: 8,
        chunks: 1,
        pairs: 4,
        mma: mma_n64,
        fence: fence_operands_32,
    }
);
config!(
    Tile16x64: TILE_16X64,
    Tile64x64: TILE_64X64,
    Tile64x64S: TILE_64X64_SPLITK,
    Tile64x64K2: TILE_64X64_DEEP,
    Tile64x32: TILE_64X32,
    Tile64x32K2: TILE_64X32_DEEP {
        slabs: 1,
        regs: 16,
        blocks: 4,
        chunks: 1,
        pairs: 2,
        mma: mma_n32,
        fence: fence_operands_16,
    }
);

// These three are stored from registers: `chunks` and `pairs` are unused.
config!(Tile64x96K2: TILE_64X96_DEEP {
    slabs: 1,
    regs: 24,
    blocks: 6,
    chunks: 1,
    pairs: 2,
    mma: mma_n48,
    fence: fence_operands_24,
});
config!(Tile64x208: TILE_64X208 {
    slabs: 1,
    regs: 52,
    blocks: 13,
    chunks: 1,
    pairs: 2,
    mma: mma_n104,
    fence: fence_operands_52,
});
config!(Tile64x240: TILE_64X240 {
    slabs: 1,
    regs: 60,
    blocks: 15,
    chunks: 1,
    pairs: 2,
    mma: mma_n120,
    fence: fence_operands_60,
});

/// Implements [`Config`] for each transposed-product configuration listed
/// ([`TileConfig::swap_ab`]): a consumer warpgroup's accumulator is one 64 × 16 `wgmma`
/// fragment of the share's product with its rows and columns traded — fragment row `i` is
/// the share's column (weight row) `i`, fragment column `j` its row (token) `j`
/// ([`fragment::accumulator_element`]); 8 registers a thread. Stored from registers one
/// element at a time (the decode output is a few rows; its bytes are nothing beside the
/// weights').
macro_rules! swapped_config {
    ($($name:ident: $tile:ident),+) => {$(
        struct $name;
        const _: () = {
            let t = $tile;
            assert!(t.swap_ab && t.a_rows == 16 && t.wg_cols() == SLAB_M && !t.staged);
        };
        impl Config for $name {
            const TILE: TileConfig = $tile;
            type Acc = [f32; 8];
            #[inline(always)]
            fn new_acc() -> Self::Acc {
                [0.0; 8]
            }
            #[inline(always)]
            fn fence(acc: &mut Self::Acc) {
                wgmma::fence_operands_8(acc);
            }
            /// The share's 64 B rows are the instruction's A operand (its M), the stage's 16
            /// A rows its B operand (its N): the descriptors trade places.
            #[inline(always)]
            unsafe fn mma<T: InputType>(acc: &mut Self::Acc, desc_a: u64, desc_b: u64, scale_d: u32) {
                unsafe { T::mma_n16(acc, desc_b, desc_a, scale_d) };
            }
            #[inline(always)]
            unsafe fn epilogue<T: InputType>(p: &GemmParams, acc: &Self::Acc, row: u32, col: u32) {
                let t = index::thread_in_warpgroup();
                seq!(R in 0..8 {
                    let (weight, token) = fragment::accumulator_element(t, R);
                    unsafe { store_one::<T>(p, row + token, col + weight, acc[R]) };
                });
            }
            /// Register `r` is float `r·128 + t` of the slot, as in the other configurations;
            /// registers of tokens at or past `m` are skipped.
            #[inline(always)]
            unsafe fn store_partial(acc: &Self::Acc, slot: *mut f32, row: u32, m: u32) {
                let t = index::thread_in_warpgroup();
                seq!(R in 0..8 {
                    if row + fragment::accumulator_element(t, R).1 < m {
                        unsafe { grid::store_f32(slot.add((R * 128 + t) as usize), acc[R]) };
                    }
                });
            }
            /// Eight splits' loads at a time ([`SWAPPED_SUM_GROUP`]: 64 registers beside the 8
            /// accumulators), added in split order.
            #[inline(always)]
            unsafe fn sum_partials(
                acc: &mut Self::Acc,
                first: *const f32,
                stride: usize,
                splits: u32,
                row: u32,
                m: u32,
            ) {
                let t = index::thread_in_warpgroup();
                let keep = |r: u32| row + fragment::accumulator_element(t, r).1 < m;
                for j0 in (0..splits).step_by(SWAPPED_SUM_GROUP as usize) {
                    let mut v = [[0.0f32; 8]; SWAPPED_SUM_GROUP as usize];
                    seq!(G in 0..8 {
                        if j0 + G < splits {
                            let slot = unsafe { first.add((j0 + G) as usize * stride) };
                            seq!(R in 0..8 {
                                if keep(R) {
                                    v[G][R] = unsafe { grid::load_f32_cg(slot.add((R * 128 + t) as usize)) };
                                }
                            });
                        }
                    });
                    seq!(G in 0..8 {
                        if j0 + G < splits {
                            seq!(R in 0..8 {
                                if keep(R) {
                                    add_split(&mut acc[R], v[G][R], j0 + G == 0);
                                }
                            });
                        }
                    });
                }
            }
            /// Never staged (checked above): the register epilogue.
            #[inline(always)]
            unsafe fn epilogue_staged<T: InputType>(
                p: &GemmParams,
                acc: &Self::Acc,
                _ring: Ring,
                _half: u32,
                row: u32,
                col: u32,
                _chunks_before: u32,
            ) {
                unsafe { Self::epilogue::<T>(p, acc, row, col) };
            }
        }
    )+};
}

swapped_config!(
    Tile16x128T: TILE_16X128_SWAPPED,
    Tile16x128TS: TILE_16X128_SWAPPED_SPLITK,
    Tile16x64T: TILE_16X64_SWAPPED,
    Tile16x64T2: TILE_16X64_SWAPPED_DEEP,
    Tile16x128T2: TILE_16X128_SWAPPED_DEEP,
    Tile16x64T4: TILE_16X64_SWAPPED_DEEP4
);

/// Shared-memory addresses of the ring.
#[derive(Clone, Copy)]
struct Ring {
    base: u32,
    tile: TileConfig,
}

impl Ring {
    #[inline(always)]
    fn a_tile(self, stage: u32) -> u32 {
        self.base + stage * self.tile.a_tile_bytes()
    }
    #[inline(always)]
    fn b_tile(self, stage: u32) -> u32 {
        self.base + self.tile.stages * self.tile.a_tile_bytes() + stage * self.tile.b_tile_bytes()
    }
    #[inline(always)]
    fn full(self, stage: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * stage)
    }
    #[inline(always)]
    fn empty(self, stage: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * (self.tile.stages + stage))
    }
    /// The mbarrier on which loads of C into staging buffer `buffer` of warpgroup `half` complete.
    #[inline(always)]
    fn c_loaded(self, half: u32, buffer: u32) -> MBarrier {
        MBarrier(
            self.base + self.tile.barrier_offset() + 8 * (2 * self.tile.stages + 2 * half + buffer),
        )
    }
    /// Staging buffer `buffer` (0 or 1) of consumer warpgroup `half`.
    #[inline(always)]
    fn staging(self, half: u32, buffer: u32) -> u32 {
        self.base + self.tile.staging_offset() + (2 * half + buffer) * CHUNK_BYTES
    }
    #[inline(always)]
    fn abort_flag(self) -> u32 {
        self.base + self.tile.abort_flag_offset()
    }
    /// Ping-pong: the barrier consumer warpgroup `half` waits on before each main loop but its
    /// first tile's (warpgroup 0's), completed once per main loop of the other warpgroup.
    #[inline(always)]
    fn order(self, half: u32) -> MBarrier {
        MBarrier(self.base + self.tile.barrier_offset() + 8 * (2 * self.tile.stages + 4 + half))
    }
    /// Row-wise FP8: consumer warpgroup `half`'s scale area, `sb` of its share's `wg_cols`
    /// columns, then `sa` of its `wg_rows` rows ([`TileConfig::row_scales_offset`]).
    #[inline(always)]
    fn row_scales(self, half: u32) -> u32 {
        self.base + self.tile.row_scales_offset() + half * self.tile.row_scale_bytes()
    }
    /// Split-K: the word (after the abort word) through which consumer warpgroup `half`'s
    /// leader tells the warpgroup whether it completes the tile.
    #[inline(always)]
    fn split_word(self, half: u32) -> u32 {
        self.abort_flag() + 4 + 4 * half
    }
}

/// This block's share of the output. Tiles are grouped in *cluster tiles* of `cluster_m`
/// vertically adjacent tiles; cluster `c` takes cluster tiles `c, c + clusters, …` in raster
/// order, and its block of rank `r` computes the `r`-th tile of each: a *unit* is a tile.
/// With split-K (always without clusters) the block takes its stream-K range of k-blocks
/// instead ([`StreamK`]; [`SplitParams`]): a unit is a piece of a tile, and `u` the position
/// of its first k-block.
#[derive(Clone, Copy)]
struct Tiles {
    num_m: u32,
    num_n: u32,
    /// The first unit: a cluster tile, or (split-K) a position.
    first: u32,
    /// Past the last unit.
    end: u32,
    /// Cluster tiles between a cluster's units (not used by split-K).
    step: u32,
    rank: u32,
    group_m: u32,
    k_blocks: u32,
    tile: TileConfig,
}

impl Tiles {
    #[inline(always)]
    fn new(p: &GemmParams, tile: TileConfig) -> Self {
        let num_m = p.m.div_ceil(tile.block_m).div_ceil(tile.cluster_m);
        let num_n = p.n.div_ceil(tile.block_n);
        let k_blocks = p.k.div_ceil(BLOCK_K);
        let (first, end, step, rank) = if tile.split_k {
            let stream = Self::stream_k(p, tile);
            let g = index::block_idx();
            (stream.start(g), stream.start(g + 1), 0, 0)
        } else if tile.cluster_m == 1 {
            (index::block_idx(), num_m * num_n, index::grid_dim(), 0)
        } else {
            (
                index::cluster_idx(),
                num_m * num_n,
                index::cluster_count(),
                index::cluster_ctarank(),
            )
        };
        Self {
            num_m,
            num_n,
            first,
            end,
            step,
            rank,
            group_m: p.raster_group_m.max(1),
            k_blocks,
            tile,
        }
    }
    /// Split-K: the grid's partition of the k-blocks, computed from the parameters where it
    /// is needed rather than kept in registers across the main loop.
    #[inline(always)]
    fn stream_k(p: &GemmParams, tile: TileConfig) -> StreamK {
        let tiles = p.m.div_ceil(tile.block_m) * p.n.div_ceil(tile.block_n);
        StreamK::new(tiles, p.k.div_ceil(BLOCK_K), index::grid_dim())
    }
    /// Unit `u`'s cluster tile and k-block range `kb0..kb1` of the tile's `⌈K/64⌉` (never
    /// empty); without split-K, all of tile `u`.
    #[inline(always)]
    fn unit(self, u: u32) -> (u32, u32, u32) {
        if self.tile.split_k {
            stream_k::piece_at(u, self.end, self.k_blocks)
        } else {
            (u, 0, self.k_blocks)
        }
    }
    /// The unit after unit `u`, whose k-blocks are `kb0..kb1`.
    #[inline(always)]
    fn next(self, u: u32, kb0: u32, kb1: u32) -> u32 {
        if self.tile.split_k {
            u + (kb1 - kb0)
        } else {
            u + self.step
        }
    }
    /// Top-left element `(row, col)` of this block's tile in cluster tile `t`.
    #[inline(always)]
    fn origin(self, t: u32) -> (u32, u32) {
        let (mt, nt) = raster::tile_coord(t, self.num_m, self.num_n, self.group_m);
        (
            (mt * self.tile.cluster_m + self.rank) * self.tile.block_m,
            nt * self.tile.block_n,
        )
    }
}

/// Runs the prologue hook on thread 0 and tells every thread whether to go on; in a cluster,
/// both blocks go on only if neither timed out. Must be reached by all threads of the cluster
/// (it contains a CTA or cluster barrier, which also publishes the mbarrier initialisation).
#[inline(always)]
unsafe fn prologue_hook(hook: &StageHook, ring: Ring) -> bool {
    if index::thread_idx() == 0 {
        let mut abort = 0;
        if hook.signal_flag != 0 && index::block_idx() == 0 {
            fence::acq_rel_sys();
            unsafe { flags::store_release_sys(hook.signal_flag as *mut u32, hook.signal_value) };
        }
        if hook.wait_flag != 0 && hook.flags & HOOK_WAIT_BEFORE_C == 0 {
            if unsafe { wait_for_hook_flag(hook) } {
                abort = 1;
            }
            // TMA reads what the flag guards through the async proxy (A and B: this thread;
            // C: the consumer leaders, which fence for themselves in `consume`).
            fence::proxy_async_global();
        }
        unsafe { smem::store_u32(ring.abort_flag(), abort) };
    }
    if ring.tile.cluster_m == 1 {
        sync::sync_threads();
        unsafe { smem::load_u32(ring.abort_flag()) == 0 }
    } else {
        cluster::cluster_sync();
        let mut abort = 0;
        for rank in 0..ring.tile.cluster_m {
            abort |= unsafe {
                cluster::load_shared_cluster_u32(cluster::map_shared_rank(ring.abort_flag(), rank))
            };
        }
        abort == 0
    }
}

/// Generic addresses of the tensor maps in this entry's parameter block ([`OperandMaps`], at
/// its start).
#[derive(Clone, Copy)]
struct MapAddresses {
    a: u64,
    b: u64,
    /// The last m-tile's A map.
    a_tail: u64,
    /// The last n-tile's B map.
    b_tail: u64,
}

#[inline(always)]
fn operand_maps() -> MapAddresses {
    let base = tma::entry_params_address() + core::mem::offset_of!(GemmParams, maps) as u64;
    MapAddresses {
        a: base + core::mem::offset_of!(OperandMaps, a) as u64,
        b: base + core::mem::offset_of!(OperandMaps, b) as u64,
        a_tail: base + core::mem::offset_of!(OperandMaps, a_tail) as u64,
        b_tail: base + core::mem::offset_of!(OperandMaps, b_tail) as u64,
    }
}

/// Producer: one thread streams (A, B) k-blocks of every tile of this block into the ring;
/// each k-block's A box is the whole slot (`a_rows` rows, `maps.a`), but in the last m-tile
/// where M ends inside it, `a_tail_box_rows` rows (`maps.a_tail`: TMA would otherwise
/// zero-fill the rows past M, which costs time; [`TileConfig::a_tail_box_rows`]); likewise
/// B's box is the block's share of the tile (`maps.b`), but in the last n-tile where N ends
/// inside it `b_tail_box_rows` rows (`maps.b_tail`; [`TileConfig::b_tail_box_rows`]).
///
/// # Safety
/// One thread of the producer warpgroup, after the ring's barriers are initialised and the
/// tensor maps acquired; `p.m` and `p.n` must be the A and B maps' row counts and
/// `p.a_tail_box_rows`, `p.b_tail_box_rows` the tail maps' box heights, or the `full`
/// barriers' byte counts never complete.
#[inline(always)]
unsafe fn produce(p: &GemmParams, ring: Ring, tiles: Tiles) {
    let tile = ring.tile;
    let maps = operand_maps();
    let (m, n) = (p.m, p.n);
    let b_share_rows = tile.block_n / tile.cluster_m;
    let b_share_bytes = tile.b_tile_bytes() / tile.cluster_m;
    let mut slot = PipelineState::new(tile.stages);
    let mut u = tiles.first;
    while u < tiles.end {
        let (t, kb0, kb1) = tiles.unit(u);
        let (row, col) = tiles.origin(t);
        // Only the last m-tile can end past M (the tiles' count is M over `block_m`, rounded
        // up; a cluster's second block may even start past it).
        let (map_a, a_box_rows) = if row + tile.block_m > m {
            (maps.a_tail, p.a_tail_box_rows)
        } else {
            (maps.a, tile.a_rows)
        };
        // Only the last n-tile can end past N (in clusters its box is the share's, as
        // every other tile's).
        let (map_b, b_box_rows) = if col + tile.block_n > n {
            (maps.b_tail, p.b_tail_box_rows)
        } else {
            (maps.b, b_share_rows)
        };
        let stage_bytes = tile.loaded_stage_bytes(a_box_rows, b_box_rows);
        // Stage `st` holds k-blocks `st·kps ..` (`kps` = k-blocks per stage; with 2, `kb0` is
        // 0: never split-K).
        let kps = tile.k_blocks_per_stage;
        for st in kb0 / kps..kb1.div_ceil(kps) {
            let k = (st * kps * BLOCK_K) as i32;
            unsafe {
                ring.empty(slot.stage).wait(slot.phase ^ 1);
                let full = ring.full(slot.stage);
                full.arrive_expect_tx(stage_bytes);
                // The stage's further k-blocks, if any (never split-K: a unit is a whole
                // tile): past the last k-block TMA fills their tiles with zeros, which add
                // nothing.
                for j in 1..tile.k_blocks_per_stage {
                    let kj = k + (j * BLOCK_K) as i32;
                    let a = ring.a_tile(slot.stage) + j * tile.a_block_bytes();
                    let b = ring.b_tile(slot.stage) + j * tile.b_block_bytes();
                    tma::load_2d(a, map_a, kj, row as i32, full.0);
                    tma::load_2d(b, map_b, kj, col as i32, full.0);
                }
                tma::load_2d(ring.a_tile(slot.stage), map_a, k, row as i32, full.0);
                if tile.cluster_m == 1 {
                    tma::load_2d(ring.b_tile(slot.stage), map_b, k, col as i32, full.0);
                } else {
                    let share = tiles.rank;
                    let dst = ring.b_tile(slot.stage) + share * b_share_bytes;
                    let b_row = (col + share * b_share_rows) as i32;
                    tma::load_2d_multicast(
                        dst,
                        map_b,
                        k,
                        b_row,
                        full.0,
                        (1u16 << tile.cluster_m) - 1,
                    );
                }
            }
            slot.advance();
        }
        u = tiles.next(u, kb0, kb1);
    }
    gdc::launch_dependents();
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
unsafe fn load_c_chunk(p: &GemmParams, ring: Ring, half: u32, g: u32, row: u32, col: u32, i: u32) {
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

/// Consumer warpgroup `half` (0 or 1): main loop and epilogue for every tile (with split-K:
/// unit) of this block.
#[inline(always)]
unsafe fn consume<T: InputType, C: Config>(p: &GemmParams, ring: Ring, tiles: Tiles, half: u32) {
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
            seq!(K in 0..4 {
                unsafe {
                    C::mma::<T>(
                        &mut acc,
                        descriptor::offset_in_atom(a, K * descriptor::K16_STEP_BYTES),
                        descriptor::offset_in_atom(b, K * descriptor::K16_STEP_BYTES),
                        if K == 0 { (st > st0) as u32 } else { 1 },
                    )
                };
            });
            // The stage's further k-blocks (zeros past K): each its own A and B tiles, whole
            // swizzle atoms on (`J < kps` is a constant: the untaken ones compile away).
            seq!(J in 1..4 {
                if J < kps {
                    let a = descriptor::advance_atoms(a, J * C::TILE.a_block_bytes());
                    let b = descriptor::advance_atoms(b, J * C::TILE.b_block_bytes());
                    seq!(K in 0..4 {
                        unsafe {
                            C::mma::<T>(
                                &mut acc,
                                descriptor::offset_in_atom(a, K * descriptor::K16_STEP_BYTES),
                                descriptor::offset_in_atom(b, K * descriptor::K16_STEP_BYTES),
                                1,
                            )
                        };
                    });
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

/// One thread waits (system-scope acquire, bounded by `hook.timeout_ns`) until the hook's
/// `wait_flag` reaches `wait_value`; on a timeout it records `hook.error_code` in the
/// device's and every peer's error word and returns true.
///
/// # Safety
/// `hook.wait_flag`, `hook.error_word` and `hook.peer_errors` must be the valid global
/// addresses the lowering fills (this GPU's or a peer's).
#[inline(always)]
unsafe fn wait_for_hook_flag(hook: &StageHook) -> bool {
    let outcome = unsafe {
        flags::wait_at_least(
            hook.wait_flag as *const u32,
            hook.wait_value,
            hook.timeout_ns,
        )
    };
    let timed_out = outcome == WaitOutcome::TimedOut;
    if timed_out {
        unsafe { flags::record_error(hook.error_word, &hook.peer_errors, hook.error_code) };
    }
    timed_out
}

/// Split-K, after a piece of tile `t` (every thread of consumer warpgroup `half`, whose share
/// starts at row `row`): if other blocks compute pieces of the tile too, writes the
/// warpgroup's partial sum to the piece's slot, counts the warpgroup in on the tile's counter
/// and, if it is the tile's last piece, adds every piece's partial into `acc` in k order and
/// resets the counter (the hand-off: [`grid`]). Returns whether this warpgroup completes the
/// tile (and runs its epilogue): always where this block computes the whole tile.
///
/// # Safety
/// `p.split` must hold the workspace the host sized for this grid (`tiles + grid` slots of
/// `block_m · block_n` f32 and `2 · tiles` zeroed counters, [`SplitParams`]); every thread of
/// the warpgroup must call it (it contains warpgroup barriers).
#[inline(always)]
unsafe fn finish_split<C: Config>(
    p: &GemmParams,
    ring: Ring,
    acc: &mut C::Acc,
    t: u32,
    half: u32,
    row: u32,
) -> bool {
    let (g0, pieces) = Tiles::stream_k(p, C::TILE).pieces(t);
    if pieces == 1 {
        return true;
    }
    // Floats of one warpgroup's part of a slot: half a tile.
    let per_half = (C::TILE.block_m * C::TILE.block_n / 2) as usize;
    let partials = p.split.partials as *mut f32;
    let slot_of = |slot: u32| (2 * slot as usize + half as usize) * per_half;
    unsafe { C::store_partial(acc, partials.add(slot_of(t + index::block_idx())), row, p.m) };
    let barrier = 1 + half;
    sync::named_sync(barrier, WARPGROUP_THREADS);
    if index::thread_in_warpgroup() == 0 {
        let counter = unsafe { (p.split.counters as *mut u32).add(2 * t as usize + half as usize) };
        // Release: every partial store of the warpgroup (ordered before this thread by the
        // barrier) before the count.
        fence::acq_rel_gpu();
        let last = unsafe { grid::fetch_add_relaxed_gpu(counter, 1) } + 1 == pieces;
        if last {
            // Acquire: the other pieces' partials, released with their counts.
            fence::acq_rel_gpu();
            unsafe { grid::store_relaxed_gpu(counter, 0) };
        }
        unsafe { smem::store_u32(ring.split_word(half), last as u32) };
    }
    sync::named_sync(barrier, WARPGROUP_THREADS);
    let last = unsafe { smem::load_u32(ring.split_word(half)) } != 0;
    if last {
        let first = unsafe { partials.add(slot_of(t + g0)) };
        unsafe { C::sum_partials(acc, first, 2 * per_half, pieces, row, p.m) };
    }
    last
}

/// Row-wise FP8, staged epilogue: starts copying the scales of consumer warpgroup `half`'s
/// share of a tile, whose top-left element is `(row, col)`, into its scale area
/// ([`Ring::row_scales`]) with `cp.async`, so that they arrive while the main loop runs and the
/// epilogue reads them from shared memory ([`stage_row_scales_ready`]). Thread `t` of the
/// warpgroup copies `sb[col + t + 128·j]` and `sa[row + t]` (indices clamped to N − 1 and
/// M − 1: the rows and columns past them are computed but never stored). Its copies for an
/// earlier unit must be complete first: a split-K unit that ran no epilogue never waited.
///
/// # Safety
/// As [`row_scale`]; every thread of the warpgroup calls it, after the warpgroup's last
/// epilogue read of the area (its chunks' barriers order those reads before this).
#[inline(always)]
unsafe fn copy_row_scales<C: Config>(p: &GemmParams, ring: Ring, half: u32, row: u32, col: u32) {
    let t = index::thread_in_warpgroup();
    let area = ring.row_scales(half);
    let (cols, rows) = (C::TILE.wg_cols(), C::TILE.wg_rows());
    cp_async::wait_all();
    let sb = p.row_scales.b as *const f32;
    let sa = p.row_scales.a as *const f32;
    let mut c = t;
    while c < cols {
        let src = unsafe { sb.add((col + c).min(p.n - 1) as usize) };
        unsafe { cp_async::copy_4(area + 4 * c, src) };
        c += WARPGROUP_THREADS;
    }
    if t < rows {
        let src = unsafe { sa.add((row + t).min(p.m - 1) as usize) };
        unsafe { cp_async::copy_4(area + 4 * (cols + t), src) };
    }
    cp_async::commit_group();
}

/// Row-wise FP8, staged epilogue: waits for this thread's [`copy_row_scales`] and, with the
/// warpgroup barrier `barrier`, for every other thread's, so the whole scale area is visible.
#[inline(always)]
fn stage_row_scales_ready(barrier: u32) {
    cp_async::wait_all();
    sync::named_sync(barrier, WARPGROUP_THREADS);
}

/// Row-wise FP8, staged epilogue: the B scales a lane applies in one chunk, `PAIRS` groups of
/// columns `c + 16·pr + {0, 1, 8, 9}` of the warpgroup's share (`c`: the lane's first column
/// in the chunk, even; group `pr` covers column blocks `2·pr` and `2·pr + 1` of the chunk, 8
/// columns each, of which the lane holds two adjacent columns per block), read from the
/// scale area `area` as pairs.
///
/// # Safety
/// `area` must be the warpgroup's scale area after [`stage_row_scales_ready`].
#[inline(always)]
unsafe fn chunk_scales_b<const PAIRS: usize>(area: u32, c: u32) -> [[f32; 4]; PAIRS] {
    let mut scales = [[1.0; 4]; PAIRS];
    for (pr, group) in scales.iter_mut().enumerate() {
        let c0 = area + 4 * (c + 16 * pr as u32);
        let [x0, x1] = unsafe { smem::load_f32x2(c0) };
        let [x8, x9] = unsafe { smem::load_f32x2(c0 + 32) };
        *group = [x0, x1, x8, x9];
    }
    scales
}

/// Row-wise FP8 scales ([`RowScales`]): `sa[row] · sb[col]`, the row and column clamped to
/// M − 1 and N − 1 (elements past them are computed but never stored).
///
/// # Safety
/// `p.row_scales` must hold the addresses of M and N f32 in this GPU's memory.
#[inline(always)]
unsafe fn row_scale(p: &GemmParams, row: u32, col: u32) -> f32 {
    unsafe { scale_a(p, row) * scale_b(p, col) }
}

/// Row-wise FP8: `sa[row]`, the row clamped to M − 1 ([`row_scale`]'s first factor).
///
/// # Safety
/// As [`row_scale`].
#[inline(always)]
unsafe fn scale_a(p: &GemmParams, row: u32) -> f32 {
    unsafe { *(p.row_scales.a as *const f32).add(row.min(p.m - 1) as usize) }
}

/// Row-wise FP8: `sb[col]`, the column clamped to N − 1 ([`row_scale`]'s second factor).
///
/// # Safety
/// As [`row_scale`].
#[inline(always)]
unsafe fn scale_b(p: &GemmParams, col: u32) -> f32 {
    unsafe { *(p.row_scales.b as *const f32).add(col.min(p.n - 1) as usize) }
}

/// Stores one pair of horizontally adjacent outputs `(row, col)`, `(row, col + 1)`.
///
/// # Safety
/// `p.d` (and, with `beta != 0`, `p.c`) must address M rows of `ldd` (`ldc`) 16-bit elements
/// in global memory this thread may write (read); with row-wise FP8 scales, as [`row_scale`].
#[inline(always)]
unsafe fn store_pair<T: InputType>(p: &GemmParams, row: u32, col: u32, x0: f32, x1: f32) {
    if col + 1 >= p.n {
        // The last column of an odd N (or none at all).
        return unsafe { store_one::<T>(p, row, col, x0) };
    }
    if row >= p.m {
        return;
    }
    let mut v0 = p.alpha * x0;
    let mut v1 = p.alpha * x1;
    if T::FP8 && p.row_scales.a != 0 {
        v0 *= unsafe { row_scale(p, row, col) };
        v1 *= unsafe { row_scale(p, row, col + 1) };
    }
    let at_d = (row as usize) * (p.ldd as usize) + col as usize;
    if p.beta != 0.0 {
        let at_c = (row as usize) * (p.ldc as usize) + col as usize;
        let (c0, c1) = T::unpack2(unsafe { *((p.c as *const u16).add(at_c) as *const u32) });
        v0 += p.beta * c0;
        v1 += p.beta * c1;
    }
    unsafe { *((p.d as *mut u16).add(at_d) as *mut u32) = T::pack2(v0, v1) };
}

/// Stores one output `(row, col)`: `alpha·x` (row-wise FP8: times the row's and column's
/// scales) plus `beta·C`; nothing outside the M × N output.
///
/// # Safety
/// `p.d` (and, with `beta != 0`, `p.c`) must address M rows of `ldd` (`ldc`) 16-bit elements
/// in global memory this thread may write (read); with row-wise FP8 scales, as [`row_scale`].
#[inline(always)]
unsafe fn store_one<T: InputType>(p: &GemmParams, row: u32, col: u32, x: f32) {
    if row >= p.m || col >= p.n {
        return;
    }
    let mut v = p.alpha * x;
    if T::FP8 && p.row_scales.a != 0 {
        v *= unsafe { row_scale(p, row, col) };
    }
    if p.beta != 0.0 {
        let at_c = (row as usize) * (p.ldc as usize) + col as usize;
        v += p.beta * T::unpack2(unsafe { *(p.c as *const u16).add(at_c) } as u32).0;
    }
    let at_d = (row as usize) * (p.ldd as usize) + col as usize;
    unsafe { *(p.d as *mut u16).add(at_d) = T::pack2(v, 0.0) as u16 };
}

/// The stage's entry into the distributed run, before it touches global memory: unless the
/// host deferred it (`defer_grid_wait`, [`HOOK_DEFER_GRID_WAIT`]), wait for the previous grid
/// in the stream (PDL: everything it wrote is visible after `griddepcontrol.wait`), then run
/// the prologue hook (signal and wait on cross-GPU flags). Returns whether the block goes on;
/// every thread of the cluster must call it.
#[inline(always)]
unsafe fn stage_prologue(p: &GemmParams, ring: Ring, defer_grid_wait: bool) -> bool {
    if !defer_grid_wait {
        gdc::wait_for_prerequisites();
    }
    unsafe { prologue_hook(&p.hook, ring) }
}

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
