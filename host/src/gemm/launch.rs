//! Preparing and launching the GEMM stage kernel on one GPU.
use super::choose::{
    choose_fp8_variant, choose_variant_for, raster_group_m, split_grid, tile_count,
};
use super::{Fp8GemmArgs, GemmArgs, GemmError, MatrixView, SectorAlignment, check};
use crate::dtype::Dtype;
use crate::fp8::ScaleMode;
use crate::runtime::{
    CudaStream, DeviceBuffer, Gpu, Kernel, KernelArgs, L2Promotion, LaunchConfig, Module,
    RawStream, RuntimeError, Swizzle, TensorMap2d, TensorMapDtype, TensorMapEncoding,
    TensorMapSpec, launch, max_active_clusters,
};
use kernels_gpu::gemm_abi::{
    self, GemmParams, GemmVariant, OperandMaps, RowScales, SplitParams, StageHook, TileConfig,
};
use kernels_gpu::layout::stream_k;
use std::sync::Arc;

/// Errors of preparing or launching a GEMM.
#[derive(Debug, thiserror::Error)]
pub enum GemmLaunchError {
    #[error(transparent)]
    Invalid(#[from] GemmError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// The entry points of one compiled configuration.
struct Compiled {
    variant: &'static GemmVariant,
    bf16: Kernel,
    f16: Kernel,
    /// e4m3 A and B with bf16 C and D, where compiled.
    e4m3: Option<Kernel>,
    /// Clusters (blocks, without clusters) the GPU holds at once: the persistent grid's size.
    resident_clusters: u32,
}

/// The GEMM entry points of one GPU's module: every compiled tile configuration.
pub struct GemmKernel {
    gpu: Gpu,
    compiled: Vec<Compiled>,
}

impl GemmKernel {
    /// Looks up every configuration's entry points in `module` and reserves their shared memory.
    pub fn new(module: &Arc<Module>) -> Result<Self, RuntimeError> {
        let compiled = gemm_abi::VARIANTS
            .iter()
            .map(|variant| {
                let bf16 = module.kernel(variant.kernel_bf16)?;
                let f16 = module.kernel(variant.kernel_f16)?;
                let e4m3 = variant
                    .kernel_e4m3
                    .map(|name| module.kernel(name))
                    .transpose()?;
                for k in [&bf16, &f16].into_iter().chain(e4m3.as_ref()) {
                    k.reserve_dynamic_smem(variant.config.smem_bytes())?;
                }
                let sms = module.gpu().sm_count();
                let cluster = variant.config.cluster_m;
                let resident_clusters = if cluster == 1 {
                    sms
                } else {
                    let probe = launch_config(variant, sms / cluster * cluster, false);
                    max_active_clusters(&bf16, &probe)?.clamp(1, sms / cluster)
                };
                Ok(Compiled {
                    variant,
                    bf16,
                    f16,
                    e4m3,
                    resident_clusters,
                })
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(Self {
            gpu: module.gpu().clone(),
            compiled,
        })
    }

    /// For each tile configuration, how many of its clusters (or blocks) are resident at once.
    pub fn resident_clusters(&self) -> Vec<(&'static str, u32)> {
        self.compiled
            .iter()
            .map(|c| (c.variant.name, c.resident_clusters))
            .collect()
    }

    /// How many clusters (blocks, without clusters) of `variant` the GPU holds at once.
    pub(crate) fn resident_clusters_of(&self, variant: &GemmVariant) -> u32 {
        self.compiled
            .iter()
            .find(|c| c.variant == variant)
            .map_or(1, |c| c.resident_clusters)
    }

    /// The GPU the kernels are loaded on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Validates `args`, picks a tile configuration ([`choose_variant_for`]: the shape and
    /// where the operands' rows start), builds the A and B
    /// tensor maps (uploaded on `stream`) and the parameter block. The views must stay valid
    /// while the prepared GEMM is used.
    pub fn prepare(
        &self,
        stream: &CudaStream,
        args: &GemmArgs,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        let variant = rule_variant(args, None, self.gpu.sm_count());
        self.prepare_variant(stream, args, variant)
    }

    /// Like [`Self::prepare`] with the tile configuration given (an override of the rule).
    pub fn prepare_variant(
        &self,
        stream: &CudaStream,
        args: &GemmArgs,
        variant: &GemmVariant,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        self.prepare_inputs(stream, args, variant, Inputs::Native)
    }

    /// Validates an FP8 GEMM ([`Fp8GemmArgs`]), picks one of the configurations compiled for
    /// e4m3 ([`choose_fp8_variant`]) and prepares it as [`Self::prepare`] does.
    pub fn prepare_fp8(
        &self,
        stream: &CudaStream,
        args: &Fp8GemmArgs,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        let (m, n, k) = (args.a.rows, args.b.rows, args.a.cols);
        let scales = args.scales.mode();
        let variant = choose_fp8_variant(m, n, k.div_ceil(2), self.gpu.sm_count(), scales);
        self.prepare_fp8_variant(stream, args, variant)
    }

    /// Like [`Self::prepare_fp8`] with the tile configuration given; it must be one compiled
    /// for e4m3 ([`GemmVariant::kernel_e4m3`]).
    pub fn prepare_fp8_variant(
        &self,
        stream: &CudaStream,
        args: &Fp8GemmArgs,
        variant: &GemmVariant,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        let (pairs, row_scales) = args.as_pairs()?;
        self.prepare_inputs(stream, &pairs, variant, Inputs::E4m3Pairs(row_scales))
    }

    /// Prepares a distributed stage's GEMM as the CUDA lowering resolved it: a 16-bit GEMM
    /// (`fp8: None`), or an FP8 one already in pair form ([`Fp8GemmArgs::as_pairs`]) with its
    /// row-wise scales (`fp8: Some(..)`, zero addresses for tensor-wise scales, which the
    /// lowering folded into alpha), on the configuration [`rule_variant`] picks.
    pub(crate) fn prepare_stage(
        &self,
        stream: &CudaStream,
        args: &GemmArgs,
        fp8: Option<RowScales>,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        let variant = rule_variant(args, fp8, self.gpu.sm_count());
        let inputs = fp8.map_or(Inputs::Native, Inputs::E4m3Pairs);
        self.prepare_inputs(stream, args, variant, inputs)
    }

    /// Prepares `args` on `variant`'s entry point for `inputs` (see [`Inputs`]).
    fn prepare_inputs(
        &self,
        stream: &CudaStream,
        args: &GemmArgs,
        variant: &GemmVariant,
        inputs: Inputs,
    ) -> Result<PreparedGemm, GemmLaunchError> {
        check(args)?;
        let compiled = self
            .compiled
            .iter()
            .find(|c| c.variant == variant)
            .ok_or_else(|| {
                GemmError::Shape(format!(
                    "tile configuration {} is not compiled",
                    variant.name
                ))
            })?;
        let kernel = match (inputs, args.dtype) {
            (Inputs::Native, Dtype::Bf16) => compiled.bf16.clone(),
            (Inputs::Native, Dtype::F16) => compiled.f16.clone(),
            (Inputs::E4m3Pairs(_), Dtype::Bf16) => compiled.e4m3.clone().ok_or_else(|| {
                GemmError::Shape(format!(
                    "tile configuration {} is not compiled for e4m3 (those that are: {})",
                    variant.name,
                    fp8_variant_names()
                ))
            })?,
            (Inputs::E4m3Pairs(_), Dtype::F16) => {
                return Err(GemmError::Shape(
                    "FP8 GEMMs write bf16 D (an f16 output is not compiled)".into(),
                )
                .into());
            }
        };
        let config = variant.config;
        let (m, n, k) = args.shape();
        if m > u64::from(config.max_rows()) {
            return Err(GemmError::Shape(format!(
                "tile configuration {} serves at most {} rows (M = {m})",
                variant.name,
                config.max_rows()
            ))
            .into());
        }
        let cluster_tiles = cluster_tiles(variant, m, n)?;
        let dtype = match args.dtype {
            Dtype::Bf16 => TensorMapDtype::Bf16,
            Dtype::F16 => TensorMapDtype::F16,
        };
        let spec = |v: &MatrixView, (box_cols, box_rows): (u32, u32), swizzle: Swizzle| {
            TensorMapSpec::new(dtype, v.rows, v.cols, v.ld, box_cols, box_rows)
                .with_swizzle(swizzle)
        };
        // A and B travel by value in the parameter block: encoded only.
        let operand_map = |v: &MatrixView, box_dims: (u32, u32), prefetch_pays: bool| {
            let spec = spec(v, box_dims, Swizzle::B128);
            let on_sectors = v.rows_on_sectors(args.dtype.size_bytes() as u64);
            let spec = spec.with_l2_promotion(l2_promotion(on_sectors, prefetch_pays));
            TensorMapEncoding::new(&self.gpu, v.ptr, spec)
        };
        let (a_prefetch, b_prefetch) = (true, b_prefetch_pays(&config));
        let operands = [
            operand_map(&args.a, config.a_box(), a_prefetch)?,
            operand_map(&args.b, config.b_box(), b_prefetch)?,
        ];
        // The last m-tile's A box stops at M and the last n-tile's B box at N
        // (`TileConfig::a_tail_box_rows`, `b_tail_box_rows`): a map of its own only where the
        // dimension ends inside a tile.
        let tail_map = |v: &MatrixView, full: (u32, u32), tail: (u32, u32), prefetch: bool| {
            (tail != full)
                .then(|| operand_map(v, tail, prefetch))
                .transpose()
        };
        let tail_maps = [
            tail_map(
                &args.a,
                config.a_box(),
                config.a_tail_box(m as u32),
                a_prefetch,
            )?,
            tail_map(
                &args.b,
                config.b_box(),
                config.b_tail_box(n as u32),
                b_prefetch,
            )?,
        ];
        // D and C move in the epilogue's chunks, swizzled as the kernel stages them; the
        // parameter block holds their maps' device addresses.
        let chunk_swizzle = Swizzle::with_span_bytes(config.epilogue_row_bytes())
            .expect("epilogue rows are 64 or 128 bytes");
        let chunk_map = |v: &MatrixView| {
            TensorMap2d::new(
                &self.gpu,
                stream,
                v.ptr,
                spec(v, config.d_box(), chunk_swizzle),
            )
        };
        let (map_d, map_c) = match Epilogue::for_args(args, &config) {
            Epilogue::Registers => (None, None),
            Epilogue::Staged => (Some(chunk_map(&args.d)?), None),
            Epilogue::StagedWithC(c) => (Some(chunk_map(&args.d)?), Some(chunk_map(&c)?)),
        };
        let c = args.c.unwrap_or(MatrixView {
            ptr: 0,
            rows: m,
            cols: n,
            ld: 0,
        });
        // `check` bounded every dimension below 2^31 and leading dimensions are ≥ columns;
        // leading dimensions of C/D must also fit the kernel's 32-bit fields.
        let ld32 = |operand: &'static str, ld: u64| {
            u32::try_from(ld).map_err(|_| GemmError::Alignment {
                operand,
                rule: format!("leading dimension {ld} exceeds 2^32"),
            })
        };
        let mut params = GemmParams {
            maps: operand_maps(&operands, &tail_maps),
            map_d: map_d.as_ref().map_or(0, TensorMap2d::device_address),
            map_c: map_c.as_ref().map_or(0, TensorMap2d::device_address),
            d: args.d.ptr,
            c: c.ptr,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            ldd: ld32("D", args.d.ld)?,
            ldc: ld32("C", c.ld)?,
            alpha: args.alpha,
            beta: args.beta,
            raster_group_m: raster_group_m(variant, m, n, compiled.resident_clusters),
            a_tail_box_rows: config.a_tail_box_rows(m as u32),
            b_tail_box_rows: config.b_tail_box_rows(n as u32),
            hook: StageHook::default(),
            split: SplitParams::default(),
            row_scales: match inputs {
                Inputs::E4m3Pairs(scales) => scales,
                Inputs::Native => RowScales::default(),
            },
        };
        // A persistent grid: at most one block per SM, whole clusters, no more than the tiles;
        // a split-K configuration's grid is the stream-K partition the rule picks
        // (`split_grid`; one block per tile up to the SMs where it finds no split).
        let cluster = config.cluster_m;
        let resident = compiled.resident_clusters;
        let (grid, split) = if config.split_k {
            let grid = split_grid(variant, m, n, k, self.gpu.sm_count())
                .unwrap_or(cluster_tiles)
                .min(resident)
                .max(1);
            let k_blocks = params.k.div_ceil(gemm_abi::BLOCK_K).max(1);
            if !stream_k::fits(cluster_tiles.into(), k_blocks.into(), grid.into()) {
                return Err(GemmError::Shape(format!(
                    "{m}x{n}x{k} is too large for the split-K configuration {} (its {grid} \
                     blocks' shares of the k-blocks need tiles × ⌈K/64⌉ × blocks < 2^32)",
                    variant.name
                ))
                .into());
            }
            let workspace = SplitWorkspace::new(&self.gpu, stream, config, cluster_tiles, grid)?;
            params.split = workspace.params();
            (grid, Some(workspace))
        } else {
            (cluster_tiles.min(resident).max(1) * cluster, None)
        };
        Ok(PreparedGemm {
            kernel,
            variant: compiled.variant,
            params,
            grid,
            operand_maps: operands,
            tail_maps,
            chunk_maps: [map_d, map_c],
            _split: split,
        })
    }
}

/// The cluster tiles of `variant` on an `m × n` output (tiles of `block_m × block_n`, grouped
/// by `cluster_m` along M): the kernel walks them with 32-bit indices, so an output of 2³² or
/// more is refused (`check` bounds each dimension below 2³¹, not their product).
fn cluster_tiles(variant: &GemmVariant, m: u64, n: u64) -> Result<u32, GemmError> {
    let tiles = tile_count(variant, m, n) / u64::from(variant.config.cluster_m);
    u32::try_from(tiles).map_err(|_| {
        GemmError::Shape(format!(
            "{m}x{n} output is {tiles} tiles of {}, more than the kernel's 32-bit tile \
             indices count",
            variant.name
        ))
    })
}

/// Split-K's device memory ([`SplitParams`]): the f32 partial sums of every piece a grid of
/// at most `grid` blocks may cut (slots `t + g`: fewer than `tiles + grid`, so a grid capped
/// later by [`PreparedGemm::cap_grid`] fits too) and the per-tile arrival counters (zeroed
/// here; every launch leaves them zero).
struct SplitWorkspace {
    partials: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
}

impl SplitWorkspace {
    fn new(
        gpu: &Gpu,
        stream: &CudaStream,
        config: gemm_abi::TileConfig,
        tiles: u32,
        grid: u32,
    ) -> Result<Self, RuntimeError> {
        let tile_floats = (config.block_m * config.block_n) as usize;
        let slots = tiles as usize + grid as usize;
        let partials = DeviceBuffer::alloc(gpu, slots * tile_floats)?;
        let mut counters = DeviceBuffer::alloc(gpu, 2 * tiles as usize)?;
        counters.fill_bytes(stream, 0)?;
        Ok(Self { partials, counters })
    }

    fn params(&self) -> SplitParams {
        SplitParams {
            partials: self.partials.device_ptr(),
            counters: self.counters.device_ptr(),
        }
    }
}

/// Which entry point a prepared GEMM runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Inputs {
    /// A and B of `GemmArgs::dtype`.
    Native,
    /// A and B in e4m3, described as 16-bit pairs ([`Fp8GemmArgs::as_pairs`]); C and D bf16;
    /// the row-wise scales, if any.
    E4m3Pairs(RowScales),
}

/// The rule's configuration for `args` (the shape and where the operands' rows start:
/// [`choose_variant_for`]), or, for an FP8 GEMM in pair form with its row-wise scales
/// (`fp8: Some(..)`), [`choose_fp8_variant`]'s. What [`GemmKernel::prepare`] and every
/// distributed stage run; off 32-byte boundaries that may be a 2-block cluster, which a stage
/// runs under its hook's waits and signals and inside a CUDA graph like any other
/// configuration (`gpu_distributed`'s one-GPU tests run such stages).
pub(crate) fn rule_variant(
    args: &GemmArgs,
    fp8: Option<RowScales>,
    sm_count: u32,
) -> &'static GemmVariant {
    let (m, n, k) = args.shape();
    match fp8 {
        None => choose_variant_for(m, n, k, sm_count, SectorAlignment::of(args)),
        Some(rows) => choose_fp8_variant(m, n, k, sm_count, scale_mode(rows)),
    }
}

/// The scale mode of a stage's FP8 inputs in pair form: row-wise where the kernel reads scale
/// vectors (`rows.a != 0`), tensor-wise where the lowering folded the scales into alpha.
fn scale_mode(rows: RowScales) -> ScaleMode {
    if rows.a != 0 {
        ScaleMode::Rowwise
    } else {
        ScaleMode::Tensorwise
    }
}

/// The names of the configurations compiled for e4m3.
fn fp8_variant_names() -> String {
    let names: Vec<&str> = gemm_abi::VARIANTS
        .iter()
        .filter(|v| v.kernel_e4m3.is_some())
        .map(|v| v.name)
        .collect();
    names.join(", ")
}

/// How the kernel writes D, decided by which tensor maps the host gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Epilogue {
    /// Element pairs stored from registers (and C read from global memory).
    Registers,
    /// 64-row chunks staged in shared memory and written with TMA stores.
    Staged,
    /// As `Staged`, with each C chunk first TMA-loaded into the staging buffer.
    StagedWithC(MatrixView),
}

