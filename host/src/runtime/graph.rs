//! Explicitly built CUDA graphs: kernel, memcpy and memset nodes, dependencies with edge
//! data, instantiation, launch, and parameter updates of an instantiated graph.
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

    /// Adds a store of the 4-byte `value` at `dst` without dependencies
    /// (`cuGraphAddMemsetNode`, element size 4, one element).
    ///
    /// # Safety
    /// `dst` must be 4-byte-aligned device memory valid for as long as the graph may run.
    pub unsafe fn add_memset_u32_node(&mut self, dst: u64, value: u32) -> Result<GraphNode> {
        let params = sys::CUDA_MEMSET_NODE_PARAMS {
            dst,
            pitch: 4,
            value,
            elementSize: 4,
            width: 1,
            height: 1,
        };
        self.gpu.bind()?;
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `params` lives across the call.
        unsafe {
            sys::cuGraphAddMemsetNode(
                &mut node,
                self.raw,
                std::ptr::null(),
                0,
                &params,
                self.gpu.context().cu_ctx(),
            )
        }
        .result()
        .map_err(RuntimeError::driver("cuGraphAddMemsetNode"))?;
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
        self.gpu.bind()?;
        // SAFETY: the instance and the stream are alive.
        unsafe { sys::cuGraphLaunch(self.raw, stream.cu_stream()) }
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
    fn copies_are_one_row_of_bytes() {
        let p = memcpy_params(0x2000, 0x1000, 96);
        assert_eq!((p.WidthInBytes, p.Height, p.Depth), (96, 1, 1));
        assert_eq!((p.srcDevice, p.dstDevice), (0x1000, 0x2000));
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
    }
}
