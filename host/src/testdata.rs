//! Random operands generated on the GPU (`fill_normal_*` kernels), for benchmarks whose
//! operands are too large to generate on the host in reasonable time; FP8 codes from a
//! table at memory speed on the host ([`random_e4m3_bytes`]).
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::cuda::{BufferRef, DeviceArgs, Fp8RowScales};
use crate::dtype::{Dtype, Element};
use crate::fp8::{E4m3, ScaleMode};
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

/// One device's operands of a plan, in `cuMemAlloc` memory (peers may read them): A and B
/// as `O` (the element type, or e4m3 codes as `u8` for an FP8 plan), C and D as `T`.
#[derive(Debug)]
pub struct RandomShard<T: DeviceCopy, O: DeviceCopy = T> {
    /// Shard of A.
    pub a: DeviceBuffer<O>,
    /// Shard of B.
    pub b: DeviceBuffer<O>,
    /// Shard of C: empty when the plan has none.
    pub c: DeviceBuffer<T>,
    /// Shard of D, poisoned with `0xFF` bytes (NaN in bf16 and f16).
    pub d: DeviceBuffer<T>,
    /// Row-wise FP8's full scale vectors (M and N f32); `None` otherwise.
    pub row_scales: Option<(DeviceBuffer<f32>, DeviceBuffer<f32>)>,
}

impl<T: DeviceCopy, O: DeviceCopy> RandomShard<T, O> {
    /// The buffers as a [`crate::cuda::DistGemm`]'s arguments for this device.
    pub fn device_args(&self) -> DeviceArgs<'_> {
        DeviceArgs {
            a: BufferRef::of(&self.a),
            b: BufferRef::of(&self.b),
            c: (!self.c.is_empty()).then(|| BufferRef::of(&self.c)),
            d: BufferRef::of(&self.d),
            row_scales: self.row_scales.as_ref().map(|(a, b)| Fp8RowScales {
                a: BufferRef::of(a),
                b: BufferRef::of(b),
            }),
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
            row_scales: None,
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

/// `len` e4m3 codes drawn as the CLI's FP8 inputs are (16·N(0, 1), never zero), at memory
/// speed: a table of 256 such codes indexed by the bytes of a SplitMix64 stream, both
/// deterministic in `seed`. (Presets' operands are up to 1.7 G codes, too many to draw one by
/// one; the table keeps the value distribution, which is what the tensor cores' power sees.)
#[must_use]
pub fn random_e4m3_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let table: Vec<u8> = crate::plan::random_e4m3(256, &mut rng)
        .into_iter()
        .map(E4m3::to_bits)
        .collect();
    let mut state = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        // SplitMix64: eight table indices per step.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let take = (len - out.len()).min(8);
        out.extend(
            z.to_le_bytes()[..take]
                .iter()
                .map(|&i| table[usize::from(i)]),
        );
    }
    out
}

/// Random operands of a plan in either element form, for `bench` and `tune`.
#[derive(Debug)]
pub enum RandomOperands<T: DeviceCopy> {
    /// bf16 or f16 A and B ([`random_shards`]).
    Plain(Vec<RandomShard<T>>),
    /// e4m3 A and B ([`random_fp8_operands`]), with the tensor-wise scales a builder takes
    /// (`None` for row-wise, whose vectors are in the shards).
    Fp8(Vec<RandomShard<T, u8>>, Option<(f32, f32)>),
}

impl<T: DeviceCopy> RandomOperands<T> {
    /// Every device's arguments.
    pub fn device_args(&self) -> Vec<DeviceArgs<'_>> {
        match self {
            RandomOperands::Plain(s) => s.iter().map(RandomShard::device_args).collect(),
            RandomOperands::Fp8(s, _) => s.iter().map(RandomShard::device_args).collect(),
        }
    }

    /// The tensor-wise FP8 scales to build with, if any.
    pub fn tensor_scales(&self) -> Option<(f32, f32)> {
        match self {
            RandomOperands::Fp8(_, scales) => *scales,
            RandomOperands::Plain(_) => None,
        }
    }
}

