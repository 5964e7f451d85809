//! Capture and graphs: `cuStreamBeginCapture`, `cuStreamEndCapture`, instantiation, launches.

use std::ffi::c_uint;
use std::ptr;

use crate::sys::{self, CUgraph, CUgraphExec};
use gpumem_core::{CaptureMode, CaptureStatus, DeviceId, Error, GraphOps, Result};

use crate::device::make_current;
use crate::legacy;
use crate::result::{self, check, code, BACKEND, SUCCESS};
use crate::stream::CudaStream;
use crate::Cuda;

/// An instantiated graph: the captured `CUgraph` and its executable `CUgraphExec`, both owned
/// and destroyed together by [`GraphOps::graph_destroy`](gpumem_core::GraphOps::graph_destroy).
/// It is the [`Api::Graph`](gpumem_core::Api::Graph) of [`Cuda`](crate::Cuda).
#[derive(Debug)]
pub struct CudaGraph {
    graph: CUgraph,
    exec: CUgraphExec,
}

// SAFETY: the handles name driver objects that Rust never dereferences. The driver serialises
// its own use of them; launching and uploading from several threads at once is allowed by CUDA
// (launches of one executable graph are ordered by the streams they go to), and destroying takes
// the value by move, so it happens once, after every borrow.
unsafe impl Send for CudaGraph {}
// SAFETY: as for `Send`: `&CudaGraph` only allows launches, uploads and DOT dumps (which read
// the graph).
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// The captured graph (`CUgraph`), for inspection with the driver (`cuGraphDebugDotPrint`).
    #[must_use]
    pub fn graph(&self) -> CUgraph {
        self.graph
    }

    /// The executable graph (`CUgraphExec`).
    #[must_use]
    pub fn exec(&self) -> CUgraphExec {
        self.exec
    }
}

impl GraphOps for Cuda {
    /// Starts capturing the stream's work (`cuStreamBeginCapture`) in `mode`.
    ///
    /// # Errors
    ///
    /// The driver's error (the legacy stream cannot capture, nor can a stream already capturing).
    unsafe fn begin_capture(dev: DeviceId, stream: CudaStream, mode: CaptureMode) -> Result<()> {
        make_current(dev)?;
        let mode = match mode {
            CaptureMode::Global => sys::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => sys::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // A blocking stream's capture is registered against legacy-stream work first (see the
        // `legacy` module: the driver may crash on their meeting).
        // A stream that already captures (it joined a capture) is left to the driver, which
        // refuses the begin; asking it for its flags would invalidate that capture.
        let mut status: c_uint = 0;
        // SAFETY: a context is current; the handle is live; `status` has the size and alignment of
        // the C enum the driver writes.
        let idle = code(unsafe { sys::cuStreamIsCapturing(stream.0, &mut status) }) == SUCCESS && status == 0;
        let blocking = idle
            && (stream == CudaStream::PER_THREAD || {
                let mut flags: c_uint = 0;
                // SAFETY: a context is current; the handle is live; `flags` is a valid out-pointer.
                let r = unsafe { sys::cuStreamGetFlags(stream.0, &mut flags) };
                code(r) != SUCCESS || flags & sys::CU_STREAM_NON_BLOCKING == 0
            });
        legacy::begin_capture(dev, stream, blocking, || {
            // SAFETY: a context is current; the handle is live; `mode` is one of
            // `CUstreamCaptureMode`'s values.
            check("cuStreamBeginCapture_v2", unsafe { sys::cuStreamBeginCapture_v2(stream.0, mode) })
        })
    }

    /// Ends the capture (`cuStreamEndCapture`) and instantiates the graph
    /// (`cuGraphInstantiateWithFlags` with flags 0, as CuPy does on CUDA 12).
    ///
    /// # Errors
    ///
    /// The driver's error: not capturing, capture invalidated, unjoined work, or a failed
    /// instantiation (the captured graph is then destroyed).
    unsafe fn end_capture(dev: DeviceId, stream: CudaStream) -> Result<CudaGraph> {
        make_current(dev)?;
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: a context is current; the handle is live; `graph` is a valid out-pointer.
        let r = unsafe { sys::cuStreamEndCapture(stream.0, &mut graph) };
        // Over, unless this stream only joined the capture (then it never registered).
        legacy::ended(dev, stream);
        if code(r) != SUCCESS {
            if !graph.is_null() {
                // SAFETY: a graph the driver handed out despite the error is ours to destroy, once.
                let _ = unsafe { sys::cuGraphDestroy(graph) };
            }
            return Err(result::error("cuStreamEndCapture", r));
        }
        let mut exec: CUgraphExec = ptr::null_mut();
        // SAFETY: `graph` is the graph just captured; `exec` is a valid out-pointer; flags 0.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if code(r) != SUCCESS {
            // SAFETY: the graph is ours and nothing else refers to it; destroyed once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(result::error("cuGraphInstantiateWithFlags", r));
        }
        Ok(CudaGraph { graph, exec })
    }