impl Epilogue {
    /// TMA stores write whole 16-byte units: with a ragged N (not a multiple of 8 elements)
    /// they would write into the padding after the last column, so those problems keep the
    /// register path, as do configurations without staging buffers. C goes through TMA too
    /// when it is read at all (`beta != 0`); it may live on a peer GPU (the reduce-scatter
    /// schedules' partial sums).
    fn for_args(args: &GemmArgs, config: &TileConfig) -> Self {
        let (_, n, _) = args.shape();
        match (n.is_multiple_of(8) && config.staged, args.c) {
            (false, _) => Epilogue::Registers,
            (true, Some(c)) if args.beta != 0.0 => Epilogue::StagedWithC(c),
            (true, _) => Epilogue::Staged,
        }
    }
}

/// The launch configuration of `variant` with `grid` blocks.
fn launch_config(variant: &GemmVariant, grid: u32, pdl: bool) -> LaunchConfig {
    let config = variant.config;
    let launch = LaunchConfig::linear(grid, gemm_abi::THREADS)
        .with_dynamic_smem(config.smem_bytes())
        .with_programmatic_serialization(pdl);
    if config.cluster_m > 1 {
        launch.with_cluster((config.cluster_m, 1, 1))
    } else {
        launch
    }
}

/// K-blocks a block's ring must hold for B's loads to drop the 256-byte L2 promotion
/// ([`b_prefetch_pays`]).
const DEEP_RING_K_BLOCKS: u32 = 12;

