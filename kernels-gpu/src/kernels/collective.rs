//! The collective kernels of a distributed run (parameters and protocol in
//! [`crate::collective_abi`]):
//! - `collective_barrier`: the start-of-run rendezvous of all devices (one thread);
//! - `reduce_sum_bf16` / `reduce_sum_f16`: the single-stage reduce-scatter's reduction, which
//!   sums block d of every device's partial product (read over NVLink) into the device's D;
//! - `collective_wait_flags`: the end-of-run wait of an all-gather device until every peer has
//!   released its input shard (one thread).
//!
//! Memory ordering: flag and counter stores are system-scope *releases*, polls system-scope
//! *acquires* ([`crate::device::flags`]); every spin is bounded by `%globaltimer` and records
//! a timeout in the device's and every peer's error word instead of hanging (sticky poison,
//! see [`crate::collective_abi`]).
use crate::collective_abi::{
    BarrierParams, MAX_PEERS, REDUCE_VECTOR, ReduceParams, WaitFlagsParams,
};
use crate::device::flags::{self, WaitOutcome};
use crate::device::wgmma::{Bf16, F16, InputType};
use crate::device::{fence, gdc, index, smem, sync};
use core::arch::asm;
use seq_macro::seq;

const _: () = assert!(MAX_PEERS == 8, "the unrolled loops below assume 8 peers");

/// The value a timed-out or poisoned barrier leaves in its own flags, so later waits of the
/// run pass.
const DRAIN_FLAG_VALUE: u32 = 0xFFFF_FFFF;

/// Sets the barrier's first `resets` reset flags to [`DRAIN_FLAG_VALUE`] (release).
#[inline(always)]
unsafe fn drain(p: &BarrierParams, resets: usize) {
    seq!(I in 0..16 {
        if I < resets {
            unsafe { flags::store_release_sys(p.reset[I] as *mut u32, DRAIN_FLAG_VALUE) };
        }
    });
}

/// The start-of-run barrier (grid 1×1, one thread); see [`BarrierParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn collective_barrier(p: BarrierParams) {
    gdc::launch_dependents();
    gdc::wait_for_prerequisites();
    if index::thread_idx() != 0 || index::block_idx() != 0 {
        return;
    }
    let resets = (p.reset_count as usize).min(2 * MAX_PEERS);
    let arrivals = (p.arrive_count as usize).min(MAX_PEERS);
    if unsafe { flags::load_acquire_sys(p.error_word as *const u32) } != 0 {
        // Poisoned (by an earlier timeout here or on a peer): arriving would put this device
        // out of step with the peers for good. Arrive nowhere; the peers time out and poison
        // themselves; drain so this run ends quickly.
        unsafe { drain(&p, resets) };
        return;
    }
    seq!(I in 0..16 {
        if I < resets {
            unsafe { flags::store_relaxed_sys(p.reset[I] as *mut u32, 0) };
        }
    });
    // The resets happen before any peer can observe this device's arrival (and then signal
    // one of the reset flags for this run).
    fence::acq_rel_sys();
    seq!(I in 0..8 {
        if I < arrivals {
            unsafe { flags::add_release_sys(p.arrive[I] as *mut u32, 1) };
        }
    });
    let counter = p.counter as *mut u32;
    match unsafe { flags::wait_at_least(counter, p.arrivals, p.timeout_ns) } {
        WaitOutcome::Ready => {
            // Consume this run's arrivals; early arrivals for the next run stay counted.
            unsafe { flags::fetch_add_acq_rel_sys(counter, p.arrivals.wrapping_neg()) };
        }
        WaitOutcome::TimedOut => {
            unsafe { flags::record_error(p.error_word, &p.peer_errors, p.error_code) };
            unsafe { drain(&p, resets) };
        }
    }
}

/// The end-of-run wait for the peers' release flags (grid 1×1, one thread); see
/// [`WaitFlagsParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn collective_wait_flags(p: WaitFlagsParams) {
    if index::thread_idx() != 0 || index::block_idx() != 0 {
        return;
    }
    if unsafe { flags::load_acquire_sys(p.error_word as *const u32) } != 0 {
        // Poisoned: a peer may never get to its release; the run's results are void anyway.
        return;
    }
    let count = (p.count as usize).min(MAX_PEERS);
    seq!(I in 0..8 {
        if I < count {
            let flag = p.flags[I] as *const u32;
            if unsafe { flags::wait_at_least(flag, 1, p.timeout_ns) } == WaitOutcome::TimedOut {
                unsafe { flags::record_error(p.error_word, &p.peer_errors, p.codes[I]) };
                return;
            }
        }
    });
}

