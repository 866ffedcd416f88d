//! One measured row of the table: what was timed, the derived columns, and why a column is
//! missing.

use serde::Serialize;
use std::collections::BTreeMap;

use super::PEAK_TFLOPS;

/// One preset × schedule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    pub preset: String,
    pub tp: usize,
    pub schedule: String,
    pub schedule_full: String,
    /// The schedule `auto` chose, when the runtime says.
    pub auto_choice: Option<String>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: String,
    /// (a) our kernel, full problem on one GPU.
    pub single_gpu_ours_ms: Option<f64>,
    /// (a) cuBLASLt, full problem on one GPU.
    pub single_gpu_cublas_ms: Option<f64>,
    /// (b) shape(s) and time.
    pub single_stage_shape: Option<String>,
    pub single_stage_nocomm_ms: Option<f64>,
    /// (c) stage shapes and time.
    pub pipelined_stage_shapes: Option<String>,
    pub pipelined_nocomm_ms: Option<f64>,
    /// Every device's median of (b), (c) and (d) (the columns above are the largest): shows
    /// whether one GPU is slower than the other and what coupling them costs.
    pub device_medians_ms: DeviceMedians,
    /// (d)
    pub distgemm_ms: Option<f64>,
    pub distgemm_min_ms: Option<f64>,
    pub distgemm_max_ms: Option<f64>,
    pub distgemm_reps: Option<usize>,
    /// (d) as the median of every repetition's slowest device (the statistic before
    /// `distgemm::timing` reported the slowest device's median; see there why it overstates).
    pub distgemm_per_rep_max_ms: Option<f64>,
    /// Pipelined all-gather rows: variants of (c) and (d) that leave parts out, timed in the
    /// same rounds ([`Diagnostic`]).
    pub diagnostics: Vec<Diagnostic>,
    /// Pipelined rows with `--diagnose`: the SM clock and board power every contender of the
    /// family ran at ([`ContenderPower`]).
    pub power: Vec<ContenderPower>,
    /// (e)
    pub nccl_cublas_variant: Option<String>,
    pub nccl_cublas_ms: Option<f64>,
    /// (f)
    pub torch_async_tp_op: Option<String>,
    pub torch_async_tp_ms: Option<f64>,
    /// PyTorch's own NCCL + matmul and matmul-alone times for the same collective.
    pub torch_nccl_matmul_ms: Option<f64>,
    pub torch_matmul_local_ms: Option<f64>,
    /// Derived from (d).
    pub distgemm_tflops_per_gpu: Option<f64>,
    pub pct_of_single_stage: Option<f64>,
    pub pct_of_pipelined_nocomm: Option<f64>,
    pub pct_of_peak: Option<f64>,
    pub speedup_vs_nccl_cublas: Option<f64>,
    pub speedup_vs_torch_async_tp: Option<f64>,
    /// Why a column is null.
    pub missing: BTreeMap<String, String>,
    pub machine: String,
    pub driver: String,
    pub commit: String,
    pub date: String,
}

/// Every device's median of the family's timings ([`Record::device_medians_ms`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceMedians {
    pub single_stage_nocomm: Vec<f64>,
    pub pipelined_nocomm: Vec<f64>,
    pub distgemm: Vec<f64>,
}

/// A variant of (c) or (d) that leaves a part out (e.g. "(d), copies cut to 4096 B"): its
/// time over (c) against (d)'s says what that part costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diagnostic {
    pub name: String,
    /// The slowest device's median.
    pub ms: f64,
    pub device_medians_ms: Vec<f64>,
}

/// A contender's mean SM clock and board power on every device over the timed part of all its
/// blocks, sampled with NVML every 10 ms (the power is NVML's one-second average, so a short
/// block's reading includes some of its neighbours). Under the power cap a
/// contender that draws the cap's power at a lower clock spends more energy per cycle; one
/// that draws less than the cap is idle part of the time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ContenderPower {
    pub name: String,
    pub sm_mhz: Vec<f64>,
    pub watts: Vec<f64>,
}

impl Record {
    /// Fills the derived columns from the measured ones.
    pub fn derive(&mut self) {
        let flops_per_gpu = 2.0 * self.m as f64 * self.n as f64 * self.k as f64 / self.tp as f64;
        let Some(d) = self.distgemm_ms.filter(|&d| d > 0.0) else {
            return;
        };
        let tflops = flops_per_gpu / (d * 1e-3) / 1e12;
        self.distgemm_tflops_per_gpu = Some(tflops);
        self.pct_of_peak = Some(100.0 * tflops / PEAK_TFLOPS);
        self.pct_of_single_stage = self.single_stage_nocomm_ms.map(|b| 100.0 * b / d);
        self.pct_of_pipelined_nocomm = self.pipelined_nocomm_ms.map(|c| 100.0 * c / d);
        self.speedup_vs_nccl_cublas = self.nccl_cublas_ms.map(|e| e / d);
        self.speedup_vs_torch_async_tp = self.torch_async_tp_ms.map(|f| f / d);
    }

    pub fn set<T>(&mut self, column: &str, value: &Result<T, String>) -> Option<T>
    where
        T: Clone,
    {
        match value {
            Ok(v) => Some(v.clone()),
            Err(e) => {
                self.missing.insert(column.to_owned(), e.clone());
                None
            }
        }
    }
}