    /// The stream's capture status (`cuStreamIsCapturing`).
    ///
    /// # Errors
    ///
    /// The driver's error, for instance `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for the legacy stream
    /// while a blocking stream captures.
    unsafe fn capture_status(dev: DeviceId, stream: CudaStream) -> Result<CaptureStatus> {
        make_current(dev)?;
        // The driver writes a C enum (an `unsigned int`): read it as that integer.
        let mut status: c_uint = 0;
        // SAFETY: a context is current; the handle is live; `status` has the size and alignment of
        // the C enum the driver writes.
        let r = unsafe { sys::cuStreamIsCapturing(stream.0, &mut status) };
        check("cuStreamIsCapturing", r)?;
        match status {
            0 => Ok(CaptureStatus::None),
            1 => Ok(CaptureStatus::Active),
            2 => Ok(CaptureStatus::Invalidated),
            other => Err(Error::backend(
                BACKEND,
                "cuStreamIsCapturing",
                i64::from(other),
                "CU_STREAM_CAPTURE_STATUS_UNKNOWN",
                format!("the driver reported capture status {other}, which this backend does not know"),
            )),
        }
    }

    /// The capture's id (`cuStreamGetCaptureInfo_v2`, in every driver from CUDA 11.3 on).
    ///
    /// # Errors
    ///
    /// The driver's error, as for [`capture_status`](Self::capture_status).
    unsafe fn capture_id(dev: DeviceId, stream: CudaStream) -> Result<Option<u64>> {
        make_current(dev)?;
        let mut status: c_uint = 0;
        let mut id: u64 = 0;
        // SAFETY: a context is current; the handle is live; `status` has the size and alignment
        // of the C enum the driver writes, `id` of its `cuuint64_t`; the other outputs are
        // optional and not asked for (null).
        let r = unsafe {
            sys::cuStreamGetCaptureInfo_v2(
                stream.0,
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        check("cuStreamGetCaptureInfo_v2", r)?;
        Ok((status != 0).then_some(id))
    }

    /// Launches the graph on the stream.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn graph_launch(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        let _legacy = legacy::enter("cuGraphLaunch", dev, stream)?;
        // SAFETY: a context is current; the executable graph is live while borrowed; the stream
        // handle is live.
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(graph.exec, stream.0) })
    }

    /// Uploads the graph's resources ahead of its first launch, ordered on the stream.
    ///
    /// # Errors
    ///
    /// The driver's error.
    unsafe fn graph_upload(dev: DeviceId, graph: &CudaGraph, stream: CudaStream) -> Result<()> {
        make_current(dev)?;
        // SAFETY: as for `graph_launch`.
        check("cuGraphUpload", unsafe { sys::cuGraphUpload(graph.exec, stream.0) })
    }

    /// The captured graph as DOT text: `cuGraphDebugDotPrint` writes it to a file of its own in
    /// the temporary directory, which is read and removed (as CuPy's `debug_dot_str`).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the temporary directory's path is not UTF-8 or holds a NUL; the
    /// driver's error; an I/O error reading the file, as `InvalidArgument` with its text.
    fn graph_debug_dot(dev: DeviceId, graph: &CudaGraph, flags: u32) -> Result<String> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        make_current(dev)?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("gpumem-graph-{}-{n}.dot", std::process::id()));
        let c_path = path.to_str().and_then(|p| std::ffi::CString::new(p).ok()).ok_or_else(|| {
            Error::InvalidArgument(format!("temporary file path {} is not usable", path.display()))
        })?;
        // SAFETY: the graph is live (borrowed); `c_path` is a NUL-terminated path that outlives
        // the call; the driver only writes the file it names.
        let printed = check("cuGraphDebugDotPrint", unsafe {
            sys::cuGraphDebugDotPrint(graph.graph, c_path.as_ptr(), flags as c_uint)
        });
        let text = printed.and_then(|()| {
            std::fs::read_to_string(&path)
                .map_err(|e| Error::InvalidArgument(format!("reading {}: {e}", path.display())))
        });
        // The file is ours; a failed removal leaves a file in the temporary directory, nothing more.
        let _ = std::fs::remove_file(&path);
        text
    }

    /// Destroys the executable graph and the graph; launches already queued still run.
    ///
    /// # Errors
    ///
    /// The first of the driver's errors; both are destroyed regardless.
    fn graph_destroy(dev: DeviceId, graph: CudaGraph) -> Result<()> {
        // The handles carry their context: destroy them even if it could not be made current (the
        // driver is loaded, since the graph exists).
        let current = make_current(dev).map(drop);
        // SAFETY: the executable graph is ours, taken by value, destroyed once.
        let exec = check("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(graph.exec) });
        // SAFETY: as above, for the graph; the executable form no longer refers to it.
        let captured = check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph.graph) });
        current.and(exec).and(captured)
    }
}
