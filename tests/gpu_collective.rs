//! The collective kernels alone, on one GPU: two fake devices whose exclusive workspaces are two
//! buffers of that GPU (layout `ExclusiveLayout::new(2)`), so that the sticky poison and the
//! end-of-run release wait can be driven into every state without a peer GPU:
//! - a barrier whose peer never arrives times out, records its code in its own and the peer's
//!   error word and drains its flags; the peer's barrier, finding its word set, then arrives
//!   nowhere, drains and returns at once, and the first code stays in both words;
//! - two barriers meet, reset their stage and release flags and leave the counters at 0;
//! - the release wait passes once the flag is set (by a copy on another stream while it spins),
//!   times out into both error words when it is not, and returns at once when poisoned.
//!
//! Run from the bundle: `bundle/tests/gpu_collective` (or `cargo test -p distgemm-tests
//! --test gpu_collective`).
use std::sync::Arc;
use std::time::{Duration, Instant};

use distgemm::cuda::error::{decode_timeout, encode_timeout};
use distgemm::cuda::{BarrierParams, TimeoutSite, WaitingNode};
use distgemm::plan::ExclusiveLayout;
use distgemm::runtime::caller_stream::upload_async;
use distgemm::runtime::{CudaStream, DeviceBuffer, Gpu, KernelArgs, LaunchConfig, Module, launch};
use distgemm::schedule::FlagRef;
use distgemm_tests::gpu::{self, visible_line};
use kernels_gpu::collective_abi::WaitFlagsParams;

/// Bound of the waits that are meant to time out.
const SHORT: Duration = Duration::from_millis(50);
/// Bound of the waits that are meant to pass.
const LONG: Duration = Duration::from_secs(5);

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The two fake devices' exclusive workspaces (u32 words) on one GPU.
struct Pair {
    gpu: Gpu,
    module: Arc<Module>,
    layout: ExclusiveLayout,
    words: [DeviceBuffer<u32>; 2],
    streams: [Arc<CudaStream>; 2],
}

impl Pair {
    fn new(gpu: &Gpu, module: Arc<Module>) -> Pair {
        let layout = ExclusiveLayout::new(2);
        let stream = || gpu.new_stream().expect("stream");
        let streams = [stream(), stream()];
        let words = [0, 1].map(|d| {
            let mut w = DeviceBuffer::<u32>::alloc(gpu, layout.bytes / 4).expect("workspace");
            w.fill(&streams[d], 0).expect("zero");
            w
        });
        Pair {
            gpu: gpu.clone(),
            module,
            layout,
            words,
            streams,
        }
    }

    /// Device address of byte `offset` of device `d`'s workspace.
    fn at(&self, d: usize, offset: usize) -> u64 {
        self.words[d].device_ptr() + offset as u64
    }

    fn error_word(&self, d: usize) -> u64 {
        self.at(d, self.layout.error_offset)
    }

    fn flag(&self, d: usize, index: usize) -> u64 {
        self.at(d, self.layout.flag_offset(index))
    }

    /// Device `d`'s workspace as words, after its stream is done.
    fn read(&self, d: usize) -> Vec<u32> {
        self.words[d].download(&self.streams[d]).expect("download")
    }

    /// Device `d`'s barrier: reset its 4 flags, arrive at the peer, wait for 1 arrival.
    fn barrier(&self, d: usize, timeout: Duration) -> BarrierParams {
        let peer = 1 - d;
        let mut p = BarrierParams {
            counter: self.at(d, self.layout.counter_offset),
            error_word: self.error_word(d),
            timeout_ns: ns(timeout),
            reset_count: self.layout.flag_count as u32,
            arrive_count: 1,
            arrivals: 1,
            error_code: code(d, WaitingNode::Barrier, None),
            ..BarrierParams::default()
        };
        for (i, reset) in p.reset.iter_mut().take(self.layout.flag_count).enumerate() {
            *reset = self.flag(d, i);
        }
        p.arrive[0] = self.at(peer, self.layout.counter_offset);
        p.peer_errors[0] = self.error_word(peer);
        p
    }

