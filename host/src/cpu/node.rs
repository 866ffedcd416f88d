//! Executing one plan node on the CPU, with the memory orderings the GPU uses:
//!
//! | node | GPU | CPU |
//! |---|---|---|
//! | barrier | `st.relaxed` resets, `fence.acq_rel.sys`, `red.release.sys` arrivals, `ld.acquire.sys` poll, `atom.acq_rel.sys` subtraction | relaxed stores, `Release` RMWs, `Acquire` loads, `AcqRel` RMW |
//! | flag set | write-value node: a fence "similar to `__threadfence_system()`" (the driver's words), then a 32-bit write | `SeqCst` fence, then a relaxed store |
//! | kernel signal | `fence.acq_rel.sys`, `st.release.sys` | `Release` store |
//! | flag wait, release wait | `ld.acquire.sys` poll | `Acquire` loads |

use std::sync::atomic::{Ordering, fence};
use std::time::Instant;

use super::ExecError;
use super::memory::{
    DeviceMemory, ExclusiveWorkspace, copy_region, read_view_e4m3, read_view_f32, write_view,
};
use super::wait::{WaitFailure, Waiter};
use crate::dtype::Element;
use crate::fp8::{ScaleMode, Scales};
use crate::plan::{BarrierNode, KERNEL_SIGNAL_VALUE, Node};
use crate::reference::{EpilogueInput, gemm_f32, gemm_scaled_f32};
use crate::schedule::{FlagRef, GemmStage, ReduceStep};
use crate::trace::record::Recorder;

/// What a node needs to run: all devices' memory, all exclusive workspaces, the waiter, and
/// the recorder of a traced run.
pub(crate) struct Context<'a, T> {
    pub(crate) memory: &'a [DeviceMemory<T>],
    pub(crate) exclusive: &'a [ExclusiveWorkspace],
    pub(crate) waiter: Waiter<'a>,
    pub(crate) trace: Option<&'a Recorder>,
}

/// When a kernel's prologue waited for its flags (traced runs only).
type FlagWait = Option<(Instant, Instant)>;

