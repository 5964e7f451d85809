//! Capture and graphs: not offered by this backend. Every operation returns
//! `Error::Unsupported` without calling the runtime, and [`HipGraph`] has no values.

use gpumem_core::{CaptureMode, CaptureStatus, DeviceId, GraphOps, Result};

use crate::result;
use crate::stream::HipStream;
use crate::Hip;

/// An instantiated graph: the [`Api::Graph`](gpumem_core::Api::Graph) of
/// [`Hip`](crate::Hip), a type without values.
///
/// Differs from the CUDA backend: this backend offers no capture (see the
/// [crate docs](crate#what-hip-52-lacks-and-what-this-backend-does-instead)), so
/// `Backend::end_capture` never returns a graph and the graph operations can never be reached
/// with one; the compiler knows it.
#[derive(Debug)]
pub enum HipGraph {}

impl GraphOps for Hip {
    /// `Unsupported`, without calling the runtime: this backend offers no capture (see the
    /// module docs).
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "begin_capture", backend: "hip" }`.
    unsafe fn begin_capture(_dev: DeviceId, _stream: HipStream, _mode: CaptureMode) -> Result<()> {
        Err(result::unsupported("begin_capture"))
    }

    /// `Unsupported`, without calling the runtime: this backend offers no capture.
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "end_capture", backend: "hip" }`.
    unsafe fn end_capture(_dev: DeviceId, _stream: HipStream) -> Result<HipGraph> {
        Err(result::unsupported("end_capture"))
    }

    /// `Unsupported`, without calling the runtime: this backend offers no capture. The typed layer
    /// reads this answer as "not capturing" where it checks before a transfer, as CuPy skips those
    /// checks on HIP.
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "capture_status", backend: "hip" }`.
    unsafe fn capture_status(_dev: DeviceId, _stream: HipStream) -> Result<CaptureStatus> {
        Err(result::unsupported("capture_status"))
    }

    /// `Unsupported`; never reached, since no [`HipGraph`] exists.
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "graph_launch", backend: "hip" }`.
    unsafe fn graph_launch(_dev: DeviceId, _graph: &HipGraph, _stream: HipStream) -> Result<()> {
        Err(result::unsupported("graph_launch"))
    }

    /// `Unsupported`; never reached, since no [`HipGraph`] exists.
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "graph_upload", backend: "hip" }`.
    unsafe fn graph_upload(_dev: DeviceId, _graph: &HipGraph, _stream: HipStream) -> Result<()> {
        Err(result::unsupported("graph_upload"))
    }

    /// `Unsupported`; never reached, since no [`HipGraph`] exists (HIP 5.2's headers and
    /// `libamdhip64.so.5.2` have no `hipGraphDebugDotPrint` either).
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "graph_debug_dot", backend: "hip" }`.
    fn graph_debug_dot(_dev: DeviceId, _graph: &HipGraph, _flags: u32) -> Result<String> {
        Err(result::unsupported("graph_debug_dot"))
    }

    /// `Unsupported`; never reached, since no [`HipGraph`] exists.
    ///
    /// # Errors
    ///
    /// Always `Error::Unsupported { operation: "graph_destroy", backend: "hip" }`.
    fn graph_destroy(_dev: DeviceId, _graph: HipGraph) -> Result<()> {
        Err(result::unsupported("graph_destroy"))
    }
}
