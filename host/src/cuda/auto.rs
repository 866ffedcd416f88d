//! `Auto`: choosing, per shape, between the pipelined schedule of a family and its
//! single-stage variant ("collective then GEMM" for all-gather, "GEMM then collective" for
//! reduce-scatter), by a fixed cost model — never by timing, so the choice is deterministic.
//!
//! A family is fixed by the shard layout the user holds (`ag-a` / `ag-a-single` share theirs,
//! and so on), so `Auto` only ever picks between the two schedules of one family.
//!
//! **The rule** (constants in [`MachineModel`], measured on H200: ~650 TFLOP/s for stage-sized
//! GEMMs, ~390 GB/s per peer copy; benches/results/README.md):
//! 1. TP = 1: the pipelined plan is one plain GEMM without communication — take it.
//! 2. A problem whose local GEMM takes less than `tiny_seconds` (30 µs) is "tiny": pipelining
//!    could hide at most that much, which is of the order of its own per-stage overheads, so
//!    take the single-stage variant.
//! 3. Otherwise compare two estimates and pipeline only if that is strictly faster:
//!    - a GEMM of m×n×k is bounded by two times: its *compute* time, the waves of output
//!      tiles that the GEMM's own rule (`crate::gemm::choose_variant`) runs it with, at `F`
//!      FLOP/s on full waves (stage GEMMs that leave SMs idle pay for it, and a narrower tile
//!      that fills the waves better is credited as the launch will use it); and its *memory*
//!      time, its operands read and its output written once at the HBM rate `W`. It takes the
//!      4-norm of the two, `(compute⁴ + memory⁴)^¼`: the larger one when they are far apart,
//!      up to 19 % more when they are equal, since a GEMM near the ridge overlaps its loads
//!      and its math imperfectly. This is what makes a 128-row all-gather stage of 70B fc1
//!      (every stage streams the whole 470 MB B shard for 128 rows of output) slower than
//!      half of the 256-row local GEMM, which reads that shard once for twice the work;
//!    - moving `b` bytes between two GPUs takes `b / BW`;
//!    - pipelined (P stages, per-stage GEMM `g`, per-stage communication `c`): stage 0 runs
//!      uncovered, every later stage takes `max(g, c)` — the overlap
//!      condition `g ≥ c` decides whether the communication is hidden — plus a fixed cost per
//!      hand-off `h`: `g + (P−1)·(max(g, c) + h)`. `h` depends on the collective: an
//!      all-gather stage waits only for a copy that ran long before; a reduce-scatter stage
//!      waits for the left neighbour's previous stage to finish (any skew between the devices
//!      is exposed) and reads its partial over NVLink in the epilogue;
//!    - single-stage: one GEMM of the local shape `G` plus all communication, unhidden, plus
//!      the one hand-off between the collective and the GEMM `h₁` (the GEMM, or the
//!      reduction, waits for a flag that the other side sets when it is done):
//!      `G + (P−1)·c + h₁`.
//!
//! Ties go to the single-stage variant, so a small problem never runs slower than the plain
//! "collective then GEMM" approach by the model's account.
//!
//! **Measured choices first.** [`choose_schedule_tuned`] takes a tuning table
//! ([`super::tuning`], written by `distgemm tune`): when an entry matches the GPU, TP, problem
//! kind, family, N and K (the problem's token bucket, else one an octave away), its measured
//! choice runs; otherwise the rule does. [`Resolution::source`] says which decided. Both are
//! pure functions of the table's contents, so ranks reading the same table agree.

use std::fmt;

use super::tuning::{LoadedTable, TuningKey};
use crate::gemm::{choose_variant, estimated_cost};
use crate::problem::Problem;
use crate::schedule::{Collective, RsPartials, ScheduleKind, can_implement};

/// The GPU `Auto` assumes when it is given none (planning without a GPU): the one its model
/// was measured on, by the name the driver gives it.
pub const ASSUMED_GPU_NAME: &str = "NVIDIA H200";

