//! The markdown table, the per-row breakdowns and the verdicts.

use super::NOISE;
use super::record::Record;
use std::collections::BTreeMap;

pub fn ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.3}"))
}

pub fn pct(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.1}"))
}

pub fn times(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}×"))
}

pub const TABLE_HEADER: &str = "| preset | schedule | (a) ours ms | (a) cuBLAS ms | (b) ms | (c) ms | (d) distgemm ms | TFLOP/s/GPU | % of (b) | % of (c) | % of 989 | (e) NCCL+cuBLAS ms | (f) torch async-TP ms | ×(e) | ×(f) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

pub fn table_row(r: &Record) -> String {
    let sched = match &r.auto_choice {
        Some(c) => format!("{} → {c}", r.schedule),
        None => r.schedule.clone(),
    };
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        r.preset,
        sched,
        ms(r.single_gpu_ours_ms),
        ms(r.single_gpu_cublas_ms),
        ms(r.single_stage_nocomm_ms),
        ms(r.pipelined_nocomm_ms),
        ms(r.distgemm_ms),
        r.distgemm_tflops_per_gpu
            .map_or("—".into(), |v| format!("{v:.0}")),
        pct(r.pct_of_single_stage),
        pct(r.pct_of_pipelined_nocomm),
        pct(r.pct_of_peak),
        ms(r.nccl_cublas_ms),
        ms(r.torch_async_tp_ms),
        times(r.speedup_vs_nccl_cublas),
        times(r.speedup_vs_torch_async_tp),
    )
}

/// One line per row with diagnostics: (c), each diagnostic and (d), with their excess over (c)
/// and every device's median.
pub fn overhead_split(records: &[Record]) -> String {
    let per_device = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    records
        .iter()
        .filter(|r| r.auto_choice.is_none() && !r.diagnostics.is_empty())
        .filter_map(|r| {
            let (c, d) = (r.pipelined_nocomm_ms?, r.distgemm_ms?);
            let item = |name: &str, ms: f64, devices: &[f64]| {
                format!(
                    "{name} {ms:.3} ms ({:+.1} %) [{}]",
                    (ms - c) / c * 100.0,
                    per_device(devices)
                )
            };
            let mut items = vec![format!(
                "(c) {c:.3} ms [{}]",
                per_device(&r.device_medians_ms.pipelined_nocomm)
            )];
            items.extend(
                r.diagnostics
                    .iter()
                    .map(|x| item(&x.name, x.ms, &x.device_medians_ms)),
            );
            items.push(item("(d)", d, &r.device_medians_ms.distgemm));
            Some(format!(
                "- {} {}: {}\n",
                r.preset,
                r.schedule,
                items.join("; ")
            ))
        })
        .collect()
}

/// One line per row with power samples: every contender's SM clock and board power per device.
pub fn power_split(records: &[Record]) -> String {
    let join = |v: &[f64], unit: &str| {
        let parts: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        format!("{} {unit}", parts.join("/"))
    };
    records
        .iter()
        .filter(|r| r.auto_choice.is_none() && !r.power.is_empty())
        .map(|r| {
            let items: Vec<String> = r
                .power
                .iter()
                .map(|p| {
                    format!(
                        "{} {}, {}",
                        p.name,
                        join(&p.sm_mhz, "MHz"),
                        join(&p.watts, "W")
                    )
                })
                .collect();
            format!("- {} {}: {}\n", r.preset, r.schedule, items.join("; "))
        })
        .collect()
}

