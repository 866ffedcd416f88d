//! The contract between the host and the GEMM stage kernel: tile configuration, shared-memory
//! budget and the by-value kernel parameter block. Compiled for both sides so they cannot drift.
//!
//! Problem: `D (M×N) = alpha · A · Bᵀ + beta · C`, with A M×K and B N×K both K-contiguous
//! ("TN"), C and D M×N row-major with leading dimensions `ldc`/`ldd` (elements). A and B are
//! read through TMA tensor maps the host builds over the operand views (any base pointer and
//! leading dimension, so a stage can read a sub-block of a shard or a workspace slot in place).

/// K elements per pipeline stage: one 128-byte swizzle row of 2-byte elements.
pub const BLOCK_K: u32 = 64;
/// Rows of one `wgmma` (`m64nNk16`): a consumer warpgroup's accumulator is one or more
/// 64-row *slabs*.
pub const SLAB_M: u32 = 64;
/// Threads per block: one producer warpgroup + two consumer warpgroups.
pub const THREADS: u32 = 384;
/// Opt-in dynamic shared memory per block on H100/H200 (227 KiB).
pub const MAX_SMEM_BYTES: u32 = 232_448;
/// Rows of the output chunk the epilogue stages in shared memory and writes with one TMA store:
/// one 64-row accumulator slab, by [`TileConfig::epilogue_cols`] columns.
pub const EPILOGUE_CHUNK: u32 = SLAB_M;
/// Bytes of one staging buffer: room for the widest chunk, 64 × 64 two-byte elements.
pub const CHUNK_BYTES: u32 = EPILOGUE_CHUNK * EPILOGUE_CHUNK * 2;
/// Staging buffers: two per consumer warpgroup, so one can be filled while the TMA store of
/// the other is still reading it.
pub const STAGING_BYTES: u32 = 2 * 2 * CHUNK_BYTES;

/// How the two consumer warpgroups share a block's output tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerSplit {
    /// Warpgroup `h` owns rows `64h..64h+63`, every column: one 64-row slab each
    /// (`block_m == 128`).
    Rows,
    /// Warpgroup `h` owns columns `h·block_n/2..(h+1)·block_n/2` of every row: `block_m / 64`
    /// slabs each, one `wgmma` per slab and k16 step, all reading the same B rows.
    Columns,
    /// *Ping-pong*: each warpgroup owns whole tiles, alternately (warpgroup `h` the block's
    /// tiles `h, h + 2, …`), as `block_m / 64` slabs; their main loops take turns (an order
    /// barrier each), so one warpgroup's epilogue runs while the other's `wgmma`s keep the
    /// tensor cores busy. A ring slot serves one warpgroup (four warps release it).
    Tiles,
    /// One consumer warpgroup owns the whole tile (`block_m / 64` slabs of `block_n`
    /// columns); the other has nothing to do. For tiles whose tensor work is too small to
    /// share — the transposed-product decode tile 64 weight rows wide
    /// ([`TileConfig::swap_ab`], one `m64n16` per k16 step) and the 64×32 tile (one `m64n32`)
    /// — and for the one-warpgroup forms of the 64×64 and 64×128 tiles (one `m64n64` or
    /// `m64n128`), which read a stage's A rows from shared memory once instead of twice. Four
    /// warps release each slot.
    Single,
}

/// A tile configuration of the GEMM kernel. Each one is compiled into its own pair of entry
/// points (bf16, f16); the host picks one per problem (`distgemm::gemm::choose_variant`).
///
/// Shared memory: the `stages` A tiles (`a_rows × 64`), then the `stages` B tiles
/// (`block_n × 64`), each 1024-byte aligned (128-byte swizzle), then, where the configuration
/// stages its epilogue, the staging buffers (two output chunks per consumer warpgroup, see
/// [`TileConfig::epilogue_cols`]), then the mbarriers
/// (`full[stages]`, `empty[stages]`, one per staging buffer) and a 16-byte word for the prologue
/// hook's abort decision.
///
/// A consumer warpgroup's share of the tile (see [`ConsumerSplit`]) is `slabs()` accumulators
/// of 64 × `wg_cols()`, each fed by one `wgmma m64nNk16` (N = `wg_cols()`) per k16 step.
///
/// With `cluster_m == 2`, blocks are launched in clusters of two along M: both compute the
/// same n-tile for two consecutive m-tiles, so they share the B tile. Each block loads half of
/// B's rows and multicasts it into both blocks' shared memory, halving B's L2→SM traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileConfig {
    /// Output tile rows per block.
    pub block_m: u32,
    /// Output tile columns per block.
    pub block_n: u32,
    /// How the consumer warpgroups divide the tile.
    pub split: ConsumerSplit,
    /// Pipeline depth.
    pub stages: u32,
    /// Blocks per cluster along M (1 or 2).
    pub cluster_m: u32,
    /// Split-K: the grid shares the tiles' k-blocks out evenly (stream-K, [`SplitParams`]),
    /// so a tile's k-blocks may be divided among several blocks: for problems whose tiles
    /// leave SMs idle (decode; a last wave of few tiles). A separate compiled configuration,
    /// so the other configurations' code is untouched by it. Never with clusters.
    pub split_k: bool,
    /// Rows of A each stage loads: `block_m`, or fewer for a *short* tile (decode, at most
    /// `a_rows` rows in the whole problem), whose stage is mostly B. Its `wgmma`s still
    /// compute 64 rows: rows `a_rows..64` of a slab read the bytes after the A slot (the
    /// next slots' rows, or B) and are never stored, since they are rows past M.
    pub a_rows: u32,
    /// Whether the epilogue may stage output chunks in shared memory for TMA stores
    /// ([`STAGING_BYTES`] reserved). Without, every tile is stored from registers and the
    /// bytes go to the ring.
    pub staged: bool,
    /// The *transposed product* of a short tile (decode): each consumer warpgroup computes
    /// `(B·Aᵀ)ᵀ` for its share, its 64 rows of the stage's B tile as the `wgmma`'s A operand
    /// (M = 64 weight rows) and the stage's `a_rows` rows of A as its B operand (N = `a_rows`
    /// tokens). Both tiles are K-major with the 128-byte swizzle either way, so only the two
    /// descriptors trade places; the accumulator is `64 × a_rows` (transposed against D) and
    /// is stored from registers. A k16 step then costs the tensor cores `a_rows` columns
    /// instead of the share's width: the short tile's `wgmma`s no longer compute 64 rows of A
    /// of which at most `a_rows` exist. Only with [`ConsumerSplit::Columns`], one slab,
    /// unstaged.
    pub swap_ab: bool,
    /// 64-wide k-blocks per ring stage (1, 2 or 4): with more than one, a stage holds its
    /// k-blocks' A and B tiles side by side (each its own 1024-byte aligned swizzled tile,
    /// loaded by its own TMA boxes) behind one `full` and one `empty` barrier, so the
    /// per-stage hand-off (barrier round trips, `wgmma` commit and wait) is paid once per
    /// stage. A unit's last stage's k-blocks past K are zero-filled by TMA and add nothing.
    /// For the narrow decode tiles, whose k-block is mostly that hand-off; never with split-K
    /// (a piece may start inside a stage) or clusters.
    pub k_blocks_per_stage: u32,
}

