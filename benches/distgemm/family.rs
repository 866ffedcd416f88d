//! A schedule family's contenders, timed together in interleaved rounds.

use crate::contenders::{
    Block, Ctx, dist_shards, distgemm_block, err, nccl_block, plan_gemms_block,
};
use crate::diagnose::{DIAGNOSTICS, POWER_SAMPLE_PERIOD, SCATTER_DIAGNOSTICS, Variant};
use distgemm::baseline::NcclElement;
use distgemm::cuda::{DistGemm, TimingDiagnostics};
use distgemm::problem::Problem;
use distgemm::schedule::{Collective, ScheduleKind};
use distgemm_benches::distgemm_report::{ContenderPower, nccl_kind_of};
use distgemm_benches::energy::{ClockPower, PowerSampler, power_skip};
use distgemm_benches::{MIN_TIMED_REPS, ROUNDS, Timing, TimingConfig, interleaved};
use std::collections::HashMap;

/// (b), (c), (d) and (e) of one schedule family, timed together on all TP GPUs in interleaved
/// rounds (each round a block of a third of the repetitions, at least [`MIN_TIMED_REPS`],
/// after `--settle-ms` of untimed launches): the ratios (b)/(d), (c)/(d) and (e)/(d) then
/// compare measurements taken under the same drift of clocks and power, not minutes apart.
pub(crate) struct FamilyTimings {
    /// (b): the single-stage schedule's GEMM without communication, and its shape.
    pub(crate) single_stage_nocomm: Result<(Timing, String), String>,
    /// (c): the pipelined schedule's stage GEMMs without communication, and their shapes.
    pub(crate) pipelined_nocomm: Result<(Timing, String), String>,
    /// (d) of the family's pipelined and single-stage schedules.
    pub(crate) distgemm: HashMap<ScheduleKind, Result<Timing, String>>,
    /// (e): the family's NCCL collective + cuBLASLt ([`nccl_kind_of`]).
    pub(crate) nccl_cublas: Result<Timing, String>,
    /// With `--diagnose`: the [`DIAGNOSTICS`] (all-gather families) or the
    /// [`SCATTER_DIAGNOSTICS`] (reduce-scatter families) of the pipelined schedule.
    pub(crate) diagnostics: Vec<(&'static str, Result<Timing, String>)>,
    /// With `--diagnose`: every contender's mean SM clock and board power per device over its
    /// blocks, by name.
    pub(crate) power: Vec<ContenderPower>,
}

pub(crate) fn family_timings<T: NcclElement>(
    ctx: &Ctx,
    family: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> FamilyTimings {
    let (piped, single) = (family.pipelined(), family.single_stage());
    let mut shapes = [String::new(), String::new()];
    // With --diagnose, the family's diagnostic variants of its pipelined schedule too.
    let variants: &[(&str, Variant)] = match (ctx.opts.diagnose, family.collective()) {
        (false, _) => &[],
        (true, Collective::AllGather) => &DIAGNOSTICS,
        (true, Collective::ReduceScatter) => &SCATTER_DIAGNOSTICS,
    };
    // The operands of every (d) contender, in the order they are prepared below; each
    // `DistGemm` borrows its own.
    let dist_variants = variants
        .iter()
        .filter(|(_, v)| matches!(v, Variant::Dist(_)));
    let shard_sets: Vec<_> = [piped, single]
        .into_iter()
        .chain(dist_variants.map(|_| piped))
        .map(|kind| dist_shards::<T>(ctx, kind, problem, tp))
        .collect();
    let mut shard_sets = shard_sets.iter();
    let mut dist_block = |kind, diagnostics| {
        let shards = shard_sets.next().expect("one shard set per (d) contender");
        shards
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|shards| distgemm_block::<T>(ctx, shards, kind, problem, tp, diagnostics))
    };
    let mut prepared: Vec<Result<(Block<'_>, TimingConfig), String>> = Vec::new();
    for (i, kind) in [single, piped].into_iter().enumerate() {
        prepared.push(plan_gemms_block::<T>(ctx, kind, problem, tp, None).map(
            |(block, timing, shape)| {
                shapes[i] = shape;
                (block, timing)
            },
        ));
    }
    for kind in [piped, single] {
        prepared.push(dist_block(kind, TimingDiagnostics::default()));
    }
    prepared.push(nccl_block::<T>(ctx, nccl_kind_of(family), problem, tp));
    for (_, variant) in variants {
        prepared.push(match variant {
            Variant::NocommGraphs(extra) => {
                plan_gemms_block::<T>(ctx, piped, problem, tp, Some(*extra))
                    .map(|(block, timing, _)| (block, timing))
            }
            Variant::Dist(diagnostics) => dist_block(piped, *diagnostics),
        });
    }
    // With --diagnose, what clock and power every contender's blocks ran at.
    let bus_ids: Vec<String> = ctx.gpus[..tp]
        .iter()
        .map(|g| g.pci_bus_id().to_owned())
        .collect();
    // Per contender, every device's means so far; None once a sampler failed.
    let mut power = vec![Some(vec![ClockPower::default(); tp]); prepared.len()];
    // Every block starts with ≥ --settle-ms of untimed launches (the warm-up of `timing_for`):
    // a (d) block timed straight after a GPU had idled caught it waking up (samples up to
    // 1.4× the median in a first interleaved run).
    let samples = interleaved(prepared.len(), ROUNDS, |c, _round| {
        let (block, timing) = prepared[c].as_mut().map_err(|e| e.clone())?;
        let round_timing = TimingConfig {
            warmup: timing.warmup,
            reps: (timing.reps / ROUNDS).max(MIN_TIMED_REPS),
        };
        let sampler = ctx.opts.diagnose.then(|| {
            PowerSampler::start(
                bus_ids.clone(),
                POWER_SAMPLE_PERIOD,
                power_skip(ctx.opts.settle_ms),
            )
        });
        let timed = block(round_timing).map(|t| t.per_device_ms);
        if let Some(sampler) = sampler {
            power[c] = power[c]
                .take()
                .zip(sampler.finish().ok())
                .map(|(sofar, block)| {
                    sofar
                        .into_iter()
                        .zip(block)
                        .map(|(a, b)| a.merged(b))
                        .collect()
                });
        }
        timed
    });
    let mut names = vec![
        "(b)".to_owned(),
        "(c)".to_owned(),
        format!("(d) {}", piped.cli_name()),
        format!("(d) {}", single.cli_name()),
        "(e)".to_owned(),
    ];
    names.extend(variants.iter().map(|(name, _)| (*name).to_owned()));
    let power = if ctx.opts.diagnose {
        names
            .into_iter()
            .zip(power)
            .filter_map(|(name, p)| {
                let p = p.filter(|p| p.iter().any(|x| x.samples > 0))?;
                Some(ContenderPower {
                    name,
                    sm_mhz: p.iter().map(|x| x.sm_mhz).collect(),
                    watts: p.iter().map(|x| x.watts).collect(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut timings = samples
        .into_iter()
        .map(|s| s.and_then(|s| Timing::from_devices(s).map_err(err)));
    let mut next = || timings.next().expect("one timing per contender");
    let [b_shape, c_shape] = shapes;
    let b = next().map(|t| (t, b_shape));
    let c = next().map(|t| (t, c_shape));
    let distgemm = HashMap::from([(piped, next()), (single, next())]);
    FamilyTimings {
        single_stage_nocomm: b,
        pipelined_nocomm: c,
        distgemm,
        nccl_cublas: next(),
        diagnostics: variants.iter().map(|(name, _)| (*name, next())).collect(),
        power,
    }
}

/// The schedule distgemm's `Auto` picks in `family` for `problem` (pure: the cost model).
pub(crate) fn resolve_auto<T: NcclElement>(
    ctx: &Ctx,
    family: ScheduleKind,
    problem: Problem,
    tp: usize,
) -> Result<ScheduleKind, String> {
    DistGemm::builder()
        .devices(ctx.gpus[..tp].to_vec())
        .tp(tp)
        .auto_schedule(family)
        .problem(problem)
        .dtype(T::DTYPE)
        .resolved_schedule()
        .map_err(err)
}
