//! Human-readable renderings of a plan: Graphviz DOT, and with the `cli` feature a
//! per-(device, stage) text table (module `table`).

#[cfg(feature = "cli")]
mod table;

use std::fmt::Write as _;

use super::{Node, Plan};
use crate::schedule::{CopyDirection, Region, View};

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

impl Plan {
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
            "{} t={}\\n{} → {}\\n{} B",
            match c.direction {
                CopyDirection::Pull => "copy",
                CopyDirection::Push => "push",
            },
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
