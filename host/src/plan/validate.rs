//! [`Plan::validate`]: everything an executor relies on, checked once, so that a plan read
//! from JSON (possibly edited) is refused with an error instead of panicking a device thread,
//! reading wrong rows or asking for terabytes. The checks are listed at [`Plan::validate`].

use super::{EdgeKind, ExclusiveLayout, Node, PeerCopyNode, Plan, PlanError, RsPartials};
use crate::schedule::{
    Block, BufferKind, CSource, Collective, CopyDirection, GemmStage, MAX_ELEMENTS, ReduceStep,
    Region, View, can_implement,
};

impl Plan {
    /// Checks that the plan is one the executors can run safely; [`Plan::build`] and
    /// [`Plan::from_json`] call it. The checks, in order:
    /// 1. the schedule can run the problem on `tp` devices ([`can_implement`]), there are `tp`
    ///    device plans numbered `0..tp`, the exclusive layout is the one for `tp` devices, and
    ///    partials are pushed only by a schedule that has them ([`RsPartials::applies_to`]);
    /// 2. per device: its shard blocks lie inside the global matrices (C exactly when beta ≠ 0),
    ///    its workspace has at most 2^40 elements and `workspace_bytes` matches it;
    /// 3. per device: edges go forward (`from < to < nodes`), so the node list is a topological
    ///    order and the DAG is acyclic, and an edge is deferred
    ///    ([`EdgeKind::ProgrammaticDeferred`]) only into a pipelined all-gather's stage-0 GEMM;
    /// 4. per node: views and regions lie inside their buffers (saturating ends, so nothing wraps)
    ///    with 16-byte aligned offsets and leading dimensions; flags exist; a GEMM's views have
    ///    its shape and it writes its own D; a copy moves equal lengths with
    ///    `bytes = len · element size`, a pull into its own device, a push (only in a plan of
    ///    pushed partials) from its own workspace into a peer's; in a plan of pushed partials
    ///    no GEMM reads a peer's C; a reduction's sources have its destination's shape;
    ///    a barrier arrives only at peers, and every device waits for exactly the arrivals the
    ///    other barriers send it; in an FP8 plan, a GEMM's A and B views point at e4m3
    ///    buffers and its C and D views and a reduction's views at output-typed ones
    ///    ([`PlanError::ElementType`]), views and regions of operand buffers cover whole rows
    ///    ([`Plan::operand_row_elements`]), which is how row-wise scales find and follow their
    ///    rows, and a copy moves elements of one type.
    pub fn validate(&self) -> Result<(), PlanError> {
        can_implement(self.schedule, &self.problem, self.tp)?;
        let inconsistent = |what: String| Err(PlanError::Inconsistent(what));
        if self.devices.len() != self.tp {
            return inconsistent(format!(
                "TP is {} but the plan has {} devices",
                self.tp,
                self.devices.len()
            ));
        }
        if let Some((i, dev)) = self
            .devices
            .iter()
            .enumerate()
            .find(|(i, d)| d.device != *i)
        {
            return inconsistent(format!(
                "device plan {i} is numbered {} (device plans must be in device order)",
                dev.device
            ));
        }
        if self.exclusive != ExclusiveLayout::new(self.tp) {
            return inconsistent(format!(
                "the exclusive workspace layout {:?} is not the one for TP={}",
                self.exclusive, self.tp
            ));
        }
        if self.rs_partials != self.rs_partials.effective(self.schedule) {
            return inconsistent(format!(
                "{} has no partials to push (rs_partials \"{}\" applies to the pipelined \
                 reduce-scatter schedules only)",
                self.schedule.cli_name(),
                self.rs_partials.cli_name()
            ));
        }
        for dev in &self.devices {
            self.check_device_layout(dev.device)
                .or_else(|what| inconsistent(format!("device {}: {what}", dev.device)))?;
            for (i, e) in dev.edges.iter().enumerate() {
                if e.from >= e.to || e.to >= dev.nodes.len() {
                    return inconsistent(format!(
                        "device {}: edge {i} goes from node {} to node {} of {} (edges must go \
                         forward between existing nodes)",
                        dev.device,
                        e.from,
                        e.to,
                        dev.nodes.len()
                    ));
                }
                self.check_deferred_edge(dev.device, i)?;
            }
            for node in &dev.nodes {
                self.check_element_types(dev.device, node)?;
                self.check_node(dev.device, node)
                    .map_err(|what| PlanError::InvalidView {
                        device: dev.device,
                        node: node.name(),
                        what,
                    })?;
            }
        }
        self.check_barrier_arrivals()
    }

