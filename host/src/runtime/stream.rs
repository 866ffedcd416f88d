//! Streams, timing events and CUDA graphs, on top of cudarc's `CudaStream` / `CudaEvent` /
//! `CudaGraph`.
//!
//! cudarc covers stream creation, events and stream capture; what it lacks is a timing event
//! constructor that hides the `sys` flag and a way to read a captured graph's topology. The
//! latter uses `cuGraphGetNodes` and `cuGraphGetEdges` with edge data (CUDA 12.3+; loaded as
//! `cuGraphGetEdges_v2`), which is how one checks that a PDL launch became a *programmatic*
//! edge (`type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`, `from_port =
//! CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC`) rather than a full dependency.

use super::device::Gpu;
use super::error::{Result, RuntimeError};
use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, sys};
use std::sync::Arc;

/// An event that records timestamps (`cuEventCreate` with `CU_EVENT_DEFAULT`; cudarc's
/// default is `CU_EVENT_DISABLE_TIMING`).
pub fn timing_event(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(RuntimeError::driver("cuEventCreate"))
}

/// Records `event` at the current end of `stream` (`cuEventRecord`).
pub fn record(event: &CudaEvent, stream: &CudaStream) -> Result<()> {
    event
        .record(stream)
        .map_err(RuntimeError::driver("cuEventRecord"))
}

/// Milliseconds between two recorded timing events, waiting for both (`cuEventElapsedTime`).
pub fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
    start
        .elapsed_ms(end)
        .map_err(RuntimeError::driver("cuEventElapsedTime"))
}

/// Waits for all work on `stream` (`cuStreamSynchronize`).
pub fn synchronize(stream: &CudaStream) -> Result<()> {
    stream
        .synchronize()
        .map_err(RuntimeError::driver("cuStreamSynchronize"))
}

/// Captures what `enqueue` puts on `stream` into an instantiated graph
/// (`cuStreamBeginCapture` in thread-local mode, `cuStreamEndCapture`,
/// `cuGraphInstantiateWithFlags`). Capture is always ended, also when `enqueue` fails, so the
/// stream stays usable; `enqueue`'s error is returned then.
pub fn capture_graph<F>(stream: &Arc<CudaStream>, enqueue: F) -> Result<CudaGraph>
where
    F: FnOnce(&Arc<CudaStream>) -> Result<()>,
{
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(RuntimeError::driver("cuStreamBeginCapture"))?;
    let enqueued = enqueue(stream);
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    enqueued?;
    ended
        .map_err(RuntimeError::driver(
            "cuStreamEndCapture/cuGraphInstantiate",
        ))?
        .ok_or_else(|| RuntimeError::Graph("stream capture produced no graph".into()))
}

/// Launches an instantiated graph on the stream it was captured from (`cuGraphLaunch`).
pub fn launch_graph(graph: &CudaGraph) -> Result<()> {
    graph
        .launch()
        .map_err(RuntimeError::driver("cuGraphLaunch"))
}

/// The kind of a graph dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependencyKind {
    /// Full dependency: the downstream node starts after the upstream one completes.
    Default,
    /// Programmatic dependency (PDL): the downstream kernel may start early.
    Programmatic,
    /// A type this version does not know.
    Other(u8),
}

/// `CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC`: the out-port a PDL edge leaves from.
pub const PORT_PROGRAMMATIC: u8 = 1;

/// One edge of a graph; `from`/`to` index [`GraphTopology::node_count`] nodes in
/// `cuGraphGetNodes` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphEdge {
    /// Upstream node index.
    pub from: usize,
    /// Downstream node index.
    pub to: usize,
    /// Dependency type.
    pub kind: DependencyKind,
    /// Out-port of the upstream node (0 default, 1 programmatic, 2 launch order).
    pub from_port: u8,
    /// In-port of the downstream node (always 0 today).
    pub to_port: u8,
}

/// Nodes and edges of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphTopology {
    /// Number of nodes.
    pub node_count: usize,
    /// Every edge with its data.
    pub edges: Vec<GraphEdge>,
}

/// Reads the topology of a captured graph (`cuGraphGetNodes`, `cuGraphGetEdges` with edge
/// data; each called once for the count and once for the contents).
pub fn graph_topology(graph: &CudaGraph) -> Result<GraphTopology> {
    topology_of(graph.cu_graph()).map(|(_, topology)| topology)
}

/// [`graph_topology`] of a raw graph handle, with the node handles in the order the indices of
/// the returned edges refer to (`cuGraphGetNodes` order).
pub(super) fn topology_of(raw: sys::CUgraph) -> Result<(Vec<sys::CUgraphNode>, GraphTopology)> {
    let mut node_count = 0usize;
    // SAFETY: the graph is alive (borrowed); a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(raw, std::ptr::null_mut(), &mut node_count) }
        .result()
        .map_err(RuntimeError::driver("cuGraphGetNodes"))?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); node_count];
    // SAFETY: `nodes` has room for `node_count` handles.
    unsafe { sys::cuGraphGetNodes(raw, nodes.as_mut_ptr(), &mut node_count) }
        .result()
        .map_err(RuntimeError::driver("cuGraphGetNodes"))?;
    nodes.truncate(node_count);

    let mut edge_count = 0usize;
    // SAFETY: null arrays ask for the count only.
    unsafe {
        sys::cuGraphGetEdges_v2(
            raw,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut edge_count,
        )
    }
    .result()
    .map_err(RuntimeError::driver("cuGraphGetEdges"))?;
    let mut from = vec![std::ptr::null_mut(); edge_count];
    let mut to = vec![std::ptr::null_mut(); edge_count];
    let empty = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    let mut data = vec![empty; edge_count];
    // SAFETY: all three arrays have room for `edge_count` entries.
    unsafe {
        sys::cuGraphGetEdges_v2(
            raw,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut edge_count,
        )
    }
    .result()
    .map_err(RuntimeError::driver("cuGraphGetEdges"))?;

    let index_of = |node: sys::CUgraphNode| {
        nodes.iter().position(|&n| n == node).ok_or_else(|| {
            RuntimeError::Graph("cuGraphGetEdges returned a node cuGraphGetNodes did not".into())
        })
    };
    let edges = (0..edge_count.min(from.len()))
        .map(|i| {
            let d = data[i];
            Ok(GraphEdge {
                from: index_of(from[i])?,
                to: index_of(to[i])?,
                kind: match d.type_ {
                    0 => DependencyKind::Default,
                    1 => DependencyKind::Programmatic,
                    other => DependencyKind::Other(other),
                },
                from_port: d.from_port,
                to_port: d.to_port,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let topology = GraphTopology {
        node_count: nodes.len(),
        edges,
    };
    Ok((nodes, topology))
}
