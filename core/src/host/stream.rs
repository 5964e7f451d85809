//! Streams: each is a worker thread running its queue in order; the null and legacy streams run
//! on the caller's thread once the device's blocking streams have drained.

use std::ffi::c_void;
use std::sync::Arc;

use crate::error::Result;
use crate::hal::{DeviceId, HostFn, StreamCallback, StreamFlags, StreamOps};

use super::event::HostEvent;
use super::memory;
use super::result::{err, Code};
use super::worker::{join_legacy, Worker};
use super::{enqueue, target, Host, HostStream, Target, PRIORITY_RANGE};

impl StreamOps for Host {
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
    unsafe fn stream_flags(dev: DeviceId, stream: HostStream) -> Result<StreamFlags> {
        match target("cuStreamGetFlags", dev, stream)? {
            Target::Legacy => Ok(StreamFlags::default()),
            Target::Worker(w) => Ok(w.flags),
        }
    }
    unsafe fn stream_priority(dev: DeviceId, stream: HostStream) -> Result<i32> {
        match target("cuStreamGetPriority", dev, stream)? {
            Target::Legacy => Ok(0),
            Target::Worker(w) => Ok(w.priority),
        }
    }
    unsafe fn stream_query(dev: DeviceId, stream: HostStream) -> Result<bool> {
        match target("cuStreamQuery", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuStreamQuery")?;
                Ok(true)
            }
            Target::Worker(w) => w.query(),
        }
    }
    unsafe fn stream_synchronize(dev: DeviceId, stream: HostStream) -> Result<()> {
        match target("cuStreamSynchronize", dev, stream)? {
            Target::Legacy => join_legacy(dev, "cuStreamSynchronize"),
            Target::Worker(w) => w.synchronize("cuStreamSynchronize"),
        }
    }
    unsafe fn stream_wait_event(dev: DeviceId, stream: HostStream, event: &Arc<HostEvent>) -> Result<()> {
        let api = "cuStreamWaitEvent";
        match target(api, dev, stream)? {
            Target::Legacy => {
                if let Some((capture, _)) = event.captured() {
                    // The legacy stream cannot take part in a capture.
                    capture.invalidate();
                    return Err(err(api, Code::StreamCaptureIsolation, None));
                }
                join_legacy(dev, api)?;
                event.wait_for(event.current_generation());
                Ok(())
            }
            Target::Worker(w) => w.wait_event(api, event),
        }
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
    unsafe fn add_callback(dev: DeviceId, stream: HostStream, callback: StreamCallback) -> Result<()> {
        match target("cuStreamAddCallback", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuStreamAddCallback")?;
                callback(Ok(()));
                Ok(())
            }
            Target::Worker(w) => w.submit_once("cuStreamAddCallback", Box::new(move || callback(Ok(())))),
        }
    }
}