impl TileConfig {
    /// Rows of the tile one consumer warpgroup computes.
    pub const fn wg_rows(&self) -> u32 {
        match self.split {
            ConsumerSplit::Rows => self.block_m / 2,
            ConsumerSplit::Columns | ConsumerSplit::Tiles | ConsumerSplit::Single => self.block_m,
        }
    }
    /// Columns of the tile one consumer warpgroup computes: the N of its `wgmma`s.
    pub const fn wg_cols(&self) -> u32 {
        match self.split {
            ConsumerSplit::Rows | ConsumerSplit::Tiles | ConsumerSplit::Single => self.block_n,
            ConsumerSplit::Columns => self.block_n / 2,
        }
    }
    /// Split-K: how many splits' partial sums the finishing warpgroup loads at once (1 ..=
    /// [`MAX_SUM_GROUP`]; [`SWAPPED_SUM_GROUP`] for the transposed decode tiles) before adding
    /// them in split order. Each split is
    /// `block_m · block_n / 256` floats per consumer thread (its accumulators); a group keeps
    /// `sum_group` of those in flight beside the accumulators, within 160 of the consumers'
    /// 232 registers (more spilled: `128x128s` with 2 groups of 64). One L2 round trip per
    /// group, so the sum of `s` splits costs `⌈s / sum_group⌉` round trips.
    pub const fn sum_group(&self) -> u32 {
        if self.swap_ab {
            return SWAPPED_SUM_GROUP;
        }
        let per_split = self.block_m * self.block_n / 256;
        let g = 160 / per_split;
        if g <= 1 {
            1
        } else if g - 1 > MAX_SUM_GROUP {
            MAX_SUM_GROUP
        } else {
            g - 1
        }
    }
    /// 64-row accumulator slabs per consumer warpgroup.
    pub const fn slabs(&self) -> u32 {
        self.wg_rows() / SLAB_M
    }
    /// Top-left element of consumer warpgroup `half`'s share, relative to the tile's.
    pub const fn wg_origin(&self, half: u32) -> (u32, u32) {
        match self.split {
            ConsumerSplit::Rows => (half * self.wg_rows(), 0),
            ConsumerSplit::Columns => (0, half * self.wg_cols()),
            ConsumerSplit::Tiles | ConsumerSplit::Single => (0, 0),
        }
    }
    /// Bytes of one k-block's A tile (`a_rows` × 64).
    pub const fn a_block_bytes(&self) -> u32 {
        self.a_rows * BLOCK_K * 2
    }
    /// Bytes of one k-block's B tile (`block_n` × 64).
    pub const fn b_block_bytes(&self) -> u32 {
        self.block_n * BLOCK_K * 2
    }
    /// Bytes of one stage's A tiles (`k_blocks_per_stage` k-blocks).
    pub const fn a_tile_bytes(&self) -> u32 {
        self.a_block_bytes() * self.k_blocks_per_stage
    }
    /// Bytes of one stage's B tiles (`k_blocks_per_stage` k-blocks).
    pub const fn b_tile_bytes(&self) -> u32 {
        self.b_block_bytes() * self.k_blocks_per_stage
    }
    /// Bytes of one ring slot: its A tiles (`a_rows` each) and B tiles. (TMA fills the B tiles
    /// and the A tiles, but in a partial last m-tile only the first
    /// [`GemmParams::a_tail_box_rows`] rows of each.)
    pub const fn stage_bytes(&self) -> u32 {
        self.a_tile_bytes() + self.b_tile_bytes()
    }
    /// Bytes TMA delivers into one block's slot per stage, announced on its `full` barrier:
    /// `a_box_rows` rows of each A tile (`a_rows`, or in a partial last m-tile
    /// [`GemmParams::a_tail_box_rows`]) and `b_box_rows` of each B tile from each block of
    /// the cluster (`block_n / cluster_m`, or in a partial last n-tile
    /// [`GemmParams::b_tail_box_rows`]); a second k-block past K is zero-filled and still
    /// counts.
    pub const fn loaded_stage_bytes(&self, a_box_rows: u32, b_box_rows: u32) -> u32 {
        (a_box_rows + b_box_rows * self.cluster_m) * BLOCK_K * 2 * self.k_blocks_per_stage
    }
    /// Ring stages that `k_blocks` consecutive k-blocks of one unit take.
    pub const fn stages_for(&self, k_blocks: u32) -> u32 {
        k_blocks.div_ceil(self.k_blocks_per_stage)
    }
    /// Offset of the epilogue staging buffers after the operand tiles.
    pub const fn staging_offset(&self) -> u32 {
        self.stages * self.stage_bytes()
    }
    /// Offset of the mbarriers after the staging buffers (if any).
    pub const fn barrier_offset(&self) -> u32 {
        self.staging_offset() + if self.staged { STAGING_BYTES } else { 0 }
    }
    /// Offset of the abort word after the mbarriers: `full[stages]`, `empty[stages]`, one per
    /// staging buffer for loads of C into it, then, with ping-pong, the two order barriers.
    pub const fn abort_flag_offset(&self) -> u32 {
        let order = match self.split {
            ConsumerSplit::Tiles => 2,
            ConsumerSplit::Rows | ConsumerSplit::Columns | ConsumerSplit::Single => 0,
        };
        self.barrier_offset() + (2 * self.stages + 4 + order) * 8
    }
    /// Consumer warps that use, and release, each ring slot: all eight, or with ping-pong
    /// ([`ConsumerSplit::Tiles`]) the four of the warpgroup whose tile the slot holds, or the
    /// four of the only one ([`ConsumerSplit::Single`]).
    pub const fn warps_per_slot(&self) -> u32 {
        match self.split {
            ConsumerSplit::Tiles | ConsumerSplit::Single => 4,
            ConsumerSplit::Rows | ConsumerSplit::Columns => 8,
        }
    }
    /// Offset of the row-wise FP8 scale area after the abort word and the split words: per
    /// consumer warpgroup, the `sb` of its share's columns then the `sa` of its rows
    /// ([`TileConfig::row_scale_bytes`]), copied in while the tile's main loop runs so that
    /// the staged epilogue reads them from shared memory.
    pub const fn row_scales_offset(&self) -> u32 {
        self.abort_flag_offset() + 16
    }
    /// Bytes of one consumer warpgroup's row-wise scale area: `wg_cols + wg_rows` f32 (none
    /// without staging buffers: the register epilogue loads its scales itself).
    pub const fn row_scale_bytes(&self) -> u32 {
        if self.staged {
            (self.wg_cols() + self.wg_rows()) * 4
        } else {
            0
        }
    }
    /// Dynamic shared memory the kernel needs.
    pub const fn smem_bytes(&self) -> u32 {
        self.row_scales_offset() + 2 * self.row_scale_bytes()
    }
    /// Box of the A tensor map for every m-tile but a partial last one: `{64 columns,
    /// a_rows rows}`, the whole slot.
    pub const fn a_box(&self) -> (u32, u32) {
        (BLOCK_K, self.a_rows)
    }
    /// Rows of A the TMA box of the *last* m-tile loads for a problem of `m` rows: the rows
    /// that tile has (`m` less the whole tiles above it) rounded up to a swizzle atom's 8
    /// rows, at most `a_rows` (so `a_rows` where M is a multiple of the tile, and for a short
    /// tile `m` rounded up). TMA zero-fills the rows of a box past the matrix's edge, and that
    /// fill is not free: a 64-row box at 1 or 16 rows made the 64-row tiles 10–60 % slower
    /// than at 64 rows on the same weights (gemm-grid-2026-12-02-f66c553-m1), and a 64-row box
    /// over the last 32 rows of 96 made `64x64k2` 31 % slower than at 128 rows
    /// (gemm-2026-12-02-3f7ef7e-96x6144x4096-and-5-more; kernels-gpu/NOTES.md steps 54, 55).
    /// The slot's rows past the box keep whatever the ring held before; they feed only
    /// accumulator rows (tokens) at or past M, which are never stored.
    pub const fn a_tail_box_rows(&self, m: u32) -> u32 {
        tail_box_rows(m, self.block_m, self.a_rows)
    }
    /// Box of the A tensor map of the last m-tile for a problem of `m` rows: `{64 columns,
    /// a_tail_box_rows(m) rows}`.
    pub const fn a_tail_box(&self, m: u32) -> (u32, u32) {
        (BLOCK_K, self.a_tail_box_rows(m))
    }
    /// The most rows (M) a problem may have on this configuration: `a_rows` for a short
    /// tile, else no bound (`u32::MAX`; more rows are more tiles).
    pub const fn max_rows(&self) -> u32 {
        if self.a_rows < self.block_m {
            self.a_rows
        } else {
            u32::MAX
        }
    }
    /// Box of the B tensor map: `{64 columns, block_n / cluster_m rows}` (each block of a
    /// cluster loads its share of the B tile).
    pub const fn b_box(&self) -> (u32, u32) {
        (BLOCK_K, self.block_n / self.cluster_m)
    }
    /// Rows of B the TMA box of the *last* n-tile loads for a problem of `n` columns, as
    /// [`TileConfig::a_tail_box_rows`] does for A: the rows that tile has rounded up to 8, at
    /// most `block_n`, so that TMA zero-fills no rows past N. The slot's rows past the box
    /// keep whatever the ring held before; B row `j` of a slot feeds only output column `j`
    /// of the tile (accumulator columns, or with the transposed product accumulator rows),
    /// and columns at or past N are never stored. In clusters, where each block multicasts
    /// a share of the tile, the box stays [`TileConfig::b_box`].
    pub const fn b_tail_box_rows(&self, n: u32) -> u32 {
        if self.cluster_m == 1 {
            tail_box_rows(n, self.block_n, self.block_n)
        } else {
            self.block_n / self.cluster_m
        }
    }
    /// Box of the B tensor map of the last n-tile for a problem of `n` columns: `{64 columns,
    /// b_tail_box_rows(n) rows}`.
    pub const fn b_tail_box(&self, n: u32) -> (u32, u32) {
        (BLOCK_K, self.b_tail_box_rows(n))
    }
    /// Columns of one staged epilogue chunk: 64 (rows of 128 bytes, stored with the 128-byte
    /// swizzle) when they divide a warpgroup's width, else 32 (rows of 64 bytes, 64-byte
    /// swizzle), so that a chunk never reaches into columns another warpgroup or tile owns.
    pub const fn epilogue_cols(&self) -> u32 {
        if self.wg_cols().is_multiple_of(64) {
            64
        } else {
            32
        }
    }
    /// Staged chunks one consumer warpgroup writes per tile.
    pub const fn chunks_per_tile(&self) -> u32 {
        self.slabs() * (self.wg_cols() / self.epilogue_cols())
    }
    /// Top-left element of staged chunk `i` (`0..chunks_per_tile()`) relative to the
    /// warpgroup's share of the tile: chunks go slab by slab, left to right within a slab.
    pub const fn chunk_offset(&self, i: u32) -> (u32, u32) {
        let per_slab = self.wg_cols() / self.epilogue_cols();
        (
            (i / per_slab) * EPILOGUE_CHUNK,
            (i % per_slab) * self.epilogue_cols(),
        )
    }
    /// Bytes of one row of a staged chunk: the swizzle span of the D and C tensor maps.
    pub const fn epilogue_row_bytes(&self) -> u32 {
        self.epilogue_cols() * 2
    }
    /// Box of the D and C tensor maps: `{epilogue_cols, 64 rows}`.
    pub const fn d_box(&self) -> (u32, u32) {
        (self.epilogue_cols(), EPILOGUE_CHUNK)
    }
    /// Whether the configuration is one the kernel implements, fits, and keeps every tile
    /// 1024-byte aligned: 128-row tiles split by rows (N of 96, 128, 160, 192, 224 or 256; 80 or
    /// 144 stored from registers), or split by
    /// columns 192×192 tiles (three `m64n96k16` slabs per warpgroup), 64×128 tiles (one
    /// `m64n64k16` slab per warpgroup), 64×96 tiles (one `m64n48k16` slab per warpgroup,
    /// stored from registers) and 64×64 tiles (one `m64n32k16` slab per warpgroup), or 64×32,
    /// (from registers) 64×64 and 64×128 tiles for one warpgroup; the transposed product
    /// ([`TileConfig::swap_ab`]) only on 16-row short tiles.
    pub const fn is_valid(&self) -> bool {
        let shape = match self.split {
            // 80 and 144 wide only from registers: no staged chunk width (64 or 32) divides
            // them.
            ConsumerSplit::Rows => {
                self.block_m == 128
                    && (matches!(self.block_n, 96 | 128 | 160 | 192 | 224 | 256)
                        || (matches!(self.block_n, 80 | 144) && !self.staged))
            }
            ConsumerSplit::Columns => {
                (self.block_m == 192 && self.block_n == 192)
                    || (self.block_m == 64 && (self.block_n == 128 || self.block_n == 64))
                    // Halves 48 wide: no staged chunk width (64 or 32) divides them.
                    || (self.block_m == 64 && self.block_n == 96 && !self.staged)
                    // Halves 104 and 120 wide (`64x208`, `64x240`): likewise.
                    || (self.block_m == 64 && matches!(self.block_n, 208 | 240) && !self.staged)
            }
            // Two 64×128 slabs a warpgroup: 128 accumulator registers, as 128×256's share.
            ConsumerSplit::Tiles => {
                self.block_m == 128 && self.block_n == 128 && !self.split_k && self.cluster_m == 1
            }
            // One warpgroup's `wgmma` a k16 step, for tiles whose tensor work is too small to
            // share: the transposed product 64 weight rows wide (`m64n16`), 64×32 (`m64n32`),
            // 64×64 (`m64n64`) or 64×128 (`m64n128`).
            ConsumerSplit::Single => {
                self.block_m == SLAB_M
                    && self.cluster_m == 1
                    && if self.swap_ab {
                        self.block_n == 64
                    } else {
                        // 64 wide (`m64n64`) only from registers, as the 64×64 tiles; 128 wide
                        // staged or not (both chunk widths divide it).
                        self.block_n == 32
                            || (self.block_n == 64 && !self.staged)
                            || self.block_n == 128
                    }
            }
        };
        // A short tile: one 64-row slab whose A rows are whole 8-row swizzle atoms.
        let rows = self.a_rows == self.block_m
            || (self.block_m == SLAB_M
                && self.a_rows > 0
                && self.a_rows < SLAB_M
                && self.a_rows.is_multiple_of(8));
        // The transposed product: one 64-row slab of B rows per warpgroup times the short
        // tile's 16 rows of A (`m64n16`), stored from registers.
        let swapped = !self.swap_ab
            || (matches!(self.split, ConsumerSplit::Columns | ConsumerSplit::Single)
                && self.block_m == SLAB_M
                && self.a_rows == 16
                && !self.staged);
        let depth = self.k_blocks_per_stage == 1
            || ((self.k_blocks_per_stage == 2 || self.k_blocks_per_stage == 4)
                && self.cluster_m == 1
                && !self.split_k);
        shape
            && rows
            && swapped
            && depth
            && self.smem_bytes() <= MAX_SMEM_BYTES
            && self.a_tile_bytes().is_multiple_of(1024)
            && self.b_tile_bytes().is_multiple_of(1024)
            && (self.cluster_m == 1 || self.cluster_m == 2)
            && !(self.split_k && self.cluster_m != 1)
            && (self.b_tile_bytes() / self.cluster_m).is_multiple_of(1024)
    }
}