/// The machine constants of the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineModel {
    /// Dense GEMM rate at full wave efficiency, FLOP/s.
    pub gemm_flops: f64,
    /// Rate at which a GEMM streams its operands from and its output to HBM, bytes/s.
    pub hbm_bandwidth: f64,
    /// Peer-to-peer bandwidth of one pull, bytes/s.
    pub peer_bandwidth: f64,
    /// SMs.
    pub sm_count: u32,
    /// Fixed cost of one all-gather stage hand-off (kernel boundary + copy flag), seconds.
    pub gather_stage_overhead: f64,
    /// Fixed cost of one reduce-scatter stage hand-off (kernel boundary, the wait for the
    /// left neighbour's previous stage, the partial read remotely in the epilogue), seconds.
    pub scatter_stage_overhead: f64,
    /// Fixed cost of a single-stage schedule's one hand-off between its collective and its
    /// GEMM (either order), seconds.
    pub single_stage_overhead: f64,
    /// Local GEMMs faster than this are never pipelined, seconds.
    pub tiny_seconds: f64,
}

impl MachineModel {
    /// H200 (measured, benches/results/README.md): 650 TFLOP/s stage GEMMs, 390 GB/s peer copies, 132 SMs; HBM at
    /// 3.5 TB/s (a device-to-device copy moves 4.25 TB/s; a GEMM's operand reads
    /// are less regular); a 30 µs "tiny" threshold (an estimate). Hand-offs fitted to the 2×H200
    /// token sweep distgemm-sweep-2026-11-30-3b382b1 (70B fc1 ag-a and 70B fc2 rs-a at
    /// 256–16384 tokens, every block settled for 1 s; kernels-gpu/NOTES.md step 28), so that
    /// the rule picks the faster of the two schedules wherever they differ by more than 1 %.
    /// The earlier sweeps, settled for only 250 ms right after each schedule was built, read
    /// the pipelined schedules up to 16 % slow (step 27) and are not used. What the fit says:
    /// - a pipelined all-gather stage costs 10 µs more than the single-stage hand-off
    ///   (30 µs against 20 µs): its second kernel boundary, another ragged last wave and an L2
    ///   that the previous stage filled with other operands; at 512 tokens of 70B fc1 that
    ///   makes single-stage faster (measured 0.397 against 0.419 ms) and at 1024 a tie;
    /// - a reduce-scatter stage costs 25 µs more (45 µs): it also waits for the neighbour's
    ///   previous stage and reads its partial over NVLink in the epilogue; pipelining then
    ///   pays from 2048 tokens of 70B fc2 (a tie there, 4 % at 4096).
    pub const H200: MachineModel = MachineModel {
        gemm_flops: 650e12,
        hbm_bandwidth: 3.5e12,
        peer_bandwidth: 390e9,
        sm_count: 132,
        gather_stage_overhead: 30e-6,
        scatter_stage_overhead: 45e-6,
        single_stage_overhead: 20e-6,
        tiny_seconds: 30e-6,
    };

    /// Compute time of an m×n×k GEMM: the waves of the tile configuration the GEMM rule picks
    /// ([`estimated_cost`], in 128×256-tile-equivalent output elements per SM, each tile's
    /// epilogue included), each element `2k` FLOP at `gemm_flops / sm_count` per SM.
    #[must_use]
    pub fn gemm_compute_seconds(&self, m: usize, n: usize, k: usize) -> f64 {
        let sms = self.sm_count.max(1);
        let (m, n, k64) = (m as u64, n as u64, k as u64);
        let elements_per_sm = estimated_cost(choose_variant(m, n, k64, sms), m, n, k64, sms);
        elements_per_sm * 2.0 * k as f64 * f64::from(sms) / self.gemm_flops
    }

