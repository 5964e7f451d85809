//! Graphs: work captured from a stream, replayed with one launch.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::hal::DeviceId;
use crate::runtime::stream::inflight::{self, CaptureRecord};
use crate::runtime::stream::StreamRuntime;
use crate::runtime::stream::{self, Stream};

/// An instantiated graph, made by [`Stream::end_capture`]: CuPy's `cupy.cuda.Graph`. It cannot
/// be built any other way.
///
/// The graph owns what its captured work touches: the memory, pinned buffers and host functions
/// of the operations captured into it. Each launch keeps them alive until it is done, so a graph
/// may be dropped while replays are queued, and memory dropped by the program after capture is
/// not freed or lent again while the graph can still write it. Memory a capture allocates and
/// frees is held the same way, until the graph is dropped; gpumem does not lend it again within
/// the graph's replays (PyTorch's private graph pools do), which costs memory, not safety.
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::Stream;
///
/// let s = Stream::<Host>::non_blocking()?;
/// let p = gpumem_core::alloc::<Host>(256)?;
/// s.begin_capture(None)?;
/// p.memset_async(3, 256, Some(&s))?;
/// let graph = s.end_capture()?;
/// p.memset(0, 256)?;
/// graph.launch(Some(&s))?; // replays the memset
/// s.synchronize()?;
/// let mut back = [0u8; 256];
/// p.copy_to_host(&mut back, 256)?;
/// assert!(back.iter().all(|&b| b == 3));
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct Graph<B: StreamRuntime> {
    raw: Option<B::Graph>,
    device: DeviceId,
    /// What the captured work touches and calls: its memory, pinned buffers and host functions.
    /// Each launch keeps it alive until the launch is done, and a capture the graph is launched
    /// into keeps it for the outer graph, so dropping this graph never frees what a queued replay
    /// can reach.
    parts: Arc<GraphParts<B>>,
}

/// What a graph's work reaches, shared with its queued launches.
pub(crate) struct GraphParts<B: StreamRuntime> {
    record: CaptureRecord<B>,
}

impl<B: StreamRuntime> fmt::Debug for Graph<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device)
            .field("host_functions", &self.parts.record.host_fns.len())
            .field("kept", &self.parts.record.n_kept())
            .finish_non_exhaustive()
    }
}

impl<B: StreamRuntime> Graph<B> {
    pub(crate) fn new(raw: B::Graph, device: DeviceId, record: CaptureRecord<B>) -> Self {
        Graph { raw: Some(raw), device, parts: Arc::new(GraphParts { record }) }
    }

    fn raw(&self) -> &B::Graph {
        self.raw.as_ref().unwrap_or_else(|| unreachable!("the graph handle is present until drop"))
    }

    /// The device the graph was captured on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.device
    }

    /// Launches the graph on `stream`, or on the current stream for `None`. The launch keeps the
    /// graph's memory and host functions alive until it is done.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without graphs; the runtime's error.
    pub fn launch(&self, stream: Option<&Stream<B>>) -> Result<()> {
        let target = stream::target::<B>(stream);
        let ranges = &self.parts.record.ranges;
        // The launch waits for the work queued with no event on the graph's memory: on the streams
        // whose order covers its reuse, and on the other streams noted on it since the capture.
        // SAFETY: the handle `target` gave is live for this call.
        let (queueing, _) = unsafe { inflight::begin(target, ranges, || self.parts.record.orders()) }?;
        // SAFETY: as above.
        unsafe { B::graph_launch(target.device, self.raw(), target.handle) }?;
        queueing.keep([inflight::Keep::Other(Arc::clone(&self.parts) as Arc<dyn Any + Send + Sync>)], ranges)
    }

    /// The graph as Graphviz DOT text (CuPy's `debug_dot_str(flags=0)`): on CUDA the driver's
    /// `cuGraphDebugDotPrint` with `flags` (`CUgraphDebugDot_flags`; 0 for the default detail),
    /// on the host backend one node per captured operation, in replay order.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without a DOT dump; the runtime's error.
    pub fn debug_dot_str(&self, flags: u32) -> Result<String> {
        B::graph_debug_dot(self.device, self.raw(), flags)
    }

    /// Uploads the graph to the device ahead of its first launch, ordered on `stream` (or the
    /// current stream).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without graphs; the runtime's error.
    pub fn upload(&self, stream: Option<&Stream<B>>) -> Result<()> {
        let (handle, dev, _) = stream::resolve::<B>(stream);
        // SAFETY: the handle `resolve` gave is live for this call.
        unsafe { B::graph_upload(dev, self.raw(), handle) }
    }
}

impl<B: StreamRuntime> Drop for Graph<B> {
    fn drop(&mut self) {
        // Launches already queued still run after the destroy (the contract), and each keeps the
        // graph's parts alive until it is done: nothing here waits.
        if let Some(raw) = self.raw.take() {
            let device = self.device;
            crate::runtime::state::drop_outside_callbacks::<B>(move || {
                if let Err(e) = B::graph_destroy(device, raw) {
                    crate::runtime::state::record_drop_error::<B>(e);
                }
            });
        }
    }
}
