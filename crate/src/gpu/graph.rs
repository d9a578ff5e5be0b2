//! A CUDA graph: a loop's GPU work captured once ([`super::Runner`]
//! in capture mode records its loop instead of running it) and made
//! executable, so one call launches all of it. What lab 5 weighs against
//! issuing the same loop op by op.

use super::{driver, Gpu, Stream};
use crate::error::Result;

/// An executable graph and the graph it was made from.
pub struct Graph {
    graph: driver::CUgraph,
    exec: driver::CUgraphExec,
    /// Each node's type, as the driver numbers it.
    node_types: Vec<driver::GraphNodeType>,
    instantiate_ms: f64,
    gpu: Gpu,
}

impl Graph {
    /// Makes captured graph `graph` executable; the result owns it.
    ///
    /// # Safety
    /// `graph` is a live graph of `gpu`'s context that nothing else owns.
    pub(crate) unsafe fn instantiate(gpu: &Gpu, graph: driver::CUgraph) -> Result<Graph> {
        let started = std::time::Instant::now();
        // SAFETY: `graph` is live (the caller's promise).
        let made = unsafe { driver::graph_node_types(graph) }.and_then(|node_types| {
            // SAFETY: `graph` is still live and owned here; the executable
            // graph made from it is owned by the `Graph` returned.
            unsafe { driver::graph_instantiate(graph) }.map(|exec| (node_types, exec))
        });
        match made {
            Ok((node_types, exec)) => Ok(Graph { graph, exec, node_types, instantiate_ms: started.elapsed().as_secs_f64() * 1e3, gpu: gpu.clone() }),
            Err(e) => {
                // SAFETY: owned here and never instantiated.
                let _ = unsafe { driver::graph_destroy(graph) };
                Err(e)
            }
        }
    }

    /// How many nodes it holds (copies, kernels and the event edges' joins).
    pub fn nodes(&self) -> usize {
        self.node_types.len()
    }

    /// How many of its nodes allocate or free memory when the graph runs
    /// (a stream-ordered allocation captured into it, cuBLAS's among
    /// them when it is not given a workspace): 0 for a graph whose every
    /// launch uses only memory made before it.
    pub fn memory_nodes(&self) -> usize {
        self.node_types.iter().filter(|&&t| t == driver::GRAPH_NODE_MEM_ALLOC || t == driver::GRAPH_NODE_MEM_FREE).count()
    }

    /// Host time cuGraphInstantiate took, ms.
    pub fn instantiate_ms(&self) -> f64 {
        self.instantiate_ms
    }

    /// Launches the whole graph on `s` (one cuGraphLaunch).
    ///
    /// # Safety
    /// Every buffer the captured work touches is alive until the launch has
    /// completed on `s`, and nothing else uses them meanwhile.
    pub unsafe fn launch(&self, s: &Stream) -> Result<()> {
        // SAFETY: both handles are live (owned by `self` and `s`); the
        // buffers are the caller's promise (# Safety).
        unsafe { driver::graph_launch(self.exec, s.raw()) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: owned by `self` and destroyed only here (a launch still
        // running completes first: the driver frees the graph after it).
        let _ = unsafe { driver::graph_exec_destroy(self.exec) };
        // SAFETY: owned by `self`, destroyed only here; the executable graph
        // made from it keeps its own copy.
        let _ = unsafe { driver::graph_destroy(self.graph) };
    }
}
