//! Host memory of the logical devices: five element buffers and the exclusive workspace each.
//!
//! In an FP8 plan the operand buffers ([`BufferKind::holds_operands`]: A, B and an all-gather
//! workspace) are [`Fp8Buffer`]s of e4m3 codes instead, each row with its row-wise scale
//! beside it ([`Plan::operand_row_elements`]), so that a copy of whole rows moves their scales
//! too; the output-typed buffers of the same kinds are then empty.
//!
//! Sharing scheme: every buffer sits behind its own `RwLock`. A node takes one lock at a time,
//! only to copy a view out (read lock) or a finished result in (write lock), and never holds a
//! lock while it waits on a flag, a barrier or another lock, so locks cannot deadlock or hide a
//! protocol error: which data a reader sees is decided by the flags alone, exactly as on the GPU
//! (a read before the producer's store sees stale or poisoned data and fails the check).

use std::sync::atomic::AtomicU32;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dtype::Element;
use crate::fp8::{E4m3, ScaleMode, Scales};
use crate::plan::{DeviceInputs, Fp8DeviceInputs, Plan};
use crate::schedule::{BufferKind, Region, View};

/// The buffers of one logical device.
#[derive(Debug)]
pub(crate) struct DeviceMemory<T> {
    a: RwLock<Vec<T>>,
    b: RwLock<Vec<T>>,
    c: RwLock<Vec<T>>,
    d: RwLock<Vec<T>>,
    workspace: RwLock<Vec<T>>,
    /// The e4m3 operand buffers of an FP8 plan.
    pub(crate) fp8: Option<Fp8Memory>,
}

/// One e4m3 buffer: codes, and with row-wise scales one f32 per row of `row` elements.
#[derive(Debug)]
pub(crate) struct Fp8Buffer {
    codes: Vec<E4m3>,
    row_scales: Vec<f32>,
    row: usize,
}

impl Fp8Buffer {
    /// `elements` zero codes in rows of `row` (scales only when row-wise).
    fn new(elements: usize, row: usize, mode: ScaleMode) -> Self {
        let rows = match mode {
            ScaleMode::Rowwise => elements.checked_div(row).unwrap_or(0),
            ScaleMode::Tensorwise => 0,
        };
        Fp8Buffer {
            codes: vec![E4m3::default(); elements],
            row_scales: vec![0.0; rows],
            row,
        }
    }
}

/// The e4m3 buffers of one device of an FP8 plan, and the tensor-wise scales of its inputs.
#[derive(Debug)]
pub(crate) struct Fp8Memory {
    /// How the scales are laid out.
    pub(crate) mode: ScaleMode,
    a: RwLock<Fp8Buffer>,
    b: RwLock<Fp8Buffer>,
    /// The gathered slots of an all-gather schedule (`None` for reduce-scatter, whose
    /// workspace holds output-typed partials).
    workspace: Option<RwLock<Fp8Buffer>>,
    /// `(sa, sb)` of tensor-wise scales (unused row-wise).
    tensor_scales: RwLock<(f32, f32)>,
}

impl Fp8Memory {
    fn buffer(&self, kind: BufferKind) -> Option<&RwLock<Fp8Buffer>> {
        match kind {
            BufferKind::A => Some(&self.a),
            BufferKind::B => Some(&self.b),
            BufferKind::Workspace => self.workspace.as_ref(),
            BufferKind::C | BufferKind::D => None,
        }
    }

    /// Copies a device's FP8 shards and scales in (sizes checked by the caller).
    pub(crate) fn store_inputs(&self, a: &[E4m3], b: &[E4m3], scales: &Scales) {
        for (kind, codes) in [(BufferKind::A, a), (BufferKind::B, b)] {
            if let Some(buffer) = self.buffer(kind) {
                write_lock(buffer).codes.copy_from_slice(codes);
            }
        }
        match scales {
            Scales::Tensorwise { a, b } => *write_lock(&self.tensor_scales) = (*a, *b),
            Scales::Rowwise { a, b } => {
                write_lock(&self.a).row_scales.copy_from_slice(a);
                write_lock(&self.b).row_scales.copy_from_slice(b);
            }
        }
    }

