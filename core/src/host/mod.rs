//! The host backend: gpumem on the CPU alone, for programs and tests on machines without a GPU,
//! and the reference the GPU backends are compared with.
//!
//! - Devices: `GPUMEM_HOST_DEVICES` simulated devices (default 2), each with
//!   `GPUMEM_HOST_DEVICE_MEMORY` bytes (default 16 GiB). Device memory is zeroed host memory,
//!   512-byte aligned; every device can reach every other's.
//! - Streams: each stream is a worker thread running its queue in order. The per-thread default
//!   stream is a worker per host thread. The null and legacy streams run their work on the
//!   caller's thread after the device's blocking streams have drained.
//! - Events complete when their stream reaches them; timing uses the host clock.
//! - Capture records a stream's operations; the graph replays them in order. Host functions
//!   captured once run on every replay.
//! - Freeing device memory waits for all streams, as `cudaFree` does; the stream-ordered
//!   allocator frees when the stream reaches the free.
//! - Errors carry CUDA's numeric codes under host names (`HOST_ERROR_...`).
//!
//! Host functions and callbacks may not synchronise their own stream (an error, where CUDA forbids
//! any runtime call in a callback).

#![allow(unsafe_code)]

mod code;
mod event;
mod memory;
mod worker;

use std::ffi::c_void;
use std::sync::Arc;

use crate::backend::{
    Backend, CaptureMode, CaptureStatus, DeviceId, DeviceProperties, DevicePtr, EventFlags, HostFn, MemInfo,
    StreamCallback, StreamFlags,
};
use crate::error::Result;

use code::{err, Code};
pub use event::HostEvent;
use worker::{drain_device, join_legacy, refuse_implicit_capture, Op, Worker};

/// The host backend. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Host;

/// A host stream handle: 0 (null), 1 (legacy), 2 (per-thread default) or the address of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostStream(usize);

/// A captured graph of host operations.
#[derive(Clone)]
pub struct HostGraph(Arc<Vec<Op>>);

impl std::fmt::Debug for HostGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostGraph({} operations)", self.0.len())
    }
}

const PRIORITY_RANGE: (i32, i32) = (0, -5);

enum Target {
    Legacy,
    Worker(Arc<Worker>),
}