    /// Device `d`'s end-of-run wait for the peer's release flag.
    fn release_wait(&self, d: usize, timeout: Duration) -> (WaitFlagsParams, FlagRef) {
        let peer = 1 - d;
        let flag = FlagRef {
            device: d,
            index: self.layout.release_flag(peer),
        };
        let mut p = WaitFlagsParams {
            error_word: self.error_word(d),
            timeout_ns: ns(timeout),
            count: 1,
            ..WaitFlagsParams::default()
        };
        p.flags[0] = self.flag(d, flag.index);
        p.codes[0] = code(d, WaitingNode::Release, Some(flag));
        p.peer_errors[0] = self.error_word(peer);
        (p, flag)
    }

    /// Launches a 1-thread collective kernel on device `d`'s stream.
    fn launch<P: Copy>(&self, d: usize, kernel: &str, params: &P) {
        let kernel = self.module.kernel(kernel).expect("kernel");
        let mut args = KernelArgs::new().by_value(params);
        // SAFETY: `params` is the kernel's parameter block; every address in it is a word of
        // `self.words`, which outlives the launch (every test synchronises before dropping).
        unsafe {
            launch(
                &kernel,
                &self.streams[d],
                &LaunchConfig::linear(1, 1),
                &mut args,
            )
        }
        .expect("launch");
    }

    fn sync(&self, d: usize) {
        distgemm::runtime::stream::synchronize(&self.streams[d]).expect("synchronize");
    }
}

fn code(device: usize, node: WaitingNode, flag: Option<FlagRef>) -> u32 {
    encode_timeout(TimeoutSite {
        device,
        node,
        stage: 0,
        flag,
    })
}

#[test]
fn a_timed_out_barrier_poisons_both_devices_and_the_first_code_stays() {
    let test = "gpu_collective::a_timed_out_barrier_poisons_both_devices_and_the_first_code_stays";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let pair = Pair::new(&session.gpu, session.module().expect("module"));
    let counter = pair.layout.counter_offset / 4;
    let error = pair.layout.error_offset / 4;
    let flags = pair.layout.flags_offset / 4..pair.layout.flags_offset / 4 + 4;

    // Device 0 alone: its barrier times out (device 1 never arrives).
    let start = Instant::now();
    pair.launch(0, "collective_barrier", &pair.barrier(0, SHORT));
    pair.sync(0);
    let first = code(0, WaitingNode::Barrier, None);
    let (w0, w1) = (pair.read(0), pair.read(1));
    assert_eq!(w0[error], first, "own error word");
    assert_eq!(w1[error], first, "the peer's error word gets the code too");
    assert_eq!(
        decode_timeout(w1[error]).map(|s| s.device),
        Some(0),
        "the code names the waiting device"
    );
    assert!(w0[flags.clone()].iter().all(|&f| f == u32::MAX), "drained");
    assert_eq!((w0[counter], w1[counter]), (0, 1), "it arrived at the peer");

    // Device 1, poisoned by device 0: it arrives nowhere, drains and returns without waiting.
    let poisoned = Instant::now();
    pair.launch(1, "collective_barrier", &pair.barrier(1, LONG));
    pair.sync(1);
    let took = poisoned.elapsed();
    let (w0, w1) = (pair.read(0), pair.read(1));
    assert!(took < LONG / 2, "a poisoned barrier waited {took:?}");
    assert_eq!(w0[counter], 0, "a poisoned barrier must not arrive");
    assert_eq!(w1[counter], 1, "nor consume an arrival");
    assert!(w1[flags.clone()].iter().all(|&f| f == u32::MAX), "drained");
    assert_eq!(
        (w0[error], w1[error]),
        (first, first),
        "the first code stays"
    );

    // A later timeout elsewhere does not overwrite it either.
    let (wait, _) = pair.release_wait(1, SHORT);
    pair.launch(1, "collective_wait_flags", &wait);
    pair.sync(1);
    assert_eq!(pair.read(1)[error], first);
    visible_line(&format!(
        "{test}: ok (timeout after {:?}, poisoned barrier returned in {took:?})",
        start.elapsed() - took
    ));
}

