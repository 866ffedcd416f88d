//! distgemm as a library: one tensor-parallel GEMM, planned once, run on the CPU executor and,
//! where there are enough Hopper GPUs with peer access, on them; both results checked against
//! a float64 reference.
//!
//! ```sh
//! cargo run --release --example distgemm_library            # TP = 2
//! cargo run --release --example distgemm_library -- 4       # TP = 1, 2, 4 or 8
//! ```
//!
//! The layer is a column-parallel projection (an MLP's fc1, or QKV) under sequence
//! parallelism: every device holds M/TP of the tokens (its rows of A) and N/TP of the weight's
//! output features (its rows of B), and must produce all M tokens of its N/TP output columns.
//! That is the all-gather schedule `ag-a` (CUTLASS's `AllGather1D_TilingCD_RotatingA`): A's
//! shards rotate between the devices while each device multiplies the shard it has.

use std::error::Error;
use std::process::ExitCode;

use distgemm::cpu::CpuExecutor;
use distgemm::cuda::{BufferRef, DeviceArgs, DistGemm};
use distgemm::plan::{DeviceInputs, GlobalInputs, Plan};
use distgemm::problem::Problem;
use distgemm::reference::{CheckInputs, check};
use distgemm::runtime::{DeviceBuffer, Gpu, hopper_gpus};
use distgemm::schedule::{BufferKind, ScheduleKind};
use half::bf16;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let tp: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|e| format!("TP must be a number from 1 to 8, not `{arg}` ({e})"))?,
        None => 2,
    };
    // D (M×N) = A (M×K) · Bᵀ, B stored N×K: 512 tokens, 1024 output and 512 input features.
    let problem = Problem::new(512, 1024, 512);
    let schedule = ScheduleKind::AllGatherRotatingA;

    // The plan is pure data: per device, what to compute at every stage, what to copy from
    // which peer and which flags to wait for. It also knows every device's shard layout.
    let plan = Plan::build(schedule, problem, tp)?;
    let inputs = GlobalInputs::<bf16>::random(&problem, 7);
    let shards = plan.shard_inputs(&inputs)?;

    // The CPU executor runs the same plan with one thread per device: no GPU needed.
    let d = run_on_cpu(plan.clone(), &shards)?;
    report("CPU executor", &plan, &inputs, &d)?;

    // The GPUs, when this machine has TP Hopper GPUs that can reach each other.
    match usable_gpus(tp) {
        Ok(gpus) => {
            let d = run_on_gpus(&plan, gpus, &shards)?;
            report("GPUs", &plan, &inputs, &d)?;
        }
        Err(reason) => println!("GPUs: skipped ({reason})"),
    }
    Ok(())
}

/// Runs `plan` on the CPU executor and returns the global D.
fn run_on_cpu(plan: Plan, shards: &[DeviceInputs<bf16>]) -> Result<Vec<bf16>, Box<dyn Error>> {
    let mut exec = CpuExecutor::<bf16>::new(plan)?;
    exec.load_inputs(shards)?;
    exec.run(1)?;
    Ok(exec.plan().gather_output(&exec.outputs())?)
}

/// The first `tp` Hopper GPUs, if there are that many and every pair has peer access.
fn usable_gpus(tp: usize) -> Result<Vec<Gpu>, Box<dyn Error>> {
    let gpus: Vec<Gpu> = hopper_gpus()?.into_iter().take(tp).collect();
    if gpus.len() < tp {
        return Err(format!("TP={tp} needs {tp} Hopper GPUs, found {}", gpus.len()).into());
    }
    for a in &gpus {
        for b in &gpus {
            if !a.can_access_peer(b)? {
                return Err(
                    format!("GPU {} cannot access GPU {}", a.ordinal(), b.ordinal()).into(),
                );
            }
        }
    }
    Ok(gpus)
}

/// One device's shard buffers on its GPU.
struct GpuShard {
    a: DeviceBuffer<bf16>,
    b: DeviceBuffer<bf16>,
    d: DeviceBuffer<bf16>,
}

/// Uploads every device's shards, builds a `DistGemm` (one CUDA graph per GPU, built and
/// instantiated once), runs it once and returns the global D.
fn run_on_gpus(
    plan: &Plan,
    gpus: Vec<Gpu>,
    shards: &[DeviceInputs<bf16>],
) -> Result<Vec<bf16>, Box<dyn Error>> {
    let mut buffers = Vec::with_capacity(gpus.len());
    for ((gpu, shard), dev) in gpus.iter().zip(shards).zip(&plan.devices) {
        let stream = gpu.new_stream()?;
        let buffer = GpuShard {
            a: DeviceBuffer::from_host(gpu, &stream, &shard.a)?,
            b: DeviceBuffer::from_host(gpu, &stream, &shard.b)?,
            d: DeviceBuffer::alloc(gpu, dev.buffer_elements(BufferKind::D))?,
        };
        distgemm::runtime::stream::synchronize(&stream)?;
        buffers.push((buffer, stream));
    }
    // The buffers must outlive the DistGemm that reads and writes them.
    let args = buffers
        .iter()
        .map(|(shard, _)| DeviceArgs {
            a: BufferRef::of(&shard.a),
            b: BufferRef::of(&shard.b),
            c: None, // beta = 0: no C
            d: BufferRef::of(&shard.d),
            row_scales: None, // bf16: no FP8 scale vectors
        })
        .collect();
    let mut dist = DistGemm::builder()
        .devices(gpus)
        .schedule(plan.schedule)
        .problem(plan.problem)
        .args(args)
        .build()?; // validates, enables peer access, builds and instantiates the graphs
    dist.run()?; // launches one graph per GPU
    dist.wait()?; // a stuck peer becomes an error naming the device, stage and flag
    drop(dist);

    let mut outputs = Vec::with_capacity(buffers.len());
    for (shard, stream) in &buffers {
        outputs.push(shard.d.download(stream)?);
    }
    Ok(plan.gather_output(&outputs)?)
}

/// Checks `d` against the float64 reference, with the error bound of the schedule's
/// roundings, and prints the outcome; a mismatch is an error.
fn report(
    what: &str,
    plan: &Plan,
    inputs: &GlobalInputs<bf16>,
    d: &[bf16],
) -> Result<(), Box<dyn Error>> {
    let checked = CheckInputs {
        a: &inputs.a,
        b: &inputs.b,
        c: inputs.c.as_deref(),
    };
    let roundings = plan.schedule.roundings(plan.tp);
    let result = check(&plan.problem, roundings, plan.tp, checked, d)?;
    println!(
        "{what}: {} TP={} {}: {} of {} elements within the bound (worst {:.3} of it)",
        plan.schedule.cli_name(),
        plan.tp,
        plan.problem,
        result.elements - result.mismatches,
        result.elements,
        result.worst_ratio
    );
    if result.passed() {
        Ok(())
    } else {
        Err(format!("{what}: {} elements off the reference", result.mismatches).into())
    }
}
