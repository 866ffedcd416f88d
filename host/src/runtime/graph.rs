//! Explicitly built CUDA graphs: kernel, memcpy and write-value nodes, dependencies
//! with edge data, instantiation, launch, and parameter updates of an instantiated graph.
//!
//! cudarc's safe layer only offers graphs made by stream capture. distgemm builds its
//! per-device graphs node by node instead, because a plan's DAG is data: every node and every
//! edge (with its kind) is created exactly as the plan lists it, and the node handles are kept
//! so that a later pointer update can rewrite one node of the *instantiated* graph
//! (`cuGraphExec*SetParams`) without rebuilding anything.
//!
//! Programmatic dependent launch in an explicit graph is an edge property: an edge between two
//! kernel nodes with `CUgraphEdgeData{type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC, from_port =
//! CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC}` lets the downstream kernel launch once every block
//! of the upstream one has executed `griddepcontrol.launch_dependents` (or exited); the
//! launch attribute `PROGRAMMATIC_STREAM_SERIALIZATION` is for stream launches only and is
//! ignored here. Thread-block clusters are a kernel-node attribute.
//!
//! One function per driver call, each returning [`RuntimeError`] with the call's name.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use super::launch::{KernelArgs, LaunchConfig, LaunchLimits};
use super::module::Kernel;
use super::stream::{DependencyKind, GraphEdge, GraphTopology, topology_of};
use cudarc::driver::{CudaStream, sys};

/// A node of a [`Graph`], valid while the graph lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphNode(sys::CUgraphNode);

// SAFETY: a node handle is a token the driver accepts from any thread; it is only passed to
// calls on its graph (or instance), which bind the context first.
unsafe impl Send for GraphNode {}
// SAFETY: as above; nothing is mutated through a shared handle.
unsafe impl Sync for GraphNode {}

impl GraphNode {
    /// The driver's handle (the profiler asks CUPTI for the node's id with it).
    #[cfg(feature = "cli")]
    pub(crate) fn raw(self) -> sys::CUgraphNode {
        self.0
    }
}

/// A CUDA graph under construction on one GPU (`cuGraphCreate`); destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    raw: sys::CUgraph,
    gpu: Gpu,
    /// Nodes in creation order (what [`Graph::topology`] indexes).
    nodes: Vec<sys::CUgraphNode>,
}

// SAFETY: graph handles may be used from any thread; every method binds the GPU's context
// first, and `&mut self` serialises mutation.
unsafe impl Send for Graph {}
// SAFETY: shared access only reads the graph (`topology`, `instantiate`).
unsafe impl Sync for Graph {}

/// The edge data of a dependency of `kind`.
#[must_use]
pub fn edge_data(kind: DependencyKind) -> sys::CUgraphEdgeData {
    let (from_port, type_) = match kind {
        DependencyKind::Programmatic => (
            sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        ),
        DependencyKind::Default | DependencyKind::Other(_) => (
            sys::CU_GRAPH_KERNEL_NODE_PORT_DEFAULT as u8,
            sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8,
        ),
    };
    sys::CUgraphEdgeData {
        from_port,
        to_port: 0,
        type_,
        reserved: [0; 5],
    }
}

/// The kernel-node parameters of a launch of `kernel` with `cfg` (grid, block, dynamic shared
/// memory; clusters are an attribute, see [`Graph::add_kernel_node`]). `params` must outlive
/// the driver call that reads the struct.
fn kernel_node_params(
    kernel: &Kernel,
    cfg: &LaunchConfig,
    params: &mut [*mut std::ffi::c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: kernel.cu_function(),
        gridDimX: cfg.grid.0,
        gridDimY: cfg.grid.1,
        gridDimZ: cfg.grid.2,
        blockDimX: cfg.block.0,
        blockDimY: cfg.block.1,
        blockDimZ: cfg.block.2,
        sharedMemBytes: cfg.dynamic_smem,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Checks a kernel launch configuration and raises the kernel's shared-memory limit, as
/// [`super::launch()`] does for stream launches.
fn prepare_kernel_launch(kernel: &Kernel, cfg: &LaunchConfig) -> Result<()> {
    let limits = LaunchLimits {
        max_dynamic_smem: kernel.max_dynamic_smem(),
    };
    cfg.validate(&limits)
        .map_err(|reason| RuntimeError::InvalidLaunch {
            kernel: kernel.name().to_owned(),
            reason,
        })?;
    kernel.reserve_dynamic_smem(cfg.dynamic_smem)
}

/// A flat device-to-device copy of `bytes` bytes (a 1×1×`bytes` 3-D copy). With unified
/// addressing and peer access enabled, `src` and `dst` may live on different GPUs; the copy
/// runs on the copy engine of the graph's GPU.
fn memcpy_params(dst: u64, src: u64, bytes: usize) -> sys::CUDA_MEMCPY3D {
    let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: device,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: bytes,
        srcHeight: 1,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: device,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: bytes,
        dstHeight: 1,
        WidthInBytes: bytes,
        Height: 1,
        Depth: 1,
    }
}

/// One `CU_STREAM_MEM_OP_WRITE_VALUE_32` of `value` at `dst` with the default flags (a memory
/// fence before the write).
fn write_value_op(dst: u64, value: u32) -> sys::CUstreamBatchMemOpParams {
    // SAFETY: the union is plain data; all-zero is valid and the write member is set below.
    let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
    op.writeValue = sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
        operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32,
        address: dst,
        __bindgen_anon_1:
            sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                value,
            },
        flags: sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        alias: 0,
    };
    op
}