    /// Fills the gathered slots with NaN codes and NaN scales.
    pub(crate) fn poison(&mut self) {
        if let Some(ws) = &mut self.workspace {
            let ws = ws.get_mut().unwrap_or_else(PoisonError::into_inner);
            ws.codes.fill(E4m3::NAN);
            ws.row_scales.fill(f32::NAN);
        }
    }

    /// `(sa, sb)` of tensor-wise scales.
    pub(crate) fn tensor_scales(&self) -> (f32, f32) {
        *self
            .tensor_scales
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn write_lock<X>(lock: &RwLock<X>) -> RwLockWriteGuard<'_, X> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl<T: Element> DeviceMemory<T> {
    /// Zeroed buffers sized as the plan says for `device`: in an FP8 plan, the operand
    /// buffers as e4m3 (and their output-typed ones empty).
    pub(crate) fn new(plan: &Plan, device: usize) -> Self {
        let dev = &plan.devices[device];
        let fp8 = plan.problem.fp8;
        let operand = |kind: BufferKind| fp8.is_some() && kind.holds_operands(plan.schedule);
        let zeros = |kind| {
            let len = if operand(kind) {
                0
            } else {
                dev.buffer_elements(kind)
            };
            RwLock::new(vec![T::default(); len])
        };
        let fp8 = fp8.map(|fp8| {
            let buffer = |kind| {
                let row = plan.operand_row_elements(device, kind).unwrap_or(0);
                RwLock::new(Fp8Buffer::new(dev.buffer_elements(kind), row, fp8.scales))
            };
            Fp8Memory {
                mode: fp8.scales,
                a: buffer(BufferKind::A),
                b: buffer(BufferKind::B),
                workspace: operand(BufferKind::Workspace).then(|| buffer(BufferKind::Workspace)),
                tensor_scales: RwLock::new((0.0, 0.0)),
            }
        });
        DeviceMemory {
            a: zeros(BufferKind::A),
            b: zeros(BufferKind::B),
            c: zeros(BufferKind::C),
            d: zeros(BufferKind::D),
            workspace: zeros(BufferKind::Workspace),
            fp8,
        }
    }

    /// Copies a device's FP8 input shards into its e4m3 A and B, their scales and its C (sizes
    /// checked by the caller; an FP8 device).
    pub(crate) fn store_fp8_inputs(&self, inputs: &Fp8DeviceInputs<T>) {
        if let Some(fp8) = &self.fp8 {
            fp8.store_inputs(&inputs.a, &inputs.b, &inputs.scales);
        }
        if let Some(c) = &inputs.c {
            self.write(BufferKind::C).copy_from_slice(c);
        }
    }

    fn lock(&self, kind: BufferKind) -> &RwLock<Vec<T>> {
        match kind {
            BufferKind::A => &self.a,
            BufferKind::B => &self.b,
            BufferKind::C => &self.c,
            BufferKind::D => &self.d,
            BufferKind::Workspace => &self.workspace,
        }
    }

    /// Shared access to a buffer. A poisoned lock only means another thread panicked; the
    /// elements are plain values, so the data is still usable (the panic is reported itself).
    pub(crate) fn read(&self, kind: BufferKind) -> RwLockReadGuard<'_, Vec<T>> {
        self.lock(kind)
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, kind: BufferKind) -> RwLockWriteGuard<'_, Vec<T>> {
        self.lock(kind)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Copies a device's input shards into its A, B and C (sizes checked by the caller).
    pub(crate) fn store_inputs(&self, inputs: &DeviceInputs<T>) {
        self.write(BufferKind::A).copy_from_slice(&inputs.a);
        self.write(BufferKind::B).copy_from_slice(&inputs.b);
        if let Some(c) = &inputs.c {
            self.write(BufferKind::C).copy_from_slice(c);
        }
    }

    /// Sets every element of a buffer to `value`.
    pub(crate) fn fill(&self, kind: BufferKind, value: T) {
        self.write(kind).fill(value);
    }