/// 128×256 tiles, 4 stages: the most work per byte of operands among the 128-row tiles; for
/// large problems.
pub const TILE_128X256: TileConfig = TileConfig {
    block_m: 128,
    block_n: 256,
    split: ConsumerSplit::Rows,
    stages: 4,
    cluster_m: 1,
    split_k: false,
    a_rows: 128,
    staged: true,
    swap_ab: false,
    k_blocks_per_stage: 1,
};
/// 128×256 tiles in 2-block clusters sharing B through TMA multicast.
pub const TILE_128X256_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_128X256
};
/// 192×192 tiles, 4 stages of 48 KiB: 12 % fewer operand bytes per output element than
/// 128×256 (384 rows of operands per 36 864 outputs instead of per 32 768), though measured no
/// cheaper per element (kernels-gpu/NOTES.md step 16); it pays where its tile count fills the
/// waves best. Each consumer warpgroup computes a 192×96 half as three `m64n96k16` slabs.
pub const TILE_192X192: TileConfig = TileConfig {
    block_m: 192,
    block_n: 192,
    split: ConsumerSplit::Columns,
    stages: 4,
    cluster_m: 1,
    split_k: false,
    a_rows: 192,
    staged: true,
    swap_ab: false,
    k_blocks_per_stage: 1,
};
/// 192×192 tiles in 2-block clusters sharing B (96 of its rows loaded by each block): 288 rows
/// of operands a block per 36 864 outputs, for rows that start off 32-byte boundaries, where
/// the L2 requests of the rows a block loads bound the main loop (`host/src/gemm/sectors.rs`).
pub const TILE_192X192_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_192X192
};
/// 128×224 tiles, 4 stages: for widths that 224 divides into a tile count just under whole
/// waves where 256 leaves a badly filled last wave (7168 = 32 · 224: 512 tiles of a 2048-row
/// problem are 3.9 waves of 132, 448 wide ones 3.4).
pub const TILE_128X224: TileConfig = TileConfig {
    block_n: 224,
    ..TILE_128X256
};
/// 128×224 tiles in 2-block clusters sharing B (for rows off 32-byte boundaries, as
/// [`TILE_192X192_CLUSTER2`]).
pub const TILE_128X224_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_128X224
};
/// 128×192 tiles, 4 stages (40 KiB each; five do not fit beside the staging buffers): for
/// widths that 192 divides into about a wave of tiles where 224 and 256 leave SMs idle
/// (6144 = 32 · 192: a 512-row problem is 128 tiles on 132 SMs, where 224-wide tiles make 112
/// and 256-wide ones 96).
pub const TILE_128X192: TileConfig = TileConfig {
    block_n: 192,
    ..TILE_128X256
};
/// 128×192 tiles in 2-block clusters sharing B (for rows off 32-byte boundaries, as
/// [`TILE_192X192_CLUSTER2`]).
pub const TILE_128X192_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_128X192
};
/// 128×160 tiles, 5 stages (36 KiB each): for widths that 160 divides into about a wave of
/// tiles where wider ones leave SMs idle (5120 = 32 · 160: a 512-row problem is 128 tiles on
/// 132 SMs, where 224-wide tiles make 92 and 256-wide ones 80).
pub const TILE_128X160: TileConfig = TileConfig {
    block_n: 160,
    stages: 5,
    ..TILE_128X256
};
/// 128×160 tiles in 2-block clusters sharing B (for rows off 32-byte boundaries, as
/// [`TILE_192X192_CLUSTER2`]).
pub const TILE_128X160_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_128X160
};
/// 128×128 tiles, 6 stages: twice the tiles, for problems whose 128×256 tile count leaves a
/// badly filled last wave.
pub const TILE_128X128: TileConfig = TileConfig {
    block_n: 128,
    stages: 6,
    ..TILE_128X256
};
/// 128×128 tiles in 2-block clusters sharing B.
pub const TILE_128X128_CLUSTER2: TileConfig = TileConfig {
    cluster_m: 2,
    ..TILE_128X128
};
/// 128×128 tiles, ping-pong ([`ConsumerSplit::Tiles`]): each consumer warpgroup computes whole
/// tiles in turn, so a tile's epilogue overlaps the next tile's main loop instead of idling
/// the tensor cores; operands per output as 128×128. The FP8 rule picks it where the
/// epilogue weighs most: compute-bound shapes of short K (`host/src/gemm/choose.rs`); in 16
/// bits it runs by name only (measured slower there).
pub const TILE_128X128_PINGPONG: TileConfig = TileConfig {
    split: ConsumerSplit::Tiles,
    ..TILE_128X128
};
/// 128×256 tiles with split-K ([`SplitParams`]): for weight-streaming shapes whose 128×256
/// tiles are fewer than the SMs (decode: M ≤ 128 rows, N a few thousand).
pub const TILE_128X256_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_128X256
};
/// 128×128 tiles, 6 stages, with split-K: twice the tiles of 128×256 and a deeper ring per
/// block, so more of the weight stream is in flight per SM.
pub const TILE_128X128_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_128X128
};

