//! The CUDA runtime of distgemm: the only module that talks to the CUDA driver.
//!
//! It stands on [`cudarc`] and follows cudarc's three levels: where cudarc's safe layer
//! covers what we need (contexts, streams, events, graph capture) we use it directly; where it
//! does not (PTX loading with JIT logs, `cuMemAlloc` buffers, tensor maps, `cuLaunchKernelEx`
//! with cluster/PDL attributes, graph edges, peer access) each raw `cudarc::driver::sys` call is
//! wrapped exactly once, here, returning [`RuntimeError`].
//!
//! | piece | what it owns |
//! |---|---|
//! | [`device`] | driver discovery (no panic without `libcuda`), [`Gpu`] (one primary context per device, CC 9.0 only), peer access |
//! | [`module`] | PTX source (env path or embedded), `cuModuleLoadDataEx` with JIT logs, [`Kernel`] lookup |
//! | [`memory`] | [`DeviceBuffer`]: plain `cuMemAlloc` memory that peers can access |
//! | [`tensor_map`] | [`TensorMapEncoding`]: `cuTensorMapEncodeTiled` (passed by value); [`TensorMap2d`]: one kept in device memory (passed as `u64`) |
//! | [`mod@launch`] | [`LaunchConfig`], [`KernelArgs`], `cuLaunchKernelEx` with cluster / programmatic serialization |
//! | [`stream`] | timing events and CUDA-graph capture / topology on top of cudarc's stream |
//! | [`caller_stream`] | work on a stream the caller owns: raw stream handles, completion events, stream-ordered copies, a pinned status word |
//! | [`ipc`] | device memory shared with other processes (legacy CUDA IPC handles) |
//! | [`graph`] | explicitly built graphs: kernel / memcpy / write-value nodes, edges with edge data, instantiation, launch, `cuGraphExec*SetParams` |
//!
//! Everything that needs no GPU (launch validation, tensor-map validation, PTX source
//! selection) is a plain function with unit tests.

pub mod caller_stream;
pub mod device;
mod error;
pub mod graph;
pub mod ipc;
pub mod launch;
pub mod memory;
pub mod module;
pub mod stream;
pub mod tensor_map;

pub use caller_stream::{PinnedWord, RawStream, StreamEvent};
pub use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream};
pub use device::{
    DriverVersion, Gpu, PeerSupport, device_uuid, driver_version, enable_peer_access_between,
    hopper_gpus, peer_support, require_peer_link,
};
pub use error::{MIN_DRIVER_API_VERSION, Result, RuntimeError};
pub use graph::{Graph, GraphExec, GraphNode};
pub use ipc::{IpcHandle, IpcMapping};
pub use launch::{KernelArgs, LaunchConfig, launch, max_active_clusters};
pub use memory::{DeviceBuffer, DeviceCopy};
pub use module::{Kernel, Module, PtxOrigin};
pub use tensor_map::{
    L2Promotion, Swizzle, TensorMap2d, TensorMapDtype, TensorMapEncoding, TensorMapSpec,
};