    /// Edge `edge` of `device` (inside the node list) is deferred only into stage 0's GEMM of
    /// a pipelined all-gather ([`PlanError::DeferredEdge`]).
    fn check_deferred_edge(&self, device: usize, edge: usize) -> Result<(), PlanError> {
        let dev = &self.devices[device];
        let e = dev.edges[edge];
        let to = &dev.nodes[e.to];
        let pipelined_all_gather =
            self.schedule.is_pipelined() && self.schedule.collective() == Collective::AllGather;
        let first_gemm = matches!(to, Node::Gemm(g) if g.stage == 0);
        if e.kind != EdgeKind::ProgrammaticDeferred || (pipelined_all_gather && first_gemm) {
            return Ok(());
        }
        Err(PlanError::DeferredEdge {
            device,
            edge,
            node: to.name(),
            stage: to.stage(),
            schedule: self.schedule,
        })
    }

    /// Shard blocks inside the global matrices, C present exactly when beta ≠ 0, a workspace
    /// of at most 2^40 elements whose byte size is recorded correctly.
    fn check_device_layout(&self, device: usize) -> Result<(), String> {
        let dev = &self.devices[device];
        let p = &self.problem;
        let blocks = [
            ("A", Some(dev.shards.a), p.m, p.k),
            ("B", Some(dev.shards.b), p.n, p.k),
            ("C", dev.shards.c, p.m, p.n),
            ("D", Some(dev.shards.d), p.m, p.n),
        ];
        for (name, block, rows, cols) in blocks {
            if let Some(block) = block
                && !block_inside(&block, rows, cols)
            {
                return Err(format!(
                    "its {name} shard {block:?} is not inside the {rows}×{cols} global {name}"
                ));
            }
        }
        if dev.shards.c.is_some() != p.has_c() {
            return Err(format!(
                "it {} a C shard but beta is {}",
                if dev.shards.c.is_some() {
                    "has"
                } else {
                    "lacks"
                },
                p.beta
            ));
        }
        let elements = dev.workspace.elements();
        if elements > MAX_ELEMENTS {
            return Err(format!(
                "its workspace of {elements} elements is larger than 2^40"
            ));
        }
        let element_bytes = self.element_bytes(BufferKind::Workspace);
        let bytes = elements * element_bytes;
        if dev.workspace_bytes != bytes {
            return Err(format!(
                "workspace_bytes is {} but {elements} elements take {bytes} ({element_bytes} \
                 per element)",
                dev.workspace_bytes
            ));
        }
        Ok(())
    }

    /// The checks of one node of `device` (module documentation, point 4).
    fn check_node(&self, device: usize, node: &Node) -> Result<(), String> {
        for view in node_views(node) {
            self.check_view(&view)?;
        }
        for region in node_regions(node) {
            self.check_region(&region)?;
        }
        for flag in node.flags_set().into_iter().chain(node.flags_awaited()) {
            if flag.device >= self.tp || flag.index >= self.exclusive.flag_count {
                return Err(format!(
                    "flag {} of device {} does not exist",
                    flag.index, flag.device
                ));
            }
        }
        if node.stage() > self.tp {
            return Err(format!(
                "stage {} is beyond the last stage of TP={}",
                node.stage(),
                self.tp
            ));
        }
        match node {
            Node::Barrier(b) => {
                if let Some(f) = b.reset_flags.iter().find(|f| f.device != device) {
                    return Err(format!(
                        "it resets flag {} of device {}, not its own",
                        f.index, f.device
                    ));
                }
                let mut seen = vec![false; self.tp];
                for &q in &b.arrive_at {
                    if q == device || q >= self.tp || std::mem::replace(&mut seen[q], true) {
                        return Err(format!(
                            "it arrives at device {q}: arrivals go once to each existing peer"
                        ));
                    }
                }
                Ok(())
            }
            Node::PeerCopy(c) => self.check_copy(device, c),
            Node::FlagSet(_) => Ok(()),
            Node::AwaitRelease(w) => match w.flags.iter().find(|f| f.device != device) {
                Some(f) => Err(format!(
                    "it waits for flag {} of device {}, not its own",
                    f.index, f.device
                )),
                None => Ok(()),
            },
            Node::Gemm(g) => self.check_gemm(device, g),
            Node::Reduce(r) => check_reduce(device, r),
        }
    }

