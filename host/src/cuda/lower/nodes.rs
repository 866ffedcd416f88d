//! One device's plan nodes lowered to graph nodes: one method per node kind.

use kernels_gpu::collective_abi::{
    BarrierParams, PeerErrorWords, REDUCE_VECTOR, ReduceParams, WaitFlagsParams,
};
use kernels_gpu::gemm_abi::{HOOK_DEFER_GRID_WAIT, HOOK_WAIT_BEFORE_C, StageHook};

use super::LowerOptions;
use super::LoweredNode;
use super::resolve::{Resolver, count, fixed};
use crate::cuda::error::{DistGemmError, TimeoutSite, WaitingNode, encode_timeout};
use crate::fp8::ScaleMode;
use crate::gemm::{Fp8GemmArgs, Fp8Scales, GemmArgs};
use crate::plan::{
    AwaitReleaseNode, BarrierNode, DevicePlan, EdgeKind, FlagSetNode, KERNEL_SIGNAL_VALUE, Node,
    PeerCopyNode, Plan,
};
use crate::schedule::{
    BufferKind, CSource, Collective, FlagRef, GemmStage, ReduceStep, RsPartials, View,
};

/// Row-wise FP8: the first global rows of A and of B that stage `g` multiplies — where its
/// rows start in the device's full scale vectors (`DeviceAddresses::{a,b}_scales`; the kernel
/// reads `sa[i]` for its A row `i` and `sb[j]` for its B row `j`, both contiguous). A view of
/// the device's own A (B) shard starts at the shard's first global row plus its offset in
/// rows. A view of the workspace is an all-gather's gathered operand, whose rows are the
/// stage's output rows (A) or columns (B): the global position of its D view, which is in
/// the device's D.
fn operand_rows(dev: &DevicePlan, g: &GemmStage) -> Result<(usize, usize), DistGemmError> {
    let internal = |what: String| {
        DistGemmError::Internal(format!("device {} stage {}: {what}", dev.device, g.stage))
    };
    let output = || {
        if g.d.buffer != BufferKind::D || g.d.ld == 0 {
            return Err(internal(format!(
                "a gathered operand's stage writes {:?}, not the device's D",
                g.d.buffer
            )));
        }
        let d = dev.shards.d;
        Ok((d.row0 + g.d.offset / g.d.ld, d.col0 + g.d.offset % g.d.ld))
    };
    let shard_row = |v: &View, block: crate::schedule::Block| {
        if v.ld == 0 || v.ld != block.cols || !v.offset.is_multiple_of(v.ld) {
            return Err(internal(format!(
                "operand view {v:?} does not start a row of its shard {block:?}"
            )));
        }
        Ok(block.row0 + v.offset / v.ld)
    };
    let a = match g.a.buffer {
        BufferKind::A => shard_row(&g.a, dev.shards.a)?,
        BufferKind::Workspace => output()?.0,
        other => return Err(internal(format!("A read from {other:?}"))),
    };
    let b = match g.b.buffer {
        BufferKind::B => shard_row(&g.b, dev.shards.b)?,
        BufferKind::Workspace => output()?.1,
        other => return Err(internal(format!("B read from {other:?}"))),
    };
    Ok((a, b))
}

/// Whether stage `g`'s flag wait guards only its C: a reduce-scatter stage with pushed
/// partials reads C from its own receive slot, which the left neighbour's copy fills before
/// setting the flag (A and B are its own shards). The kernel then waits just before its first
/// C load ([`HOOK_WAIT_BEFORE_C`]), so the first tile's main loop covers the copy.
fn waits_for_c_only(plan: &Plan, g: &GemmStage) -> bool {
    plan.schedule.collective() == Collective::ReduceScatter
        && plan.rs_partials == RsPartials::Push
        && g.waits.is_some()
        && matches!(g.epilogue.source, CSource::Local(_))
}

/// The lowering of one device: the plan, the resolved addresses and what every node of the
/// device shares; one method per node kind.
pub(super) struct DeviceLowering<'a> {
    pub(super) r: Resolver<'a>,
    pub(super) dev: &'a DevicePlan,
    pub(super) options: &'a LowerOptions,
    pub(super) timeout_ns: u64,
    pub(super) error_word: u64,
    pub(super) peer_errors: PeerErrorWords,
}

