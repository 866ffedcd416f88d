//! The contract between the host and the collective kernels (`kernels::collective`): the
//! start-of-run barrier, the single-stage reduce-scatter's reduction and the end-of-run wait
//! for the peers' release flags. Compiled for both sides so they cannot drift, like
//! [`crate::gemm_abi`].
//!
//! Peer addresses travel inside the by-value parameter blocks as fixed arrays of
//! [`MAX_PEERS`] entries (unused entries are 0), so a launch needs no device-side argument
//! buffer and a graph kernel node carries everything it needs.
//!
//! **Sticky poison.** Every device has an *error word* (in its exclusive workspace). A wait
//! that times out records its code with `atom.cas.sys 0 → code` into its own error word *and*
//! into every peer's ([`PeerErrorWords`]), so the first code anywhere stays and every device
//! learns of the failure even when no host reads the others' words. A barrier that finds its
//! own word set arrives nowhere: its peers' barriers then time out and poison everybody, so a
//! failure can never leave one device a barrier ahead of the others and silently running on.

/// Largest number of devices a parameter block describes (the plan's `MAX_TP`).
pub const MAX_PEERS: usize = 8;

/// Threads per block of the reduction kernel.
pub const REDUCE_THREADS: u32 = 256;

/// Elements one thread sums per step: one 16-byte vector of 2-byte elements.
pub const REDUCE_VECTOR: u32 = 8;

/// The error words of the other devices (device addresses, usually on other GPUs), in any
/// order; unused entries are 0. A timed-out wait records its code in each of them.
pub type PeerErrorWords = [u64; MAX_PEERS];

/// Dynamic shared memory of the reduction kernel: one word that broadcasts thread 0's
/// "a wait timed out" decision to the block.
pub const REDUCE_SMEM_BYTES: u32 = 16;

/// Parameters of the start-of-run barrier (one block of one thread):
/// 1. `griddepcontrol.launch_dependents`, then `griddepcontrol.wait`;
/// 2. if `*error_word != 0` (this device is poisoned, see the module documentation): set
///    every reset flag to `0xFFFF_FFFF` (release) and return, arriving nowhere;
/// 3. store 0 into each of the `reset_count` flags of `reset` (the device's own stage and
///    release flags);
/// 4. `fence.acq_rel.sys`, then `red.release.sys.add 1` into each of the `arrive_count`
///    counters of `arrive` (the peers' barrier counters);
/// 5. spin (`ld.acquire.sys`, bounded by `timeout_ns`) until `*counter >= arrivals`;
/// 6. `atom.acq_rel.sys.add −arrivals` on `*counter`: a *running* counter, so an arrival a
///    fast peer already made for the next run survives.
///
/// On timeout it records `error_code` in its own and every peer's error word (first code
/// kept), skips step 6 and sets every reset flag to `0xFFFF_FFFF`, so that the rest of the
/// run drains without waiting a further timeout per stage (its results are meaningless; the
/// host reports the error).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BarrierParams {
    /// Own stage and release flags to reset (device addresses).
    pub reset: [u64; 2 * MAX_PEERS],
    /// Peers' barrier counters to arrive at (device addresses, usually on other GPUs).
    pub arrive: [u64; MAX_PEERS],
    /// Peers' error words.
    pub peer_errors: PeerErrorWords,
    /// Own barrier counter.
    pub counter: u64,
    /// Own error word.
    pub error_word: u64,
    /// Spin-wait bound in nanoseconds.
    pub timeout_ns: u64,
    /// Entries of `reset` in use.
    pub reset_count: u32,
    /// Entries of `arrive` in use.
    pub arrive_count: u32,
    /// Arrivals to wait for (P − 1).
    pub arrivals: u32,
    /// Value recorded in the error words on timeout.
    pub error_code: u32,
}