    /// Equal lengths, `bytes = len · element size`; a pull writes the own device's memory, a
    /// push (only in a plan of pushed partials) reads the own workspace and writes a peer's.
    fn check_copy(&self, device: usize, c: &PeerCopyNode) -> Result<(), String> {
        let element_bytes = self.element_bytes(c.src.buffer);
        if self.element_bytes(c.dst.buffer) != element_bytes {
            return Err(format!(
                "a copy of {:?} into {:?}: its buffers hold elements of different types",
                c.src, c.dst
            ));
        }
        let bytes = c.src.len.checked_mul(element_bytes);
        if c.src.len != c.dst.len || bytes != Some(c.bytes) {
            return Err(format!(
                "a copy of {:?} into {:?} recording {} bytes: lengths must be equal and bytes = \
                 length × element size",
                c.src, c.dst, c.bytes
            ));
        }
        match c.direction {
            CopyDirection::Pull if c.dst.device != device => Err(format!(
                "a pull into {:?}: a pull writes its own device's memory",
                c.dst
            )),
            CopyDirection::Push if self.rs_partials != RsPartials::Push => Err(format!(
                "a push of {:?} in a plan whose partials are {}",
                c.src,
                self.rs_partials.cli_name()
            )),
            CopyDirection::Push
                if c.src.device != device
                    || c.src.buffer != BufferKind::Workspace
                    || c.dst.device == device
                    || c.dst.buffer != BufferKind::Workspace =>
            {
                Err(format!(
                    "a push of {:?} into {:?}: a push copies its own workspace into a peer's",
                    c.src, c.dst
                ))
            }
            CopyDirection::Pull | CopyDirection::Push => Ok(()),
        }
    }

    /// A GEMM's views have its shape (A m×k, B n×k, C and D m×n), D is the own device's, a
    /// GEMM without C has beta = 0 (else the executors would silently drop `beta·C`), a GEMM
    /// of a plan of pushed partials reads no peer's C, and its peer and tile name devices.
    fn check_gemm(&self, device: usize, g: &GemmStage) -> Result<(), String> {
        if let (RsPartials::Push, CSource::Peer(v)) = (self.rs_partials, &g.epilogue.source) {
            return Err(format!(
                "stage {} reads C from device {}'s {} in a plan of pushed partials (C is the \
                 own receive slot)",
                g.stage,
                v.device,
                v.buffer.name()
            ));
        }
        let s = g.shape;
        let mut views = vec![
            ("A", g.a, s.m, s.k),
            ("B", g.b, s.n, s.k),
            ("D", g.d, s.m, s.n),
        ];
        if let Some(c) = g.epilogue.source.view() {
            views.push(("C", *c, s.m, s.n));
        } else if g.epilogue.beta != 0.0 {
            return Err(format!(
                "beta is {} but the epilogue has no C",
                g.epilogue.beta
            ));
        }
        for (name, v, rows, cols) in views {
            if (v.rows, v.cols) != (rows, cols) {
                return Err(format!(
                    "its {name} view is {}×{} but the GEMM shape {}×{}×{} needs {rows}×{cols}",
                    v.rows, v.cols, s.m, s.n, s.k
                ));
            }
        }
        if g.d.device != device {
            return Err(format!(
                "it writes device {}'s {}: a GEMM writes its own device's memory",
                g.d.device,
                g.d.buffer.name()
            ));
        }
        for (what, index) in [("peer", g.peer), ("tile", g.tile)] {
            if let Some(i) = index
                && i >= self.tp
            {
                return Err(format!("{what} {i} does not exist at TP={}", self.tp));
            }
        }
        Ok(())
    }