/// The parameters of a batch-mem-op node of the one operation `op` in `gpu`'s context. `op`
/// must outlive the driver call that reads the struct.
fn batch_mem_op_params(
    gpu: &Gpu,
    op: &mut sys::CUstreamBatchMemOpParams,
) -> sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
    sys::CUDA_BATCH_MEM_OP_NODE_PARAMS {
        ctx: gpu.context().cu_ctx(),
        count: 1,
        paramArray: op,
        flags: 0,
    }
}

impl Graph {
    /// An empty graph on `gpu` (`cuGraphCreate`).
    pub fn new(gpu: &Gpu) -> Result<Graph> {
        gpu.bind()?;
        let mut raw: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes one handle; flags must be 0.
        unsafe { sys::cuGraphCreate(&mut raw, 0) }
            .result()
            .map_err(RuntimeError::driver("cuGraphCreate"))?;
        Ok(Graph {
            raw,
            gpu: gpu.clone(),
            nodes: Vec::new(),
        })
    }

    /// The GPU the graph runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Number of nodes added so far.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn push(&mut self, node: sys::CUgraphNode) -> GraphNode {
        self.nodes.push(node);
        GraphNode(node)
    }

    /// Adds a kernel node without dependencies (`cuGraphAddKernelNode`), then its cluster
    /// shape if `cfg` has one ([`Graph::set_kernel_node_cluster`]). The driver copies the
    /// parameter values; `cfg.programmatic_serialization` is ignored (PDL is an edge kind).
    ///
    /// # Safety
    /// As for [`super::launch()`]: `args` must match the kernel's signature and every address in
    /// them must stay valid for as long as the graph may run.
    pub unsafe fn add_kernel_node(
        &mut self,
        kernel: &Kernel,
        cfg: &LaunchConfig,
        args: &mut KernelArgs,
    ) -> Result<GraphNode> {
        if kernel.gpu().ordinal() != self.gpu.ordinal() {
            return Err(RuntimeError::InvalidLaunch {
                kernel: kernel.name().to_owned(),
                reason: format!(
                    "the kernel is loaded on GPU {} but the graph belongs to GPU {}",
                    kernel.gpu().ordinal(),
                    self.gpu.ordinal()
                ),
            });
        }
        prepare_kernel_launch(kernel, cfg)?;
        let mut params = args.param_pointers();
        let node_params = kernel_node_params(kernel, cfg, &mut params);
        self.gpu.bind()?;
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `node_params` and the values it points to (in `args`) live across the call;
        // the driver copies them. No dependencies are passed.
        unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, self.raw, std::ptr::null(), 0, &node_params)
        }
        .result()
        .map_err(RuntimeError::driver("cuGraphAddKernelNode"))?;
        let node = self.push(node);
        if let Some(dims) = cfg.cluster {
            self.set_kernel_node_cluster(node, dims)?;
        }
        Ok(node)
    }

    /// Sets a kernel node's thread-block cluster shape
    /// (`cuGraphKernelNodeSetAttribute(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)`).
    pub fn set_kernel_node_cluster(
        &mut self,
        node: GraphNode,
        dims: (u32, u32, u32),
    ) -> Result<()> {
        // SAFETY: the attribute value is a plain-data union; all-zero is valid and the cluster
        // member is written below.
        let mut value: sys::CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
        value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
            x: dims.0,
            y: dims.1,
            z: dims.2,
        };
        self.gpu.bind()?;
        // SAFETY: `node` is a kernel node of this live graph; `value` outlives the call.
        unsafe {
            sys::cuGraphKernelNodeSetAttribute(
                node.0,
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                &value,
            )
        }
        .result()
        .map_err(RuntimeError::driver("cuGraphKernelNodeSetAttribute"))
    }

    /// Adds a copy of `bytes` bytes from `src` to `dst` without dependencies
    /// (`cuGraphAddMemcpyNode` in this GPU's context).
    ///
    /// # Safety
    /// Both ranges must be device memory (this GPU's, or a peer's with peer access enabled)
    /// that stays valid for as long as the graph may run.
    pub unsafe fn add_memcpy_node(
        &mut self,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<GraphNode> {
        let params = memcpy_params(dst, src, bytes);
        self.gpu.bind()?;
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `params` lives across the call; validity of the ranges is the caller's.
        unsafe {
            sys::cuGraphAddMemcpyNode(
                &mut node,
                self.raw,
                std::ptr::null(),
                0,
                &params,
                self.gpu.context().cu_ctx(),
            )
        }
        .result()
        .map_err(RuntimeError::driver("cuGraphAddMemcpyNode"))?;
        Ok(self.push(node))
    }

    /// Adds a release store of the 4-byte `value` at `dst` without dependencies: a batch
    /// memory-operation node (`cuGraphAddBatchMemOpNode`) of one
    /// `CU_STREAM_MEM_OP_WRITE_VALUE_32` with the default flags. The driver documents the
    /// default (`CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` unset) as: "cuStreamWriteValue32 will
    /// provide a memory fence before the write, which has similar semantics to
    /// `__threadfence_system()` but is scoped to the stream rather than a CUDA thread". So
    /// everything ordered before the node (e.g. a memcpy node on a graph edge) is visible
    /// system-wide before the value is: whoever acquires the value sees it. The operation runs
    /// in the front end of the GPU and needs no SM, so it makes progress while persistent
    /// kernels occupy every SM. `dst` may be a peer GPU's memory (peer access enabled).
    ///
    /// # Safety
    /// `dst` must be 4-byte-aligned device memory (this GPU's, or a peer's with peer access
    /// enabled) valid for as long as the graph may run.
    pub unsafe fn add_write_value_node(&mut self, dst: u64, value: u32) -> Result<GraphNode> {
        let mut op = write_value_op(dst, value);
        let params = batch_mem_op_params(&self.gpu, &mut op);
        self.gpu.bind()?;
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `params` and the operation it points to live across the call; the driver
        // copies them.
        unsafe { sys::cuGraphAddBatchMemOpNode(&mut node, self.raw, std::ptr::null(), 0, &params) }
            .result()
            .map_err(RuntimeError::driver("cuGraphAddBatchMemOpNode"))?;
        Ok(self.push(node))
    }

    /// Makes `to` depend on `from` (`cuGraphAddDependencies` with edge data, see
    /// [`edge_data`]). A programmatic dependency is only valid between two kernel nodes.
    pub fn add_dependency(
        &mut self,
        from: GraphNode,
        to: GraphNode,
        kind: DependencyKind,
    ) -> Result<()> {
        let data = edge_data(kind);
        self.gpu.bind()?;
        // SAFETY: both nodes belong to this live graph; one edge is described by one entry of
        // each array.
        unsafe { sys::cuGraphAddDependencies_v2(self.raw, &from.0, &to.0, &data, 1) }
            .result()
            .map_err(RuntimeError::driver("cuGraphAddDependencies"))
    }

    /// Instantiates the graph (`cuGraphInstantiateWithFlags`, no flags). The graph must be
    /// kept alive as long as node handles are used for updates of the instance.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.gpu.bind()?;
        let mut raw: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the graph is alive; one handle is written.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0) }
            .result()
            .map_err(RuntimeError::driver("cuGraphInstantiate"))?;
        Ok(GraphExec {
            raw,
            gpu: self.gpu.clone(),
        })
    }

    /// The graph's nodes and edges as the driver reports them (`cuGraphGetNodes`,
    /// `cuGraphGetEdges`), with node indices in *creation order*: index `i` is the `i`-th node
    /// added to this graph.
    pub fn topology(&self) -> Result<GraphTopology> {
        self.gpu.bind()?;
        let (driver_order, topology) = topology_of(self.raw)?;
        let creation_index = |i: usize| {
            driver_order
                .get(i)
                .and_then(|node| self.nodes.iter().position(|n| n == node))
                .ok_or_else(|| {
                    RuntimeError::Graph("the driver lists a node this graph did not add".into())
                })
        };
        let edges = topology
            .edges
            .iter()
            .map(|e| {
                Ok(GraphEdge {
                    from: creation_index(e.from)?,
                    to: creation_index(e.to)?,
                    ..*e
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(GraphTopology {
            node_count: topology.node_count,
            edges,
        })
    }
}

impl Drop for Graph {
    /// `cuGraphDestroy`; errors are recorded in the cudarc context (cannot return from drop).
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: created by cuGraphCreate, destroyed once; instances are independent of it.
        ctx.record_err(unsafe { sys::cuGraphDestroy(self.raw) }.result());
    }
}

/// An instantiated graph (`CUgraphExec`); destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    raw: sys::CUgraphExec,
    gpu: Gpu,
}

// SAFETY: as for `Graph`; launches and updates bind the context and take `&self`/`&mut self`.
unsafe impl Send for GraphExec {}
// SAFETY: `launch` is a single driver call that the driver serialises.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Enqueues one run of the graph on `stream` (`cuGraphLaunch`).
    pub fn launch(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().ordinal() != self.gpu.ordinal() {
            return Err(RuntimeError::Graph(format!(
                "the stream belongs to GPU {} but the graph to GPU {}",
                stream.context().ordinal(),
                self.gpu.ordinal()
            )));
        }
        self.launch_on(super::caller_stream::RawStream::of(stream))
    }

    /// Enqueues one run of the graph on a stream given by handle (`cuGraphLaunch`), e.g. the
    /// caller's; the stream must belong to this graph's GPU (the driver refuses others).
    pub fn launch_on(&self, stream: super::caller_stream::RawStream) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the instance is alive; the stream is (RawStream's contract).
        unsafe { sys::cuGraphLaunch(self.raw, stream.raw()) }
            .result()
            .map_err(RuntimeError::driver("cuGraphLaunch"))
    }

    /// Replaces the parameters of kernel node `node` in this instance
    /// (`cuGraphExecKernelNodeSetParams`). The kernel, grid, block and cluster must be those
    /// the node was created with (the driver refuses other changes of topology). Takes effect
    /// for launches after the call; do not call it while a launch of this instance runs.
    ///
    /// # Safety
    /// As for [`Graph::add_kernel_node`].
    pub unsafe fn set_kernel_node_params(
        &mut self,
        node: GraphNode,
        kernel: &Kernel,
        cfg: &LaunchConfig,
        args: &mut KernelArgs,
    ) -> Result<()> {
        prepare_kernel_launch(kernel, cfg)?;
        let mut params = args.param_pointers();
        let node_params = kernel_node_params(kernel, cfg, &mut params);
        self.gpu.bind()?;
        // SAFETY: `node` belongs to the graph this instance came from; the parameters live
        // across the call and are copied by the driver.
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(self.raw, node.0, &node_params) }
            .result()
            .map_err(RuntimeError::driver("cuGraphExecKernelNodeSetParams"))
    }

    /// Replaces the source, destination and size of memcpy node `node` in this instance
    /// (`cuGraphExecMemcpyNodeSetParams`); the same timing rule as for kernel nodes.
    ///
    /// # Safety
    /// As for [`Graph::add_memcpy_node`].
    pub unsafe fn set_memcpy_node_params(
        &mut self,
        node: GraphNode,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<()> {
        let params = memcpy_params(dst, src, bytes);
        self.gpu.bind()?;
        // SAFETY: `node` belongs to the graph this instance came from; `params` lives across
        // the call.
        unsafe {
            sys::cuGraphExecMemcpyNodeSetParams(
                self.raw,
                node.0,
                &params,
                self.gpu.context().cu_ctx(),
            )
        }
        .result()
        .map_err(RuntimeError::driver("cuGraphExecMemcpyNodeSetParams"))
    }
}