/// Whether the 256-byte L2 promotion's prefetch pays for B's loads (the weights in every
/// schedule's stage GEMM). 256 bytes make each miss a one-k-block prefetch of the same weight
/// rows, which pays where a block's ring holds few k-blocks (the 128-row tiles' 4–6,
/// `64x128`'s 8: the next k-block's DRAM latency is exposed there). Rings of
/// [`DEEP_RING_K_BLOCKS`] or more (the decode and narrow tiles, 12–22 k-blocks) hide that
/// latency already, and their two- and four-k-block stages request both halves of a 256-byte
/// span together, so the promotion only doubles fills in flight (NOTES step 90: the decode
/// grid 1–5 % faster on them with 128 bytes, the 128-row tiles up to 3 % slower).
fn b_prefetch_pays(config: &TileConfig) -> bool {
    config.stages * config.k_blocks_per_stage < DEEP_RING_K_BLOCKS
}

/// The L2 promotion of the loads of an operand map: 256 bytes where the prefetch pays
/// (`prefetch_pays`) and every row starts on a 32-byte boundary (`rows_on_sectors`, see
/// [`SectorAlignment`]), else 128. Rows 16 bytes off a 32-byte boundary make each 128-byte box
/// row straddle an extra sector, and with 256-byte spans such GEMMs ran 13–14 % slower (NOTES
/// step 92: 7000 × 3000 × 5000 466 against 402 µs).
fn l2_promotion(rows_on_sectors: bool, prefetch_pays: bool) -> L2Promotion {
    if prefetch_pays && rows_on_sectors {
        L2Promotion::B256
    } else {
        L2Promotion::B128
    }
}

