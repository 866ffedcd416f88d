//! The user's shard buffers as a distributed GEMM sees them, and their validation against a
//! plan.
//!
//! A [`BufferRef`] borrows the buffer it names: a [`super::DistGemm`] built from it cannot
//! outlive the memory its graphs read and write. Dropping a buffer while the GEMM still holds
//! a reference to it does not compile:
//!
//! ```compile_fail
//! # use distgemm::cuda::{BufferRef, DistGemm};
//! # use distgemm::runtime::{DeviceBuffer, Gpu};
//! # fn misuse(gpu: &Gpu) -> Result<(), Box<dyn std::error::Error>> {
//! let buffer = DeviceBuffer::<u16>::alloc(gpu, 1024)?;
//! let reference = BufferRef::of(&buffer);
//! drop(buffer); // error[E0505]: cannot move out of `buffer` because it is borrowed
//! let _keep = reference;
//! # Ok(())
//! # }
//! ```

use std::marker::PhantomData;

use super::error::DistGemmError;
use crate::fp8::ScaleMode;
use crate::plan::Plan;
use crate::runtime::{DeviceBuffer, DeviceCopy};
use crate::schedule::BufferKind;

/// A user buffer: device address, size and owning GPU, borrowed for `'a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef<'a> {
    ptr: u64,
    bytes: usize,
    ordinal: usize,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> BufferRef<'a> {
    /// The whole of `buffer`, borrowed.
    #[must_use]
    pub fn of<T: DeviceCopy>(buffer: &'a DeviceBuffer<T>) -> Self {
        BufferRef {
            ptr: buffer.device_ptr(),
            bytes: buffer.size_bytes(),
            ordinal: buffer.ordinal(),
            _borrow: PhantomData,
        }
    }

    /// A raw allocation (e.g. another library's tensor).
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be `cuMemAlloc` (or VMM) memory of GPU `ordinal` that stays
    /// allocated for `'a` and for every run enqueued while it is used.
    #[must_use]
    pub unsafe fn from_raw(ptr: u64, bytes: usize, ordinal: usize) -> Self {
        BufferRef {
            ptr,
            bytes,
            ordinal,
            _borrow: PhantomData,
        }
    }

    /// Device address.
    #[must_use]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The GPU that owns the memory.
    #[must_use]
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for BufferRef<'a> {
    fn from(buffer: &'a DeviceBuffer<T>) -> Self {
        BufferRef::of(buffer)
    }
}

/// One device's shard buffers, packed row-major as the plan's shard layout says
/// (sizes: [`crate::plan::DevicePlan::buffer_elements`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceArgs<'a> {
    /// Shard of A.
    pub a: BufferRef<'a>,
    /// Shard of B.
    pub b: BufferRef<'a>,
    /// Shard of C (required exactly when beta ≠ 0; ignored otherwise).
    pub c: Option<BufferRef<'a>>,
    /// Shard of D (the output).
    pub d: BufferRef<'a>,
    /// Row-wise FP8 only (required then, `None` otherwise): the scale vectors.
    pub row_scales: Option<Fp8RowScales<'a>>,
}

/// Row-wise FP8 scales as every device holds them: one f32 per row of the *global* A (M) and
/// of the global B (N), whichever rows the device's shards hold. The stage GEMMs read the
/// scales of the rows they multiply; nothing moves them between GPUs. (Scales are 4 bytes
/// per row against K bytes of e4m3: a framework that has only its shard's scales gathers
/// them with its own collective first.) Their values are the caller's to keep finite and
/// positive; the host cannot check device memory without a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8RowScales<'a> {
    /// M f32: `sa[i]` scales row `i` of A (row `i` of D).
    pub a: BufferRef<'a>,
    /// N f32: `sb[j]` scales row `j` of B (column `j` of D).
    pub b: BufferRef<'a>,
}