    /// Exclusive access without locking (the executor is not running).
    pub(crate) fn get_mut(&mut self, kind: BufferKind) -> &mut Vec<T> {
        match kind {
            BufferKind::A => &mut self.a,
            BufferKind::B => &mut self.b,
            BufferKind::C => &mut self.c,
            BufferKind::D => &mut self.d,
            BufferKind::Workspace => &mut self.workspace,
        }
        .get_mut()
        .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Copies a view out of its buffer as packed f32 (`rows × cols`, ld = cols).
pub(crate) fn read_view_f32<T: Element>(memory: &[DeviceMemory<T>], v: &View) -> Vec<f32> {
    let buf = memory[v.device].read(v.buffer);
    let mut out = Vec::with_capacity(v.elements());
    for r in 0..v.rows {
        let start = v.offset + r * v.ld;
        out.extend(buf[start..start + v.cols].iter().map(|x| x.to_f32()));
    }
    out
}

/// Stores a packed `rows × cols` result into a view.
pub(crate) fn write_view<T: Element>(memory: &[DeviceMemory<T>], v: &View, values: &[T]) {
    let mut buf = memory[v.device].write(v.buffer);
    for r in 0..v.rows {
        let start = v.offset + r * v.ld;
        buf[start..start + v.cols].copy_from_slice(&values[r * v.cols..(r + 1) * v.cols]);
    }
}

/// Copies `src` into `dst` (two phases, one lock each); e4m3 rows move with their row-wise
/// scales (validation guarantees whole rows).
pub(crate) fn copy_region<T: Element>(memory: &[DeviceMemory<T>], src: &Region, dst: &Region) {
    let fp8 = |r: &Region| {
        memory[r.device]
            .fp8
            .as_ref()
            .and_then(|f| f.buffer(r.buffer))
    };
    if let (Some(from), Some(to)) = (fp8(src), fp8(dst)) {
        let (codes, scales) = {
            let from = from.read().unwrap_or_else(PoisonError::into_inner);
            let rows = row_range(&from, src.offset, src.len);
            (
                from.codes[src.offset..src.offset + src.len].to_vec(),
                from.row_scales.get(rows).map(<[f32]>::to_vec),
            )
        };
        let mut to = write_lock(to);
        to.codes[dst.offset..dst.offset + dst.len].copy_from_slice(&codes);
        let rows = row_range(&to, dst.offset, dst.len);
        if let (Some(scales), Some(into)) = (scales, to.row_scales.get_mut(rows)) {
            into.copy_from_slice(&scales);
        }
        return;
    }
    let data: Vec<T> =
        memory[src.device].read(src.buffer)[src.offset..src.offset + src.len].to_vec();
    memory[dst.device].write(dst.buffer)[dst.offset..dst.offset + dst.len].copy_from_slice(&data);
}

/// The rows of `buffer` that `len` elements from `offset` cover (whole rows).
fn row_range(buffer: &Fp8Buffer, offset: usize, len: usize) -> std::ops::Range<usize> {
    let row = buffer.row.max(1);
    offset / row..(offset + len) / row
}

/// Copies an e4m3 view out of its buffer: the packed `rows × cols` codes and, row-wise, the
/// scale of each of its rows (the row of its first element); `None` when the view's buffer
/// is not e4m3.
pub(crate) fn read_view_e4m3<T>(
    memory: &[DeviceMemory<T>],
    v: &View,
) -> Option<(Vec<E4m3>, Vec<f32>)> {
    let buffer = memory[v.device].fp8.as_ref()?.buffer(v.buffer)?;
    let buf = buffer.read().unwrap_or_else(PoisonError::into_inner);
    let mut codes = Vec::with_capacity(v.elements());
    let mut scales = Vec::new();
    for r in 0..v.rows {
        let start = v.offset + r * v.ld;
        codes.extend_from_slice(&buf.codes[start..start + v.cols]);
        if let Some(&s) = buf.row_scales.get(start / buf.row.max(1)) {
            scales.push(s);
        }
    }
    Some((codes, scales))
}

/// The exclusive workspace of one device: the running barrier counter and the flags (stage
/// flags, then release flags).
#[derive(Debug)]
pub(crate) struct ExclusiveWorkspace {
    pub(crate) counter: AtomicU32,
    pub(crate) flags: Vec<AtomicU32>,
}

impl ExclusiveWorkspace {
    /// All zero (the state `initialize` establishes once).
    pub(crate) fn new(flag_count: usize) -> Self {
        ExclusiveWorkspace {
            counter: AtomicU32::new(0),
            flags: (0..flag_count).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}
