//! Random operands generated on the GPU (`fill_normal_*` kernels), for benchmarks whose
//! operands are too large to generate on the host in reasonable time.
use crate::cuda::{BufferRef, DeviceArgs};
use crate::dtype::{Dtype, Element};
use crate::plan::Plan;
use crate::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, Gpu, KernelArgs, LaunchConfig, Module, RuntimeError,
    launch, stream,
};
use crate::schedule::BufferKind;
use std::sync::Arc;

/// Fills `buffer` with approximately N(0, 1) values (a sum of four hashed uniforms, scaled),
/// deterministic in `seed`. Never zeros: the data exercises the tensor cores like real weights.
pub fn fill_normal<T: Element + DeviceCopy>(
    module: &Arc<Module>,
    stream: &CudaStream,
    buffer: &mut DeviceBuffer<T>,
    seed: u32,
) -> Result<(), RuntimeError> {
    let name = match T::DTYPE {
        Dtype::Bf16 => "fill_normal_bf16",
        Dtype::F16 => "fill_normal_f16",
    };
    let kernel = module.kernel(name)?;
    let blocks = (buffer.len().div_ceil(256) as u32).clamp(1, 16 * module.gpu().sm_count());
    let mut args = KernelArgs::new()
        .ptr(buffer)
        .u64(buffer.len() as u64)
        .u32(seed);
    // SAFETY: `fill_normal_*(out: *mut u16, n: u64, seed: u32)` writes `n` 2-byte elements
    // at `out`, exactly the buffer's length.
    unsafe {
        launch(
            &kernel,
            stream,
            &LaunchConfig::linear(blocks, 256),
            &mut args,
        )
    }
}

/// One device's operands of a plan, in `cuMemAlloc` memory (peers may read them).
#[derive(Debug)]
pub struct RandomShard<T: DeviceCopy> {
    /// Shard of A.
    pub a: DeviceBuffer<T>,
    /// Shard of B.
    pub b: DeviceBuffer<T>,
    /// Shard of C: empty when the plan has none.
    pub c: DeviceBuffer<T>,
    /// Shard of D, poisoned with `0xFF` bytes (NaN in bf16 and f16).
    pub d: DeviceBuffer<T>,
}

impl<T: DeviceCopy> RandomShard<T> {
    /// The buffers as a [`crate::cuda::DistGemm`]'s arguments for this device.
    pub fn device_args(&self) -> DeviceArgs<'_> {
        DeviceArgs {
            a: BufferRef::of(&self.a),
            b: BufferRef::of(&self.b),
            c: (!self.c.is_empty()).then(|| BufferRef::of(&self.c)),
            d: BufferRef::of(&self.d),
            row_scales: None,
        }
    }
}

/// Every device's operands of `plan`, sized by it: A, B and C (where the plan has one) filled
/// with [`fill_normal`] (seed `seed + 8·device + operand`), D poisoned. `gpus[d]` and
/// `modules[d]` serve device `d`. Returns once the fills are complete: a `DistGemm` orders its
/// work after its own streams only. The shards must outlive any `DistGemm` that uses them.
pub fn random_shards<T: Element + DeviceCopy>(
    plan: &Plan,
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    seed: u32,
) -> Result<Vec<RandomShard<T>>, RuntimeError> {
    let mut shards = Vec::with_capacity(plan.devices.len());
    for (d, ((dev, gpu), module)) in plan.devices.iter().zip(gpus).zip(modules).enumerate() {
        let fill_stream = gpu.new_stream()?;
        let alloc = |kind| DeviceBuffer::<T>::alloc(gpu, dev.buffer_elements(kind));
        let mut shard = RandomShard {
            a: alloc(BufferKind::A)?,
            b: alloc(BufferKind::B)?,
            c: alloc(BufferKind::C)?,
            d: alloc(BufferKind::D)?,
        };
        for (i, buf) in [&mut shard.a, &mut shard.b, &mut shard.c]
            .into_iter()
            .enumerate()
        {
            if !buf.is_empty() {
                let seed = seed.wrapping_add(8 * d as u32 + i as u32);
                fill_normal(module, &fill_stream, buf, seed)?;
            }
        }
        shard.d.fill_bytes(&fill_stream, 0xFF)?;
        stream::synchronize(&fill_stream)?;
        shards.push(shard);
    }
    Ok(shards)
}