/// 128×160 tiles with split-K: for problems of a few hundred rows whose 160-wide tiles fill
/// at most half the SMs (405B QKV at TP 8, 512 rows: 60 tiles, two splits make 120 blocks).
pub const TILE_128X160_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_128X160
};

/// 128×144 tiles with split-K, 6 stages of 34 KiB, stored from registers (no staged chunk
/// width divides 144): cuBLASLt's tile at 405B QKV at TP 8 with 512 rows, where 144 divides
/// the 2304 columns into 16 tiles — 64 tiles of a 512-row problem, two splits on 128 blocks —
/// where `128x160s` runs 15 tiles a row, the last 64 wide (60 tiles on 120 blocks).
pub const TILE_128X144_SPLITK: TileConfig = TileConfig {
    block_n: 144,
    stages: 6,
    staged: false,
    split_k: true,
    ..TILE_128X256
};

/// 128×80 tiles, 8 stages of 26 KiB, stored from registers (no staged chunk width divides
/// 80): cuBLASLt's tile for a few hundred rows of 1–3 k columns at long K, where 80 cuts the
/// columns into enough tiles for one wave without split-K (512 × 2304: 116 tiles, where
/// 128×128 makes 72 and 128×144 needs two splits of 64).
pub const TILE_128X80: TileConfig = TileConfig {
    block_n: 80,
    stages: 8,
    staged: false,
    ..TILE_128X256
};
/// 128×96 tiles, 6 stages of 28 KiB: 96 cuts 1536 and 3072 columns into 16 and 32 tiles (a
/// wave of 128 tiles at 1024 and 512 rows).
pub const TILE_128X96: TileConfig = TileConfig {
    block_n: 96,
    stages: 6,
    ..TILE_128X256
};

/// 64×128 tiles, 8 stages, split by columns (each consumer warpgroup one `m64n64k16` slab):
/// for problems of at most 64 rows (decode), where a 128-row tile spends half its tensor work
/// on rows that do not exist. There the kernel is bound by that work, not by the weight
/// stream: a 128-row tile at M = 1 takes ~512 cycles per 64-deep k-block whatever M is
/// (kernels-gpu/NOTES.md step 34), so one SM streams at most ~60 GB/s of B; a 64-row tile
/// halves the work per byte of B and doubles that.
pub const TILE_64X128: TileConfig = TileConfig {
    block_m: 64,
    block_n: 128,
    split: ConsumerSplit::Columns,
    stages: 8,
    cluster_m: 1,
    split_k: false,
    a_rows: 64,
    staged: true,
    swap_ab: false,
    k_blocks_per_stage: 1,
};
/// [`TILE_64X128`] computed by one consumer warpgroup ([`ConsumerSplit::Single`]): one
/// `m64n128k16` per k16 step instead of two warpgroups' `m64n64k16`, so a stage's A rows are
/// read from shared memory once instead of twice (the same ring, boxes, grid and staged
/// epilogue). Measured faster than or within 0.5 % of [`TILE_64X128`] on all 60 records of
/// 64–128 rows, K = 2048–28672 (up to 11 % where a long run holds the GPU at its power cap:
/// 128 × 5120 × 16384 in f16, 100 ms blocks), level at 64 rows (kernels-gpu/NOTES.md step 81);
/// the weight-stream rule runs it in `64x128`'s place from 64 rows.
pub const TILE_64X128_ONE_WARPGROUP: TileConfig = TileConfig {
    split: ConsumerSplit::Single,
    ..TILE_64X128
};
/// 64×128 tiles with split-K: decode shapes whose 64-row tiles are still fewer than the SMs
/// (few, wide-K weight matrices: a QKV projection at high TP), where only splitting K puts
/// every SM on the weight stream.
pub const TILE_64X128_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_64X128
};

/// 64×64 tiles, 13 stages of 16 KiB, split by columns (each consumer warpgroup one
/// `m64n32k16` slab), stored from registers: for decode and small-batch shapes of up to a few
/// tens of rows whose 64×128 tiles number about half the SMs or fewer (8B QKV at 64 rows: 96
/// tiles instead of 48). cuBLAS runs these shapes in 64×64 tiles with 13 stages (its kernel
/// name at 64 × 6144 × 4096 and, split three ways, at 64 × 2304 × 16384; ncu, NOTES step 53).
/// A whole tile's A rows are loaded (`a_rows == block_m`), so it serves any M.
pub const TILE_64X64: TileConfig = TileConfig {
    block_n: 64,
    stages: 13,
    staged: false,
    ..TILE_64X128
};
/// [`TILE_64X64`] with split-K: for weight matrices whose 64-wide tiles are still too few
/// (405B QKV at TP 8: 36 tiles).
pub const TILE_64X64_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_64X64
};
/// [`TILE_64X64`] with two k-blocks a stage ([`TileConfig::k_blocks_per_stage`]): 7 stages of
/// 2 × 16 KiB, half the hand-offs per byte.
pub const TILE_64X64_DEEP: TileConfig = TileConfig {
    stages: 7,
    k_blocks_per_stage: 2,
    ..TILE_64X64
};
/// [`TILE_64X64_DEEP`] computed by one consumer warpgroup ([`ConsumerSplit::Single`]): one
/// `m64n64k16` per k16 step instead of two warpgroups' `m64n32k16`, so a stage's A rows are
/// read from shared memory once instead of twice and half the consumer warps run. Measured
/// 1–8 % faster than [`TILE_64X64_DEEP`] at 72–128 rows and K = 8192–28672 in 100 ms blocks
/// (the GPU at its power cap), level or up to 3 % slower at K ≤ 4096 and at 64 rows
/// (kernels-gpu/NOTES.md step 80); the weight-stream rule runs it in `64x64k2`'s place there.
pub const TILE_64X64_DEEP_ONE_WARPGROUP: TileConfig = TileConfig {
    split: ConsumerSplit::Single,
    ..TILE_64X64_DEEP
};
/// 64×96 tiles with two k-blocks a stage: 5 stages of 2 × 20 KiB, split by columns (each
/// consumer warpgroup one `m64n48k16` slab), stored from registers. A 64-row block's ring
/// stage takes ~0.195 µs whatever its width (NOTES step 75), so halving the stages a k-block
/// is what speeds it up; 96 columns make more blocks than 128 at a few hundred rows of narrow
/// N (192–300 × 2304: 72–120 blocks against 54–90), 6–7 % faster there than `64x128`.
pub const TILE_64X96_DEEP: TileConfig = TileConfig {
    block_n: 96,
    stages: 5,
    k_blocks_per_stage: 2,
    ..TILE_64X64
};
/// 64×208 tiles, 6 stages of 34 KiB, split by columns (each consumer warpgroup one
/// `m64n104k16` slab), stored from registers: a 64-row granularity whose tiles make about one
/// wave at a few hundred ragged rows of 5–9 k columns (260 × 5120: 5 × 25 = 125 blocks), where
/// 128-row tiles compute up to a third of their rows as padding and 64×256 tiles' 100 blocks
/// leave SMs idle (NOTES steps 77–78).
pub const TILE_64X208: TileConfig = TileConfig {
    block_n: 208,
    stages: 6,
    staged: false,
    ..TILE_64X128
};
/// 64×240 tiles, 5 stages of 38 KiB (`m64n120k16` halves), stored from registers: the same
/// for 6–10 k columns (280 × 6144: 5 × 26 = 130 blocks).
pub const TILE_64X240: TileConfig = TileConfig {
    block_n: 240,
    stages: 5,
    ..TILE_64X208
};
/// 64×32 tiles, 18 stages of 12 KiB, computed by one consumer warpgroup
/// ([`ConsumerSplit::Single`], one `m64n32k16` per k16 step): for shapes whose 64-wide
/// tiles fill at most half the SMs (8B o-proj at 64 rows: 128 tiles instead of 64), where
/// cuBLAS runs 64×32 tiles with 16 stages and no split (NOTES step 53).
pub const TILE_64X32: TileConfig = TileConfig {
    block_n: 32,
    split: ConsumerSplit::Single,
    stages: 18,
    ..TILE_64X64
};
/// [`TILE_64X32`] with two k-blocks a stage: 9 stages of 2 × 12 KiB.
pub const TILE_64X32_DEEP: TileConfig = TileConfig {
    stages: 9,
    k_blocks_per_stage: 2,
    ..TILE_64X32
};

