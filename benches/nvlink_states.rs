//! Which NVLink traffic puts the links into their high-speed power state, and for how long:
//! the mechanism behind distgemm's floor over a GEMM without communication (kernels-gpu
//! NOTES, steps 21–22).
//!
//! NVLinks of these GPUs sit in a *low-speed* power state when idle; traffic can switch them
//! to *high speed*, and a link returns to low speed only after it has idled for the low-power
//! threshold (`nvidia-smi nvlink -gLowPwrInfo`: 50 ms on the H200 machines). Under the 700 W
//! board cap, power spent on links at high speed is taken from the SMs.
//!
//! GPU 0 reads GPU 1's memory in a sequence of traffic patterns, each kept up for
//! `--ms` milliseconds (default 800) after 300 ms of idling. A thread samples every NVLink's
//! power state on both GPUs (NVML field `NVML_FI_DEV_NVLINK_GET_POWER_STATE`) every 5 ms from
//! 100 ms into the pattern. Per pattern: the bytes moved per second and the mean share of
//! links at high speed on each GPU.
//!
//! Patterns: idle; SM reads (the reduction kernel with one source on the peer) of 16 B every
//! 1 ms and 4 KiB every 10 ms, as distgemm's diagnostics issue them once per run; streaming
//! SM reads by 1, 4, 16 and 528 blocks of 256 threads (a few GB/s up to full speed: the
//! rate grows with the loads in flight); the copy engine pulling 256 KiB every 50 µs, and
//! pulling 64 MiB back to back.
//!
//! Usage: `nvlink_states [FILTER] [--ms N]` (runs only if its name contains FILTER); needs two
//! GPUs with peer access (with one it says so and exits 0). Writes
//! `nvlink-states-<date>-<commit>.md` under `DISTGEMM_BENCH_RESULTS` (or `benches/results`).
use clap::Parser;
use distgemm::cuda::{REDUCE_SMEM_BYTES, REDUCE_THREADS, ReduceParams};
use distgemm::runtime::{
    CudaStream, DeviceBuffer, Gpu, Graph, GraphExec, KernelArgs, LaunchConfig, Module,
    enable_peer_access_between, hopper_gpus,
};
use distgemm_benches::energy::EnergyMeter;
use distgemm_benches::{Provenance, RunnerFlags, results_dir};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bytes of GPU 1's source buffer and of GPU 0's destination.
const BUFFER_BYTES: usize = 256 << 20;
/// Idle time before each pattern: several times the links' 50 ms low-power threshold.
const IDLE_BEFORE: Duration = Duration::from_millis(300);
/// Sampling starts this long into a pattern.
const SAMPLE_SKIP: Duration = Duration::from_millis(100);
/// Sampling period.
const SAMPLE_PERIOD: Duration = Duration::from_millis(5);

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// How a pattern moves data from GPU 1 to GPU 0.
#[derive(Clone, Copy, Debug)]
enum Traffic {
    Idle,
    /// One SM read of `bytes` (one block), every `every`.
    PacedRead {
        bytes: usize,
        every: Duration,
    },
    /// SM reads of the whole buffer by `blocks` blocks, back to back.
    StreamingRead {
        blocks: u32,
    },
    /// One copy-engine pull of `bytes`, every `every` (`Duration::ZERO`: back to back).
    Copy {
        bytes: usize,
        every: Duration,
    },
}

/// One graph per (kind, size): launched on GPU 0's stream.
struct Launcher {
    exec: GraphExec,
    _graph: Graph,
    bytes: usize,
}

fn read_graph(
    gpu: &Gpu,
    module: &Arc<Module>,
    src: u64,
    dst: u64,
    bytes: usize,
    blocks: u32,
) -> Res<Launcher> {
    // Rows of 4096 elements (8 KiB), or one row of what is asked for when it is smaller.
    let elements = (bytes / 2) as u32;
    let cols = elements.min(4096);
    let mut params = ReduceParams {
        dst,
        rows: elements / cols,
        cols,
        dst_ld: cols,
        source_count: 1,
        ..ReduceParams::default()
    };
    params.sources[0] = src;
    params.source_ld[0] = cols;
    let kernel = module.kernel("reduce_sum_bf16").map_err(err)?;
    let mut graph = Graph::new(gpu).map_err(err)?;
    let cfg = LaunchConfig::linear(blocks, REDUCE_THREADS).with_dynamic_smem(REDUCE_SMEM_BYTES);
    let mut args = KernelArgs::new().by_value(&params);
    // SAFETY: `reduce_sum_bf16(p: ReduceParams)` over `bytes` of two live buffers of
    // BUFFER_BYTES (the caller keeps them alive as long as the graph); no flags.
    unsafe { graph.add_kernel_node(&kernel, &cfg, &mut args) }.map_err(err)?;
    let exec = graph.instantiate().map_err(err)?;
    Ok(Launcher {
        exec,
        _graph: graph,
        bytes: (params.rows * cols * 2) as usize,
    })
}