    /// Memory time of an m×n×k GEMM of `elem`-byte elements: A (m×k) and B (n×k) read once,
    /// D (m×n) written once, at `hbm_bandwidth`.
    #[must_use]
    pub fn gemm_memory_seconds(&self, m: usize, n: usize, k: usize, elem: usize) -> f64 {
        // In f64: the element counts of any shape, valid or not, cannot overflow it.
        let (m, n, k) = (m as f64, n as f64, k as f64);
        (m * k + n * k + m * n) * elem as f64 / self.hbm_bandwidth
    }

    /// Seconds for an m×n×k GEMM of `elem`-byte elements: the 4-norm of its compute and
    /// memory times (module documentation).
    #[must_use]
    pub fn gemm_seconds(&self, m: usize, n: usize, k: usize, elem: usize) -> f64 {
        let compute = self.gemm_compute_seconds(m, n, k);
        let memory = self.gemm_memory_seconds(m, n, k, elem);
        (compute.powi(4) + memory.powi(4)).powf(0.25)
    }

    /// Fixed cost of one stage hand-off of a `collective` schedule.
    #[must_use]
    pub fn stage_overhead(&self, collective: Collective) -> f64 {
        match collective {
            Collective::AllGather => self.gather_stage_overhead,
            Collective::ReduceScatter => self.scatter_stage_overhead,
        }
    }

    /// Seconds to move `bytes` between two GPUs.
    #[must_use]
    pub fn copy_seconds(&self, bytes: usize) -> f64 {
        bytes as f64 / self.peer_bandwidth
    }
}

/// The choice and the estimates it was made from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoChoice {
    /// The chosen schedule.
    pub schedule: ScheduleKind,
    /// Estimated seconds of the pipelined schedule.
    pub pipelined_seconds: f64,
    /// Estimated seconds of the single-stage schedule.
    pub single_stage_seconds: f64,
}

/// Chooses between the pipelined and the single-stage schedule of `kind`'s family for
/// `problem` on `tp` devices (see the module documentation). Pure and deterministic.
///
/// The problem is validated first: when neither schedule of the family can run it
/// ([`can_implement`]), nothing is estimated (both estimates are NaN, the single-stage
/// schedule is returned) and the plan that follows refuses the problem with the reason. So
/// the model's arithmetic only ever sees dimensions below 2^31 and matrices of at most 2^40
/// elements.
#[must_use]
pub fn choose_schedule(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
    model: &MachineModel,
) -> AutoChoice {
    let (pipelined, single) = kind.family();
    if can_implement(pipelined, problem, tp).is_err() && can_implement(single, problem, tp).is_err()
    {
        return AutoChoice {
            schedule: single,
            pipelined_seconds: f64::NAN,
            single_stage_seconds: f64::NAN,
        };
    }
    let p = tp.max(1);
    let (m, n) = (problem.m, problem.n);
    let elem = problem.dtype.size_bytes();
    // An FP8 problem is modelled as the 16-bit one with half the K, which is how the kernel
    // runs it (A and B as K/2 columns of e4m3 pairs: the same bytes, and a `k32` e4m3 `wgmma`
    // at the rate of a `k16` bf16 one — measured 1300–1530 against 650–710 TFLOP/s,
    // benches/results/gemm-fp8-2026-12-01-90939d6.md): the GEMMs take the time of K/2, an
    // all-gather stage moves `rows · K` bytes, and the reduce-scatter partials keep the
    // output type's size.
    let k = match problem.fp8 {
        Some(_) => problem.k.div_ceil(2),
        None => problem.k,
    };
    // Per-stage GEMM shape and per-stage bytes moved, and the local (single GEMM) shape.
    let (stage, local, stage_bytes) = match (kind.collective(), kind.tiles_rows()) {
        // All-gather: stage (M/P, N/P, K); one stage moves one shard of the rotating operand.
        (Collective::AllGather, true) => ((m / p, n / p, k), (m, n / p, k), (m / p) * k * elem),
        (Collective::AllGather, false) => ((m / p, n / p, k), (m / p, n, k), (n / p) * k * elem),
        // Reduce-scatter: stage (M/P, N, K/P) or (M, N/P, K/P); one stage moves one partial
        // output block.
        (Collective::ReduceScatter, true) => ((m / p, n, k / p), (m, n, k / p), (m / p) * n * elem),
        (Collective::ReduceScatter, false) => {
            ((m, n / p, k / p), (m, n, k / p), m * (n / p) * elem)
        }
    };
    let g = model.gemm_seconds(stage.0, stage.1, stage.2, elem);
    let c = model.copy_seconds(stage_bytes);
    let local_gemm = model.gemm_seconds(local.0, local.1, local.2, elem);
    let hops = (p - 1) as f64;
    let pipelined_seconds = g + hops * (g.max(c) + model.stage_overhead(kind.collective()));
    let single_stage_seconds = local_gemm + hops * c + model.single_stage_overhead;
    let schedule = if p == 1 {
        pipelined
    } else if local_gemm < model.tiny_seconds {
        single
    } else if pipelined_seconds < single_stage_seconds {
        pipelined
    } else {
        single
    };
    AutoChoice {
        schedule,
        pipelined_seconds,
        single_stage_seconds,
    }
}