/// 16×128 output tiles for problems of at most 16 rows (decode): a 64×128 tile whose stages
/// load 16 rows of A (2 KiB instead of 8) and whose epilogue stores from registers, so that the
/// 32 KiB of staging buffers and 6 KiB a stage of A rows past M go to the ring: 12 stages of
/// B (192 KiB in flight per SM) instead of 8 (128 KiB), cuBLAS's depth on these shapes.
/// Unsplit, measured up to 9 % faster than `64x128` at one token (8B fc1: 68.6 → 62.7 µs)
/// and within −3…+2 % at 16 (kernels-gpu/NOTES.md step 40b). The rule now runs its transposed
/// form, [`TILE_16X128_SWAPPED`], instead; this one runs by name.
pub const TILE_16X128: TileConfig = TileConfig {
    stages: 12,
    a_rows: 16,
    staged: false,
    ..TILE_64X128
};
/// 16×128 tiles with split-K. Measured 3–5 % slower than [`TILE_64X128_SPLITK`] at 16 rows
/// and no faster at one (−6…+4 %; NOTES step 40b), so the rule does not pick it; it runs by
/// name.
pub const TILE_16X128_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_16X128
};

/// 16×64 output tiles (64 weight rows a block; each consumer warpgroup one `m64n32k16`
/// slab): the 16-row tile at half the width, 22 stages (176 KiB of B in flight, 2.75 KiB a
/// weight row), as cuBLAS streams 8B's QKV at one token (64 weight rows, 16 stages, 96 blocks,
/// no split). Where N has between about 64 and 132 such tiles it keeps every block on one
/// whole K without split-K's hand-off: measured 5–20 % faster than the split `64x128s` there
/// (NOTES step 41). No split-K form: measured within 3 % of `64x128s` where the rule would
/// split it. The rule now runs its transposed form, [`TILE_16X64_SWAPPED`], instead.
pub const TILE_16X64: TileConfig = TileConfig {
    block_n: 64,
    stages: 22,
    ..TILE_16X128
};

/// [`TILE_16X128`] with the transposed product ([`TileConfig::swap_ab`]): per k16 step each
/// consumer warpgroup issues one `m64n16k16` (its 64 weight rows by the 16 token rows)
/// instead of `m64n64k16` (64 A rows, of which at most 16 exist, by its 64 weight rows): a
/// quarter of the tensor work per byte of B. Same ring, boxes and grid as `16x128`. Measured
/// 1–10 % faster than `16x128` on the decode shapes at 1 and 16 tokens (NOTES step 51): the
/// rule's tile where it would otherwise run `16x128`.
pub const TILE_16X128_SWAPPED: TileConfig = TileConfig {
    swap_ab: true,
    ..TILE_16X128
};
/// [`TILE_16X128_SWAPPED`] with split-K: for decode shapes whose 128-wide tiles leave SMs
/// idle (a few thousand weight rows). Measured 2–7 % faster than [`TILE_64X128_SPLITK`] at
/// 1 and 16 tokens (NOTES step 51), which it replaces in the rule at most 16 rows.
pub const TILE_16X128_SWAPPED_SPLITK: TileConfig = TileConfig {
    split_k: true,
    ..TILE_16X128_SWAPPED
};

/// [`TILE_16X64`] with the transposed product ([`TileConfig::swap_ab`]) computed by one
/// consumer warpgroup ([`ConsumerSplit::Single`]): one `m64n16k16` per k16 step for the
/// tile's 64 weight rows. Same ring (22 stages), boxes and grid as `16x64`. Measured 2–9 %
/// faster than `16x64` at 1 and 16 tokens (NOTES step 51), which it replaces in the rule.
pub const TILE_16X64_SWAPPED: TileConfig = TileConfig {
    split: ConsumerSplit::Single,
    swap_ab: true,
    ..TILE_16X64
};

/// [`TILE_16X64_SWAPPED`] with two k-blocks a stage ([`TileConfig::k_blocks_per_stage`]):
/// 11 stages of 2 × 10 KiB, the same bytes in flight, half the hand-offs per byte.
pub const TILE_16X64_SWAPPED_DEEP: TileConfig = TileConfig {
    stages: 11,
    k_blocks_per_stage: 2,
    ..TILE_16X64_SWAPPED
};
/// [`TILE_16X64_SWAPPED`] with four k-blocks a stage: 5 stages of 4 × 10 KiB, 200 KiB in
/// flight, a quarter of `16x64t`'s hand-offs per byte. Measured 2–5 % faster than
/// [`TILE_16X64_SWAPPED_DEEP`] where its 64-wide tiles number 80–96 (8B QKV, 70B QKV), 12 % on
/// the 36 tiles of 405B QKV, level at 64 and 128 tiles (kernels-gpu/NOTES.md step 86); the
/// weight-stream rule runs it in `16x64t2`'s place. Four k-blocks a stage of a 64 × 64 tile
/// (3 stages of 64 KiB) measured 3–30 % slower than two: too few stages to keep the stream
/// going.
pub const TILE_16X64_SWAPPED_DEEP4: TileConfig = TileConfig {
    stages: 5,
    k_blocks_per_stage: 4,
    ..TILE_16X64_SWAPPED
};
/// [`TILE_16X128_SWAPPED`] with two k-blocks a stage: 6 stages of 2 × 18 KiB.
pub const TILE_16X128_SWAPPED_DEEP: TileConfig = TileConfig {
    stages: 6,
    k_blocks_per_stage: 2,
    ..TILE_16X128_SWAPPED
};

/// The largest [`TileConfig::sum_group`] of the tiles with 64-row accumulator slabs (the
/// kernel unrolls their group loop to this bound).
pub const MAX_SUM_GROUP: u32 = 4;

/// [`TileConfig::sum_group`] of the transposed-product decode tiles ([`TileConfig::swap_ab`]):
/// a split is 8 floats a consumer thread, so eight splits' loads take 64 registers beside the
/// 8 accumulators, and the 7 splits of 405B QKV at TP 8 with one token (18 tiles on 126
/// blocks) are summed in one L2 round trip instead of two (measured 28.1 → 27.2 µs: NOTES
/// step 71).
pub const SWAPPED_SUM_GROUP: u32 = 8;

/// One compiled configuration: its entry points and tile configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmVariant {
    /// Short name (benchmarks, overrides).
    pub name: &'static str,
    /// bf16 entry point.
    pub kernel_bf16: &'static str,
    /// f16 entry point.
    pub kernel_f16: &'static str,
    /// Entry point for e4m3 A and B with bf16 C and D, where compiled
    /// (`gemm_e4m3_<name>`): the same kernel with `m64nNk32.e4m3` `wgmma`s. The host describes
    /// the e4m3 operands to TMA as 16-bit pairs, so every byte offset, box and swizzle is the
    /// 16-bit kernel's, with K counted in pairs.
    pub kernel_e4m3: Option<&'static str>,
    /// Its tiles.
    pub config: TileConfig,
}

