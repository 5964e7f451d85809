//! The host backend: gpumem on the CPU alone, for programs and tests on machines without a GPU,
//! and the reference the GPU backends are compared with.
//!
//! - Devices: `GPUMEM_HOST_DEVICES` simulated devices (default 2), each with
//!   `GPUMEM_HOST_DEVICE_MEMORY` bytes (default 16 GiB). Device memory is zeroed host memory,
//!   512-byte aligned; every device can reach every other's.
//! - Streams: each stream is a worker thread running its queue in order. The per-thread default
//!   stream is a worker per host thread. The null and legacy streams run their work on the
//!   caller's thread after the device's blocking streams have drained. At most 1024 streams
//!   (per-thread default streams included) are live at once: the next is refused with
//!   `HOST_ERROR_LAUNCH_OUT_OF_RESOURCES`, as is a stream whose thread the system cannot start.
//! - Events complete when their stream reaches them; timing uses the host clock.
//! - Capture records a stream's operations; the graph replays them in order. Host functions
//!   captured once run on every replay. Streams join a capture by waiting for an event recorded
//!   in it and leave it by being waited for, with CUDA's rules and errors: an unjoined fork
//!   fails `end_capture` (`STREAM_CAPTURE_UNJOINED`), ending on a joined stream fails
//!   (`STREAM_CAPTURE_UNMATCHED`), waiting for work outside the capture or in another one fails
//!   (`STREAM_CAPTURE_ISOLATION`, `STREAM_CAPTURE_MERGE`), and an event recorded in a capture
//!   cannot be queried (`CAPTURED_EVENT`).
//! - Freeing device memory waits for all streams, as `cudaFree` does; the stream-ordered
//!   allocator frees when the stream reaches the free.
//! - Errors carry CUDA's numeric codes under host names (`HOST_ERROR_...`).
//!
//! Host functions and callbacks may not synchronise their own stream (an error, where CUDA forbids
//! any runtime call in a callback).

mod capture;
mod device;
mod event;
mod graph;
mod memory;
mod result;
mod stream;
mod vmm;
mod worker;

/// Physical bytes of simulated virtual memory alive on device `dev` that the calling thread
/// created (for the pool's tests).
#[cfg(test)]
pub(crate) fn vmm_physical_bytes_made_here(dev: crate::hal::DeviceId) -> usize {
    vmm::physical_bytes_made_here(dev)
}

/// The devices with access to the simulated mapping that holds `ptr` (for the pool's tests).
#[cfg(test)]
pub(crate) fn vmm_access_of(ptr: crate::hal::DevicePtr) -> Option<Vec<crate::hal::DeviceId>> {
    vmm::access_of(ptr)
}

/// The simulated virtual-memory calls made on this thread: `[create, map, set access, unmap]`
/// (for the pool's tests).
#[cfg(test)]
pub(crate) fn vmm_calls_on_this_thread() -> [usize; 4] {
    vmm::calls_on_this_thread()
}

/// Whether `handle` is a stream handle of the host backend that can be used now: 0, 1, 2 (the
/// null, legacy and per-thread default streams) or a stream created and not yet destroyed.
///
/// The C ABI checks foreign handles with it before using them. The answer holds only while
/// nothing destroys the stream: it does not keep it alive.
#[must_use]
pub fn is_live_stream(handle: usize) -> bool {
    handle <= 2 || worker::is_live(handle)
}

use std::sync::Arc;

use crate::error::Result;
use crate::hal::{Api, Caps, DeviceId, StreamFlags};

pub use event::HostEvent;
pub use graph::HostGraph;
use result::{err, Code};
use worker::{join_legacy, Op, Worker};

/// The host backend. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Host;

/// A host stream handle: 0 (null), 1 (legacy), 2 (per-thread default) or the address of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostStream(usize);

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
        self.0.abandon_capture();
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

impl Api for Host {
    const NAME: &'static str = "host";
    const CAPS: Caps = Caps {
        capture: true,
        stream_ordered_allocation: true,
        host_functions: true,
        virtual_memory: true,
        peer_access: true,
    };
    type Stream = HostStream;
    type Event = Arc<HostEvent>;
    type Graph = HostGraph;
}

crate::runtime_statics!(Host);