impl DeviceLowering<'_> {
    fn device(&self) -> usize {
        self.dev.device
    }

    /// Whether a store into `f` is made (fault injection drops some).
    fn sends(&self, f: &FlagRef) -> bool {
        !self.options.missing_signals.contains(f)
    }

    /// The error code of this device's `node` at `stage` waiting on `flag`.
    fn code(&self, node: WaitingNode, stage: usize, flag: Option<FlagRef>) -> u32 {
        encode_timeout(TimeoutSite {
            device: self.device(),
            node,
            stage,
            flag,
        })
    }

    pub(super) fn node(&self, index: usize, node: &Node) -> Result<LoweredNode, DistGemmError> {
        match node {
            Node::Barrier(b) => self.barrier(b),
            Node::PeerCopy(c) => self.copy(c),
            Node::FlagSet(f) => self.flag_set(f),
            Node::Gemm(g) => self.gemm(index, g),
            Node::Reduce(red) => self.reduce(red),
            Node::AwaitRelease(w) => self.await_release(w),
        }
    }

    fn barrier(&self, b: &BarrierNode) -> Result<LoweredNode, DistGemmError> {
        let r = &self.r;
        let reset = r.flags(&b.reset_flags)?;
        let arrive: Vec<u64> = b
            .arrive_at
            .iter()
            .map(|&q| r.counter(q))
            .collect::<Result<_, _>>()?;
        let uncoupled = self.options.diagnostics.no_rendezvous;
        Ok(LoweredNode::Barrier(BarrierParams {
            reset: fixed(&reset, "flags to reset")?,
            arrive: fixed(&arrive, "peers to arrive at")?,
            peer_errors: self.peer_errors,
            counter: r.counter(self.device())?,
            error_word: self.error_word,
            timeout_ns: self.timeout_ns,
            reset_count: count(reset.len()),
            arrive_count: if uncoupled { 0 } else { count(arrive.len()) },
            arrivals: if uncoupled { 0 } else { b.arrivals },
            error_code: self.code(WaitingNode::Barrier, 0, None),
        }))
    }

    fn copy(&self, c: &PeerCopyNode) -> Result<LoweredNode, DistGemmError> {
        Ok(LoweredNode::Copy {
            dst: self.r.region(&c.dst)?,
            src: self.r.region(&c.src)?,
            bytes: self
                .options
                .diagnostics
                .copy_limit
                .map_or(c.bytes, |limit| c.bytes.min(limit)),
        })
    }

    fn flag_set(&self, f: &FlagSetNode) -> Result<LoweredNode, DistGemmError> {
        Ok(LoweredNode::FlagSet {
            dst: self.r.flag(&f.flag)?,
            value: if self.sends(&f.flag) { f.value } else { 0 },
        })
    }

    fn gemm(&self, index: usize, g: &GemmStage) -> Result<LoweredNode, DistGemmError> {
        let (r, device, diagnostics) = (&self.r, self.device(), &self.options.diagnostics);
        let deferred = self
            .dev
            .predecessors(index)
            .any(|(_, kind)| kind == EdgeKind::ProgrammaticDeferred);
        if deferred {
            check_deferrable(device, g)?;
        }
        let c = g
            .epilogue
            .source
            .view()
            .map(|v| {
                let v = if diagnostics.local_c {
                    View { device, ..*v }
                } else {
                    *v
                };
                r.view(&v)
            })
            .transpose()?;
        let (a, b, d) = (r.view(&g.a)?, r.view(&g.b)?, r.view(&g.d)?);
        let (alpha, beta) = (g.epilogue.alpha, g.epilogue.beta);
        let scales = match (r.plan.problem.fp8, self.options.fp8_scales) {
            (None, None) => None,
            (Some(fp8), Some([sa, sb])) if fp8.scales == ScaleMode::Tensorwise => {
                Some(Fp8Scales::Tensorwise { a: sa, b: sb })
            }
            (Some(fp8), None) if fp8.scales == ScaleMode::Rowwise => {
                let own = r.device(device)?;
                if own.a_scales == 0 || own.b_scales == 0 {
                    return Err(DistGemmError::Internal(format!(
                        "device {device}: a row-wise FP8 plan without its scale vectors"
                    )));
                }
                let (a_row, b_row) = operand_rows(self.dev, g)?;
                Some(Fp8Scales::Rowwise {
                    a: own.a_scales + 4 * a_row as u64,
                    b: own.b_scales + 4 * b_row as u64,
                })
            }
            (fp8, scales) => {
                return Err(DistGemmError::Internal(format!(
                    "device {device}: an FP8 plan ({fp8:?}) needs tensor-wise scales or \
                     row-wise scale vectors, a 16-bit one neither (got {scales:?})"
                )));
            }
        };
        let (args, fp8) = match scales {
            None => {
                let dtype = r.plan.problem.dtype;
                let args = GemmArgs {
                    dtype,
                    a,
                    b,
                    c,
                    d,
                    alpha,
                    beta,
                };
                (args, None)
            }
            Some(scales) => {
                let stage = Fp8GemmArgs {
                    a,
                    b,
                    c,
                    d,
                    alpha,
                    beta,
                    scales,
                };
                let (args, rows) = stage.as_pairs().map_err(|e| DistGemmError::Gemm {
                    device,
                    stage: g.stage,
                    source: e,
                })?;
                (args, Some(rows))
            }
        };
        let signal_flag = match g.signals.filter(|f| self.sends(f)) {
            Some(f) => r.flag(&f)?,
            None => 0,
        };
        let wait_flag = match &g.waits {
            Some(f) if !diagnostics.no_flag_waits => r.flag(f)?,
            _ => 0,
        };
        let hook = StageHook {
            signal_flag,
            wait_flag,
            error_word: self.error_word,
            timeout_ns: self.timeout_ns,
            signal_value: KERNEL_SIGNAL_VALUE,
            wait_value: 1,
            error_code: self.code(WaitingNode::Gemm, g.stage, g.waits),
            flags: if deferred {
                HOOK_DEFER_GRID_WAIT
            } else if waits_for_c_only(r.plan, g) {
                HOOK_WAIT_BEFORE_C
            } else {
                0
            },
            peer_errors: self.peer_errors,
        };
        Ok(LoweredNode::Gemm {
            stage: g.stage,
            args,
            fp8,
            hook,
        })
    }

    fn reduce(&self, red: &ReduceStep) -> Result<LoweredNode, DistGemmError> {
        let r = &self.r;
        let dst = r.view(&red.dst)?;
        let mut sources = Vec::with_capacity(red.sources.len());
        let mut source_ld = Vec::with_capacity(red.sources.len());
        for s in &red.sources {
            if (s.rows, s.cols) != (red.dst.rows, red.dst.cols) {
                return Err(DistGemmError::Internal(format!(
                    "reduce source {s:?} is not the shape of its destination"
                )));
            }
            let v = r.view(s)?;
            sources.push(v.ptr);
            source_ld.push(u32::try_from(v.ld).map_err(|_| {
                DistGemmError::Internal(format!("leading dimension {} exceeds 2^32", v.ld))
            })?);
        }
        let vector_ok = |x: u64| x.is_multiple_of(u64::from(REDUCE_VECTOR));
        let aligned = sources
            .iter()
            .chain([&dst.ptr])
            .all(|p| p.is_multiple_of(16))
            && source_ld.iter().all(|&ld| vector_ok(u64::from(ld)))
            && vector_ok(dst.ld)
            && vector_ok(dst.cols);
        if !aligned {
            return Err(DistGemmError::Internal(format!(
                "the reduction of device {} is not 16-byte aligned",
                self.device()
            )));
        }
        let signals = r.flags(red.signals.iter().filter(|f| self.sends(f)))?;
        let waits = r.flags(&red.waits)?;
        let codes: Vec<u32> = red
            .waits
            .iter()
            .map(|f| self.code(WaitingNode::Reduce, red.stage, Some(*f)))
            .collect();
        let dim = |x: u64| {
            u32::try_from(x).map_err(|_| {
                DistGemmError::Internal(format!("reduction dimension {x} exceeds 2^32"))
            })
        };
        Ok(LoweredNode::Reduce(ReduceParams {
            sources: fixed(&sources, "reduction sources")?,
            signals: fixed(&signals, "flags to signal")?,
            waits: fixed(&waits, "flags to wait on")?,
            source_ld: fixed(&source_ld, "reduction sources")?,
            wait_codes: fixed(&codes, "flags to wait on")?,
            peer_errors: self.peer_errors,
            dst: dst.ptr,
            error_word: self.error_word,
            timeout_ns: self.timeout_ns,
            rows: dim(dst.rows)?,
            cols: dim(dst.cols)?,
            dst_ld: dim(dst.ld)?,
            source_count: count(sources.len()),
            signal_count: count(signals.len()),
            wait_count: count(waits.len()),
            signal_value: KERNEL_SIGNAL_VALUE,
            reserved: 0,
        }))
    }

    fn await_release(&self, w: &AwaitReleaseNode) -> Result<LoweredNode, DistGemmError> {
        let flags = self.r.flags(&w.flags)?;
        let codes: Vec<u32> = w
            .flags
            .iter()
            .map(|f| self.code(WaitingNode::Release, 0, Some(*f)))
            .collect();
        Ok(LoweredNode::WaitFlags(WaitFlagsParams {
            flags: fixed(&flags, "release flags")?,
            peer_errors: self.peer_errors,
            codes: fixed(&codes, "release flags")?,
            error_word: self.error_word,
            timeout_ns: self.timeout_ns,
            count: count(flags.len()),
            reserved: 0,
        }))
    }
}

