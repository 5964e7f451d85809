//! Stream capture and graphs.

use crate::error::Result;
use crate::hal::types::{CaptureMode, CaptureStatus, DeviceId};
use crate::hal::Api;

/// Capture and graph operations. See the [contract](crate::hal).
pub trait GraphOps: Api {
    /// Starts capturing the work queued on `stream` into a graph.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    unsafe fn begin_capture(dev: DeviceId, stream: Self::Stream, mode: CaptureMode) -> Result<()>;
    /// Ends the capture and instantiates the captured graph.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error (not capturing,
    /// invalidated, unjoined work).
    unsafe fn end_capture(dev: DeviceId, stream: Self::Stream) -> Result<Self::Graph>;
    /// The stream's capture status.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error (for instance an
    /// implicit-synchronisation conflict with a capturing blocking stream).
    unsafe fn capture_status(dev: DeviceId, stream: Self::Stream) -> Result<CaptureStatus>;
    /// The capture `stream` takes part in, as a number the stream that began it shares with every
    /// stream that joined it through an event; `None` when the stream does not capture. The
    /// default, for a backend that cannot tell captures apart, answers `None`: the typed layer
    /// then holds what a joined stream's work touches for good, instead of handing it to the
    /// graph.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// The runtime's error, as for [`GraphOps::capture_status`].
    unsafe fn capture_id(dev: DeviceId, stream: Self::Stream) -> Result<Option<u64>> {
        let _ = (dev, stream);
        Ok(None)
    }
    /// Launches the graph on `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    unsafe fn graph_launch(dev: DeviceId, graph: &Self::Graph, stream: Self::Stream) -> Result<()>;
    /// Uploads the graph's resources to the device ahead of its first launch, ordered on
    /// `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is 0, 1, 2 or a live stream of this backend, not destroyed (see the
    /// [contract](crate::hal#safety)).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without capture; the runtime's error.
    unsafe fn graph_upload(dev: DeviceId, graph: &Self::Graph, stream: Self::Stream) -> Result<()>;
    /// The graph as Graphviz DOT text (`cuGraphDebugDotPrint`); `flags` are the runtime's
    /// `CUgraphDebugDot_flags` (0: the default detail).
    ///
    /// # Errors
    ///
    /// `Unsupported` on a backend without graphs or without a DOT dump; the runtime's error.
    fn graph_debug_dot(dev: DeviceId, graph: &Self::Graph, flags: u32) -> Result<String>;
    /// Destroys the graph. Launches already queued still run.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn graph_destroy(dev: DeviceId, graph: Self::Graph) -> Result<()>;
}