/// The parameter block's tensor maps: A's and B's, and each tail map or, where the dimension
/// has none, the whole map again.
fn operand_maps(
    [a, b]: &[TensorMapEncoding; 2],
    [a_tail, b_tail]: &[Option<TensorMapEncoding>; 2],
) -> OperandMaps {
    OperandMaps {
        a: a.words(),
        b: b.words(),
        a_tail: a_tail.as_ref().unwrap_or(a).words(),
        b_tail: b_tail.as_ref().unwrap_or(b).words(),
    }
}

/// A GEMM ready to launch: its kernel, parameter block and grid, and its tensor maps.
pub struct PreparedGemm {
    kernel: Kernel,
    variant: &'static GemmVariant,
    params: GemmParams,
    grid: u32,
    /// A's and B's maps, whose encodings the parameter block carries by value.
    operand_maps: [TensorMapEncoding; 2],
    /// A's map for the last m-tile and B's for the last n-tile where their boxes differ from
    /// the others' (M or N ends inside a tile); otherwise the parameter block carries A's or
    /// B's map twice.
    tail_maps: [Option<TensorMapEncoding>; 2],
    /// D's and C's maps where the epilogue stages them: device copies the parameter block
    /// points to (kept alive here).
    chunk_maps: [Option<TensorMap2d>; 2],
    /// Split-K configurations: the partial sums and counters the parameter block points to.
    _split: Option<SplitWorkspace>,
}