impl Drop for GraphExec {
    /// `cuGraphExecDestroy`; errors are recorded in the cudarc context.
    fn drop(&mut self) {
        let ctx = self.gpu.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: created by cuGraphInstantiate, destroyed once.
        ctx.record_err(unsafe { sys::cuGraphExecDestroy(self.raw) }.result());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programmatic_edges_leave_the_programmatic_port() {
        let e = edge_data(DependencyKind::Programmatic);
        assert_eq!((e.type_, e.from_port, e.to_port), (1, 1, 0));
        let e = edge_data(DependencyKind::Default);
        assert_eq!((e.type_, e.from_port, e.to_port), (0, 0, 0));
    }

    #[test]
    fn flag_stores_are_fenced_32_bit_writes() {
        let op = write_value_op(0x4000, 0xFFFF_FFFF);
        // SAFETY: `write_value_op` sets the write member.
        let w = unsafe { op.writeValue };
        assert_eq!(
            w.operation,
            sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32
        );
        assert_eq!(w.address, 0x4000);
        // SAFETY: a 32-bit write sets `value`.
        assert_eq!(unsafe { w.__bindgen_anon_1.value }, 0xFFFF_FFFF);
        // The default: the fence before the write stays.
        assert_eq!(w.flags, 0);
    }

    #[test]
    fn copies_are_one_row_of_bytes() {
        let p = memcpy_params(0x2000, 0x1000, 96);
        assert_eq!((p.WidthInBytes, p.Height, p.Depth), (96, 1, 1));
        assert_eq!((p.srcDevice, p.dstDevice), (0x1000, 0x2000));
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
    }
}
