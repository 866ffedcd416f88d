//! What the ranks of a group tell each other when they build a [`super::RankGemm`], and the
//! checks every rank runs on the answers. Pure data and functions: unit-tested with fake
//! ranks, no GPU.
//!
//! Each rank sends one [`Hello`] (JSON): who it is (rank, group size, GPU UUID), what it was
//! asked to build (schedule after `Auto`, how partials move, problem, timeout, protocol
//! version), and either the
//! handles of the memory its peers will touch or the error that stopped it. Every rank then
//! runs [`check_group`] on all hellos: any disagreement is an error on every rank, naming the
//! rank and the field, before any graph exists.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plan::RsPartials;
use crate::problem::Problem;
use crate::runtime::IpcHandle;
use crate::schedule::{BufferKind, ScheduleKind};

/// Version of the cross-process protocol (flags, barrier, layouts); ranks must agree.
pub(crate) const PROTOCOL_VERSION: u32 = 1;

/// How one allocation is made visible to other processes: the seam where other handle types
/// (a VMM POSIX fd, a fabric handle for multi-host NVLink) would be added. Everything past the
/// import is a device address, so the plan and the lowering never see which it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum SharedMemory {
    /// A legacy CUDA IPC handle of a `cuMemAlloc` allocation.
    CudaIpc {
        /// The handle.
        handle: IpcHandle,
        /// Bytes of the allocation.
        bytes: usize,
    },
}

impl SharedMemory {
    pub(crate) fn bytes(&self) -> usize {
        match self {
            SharedMemory::CudaIpc { bytes, .. } => *bytes,
        }
    }
}

/// The memory of one rank that its peers read or write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Exports {
    /// The workspace (all-gather slots; reduce-scatter partials read by the neighbour).
    pub(crate) workspace: Option<SharedMemory>,
    /// The exclusive workspace (barrier counter, error word, flags).
    pub(crate) exclusive: SharedMemory,
    /// The input slot of the operand the schedule gathers (A or B), which peers copy from.
    pub(crate) input: Option<SharedMemory>,
}

/// One rank's message of the build handshake.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub(crate) protocol: u32,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// `GPU-…` UUID of the rank's GPU.
    pub(crate) gpu_uuid: String,
    /// Whether the rank accepts sharing its GPU with other ranks.
    pub(crate) allow_shared_gpu: bool,
    pub(crate) schedule: ScheduleKind,
    /// Who decided the schedule ([`crate::cuda::ScheduleSource`]'s text: "fixed", "rule" or
    /// "tuned (table …)"), named when ranks disagree on the schedule (empty from a rank that
    /// predates tuning tables).
    #[serde(default)]
    pub(crate) schedule_source: String,
    /// How partials move, as the rank's plan says (`Read` from a rank that predates pushes).
    #[serde(default)]
    pub(crate) rs_partials: RsPartials,
    pub(crate) problem: Problem,
    pub(crate) timeout_ns: u64,
    /// The rank's exports, or why it could not make them.
    pub(crate) exports: Result<Exports, String>,
}

/// What [`check_group`] learned: per rank, the GPU UUID, and how many ranks share each rank's
/// GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// Ranks on the same GPU as rank r, for every r.
    pub(crate) ranks_on_gpu: Vec<usize>,
}

/// The operand whose shard peers copy from its owner in `schedule` (all-gather schedules).
pub(crate) fn gathered_operand(schedule: ScheduleKind) -> Option<BufferKind> {
    match schedule {
        ScheduleKind::AllGatherRotatingA | ScheduleKind::AllGatherSingleStageA => {
            Some(BufferKind::A)
        }
        ScheduleKind::AllGatherRotatingB | ScheduleKind::AllGatherSingleStageB => {
            Some(BufferKind::B)
        }
        ScheduleKind::ReduceScatterTilingA
        | ScheduleKind::ReduceScatterTilingB
        | ScheduleKind::ReduceScatterSingleStageA
        | ScheduleKind::ReduceScatterSingleStageB => None,
    }
}

fn same_problem(a: &Problem, b: &Problem) -> bool {
    (a.m, a.n, a.k, a.dtype) == (b.m, b.n, b.k, b.dtype)
        && a.alpha.to_bits() == b.alpha.to_bits()
        && a.beta.to_bits() == b.beta.to_bits()
}

