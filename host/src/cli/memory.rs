//! What `run` will allocate, estimated from the plan before anything is allocated, and the
//! refusal (bad input, with the numbers) when this machine does not have it. Without it a
//! large `--tokens` on the CUDA path would abort inside the allocator after minutes of input
//! generation.
//!
//! Host bytes (element sizes s_in of A and B, 1 for FP8, and s_out of C, D and partials, see
//! [`Plan::element_bytes`]; FP8's row-wise scales, `4·(M + N)`, are left out):
//! - the global operands A, B, C and the gathered D: `s_in·(M·K + N·K) + s_out·M·N·([beta≠0] + 1)`;
//! - every device's input shards (A, B, C) and output shard (D), each in its own type;
//! - on the CPU executor, its device memory again (A, B, C, D and workspace of every device);
//! - for `--check` on the CUDA backend, each element's two f64 sums computed on the GPU
//!   ([`crate::reference::gpu::products`]): `16·M·N` (the CPU executor's check computes each
//!   element's sums as it compares them, in no memory of note).
//!
//! Device bytes, per GPU: the shards and workspace of its device plan plus the exclusive
//! workspace, compared with the GPU's free memory.

use bytesize::ByteSize;

use super::CliError;
use crate::plan::{DevicePlan, Plan};
use crate::runtime::Gpu;
use crate::schedule::BufferKind;

/// Which executor the estimate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Executor {
    /// The CPU executor (device memory is host memory).
    Cpu,
    /// The CUDA backend.
    Cuda,
}

/// A device's operand shards.
const OPERANDS: [BufferKind; 4] = [BufferKind::A, BufferKind::B, BufferKind::C, BufferKind::D];
/// A device's operand shards and its workspace: all a GPU (or the CPU executor) holds for it.
const EVERY_BUFFER: [BufferKind; 5] = [
    BufferKind::A,
    BufferKind::B,
    BufferKind::C,
    BufferKind::D,
    BufferKind::Workspace,
];

/// Host bytes `run` allocates for `plan` (module documentation), saturating.
pub(super) fn host_bytes(plan: &Plan, executor: Executor, check: bool) -> usize {
    let p = &plan.problem;
    let c = if p.has_c() {
        p.m.saturating_mul(p.n)
    } else {
        0
    };
    let global = [
        p.m.saturating_mul(p.k)
            .saturating_mul(plan.element_bytes(BufferKind::A)),
        p.n.saturating_mul(p.k)
            .saturating_mul(plan.element_bytes(BufferKind::B)),
        c.saturating_mul(plan.element_bytes(BufferKind::C)),
        p.m.saturating_mul(p.n)
            .saturating_mul(plan.element_bytes(BufferKind::D)),
    ];
    let mut bytes = sum(global);
    bytes = bytes.saturating_add(devices_bytes(plan, &OPERANDS));
    if executor == Executor::Cpu {
        bytes = bytes.saturating_add(devices_bytes(plan, &EVERY_BUFFER));
    }
    if check && executor == Executor::Cuda {
        bytes = bytes.saturating_add(p.m.saturating_mul(p.n).saturating_mul(16));
    }
    bytes
}

/// Device bytes of one GPU: its buffers and the exclusive workspace.
pub(super) fn device_bytes(plan: &Plan, device: &DevicePlan) -> usize {
    EVERY_BUFFER
        .iter()
        .map(|&b| plan.buffer_bytes(device.device, b))
        .fold(plan.exclusive.bytes, usize::saturating_add)
}

/// Bytes of `buffers` summed over every device of `plan`.
fn devices_bytes(plan: &Plan, buffers: &[BufferKind]) -> usize {
    plan.devices
        .iter()
        .flat_map(|d| buffers.iter().map(|&b| plan.buffer_bytes(d.device, b)))
        .fold(0, usize::saturating_add)
}

fn sum<const N: usize>(values: [usize; N]) -> usize {
    values.into_iter().fold(0, usize::saturating_add)
}

/// Refuses when `needed` host bytes exceed what the system reports available (Linux
/// `MemAvailable`; elsewhere nothing is checked).
pub(super) fn check_host(needed: usize, what: &str) -> Result<(), CliError> {
    match available_host_bytes() {
        Some(available) if needed > available => Err(CliError::TooLarge(format!(
            "{what} needs {} of host memory, this machine has {} available",
            human(needed),
            human(available)
        ))),
        _ => Ok(()),
    }
}

/// Refuses when a GPU's share does not fit its free memory.
pub(super) fn check_devices(plan: &Plan, gpus: &[Gpu]) -> Result<(), CliError> {
    for (dev, gpu) in plan.devices.iter().zip(gpus) {
        let needed = device_bytes(plan, dev);
        let (free, _total) = gpu.context().mem_get_info().map_err(|e| {
            CliError::CudaUnavailable(format!(
                "cannot read GPU {}'s free memory: {e}",
                gpu.ordinal()
            ))
        })?;
        if needed > free {
            return Err(CliError::TooLarge(format!(
                "device {} needs {} on GPU {} ({}) for its shards and workspace, {} are free",
                dev.device,
                human(needed),
                gpu.ordinal(),
                gpu.name(),
                human(free)
            )));
        }
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn available_host_bytes() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Bytes with a binary unit: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub(super) fn human(bytes: usize) -> ByteSize {
    ByteSize::b(u64::try_from(bytes).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;

    #[test]
    fn host_bytes_count_globals_shards_executor_and_reference() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            2,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let matrix = 64 * 64 * 2;
        // Globals A, B, D; shards: A and B split in two, D split in two: one matrix each.
        let cuda = host_bytes(&plan, Executor::Cuda, false);
        assert_eq!(cuda, 3 * matrix + 3 * matrix);
        // The CPU executor adds its buffers: the shards again plus the 1-slot workspaces.
        let ws: usize = plan.devices.iter().map(|d| d.workspace_bytes).sum();
        assert_eq!(
            host_bytes(&plan, Executor::Cpu, false),
            cuda + 3 * matrix + ws
        );
        // The check's two M×N f64 matrices from the GPU; none on the CPU executor.
        assert_eq!(host_bytes(&plan, Executor::Cuda, true), cuda + 16 * 64 * 64);
        assert_eq!(
            host_bytes(&plan, Executor::Cpu, true),
            host_bytes(&plan, Executor::Cpu, false)
        );
    }

    /// FP8: A, B and the gathered slots count one byte per element, D two; a reduce-scatter
    /// workspace (partials) two.
    #[test]
    fn fp8_operands_count_one_byte() {
        let problem = Problem::new(64, 64, 64).with_fp8(crate::fp8::ScaleMode::Rowwise);
        let plan = Plan::build(ScheduleKind::AllGatherRotatingA, problem, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        let (operand, output) = (64 * 64, 64 * 64 * 2);
        let cuda = host_bytes(&plan, Executor::Cuda, false);
        assert_eq!(cuda, 2 * (2 * operand + output));
        assert_eq!(plan.devices[0].workspace_bytes, 32 * 64);
        assert_eq!(
            device_bytes(&plan, &plan.devices[0]),
            operand + output / 2 + 32 * 64 + plan.exclusive.bytes
        );
        let rs = Plan::build(ScheduleKind::ReduceScatterTilingA, problem, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rs.devices[0].workspace_bytes, 32 * 64 * 2);
    }
}