/// Who decided the schedule that runs.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleSource {
    /// A fixed schedule: no `Auto`.
    Fixed,
    /// `Auto`'s rule: no tuning table, or no entry of it matches.
    Rule,
    /// An entry of a tuning table.
    Tuned {
        /// The table's identity ([`LoadedTable::identity`]: path and content hash).
        table: String,
        /// The entry's key.
        key: TuningKey,
        /// Whether the entry's token bucket is the problem's (else it is a neighbouring one, a
        /// factor of 2 away).
        exact: bool,
    },
}

impl fmt::Display for ScheduleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleSource::Fixed => f.write_str("fixed"),
            ScheduleSource::Rule => f.write_str("rule"),
            ScheduleSource::Tuned { table, key, exact } => {
                let nearest = if *exact { "" } else { ", nearest token bucket" };
                write!(f, "tuned (table {table}: {key}{nearest})")
            }
        }
    }
}

/// A resolved schedule, who decided it and what the rule says.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The schedule that runs.
    pub schedule: ScheduleKind,
    /// Who decided it.
    pub source: ScheduleSource,
    /// The rule's choice and estimates (`None` for a fixed schedule).
    pub rule: Option<AutoChoice>,
    /// How partials move, where a tuning table's entry decided it (its measured choice);
    /// `None` otherwise (the builder's setting, read by default, applies).
    pub rs_partials: Option<RsPartials>,
}

impl Resolution {
    /// The partials mode that runs: the builder's `explicit` setting, else the tuning
    /// table's, else [`RsPartials::Read`].
    #[must_use]
    pub fn rs_partials_with(&self, explicit: Option<RsPartials>) -> RsPartials {
        explicit.or(self.rs_partials).unwrap_or_default()
    }
}