    /// A GEMM's A and B views point at operand buffers
    /// ([`crate::problem::Problem::operand_bytes`] per element: 1 in an FP8 plan), its C and D
    /// views and a reduction's views at output buffers
    /// ([`crate::problem::Problem::output_bytes`]); a copy's two buffers are compared by [`Plan::check_copy`].
    /// The executors read each view with its role's element type, so a mismatch would read
    /// the wrong bytes or none.
    fn check_element_types(&self, device: usize, node: &Node) -> Result<(), PlanError> {
        let (operand, output) = (self.problem.operand_bytes(), self.problem.output_bytes());
        let roles: Vec<(&'static str, &View, usize)> = match node {
            Node::Gemm(g) => [
                Some(("A", &g.a, operand)),
                Some(("B", &g.b, operand)),
                g.epilogue.source.view().map(|c| ("C", c, output)),
                Some(("D", &g.d, output)),
            ]
            .into_iter()
            .flatten()
            .collect(),
            Node::Reduce(r) => r
                .sources
                .iter()
                .map(|s| ("reduction source", s, output))
                .chain([("reduction destination", &r.dst, output)])
                .collect(),
            Node::Barrier(_) | Node::PeerCopy(_) | Node::FlagSet(_) | Node::AwaitRelease(_) => {
                Vec::new()
            }
        };
        for (role, view, expected) in roles {
            let got = self.element_bytes(view.buffer);
            if got != expected {
                return Err(PlanError::ElementType {
                    device,
                    node: node.name(),
                    role,
                    view_device: view.device,
                    buffer: view.buffer,
                    got,
                    expected,
                });
            }
        }
        Ok(())
    }

    /// Every device waits for exactly as many arrivals as the other devices' barriers send it
    /// (a mismatch would leave the running counter off by some arrivals for good).
    fn check_barrier_arrivals(&self) -> Result<(), PlanError> {
        let mut sent = vec![0usize; self.tp];
        for dev in &self.devices {
            for node in &dev.nodes {
                if let Node::Barrier(b) = node {
                    for &q in &b.arrive_at {
                        sent[q] += 1;
                    }
                }
            }
        }
        for dev in &self.devices {
            let waits: Vec<u32> = dev
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Node::Barrier(b) => Some(b.arrivals),
                    _ => None,
                })
                .collect();
            let received = sent[dev.device];
            let consistent = match waits.as_slice() {
                [] => received == 0,
                [arrivals] => usize::try_from(*arrivals).is_ok_and(|a| a == received),
                _ => false,
            };
            if !consistent {
                return Err(PlanError::Inconsistent(format!(
                    "device {} has barriers waiting for {waits:?} arrivals, the others send {received} \
                     (one barrier per device, waiting for every arrival sent to it)",
                    dev.device
                )));
            }
        }
        Ok(())
    }

    fn buffer_len(&self, device: usize, buffer: BufferKind) -> Result<usize, String> {
        self.devices
            .get(device)
            .map(|d| d.buffer_elements(buffer))
            .ok_or_else(|| format!("device {device} does not exist"))
    }

    /// In an FP8 plan, a view (offset, ld, cols) or region (offset, len) of an operand buffer
    /// starts at a row and spans whole rows.
    fn check_whole_rows(
        &self,
        device: usize,
        buffer: BufferKind,
        starts: usize,
        spans: &[usize],
    ) -> Result<(), String> {
        let row = match (self.problem.fp8, self.operand_row_elements(device, buffer)) {
            (Some(_), Some(row)) => row,
            _ => return Ok(()),
        };
        if row == 0 || !starts.is_multiple_of(row) || spans.iter().any(|s| !s.is_multiple_of(row)) {
            return Err(format!(
                "it touches device {device}'s {} at element {starts} spanning {spans:?}, not \
                 whole rows of {row} e4m3 elements (row-wise scales move with whole rows)",
                buffer.name()
            ));
        }
        Ok(())
    }

    fn check_view(&self, v: &View) -> Result<(), String> {
        self.check_whole_rows(v.device, v.buffer, v.offset, &[v.ld, v.cols])?;
        let len = self.buffer_len(v.device, v.buffer)?;
        let align = crate::schedule::align_elements(self.element_bytes(v.buffer));
        if v.end() > len || v.cols > v.ld {
            return Err(format!("view {v:?} exceeds its buffer of {len} elements"));
        }
        if !v.offset.is_multiple_of(align) || !v.ld.is_multiple_of(align) {
            return Err(format!("view {v:?} is not 16-byte aligned"));
        }
        Ok(())
    }

    fn check_region(&self, r: &Region) -> Result<(), String> {
        self.check_whole_rows(r.device, r.buffer, r.offset, &[r.len])?;
        let len = self.buffer_len(r.device, r.buffer)?;
        if r.end() > len {
            return Err(format!("region {r:?} exceeds its buffer of {len} elements"));
        }
        Ok(())
    }
}

