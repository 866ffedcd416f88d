//! The pure half of the `distgemm` benchmark (`benches/distgemm/`): command line ([`args`]),
//! the table's rows and which baseline pairs with which schedule ([`rows`]), the result records
//! and their derived columns ([`record`]), tables and verdicts ([`table`]), the PyTorch peer
//! ([`torch`]) and the token-sweep analysis ([`sweep`]). Kept in the support library so that
//! `cargo test` runs its tests (a `harness = false` bench's tests do not run).

pub mod args;
pub mod record;
pub mod rows;
pub mod sweep;
pub mod table;
pub mod torch;

pub use args::{
    Options, SETTLE_MS, non_negative_ms, parse_args, presets, results_stem, settle_warmup,
    timing_for,
};
pub use record::{ContenderPower, DeviceMedians, Diagnostic, Record};
pub use rows::{
    TORCH_AG, TORCH_RS, all_rows, nccl_kind_of, row_family, row_id, row_name, torch_op_of,
};
pub use sweep::{SweepPoint, pipelining_threshold};
pub use table::{
    TABLE_HEADER, missing_notes, ms, overhead_split, pct, power_split, table_row, times, verdicts,
};
pub use torch::{TorchResults, find_peer_script, run_peer_command};

/// Dense bf16/f16 tensor peak of an H100/H200 SXM, TFLOP/s.
pub const PEAK_TFLOPS: f64 = 989.0;
/// Throughput assumed when choosing repetition counts (TFLOP/s per GPU).
pub const PLANNING_TFLOPS: f64 = 650.0;
/// Token counts of the sweep.
pub const SWEEP_TOKENS: [usize; 7] = [256, 512, 1024, 2048, 4096, 8192, 16384];
/// A schedule whose time is within this factor of the best counts as "as fast".
pub const NOISE: f64 = 1.03;