/// Every device's operands of `plan`: [`random_shards`] for a bf16 or f16 plan,
/// [`random_fp8_operands`] for an FP8 one.
pub fn random_operands<T: Element + DeviceCopy>(
    plan: &Plan,
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    seed: u32,
) -> Result<RandomOperands<T>, RuntimeError> {
    Ok(match plan.problem.fp8 {
        None => RandomOperands::Plain(random_shards(plan, gpus, modules, seed)?),
        Some(_) => random_fp8_operands(plan, gpus, modules, seed)?,
    })
}

/// Every device's operands of the FP8 `plan`: A and B from [`random_e4m3_bytes`] (seed
/// `seed + 8·device + operand`), C (where the plan has one) from [`fill_normal`], D poisoned,
/// positive scales as the CLI draws them (2^u, u in [−6, −2)): tensor-wise kept for the
/// builder, row-wise uploaded to every device. Returns once the uploads are complete.
pub fn random_fp8_operands<T: Element + DeviceCopy>(
    plan: &Plan,
    gpus: &[Gpu],
    modules: &[Arc<Module>],
    seed: u32,
) -> Result<RandomOperands<T>, RuntimeError> {
    let mut rng = StdRng::seed_from_u64(u64::from(seed));
    let p = &plan.problem;
    let (tensor, rows) = match p.fp8.map(|f| f.scales) {
        Some(ScaleMode::Rowwise) => (
            None,
            Some((
                crate::plan::random_scales(p.m, &mut rng),
                crate::plan::random_scales(p.n, &mut rng),
            )),
        ),
        _ => {
            let s = crate::plan::random_scales(2, &mut rng);
            (Some((s[0], s[1])), None)
        }
    };
    let mut shards = Vec::with_capacity(plan.devices.len());
    for (d, ((dev, gpu), module)) in plan.devices.iter().zip(gpus).zip(modules).enumerate() {
        let stream = gpu.new_stream()?;
        let codes = |kind, operand: u32| {
            let seed = u64::from(seed.wrapping_add(8 * d as u32 + operand));
            DeviceBuffer::from_host(
                gpu,
                &stream,
                &random_e4m3_bytes(dev.buffer_elements(kind), seed),
            )
        };
        let mut c = DeviceBuffer::<T>::alloc(gpu, dev.buffer_elements(BufferKind::C))?;
        if !c.is_empty() {
            fill_normal(module, &stream, &mut c, seed.wrapping_add(8 * d as u32 + 2))?;
        }
        let mut out = DeviceBuffer::<T>::alloc(gpu, dev.buffer_elements(BufferKind::D))?;
        out.fill_bytes(&stream, 0xFF)?;
        let row_scales = match &rows {
            Some((a, b)) => Some((
                DeviceBuffer::from_host(gpu, &stream, a)?,
                DeviceBuffer::from_host(gpu, &stream, b)?,
            )),
            None => None,
        };
        shards.push(RandomShard {
            a: codes(BufferKind::A, 0)?,
            b: codes(BufferKind::B, 1)?,
            c,
            d: out,
            row_scales,
        });
        stream::synchronize(&stream)?;
    }
    Ok(RandomOperands::Fp8(shards, tensor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_e4m3_bytes_are_reproducible_finite_nonzero_and_spread() {
        let a = random_e4m3_bytes(100_003, 7);
        assert_eq!(a.len(), 100_003);
        assert_eq!(a, random_e4m3_bytes(100_003, 7));
        assert_ne!(a, random_e4m3_bytes(100_003, 8));
        let values: Vec<f32> = a.iter().map(|&b| E4m3::from_bits(b).to_f32()).collect();
        assert!(values.iter().all(|v| v.is_finite() && *v != 0.0));
        // 16·N(0, 1): mean near 0, standard deviation near 16 (the table's 256 draws bound
        // how close), both signs, many distinct codes.
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let sd = (values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        assert!(mean.abs() < 3.0, "mean {mean}");
        assert!((12.0..20.0).contains(&sd), "sd {sd}");
        let mut distinct = a.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 60, "{} distinct codes", distinct.len());
    }
}
