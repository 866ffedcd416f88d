//! Shared-memory transaction barriers (`mbarrier`, PTX ISA §9.7.13.15).
//!
//! An mbarrier is an 8-byte object in shared memory with a *phase*, an expected arrival count
//! and a transaction count. A phase completes when all expected arrivals have arrived and the
//! transaction count (bytes announced with `expect_tx`, retired by TMA `complete_tx`) is back
//! to zero; the phase bit then flips. Waiters wait on a *parity*: `wait(p)` returns once the
//! phase with parity `p` has completed. A pipeline stage used for the n-th time (n = 0, 1, …)
//! waits with parity `n & 1` on its *full* barrier; producers wait on *empty* barriers with
//! the opposite parity, because a fresh buffer starts out empty (their first wait, on parity 1,
//! returns at once: the "previous" phase of a fresh barrier counts as completed).
use core::arch::asm;

/// A handle to an mbarrier: its 32-bit shared-window address (8-byte aligned). The address
/// must be an 8-byte word of this block's shared memory that the kernel's layout reserves for
/// this barrier alone (`Ring` in `kernels/gemm/ring.rs`); every operation below says what
/// else it needs.
#[derive(Clone, Copy)]
pub struct MBarrier(pub u32);

impl MBarrier {
    /// Sets the expected arrival count of every phase and starts phase 0. One thread
    /// initialises; then [`crate::device::fence::mbarrier_init`] and a barrier.
    ///
    /// Lowers to `mbarrier.init.shared::cta.b64 [bar], count`.
    ///
    /// # Safety
    /// Exactly one thread initialises each barrier, before any thread (of this block or, in a
    /// cluster, of another) uses it, and not while any operation on it is pending; the other
    /// users then see the initialisation only after `fence::mbarrier_init` and a block (or
    /// cluster) barrier. `count` is at least 1.
    #[inline(always)]
    pub unsafe fn init(self, count: u32) {
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) self.0, c = in(reg32) count, options(nostack))
        };
    }

    /// One arrival on the current phase (release, CTA scope).
    ///
    /// Lowers to `mbarrier.arrive.shared::cta.b64 _, [bar]`.
    ///
    /// # Safety
    /// The barrier is initialised (see [`Self::init`]), and this arrival is one of the phase's
    /// expected `count`: arriving more often than the protocol plans completes a phase early,
    /// which lets its waiters read data that is not there yet.
    #[inline(always)]
    pub unsafe fn arrive(self) {
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) self.0, options(nostack))
        };
    }

    /// Arrival on the barrier at the same offset in block `rank` of the cluster, with the
    /// default `.release.cta` semantics.
    ///
    /// Not `.release.cluster`: a cluster-scope release makes the arriving thread wait until
    /// all its earlier memory operations are visible cluster-wide, which serialised the
    /// consumers' pipeline (kernels-gpu/NOTES.md, step 3). Ordering with the producer's next
    /// TMA write into the slot comes from the wgmma `wait_group` before the arrival.
    ///
    /// Lowers to `mapa.shared::cluster.u32 r, bar, rank` and
    /// `mbarrier.arrive.shared::cluster.b64 _, [r]`.
    ///
    /// # Safety
    /// As [`Self::arrive`], for the barrier of block `rank`: a rank of this cluster whose block
    /// has initialised its barrier (made visible by a cluster barrier) and has not exited.
    #[inline(always)]
    pub unsafe fn arrive_cluster(self, rank: u32) {
        let remote = crate::device::cluster::map_shared_rank(self.0, rank);
        unsafe {
            asm!("mbarrier.arrive.shared::cluster.b64 _, [{b}];", b = in(reg32) remote, options(nostack))
        };
    }

    /// One arrival plus `bytes` more expected transaction bytes. The producer announces a
    /// stage's TMA bytes this way *before* issuing the copies.
    ///
    /// Lowers to `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes`.
    ///
    /// # Safety
    /// As [`Self::arrive`]; and exactly `bytes` bytes of asynchronous copies signalling this
    /// barrier (TMA `complete_tx`) must follow in this phase, or the phase never completes
    /// (too few) or completes early (too many).
    #[inline(always)]
    pub unsafe fn arrive_expect_tx(self, bytes: u32) {
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};", b = in(reg32) self.0, n = in(reg32) bytes,
                options(nostack))
        };
    }

    /// `mbarrier.try_wait.parity` once: true when the phase with parity `parity` has completed.
    /// The thread may be suspended until the phase completes or about `suspend_ns`
    /// nanoseconds have passed, whichever comes first (the hint is an upper bound the hardware
    /// may shorten); a suspended thread issues nothing, where a bare polling loop would keep
    /// its warp issuing `try_wait`s.
    ///
    /// Lowers to `mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity, suspend_ns`.
    ///
    /// # Safety
    /// The barrier is initialised and visible to this thread (see [`Self::init`]); `parity` is
    /// the parity of the current or the immediately preceding phase (a wait two phases behind
    /// cannot tell them apart and returns at the wrong time).
    #[inline(always)]
    pub unsafe fn try_wait(self, parity: u32, suspend_ns: u32) -> bool {
        let done: u32;
        unsafe {
            asm!(
                "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph}, {hint}; selp.u32 {d}, 1, 0, p; }}",
                b = in(reg32) self.0,
                ph = in(reg32) parity,
                hint = in(reg32) suspend_ns,
                d = out(reg32) done,
                options(nostack),
            )
        };
        done != 0
    }

    /// Waits until the phase with parity `parity` has completed (acquire, CTA scope: the data
    /// the phase guards is then visible), sleeping in [`Self::try_wait`] with
    /// [`WAIT_SUSPEND_NS`] rather than spinning.
    ///
    /// Lowers to a loop around `mbarrier.try_wait.parity.shared::cta.b64`.
    ///
    /// # Safety
    /// As [`Self::try_wait`]; and the phase must complete (its arrivals and bytes are planned),
    /// or the thread waits forever.
    #[inline(always)]
    pub unsafe fn wait(self, parity: u32) {
        while !unsafe { self.try_wait(parity, WAIT_SUSPEND_NS) } {}
    }

    /// [`Self::wait`] for a whole warp: every lane must call it, and all leave together once
    /// each has seen the phase complete (a completed phase stays complete until the waiters
    /// themselves release the barrier's next use, so lanes that saw it early see it again).
    /// The retry decision is a warp vote, so the wait is uniform control flow: ptxas can then
    /// keep the pipeline position of a loop around it (slot, parity, the wgmma descriptors
    /// derived from them) in uniform registers instead of per-thread ones.
    ///
    /// Lowers to a loop around `mbarrier.try_wait.parity.shared::cta.b64` and
    /// `vote.sync.all.pred`.
    ///
    /// # Safety
    /// As [`Self::wait`]; and every lane of the warp calls it together (converged).
    #[inline(always)]
    pub unsafe fn wait_warp(self, parity: u32) {
        while !crate::device::sync::all_lanes(unsafe { self.try_wait(parity, WAIT_SUSPEND_NS) }) {}
    }
}

