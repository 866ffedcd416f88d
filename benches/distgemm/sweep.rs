//! `--sweep`: the token sweep over 70B fc1/fc2, where pipelining stops paying (issue 6,
//! item 6).

use crate::contenders::{Ctx, dist_shards, distgemm_block, nccl_block, one_block};
use crate::family::resolve_auto;
use crate::table::write_outputs;
use distgemm::baseline::NcclElement;
use distgemm::cuda::TimingDiagnostics;
use distgemm::problem::Preset;
use distgemm::schedule::ScheduleKind;
use distgemm_benches::distgemm_report::{
    SWEEP_TOKENS, SweepPoint, ms, nccl_kind_of, pipelining_threshold, results_stem,
};
use distgemm_benches::{BenchError, Provenance};
use std::collections::BTreeMap;

pub(crate) fn sweep<T: NcclElement>(
    ctx: &Ctx,
    tp: usize,
    prov: &Provenance,
) -> Result<(), BenchError> {
    let o = &ctx.opts;
    let mut points = Vec::new();
    let mut md = format!(
        "# distgemm token sweep: where pipelining stops paying\n\n\
         Machine: {} × {tp}, {}. Date: {}. Commit: {}. {}, TP = {tp}. Times in ms (the slowest \
         device's median; every timed block starts with ≥ {settle:.0} ms of untimed work). \
         (e) = NCCL collective + cuBLASLt in sequence.\n\n",
        prov.gpu,
        prov.driver,
        prov.date,
        prov.commit,
        o.dtype.name(),
        settle = o.settle_ms,
    );
    for preset in [Preset::Llama3_70bFc1, Preset::Llama3_70bFc2] {
        if o.filter
            .as_ref()
            .is_some_and(|f| !format!("distgemm/{}", preset.name()).contains(f.as_str()))
        {
            continue;
        }
        // The preset's natural family: all-gather of A for fc1, reduce-scatter of rows for fc2.
        let family = if preset.name().ends_with("fc1") {
            ScheduleKind::AllGatherRotatingA
        } else {
            ScheduleKind::ReduceScatterTilingA
        };
        let natural = nccl_kind_of(family);
        let header = format!(
            "## {} (family {family}: {family} vs {single} vs (e) {})\n\n| M | {family} ms | {single} ms | (e) ms | auto picks | auto ms | pipelining pays | auto follows | best pipelined (any family) | ms |\n|---:|---:|---:|---:|---|---:|---|---|---|---:|\n",
            preset.name(),
            natural.name(),
            family = family.cli_name(),
            single = family.single_stage().cli_name(),
        );
        print!("\n{header}");
        md.push_str(&header);
        let mut rows = Vec::new();
        for &m in &SWEEP_TOKENS {
            let problem = preset.problem(m).with_dtype(o.dtype);
            let mut p = SweepPoint {
                preset: preset.name().into(),
                tp,
                m,
                n: problem.n,
                k: problem.k,
                dtype: o.dtype.name().into(),
                nccl_cublas_variant: natural.name().into(),
                machine: prov.gpu.clone(),
                commit: prov.commit.clone(),
                date: prov.date.clone(),
                ..Default::default()
            };
            p.family = family.cli_name().into();
            for kind in ScheduleKind::ALL {
                let timed = dist_shards::<T>(ctx, kind, problem, tp).and_then(|shards| {
                    let block = distgemm_block::<T>(
                        ctx,
                        &shards,
                        kind,
                        problem,
                        tp,
                        TimingDiagnostics::default(),
                    );
                    block.and_then(one_block)
                });
                match timed {
                    Ok(t) => {
                        p.schedules_ms
                            .insert(kind.cli_name().into(), Some(t.median_ms));
                    }
                    Err(e) => {
                        p.schedules_ms.insert(kind.cli_name().into(), None);
                        p.missing.insert(kind.cli_name().into(), e);
                    }
                }
            }
            match resolve_auto::<T>(ctx, family, problem, tp) {
                Ok(k) => p.auto_choice = Some(k.cli_name().into()),
                Err(e) => {
                    p.missing.insert("auto".into(), e);
                }
            }
            match nccl_block::<T>(ctx, natural, problem, tp).and_then(one_block) {
                Ok(t) => p.nccl_cublas_ms = Some(t.median_ms),
                Err(e) => {
                    p.missing.insert("nccl_cublas_ms".into(), e);
                }
            }
            p.derive();
            let yes_no = |v: Option<bool>| v.map_or("—", |b| if b { "yes" } else { "no" });
            let line = format!(
                "| {m} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                ms(p.family_pipelined_ms),
                ms(p.family_single_stage_ms),
                ms(p.nccl_cublas_ms),
                p.auto_choice.as_deref().unwrap_or("?"),
                ms(p.auto_ms),
                yes_no(p.pipelining_pays),
                yes_no(p.auto_follows),
                p.best_pipelined.as_deref().unwrap_or("—"),
                ms(p.best_pipelined_ms),
            );
            print!("{line}");
            md.push_str(&line);
            rows.push((m, p.pipelining_pays, p.auto_follows));
            points.push(p);
        }
        let threshold = pipelining_threshold(
            &rows
                .iter()
                .map(|&(m, pays, _)| (m, pays))
                .collect::<Vec<_>>(),
        );
        let follows: Vec<usize> = rows
            .iter()
            .filter(|r| r.2 == Some(false))
            .map(|r| r.0)
            .collect();
        let known = rows.iter().any(|r| r.1.is_some());
        let summary = format!(
            "\n{}: {}; {}\n\n",
            preset.name(),
            match (known, threshold) {
                (false, _) => "pipelining could not be judged (no distgemm times)".to_owned(),
                (true, Some(t)) => format!("pipelining pays from M = {t} upwards"),
                (true, None) => "pipelining does not pay at the largest M measured".to_owned(),
            },
            if rows.iter().all(|r| r.2.is_none()) {
                "auto could not be judged".to_owned()
            } else if follows.is_empty() {
                "auto is within 3 % of the fastest of (family pipelined, family single-stage, (e)) at every M".to_owned()
            } else {
                format!("auto is more than 3 % slower than the fastest option at M = {follows:?}")
            }
        );
        print!("{summary}");
        md.push_str(&summary);
    }
    if points.is_empty() {
        println!(
            "distgemm bench: no sweep preset matches the filter {:?}",
            o.filter
        );
        return Ok(());
    }
    let notes: BTreeMap<String, usize> = points
        .iter()
        .flat_map(|p| p.missing.values().cloned())
        .fold(BTreeMap::new(), |mut acc, why| {
            *acc.entry(why).or_default() += 1;
            acc
        });
    if !notes.is_empty() {
        md.push_str("## Missing measurements\n\n");
        for (why, count) in notes {
            let line = format!("- {why} ({count}×)\n");
            print!("{line}");
            md.push_str(&line);
        }
    }
    let stem = results_stem("distgemm-sweep", &prov.date, &prov.commit, o);
    let (jp, mp) = write_outputs(&stem, &(serde_json::to_string_pretty(&points)? + "\n"), &md)?;
    println!("wrote {} and {}", jp.display(), mp.display());
    Ok(())
}