/// Whether `block` lies inside a `rows × cols` matrix.
fn block_inside(block: &Block, rows: usize, cols: usize) -> bool {
    block
        .row0
        .checked_add(block.rows)
        .is_some_and(|r| r <= rows)
        && block
            .col0
            .checked_add(block.cols)
            .is_some_and(|c| c <= cols)
}

/// A reduction's sources have its destination's shape, which is the own device's.
fn check_reduce(device: usize, r: &ReduceStep) -> Result<(), String> {
    if r.dst.device != device {
        return Err(format!(
            "it writes device {}'s {}: a reduction writes its own device's memory",
            r.dst.device,
            r.dst.buffer.name()
        ));
    }
    if let Some(src) = r
        .sources
        .iter()
        .find(|s| (s.rows, s.cols) != (r.dst.rows, r.dst.cols))
    {
        return Err(format!(
            "source {src:?} is {}×{} but the destination is {}×{}",
            src.rows, src.cols, r.dst.rows, r.dst.cols
        ));
    }
    Ok(())
}

/// Every matrix view a node reads or writes.
fn node_views(node: &Node) -> Vec<View> {
    match node {
        Node::Gemm(g) => [
            Some(g.a),
            Some(g.b),
            Some(g.d),
            g.epilogue.source.view().copied(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        Node::Reduce(r) => r.sources.iter().copied().chain([r.dst]).collect(),
        Node::Barrier(_) | Node::PeerCopy(_) | Node::FlagSet(_) | Node::AwaitRelease(_) => {
            Vec::new()
        }
    }
}

/// Every flat region a node reads or writes.
fn node_regions(node: &Node) -> Vec<Region> {
    match node {
        Node::PeerCopy(c) => vec![c.src, c.dst],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanOptions;
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;

    fn push_plan() -> Plan {
        Plan::build_with(
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(96, 64, 96),
            3,
            PlanOptions {
                rs_partials: RsPartials::Push,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Applies `edit` to the first push of device 1 of a valid push plan; returns the error.
    fn with_push(edit: impl FnOnce(&mut PeerCopyNode)) -> String {
        let mut plan = push_plan();
        let copy = plan.devices[1].nodes.iter_mut().find_map(|n| match n {
            Node::PeerCopy(c) => Some(c),
            _ => None,
        });
        edit(copy.unwrap_or_else(|| panic!("no push")));
        plan.validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_malformed_push_is_refused() {
        assert!(push_plan().validate().is_ok());
        type Edit = fn(&mut PeerCopyNode);
        let cases: [(Edit, &str); 5] = [
            (
                |c| c.dst.device = 1,
                "copies its own workspace into a peer's",
            ),
            (
                |c| c.src.device = 0,
                "copies its own workspace into a peer's",
            ),
            (
                |c| c.dst.buffer = BufferKind::D,
                "copies its own workspace into a peer's",
            ),
            (
                |c| c.direction = CopyDirection::Pull,
                "a pull writes its own device",
            ),
            (|c| c.bytes += 2, "bytes = length × element size"),
        ];
        for (edit, needle) in cases {
            let err = with_push(edit);
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
            assert!(err.contains("device 1, copy node"), "{err}");
        }
    }

    #[test]
    fn pushes_and_remote_c_do_not_mix() {
        // A push in a plan that says partials are read.
        let mut plan = push_plan();
        plan.rs_partials = RsPartials::Read;
        let err = plan.validate().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("in a plan whose partials are read")),
            "{err:?}"
        );
        // A stage that reads its left neighbour's slot in a plan that pushes.
        let mut plan = push_plan();
        if let Some(Node::Gemm(g)) = plan.devices[2]
            .nodes
            .iter_mut()
            .find(|n| matches!(n, Node::Gemm(g) if g.stage == 1))
            && let Some(v) = g.epilogue.source.view()
        {
            g.epilogue.source = CSource::Peer(View { device: 1, ..*v });
        }
        let err = plan.validate().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("stage 1 reads C from device 1's ws")),
            "{err:?}"
        );
    }

    #[test]
    fn only_the_pipelined_reduce_scatter_pushes() {
        for kind in ScheduleKind::ALL {
            let mut plan =
                Plan::build(kind, Problem::new(96, 96, 96), 3).unwrap_or_else(|e| panic!("{e}"));
            plan.rs_partials = RsPartials::Push;
            match (RsPartials::applies_to(kind), plan.validate()) {
                (false, Err(PlanError::Inconsistent(what))) => {
                    assert!(what.contains("no partials to push"), "{what}");
                }
                // The read DAG under a push label: its stages read the left neighbour's slot.
                (true, Err(PlanError::InvalidView { what, .. })) => {
                    assert!(what.contains("in a plan of pushed partials"), "{what}");
                }
                (_, other) => panic!("{kind}: {other:?}"),
            }
        }
    }

    /// A deferred edge enters only a pipelined all-gather's stage-0 GEMM: moved to its
    /// stage 1, added to a single-stage all-gather's GEMM or to a reduce-scatter's stage 0
    /// (which writes a workspace slot a peer's previous run may still read), it is refused.
    #[test]
    fn only_a_pipelined_all_gathers_first_stage_is_deferred() {
        let problem = Problem::new(96, 96, 96);
        /// `kind`'s plan at TP=3 with the edges into device 1's GEMM of stage `stage` deferred.
        fn deferred_into(kind: ScheduleKind, problem: Problem, stage: usize) -> Plan {
            let mut plan = Plan::build(kind, problem, 3).unwrap_or_else(|e| panic!("{e}"));
            let dev = &mut plan.devices[1];
            let to = dev
                .nodes
                .iter()
                .position(|n| matches!(n, Node::Gemm(g) if g.stage == stage))
                .unwrap_or_else(|| panic!("{kind}: no stage {stage}"));
            for e in dev.edges.iter_mut().filter(|e| e.to == to) {
                e.kind = EdgeKind::ProgrammaticDeferred;
            }
            plan
        }
        for kind in [
            ScheduleKind::AllGatherRotatingA,
            ScheduleKind::AllGatherRotatingB,
        ] {
            assert_eq!(deferred_into(kind, problem, 0).validate(), Ok(()));
            let err = deferred_into(kind, problem, 1).validate();
            assert!(
                matches!(
                    err,
                    Err(PlanError::DeferredEdge {
                        device: 1,
                        node: "gemm",
                        stage: 1,
                        ..
                    })
                ),
                "{kind}: {err:?}"
            );
        }
        for kind in [
            ScheduleKind::AllGatherSingleStageA,
            ScheduleKind::ReduceScatterTilingA,
            ScheduleKind::ReduceScatterTilingB,
            ScheduleKind::ReduceScatterSingleStageB,
        ] {
            let err = deferred_into(kind, problem, 0).validate();
            assert!(
                matches!(
                    &err,
                    Err(PlanError::DeferredEdge { device: 1, node: "gemm", stage: 0, schedule, .. })
                        if *schedule == kind
                ),
                "{kind}: {err:?}"
            );
            let msg = err.map_err(|e| e.to_string()).err().unwrap_or_default();
            assert!(
                msg.contains(
                    "is deferred; only a pipelined all-gather's stage-0 GEMM may be deferred"
                ),
                "{msg}"
            );
        }
    }
}
