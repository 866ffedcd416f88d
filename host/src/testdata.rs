//! Random operands generated on the GPU (`fill_normal_*` kernels), for benchmarks whose
//! operands are too large to generate on the host in reasonable time.
use crate::dtype::{Dtype, Element};
use crate::runtime::{
    CudaStream, DeviceBuffer, DeviceCopy, KernelArgs, LaunchConfig, Module, RuntimeError, launch,
};
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