impl PreparedGemm {
    /// The kernel's parameter block.
    pub fn params(&self) -> &GemmParams {
        &self.params
    }

    /// Sets the distributed prologue hook (flags to signal and wait on).
    pub fn set_hook(&mut self, hook: StageHook) {
        self.params.hook = hook;
    }

    /// Points an FP8 GEMM's row-wise scales at new vectors (a distributed stage's rows in the
    /// caller's new scale buffers; the lowering checked them as `prepare_stage` did).
    pub(crate) fn set_row_scales(&mut self, rows: RowScales) {
        self.params.row_scales = rows;
    }

    /// Overrides the rule's band height of the tile order (in cluster tiles, at least 1;
    /// see [`super::choose::raster_group_m`]). Any value is correct; it only changes which
    /// tiles run together, hence L2 reuse.
    pub fn set_raster_group_m(&mut self, group_m: u32) {
        self.params.raster_group_m = group_m.max(1);
    }

    /// Caps the persistent grid at `max_blocks` blocks (rounded down to whole clusters, at
    /// least one cluster). Every tile still runs, since each block loops over tiles with the
    /// grid's stride; fewer run at a time. For ranks that share one GPU, so that every rank's
    /// kernels can be resident together.
    pub fn cap_grid(&mut self, max_blocks: u32) {
        let cluster = self.variant.config.cluster_m.max(1);
        let cap = (max_blocks / cluster).max(1) * cluster;
        self.grid = self.grid.min(cap);
    }