fn copy_graph(gpu: &Gpu, src: u64, dst: u64, bytes: usize) -> Res<Launcher> {
    let mut graph = Graph::new(gpu).map_err(err)?;
    // SAFETY: `bytes` ≤ BUFFER_BYTES of two live buffers (kept alive by the caller).
    unsafe { graph.add_memcpy_node(dst, src, bytes) }.map_err(err)?;
    let exec = graph.instantiate().map_err(err)?;
    Ok(Launcher {
        exec,
        _graph: graph,
        bytes,
    })
}

/// Samples both GPUs' link states until stopped: mean share of links at high speed per GPU.
fn sample_links(bus_ids: Vec<String>, stop: Arc<AtomicBool>) -> Res<Vec<f64>> {
    let meters = bus_ids
        .iter()
        .map(|id| EnergyMeter::open_bus_id(id))
        .collect::<Res<Vec<_>>>()?;
    std::thread::sleep(SAMPLE_SKIP);
    let mut shares = vec![0.0; meters.len()];
    let mut samples = 0;
    while !stop.load(Ordering::Relaxed) {
        for (meter, share) in meters.iter().zip(&mut shares) {
            let (high, total) = meter.nvlinks_at_high_speed()?;
            if total == 0 {
                return Err("NVML reports no NVLink power state".into());
            }
            *share += f64::from(high) / f64::from(total);
        }
        samples += 1;
        std::thread::sleep(SAMPLE_PERIOD);
    }
    if samples == 0 {
        return Err("no samples".into());
    }
    Ok(shares.into_iter().map(|s| s / f64::from(samples)).collect())
}

/// Runs `traffic` for `length` on GPU 0's stream; returns the bytes moved.
fn drive(
    traffic: Traffic,
    launchers: &Launchers,
    stream: &CudaStream,
    length: Duration,
) -> Res<usize> {
    let start = Instant::now();
    let mut moved = 0;
    let (launcher, every) = match traffic {
        Traffic::Idle => {
            std::thread::sleep(length);
            return Ok(0);
        }
        Traffic::PacedRead { bytes, every } => (launchers.read(bytes, 1)?, every),
        Traffic::StreamingRead { blocks } => {
            (launchers.read(BUFFER_BYTES, blocks)?, Duration::ZERO)
        }
        Traffic::Copy { bytes, every } => (launchers.copy(bytes)?, every),
    };
    let mut next = start;
    while start.elapsed() < length {
        launcher.exec.launch(stream).map_err(err)?;
        moved += launcher.bytes;
        if every.is_zero() {
            stream.synchronize().map_err(err)?;
        } else {
            next += every;
            while Instant::now() < next {
                std::hint::spin_loop();
            }
        }
    }
    stream.synchronize().map_err(err)?;
    Ok(moved)
}

/// Every graph the patterns launch, built up front.
struct Launchers {
    reads: Vec<((usize, u32), Launcher)>,
    copies: Vec<(usize, Launcher)>,
}

impl Launchers {
    fn read(&self, bytes: usize, blocks: u32) -> Res<&Launcher> {
        self.reads
            .iter()
            .find(|(k, _)| *k == (bytes, blocks))
            .map(|(_, l)| l)
            .ok_or_else(|| format!("no read graph of {bytes} B × {blocks} blocks"))
    }
    fn copy(&self, bytes: usize) -> Res<&Launcher> {
        self.copies
            .iter()
            .find(|(b, _)| *b == bytes)
            .map(|(_, l)| l)
            .ok_or_else(|| format!("no copy graph of {bytes} B"))
    }
}

