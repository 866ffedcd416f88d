//! The table: every preset × schedule row, verdicts and the result files.

use crate::contenders::{Ctx, single_gpu};
use crate::diagnose::{COPY_CAP, POWER_SAMPLE_PERIOD};
use crate::family::{FamilyTimings, family_timings, resolve_auto};
use distgemm::baseline::NcclElement;
use distgemm::cuda::ScheduleChoice;
use distgemm::problem::Preset;
use distgemm::schedule::ScheduleKind;
use distgemm_benches::distgemm_report::{
    Diagnostic, Record, TABLE_HEADER, TORCH_AG, TorchResults, all_rows, missing_notes,
    nccl_kind_of, overhead_split, power_split, presets, results_stem, row_family, row_id, row_name,
    table_row, torch_op_of, verdicts,
};
use distgemm_benches::{BenchError, Provenance, ROUNDS, Timing, results_dir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Measures every selected row of `preset`.
pub(crate) fn preset_rows<T: NcclElement>(
    ctx: &Ctx,
    preset: Preset,
    tp: usize,
    torch: &TorchResults,
    prov: &Provenance,
) -> Vec<Record> {
    let o = &ctx.opts;
    let problem = preset.problem(o.tokens).with_dtype(o.dtype);
    let rows: Vec<ScheduleChoice> = all_rows()
        .into_iter()
        .filter(|s| {
            o.filter
                .as_ref()
                .is_none_or(|f| row_id(preset, *s).contains(f.as_str()))
        })
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    println!("== {} (M={}, TP={tp})", preset.name(), o.tokens);
    let (m, n, k) = (problem.m as u64, problem.n as u64, problem.k as u64);
    let (a_ours, a_cublas) = single_gpu::<T>(ctx, (m, n, k));
    // (b), (c), (d) and (e) per family, each family's contenders timed together (rs-a and rs-b
    // measure the same (e), each in its own family's rounds).
    let mut families: HashMap<ScheduleKind, FamilyTimings> = HashMap::new();
    for family in rows.iter().map(|&s| row_family(s)) {
        families
            .entry(family)
            .or_insert_with(|| family_timings::<T>(ctx, family, problem, tp));
    }
    let mut out = Vec::new();
    for sched in rows {
        let mut r = Record {
            preset: preset.name().into(),
            tp,
            schedule: row_name(sched),
            schedule_full: match sched {
                ScheduleChoice::Fixed(k) => k.full_name().to_owned(),
                ScheduleChoice::Auto(f) => format!("Auto within {}", f.full_name()),
            },
            m: problem.m,
            n: problem.n,
            k: problem.k,
            dtype: o.dtype.name().into(),
            machine: prov.gpu.clone(),
            driver: prov.driver.clone(),
            commit: prov.commit.clone(),
            date: prov.date.clone(),
            ..Default::default()
        };
        r.single_gpu_ours_ms = r
            .set("single_gpu_ours_ms", &a_ours)
            .map(|t: Timing| t.median_ms);
        r.single_gpu_cublas_ms = r
            .set("single_gpu_cublas_ms", &a_cublas)
            .map(|t: Timing| t.median_ms);
        // `Auto` is resolved by the runtime's (pure) rule, and the chosen schedule's
        // measurement is reused: the graphs would be identical.
        let chosen = match sched {
            ScheduleChoice::Fixed(k) => Ok(k),
            ScheduleChoice::Auto(f) => resolve_auto::<T>(ctx, f, problem, tp),
        };
        if let ScheduleChoice::Auto(_) = sched {
            r.auto_choice = r
                .set("auto_choice", &chosen)
                .map(|k| k.cli_name().to_owned());
        }
        let family = &families[&row_family(sched)];
        let d = chosen.clone().and_then(|k| {
            family
                .distgemm
                .get(&k)
                .cloned()
                .unwrap_or_else(|| Err(format!("{} is not in the family", k.cli_name())))
        });
        if let Some(t) = r.set("distgemm_ms", &d) {
            r.distgemm_ms = Some(t.median_ms);
            r.distgemm_min_ms = Some(t.min_ms);
            r.distgemm_max_ms = Some(t.max_ms);
            r.distgemm_reps = Some(t.samples_ms.len());
            r.distgemm_per_rep_max_ms = Some(t.per_rep_max_median_ms);
            r.device_medians_ms.distgemm = t.device_medians_ms();
        }
        // (b), (c), (e), (f) of the family (the chosen schedule's, which is in the family).
        let kind = chosen.unwrap_or(row_family(sched));
        if let Some((t, s)) = r.set("single_stage_nocomm_ms", &family.single_stage_nocomm) {
            r.single_stage_nocomm_ms = Some(t.median_ms);
            r.device_medians_ms.single_stage_nocomm = t.device_medians_ms();
            r.single_stage_shape = Some(s);
        }
        if let Some((t, s)) = r.set("pipelined_nocomm_ms", &family.pipelined_nocomm) {
            r.pipelined_nocomm_ms = Some(t.median_ms);
            r.device_medians_ms.pipelined_nocomm = t.device_medians_ms();
            r.pipelined_stage_shapes = Some(s);
        }
        r.nccl_cublas_variant = Some(nccl_kind_of(row_family(sched)).name().into());
        r.nccl_cublas_ms = r
            .set("nccl_cublas_ms", &family.nccl_cublas)
            .map(|t: Timing| t.median_ms);
        let op = torch_op_of(kind);
        r.torch_async_tp_op = Some(op.into());
        r.torch_async_tp_ms = r.set(
            "torch_async_tp_ms",
            &torch.get(preset.name(), problem.m, op),
        );
        let (nccl_op, local_op) = if op == TORCH_AG {
            ("nccl_all_gather+matmul", "matmul_ag_local")
        } else {
            ("matmul+nccl_reduce_scatter", "matmul_rs_local")
        };
        r.torch_nccl_matmul_ms = torch.get(preset.name(), problem.m, nccl_op).ok();
        r.torch_matmul_local_ms = torch.get(preset.name(), problem.m, local_op).ok();
        if kind.is_pipelined() {
            r.power = family.power.clone();
            for (name, timing) in &family.diagnostics {
                if let Some(t) = r.set(name, timing) {
                    r.diagnostics.push(Diagnostic {
                        name: (*name).into(),
                        ms: t.median_ms,
                        device_medians_ms: t.device_medians_ms(),
                    });
                }
            }
        }
        r.derive();
        print!("{}", table_row(&r));
        out.push(r);
    }
    out
}

pub(crate) fn write_outputs(
    stem: &str,
    json: &str,
    md: &str,
) -> Result<(PathBuf, PathBuf), BenchError> {
    let dir = results_dir();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let jp = dir.join(format!("{stem}.json"));
    let mp = dir.join(format!("{stem}.md"));
    std::fs::write(&jp, json).map_err(io(&jp))?;
    std::fs::write(&mp, md).map_err(io(&mp))?;
    Ok((jp, mp))
}

pub(crate) fn table<T: NcclElement>(
    ctx: &Ctx,
    tp: usize,
    torch: &TorchResults,
    prov: &Provenance,
) -> Result<(), BenchError> {
    print!("{TABLE_HEADER}");
    let mut records = Vec::new();
    for preset in presets(ctx.opts.quick) {
        records.extend(preset_rows::<T>(ctx, preset, tp, torch, prov));
    }
    if records.is_empty() {
        println!(
            "distgemm bench: no row matches the filter {:?}",
            ctx.opts.filter
        );
        return Ok(());
    }
    let verdict = verdicts(&records);
    let notes = missing_notes(&records);
    println!("\n{verdict}");
    if !notes.is_empty() {
        println!("missing columns:\n{notes}");
    }
    let mut md = format!(
        "# distgemm vs single-GPU GEMM, NCCL + cuBLAS and PyTorch async-TP\n\n\
         Machine: {} × {tp}, {}. Date: {}. Commit: {}. M = {} tokens, {}, TP = {tp}.\n\
         PyTorch: {}.\n\n\
         (a) full GEMM on one GPU; (b) the family's single-stage local GEMM, no communication; \
         (c) the family's P pipelined stage GEMMs back to back, no communication; (d) distgemm; \
         (e) NCCL collective + cuBLASLt in sequence; (f) PyTorch symm_mem fused op. \
         % of (b)/(c) = (b)/(d), (c)/(d); ×(e), ×(f) = speed-up of (d). (b)-(f) run on all TP \
         GPUs; a time is the slowest device's median repetition (distgemm::timing: devices \
         that meet at a barrier every run make each other wait, so the median of each \
         repetition's slowest device counts a slow device's excess twice; that statistic is \
         `distgemm_per_rep_max_ms` in the JSON, and PyTorch's `ms_per_call_max`). Every timed block \
         starts with ≥ {settle:.0} ms of untimed work (a GPU that idled runs at boost clock \
         at first); a family's (b), (c), (d) and (e) are timed together in interleaved rounds \
         on all TP GPUs; PyTorch settles and interleaves the same way (--settle-ms {settle:.0} \
         --rounds {ROUNDS}: its fused op and its local matmul take turns).\n\n",
        prov.gpu,
        prov.driver,
        prov.date,
        prov.commit,
        ctx.opts.tokens,
        ctx.opts.dtype.name(),
        torch
            .info
            .as_ref()
            .map_or_else(|| "did not run".into(), |v| v.to_string()),
        settle = ctx.opts.settle_ms,
    );
    md.push_str(TABLE_HEADER);
    for r in &records {
        md.push_str(&table_row(r));
    }
    md.push_str(&format!("\n## Verdicts (issue 6)\n\n{verdict}"));
    let split = overhead_split(&records);
    if !split.is_empty() {
        println!("\n{split}");
        md.push_str(&format!(
            "\n## Where the overhead over (c) goes (pipelined schedules; all-gather copies cut to {COPY_CAP} B; per-device medians in brackets)\n\n{split}"
        ));
    }
    let power = power_split(&records);
    if !power.is_empty() {
        println!("\n{power}");
        md.push_str(&format!(
            "\n## SM clock and board power per contender (NVML every {} ms over the timed part of its blocks; power is a one-second average; per device)\n\n{power}",
            POWER_SAMPLE_PERIOD.as_millis()
        ));
    }
    if !notes.is_empty() {
        md.push_str(&format!("\n## Missing columns\n\n{notes}"));
    }
    let stem = results_stem("distgemm", &prov.date, &prov.commit, &ctx.opts);
    let (jp, mp) = write_outputs(
        &stem,
        &(serde_json::to_string_pretty(&records)? + "\n"),
        &md,
    )?;
    println!("wrote {} and {}", jp.display(), mp.display());
    Ok(())
}