    /// The tile configuration this GEMM runs with.
    pub fn variant(&self) -> &'static GemmVariant {
        self.variant
    }

    /// The kernel this GEMM launches.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Launch configuration: a persistent grid of at most one block per SM, 384 threads each,
    /// in clusters of the configuration's size. With `pdl`, the launch may overlap the previous
    /// kernel in the stream up to the kernel's `griddepcontrol.wait`.
    pub fn launch_config(&self, pdl: bool) -> LaunchConfig {
        launch_config(self.variant, self.grid, pdl)
    }

    /// Points this GEMM at operands at new addresses with the same shapes, leading
    /// dimensions, type and beta (`args` may differ from the prepared ones in addresses and
    /// alpha only; alpha carries an FP8 run's tensor-wise scales): re-encodes the moved tensor
    /// maps — A's and B's into the parameter block, which carries them by value; D's and C's
    /// device copies in place, in stream order on `stream`, so the parameter block keeps
    /// their addresses (they travel from pageable host memory: see
    /// [`crate::runtime::caller_stream::upload_async`]) — and updates the D and C pointers
    /// and alpha. Returns an error, and changes nothing, if anything else differs. A driver
    /// error part-way (encoding or enqueueing a map) may leave some maps moved and the
    /// parameter block not: the call is idempotent, so repeat it with the same `previous` and
    /// `args` before the next launch, or drop the GEMM.
    ///
    /// # Safety
    /// Every launch that uses this GEMM's tensor maps must be enqueued on `stream`, and the
    /// new operands must stay valid for the launches enqueued after this call.
    pub unsafe fn retarget(
        &mut self,
        gpu: &Gpu,
        previous: &GemmArgs,
        args: &GemmArgs,
        stream: RawStream,
    ) -> Result<(), GemmLaunchError> {
        let same_shape =
            |a: &MatrixView, b: &MatrixView| (a.rows, a.cols, a.ld) == (b.rows, b.cols, b.ld);
        let same_c = match (&previous.c, &args.c) {
            (Some(p), Some(c)) => same_shape(p, c),
            (None, None) => true,
            _ => false,
        };
        if previous.dtype != args.dtype
            || previous.beta.to_bits() != args.beta.to_bits()
            || !same_shape(&previous.a, &args.a)
            || !same_shape(&previous.b, &args.b)
            || !same_shape(&previous.d, &args.d)
            || !same_c
        {
            return Err(GemmError::Shape(
                "a pointer update may change addresses and alpha only, not shapes, types or beta"
                    .into(),
            )
            .into());
        }
        check(args)?;
        // Only moved maps are re-encoded: A's and B's on the host (the parameter block
        // carries them by value), D's and C's device copies in stream order.
        let [map_a, map_b] = &mut self.operand_maps;
        let [a_tail, b_tail] = &mut self.tail_maps;
        let a_moved = (args.a.ptr, previous.a.ptr);
        let b_moved = (args.b.ptr, previous.b.ptr);
        let moves = [
            (Some(map_a), a_moved),
            (Some(map_b), b_moved),
            (a_tail.as_mut(), a_moved),
            (b_tail.as_mut(), b_moved),
        ];
        for (map, (base, old)) in moves {
            if let Some(map) = map
                && base != old
            {
                map.retarget(gpu, base)?;
            }
        }
        let targets = [
            Some((args.d.ptr, previous.d.ptr)),
            args.c.zip(previous.c).map(|(c, p)| (c.ptr, p.ptr)),
        ];
        for (map, target) in self.chunk_maps.iter_mut().zip(targets) {
            if let (Some(map), Some((base, old))) = (map.as_mut(), target)
                && base != old
            {
                // SAFETY: the caller's contract (launches on `stream`, operands alive).
                unsafe { map.retarget_async(gpu, base, stream)? };
            }
        }
        self.params.maps = operand_maps(&self.operand_maps, &self.tail_maps);
        self.params.d = args.d.ptr;
        self.params.c = args.c.map_or(0, |c| c.ptr);
        self.params.alpha = args.alpha;
        Ok(())
    }

    /// The kernel arguments (the parameter block by value).
    pub fn kernel_args(&self) -> KernelArgs {
        KernelArgs::new().by_value(&self.params)
    }

    /// Enqueues the GEMM on `stream`.
    ///
    /// # Safety
    /// The operands `prepare` was given (raw device addresses in [`GemmArgs`]) must be live
    /// memory of this GPU holding the matrices their views describe, until the launch has
    /// completed, and nothing else may write D (or read it as C) meanwhile. A split-K
    /// configuration's launches must not run concurrently with each other (launches on one
    /// stream never do, with or without PDL): they share its partial sums and counters.
    pub unsafe fn launch(&self, stream: &CudaStream, pdl: bool) -> Result<(), RuntimeError> {
        let mut args = self.kernel_args();
        // SAFETY: the parameter block matches the kernel's single `GemmParams` parameter; its
        // tensor maps are owned by `self`; the operands are the caller's contract.
        unsafe { launch(&self.kernel, stream, &self.launch_config(pdl), &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(n: u64, beta: f32) -> GemmArgs {
        let mut a = GemmArgs::dense(Dtype::Bf16, 0x1000, 0x2000, 0x3000, (64, n, 64));
        a.beta = beta;
        if beta != 0.0 {
            a.c = Some(MatrixView::dense(0x4000, 64, n));
        }
        a
    }

    #[test]
    fn outputs_of_2_to_the_32_tiles_are_refused_not_wrapped() {
        let wide = crate::gemm::variant_named("128x256").unwrap();
        // 8192 × 8192: 64 × 32 tiles.
        assert_eq!(cluster_tiles(wide, 8192, 8192), Ok(2048));
        // Clusters of two count pairs of m-tiles: 3 m-tiles make 2 cluster rows.
        let c2 = crate::gemm::variant_named("128x256c2").unwrap();
        assert_eq!(cluster_tiles(c2, 3 * 128, 256), Ok(2));
        // Each dimension below 2^31 (what `check` allows), their tiles 2^32 or more.
        let err = cluster_tiles(wide, (1 << 31) - 1, (1 << 31) - 1).unwrap_err();
        assert!(
            matches!(&err, GemmError::Shape(s) if s.contains("32-bit")),
            "{err}"
        );
        // 2^24 m-tiles: 2^8 n-tiles are 2^32 tiles, one fewer fits.
        assert!(cluster_tiles(wide, 128 << 24, 256 << 8).is_err());
        assert_eq!(cluster_tiles(wide, 128 << 24, 255 << 8), Ok(255 << 24));
    }

    #[test]
    fn the_staged_epilogue_needs_whole_16_byte_rows_and_staging_buffers() {
        let tile = &gemm_abi::TILE_128X256;
        assert_eq!(Epilogue::for_args(&args(256, 0.0), tile), Epilogue::Staged);
        assert_eq!(
            Epilogue::for_args(&args(257, 0.0), tile),
            Epilogue::Registers
        );
        assert_eq!(
            Epilogue::for_args(&args(264, 1.0), tile),
            Epilogue::StagedWithC(MatrixView::dense(0x4000, 64, 264))
        );
        assert_eq!(
            Epilogue::for_args(&args(263, 1.0), tile),
            Epilogue::Registers
        );
        // A configuration without staging buffers stores from registers.
        let short = &gemm_abi::TILE_16X128;
        assert_eq!(
            Epilogue::for_args(&args(256, 0.0), short),
            Epilogue::Registers
        );
        assert_eq!(
            Epilogue::for_args(&args(264, 1.0), short),
            Epilogue::Registers
        );
    }

    #[test]
    fn only_deep_rings_drop_the_256_byte_promotion_of_b() {
        // The tiles measured faster with 128 bytes (NOTES step 90) get them, the 128-row
        // tiles and `64x128`, measured slower or level, keep 256.
        let pays = |name| b_prefetch_pays(&crate::gemm::variant_named(name).unwrap().config);
        for name in [
            "16x64t4",
            "16x128t2",
            "16x128ts",
            "64x64k2",
            "64x64k2w1",
            "64x64s",
        ] {
            assert!(!pays(name), "{name}");
        }
        for name in [
            "64x128w1", "64x128s", "64x96k2", "128x128", "128x224", "128x256",
        ] {
            assert!(pays(name), "{name}");
        }
    }

    #[test]
    fn rows_off_32_byte_boundaries_drop_the_256_byte_promotion() {
        let on_sectors = |ptr, ld| {
            MatrixView {
                ptr,
                rows: 64,
                cols: 64,
                ld,
            }
            .rows_on_sectors(2)
        };
        // K = 4992 and 6000: rows on 32-byte boundaries; 5000 and 3000 (≡ 8 mod 16): 16 off;
        // a base 16 bytes off puts every row off; no promotion where the prefetch does not pay.
        let cases = [
            (0x1000, 4992, true, L2Promotion::B256),
            (0x1000, 6000, true, L2Promotion::B256),
            (0x1000, 5000, true, L2Promotion::B128),
            (0x1000, 3000, true, L2Promotion::B128),
            (0x1010, 4992, true, L2Promotion::B128),
            (0x1000, 4992, false, L2Promotion::B128),
        ];
        for (ptr, ld, prefetch_pays, promotion) in cases {
            let got = l2_promotion(on_sectors(ptr, ld), prefetch_pays);
            assert_eq!(got, promotion, "{ptr:#x} {ld} {prefetch_pays}");
        }
    }
}