#[test]
fn two_barriers_meet_and_reset_stage_and_release_flags() {
    let test = "gpu_collective::two_barriers_meet_and_reset_stage_and_release_flags";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let mut pair = Pair::new(&session.gpu, session.module().expect("module"));
    let first_flag = pair.layout.flags_offset / 4;
    for d in 0..2 {
        // Stale stage and release flags from an earlier run.
        let mut words = vec![0u32; pair.layout.bytes / 4];
        words[first_flag..first_flag + 4].fill(7);
        let stream = Arc::clone(&pair.streams[d]);
        pair.words[d].upload(&stream, &words).expect("upload");
    }
    for run in 0..3 {
        pair.launch(0, "collective_barrier", &pair.barrier(0, LONG));
        pair.launch(1, "collective_barrier", &pair.barrier(1, LONG));
        pair.sync(0);
        pair.sync(1);
        for d in 0..2 {
            let w = pair.read(d);
            assert_eq!(w[0], 0, "run {run}: device {d}'s counter");
            assert_eq!(w[1], 0, "run {run}: device {d}'s error word");
            assert!(
                w[first_flag..first_flag + 4].iter().all(|&f| f == 0),
                "run {run}: device {d}'s flags {:?}",
                &w[first_flag..first_flag + 4]
            );
        }
    }
    visible_line(&format!("{test}: ok"));
}

#[test]
fn the_release_wait_passes_times_out_or_skips_when_poisoned() {
    let test = "gpu_collective::the_release_wait_passes_times_out_or_skips_when_poisoned";
    let Some(session) = gpu::hopper_gpu(test) else {
        return;
    };
    let pair = Pair::new(&session.gpu, session.module().expect("module"));
    let error = pair.layout.error_offset / 4;

    // The flag is set by a copy on another stream while the wait spins.
    let (wait, _) = pair.release_wait(0, LONG);
    let start = Instant::now();
    pair.launch(0, "collective_wait_flags", &wait);
    std::thread::sleep(Duration::from_millis(20));
    let set = u32::MAX.to_ne_bytes();
    // SAFETY: the flag is a word of `pair.words[0]`, alive until the end of the test.
    unsafe {
        upload_async(
            &pair.gpu,
            wait.flags[0],
            &set,
            gpu::raw_stream(&pair.streams[1]),
        )
    }
    .expect("set the release flag");
    pair.sync(1);
    pair.sync(0);
    let passed = start.elapsed();
    assert!(passed < LONG / 2, "the wait took {passed:?}");
    assert_eq!(
        (pair.read(0)[error], pair.read(1)[error]),
        (0, 0),
        "no error"
    );

    // Device 1's flag is never set: it times out into both error words.
    let (wait, flag) = pair.release_wait(1, SHORT);
    pair.launch(1, "collective_wait_flags", &wait);
    pair.sync(1);
    let expected = code(1, WaitingNode::Release, Some(flag));
    assert_eq!(
        (pair.read(0)[error], pair.read(1)[error]),
        (expected, expected)
    );
    assert_eq!(
        decode_timeout(expected).map(|s| (s.device, s.node, s.flag)),
        Some((1, WaitingNode::Release, Some(flag)))
    );

    // Device 0 is now poisoned too: its wait returns at once although its flag is reset.
    let (wait, _) = pair.release_wait(0, LONG);
    let reset = 0u32.to_ne_bytes();
    // SAFETY: as above.
    unsafe {
        upload_async(
            &pair.gpu,
            wait.flags[0],
            &reset,
            gpu::raw_stream(&pair.streams[0]),
        )
    }
    .expect("reset");
    let start = Instant::now();
    pair.launch(0, "collective_wait_flags", &wait);
    pair.sync(0);
    assert!(start.elapsed() < LONG / 2, "a poisoned wait waited");
    visible_line(&format!(
        "{test}: ok (released after {passed:?} while spinning)"
    ));
}
