//! distgemm: tensor-parallel GEMM for NVLink-connected Hopper GPUs.
//!
//! Layering (see README.md): `problem` + `schedule` (pure) → `plan` (pure, per-device DAG) →
//! `cpu` executor | `cuda` lowering (one CUDA graph per GPU); `runtime` is the only module that talks to the CUDA driver.
//!
//! Cargo features (the library alone, `--no-default-features`, is what a tensor-parallel user
//! calls):
//! - `cli` (default): the `distgemm` binary's modules `cli` and `testdata`;
//! - `baselines`: `baseline` (cuBLASLt and NCCL, for benchmarks and tests) and `testdata`;
//! - `diagnostics`: the measurement hooks the benchmarks use (timing diagnostics, the collective
//!   kernels' parameter types for hand-built graphs);
//! - `testing`: the hooks tests use (fault injection, workspace poisoning, one rank alone).

#[cfg(feature = "baselines")]
pub mod baseline;
#[cfg(feature = "cli")]
pub mod cli;
pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod fp8;
pub mod gemm;
pub mod plan;
pub mod problem;
pub mod reference;
pub mod runtime;
pub mod schedule;
#[cfg(any(feature = "cli", feature = "baselines"))]
pub mod testdata;
pub mod timing;
pub mod trace;