/// Per preset: the fastest schedule and the three conditions on it.
pub fn verdicts(records: &[Record]) -> String {
    let mut out = String::new();
    let mut names: Vec<&str> = records.iter().map(|r| r.preset.as_str()).collect();
    names.dedup();
    for preset in names {
        let best = records
            .iter()
            .filter(|r| r.preset == preset && !r.schedule.starts_with("auto"))
            .filter_map(|r| r.distgemm_ms.map(|d| (d, r)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((d, r)) = best else {
            out.push_str(&format!("- {preset}: no distgemm time\n"));
            continue;
        };
        let best_e = records
            .iter()
            .filter(|x| x.preset == preset)
            .filter_map(|x| x.nccl_cublas_ms)
            .fold(f64::INFINITY, f64::min);
        // PyTorch's best op, with the local matmul it took turns with.
        let best_f = records
            .iter()
            .filter(|x| x.preset == preset)
            .filter_map(|x| x.torch_async_tp_ms.map(|f| (f, x.torch_matmul_local_ms)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let (best_f, torch_local) = best_f.unwrap_or((f64::INFINITY, None));
        let check = |ok: bool| if ok { "yes" } else { "NO" };
        let b = r.single_stage_nocomm_ms;
        // What each adds over its own GEMM on the device-local problem: the price of the
        // distributed machinery, with the GEMM kernels' own speeds taken out.
        let over = |t: f64, local: Option<f64>| {
            local.map_or("—".into(), |l| format!("{:+.1} %", 100.0 * (t / l - 1.0)))
        };
        let overheads = if best_f.is_finite() {
            format!(
                "; over its own local GEMM: distgemm {} (of (b)), PyTorch {} (of its local matmul)",
                over(d, b),
                over(best_f, torch_local)
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "- {preset}: best schedule {} at {d:.3} ms; ≤ 1.03 × (b) ({}): {}; faster than the best (e) ({}): {}; no slower than the best (f) ({}): {}{overheads}\n",
            r.schedule,
            ms(b),
            b.map_or("unknown", |b| check(d <= NOISE * b)),
            if best_e.is_finite() { format!("{best_e:.3}") } else { "—".into() },
            if best_e.is_finite() { check(d < best_e) } else { "unknown" },
            if best_f.is_finite() { format!("{best_f:.3}") } else { "—".into() },
            if best_f.is_finite() { check(d <= best_f) } else { "unknown" },
        ));
    }
    out
}

/// One line per reason a column is missing, with up to four of the cells it left empty.
pub fn missing_notes(records: &[Record]) -> String {
    let mut reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in records {
        for (col, why) in &r.missing {
            reasons
                .entry(why.clone())
                .or_default()
                .push(format!("{}/{} {col}", r.preset, r.schedule));
        }
    }
    let mut out = String::new();
    for (why, where_) in reasons {
        let shown: Vec<&str> = where_.iter().take(4).map(String::as_str).collect();
        out.push_str(&format!(
            "- {why} ({}{})\n",
            shown.join(", "),
            if where_.len() > 4 {
                format!(", … {} in all", where_.len())
            } else {
                String::new()
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distgemm_report::record::{ContenderPower, DeviceMedians, Diagnostic};
    #[test]
    fn power_split_lists_every_contender_per_device() {
        let power = vec![
            ContenderPower {
                name: "(c)".into(),
                sm_mhz: vec![1470.4, 1489.6],
                watts: vec![699.0, 688.2],
            },
            ContenderPower {
                name: "(d) ag-a".into(),
                sm_mhz: vec![1430.0, 1431.0],
                watts: vec![700.0, 655.0],
            },
        ];
        let rows = [
            Record {
                preset: "p".into(),
                schedule: "ag-a".into(),
                power,
                ..Default::default()
            },
            Record {
                preset: "p".into(),
                schedule: "ag-a-single".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            power_split(&rows),
            "- p ag-a: (c) 1470/1490 MHz, 699/688 W; (d) ag-a 1430/1431 MHz, 700/655 W\n"
        );
    }

    #[test]
    fn overhead_split_lists_rows_with_diagnostics() {
        let row = |schedule: &str, capped: Option<f64>| Record {
            preset: "p".into(),
            schedule: schedule.into(),
            pipelined_nocomm_ms: Some(10.0),
            distgemm_ms: Some(10.3),
            diagnostics: capped
                .map(|ms| Diagnostic {
                    name: "cut".into(),
                    ms,
                    device_medians_ms: vec![ms, ms - 0.05],
                })
                .into_iter()
                .collect(),
            device_medians_ms: DeviceMedians {
                single_stage_nocomm: vec![9.9, 10.0],
                pipelined_nocomm: vec![9.95, 10.0],
                distgemm: vec![10.3, 10.29],
            },
            ..Default::default()
        };
        assert_eq!(
            overhead_split(&[row("ag-a", Some(10.1)), row("rs-a", None)]),
            "- p ag-a: (c) 10.000 ms [9.950/10.000]; cut 10.100 ms (+1.0 %) [10.100/10.050]; \
             (d) 10.300 ms (+3.0 %) [10.300/10.290]\n"
        );
    }

    #[test]
    fn derived_columns() {
        let mut r = Record {
            m: 16384,
            n: 57344,
            k: 8192,
            tp: 2,
            distgemm_ms: Some(12.0),
            single_stage_nocomm_ms: Some(11.0),
            pipelined_nocomm_ms: Some(11.5),
            nccl_cublas_ms: Some(13.2),
            torch_async_tp_ms: Some(12.6),
            ..Default::default()
        };
        r.derive();
        let tflops = 2.0 * 16384.0 * 57344.0 * 8192.0 / 2.0 / 12e-3 / 1e12;
        assert!((r.distgemm_tflops_per_gpu.unwrap() - tflops).abs() < 1e-9);
        assert!((r.pct_of_single_stage.unwrap() - 100.0 * 11.0 / 12.0).abs() < 1e-9);
        assert!((r.speedup_vs_nccl_cublas.unwrap() - 1.1).abs() < 1e-9);
        assert!((r.speedup_vs_torch_async_tp.unwrap() - 1.05).abs() < 1e-9);
        let row = table_row(&r);
        assert!(row.contains("| 12.000 |") && row.contains("1.10×"), "{row}");
        let mut none = Record::default();
        none.derive();
        assert!(none.distgemm_tflops_per_gpu.is_none());
        let json = serde_json::to_value(&none).unwrap();
        for key in [
            "preset",
            "tp",
            "schedule",
            "m",
            "n",
            "k",
            "dtype",
            "distgemm_ms",
            "single_stage_nocomm_ms",
            "pipelined_nocomm_ms",
            "nccl_cublas_ms",
            "torch_async_tp_ms",
            "machine",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn verdicts_name_the_best_schedule() {
        let rec = |s: &str, d: f64, b: f64| Record {
            preset: "p".into(),
            schedule: s.into(),
            distgemm_ms: Some(d),
            single_stage_nocomm_ms: Some(b),
            nccl_cublas_ms: Some(10.0),
            torch_async_tp_ms: Some(9.0),
            ..Default::default()
        };
        let mut a = rec("ag-a", 9.5, 9.4);
        a.torch_matmul_local_ms = Some(8.0);
        let v = verdicts(&[a, rec("ag-b", 9.9, 9.0)]);
        assert!(v.contains("best schedule ag-a at 9.500"), "{v}");
        assert!(v.contains("≤ 1.03 × (b) (9.400): yes"), "{v}");
        assert!(v.contains("no slower than the best (f) (9.000): NO"), "{v}");
        // 9.5 / 9.4 and 9.0 / 8.0.
        assert!(
            v.contains("distgemm +1.1 % (of (b)), PyTorch +12.5 % (of its local matmul)"),
            "{v}"
        );
    }
}
