//! Graphs: work captured from a stream, replayed with one launch.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::hal::{DeviceId, EventFlags};
use crate::runtime::state::Runtime;
use crate::runtime::stream::callback::HostFnData;
use crate::runtime::stream::event::Event;
use crate::runtime::stream::{self, Stream};

/// An instantiated graph, made by [`Stream::end_capture`]: CuPy's `cupy.cuda.Graph`. It cannot
/// be built any other way.
///
/// The graph owns the host functions captured into it. While it has any, each launch records an
/// event behind itself, and dropping the graph waits for those events before it frees the
/// functions, so a replay still queued never calls freed data.
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
pub struct Graph<B: Runtime> {
    raw: Option<B::Graph>,
    device: DeviceId,
    host_fns: Vec<Arc<HostFnData>>,
    /// One event per stream the graph was launched on, recorded behind the last launch there.
    launches: Mutex<Vec<(usize, Event<B>)>>,
}

impl<B: Runtime> fmt::Debug for Graph<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device)
            .field("host_functions", &self.host_fns.len())
            .finish_non_exhaustive()
    }
}

impl<B: Runtime> Graph<B> {
    pub(crate) fn new(raw: B::Graph, device: DeviceId, host_fns: Vec<Arc<HostFnData>>) -> Self {
        Graph { raw: Some(raw), device, host_fns, launches: Mutex::new(Vec::new()) }
    }

    fn raw(&self) -> &B::Graph {
        self.raw.as_ref().expect("graph handle is present until drop")
    }

    /// The device the graph was captured on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.device
    }

    /// Launches the graph on `stream`, or on the current stream for `None`.
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without graphs; the runtime's error.
    pub fn launch(&self, stream: Option<&Stream<B>>) -> Result<()> {
        let (handle, dev, ptr) = stream::resolve::<B>(stream);
        // SAFETY: the handle `resolve` gave is live for this call (the stream given, or the
        // thread's current stream, which its state holds).
        unsafe { B::graph_launch(dev, self.raw(), handle) }?;
        if !self.host_fns.is_empty() {
            let mut launches = self.launches.lock();
            let event = match launches.iter().find(|(s, _)| *s == ptr) {
                Some((_, e)) => e.clone(),
                None => {
                    let e = Event::with_flags(EventFlags { disable_timing: true, ..EventFlags::default() })?;
                    launches.push((ptr, e.clone()));
                    e
                }
            };
            // SAFETY: as for the launch above.
            unsafe { B::event_record(dev, event.raw(), handle) }?;
        }
        Ok(())
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

impl<B: Runtime> Drop for Graph<B> {
    fn drop(&mut self) {
        for (_, event) in self.launches.get_mut().drain(..) {
            // Replays still queued may call the host functions: wait for them first. A failed
            // wait (device lost) leaves nothing better to do than go on.
            let _ = event.synchronize();
        }
        if let Some(raw) = self.raw.take() {
            let _ = B::graph_destroy(self.device, raw);
        }
    }
}
