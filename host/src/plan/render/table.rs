//! The plan as a text table ([`Plan::render_table`], `distgemm plan`'s default output).
//!
//! Columns are sized to their contents by `comfy-table` (no terminal detection, no wrapping:
//! the output is the same on a terminal and in a pipe) and byte counts read in binary units
//! (`bytesize`: `2.0 KiB`, `128.0 MiB`; the exact counts are in `--format json`). Both crates
//! come with the `cli` feature, and so does this module: the library's own renderings
//! ([`Plan::render_dot`], [`Plan::to_json`]) need neither.

use std::fmt::Write as _;

use bytesize::ByteSize;
use comfy_table::{LineStyle, Table, TableStyle};

use super::{flags, opt, region, view};
use crate::fp8::ScaleMode;
use crate::plan::{DevicePlan, Node, Plan, RsPartials};
use crate::schedule::{Block, BufferKind, CSource, Collective, CopyDirection, GemmStage};

/// Column headers of the per-device stage table.
const STAGE_COLUMNS: [&str; 10] = [
    "stage",
    "peer",
    "tile",
    "gemm m×n×k",
    "A",
    "B",
    "C (beta)",
    "D",
    "wait",
    "signal",
];

/// No borders and no column rules; a line of `─` under the header.
const STAGE_TABLE_STYLE: TableStyle =
    TableStyle::new().header_separator(LineStyle::none().fill('─').junction('─'));

/// `n` bytes in a binary unit: `64 B`, `6.0 KiB`, `128.0 MiB`.
fn bytes(n: usize) -> ByteSize {
    ByteSize::b(u64::try_from(n).unwrap_or(u64::MAX))
}

/// `A rows 0..16 cols 0..64`.
fn block(name: &str, b: &Block) -> String {
    format!(
        "{name} rows {}..{} cols {}..{}",
        b.row0,
        b.row0 + b.rows,
        b.col0,
        b.col0 + b.cols
    )
}

impl Plan {
    /// The index maps of the schedule, as one line.
    fn index_maps(&self) -> String {
        let p = self.tp;
        match (self.schedule.collective(), self.schedule.is_pipelined()) {
            (Collective::AllGather, true) => {
                format!("peer(d,t) = tile(d,t) = (d+t) mod {p}; stage t>0 reads ws slot t-1")
            }
            (Collective::ReduceScatter, true) if self.rs_partials == RsPartials::Push => format!(
                "peer = left = (d-1) mod {p}; tile(d,t) = (d-1-t) mod {p}; partials pushed: stage \
                 t>0 adds own ws slot t-1 (pushed by left after its stage t-1, then flag t); \
                 stage t<{last} writes slot {last} (t=0), {p} (t=1) or t-2 (t>1) and pushes it \
                 into right's slot t; stage {last} writes D",
                last = p - 1
            ),
            (Collective::ReduceScatter, true) => format!(
                "peer = left = (d-1) mod {p}; tile(d,t) = (d-1-t) mod {p}; stage t>0 adds left's ws slot t-1, \
                 writes own slot t (t<{last}) or D (t={last})",
                last = p - 1
            ),
            (Collective::AllGather, false) => {
                "gather all shards into ws slots (global order), then one GEMM".into()
            }
            (Collective::ReduceScatter, false) => {
                "one GEMM into the M×N partial (ws), then D = Σ_q block d of device q's partial"
                    .into()
            }
        }
    }

    /// A text table: a header (problem, workspaces, index maps), then per device its shards,
    /// a table of its GEMM stages (peer, tile, shape, views, flags) with columns as wide as
    /// their contents, its reductions, its copies and the flags set after them, and the
    /// end-of-run wait. Byte counts read in binary units (`2.0 KiB`). With the `cli` feature
    /// (default), whose `comfy-table` and `bytesize` it uses.
    #[must_use]
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let dev0 = &self.devices[0];
        let x = &self.exclusive;
        let _ = writeln!(
            out,
            "{} ({})  TP={}  {}",
            self.schedule.cli_name(),
            self.schedule.full_name(),
            self.tp,
            self.problem
        );
        let _ = writeln!(
            out,
            "workspace per device: {} slots × {} elements = {}",
            dev0.workspace.slots,
            dev0.workspace.slot_elements,
            bytes(dev0.workspace_bytes)
        );
        if let Some(fp8) = self.problem.fp8 {
            let (operands, outputs) = if BufferKind::Workspace.holds_operands(self.schedule) {
                ("A, B and ws", "C and D")
            } else {
                ("A and B", "C, D and ws (partials)")
            };
            let scales = match fp8.scales {
                ScaleMode::Tensorwise => "one scale per operand",
                ScaleMode::Rowwise => {
                    "one f32 scale per row of A and B (a copied row's scale is copied with it, \
                     4 bytes beside the row's)"
                }
            };
            let _ = writeln!(
                out,
                "FP8: {operands} hold e4m3 (1 byte per element), {outputs} {}; {scales}",
                self.problem.dtype
            );
        }
        let _ = writeln!(
            out,
            "exclusive workspace per device: {} (u32 words: barrier counter @{}, error word @{}, \
             stage flags 0..{} and release flags {}..{} @{}..{})",
            bytes(x.bytes),
            x.counter_offset,
            x.error_offset,
            x.release_base,
            x.release_base,
            x.flag_count,
            x.flags_offset,
            x.flag_offset(x.flag_count),
        );
        let _ = writeln!(out, "index maps: {}", self.index_maps());
        for dev in &self.devices {
            render_device(&mut out, dev, x.release_base);
        }
        out
    }
}