/// The one table of compiled GEMM variants. Each row is a variant name, its bf16 and f16
/// entry points (always `gemm_<dtype>_<name>`: checked below), its [`TileConfig`], the
/// device-side configuration type (`kernels/gemm/slabs.rs` and `swapped.rs`) and, for the
/// configurations compiled for FP8 too, `e4m3` and that entry point (`gemm_e4m3_<name>`).
/// `gemm_variants!(callback)` hands the rows to `callback!`, which generates from them the
/// entry points (`kernels/gemm/mod.rs`), [`VARIANTS`] and the kernel table `meta::KERNELS`, so
/// the three cannot drift.
macro_rules! gemm_variants {
    ($callback:ident) => {
        $callback! {
            "128x256" => gemm_bf16_128x256, gemm_f16_128x256, TILE_128X256, Tile128x256, e4m3 gemm_e4m3_128x256;
            "128x256c2" => gemm_bf16_128x256c2, gemm_f16_128x256c2, TILE_128X256_CLUSTER2, Tile128x256C2;
            "192x192" => gemm_bf16_192x192, gemm_f16_192x192, TILE_192X192, Tile192x192;
            "192x192c2" => gemm_bf16_192x192c2, gemm_f16_192x192c2, TILE_192X192_CLUSTER2, Tile192x192C2;
            "128x224" => gemm_bf16_128x224, gemm_f16_128x224, TILE_128X224, Tile128x224;
            "128x224c2" => gemm_bf16_128x224c2, gemm_f16_128x224c2, TILE_128X224_CLUSTER2, Tile128x224C2;
            "128x192" => gemm_bf16_128x192, gemm_f16_128x192, TILE_128X192, Tile128x192;
            "128x192c2" => gemm_bf16_128x192c2, gemm_f16_128x192c2, TILE_128X192_CLUSTER2, Tile128x192C2;
            "128x160" => gemm_bf16_128x160, gemm_f16_128x160, TILE_128X160, Tile128x160;
            "128x160c2" => gemm_bf16_128x160c2, gemm_f16_128x160c2, TILE_128X160_CLUSTER2, Tile128x160C2;
            "128x128" => gemm_bf16_128x128, gemm_f16_128x128, TILE_128X128, Tile128x128, e4m3 gemm_e4m3_128x128;
            "128x128c2" => gemm_bf16_128x128c2, gemm_f16_128x128c2, TILE_128X128_CLUSTER2, Tile128x128C2;
            "128x96" => gemm_bf16_128x96, gemm_f16_128x96, TILE_128X96, Tile128x96;
            "128x80" => gemm_bf16_128x80, gemm_f16_128x80, TILE_128X80, Tile128x80;
            "128x256s" => gemm_bf16_128x256s, gemm_f16_128x256s, TILE_128X256_SPLITK, Tile128x256S, e4m3 gemm_e4m3_128x256s;
            "128x128s" => gemm_bf16_128x128s, gemm_f16_128x128s, TILE_128X128_SPLITK, Tile128x128S;
            "128x160s" => gemm_bf16_128x160s, gemm_f16_128x160s, TILE_128X160_SPLITK, Tile128x160S;
            "128x144s" => gemm_bf16_128x144s, gemm_f16_128x144s, TILE_128X144_SPLITK, Tile128x144S;
            "16x128" => gemm_bf16_16x128, gemm_f16_16x128, TILE_16X128, Tile16x128, e4m3 gemm_e4m3_16x128;
            "64x128" => gemm_bf16_64x128, gemm_f16_64x128, TILE_64X128, Tile64x128, e4m3 gemm_e4m3_64x128;
            "16x64" => gemm_bf16_16x64, gemm_f16_16x64, TILE_16X64, Tile16x64, e4m3 gemm_e4m3_16x64;
            "64x128w1" => gemm_bf16_64x128w1, gemm_f16_64x128w1, TILE_64X128_ONE_WARPGROUP, Tile64x128W1;
            "64x128s" => gemm_bf16_64x128s, gemm_f16_64x128s, TILE_64X128_SPLITK, Tile64x128S, e4m3 gemm_e4m3_64x128s;
            "16x128s" => gemm_bf16_16x128s, gemm_f16_16x128s, TILE_16X128_SPLITK, Tile16x128S, e4m3 gemm_e4m3_16x128s;
            "128x128p" => gemm_bf16_128x128p, gemm_f16_128x128p, TILE_128X128_PINGPONG, Tile128x128P, e4m3 gemm_e4m3_128x128p;
            "16x128t" => gemm_bf16_16x128t, gemm_f16_16x128t, TILE_16X128_SWAPPED, Tile16x128T, e4m3 gemm_e4m3_16x128t;
            "16x128ts" => gemm_bf16_16x128ts, gemm_f16_16x128ts, TILE_16X128_SWAPPED_SPLITK, Tile16x128TS, e4m3 gemm_e4m3_16x128ts;
            "16x64t" => gemm_bf16_16x64t, gemm_f16_16x64t, TILE_16X64_SWAPPED, Tile16x64T, e4m3 gemm_e4m3_16x64t;
            "16x64t2" => gemm_bf16_16x64t2, gemm_f16_16x64t2, TILE_16X64_SWAPPED_DEEP, Tile16x64T2, e4m3 gemm_e4m3_16x64t2;
            "16x128t2" => gemm_bf16_16x128t2, gemm_f16_16x128t2, TILE_16X128_SWAPPED_DEEP, Tile16x128T2, e4m3 gemm_e4m3_16x128t2;
            "16x64t4" => gemm_bf16_16x64t4, gemm_f16_16x64t4, TILE_16X64_SWAPPED_DEEP4, Tile16x64T4;
            "64x64" => gemm_bf16_64x64, gemm_f16_64x64, TILE_64X64, Tile64x64, e4m3 gemm_e4m3_64x64;
            "64x64s" => gemm_bf16_64x64s, gemm_f16_64x64s, TILE_64X64_SPLITK, Tile64x64S, e4m3 gemm_e4m3_64x64s;
            "64x64k2" => gemm_bf16_64x64k2, gemm_f16_64x64k2, TILE_64X64_DEEP, Tile64x64K2, e4m3 gemm_e4m3_64x64k2;
            "64x64k2w1" => gemm_bf16_64x64k2w1, gemm_f16_64x64k2w1, TILE_64X64_DEEP_ONE_WARPGROUP, Tile64x64K2W1;
            "64x32" => gemm_bf16_64x32, gemm_f16_64x32, TILE_64X32, Tile64x32, e4m3 gemm_e4m3_64x32;
            "64x32k2" => gemm_bf16_64x32k2, gemm_f16_64x32k2, TILE_64X32_DEEP, Tile64x32K2, e4m3 gemm_e4m3_64x32k2;
            "64x96k2" => gemm_bf16_64x96k2, gemm_f16_64x96k2, TILE_64X96_DEEP, Tile64x96K2;
            "64x208" => gemm_bf16_64x208, gemm_f16_64x208, TILE_64X208, Tile64x208;
            "64x240" => gemm_bf16_64x240, gemm_f16_64x240, TILE_64X240, Tile64x240;
        }
    };
}
pub(crate) use gemm_variants;

/// Builds [`VARIANTS`] from the rows of [`gemm_variants`], checking each entry name.
macro_rules! variant_array {
    ($($name:literal => $bf16:ident, $f16:ident, $tile:ident, $config:ident $(, e4m3 $e4m3:ident)?;)*) => {
        /// Every compiled configuration.
        pub const VARIANTS: [GemmVariant; [$($name),*].len()] = [$(
            GemmVariant {
                name: $name,
                kernel_bf16: stringify!($bf16),
                kernel_f16: stringify!($f16),
                kernel_e4m3: variant_array!(@optional $($e4m3)?),
                config: $tile,
            },
        )*];
        $(
            const _: () = assert!(
                str_eq(stringify!($bf16), concat!("gemm_bf16_", $name))
                    && str_eq(stringify!($f16), concat!("gemm_f16_", $name))
                    $(&& str_eq(stringify!($e4m3), concat!("gemm_e4m3_", $name)))?,
                "entry points are named gemm_<dtype>_<variant name>"
            );
        )*
    };
    (@optional $e4m3:ident) => { Some(stringify!($e4m3)) };
    (@optional) => { None };
}
gemm_variants!(variant_array);

/// `a == b`, usable in constants.
const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const _: () = {
    let mut i = 0;
    while i < VARIANTS.len() {
        assert!(VARIANTS[i].config.is_valid());
        i += 1;
    }
};

/// [`StageHook::flags`] bit: execute the PDL `griddepcontrol.wait` at the end of the kernel
/// (thread 0 of every block, before it exits) instead of before the main loop. Only for a
/// stage that reads, writes, signals and awaits nothing its programmatic predecessor guards —
/// the first stage of a pipelined all-gather after the start-of-run barrier: it computes
/// while the barrier waits for the peers, and its completion still implies the barrier's, so
/// later stages, which wait for it, remain ordered after the barrier's flag resets.
pub const HOOK_DEFER_GRID_WAIT: u32 = 1;

