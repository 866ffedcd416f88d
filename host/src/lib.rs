//! distgemm: tensor-parallel GEMM for NVLink-connected Hopper GPUs.
//!
//! Layering (see README.md): `problem` + `schedule` (pure) → `plan` (pure, per-device DAG) →
//! `cpu` executor | `cuda` lowering (one CUDA graph per GPU); `runtime` is the only module that talks to the CUDA driver.

pub mod baseline;
pub mod cli;
pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod gemm;
pub mod plan;
pub mod problem;
pub mod reference;
pub mod runtime;
pub mod schedule;
pub mod testdata;
pub mod timing;