/// One row of the stage table.
fn stage_row(d: usize, g: &GemmStage) -> [String; 10] {
    let c = match &g.epilogue.source {
        CSource::None => "-".to_string(),
        CSource::Local(v) | CSource::Peer(v) => format!("{} ({})", view(d, v), g.epilogue.beta),
    };
    [
        g.stage.to_string(),
        opt(g.peer),
        opt(g.tile),
        format!("{}×{}×{}", g.shape.m, g.shape.n, g.shape.k),
        view(d, &g.a),
        view(d, &g.b),
        c,
        view(d, &g.d),
        flags(&g.waits.into_iter().collect::<Vec<_>>()),
        flags(&g.signals.into_iter().collect::<Vec<_>>()),
    ]
}

/// Device `dev`'s section: shards, the stage table, then reductions, copies (with the flags
/// set after each) and the end-of-run wait, one line each, in the plan's node order.
fn render_device(out: &mut String, dev: &DevicePlan, release_base: usize) {
    let d = dev.device;
    let s = &dev.shards;
    let c =
        s.c.map(|c| format!(", {}", block("C", &c)))
            .unwrap_or_default();
    let _ = writeln!(
        out,
        "\ndevice {d}: {}, {}{c}, {}",
        block("A", &s.a),
        block("B", &s.b),
        block("D", &s.d)
    );
    let mut stages = Table::new();
    stages
        .load_style(STAGE_TABLE_STYLE)
        .set_header(STAGE_COLUMNS)
        .add_rows(dev.gemms().map(|g| stage_row(d, g)));
    // Two spaces between columns: each column's right padding and the (blank) rule.
    for column in stages.column_iter_mut() {
        column.set_padding((0, 1));
    }
    for line in stages.lines() {
        let _ = writeln!(out, "  {}", line.trim_end());
    }
    // The reductions, then the copy chain, then the end-of-run wait.
    let reductions = dev.nodes.iter().filter(|n| matches!(n, Node::Reduce(_)));
    let copies = dev
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::PeerCopy(_) | Node::FlagSet(_)));
    let end = dev
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::AwaitRelease(_)));
    for node in reductions.chain(copies).chain(end) {
        match node {
            Node::Reduce(r) => {
                let sources: Vec<_> = r.sources.iter().map(|v| view(d, v)).collect();
                let _ = writeln!(
                    out,
                    "  reduce: {} = Σ [{}]; signal {}; wait {}",
                    view(d, &r.dst),
                    sources.join(", "),
                    flags(&r.signals),
                    flags(&r.waits)
                );
            }
            Node::PeerCopy(cp) if cp.direction == CopyDirection::Push => {
                let _ = writeln!(
                    out,
                    "  push after stage {}: {} → {} ({}) for dev{}'s stage {}",
                    cp.stage.saturating_sub(1),
                    region(&cp.src),
                    region(&cp.dst),
                    bytes(cp.bytes),
                    cp.dst.device,
                    cp.stage
                );
            }
            Node::PeerCopy(cp) => {
                let _ = writeln!(
                    out,
                    "  copy for stage {}: {} → {} ({})",
                    cp.stage,
                    region(&cp.src),
                    region(&cp.dst),
                    bytes(cp.bytes)
                );
            }
            Node::FlagSet(f) => {
                let what = if f.flag.index >= release_base {
                    " (release: done reading its shard)"
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "  then set dev{}.flag{} = {:#x}{what}",
                    f.flag.device, f.flag.index, f.value
                );
            }
            Node::AwaitRelease(w) => {
                let _ = writeln!(
                    out,
                    "  end: wait until {} set (every peer has released this device's shards)",
                    flags(&w.flags)
                );
            }
            Node::Gemm(_) | Node::Barrier(_) => {}
        }
    }
}