/// A stage that waits for its programmatic predecessor only at its end
/// ([`HOOK_DEFER_GRID_WAIT`]) may touch nothing that predecessor (the start-of-run barrier)
/// guards: no flag to wait on or signal, only its own device's memory, and it writes only its
/// own D (a workspace slot may still be read by a peer's previous run until the barrier, as a
/// reduce-scatter stage 0's is). The plan's construction guarantees it; this keeps an edited
/// or future plan from breaking it silently.
fn check_deferrable(device: usize, g: &GemmStage) -> Result<(), DistGemmError> {
    let views = [Some(&g.a), Some(&g.b), Some(&g.d), g.epilogue.source.view()];
    let peer_view = views.into_iter().flatten().find(|v| v.device != device);
    if g.waits.is_some() || g.signals.is_some() || peer_view.is_some() {
        return Err(DistGemmError::Internal(format!(
            "device {device}'s stage {} waits for the barrier only at its end, but it waits on \
             {:?}, signals {:?} or reads a peer's view ({peer_view:?})",
            g.stage, g.waits, g.signals
        )));
    }
    if g.d.buffer != BufferKind::D {
        return Err(DistGemmError::Internal(format!(
            "device {device}'s stage {} waits for the barrier only at its end, but it writes \
             its {} buffer, not its D",
            g.stage,
            g.d.buffer.name()
        )));
    }
    Ok(())
}
