//! Human-readable renderings of a plan: a per-(device, stage) table and Graphviz DOT.

use std::fmt::Write as _;

use super::{DevicePlan, Node, Plan};
use crate::schedule::{CSource, Collective, Region, View};

/// `ws@1024 16×64 ld64`, prefixed with `devN:` when the buffer is a peer's.
fn view(own: usize, v: &View) -> String {
    let peer = if v.device == own {
        String::new()
    } else {
        format!("dev{}:", v.device)
    };
    format!(
        "{peer}{}@{} {}×{} ld{}",
        v.buffer.name(),
        v.offset,
        v.rows,
        v.cols,
        v.ld
    )
}

fn region(r: &Region) -> String {
    format!(
        "dev{}:{}[{}..{}]",
        r.device,
        r.buffer.name(),
        r.offset,
        r.offset + r.len
    )
}

fn flags(flags: &[crate::schedule::FlagRef]) -> String {
    if flags.is_empty() {
        return "-".into();
    }
    flags
        .iter()
        .map(|f| format!("dev{}.flag{}", f.device, f.index))
        .collect::<Vec<_>>()
        .join(",")
}

fn opt(x: Option<usize>) -> String {
    x.map_or_else(|| "-".into(), |v| v.to_string())
}

fn block(name: &str, b: &crate::schedule::Block) -> String {
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

    /// A table: header (problem, workspace, index maps), then per device its shards, stages
    /// (peer, tile, GEMM shape, views, flags) and copies.
    #[must_use]
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let dev0 = &self.devices[0];
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
            "workspace per device: {} slots × {} elements = {} B; exclusive workspace: {} B \
             (barrier counter @{}, error word @{}, stage flags 0..{} and release flags {}..{} \
             @{}..{}, u32)",
            dev0.workspace.slots,
            dev0.workspace.slot_elements,
            dev0.workspace_bytes,
            self.exclusive.bytes,
            self.exclusive.counter_offset,
            self.exclusive.error_offset,
            self.exclusive.release_base,
            self.exclusive.release_base,
            self.exclusive.flag_count,
            self.exclusive.flags_offset,
            self.exclusive.flag_offset(self.exclusive.flag_count),
        );
        let _ = writeln!(out, "index maps: {}", self.index_maps());
        for dev in &self.devices {
            render_device(&mut out, dev, self.exclusive.release_base);
        }
        out
    }

    /// Graphviz DOT: one cluster per device (solid = full edge, dashed = programmatic), and
    /// dotted red edges from each flag store to the nodes that wait on that flag.
    #[must_use]
    pub fn render_dot(&self) -> String {
        let mut out = String::from(
            "digraph plan {\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n",
        );
        for dev in &self.devices {
            let d = dev.device;
            let _ = writeln!(
                out,
                "  subgraph cluster_dev{d} {{\n    label=\"device {d}\";"
            );
            for (i, node) in dev.nodes.iter().enumerate() {
                let _ = writeln!(out, "    d{d}n{i} [label=\"{}\"];", dot_label(d, node));
            }
            for e in &dev.edges {
                let style = match e.kind {
                    super::EdgeKind::Full => "solid",
                    super::EdgeKind::Programmatic => "dashed, label=\"pdl\"",
                    super::EdgeKind::ProgrammaticDeferred => {
                        "dashed, label=\"pdl, waits at its end\""
                    }
                };
                let _ = writeln!(out, "    d{d}n{} -> d{d}n{} [style={style}];", e.from, e.to);
            }
            out.push_str("  }\n");
        }
        for setter in &self.devices {
            for (i, node) in setter.nodes.iter().enumerate() {
                for flag in node.flags_set() {
                    let waiter = &self.devices[flag.device];
                    for (j, w) in waiter.nodes.iter().enumerate() {
                        if w.flags_awaited().contains(&flag) {
                            let _ = writeln!(
                                out,
                                "  d{}n{i} -> d{}n{j} [style=dotted, color=red, label=\"flag{}\"];",
                                setter.device, waiter.device, flag.index
                            );
                        }
                    }
                }
            }
        }
        out.push_str("}\n");
        out
    }
}

fn dot_label(d: usize, node: &Node) -> String {
    match node {
        Node::Barrier(b) => format!("barrier\\nwait {} arrivals", b.arrivals),
        Node::PeerCopy(c) => format!(
            "copy t={}\\n{} → {}\\n{} B",
            c.stage,
            region(&c.src),
            region(&c.dst),
            c.bytes
        ),
        Node::FlagSet(f) => format!(
            "flag set t={}\\ndev{}.flag{}",
            f.stage, f.flag.device, f.flag.index
        ),
        Node::Gemm(g) => format!(
            "gemm t={} tile {}\\n{}×{}×{}\\nD={}",
            g.stage,
            opt(g.tile),
            g.shape.m,
            g.shape.n,
            g.shape.k,
            view(d, &g.d)
        ),
        Node::Reduce(r) => format!("reduce\\n{} sources → {}", r.sources.len(), view(d, &r.dst)),
        Node::AwaitRelease(w) => format!("await release\\n{}", flags(&w.flags)),
    }
}

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
    let _ = writeln!(
        out,
        "  {:<5} {:<4} {:<4} {:<14} {:<22} {:<22} {:<28} {:<22} {:<11} signal",
        "stage", "peer", "tile", "gemm m×n×k", "A", "B", "C (beta)", "D", "wait"
    );
    // Kernels first (the stage table), then the copy chain.
    let kernels_first = dev
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::Gemm(_) | Node::Reduce(_)));
    let copies = dev
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::PeerCopy(_) | Node::FlagSet(_)));
    let end = dev
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::AwaitRelease(_)));
    for node in kernels_first.chain(copies).chain(end) {
        match node {
            Node::Gemm(g) => {
                let c = match &g.epilogue.source {
                    CSource::None => "-".to_string(),
                    CSource::Local(v) | CSource::Peer(v) => {
                        format!("{} ({})", view(d, v), g.epilogue.beta)
                    }
                };
                let _ = writeln!(
                    out,
                    "  {:<5} {:<4} {:<4} {:<14} {:<22} {:<22} {:<28} {:<22} {:<11} {}",
                    g.stage,
                    opt(g.peer),
                    opt(g.tile),
                    format!("{}×{}×{}", g.shape.m, g.shape.n, g.shape.k),
                    view(d, &g.a),
                    view(d, &g.b),
                    c,
                    view(d, &g.d),
                    flags(&g.waits.into_iter().collect::<Vec<_>>()),
                    flags(&g.signals.into_iter().collect::<Vec<_>>()),
                );
            }
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
            Node::PeerCopy(cp) => {
                let _ = writeln!(
                    out,
                    "  copy for stage {}: {} → {} ({} B)",
                    cp.stage,
                    region(&cp.src),
                    region(&cp.dst),
                    cp.bytes
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
            Node::Barrier(_) => {}
        }
    }
}