/// Suspend-time hint of [`MBarrier::wait`]: 10 ms, CUTLASS's value. The hardware wakes the
/// thread as soon as the phase completes, so a long hint costs no latency; it only bounds how
/// long one `try_wait` may sleep before the loop asks again.
pub const WAIT_SUSPEND_NS: u32 = 10_000_000;

/// Position in a ring of `stages` pipeline slots: the slot index and the parity of the
/// current pass over the ring. Producer and consumers each keep one and advance it in step.
#[derive(Clone, Copy)]
pub struct PipelineState {
    pub stage: u32,
    pub phase: u32,
    stages: u32,
}

impl PipelineState {
    /// The first slot, first pass, of a ring of `stages` slots.
    #[inline(always)]
    pub const fn new(stages: u32) -> Self {
        Self {
            stage: 0,
            phase: 0,
            stages,
        }
    }

    /// Moves to the next slot, flipping the parity after the last one.
    #[inline(always)]
    pub fn advance(&mut self) {
        self.stage += 1;
        if self.stage == self.stages {
            self.stage = 0;
            self.phase ^= 1;
        }
    }

    /// Moves `n` slots on, as `n` calls of [`Self::advance`]: the parity flips once per pass
    /// completed.
    #[inline(always)]
    pub fn skip(&mut self, n: u32) {
        let position = self.stage + n;
        self.stage = position % self.stages;
        self.phase ^= (position / self.stages) & 1;
    }
}
