//! [`Config`] for the configurations whose consumer warpgroup's share is one or three slabs
//! of 64 rows (`m64nNk16`, the operands as they are): accumulators, `wgmma` issue, the
//! register and staged epilogues, and split-K's partial sums, spelled out per configuration
//! by `config!`.
use super::WARPGROUP_THREADS;
use super::config::{Config, SLAB_A_BYTES, add_split};
use super::consume::load_c_chunk;
use super::ring::Ring;
use super::row_scales::{chunk_scales_b, stage_row_scales_ready};
use super::store::store_pair;
use crate::device::wgmma::{self, InputType};
use crate::device::{fence, grid, index, smem, stmatrix, sync, tma};
use crate::gemm_abi::*;
use crate::layout::{descriptor, swizzle};
use seq_macro::seq;

/// The output row `r0` of thread `t`'s registers `4j + {0, 1}` in slab `s` of a warpgroup's
/// share whose top row is `row` (the `wgmma` accumulator layout: `r0 = row + 64·s + 16·warp +
/// lane / 4`; registers `4j + {2, 3}` hold row `r0 + 8`).
#[inline(always)]
fn slab_row(row: u32, s: u32, t: u32) -> u32 {
    row + s * SLAB_M + 16 * (t / 32) + (t % 32) / 4
}

/// Whether thread `t`'s two rows in slab `s` ([`slab_row`]) are rows of the output (below `m`).
#[inline(always)]
fn slab_rows(row: u32, s: u32, t: u32, m: u32) -> [bool; 2] {
    let r0 = slab_row(row, s, t);
    [r0 < m, r0 + 8 < m]
}

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
        pub(super) struct $name;
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
                    let r0 = slab_row(row, S, t);
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
                    let rows = slab_rows(row, S, t, m);
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
                                let rows = slab_rows(row, S, t, m);
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
                                    let rows = slab_rows(row, S, t, m);
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