/// [`choose_schedule`], unless `table` has an entry for the problem ([`LoadedTable`]'s
/// lookup on `gpu`, the driver's name of the GPU) whose choice can run it: then that choice,
/// with the entry's partials mode.
/// Pure and deterministic in the table's contents.
#[must_use]
pub fn choose_schedule_tuned(
    kind: ScheduleKind,
    problem: &Problem,
    tp: usize,
    gpu: &str,
    model: &MachineModel,
    table: Option<&LoadedTable>,
) -> Resolution {
    let rule = choose_schedule(kind, problem, tp, model);
    let tuned = table.and_then(|t| {
        let found = t.table.lookup(gpu, tp, kind, problem)?;
        let choice = found.entry.choice;
        (choice.pipelined() == kind.pipelined() && can_implement(choice, problem, tp).is_ok()).then(
            || Resolution {
                schedule: choice,
                source: ScheduleSource::Tuned {
                    table: t.identity(),
                    key: found.entry.key.clone(),
                    exact: found.exact,
                },
                rule: Some(rule),
                rs_partials: Some(found.entry.rs_partials.effective(choice)),
            },
        )
    });
    tuned.unwrap_or(Resolution {
        schedule: rule.schedule,
        source: ScheduleSource::Rule,
        rule: Some(rule),
        rs_partials: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Preset;

    #[test]
    fn problems_no_plan_exists_for_are_not_estimated() {
        // (usize::MAX·64 + …)·2 overflowed in debug builds before the problem was validated.
        for kind in ScheduleKind::ALL {
            let choice = choose_schedule(
                kind,
                &Problem::new(usize::MAX, 64, 64),
                2,
                &MachineModel::H200,
            );
            assert_eq!(choice.schedule, kind.single_stage());
            assert!(choice.pipelined_seconds.is_nan() && choice.single_stage_seconds.is_nan());
        }
        let huge = MachineModel::H200.gemm_memory_seconds(usize::MAX, usize::MAX, 64, 2);
        assert!(huge.is_finite() && huge > 0.0);
    }

    #[test]
    fn large_presets_pipeline_at_tp2() {
        for preset in Preset::ALL {
            let problem = preset.problem(16384);
            for kind in [
                ScheduleKind::AllGatherRotatingA,
                ScheduleKind::ReduceScatterTilingA,
            ] {
                let choice = choose_schedule(kind, &problem, 2, &MachineModel::H200);
                assert!(
                    choice.schedule.is_pipelined(),
                    "{preset} {kind}: {choice:?}"
                );
            }
        }
    }

    /// Asserts which of `kind`'s two schedules the rule picks for `preset` at each token count.
    fn assert_follows(preset: Preset, kind: ScheduleKind, sweep: [(usize, bool); 7]) {
        for (tokens, pipelined) in sweep {
            let problem = preset.problem(tokens);
            let choice = choose_schedule(kind, &problem, 2, &MachineModel::H200);
            assert_eq!(
                choice.schedule.is_pipelined(),
                pipelined,
                "{preset} {tokens} tokens: {choice:?}"
            );
        }
    }

    #[test]
    fn follows_the_measured_token_sweep_of_the_all_gather_family() {
        // 2×H200, 70B fc1, ag-a vs ag-a-single (distgemm-sweep-2026-11-30-3b382b1.md, ms):
        // 0.265/0.223, 0.419/0.397, 0.766/0.761 (a tie), 1.453/1.521, 2.900/3.042,
        // 5.812/5.897, 11.576/12.048.
        assert_follows(
            Preset::Llama3_70bFc1,
            ScheduleKind::AllGatherRotatingA,
            [
                (256, false),
                (512, false),
                (1024, false),
                (2048, true),
                (4096, true),
                (8192, true),
                (16384, true),
            ],
        );
    }

    #[test]
    fn follows_the_measured_token_sweeps_of_the_reduce_scatter_family() {
        // 2×H200, 70B fc2, rs-a vs rs-a-single (distgemm-sweep-2026-11-30-3b382b1.md, ms):
        // 0.194/0.120, 0.217/0.206, 0.392/0.388 (a tie), 0.748/0.752 (a tie), 1.484/1.547,
        // 2.936/3.084, 6.023/6.217.
        assert_follows(
            Preset::Llama3_70bFc2,
            ScheduleKind::ReduceScatterTilingA,
            [
                (256, false),
                (512, false),
                (1024, false),
                (2048, true),
                (4096, true),
                (8192, true),
                (16384, true),
            ],
        );
    }

    /// An FP8 problem is estimated as the 16-bit one with half the K (the kernel's pair
    /// view): the same time for every schedule, so the same choice.
    #[test]
    fn fp8_is_modelled_as_the_16_bit_gemm_of_half_the_k() {
        let m = MachineModel::H200;
        for kind in ScheduleKind::ALL {
            for (tokens, n, k) in [(512, 28672, 8192), (4096, 8192, 28672), (16384, 8192, 8192)] {
                let fp8 = Problem::new(tokens, n, k).with_fp8(crate::fp8::ScaleMode::Tensorwise);
                let half = Problem::new(tokens, n, k / 2);
                let (a, b) = (
                    choose_schedule(kind, &fp8, 4, &m),
                    choose_schedule(kind, &half, 4, &m),
                );
                assert_eq!(a, b, "{kind} {tokens}x{n}x{k}");
            }
        }
    }

    #[test]
    fn tiny_problems_take_the_single_stage_variant() {
        let problem = Problem::new(64, 256, 256);
        for kind in ScheduleKind::ALL {
            let choice = choose_schedule(kind, &problem, 2, &MachineModel::H200);
            assert!(!choice.schedule.is_pipelined(), "{kind}: {choice:?}");
            assert_eq!(choice.schedule.collective(), kind.collective());
            assert_eq!(choice.schedule.tiles_rows(), kind.tiles_rows());
        }
    }

    #[test]
    fn tp1_is_the_plain_gemm() {
        let problem = Problem::new(64, 256, 256);
        let choice = choose_schedule(
            ScheduleKind::AllGatherSingleStageB,
            &problem,
            1,
            &MachineModel::H200,
        );
        assert_eq!(choice.schedule, ScheduleKind::AllGatherRotatingB);
    }

    #[test]
    fn overheads_decide_when_the_stages_are_short() {
        // A mid-sized problem: the per-stage hand-off is what pipelining has to beat.
        let problem = Problem::new(2048, 2048, 2048);
        let choice = choose_schedule(
            ScheduleKind::AllGatherRotatingA,
            &problem,
            8,
            &MachineModel::H200,
        );
        let expected = if choice.pipelined_seconds < choice.single_stage_seconds {
            ScheduleKind::AllGatherRotatingA
        } else {
            ScheduleKind::AllGatherSingleStageA
        };
        assert_eq!(choice.schedule, expected);
        let no_overhead = MachineModel {
            gather_stage_overhead: 0.0,
            ..MachineModel::H200
        };
        let free = choose_schedule(ScheduleKind::AllGatherRotatingA, &problem, 8, &no_overhead);
        assert!(free.pipelined_seconds < choice.pipelined_seconds);
    }

    #[test]
    fn the_choice_is_deterministic_and_stays_in_the_family() {
        for kind in ScheduleKind::ALL {
            let problem = Problem::new(4096, 8192, 4096);
            let a = choose_schedule(kind, &problem, 4, &MachineModel::H200);
            let b = choose_schedule(kind, &problem, 4, &MachineModel::H200);
            assert_eq!(a, b);
            let (p, s) = kind.family();
            assert!(a.schedule == p || a.schedule == s);
        }
    }

    #[test]
    fn wave_efficiency_follows_the_tile_the_gemm_runs_with() {
        let m = MachineModel::H200;
        // The rule's epilogue, 3 k-blocks of main loop per output element, over K = 4096's 64.
        let epilogue = 3.0 / 64.0;
        // 132 tiles of 128×256 are one wave at the full rate, but for the epilogue.
        let full = m.gemm_compute_seconds(128 * 132, 256, 4096);
        let rate = 2.0 * (128.0 * 132.0) * 256.0 * 4096.0 / full;
        assert!(
            (rate * (1.0 + epilogue) / m.gemm_flops - 1.0).abs() < 1e-9,
            "{rate}"
        );
        // 133 such tiles would need two waves, but the rule runs them as 266 tiles of 128×128
        // (three waves of half the area, at 1.06 per element): 1.59×, not 2×.
        let spill = m.gemm_compute_seconds(128 * 133, 256, 4096);
        let expected = 3.0 * (1.06 + epilogue) / (2.0 * (1.0 + epilogue));
        assert!((spill / full - expected).abs() < 1e-9, "{}", spill / full);
    }

    #[test]
    fn thin_gemms_are_bound_by_streaming_their_operands() {
        let m = MachineModel::H200;
        let (n, k) = (28672, 8192);
        // The 128-row stage of 70B fc1 ag-a at 256 tokens streams the whole 470 MB B shard:
        // memory-bound, so two of them cost more than the 256-row local GEMM that reads it once.
        let stage = m.gemm_seconds(128, n, k, 2);
        let local = m.gemm_seconds(256, n, k, 2);
        assert!(m.gemm_memory_seconds(128, n, k, 2) > m.gemm_compute_seconds(128, n, k));
        assert!(2.0 * stage > 1.3 * local, "{stage} {local}");
        // Large GEMMs are compute-bound: the memory term changes them by well under 1 %.
        let big = m.gemm_seconds(8192, n, k, 2);
        assert!(big / m.gemm_compute_seconds(8192, n, k) < 1.001);
        // Equal compute and memory time cost 2^¼ of either.
        let ridge = MachineModel {
            hbm_bandwidth: ((128 * k + n * k + 128 * n) * 2) as f64
                / m.gemm_compute_seconds(128, n, k),
            ..m
        };
        let t = ridge.gemm_seconds(128, n, k, 2);
        assert!((t / m.gemm_compute_seconds(128, n, k) - 2f64.powf(0.25)).abs() < 1e-9);
    }

    /// The token counts of the measured sweeps.
    const SWEEP_TOKENS: [usize; 7] = [256, 512, 1024, 2048, 4096, 8192, 16384];

    fn loaded(entries: Vec<crate::cuda::tuning::TuningEntry>) -> LoadedTable {
        let mut table = crate::cuda::tuning::TuningTable::default();
        for e in entries {
            table.insert(e);
        }
        LoadedTable {
            table,
            path: "tuned.json".into(),
            digest: 0xd15c,
        }
    }

    /// Every preset, schedule, TP and sweep token count: what `table` makes `Auto` run and
    /// who decided.
    fn resolutions(table: Option<&LoadedTable>) -> Vec<(String, Resolution)> {
        let mut all = Vec::new();
        for preset in Preset::ALL {
            for kind in ScheduleKind::ALL {
                for tp in [1, 2, 4, 8] {
                    for tokens in SWEEP_TOKENS {
                        let problem = preset.problem(tokens);
                        let r = choose_schedule_tuned(
                            kind,
                            &problem,
                            tp,
                            ASSUMED_GPU_NAME,
                            &MachineModel::H200,
                            table,
                        );
                        all.push((
                            format!("{preset} {} TP={tp} M={tokens}", kind.cli_name()),
                            r,
                        ));
                    }
                }
            }
        }
        all
    }

    #[test]
    fn without_a_matching_table_the_rule_decides_everywhere() {
        // An entry for another GPU matches nothing.
        let h100 = {
            let mut e = crate::cuda::tuning::tests::fc2_entry(1024, 0.1, 0.2);
            e.key.gpu = "NVIDIA H100 80GB HBM3".into();
            loaded(vec![e])
        };
        for table in [None, Some(&h100)] {
            for (what, r) in resolutions(table) {
                let (preset, kind, tp, tokens) = r_parts(&what);
                let rule = choose_schedule(kind, &preset.problem(tokens), tp, &MachineModel::H200);
                assert_eq!(r.schedule, rule.schedule, "{what}");
                assert_eq!(r.source, ScheduleSource::Rule, "{what}");
                assert_eq!(r.rule, Some(rule), "{what}");
            }
        }
    }

    /// The preset, schedule, TP and tokens of a [`resolutions`] label.
    fn r_parts(what: &str) -> (Preset, ScheduleKind, usize, usize) {
        let words: Vec<&str> = what.split(' ').collect();
        let preset = Preset::ALL
            .into_iter()
            .find(|p| p.name() == words[0])
            .unwrap();
        let kind = ScheduleKind::ALL
            .into_iter()
            .find(|k| k.cli_name() == words[1])
            .unwrap();
        let tp = words[2].trim_start_matches("TP=").parse().unwrap();
        let tokens = words[3].trim_start_matches("M=").parse().unwrap();
        (preset, kind, tp, tokens)
    }

    #[test]
    fn a_table_that_flips_one_bucket_changes_exactly_that_bucket() {
        // 70B fc2, rs-a family, TP 2: an entry per sweep bucket agreeing with the rule (which
        // pipelines from 2048 tokens on), except at 1024 tokens, measured pipelined-faster.
        let entries = SWEEP_TOKENS
            .into_iter()
            .map(|t| {
                let fast_pipe = t >= 1024;
                let (p, s) = if fast_pipe { (0.9, 1.0) } else { (1.0, 0.9) };
                crate::cuda::tuning::tests::fc2_entry(t, p, s)
            })
            .collect();
        let table = loaded(entries);
        let before = resolutions(None);
        let after = resolutions(Some(&table));
        let mut changed = Vec::new();
        for ((what, b), (_, a)) in before.iter().zip(&after) {
            if a.schedule != b.schedule {
                changed.push(what.clone());
            }
            let in_table = what.starts_with("llama3-70b-fc2 rs-a") && what.contains(" TP=2 ");
            assert_eq!(
                matches!(a.source, ScheduleSource::Tuned { exact: true, .. }),
                in_table,
                "{what}: {}",
                a.source
            );
        }
        assert_eq!(
            changed,
            vec![
                "llama3-70b-fc2 rs-a TP=2 M=1024".to_owned(),
                "llama3-70b-fc2 rs-a-single TP=2 M=1024".to_owned()
            ]
        );
        let flipped = &after
            .iter()
            .find(|(w, _)| w == "llama3-70b-fc2 rs-a-single TP=2 M=1024")
            .unwrap()
            .1;
        assert_eq!(flipped.schedule, ScheduleKind::ReduceScatterTilingA);
        assert_eq!(
            flipped.source.to_string(),
            "tuned (table tuned.json#000000000000d15c: NVIDIA H200 TP=2 bf16 rs-a M≈1024 \
             N=8192 K=28672)"
        );
        assert_eq!(
            flipped.rule.unwrap().schedule,
            ScheduleKind::ReduceScatterSingleStageA
        );
    }

    #[test]
    fn a_neighbouring_bucket_applies_a_far_one_does_not_and_a_choice_that_cannot_run_falls_back_to_the_rule()
     {
        let table = loaded(vec![crate::cuda::tuning::tests::fc2_entry(512, 0.9, 1.0)]);
        // A table with only a 16384-token entry says nothing about 256 tokens: the rule.
        let far = loaded(vec![crate::cuda::tuning::tests::fc2_entry(16384, 0.9, 1.0)]);
        let fc2 = Preset::Llama3_70bFc2.problem(256);
        let r = choose_schedule_tuned(
            ScheduleKind::ReduceScatterTilingA,
            &fc2,
            2,
            ASSUMED_GPU_NAME,
            &MachineModel::H200,
            Some(&far),
        );
        assert_eq!(r.source, ScheduleSource::Rule);
        assert_eq!(r.schedule, ScheduleKind::ReduceScatterSingleStageA);
        let r = choose_schedule_tuned(
            ScheduleKind::ReduceScatterTilingA,
            &fc2,
            2,
            ASSUMED_GPU_NAME,
            &MachineModel::H200,
            Some(&table),
        );
        assert_eq!(r.schedule, ScheduleKind::ReduceScatterTilingA);
        assert!(
            r.source.to_string().ends_with(", nearest token bucket)"),
            "{}",
            r.source
        );
        // 201 tokens do not split over 2 devices, so no rs-a schedule runs them; the rule's
        // answer stands (and the plan reports why).
        let odd = Preset::Llama3_70bFc2.problem(201);
        let r = choose_schedule_tuned(
            ScheduleKind::ReduceScatterTilingA,
            &odd,
            2,
            ASSUMED_GPU_NAME,
            &MachineModel::H200,
            Some(&table),
        );
        assert_eq!(r.source, ScheduleSource::Rule);
    }
}
