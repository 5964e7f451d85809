//! Capture and graphs: a capturing worker records its operations instead of running them (into
//! the capture it takes part in: see [`capture`](super::capture)); the graph replays them in
//! order on every launch.

use std::sync::Arc;

use crate::error::Result;
use crate::hal::{CaptureMode, CaptureStatus, DeviceId, GraphOps};

use super::result::{err, Code};
use super::worker::{implicit_capture, Op};
use super::{enqueue, target, Host, HostStream, Target};

/// A captured graph of host operations, with the API name each was queued under.
#[derive(Clone)]
pub struct HostGraph(Arc<Vec<Op>>, Arc<[&'static str]>);

impl std::fmt::Debug for HostGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostGraph({} operations)", self.0.len())
    }
}

/// The graph as DOT: one node per recorded operation, labelled with its index and API name,
/// each depending on the one before (a captured stream runs them in order).
fn dot(names: &[&'static str]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("digraph \"gpumem host graph\" {\n    rankdir=TB;\n    node [shape=box];\n");
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(out, "    op{i} [label=\"{i}: {name}\"];");
    }
    for i in 1..names.len() {
        let _ = writeln!(out, "    op{} -> op{i};", i - 1);
    }
    out.push_str("}\n");
    out
}

impl GraphOps for Host {
    unsafe fn begin_capture(dev: DeviceId, stream: HostStream, mode: CaptureMode) -> Result<()> {
        match target("cuStreamBeginCapture", dev, stream)? {
            Target::Legacy => Err(err("cuStreamBeginCapture", Code::StreamCaptureUnsupported, None)),
            Target::Worker(w) => w.begin_capture(mode),
        }
    }
    unsafe fn end_capture(dev: DeviceId, stream: HostStream) -> Result<HostGraph> {
        match target("cuStreamEndCapture", dev, stream)? {
            Target::Legacy => Err(err("cuStreamEndCapture", Code::IllegalState, None)),
            Target::Worker(w) => {
                let (ops, names) = w.end_capture()?;
                Ok(HostGraph(Arc::new(ops), names.into()))
            }
        }
    }
    unsafe fn capture_status(dev: DeviceId, stream: HostStream) -> Result<CaptureStatus> {
        match target("cuStreamGetCaptureInfo", dev, stream)? {
            // As CUDA: an error while a blocking stream captures, which that capture survives.
            Target::Legacy => implicit_capture(dev, "cuStreamGetCaptureInfo").map(|()| CaptureStatus::None),
            Target::Worker(w) => Ok(w.capture_status()),
        }
    }
    unsafe fn capture_id(dev: DeviceId, stream: HostStream) -> Result<Option<u64>> {
        match target("cuStreamGetCaptureInfo", dev, stream)? {
            Target::Legacy => implicit_capture(dev, "cuStreamGetCaptureInfo").map(|()| None),
            Target::Worker(w) => Ok(w.capture_id()),
        }
    }
    unsafe fn graph_launch(dev: DeviceId, graph: &HostGraph, stream: HostStream) -> Result<()> {
        let ops = Arc::clone(&graph.0);
        enqueue("cuGraphLaunch", dev, stream, Arc::new(move || ops.iter().for_each(|op| op())))
    }
    unsafe fn graph_upload(dev: DeviceId, _graph: &HostGraph, stream: HostStream) -> Result<()> {
        target("cuGraphUpload", dev, stream).map(drop)
    }
    fn graph_debug_dot(_dev: DeviceId, graph: &HostGraph, _flags: u32) -> Result<String> {
        Ok(dot(&graph.1))
    }
    fn graph_destroy(_dev: DeviceId, graph: HostGraph) -> Result<()> {
        drop(graph);
        Ok(())
    }
}