/// Which NVLink traffic puts the links into their high-speed power state (see
/// `benches/nvlink_states.rs`).
#[derive(Debug, Parser)]
#[command(name = "nvlink_states")]
struct Args {
    /// Run only if `nvlink_states` contains this (the bundle's runner passes every bench its
    /// FILTER, as `cargo bench -- FILTER` does).
    filter: Option<String>,
    /// How long each traffic pattern is kept up, ms.
    #[arg(long, default_value_t = 800)]
    ms: u64,
    #[command(flatten)]
    runner: RunnerFlags,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("nvlink_states: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let args = Args::parse();
    if args.runner.listed("nvlink_states") {
        return Ok(());
    }
    if args
        .filter
        .is_some_and(|f| !"nvlink_states".contains(f.as_str()))
    {
        return Ok(());
    }
    let length = Duration::from_millis(args.ms);
    let gpus = hopper_gpus().map_err(err)?;
    if gpus.len() < 2 {
        // Like the other benches on a machine that lacks what a column needs: say so, pass.
        println!(
            "nvlink_states: skipped, it needs two GPUs and found {}",
            gpus.len()
        );
        return Ok(());
    }
    let (g0, g1) = (&gpus[0], &gpus[1]);
    enable_peer_access_between(g0, g1).map_err(err)?;
    let module = Module::load(g0).map_err(err)?;
    let stream = g0.new_stream().map_err(err)?;
    let mut src = DeviceBuffer::<u16>::alloc(g1, BUFFER_BYTES / 2).map_err(err)?;
    let s1 = g1.new_stream().map_err(err)?;
    src.fill(&s1, 0x3f80).map_err(err)?; // bf16 1.0
    let dst = DeviceBuffer::<u16>::alloc(g0, BUFFER_BYTES / 2).map_err(err)?;
    let (s, d) = (src.device_ptr(), dst.device_ptr());

    let patterns: Vec<(&str, Traffic)> = vec![
        ("idle", Traffic::Idle),
        (
            "SM read 16 B every 1 ms",
            Traffic::PacedRead {
                bytes: 16,
                every: Duration::from_millis(1),
            },
        ),
        (
            "SM read 4 KiB every 10 ms",
            Traffic::PacedRead {
                bytes: 4096,
                every: Duration::from_millis(10),
            },
        ),
        (
            "SM read, streaming, 1 block",
            Traffic::StreamingRead { blocks: 1 },
        ),
        (
            "SM read, streaming, 4 blocks",
            Traffic::StreamingRead { blocks: 4 },
        ),
        (
            "SM read, streaming, 16 blocks",
            Traffic::StreamingRead { blocks: 16 },
        ),
        (
            "SM read, streaming, 528 blocks",
            Traffic::StreamingRead { blocks: 528 },
        ),
        (
            "copy engine 256 KiB every 50 µs",
            Traffic::Copy {
                bytes: 256 << 10,
                every: Duration::from_micros(50),
            },
        ),
        (
            "copy engine 64 MiB back to back",
            Traffic::Copy {
                bytes: 64 << 20,
                every: Duration::ZERO,
            },
        ),
        ("idle again", Traffic::Idle),
    ];
    let mut launchers = Launchers {
        reads: Vec::new(),
        copies: Vec::new(),
    };
    for (_, t) in &patterns {
        match *t {
            Traffic::PacedRead { bytes, .. } => launchers
                .reads
                .push(((bytes, 1), read_graph(g0, &module, s, d, bytes, 1)?)),
            Traffic::StreamingRead { blocks } => launchers.reads.push((
                (BUFFER_BYTES, blocks),
                read_graph(g0, &module, s, d, BUFFER_BYTES, blocks)?,
            )),
            Traffic::Copy { bytes, .. } => {
                launchers.copies.push((bytes, copy_graph(g0, s, d, bytes)?))
            }
            Traffic::Idle => {}
        }
    }
    let bus_ids = vec![g0.pci_bus_id().to_owned(), g1.pci_bus_id().to_owned()];
    let mut rows = Vec::new();
    for (name, traffic) in &patterns {
        std::thread::sleep(IDLE_BEFORE);
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (ids, stop) = (bus_ids.clone(), Arc::clone(&stop));
            std::thread::spawn(move || sample_links(ids, stop))
        };
        let start = Instant::now();
        let moved = drive(*traffic, &launchers, &stream, length);
        let seconds = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let shares = sampler
            .join()
            .map_err(|_| "the sampler panicked".to_owned())?;
        let moved = moved?;
        let shares = shares?;
        let row = format!(
            "| {name} | {:.2} | {:.0} % | {:.0} % |",
            moved as f64 / seconds / 1e9,
            100.0 * shares[0],
            100.0 * shares[1]
        );
        println!("{row}");
        rows.push(row);
    }
    let p = Provenance::collect(g0);
    let md = format!(
        "# NVLink power states under traffic from GPU 1 to GPU 0\n\nMachine: {} × 2, {}. Date: {}. Commit: {}. Each pattern runs {} ms after {} ms idle; NVML `NVML_FI_DEV_NVLINK_GET_POWER_STATE` of every link sampled every {} ms from {} ms in (`benches/nvlink_states.rs`).\n\n| pattern | GB/s | GPU 0 links at high speed | GPU 1 links at high speed |\n|---|---:|---:|---:|\n{}\n",
        p.gpu,
        p.driver,
        p.date,
        p.commit,
        length.as_millis(),
        IDLE_BEFORE.as_millis(),
        SAMPLE_PERIOD.as_millis(),
        SAMPLE_SKIP.as_millis(),
        rows.join("\n")
    );
    let dir = results_dir();
    std::fs::create_dir_all(&dir).map_err(err)?;
    let path = dir.join(format!("nvlink-states-{}-{}.md", &p.date[..10], p.commit));
    std::fs::write(&path, md).map_err(err)?;
    println!("wrote {}", path.display());
    Ok(())
}