/// Why device `device`'s row-wise scale vectors cannot serve `plan` (present exactly for a
/// row-wise FP8 plan; M and N f32 on the device's GPU, 4-byte aligned), if they cannot.
fn row_scales_problem(
    plan: &Plan,
    ordinal: usize,
    scales: Option<&Fp8RowScales<'_>>,
) -> Option<String> {
    let p = &plan.problem;
    let row_wise = p
        .fp8
        .is_some_and(|f| f.scales == crate::fp8::ScaleMode::Rowwise);
    match (row_wise, scales) {
        (false, None) => None,
        (false, Some(_)) => Some(format!("{p} has no row-wise scales: give none")),
        (true, None) => Some(format!(
            "{p} has row-wise FP8 scales: give the M and N f32 scale vectors (row_scales)"
        )),
        (true, Some(s)) => {
            [("A", s.a, p.m), ("B", s.b, p.n)]
                .into_iter()
                .find_map(|(name, b, rows)| {
                    let needed = rows.saturating_mul(4);
                    if b.ordinal != ordinal {
                        Some(format!(
                            "the scales of {name} live on GPU {}, not GPU {ordinal}",
                            b.ordinal
                        ))
                    } else if b.bytes < needed {
                        Some(format!(
                            "the scales of {name} have {} bytes, {rows} rows need {needed}",
                            b.bytes
                        ))
                    } else if b.ptr == 0 || !b.ptr.is_multiple_of(4) {
                        Some(format!(
                            "the scales of {name} at {:#x} are not a 4-byte-aligned device address",
                            b.ptr
                        ))
                    } else {
                        None
                    }
                })
        }
    }
}

/// Checks device `device`'s buffers against the plan: on GPU `ordinal`, large enough, 16-byte
/// aligned, C present exactly when the problem reads it.
pub(crate) fn validate_device_args(
    plan: &Plan,
    device: usize,
    ordinal: usize,
    args: &DeviceArgs<'_>,
) -> Result<(), DistGemmError> {
    let dev = plan
        .devices
        .get(device)
        .ok_or(DistGemmError::NoSuchDevice {
            device,
            tp: plan.tp,
        })?;
    let needs_c = dev.shards.c.is_some();
    let buffers = [
        (BufferKind::A, Some(args.a)),
        (BufferKind::B, Some(args.b)),
        (BufferKind::C, if needs_c { args.c } else { None }),
        (BufferKind::D, Some(args.d)),
    ];
    for (kind, buffer) in buffers {
        let needed = dev
            .buffer_elements(kind)
            .saturating_mul(plan.element_bytes(kind));
        let bad = |reason: String| DistGemmError::BadBuffer {
            device,
            buffer: kind,
            reason,
        };
        let Some(b) = buffer else {
            if kind == BufferKind::C && needs_c {
                return Err(bad(format!(
                    "beta = {} needs a C shard of {needed} bytes",
                    plan.problem.beta
                )));
            }
            continue;
        };
        if b.ordinal != ordinal {
            return Err(bad(format!(
                "it lives on GPU {} but rank {device} runs on GPU {ordinal}",
                b.ordinal
            )));
        }
        if b.bytes < needed {
            return Err(bad(format!(
                "it has {} bytes, the plan needs {needed} ({} elements)",
                b.bytes,
                dev.buffer_elements(kind)
            )));
        }
        if let Some(why) = address_problem(b.ptr) {
            return Err(bad(why));
        }
    }
    if let Some(reason) = row_scales_problem(plan, ordinal, args.row_scales.as_ref()) {
        return Err(DistGemmError::Fp8Scales(format!(
            "device {device}: {reason}"
        )));
    }
    let sized = |kind: BufferKind, b: &BufferRef<'_>| {
        (
            kind.name(),
            b.ptr,
            dev.buffer_elements(kind)
                .saturating_mul(plan.element_bytes(kind)),
        )
    };
    let d = sized(BufferKind::D, &args.d);
    let mut inputs = vec![sized(BufferKind::A, &args.a), sized(BufferKind::B, &args.b)];
    if let (true, Some(c)) = (needs_c, &args.c) {
        inputs.push(sized(BufferKind::C, c));
    }
    if let Some(other) = output_overlap((d.1, d.2), &inputs) {
        return Err(DistGemmError::BadBuffer {
            device,
            buffer: BufferKind::D,
            reason: format!("it overlaps the {other} shard; D must be separate memory"),
        });
    }
    Ok(())
}