/// Checks the hellos of a whole group as rank `me` received them (index = rank): every rank
/// speaks the same protocol, agrees on the group size, schedule, partials, problem and
/// timeout, sits on
/// its own GPU unless all allow sharing, and exported its memory with the expected sizes.
/// The first problem found is returned as one line naming the rank.
pub(crate) fn check_group(
    hellos: &[Hello],
    me: usize,
    sizes: &ExportSizes,
) -> Result<Group, String> {
    let mine = hellos
        .get(me)
        .ok_or_else(|| format!("the rendezvous returned {} ranks", hellos.len()))?;
    if hellos.len() != mine.world {
        return Err(format!(
            "the rendezvous has {} ranks but this group was built for {}",
            hellos.len(),
            mine.world
        ));
    }
    for (r, h) in hellos.iter().enumerate() {
        if let Err(why) = &h.exports {
            return Err(format!("rank {r} failed: {why}"));
        }
    }
    for (r, h) in hellos.iter().enumerate() {
        let disagree = |what: &str, theirs: String, ours: String| {
            Err(format!(
                "rank {r} has {what} {theirs}, rank {me} has {ours}: every rank must build the \
                 same distributed GEMM"
            ))
        };
        if h.protocol != PROTOCOL_VERSION {
            return disagree(
                "protocol version",
                h.protocol.to_string(),
                PROTOCOL_VERSION.to_string(),
            );
        }
        if h.rank != r {
            return Err(format!(
                "the process in slot {r} of the rendezvous says it is rank {} (duplicate or \
                 misnumbered ranks)",
                h.rank
            ));
        }
        if h.world != mine.world {
            return disagree("group size", h.world.to_string(), mine.world.to_string());
        }
        if h.schedule != mine.schedule {
            // `Auto` resolves on every rank: say who decided, so that a rank reading another
            // tuning table (or none) is found.
            let decided = |h: &Hello| match h.schedule_source.as_str() {
                "" => String::new(),
                source => format!(" (decided by: {source})"),
            };
            return disagree(
                "schedule",
                format!("{}{}", h.schedule.cli_name(), decided(h)),
                format!("{}{}", mine.schedule.cli_name(), decided(mine)),
            );
        }
        if h.rs_partials != mine.rs_partials {
            return disagree(
                "rs partials",
                h.rs_partials.cli_name().to_string(),
                mine.rs_partials.cli_name().to_string(),
            );
        }
        if !same_problem(&h.problem, &mine.problem) {
            return disagree(
                "problem",
                format!("{:?}", h.problem),
                format!("{:?}", mine.problem),
            );
        }
        if h.timeout_ns != mine.timeout_ns {
            return disagree(
                "timeout",
                format!("{:?}", Duration::from_nanos(h.timeout_ns)),
                format!("{:?}", Duration::from_nanos(mine.timeout_ns)),
            );
        }
    }
    let ranks_on_gpu: Vec<usize> = hellos
        .iter()
        .map(|h| hellos.iter().filter(|o| o.gpu_uuid == h.gpu_uuid).count())
        .collect();
    for (r, h) in hellos.iter().enumerate() {
        if ranks_on_gpu[r] > 1 && !hellos.iter().all(|o| o.allow_shared_gpu) {
            let other = hellos
                .iter()
                .position(|o| o.gpu_uuid == h.gpu_uuid)
                .unwrap_or(r);
            let other = if other == r {
                hellos
                    .iter()
                    .enumerate()
                    .position(|(i, o)| i != r && o.gpu_uuid == h.gpu_uuid)
                    .unwrap_or(r)
            } else {
                other
            };
            return Err(format!(
                "ranks {other} and {r} share GPU {}: one process per GPU is expected (allow \
                 sharing on every rank only to test the protocol on one GPU, or under MPS)",
                h.gpu_uuid
            ));
        }
    }
    for (r, h) in hellos.iter().enumerate() {
        let Ok(exports) = &h.exports else { continue };
        sizes.check(r, exports)?;
    }
    Ok(Group { ranks_on_gpu })
}

/// The export sizes every rank must have (the plan decides them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExportSizes {
    /// Per rank: workspace bytes (0: none exported).
    pub(crate) workspace: Vec<usize>,
    /// Exclusive-workspace bytes.
    pub(crate) exclusive: usize,
    /// Per rank: input-slot bytes (0: none).
    pub(crate) input: Vec<usize>,
}

impl ExportSizes {
    fn check(&self, rank: usize, exports: &Exports) -> Result<(), String> {
        let short = |what: &str, have: usize, need: usize| {
            Err(format!(
                "rank {rank} exported a {what} of {have} bytes, the plan needs {need}"
            ))
        };
        let need_ws = self.workspace.get(rank).copied().unwrap_or(0);
        let have_ws = exports.workspace.as_ref().map_or(0, SharedMemory::bytes);
        if have_ws < need_ws {
            return short("workspace", have_ws, need_ws);
        }
        if exports.exclusive.bytes() < self.exclusive {
            return short(
                "exclusive workspace",
                exports.exclusive.bytes(),
                self.exclusive,
            );
        }
        let need_in = self.input.get(rank).copied().unwrap_or(0);
        let have_in = exports.input.as_ref().map_or(0, SharedMemory::bytes);
        if have_in < need_in {
            return short("input slot", have_in, need_in);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(bytes: usize) -> SharedMemory {
        SharedMemory::CudaIpc {
            handle: serde_json::from_str(&format!("\"{}\"", "ab".repeat(64))).unwrap(),
            bytes,
        }
    }

    fn hello(rank: usize, world: usize) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            rank,
            world,
            gpu_uuid: format!("GPU-{rank}"),
            allow_shared_gpu: false,
            schedule: ScheduleKind::AllGatherRotatingA,
            schedule_source: "rule".into(),
            rs_partials: RsPartials::Read,
            problem: Problem::new(256, 512, 128),
            timeout_ns: 1_000_000_000,
            exports: Ok(Exports {
                workspace: Some(handle(4096)),
                exclusive: handle(96),
                input: Some(handle(1024)),
            }),
        }
    }