/// [`StageHook::flags`] bit: the wait on `wait_flag` guards only C (a pushed partial in the
/// device's own memory), so it moves from thread 0's prologue to each consumer warpgroup's
/// leader just before that warpgroup's first C load, which for the first tile is issued after
/// its main loop instead of before it: the producer streams A and B at once and the first
/// tile's main loop covers the neighbour's copy. The leader acquires the flag (system scope,
/// bounded as in the prologue), orders it before its TMA reads of C
/// (`fence.proxy.async.global`) and hands it to its warpgroup with a named barrier. On a
/// timeout it records the error code as the prologue would, and the block finishes its tiles
/// with whatever C holds (D is then unspecified; the host reports the timeout), since a block
/// cannot leave in the middle of its pipeline. Not combined with [`HOOK_DEFER_GRID_WAIT`].
pub const HOOK_WAIT_BEFORE_C: u32 = 2;

/// The distributed prologue hook: what a stage kernel does before its main loop, beyond the
/// PDL `griddepcontrol.wait` it executes there (unless [`HOOK_DEFER_GRID_WAIT`] moves it to
/// the end). All-zero means "nothing", and costs one predictable branch.
///
/// Order (thread 0 of each block): if `signal_flag != 0` and this is block 0, release-store
/// `signal_value` to it at system scope (after a system-scope fence, so everything the previous
/// stage wrote is visible to whoever acquires the flag); then if `wait_flag != 0` (and
/// [`HOOK_WAIT_BEFORE_C`] does not move the wait to the first C load), spin with
/// system-scope acquire loads until `*wait_flag >= wait_value`. If that takes longer than
/// `timeout_ns`, record `error_code` in `*error_word` and in every peer's error word
/// (`atom.cas.sys 0 → code`: the first code stays, see
/// [`crate::collective_abi`]) and make the whole grid return without touching D (the host
/// turns the code into an error naming device, stage and flag).
///
/// The peers' error words travel inline (64 bytes of kernel parameters, read only on the
/// timeout path) rather than through a pointer to a device-side table, which would need an
/// upload and a lifetime of its own for a path that runs only after a failure.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageHook {
    /// Device address of the flag to signal (possibly on a peer GPU), or 0.
    pub signal_flag: u64,
    /// Device address of the flag to wait on, or 0.
    pub wait_flag: u64,
    /// Device address of the word a timeout is reported in (required when `wait_flag != 0`).
    pub error_word: u64,
    /// Spin-wait bound in nanoseconds.
    pub timeout_ns: u64,
    /// Value stored to `signal_flag`.
    pub signal_value: u32,
    /// The wait ends once `*wait_flag >= wait_value`.
    pub wait_value: u32,
    /// Value recorded in the error words on timeout.
    pub error_code: u32,
    /// Bit set of `HOOK_*` options.
    pub flags: u32,
    /// The other devices' error words (unused entries 0).
    pub peer_errors: crate::collective_abi::PeerErrorWords,
}

/// Split-K of a `split_k` configuration ([`TileConfig::split_k`]); ignored by the others (all
/// zero there).
///
/// The grid shares the tiles' k-blocks out by stream-K ([`crate::layout::stream_k`]): block
/// `g` of `G` (the launch's grid size) takes positions `⌊g·W/G⌋ .. ⌊(g+1)·W/G⌋` of the
/// `W = tiles · ⌈K/64⌉` k-blocks laid end to end in the tiles' raster order, and computes the
/// *pieces* of tiles its range cuts. A tile computed whole by one block has the usual
/// epilogue. Otherwise, after a piece's main loop, a consumer warpgroup writes its f32
/// accumulators to the piece's slot in `partials` and counts itself in on the tile's counter;
/// the warpgroup that arrives last (all the tile's other pieces have written theirs) adds the
/// tile's `n` slots in k order into its registers — so the sum, and D, are the same bits
/// whichever block finishes last (for a given grid size: another `G` cuts other pieces) —
/// resets the counter to 0 for the next launch and runs the epilogue. No block ever waits
/// for another.
///
/// Slot layout: the piece of tile `t` computed by block `g` has slot `s = t + g`; the part
/// of (slot `s`, consumer warpgroup `h`) starts at float `(2s + h) · 128 · R` (`R` =
/// accumulator registers per thread = slabs × `wg_cols / 2`); register `r` of thread `i` is
/// float `r · 128 + i` in it (register-major, so each register's stores and loads are 512
/// contiguous bytes across the warpgroup). Registers of rows past M are neither written nor
/// read.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SplitParams {
    /// Device address of the f32 partial sums: `(tiles + G) · block_m · block_n` floats.
    pub partials: u64,
    /// Device address of the arrival counters: `2 · tiles` u32 (one per tile and consumer
    /// warpgroup), zero before a launch and left zero by it.
    pub counters: u64,
}

/// Row-wise FP8 scales: `D[i][j] = alpha · sa[i] · sb[j] · Σ_k a[i][k]·b[j][k] + beta · C[i][j]`.
/// Read only by the e4m3 entry points, and only when `a != 0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowScales {
    /// Device address of `sa`: M f32, one per row of A (and of D), or 0 for none.
    pub a: u64,
    /// Device address of `sb`: N f32, one per row of B (column of D); set when `a` is.
    pub b: u64,
}

/// Rows of the TMA box of the last tile along a dimension of `extent` rows cut into tiles of
/// `tile` rows, whose full box is `box_rows`: the rows past the whole tiles before it, rounded
/// up to a 128-byte swizzle atom's 8 rows, at most `box_rows` ([`TileConfig::a_tail_box_rows`],
/// [`TileConfig::b_tail_box_rows`]).
const fn tail_box_rows(extent: u32, tile: u32, box_rows: u32) -> u32 {
    let before = if extent == 0 {
        0
    } else {
        (extent - 1) / tile * tile
    };
    let rows = (extent - before).div_ceil(8) * 8;
    if rows == 0 {
        8
    } else if rows > box_rows {
        box_rows
    } else {
        rows
    }
}

/// The A and B tensor maps by value (128-byte `CUtensorMap` encodings), at the start of the
/// parameter block: the producer reads them from parameter space (the build gives the block
/// 128-byte alignment, `xtask` `patch_entry_param_0`), so they arrive with the launch instead
/// of being fetched from device memory behind a tensormap-proxy fence.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OperandMaps {
    /// A (M rows × K cols, box `TileConfig::a_box`), for every m-tile but a partial last one.
    pub a: [u64; 16],
    /// B (N rows × K cols, box `TileConfig::b_box`).
    pub b: [u64; 16],
    /// A again, box `TileConfig::a_tail_box` of M: the last m-tile's, whose box stops at M
    /// (the same as `a` where M is a multiple of the tile).
    pub a_tail: [u64; 16],
    /// B again, box `TileConfig::b_tail_box` of N: the last n-tile's, whose box stops at N
    /// (the same as `b` where N is a multiple of the tile, and in clusters).
    pub b_tail: [u64; 16],
}

