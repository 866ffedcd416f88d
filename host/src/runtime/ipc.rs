//! Device memory shared with other processes: legacy CUDA IPC handles.
//!
//! `cuIpcGetMemHandle` turns the base address of a `cuMemAlloc` allocation into a 64-byte
//! opaque handle; another process on the same host passes it to `cuIpcOpenMemHandle` and gets
//! an address of the same memory in its own context (on the same GPU, or on a peer GPU over
//! NVLink: `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` enables peer access as a side effect). The
//! mapping is released with `cuIpcCloseMemHandle`; the memory itself lives until its owner
//! frees it. Handles are plain bytes, so any byte rendezvous can carry them (a Unix socket,
//! `torch.distributed.all_gather_object`), with no file descriptors to pass.
//!
//! Why legacy IPC rather than the VMM path (`cuMemCreate` + POSIX file descriptors) is said in
//! [`crate::cuda::rank`]; both end in a device address, which is all the plan and the
//! lowering ever see.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};

/// Bytes of a legacy IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// An exported `cuMemAlloc` allocation (`CUipcMemHandle`), as bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcHandle(#[serde(with = "hex_bytes")] Vec<u8>);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcHandle({} bytes)", self.0.len())
    }
}

impl IpcHandle {
    /// Exports the allocation whose base address is `base` (`cuIpcGetMemHandle`). `base` must
    /// be the start of a `cuMemAlloc` allocation of `gpu` (the driver refuses anything else).
    pub fn export(gpu: &Gpu, base: u64) -> Result<IpcHandle> {
        gpu.bind()?;
        let mut raw = sys::CUipcMemHandle_st {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: `raw` is a properly sized out-parameter; the driver validates `base`.
        unsafe { sys::cuIpcGetMemHandle(&mut raw, base) }
            .result()
            .map_err(RuntimeError::driver("cuIpcGetMemHandle"))?;
        Ok(IpcHandle(raw.reserved.iter().map(|&b| b as u8).collect()))
    }

    fn raw(&self) -> Result<sys::CUipcMemHandle_st> {
        let bytes: &[u8; IPC_HANDLE_BYTES] = self.0.as_slice().try_into().map_err(|_| {
            RuntimeError::Ipc(format!(
                "an IPC handle has {IPC_HANDLE_BYTES} bytes, this one {}",
                self.0.len()
            ))
        })?;
        Ok(sys::CUipcMemHandle_st {
            reserved: bytes.map(|b| b as core::ffi::c_char),
        })
    }
}

/// Another process's allocation mapped into this process on `gpu` (`cuIpcOpenMemHandle`);
/// unmapped on drop (`cuIpcCloseMemHandle`).
#[derive(Debug)]
pub struct IpcMapping {
    ptr: u64,
    gpu: Gpu,
}

impl IpcMapping {
    /// Maps `handle` on `gpu`. Fails (driver error) for a handle exported by this process, a
    /// handle whose allocation was freed, or memory of a GPU this process cannot reach.
    pub fn open(gpu: &Gpu, handle: &IpcHandle) -> Result<IpcMapping> {
        let raw = handle.raw()?;
        gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is an out-parameter; the driver validates the handle.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(RuntimeError::driver("cuIpcOpenMemHandle"))?;
        Ok(IpcMapping {
            ptr,
            gpu: gpu.clone(),
        })
    }

    /// The mapped base address, valid in this process's context of the GPU.
    #[must_use]
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    /// `cuIpcCloseMemHandle`; errors are recorded in the cudarc context.
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: opened by cuIpcOpenMemHandle in this context, closed once.
        ctx.record_err(unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result());
    }
}

/// Serde of handle bytes as a lowercase hex string (readable in a JSON handshake).
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&hex)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let hex = String::deserialize(d)?;
        if hex.len() % 2 != 0 || !hex.is_ascii() {
            return Err(D::Error::custom(
                "an IPC handle is an even number of hex digits",
            ));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(D::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_travel_as_hex() {
        let handle = IpcHandle((0..64u8).collect());
        let json = serde_json::to_string(&handle).unwrap();
        assert!(json.starts_with("\"000102"));
        let back: IpcHandle = serde_json::from_str(&json).unwrap();
        assert_eq!(back, handle);
        assert!(back.raw().is_ok());
        assert!(serde_json::from_str::<IpcHandle>("\"0g\"").is_err());
        assert!(serde_json::from_str::<IpcHandle>("\"abc\"").is_err());
        assert!(IpcHandle(vec![1, 2]).raw().is_err());
    }
}