/// `ld.global.v4.u32`: 16 bytes (8 elements) at a 16-byte-aligned address.
#[inline(always)]
unsafe fn load_vector(ptr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!(
            "ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg64) ptr,
            options(nostack, readonly),
        )
    };
    [a, b, c, d]
}

/// `st.global.v4.u32`: 16 bytes at a 16-byte-aligned address.
#[inline(always)]
unsafe fn store_vector(ptr: u64, v: [u32; 4]) {
    unsafe {
        asm!(
            "st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg64) ptr,
            a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack),
        )
    };
}

/// The reduction's prologue: signal (block 0), then wait on every flag (thread 0 of each
/// block). Returns whether the block may go on; every thread of the block must call it.
#[inline(always)]
unsafe fn reduce_prologue(p: &ReduceParams) -> bool {
    let abort_word = smem::shared_addr(smem::dynamic_smem());
    if index::thread_idx() == 0 {
        if index::block_idx() == 0 {
            // Everything the GEMM before us wrote (our partial) is visible to whoever acquires
            // one of these flags.
            fence::acq_rel_sys();
            seq!(I in 0..8 {
                if I < p.signal_count as usize {
                    unsafe { flags::store_release_sys(p.signals[I] as *mut u32, p.signal_value) };
                }
            });
        }
        let mut abort = 0;
        seq!(I in 0..8 {
            if abort == 0 && I < p.wait_count as usize {
                let flag = p.waits[I] as *const u32;
                if unsafe { flags::wait_at_least(flag, 1, p.timeout_ns) } == WaitOutcome::TimedOut {
                    unsafe { flags::record_error(p.error_word, &p.peer_errors, p.wait_codes[I]) };
                    abort = 1;
                }
            }
        });
        // The sources are read with ordinary loads after the acquires above.
        unsafe { smem::store_u32(abort_word, abort) };
    }
    sync::sync_threads();
    unsafe { smem::load_u32(abort_word) == 0 }
}

/// `dst = Σ sources` for element type `T`: a grid-stride loop over 8-element vectors.
#[inline(always)]
unsafe fn reduce_sum<T: InputType>(p: &ReduceParams) {
    gdc::wait_for_prerequisites();
    if !unsafe { reduce_prologue(p) } {
        return;
    }
    let per_row = (p.cols / REDUCE_VECTOR) as u64;
    let total = p.rows as u64 * per_row;
    let stride = (index::grid_dim() * index::block_dim()) as u64;
    let sources = (p.source_count as usize).min(MAX_PEERS);
    let mut i = index::global_thread_idx() as u64;
    while i < total {
        let row = i / per_row;
        let col = (i % per_row) * REDUCE_VECTOR as u64;
        let mut acc = [0.0f32; 8];
        // Unrolled over the constant MAX_PEERS so the parameter arrays are indexed statically
        // (a run-time index would copy the parameter block to local memory).
        seq!(S in 0..8 {
            if S < sources {
                let offset = row * p.source_ld[S] as u64 + col;
                let v = unsafe { load_vector(p.sources[S] + 2 * offset) };
                seq!(J in 0..4 {
                    let (lo, hi) = T::unpack2(v[J]);
                    acc[2 * J] += lo;
                    acc[2 * J + 1] += hi;
                });
            }
        });
        let out = [
            T::pack2(acc[0], acc[1]),
            T::pack2(acc[2], acc[3]),
            T::pack2(acc[4], acc[5]),
            T::pack2(acc[6], acc[7]),
        ];
        unsafe { store_vector(p.dst + 2 * (row * p.dst_ld as u64 + col), out) };
        i += stride;
    }
}

/// bf16 reduction (any grid of [`crate::collective_abi::REDUCE_THREADS`]-thread blocks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reduce_sum_bf16(p: ReduceParams) {
    unsafe { reduce_sum::<Bf16>(&p) }
}

/// f16 reduction (any grid of [`crate::collective_abi::REDUCE_THREADS`]-thread blocks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reduce_sum_f16(p: ReduceParams) {
    unsafe { reduce_sum::<F16>(&p) }
}