thread_local! {
    /// The calling thread's per-thread default stream of each device, started on first use; each
    /// finishes its queue and exits when the thread does.
    static PER_THREAD: std::cell::RefCell<Vec<Option<PerThread>>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct PerThread(Arc<Worker>);

impl Drop for PerThread {
    fn drop(&mut self) {
        self.0.shut_down();
    }
}

fn per_thread_worker(api: &'static str, dev: DeviceId) -> Result<Arc<Worker>> {
    let i = memory::check_device(api, dev)?;
    let fail = || err(api, Code::OutOfResources, Some("cannot start the per-thread default stream".into()));
    PER_THREAD
        .try_with(|cell| {
            let mut workers = cell.borrow_mut();
            if workers.len() <= i {
                workers.resize_with(i + 1, || None);
            }
            if workers[i].is_none() {
                workers[i] = Some(PerThread(Worker::spawn(dev, StreamFlags::default(), 0)?));
            }
            Ok(Arc::clone(&workers[i].as_ref().expect("just started").0))
        })
        .map_err(|_| fail())?
}

fn target(api: &'static str, dev: DeviceId, stream: HostStream) -> Result<Target> {
    match stream.0 {
        0 | 1 => Ok(Target::Legacy),
        2 => per_thread_worker(api, dev).map(Target::Worker),
        p => {
            let p = p as *const Worker;
            // SAFETY: a handle other than 0, 1, 2 came from `Arc::into_raw` in `stream_create`
            // and is live (the `Backend` contract: handles are not used after `stream_destroy`).
            // Incrementing first makes `from_raw` produce a new reference of our own.
            unsafe {
                Arc::increment_strong_count(p);
                Ok(Target::Worker(Arc::from_raw(p)))
            }
        }
    }
}

/// Runs `op` on `stream`: queued on a worker, or at once on the legacy stream.
fn enqueue(api: &'static str, dev: DeviceId, stream: HostStream, op: Op) -> Result<()> {
    match target(api, dev, stream)? {
        Target::Legacy => {
            join_legacy(dev, api)?;
            op();
            Ok(())
        }
        Target::Worker(w) => w.submit(api, op),
    }
}

impl Backend for Host {
    const NAME: &'static str = "host";
    type Stream = HostStream;
    type Event = Arc<HostEvent>;
    type Graph = HostGraph;

    crate::backend_statics!(Host);

    fn null_stream() -> HostStream {
        HostStream(0)
    }
    fn legacy_stream() -> HostStream {
        HostStream(1)
    }
    fn per_thread_stream() -> HostStream {
        HostStream(2)
    }
    fn stream_to_raw(stream: HostStream) -> usize {
        stream.0
    }
    unsafe fn stream_from_raw(raw: usize) -> HostStream {
        HostStream(raw)
    }

    fn device_count() -> Result<usize> {
        Ok(memory::device_count())
    }
    fn set_device(dev: DeviceId) -> Result<()> {
        memory::check_device("cuCtxSetCurrent", dev).map(drop)
    }
    fn device_properties(dev: DeviceId) -> Result<DeviceProperties> {
        memory::check_device("cuDeviceGetAttribute", dev)?;
        Ok(DeviceProperties {
            name: format!("gpumem host device {dev}"),
            total_memory: memory::capacity(),
            compute_capability: (0, 0),
            multiprocessor_count: std::thread::available_parallelism().map_or(1, |n| n.get() as i32),
            memory_pools_supported: true,
            unified_addressing: true,
        })
    }
    fn mem_get_info(dev: DeviceId) -> Result<MemInfo> {
        let i = memory::check_device("cuMemGetInfo", dev)?;
        let total = memory::capacity();
        Ok(MemInfo { free: total.saturating_sub(memory::used(i)), total })
    }
    fn device_synchronize(dev: DeviceId) -> Result<()> {
        memory::check_device("cuCtxSynchronize", dev)?;
        drain_device(Some(dev));
        Ok(())
    }
    fn can_access_peer(dev: DeviceId, peer: DeviceId) -> Result<bool> {
        memory::check_device("cuDeviceCanAccessPeer", dev)?;
        memory::check_device("cuDeviceCanAccessPeer", peer)?;
        Ok(dev != peer)
    }
    fn enable_peer_access(dev: DeviceId, peer: DeviceId) -> Result<()> {
        memory::check_device("cuCtxEnablePeerAccess", dev)?;
        memory::check_device("cuCtxEnablePeerAccess", peer).map(drop)
    }
    fn pointer_device(ptr: DevicePtr) -> Result<Option<DeviceId>> {
        Ok(memory::device_of(ptr))
    }

    fn malloc(dev: DeviceId, size: usize) -> Result<DevicePtr> {
        memory::allocate("cuMemAlloc", Some(dev), size)
    }
    unsafe fn free(dev: DeviceId, ptr: DevicePtr) -> Result<()> {
        // As cudaFree: wait for the device's work, which may still use the memory.
        drain_device(Some(dev));
        memory::release("cuMemFree", Some(dev), ptr)
    }
    fn malloc_host(_dev: DeviceId, size: usize) -> Result<*mut u8> {
        memory::allocate("cuMemHostAlloc", None, size).map(|p| p as *mut u8)
    }
    unsafe fn free_host(_dev: DeviceId, ptr: *mut u8) -> Result<()> {
        drain_device(None);
        memory::release("cuMemFreeHost", None, ptr as DevicePtr)
    }
    fn malloc_async(dev: DeviceId, size: usize, _stream: HostStream) -> Result<DevicePtr> {
        memory::allocate("cuMemAllocAsync", Some(dev), size)
    }
    unsafe fn free_async(dev: DeviceId, ptr: DevicePtr, stream: HostStream) -> Result<()> {
        enqueue(
            "cuMemFreeAsync",
            dev,
            stream,
            Arc::new(move || {
                // Ordered after the stream's earlier work, which is all that may use it.
                let _ = memory::release("cuMemFreeAsync", Some(dev), ptr);
            }),
        )
    }

    unsafe fn memcpy(dev: DeviceId, dst: DevicePtr, src: DevicePtr, n: usize) -> Result<()> {
        join_legacy(dev, "cuMemcpy")?;
        // SAFETY: the caller guarantees both ranges are valid and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        Ok(())
    }
    unsafe fn memcpy_async(
        dev: DeviceId,
        dst: DevicePtr,
        src: DevicePtr,
        n: usize,
        stream: HostStream,
    ) -> Result<()> {
        enqueue(
            "cuMemcpyAsync",
            dev,
            stream,
            Arc::new(move || {
                // SAFETY: the caller guarantees both ranges stay valid and disjoint until the
                // stream reaches this copy (and every replay of a graph that captured it).
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
            }),
        )
    }
    unsafe fn memset(dev: DeviceId, dst: DevicePtr, value: u8, n: usize) -> Result<()> {
        join_legacy(dev, "cuMemsetD8")?;
        // SAFETY: the caller guarantees the range is valid.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        Ok(())
    }
    unsafe fn memset_async(
        dev: DeviceId,
        dst: DevicePtr,
        value: u8,
        n: usize,
        stream: HostStream,
    ) -> Result<()> {
        enqueue(
            "cuMemsetD8Async",
            dev,
            stream,
            Arc::new(move || {
                // SAFETY: the caller guarantees the range stays valid until the stream reaches
                // this memset (and every replay).
                unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
            }),
        )
    }

    fn stream_priority_range(dev: DeviceId) -> Result<(i32, i32)> {
        memory::check_device("cuCtxGetStreamPriorityRange", dev)?;
        Ok(PRIORITY_RANGE)
    }
    fn stream_create(dev: DeviceId, flags: StreamFlags, priority: i32) -> Result<HostStream> {
        memory::check_device("cuStreamCreateWithPriority", dev)?;
        let worker = Worker::spawn(dev, flags, priority)?;
        Ok(HostStream(Arc::into_raw(worker) as usize))
    }
    unsafe fn stream_destroy(_dev: DeviceId, stream: HostStream) -> Result<()> {
        if stream.0 <= 2 {
            return Err(err("cuStreamDestroy", Code::InvalidHandle, None));
        }
        // SAFETY: the handle came from `Arc::into_raw` in `stream_create` and is destroyed once
        // (the contract), so this takes back the reference `stream_create` gave out.
        let worker = unsafe { Arc::from_raw(stream.0 as *const Worker) };
        worker.shut_down();
        Ok(())
    }
    fn stream_flags(dev: DeviceId, stream: HostStream) -> Result<StreamFlags> {
        match target("cuStreamGetFlags", dev, stream)? {
            Target::Legacy => Ok(StreamFlags::default()),
            Target::Worker(w) => Ok(w.flags),
        }
    }
    fn stream_priority(dev: DeviceId, stream: HostStream) -> Result<i32> {
        match target("cuStreamGetPriority", dev, stream)? {
            Target::Legacy => Ok(0),
            Target::Worker(w) => Ok(w.priority),
        }
    }
    fn stream_query(dev: DeviceId, stream: HostStream) -> Result<bool> {
        match target("cuStreamQuery", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuStreamQuery")?;
                Ok(true)
            }
            Target::Worker(w) => w.query(),
        }
    }
    fn stream_synchronize(dev: DeviceId, stream: HostStream) -> Result<()> {
        match target("cuStreamSynchronize", dev, stream)? {
            Target::Legacy => join_legacy(dev, "cuStreamSynchronize"),
            Target::Worker(w) => w.synchronize("cuStreamSynchronize"),
        }
    }
    fn stream_wait_event(dev: DeviceId, stream: HostStream, event: &Arc<HostEvent>) -> Result<()> {
        let generation = event.current_generation();
        if generation == 0 {
            return Ok(());
        }
        let event = Arc::clone(event);
        enqueue("cuStreamWaitEvent", dev, stream, Arc::new(move || event.wait_for(generation)))
    }
    unsafe fn launch_host_func(
        dev: DeviceId,
        stream: HostStream,
        func: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        // The address crosses to the worker thread as an integer; the caller keeps it valid.
        let data = data as usize;
        enqueue(
            "cuLaunchHostFunc",
            dev,
            stream,
            Arc::new(move || {
                // SAFETY: the caller guarantees `func` does not unwind and `data` is valid for
                // every call the stream (or a graph's replays) makes.
                unsafe { func(data as *mut c_void) }
            }),
        )
    }
    fn add_callback(dev: DeviceId, stream: HostStream, callback: StreamCallback) -> Result<()> {
        match target("cuStreamAddCallback", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuStreamAddCallback")?;
                callback(Ok(()));
                Ok(())
            }
            Target::Worker(w) => w.submit_once("cuStreamAddCallback", Box::new(move || callback(Ok(())))),
        }
    }

    fn begin_capture(dev: DeviceId, stream: HostStream, mode: CaptureMode) -> Result<()> {
        match target("cuStreamBeginCapture", dev, stream)? {
            Target::Legacy => Err(err("cuStreamBeginCapture", Code::StreamCaptureUnsupported, None)),
            Target::Worker(w) => w.begin_capture(mode),
        }
    }
    fn end_capture(dev: DeviceId, stream: HostStream) -> Result<HostGraph> {
        match target("cuStreamEndCapture", dev, stream)? {
            Target::Legacy => Err(err("cuStreamEndCapture", Code::IllegalState, None)),
            Target::Worker(w) => Ok(HostGraph(Arc::new(w.end_capture()?))),
        }
    }
    fn capture_status(dev: DeviceId, stream: HostStream) -> Result<CaptureStatus> {
        match target("cuStreamGetCaptureInfo", dev, stream)? {
            Target::Legacy => {
                refuse_implicit_capture(dev, "cuStreamGetCaptureInfo").map(|()| CaptureStatus::None)
            }
            Target::Worker(w) => Ok(w.capture_status()),
        }
    }
    fn graph_launch(dev: DeviceId, graph: &HostGraph, stream: HostStream) -> Result<()> {
        let ops = Arc::clone(&graph.0);
        enqueue("cuGraphLaunch", dev, stream, Arc::new(move || ops.iter().for_each(|op| op())))
    }
    fn graph_upload(dev: DeviceId, _graph: &HostGraph, stream: HostStream) -> Result<()> {
        target("cuGraphUpload", dev, stream).map(drop)
    }
    fn graph_destroy(_dev: DeviceId, graph: HostGraph) -> Result<()> {
        drop(graph);
        Ok(())
    }

    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<Arc<HostEvent>> {
        memory::check_device("cuEventCreate", dev)?;
        Ok(HostEvent::new(flags))
    }
    fn event_destroy(_dev: DeviceId, event: Arc<HostEvent>) -> Result<()> {
        drop(event);
        Ok(())
    }
    fn event_record(dev: DeviceId, event: &Arc<HostEvent>, stream: HostStream) -> Result<()> {
        match target("cuEventRecord", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuEventRecord")?;
                event.record_now();
                Ok(())
            }
            Target::Worker(w) => {
                if w.capture_status() != CaptureStatus::None {
                    let event = Arc::clone(event);
                    return w.submit("cuEventRecord", Arc::new(move || event.record_now()));
                }
                let generation = event.next_generation();
                let ev = Arc::clone(event);
                let queued = w.submit("cuEventRecord", Arc::new(move || ev.complete(generation)));
                if queued.is_err() {
                    // Never queued: complete the generation so the event does not hang.
                    event.complete(generation);
                }
                queued
            }
        }
    }
    fn event_query(_dev: DeviceId, event: &Arc<HostEvent>) -> Result<bool> {
        Ok(event.query())
    }
    fn event_synchronize(_dev: DeviceId, event: &Arc<HostEvent>) -> Result<()> {
        event.synchronize();
        Ok(())
    }
    fn event_elapsed_ms(_dev: DeviceId, start: &Arc<HostEvent>, end: &Arc<HostEvent>) -> Result<f32> {
        if start.flags.disable_timing || end.flags.disable_timing {
            return Err(err("cuEventElapsedTime", Code::InvalidHandle, Some("timing is disabled".into())));
        }
        HostEvent::elapsed_ms(start, end)
    }
}