/// The GEMM kernels' single by-value parameter.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GemmParams {
    /// The A and B tensor maps (must stay the first field: see [`OperandMaps`]).
    pub maps: OperandMaps,
    /// Device address of the D tensor map (M rows × N cols, box [`TileConfig::d_box`]), or 0. With it and
    /// `beta == 0` the epilogue stages output chunks in shared memory and writes them with TMA
    /// stores that overlap the next tile's main loop (with `beta != 0` only if `map_c` is given
    /// too); otherwise it stores from registers. The host gives one only when N is a multiple
    /// of 8: TMA stores write whole 16-byte units.
    pub map_d: u64,
    /// Device address of the C tensor map (M rows × N cols, box [`TileConfig::d_box`]; C may live on a
    /// peer GPU), or 0. With it, `map_d` and `beta != 0`, the staged epilogue first loads each
    /// C chunk into its staging buffer with TMA and adds `beta·C` there.
    pub map_c: u64,
    /// D base pointer (M×N row-major, leading dimension `ldd`).
    pub d: u64,
    /// C base pointer (M×N row-major, leading dimension `ldc`), or 0 when `beta == 0`. May be a
    /// peer GPU's memory.
    pub c: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ldd: u32,
    pub ldc: u32,
    pub alpha: f32,
    pub beta: f32,
    /// Height of the tile order's bands, in cluster tiles (see [`crate::layout::raster`]);
    /// 0 is read as 1. A launch parameter rather than a compile-time one: the best band
    /// depends on the problem's shape and the grid (the host's rule picks it).
    pub raster_group_m: u32,
    /// Rows of A each k-block's TMA box loads in the last m-tile
    /// ([`TileConfig::a_tail_box_rows`] of `m`): `maps.a_tail`'s box height, from which the
    /// producer announces that tile's stage bytes (every other tile loads `a_rows`).
    pub a_tail_box_rows: u32,
    /// Rows of B each k-block's TMA box loads in the last n-tile
    /// ([`TileConfig::b_tail_box_rows`] of `n`): `maps.b_tail`'s box height (every other
    /// tile loads `block_n / cluster_m`).
    pub b_tail_box_rows: u32,
    pub hook: StageHook,
    /// Split-K, read only by `split_k` configurations.
    pub split: SplitParams,
    /// Row-wise FP8 scales, read only by the e4m3 entry points.
    pub row_scales: RowScales,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_shares_cover_the_tile_once() {
        for v in &VARIANTS {
            let t = v.config;
            // Two warpgroups, each `slabs` slabs of 64 × wg_cols, side by side or stacked; or,
            // ping-pong, each the whole tile (of alternate tiles).
            let shares = match t.split {
                ConsumerSplit::Tiles | ConsumerSplit::Single => 1,
                ConsumerSplit::Rows | ConsumerSplit::Columns => 2,
            };
            assert_eq!(
                shares * t.slabs() * SLAB_M * t.wg_cols(),
                t.block_m * t.block_n,
                "{}",
                v.name
            );
            let (r1, c1) = t.wg_origin(1);
            assert!(
                r1 == t.wg_rows() && c1 == 0
                    || r1 == 0 && c1 == t.wg_cols()
                    || shares == 1 && (r1, c1) == (0, 0),
                "{}",
                v.name
            );
            // Staged chunks tile the share's columns (a tile stored from registers has none).
            assert!(
                !t.staged || t.wg_cols() % t.epilogue_cols() == 0,
                "{}",
                v.name
            );
        }
        let t = TILE_192X192;
        assert_eq!((t.slabs(), t.wg_cols(), t.epilogue_cols()), (3, 96, 32));
        assert_eq!(t.chunks_per_tile(), 9);
        assert_eq!(t.wg_origin(1), (0, 96));
        // 4 stages of 48 KiB + 32 KiB of staging + barriers fit the 227 KiB opt-in.
        assert_eq!(t.staging_offset(), 4 * 48 * 1024);
        assert!(t.smem_bytes() <= MAX_SMEM_BYTES);
        assert_eq!(TILE_128X256.chunks_per_tile(), 4);
        assert_eq!(TILE_128X224.chunks_per_tile(), 7);
        assert_eq!(TILE_128X160.chunks_per_tile(), 5);
        // 192×192: three slabs of three 32-column chunks each.
        assert_eq!(t.chunk_offset(0), (0, 0));
        assert_eq!(t.chunk_offset(2), (0, 64));
        assert_eq!(t.chunk_offset(3), (64, 0));
        assert_eq!(t.chunk_offset(8), (128, 64));
        assert_eq!(TILE_128X256.chunk_offset(3), (0, 192));
        // Ping-pong 128×128: two slabs of two 64-column chunks, four warps a slot.
        let p = TILE_128X128_PINGPONG;
        assert_eq!((p.slabs(), p.wg_cols(), p.chunks_per_tile()), (2, 128, 4));
        assert_eq!(p.chunk_offset(2), (64, 0));
        assert_eq!((p.warps_per_slot(), TILE_128X128.warps_per_slot()), (4, 8));
        assert!(p.smem_bytes() <= MAX_SMEM_BYTES);
    }

    #[test]
    fn chunks_tile_each_share_once() {
        // The staged epilogue's chunks (tiles stored from registers stage none).
        for v in VARIANTS.iter().filter(|v| v.config.staged) {
            let t = v.config;
            let mut covered = [[false; 256]; 192];
            for i in 0..t.chunks_per_tile() {
                let (r0, c0) = t.chunk_offset(i);
                for r in r0..r0 + EPILOGUE_CHUNK {
                    for c in c0..c0 + t.epilogue_cols() {
                        let cell = &mut covered[r as usize][c as usize];
                        assert!(!*cell, "{}: chunk {i} overlaps at ({r}, {c})", v.name);
                        *cell = true;
                    }
                }
            }
            for r in 0..t.wg_rows() {
                for c in 0..t.wg_cols() {
                    assert!(covered[r as usize][c as usize], "{}: ({r}, {c})", v.name);
                }
            }
        }
    }

    #[test]
    fn split_k_configurations_have_no_clusters() {
        // The kernel's stream-K partition is over blocks, not clusters.
        for v in VARIANTS.iter().filter(|v| v.config.split_k) {
            assert_eq!(v.config.cluster_m, 1, "{}", v.name);
        }
    }

    #[test]
    fn a_boxes_stop_at_the_problem_s_rows_in_whole_swizzle_atoms() {
        // A short tile serves at most `a_rows` (16) rows: its one box stops at M.
        let short = TILE_16X64_SWAPPED_DEEP;
        for (m, rows) in [(1, 8), (8, 8), (9, 16), (16, 16)] {
            assert_eq!(short.a_tail_box_rows(m), rows, "{m}");
        }
        // The last m-tile's box: the rows past the whole tiles above it, rounded up to 8.
        let (narrow, wide) = (TILE_64X32_DEEP, TILE_128X256);
        for (m, narrow_rows, wide_rows) in [
            (1, 8, 8),
            (17, 24, 24),
            (33, 40, 40),
            (64, 64, 64),
            (65, 8, 72),
            (96, 32, 96),
            (128, 64, 128),
            (200, 8, 72),
            (5000, 8, 8),
        ] {
            assert_eq!(narrow.a_tail_box(m), (BLOCK_K, narrow_rows), "{m}");
            assert_eq!(wide.a_tail_box_rows(m), wide_rows, "{m}");
        }
        for v in &VARIANTS {
            let c = v.config;
            for m in 1..=300 {
                // Whole 128-byte swizzle atoms (8 rows) within the slot, covering every row of
                // the last m-tile (a short tile serves at most `a_rows`).
                let rows = c.a_tail_box_rows(m);
                let last = m - (m - 1) / c.block_m * c.block_m;
                assert!(rows % 8 == 0 && rows <= c.a_rows, "{} {m}", v.name);
                assert!(rows >= last || m > c.max_rows(), "{} {m}", v.name);
            }
            // A full box fills the whole slot.
            assert_eq!(c.a_box(), (BLOCK_K, c.a_rows), "{}", v.name);
            assert_eq!(
                c.loaded_stage_bytes(c.a_rows, c.block_n / c.cluster_m),
                c.stage_bytes(),
                "{}",
                v.name
            );
        }
    }

    #[test]
    fn b_boxes_stop_at_the_problem_s_columns_outside_clusters() {
        let (narrow, wide) = (TILE_64X96_DEEP, TILE_128X256);
        for (n, narrow_rows, wide_rows) in [
            (8, 8, 8),
            (96, 96, 96),
            (100, 8, 104),
            (1024, 64, 256),
            (1152, 96, 128),
            (5000, 8, 136),
        ] {
            assert_eq!(narrow.b_tail_box(n), (BLOCK_K, narrow_rows), "{n}");
            assert_eq!(wide.b_tail_box_rows(n), wide_rows, "{n}");
        }
        for v in &VARIANTS {
            let c = v.config;
            for n in (8..=1200).step_by(8) {
                let rows = c.b_tail_box_rows(n);
                if c.cluster_m == 1 {
                    // Whole swizzle atoms within the slot, covering every column of the last
                    // n-tile.
                    let last = n - (n - 1) / c.block_n * c.block_n;
                    assert!(
                        rows % 8 == 0 && rows <= c.block_n && rows >= last,
                        "{} {n}",
                        v.name
                    );
                } else {
                    assert_eq!((BLOCK_K, rows), c.b_box(), "{} {n}", v.name);
                }
            }
        }
    }

    #[test]
    fn parameter_block_layout_is_stable() {
        // The host passes the struct's bytes; the PTX declares a .param of this size.
        assert_eq!(core::mem::size_of::<StageHook>(), 48 + 64);
        assert_eq!(core::mem::size_of::<SplitParams>(), 16);
        assert_eq!(
            core::mem::size_of::<GemmParams>(),
            512 + 32 + 48 + 48 + 64 + 16 + 16
        );
        assert_eq!(core::mem::align_of::<GemmParams>(), 16);
        assert_eq!(core::mem::offset_of!(GemmParams, maps), 0);
    }
}