/// Parameters of the single-stage reduce-scatter's reduction
/// `dst = Σ_{i < source_count} sources[i]` over a `rows × cols` block (f32 accumulation in
/// source order, one rounding at the store).
///
/// Prologue, before any source is read: `griddepcontrol.wait` (the device's own partial is
/// complete); block 0's thread 0 then does `fence.acq_rel.sys` and `st.release.sys
/// signal_value` into each of the `signal_count` flags of `signals` ("my partial is
/// complete"); then thread 0 of every block spins (`ld.acquire.sys`, bounded by `timeout_ns`)
/// until each of the `wait_count` flags of `waits` is non-zero. If wait `i` times out, it
/// records `wait_codes[i]` in its own and every peer's error word (first code kept) and the
/// whole block returns without writing `dst`.
///
/// Requirements (checked by the host): `cols`, every leading dimension and every address are
/// multiples of [`REDUCE_VECTOR`] elements (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceParams {
    /// Element (0, 0) of each source block (device addresses, possibly on peers).
    pub sources: [u64; MAX_PEERS],
    /// Flags to signal (device addresses on peers).
    pub signals: [u64; MAX_PEERS],
    /// Own flags to wait on.
    pub waits: [u64; MAX_PEERS],
    /// Leading dimension of each source, in elements.
    pub source_ld: [u32; MAX_PEERS],
    /// Error code recorded when the matching wait times out.
    pub wait_codes: [u32; MAX_PEERS],
    /// Peers' error words.
    pub peer_errors: PeerErrorWords,
    /// Element (0, 0) of the output block.
    pub dst: u64,
    /// Own error word.
    pub error_word: u64,
    /// Spin-wait bound in nanoseconds.
    pub timeout_ns: u64,
    /// Rows of the block.
    pub rows: u32,
    /// Columns of the block (a multiple of [`REDUCE_VECTOR`]).
    pub cols: u32,
    /// Leading dimension of `dst`, in elements.
    pub dst_ld: u32,
    /// Entries of `sources` in use.
    pub source_count: u32,
    /// Entries of `signals` in use.
    pub signal_count: u32,
    /// Entries of `waits` in use.
    pub wait_count: u32,
    /// Value stored into each signalled flag.
    pub signal_value: u32,
    /// Padding (keeps the size a multiple of 8).
    pub reserved: u32,
}

/// Parameters of the end-of-run wait (one block of one thread, no PDL: it follows its
/// predecessors on full edges): if `*error_word != 0` (this device is poisoned, its peers may
/// never get this far) it returns at once; otherwise it spins (`ld.acquire.sys`, bounded by
/// `timeout_ns`) until each of the `count` flags of `flags` is non-zero. If wait `i` times
/// out, it records `codes[i]` in its own and every peer's error word (first code kept) and
/// returns.
///
/// It is the last node of an all-gather device's graph: `flags` are the device's release
/// flags, which each peer sets (a write-value node after its copy of this device's input
/// shard), so the graph ends only when no peer reads the shard any more.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitFlagsParams {
    /// Own flags to wait on.
    pub flags: [u64; MAX_PEERS],
    /// Peers' error words.
    pub peer_errors: PeerErrorWords,
    /// Error code recorded when the matching wait times out.
    pub codes: [u32; MAX_PEERS],
    /// Own error word.
    pub error_word: u64,
    /// Spin-wait bound in nanoseconds.
    pub timeout_ns: u64,
    /// Entries of `flags` in use.
    pub count: u32,
    /// Padding (keeps the size a multiple of 8).
    pub reserved: u32,
}

// The PTX declares `.param .align 8 .b8 [size]`: the blocks must stay 8-byte aligned, padded.
const _: () = assert!(core::mem::size_of::<BarrierParams>() == 4 * 8 * MAX_PEERS + 24 + 16);
const _: () =
    assert!(core::mem::size_of::<ReduceParams>() == 4 * 8 * MAX_PEERS + 8 * MAX_PEERS + 56);
const _: () =
    assert!(core::mem::size_of::<WaitFlagsParams>() == 2 * 8 * MAX_PEERS + 4 * MAX_PEERS + 24);
const _: () = assert!(core::mem::align_of::<ReduceParams>() == 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_are_8_byte_aligned_and_padded() {
        assert_eq!(core::mem::size_of::<BarrierParams>() % 8, 0);
        assert_eq!(core::mem::size_of::<ReduceParams>() % 8, 0);
        assert_eq!(core::mem::size_of::<WaitFlagsParams>() % 8, 0);
        assert_eq!(core::mem::align_of::<WaitFlagsParams>(), 8);
        assert_eq!(core::mem::align_of::<BarrierParams>(), 8);
    }
}
