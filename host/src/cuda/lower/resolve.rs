//! Addresses of one plan's views, regions, flags and counters on every device.

use kernels_gpu::collective_abi::PeerErrorWords;

use super::DeviceAddresses;
use crate::cuda::error::DistGemmError;
use crate::gemm::MatrixView;
use crate::plan::Plan;
use crate::schedule::{BufferKind, FlagRef, Region, View};

/// Resolves addresses for one plan.
pub(super) struct Resolver<'a> {
    pub(super) plan: &'a Plan,
    pub(super) addresses: &'a [DeviceAddresses],
}

impl Resolver<'_> {
    pub(super) fn device(&self, device: usize) -> Result<&DeviceAddresses, DistGemmError> {
        self.addresses
            .get(device)
            .ok_or_else(|| DistGemmError::Internal(format!("no addresses for device {device}")))
    }

    pub(super) fn element(
        &self,
        device: usize,
        buffer: BufferKind,
        offset: usize,
    ) -> Result<u64, DistGemmError> {
        let base = self.device(device)?.of(buffer);
        if base == 0 {
            return Err(DistGemmError::Internal(format!(
                "device {device}'s {} buffer is used but has no address",
                buffer.name()
            )));
        }
        let element_bytes = self.plan.element_bytes(buffer) as u64;
        Ok(base + offset as u64 * element_bytes)
    }

    pub(super) fn view(&self, v: &View) -> Result<MatrixView, DistGemmError> {
        Ok(MatrixView {
            ptr: self.element(v.device, v.buffer, v.offset)?,
            rows: v.rows as u64,
            cols: v.cols as u64,
            ld: v.ld as u64,
        })
    }

    pub(super) fn region(&self, r: &Region) -> Result<u64, DistGemmError> {
        self.element(r.device, r.buffer, r.offset)
    }

    pub(super) fn exclusive(&self, device: usize, offset: usize) -> Result<u64, DistGemmError> {
        Ok(self.device(device)?.exclusive + offset as u64)
    }

    pub(super) fn flag(&self, f: &FlagRef) -> Result<u64, DistGemmError> {
        self.exclusive(f.device, self.plan.exclusive.flag_offset(f.index))
    }

    pub(super) fn flags<'f>(
        &self,
        flags: impl IntoIterator<Item = &'f FlagRef>,
    ) -> Result<Vec<u64>, DistGemmError> {
        flags.into_iter().map(|f| self.flag(f)).collect()
    }

    pub(super) fn counter(&self, device: usize) -> Result<u64, DistGemmError> {
        self.exclusive(device, self.plan.exclusive.counter_offset)
    }

    pub(super) fn error_word(&self, device: usize) -> Result<u64, DistGemmError> {
        self.exclusive(device, self.plan.exclusive.error_offset)
    }

    /// The error words of every device but `device`.
    pub(super) fn peer_errors(&self, device: usize) -> Result<PeerErrorWords, DistGemmError> {
        let words: Vec<u64> = (0..self.plan.tp)
            .filter(|&q| q != device)
            .map(|q| self.error_word(q))
            .collect::<Result<_, _>>()?;
        fixed(&words, "peers' error words")
    }
}

/// Copies up to `N` values into a fixed array (unused entries default).
pub(super) fn fixed<T: Copy + Default, const N: usize>(
    values: &[T],
    what: &str,
) -> Result<[T; N], DistGemmError> {
    if values.len() > N {
        return Err(DistGemmError::Internal(format!(
            "{} {what}, more than the {N} a parameter block holds",
            values.len()
        )));
    }
    let mut out = [T::default(); N];
    out[..values.len()].copy_from_slice(values);
    Ok(out)
}

pub(super) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