impl<T: Element> Context<'_, T> {
    fn flag(&self, f: &FlagRef) -> &std::sync::atomic::AtomicU32 {
        &self.exclusive[f.device].flags[f.index]
    }

    /// Runs `node` of `device`; in a traced run, returns when a kernel's prologue waited for
    /// its flags.
    pub(crate) fn run(&self, device: usize, node: &Node) -> Result<FlagWait, ExecError> {
        match node {
            Node::Barrier(b) => self.barrier(device, b).map(|()| None),
            Node::PeerCopy(c) => {
                copy_region(self.memory, &c.src, &c.dst);
                Ok(None)
            }
            Node::FlagSet(f) => {
                // The write-value node's fence, then its plain write: together a release, so
                // the copy before it (same chain) is visible to whoever acquires the value.
                fence(Ordering::SeqCst);
                self.flag(&f.flag).store(f.value, Ordering::Relaxed);
                Ok(None)
            }
            Node::Gemm(g) => {
                let waited = self.prologue(
                    device,
                    g.stage,
                    "gemm",
                    g.signals.as_slice(),
                    g.waits.as_slice(),
                )?;
                self.gemm(g)?;
                Ok(waited)
            }
            Node::Reduce(r) => {
                let waited = self.prologue(device, r.stage, "reduce", &r.signals, &r.waits)?;
                self.reduce(r);
                Ok(waited)
            }
            Node::AwaitRelease(w) => self
                .wait_flags(device, 0, "release", &w.flags)
                .map(|()| None),
        }
    }

    /// Reset own flags, release-arrive at every peer, acquire-wait for P−1 arrivals, consume
    /// them (running counter: early arrivals for the next run survive).
    fn barrier(&self, device: usize, b: &BarrierNode) -> Result<(), ExecError> {
        // The wait counts from before the arrivals: a peer that passes its barrier thanks to
        // them and then gets stuck began waiting later, so this timeout is the one reported.
        let start = Instant::now();
        for f in &b.reset_flags {
            self.flag(f).store(0, Ordering::Relaxed);
        }
        for &q in &b.arrive_at {
            // Release orders the resets above before the arrival.
            self.exclusive[q].counter.fetch_add(1, Ordering::Release);
        }
        let counter = &self.exclusive[device].counter;
        match self
            .waiter
            .until_from(start, || counter.load(Ordering::Acquire) >= b.arrivals)
        {
            Ok(()) => {
                counter.fetch_sub(b.arrivals, Ordering::AcqRel);
                Ok(())
            }
            Err(WaitFailure::Aborted) => Err(ExecError::Aborted),
            Err(WaitFailure::TimedOut { since }) => Err(ExecError::BarrierTimeout {
                since,
                device,
                counter: counter.load(Ordering::Relaxed),
                arrivals: b.arrivals,
                timeout: self.waiter.timeout,
            }),
        }
    }

    /// Kernel prologue: signal (release) first, then wait (acquire) — the other order would
    /// close a cycle around the reduce-scatter ring. In a traced run, returns when it waited.
    fn prologue(
        &self,
        device: usize,
        stage: usize,
        node: &'static str,
        signals: &[FlagRef],
        waits: &[FlagRef],
    ) -> Result<FlagWait, ExecError> {
        for f in signals {
            self.flag(f).store(KERNEL_SIGNAL_VALUE, Ordering::Release);
        }
        let start = (self.trace.is_some() && !waits.is_empty()).then(Instant::now);
        self.wait_flags(device, stage, node, waits)?;
        Ok(start.map(|start| (start, Instant::now())))
    }

    /// Waits (acquire, bounded) until every flag of `waits` is non-zero.
    fn wait_flags(
        &self,
        device: usize,
        stage: usize,
        node: &'static str,
        waits: &[FlagRef],
    ) -> Result<(), ExecError> {
        for f in waits {
            let flag = self.flag(f);
            self.waiter
                .until(|| flag.load(Ordering::Acquire) != 0)
                .map_err(|e| match e {
                    WaitFailure::Aborted => ExecError::Aborted,
                    WaitFailure::TimedOut { since } => ExecError::FlagTimeout {
                        since,
                        device,
                        stage,
                        node,
                        flag: *f,
                        timeout: self.waiter.timeout,
                    },
                })?;
        }
        Ok(())
    }

    /// The stage kernel's arithmetic ([`gemm_f32`]), or for e4m3 operands the FP8 stage
    /// kernel's ([`gemm_scaled_f32`]) with the scales of the views' rows (row-wise) or the
    /// device's tensor-wise pair. Either way one rounding to the output type, C (a partial
    /// included) read as f32 from the output type.
    fn gemm(&self, g: &GemmStage) -> Result<(), ExecError> {
        let c = g
            .epilogue
            .source
            .view()
            .map(|v| (read_view_f32(self.memory, v), v.cols));
        let epilogue = EpilogueInput {
            alpha: g.epilogue.alpha,
            beta: g.epilogue.beta,
            c: c.as_ref().map(|(values, ld)| (values.as_slice(), *ld)),
        };
        let (m, n, k) = (g.shape.m, g.shape.n, g.shape.k);
        let d: Vec<T> = match (
            read_view_e4m3(self.memory, &g.a),
            read_view_e4m3(self.memory, &g.b),
            &self.memory[g.d.device].fp8,
        ) {
            (Some((a, sa)), Some((b, sb)), Some(fp8)) => {
                let scales = match fp8.mode {
                    ScaleMode::Rowwise => Scales::Rowwise { a: sa, b: sb },
                    ScaleMode::Tensorwise => {
                        let (a, b) = fp8.tensor_scales();
                        Scales::Tensorwise { a, b }
                    }
                };
                gemm_scaled_f32(m, n, k, &a, g.a.cols, &b, g.b.cols, &scales, epilogue)?
            }
            _ => {
                let a = read_view_f32(self.memory, &g.a);
                let b = read_view_f32(self.memory, &g.b);
                gemm_f32(m, n, k, &a, g.a.cols, &b, g.b.cols, epilogue)
            }
        };
        write_view(self.memory, &g.d, &d);
        Ok(())
    }

    /// `dst = Σ sources` in f32, in source order, rounded once.
    fn reduce(&self, r: &ReduceStep) {
        let mut sum = vec![0.0f32; r.dst.elements()];
        for src in &r.sources {
            for (s, x) in sum.iter_mut().zip(read_view_f32(self.memory, src)) {
                *s += x;
            }
        }
        let out: Vec<T> = sum.into_iter().map(T::from_f32).collect();
        write_view(self.memory, &r.dst, &out);
    }
}