/// Why `ptr` cannot be an operand's device address, if it cannot: null, or not 16-byte aligned
/// (TMA moves 16-byte units and its tensor maps need 16-byte-aligned bases).
pub(crate) fn address_problem(ptr: u64) -> Option<String> {
    (ptr == 0 || !ptr.is_multiple_of(16))
        .then(|| format!("address {ptr:#x} is not a 16-byte-aligned device address"))
}

/// The name of the first of `inputs` (name, address, bytes) whose bytes overlap the output
/// `d` (address, bytes): D is written while they are read, so they must be disjoint.
pub(crate) fn output_overlap<'n>(
    d: (u64, usize),
    inputs: &[(&'n str, u64, usize)],
) -> Option<&'n str> {
    let end = |start: u64, bytes: usize| start.saturating_add(bytes as u64);
    inputs
        .iter()
        .find(|(_, ptr, bytes)| {
            *bytes > 0 && d.1 > 0 && *ptr < end(d.0, d.1) && d.0 < end(*ptr, *bytes)
        })
        .map(|(name, ..)| *name)
}

/// [`validate_device_args`] for every device (`ordinals[d]` = rank d's GPU).
pub(crate) fn validate_args(
    plan: &Plan,
    ordinals: &[usize],
    args: &[DeviceArgs<'_>],
) -> Result<(), DistGemmError> {
    if args.len() != plan.tp {
        return Err(DistGemmError::ArgumentCount {
            given: args.len(),
            tp: plan.tp,
        });
    }
    for (d, (a, &ordinal)) in args.iter().zip(ordinals).enumerate() {
        validate_device_args(plan, d, ordinal, a)?;
    }
    Ok(())
}

/// `Ok` when the tensor-wise `scales` fit `plan`'s problem: `[sa, sb]`, each finite and at
/// least [`crate::fp8::MIN_SCALE`], for a tensor-wise FP8 problem; none for a 16-bit one or a
/// row-wise one (whose scale vectors come with the buffers: [`DeviceArgs::row_scales`]).
pub(crate) fn validate_fp8_scales(
    plan: &Plan,
    scales: Option<[f32; 2]>,
) -> Result<(), DistGemmError> {
    let p = &plan.problem;
    let mode = p.fp8.map(|f| f.scales);
    match (mode, scales) {
        (None | Some(ScaleMode::Rowwise), None) => Ok(()),
        (Some(ScaleMode::Tensorwise), Some([a, b])) => crate::fp8::Scales::Tensorwise { a, b }
            .validate(p.m, p.n)
            .map_err(|e| DistGemmError::Fp8Scales(e.to_string())),
        (Some(ScaleMode::Tensorwise), None) => Err(DistGemmError::Fp8Scales(format!(
            "{p} is FP8: give the tensor-wise scales of A and B (fp8_scales)"
        ))),
        (Some(ScaleMode::Rowwise), Some(_)) => Err(DistGemmError::Fp8Scales(format!(
            "{p} has row-wise scales: they come as scale vectors with each device's buffers, \
             not as fp8_scales"
        ))),
        (None, Some(_)) => Err(DistGemmError::Fp8Scales(format!(
            "{p} is not FP8: it takes no scales"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_scales_go_with_fp8_problems_only_and_in_range() {
        use crate::fp8::ScaleMode;
        use crate::problem::Problem;
        use crate::schedule::ScheduleKind;
        let plan = |p: Problem| {
            Plan::build(ScheduleKind::AllGatherRotatingA, p, 2).unwrap_or_else(|e| panic!("{e}"))
        };
        let bf16 = plan(Problem::new(256, 256, 256));
        let fp8 = plan(Problem::new(256, 256, 256).with_fp8(ScaleMode::Tensorwise));
        let rows = plan(Problem::new(256, 256, 256).with_fp8(ScaleMode::Rowwise));
        assert!(validate_fp8_scales(&bf16, None).is_ok());
        assert!(validate_fp8_scales(&fp8, Some([0.5, 2.0])).is_ok());
        assert!(validate_fp8_scales(&rows, None).is_ok());
        for (plan, scales, says) in [
            (&fp8, None, "give the tensor-wise scales"),
            (&rows, Some([1.0, 1.0]), "scale vectors"),
            (&bf16, Some([1.0, 1.0]), "takes no scales"),
            (&fp8, Some([f32::NAN, 1.0]), "scale"),
            (&fp8, Some([1.0, 0.0]), "scale"),
        ] {
            let e = validate_fp8_scales(plan, scales)
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(says)),
                "{scales:?}: {e:?}"
            );
        }
    }

    /// Row-wise scale vectors: required exactly for a row-wise FP8 plan; M and N f32 (here
    /// 192 and 320) on the device's GPU, 4-byte aligned.
    #[test]
    fn row_scale_vectors_go_with_row_wise_plans_only_and_fit() {
        use crate::fp8::ScaleMode;
        use crate::problem::Problem;
        use crate::schedule::ScheduleKind;
        let plan = |p: Problem| {
            Plan::build(ScheduleKind::AllGatherRotatingA, p, 2).unwrap_or_else(|e| panic!("{e}"))
        };
        let rows = plan(Problem::new(192, 320, 256).with_fp8(ScaleMode::Rowwise));
        let tensor = plan(Problem::new(192, 320, 256).with_fp8(ScaleMode::Tensorwise));
        // SAFETY: fake addresses, only compared and never dereferenced.
        let buf = |ptr: u64, bytes: usize, ordinal: usize| unsafe {
            BufferRef::from_raw(ptr, bytes, ordinal)
        };
        let good = Fp8RowScales {
            a: buf(0x1000, 192 * 4, 3),
            b: buf(0x2004, 320 * 4, 3),
        };
        assert_eq!(row_scales_problem(&rows, 3, Some(&good)), None);
        assert_eq!(row_scales_problem(&tensor, 3, None), None);
        let cases = [
            (&rows, None, "give the M and N f32 scale vectors"),
            (&tensor, Some(good), "no row-wise scales"),
            (
                &rows,
                Some(Fp8RowScales {
                    a: buf(0x1000, 191 * 4, 3),
                    ..good
                }),
                "the scales of A have 764 bytes, 192 rows need 768",
            ),
            (
                &rows,
                Some(Fp8RowScales {
                    b: buf(0x2002, 320 * 4, 3),
                    ..good
                }),
                "the scales of B at 0x2002 are not a 4-byte-aligned",
            ),
            (
                &rows,
                Some(Fp8RowScales {
                    b: buf(0x2004, 320 * 4, 1),
                    ..good
                }),
                "the scales of B live on GPU 1, not GPU 3",
            ),
        ];
        for (plan, scales, says) in cases {
            let why = row_scales_problem(plan, 3, scales.as_ref());
            assert!(why.as_deref().is_some_and(|w| w.contains(says)), "{why:?}");
        }
    }

    #[test]
    fn addresses_must_be_non_null_and_16_byte_aligned() {
        assert!(address_problem(0).is_some());
        assert!(address_problem(0x1008).is_some());
        assert!(address_problem(0x1010).is_none());
    }

    #[test]
    fn an_output_may_touch_but_not_overlap_its_inputs() {
        let inputs = [("A", 0x1000, 0x100), ("B", 0x2000, 0x100)];
        assert_eq!(output_overlap((0x1100, 0x100), &inputs), None);
        assert_eq!(output_overlap((0x0f00, 0x100), &inputs), None);
        assert_eq!(output_overlap((0x10f0, 0x20), &inputs), Some("A"));
        assert_eq!(output_overlap((0x1f00, 0x200), &inputs), Some("B"));
        assert_eq!(output_overlap((0x1000, 0), &inputs), None);
    }
}
