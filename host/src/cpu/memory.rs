//! Host memory of the logical devices: five element buffers and the exclusive workspace each.
//!
//! Sharing scheme: every buffer sits behind its own `RwLock`. A node takes one lock at a time,
//! only to copy a view out (read lock) or a finished result in (write lock), and never holds a
//! lock while it waits on a flag, a barrier or another lock, so locks cannot deadlock or hide a
//! protocol error: which data a reader sees is decided by the flags alone, exactly as on the GPU
//! (a read before the producer's store sees stale or poisoned data and fails the check).

use std::sync::atomic::AtomicU32;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dtype::Element;
use crate::plan::{DeviceInputs, DevicePlan};
use crate::schedule::{BufferKind, Region, View};

/// The buffers of one logical device.
#[derive(Debug)]
pub(crate) struct DeviceMemory<T> {
    a: RwLock<Vec<T>>,
    b: RwLock<Vec<T>>,
    c: RwLock<Vec<T>>,
    d: RwLock<Vec<T>>,
    workspace: RwLock<Vec<T>>,
}

impl<T: Element> DeviceMemory<T> {
    /// Zeroed buffers sized as the device plan says.
    pub(crate) fn new(plan: &DevicePlan) -> Self {
        let zeros = |kind| RwLock::new(vec![T::default(); plan.buffer_elements(kind)]);
        DeviceMemory {
            a: zeros(BufferKind::A),
            b: zeros(BufferKind::B),
            c: zeros(BufferKind::C),
            d: zeros(BufferKind::D),
            workspace: zeros(BufferKind::Workspace),
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

/// Copies `src` into `dst` (two phases, one lock each).
pub(crate) fn copy_region<T: Element>(memory: &[DeviceMemory<T>], src: &Region, dst: &Region) {
    let data: Vec<T> =
        memory[src.device].read(src.buffer)[src.offset..src.offset + src.len].to_vec();
    memory[dst.device].write(dst.buffer)[dst.offset..dst.offset + dst.len].copy_from_slice(&data);
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