    fn sizes(world: usize) -> ExportSizes {
        ExportSizes {
            workspace: vec![4096; world],
            exclusive: 96,
            input: vec![1024; world],
        }
    }

    fn group(world: usize) -> Vec<Hello> {
        (0..world).map(|r| hello(r, world)).collect()
    }

    #[test]
    fn a_consistent_group_passes_and_survives_json() {
        let hellos: Vec<Hello> = group(4)
            .iter()
            .map(|h| serde_json::from_str(&serde_json::to_string(h).unwrap()).unwrap())
            .collect();
        let g = check_group(&hellos, 2, &sizes(4)).unwrap();
        assert_eq!(g.ranks_on_gpu, vec![1; 4]);
    }

    #[test]
    fn every_disagreement_names_the_rank_and_the_field() {
        type Change = fn(&mut Hello);
        let cases: Vec<(Change, &str)> = vec![
            (|h| h.world = 3, "group size"),
            (
                |h| h.schedule = ScheduleKind::ReduceScatterTilingA,
                "schedule",
            ),
            (
                |h| h.rs_partials = RsPartials::Push,
                "rs partials push, rank 0 has read",
            ),
            (|h| h.problem.k = 64, "problem"),
            (|h| h.timeout_ns = 5, "timeout"),
            (|h| h.protocol = 0, "protocol"),
            (|h| h.rank = 0, "duplicate"),
            (|h| h.gpu_uuid = "GPU-0".into(), "share GPU"),
            (
                |h| h.exports = Err("no Hopper GPU".into()),
                "rank 1 failed: no Hopper GPU",
            ),
            (
                |h| {
                    if let Ok(e) = &mut h.exports {
                        e.input = None;
                    }
                },
                "input slot of 0 bytes",
            ),
        ];
        for (change, needle) in cases {
            let mut hellos = group(2);
            change(&mut hellos[1]);
            let err = check_group(&hellos, 0, &sizes(2)).unwrap_err();
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
            assert!(err.contains("rank"), "{err}");
        }
    }

    /// A rank whose tuning table chose another schedule: the error names both schedules and
    /// who decided each, the table included.
    #[test]
    fn a_rank_with_another_tuning_table_is_named_with_its_table() {
        let mut hellos = group(2);
        hellos[1].schedule = ScheduleKind::AllGatherSingleStageA;
        hellos[1].schedule_source = "tuned (table /data/tuning.json#00000000deadbeef: \
                                     NVIDIA H200 TP=2 bf16 ag-a M≈256 N=512 K=128)"
            .into();
        let err = check_group(&hellos, 0, &sizes(2)).unwrap_err();
        assert_eq!(
            err,
            "rank 1 has schedule ag-a-single (decided by: tuned (table \
             /data/tuning.json#00000000deadbeef: NVIDIA H200 TP=2 bf16 ag-a M≈256 N=512 \
             K=128)), rank 0 has ag-a (decided by: rule): every rank must build the same \
             distributed GEMM"
        );
        // A hello without the field (an older rank) still reads, and the message is as before.
        let mut json: serde_json::Value = serde_json::to_value(&hellos[1]).unwrap();
        json.as_object_mut().unwrap().remove("schedule_source");
        hellos[1] = serde_json::from_value(json).unwrap();
        let err = check_group(&hellos, 0, &sizes(2)).unwrap_err();
        assert!(err.starts_with("rank 1 has schedule ag-a-single, rank 0 has ag-a (decided"));
    }

    #[test]
    fn sharing_a_gpu_needs_every_rank_to_allow_it() {
        let mut hellos = group(3);
        hellos[1].gpu_uuid = "GPU-0".into();
        for h in &mut hellos {
            h.allow_shared_gpu = true;
        }
        let g = check_group(&hellos, 0, &sizes(3)).unwrap();
        assert_eq!(g.ranks_on_gpu, vec![2, 2, 1]);
        hellos[2].allow_shared_gpu = false;
        assert!(check_group(&hellos, 0, &sizes(3)).is_err());
    }

    #[test]
    fn the_gathered_operand_is_the_rotating_one() {
        assert_eq!(
            gathered_operand(ScheduleKind::AllGatherSingleStageB),
            Some(BufferKind::B)
        );
        assert_eq!(gathered_operand(ScheduleKind::ReduceScatterTilingB), None);
    }
}
