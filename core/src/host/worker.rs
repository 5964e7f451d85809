//! Host streams: each stream is a worker thread that runs its queue in order.
//!
//! Capture records the operations queued on a stream instead of running them; the recorded list
//! is the graph, and launching the graph queues one task that runs the list in order. The legacy
//! default stream has no thread: its work runs on the caller's thread once every blocking stream
//! of the device has drained, which is what "synchronises with all blocking streams" means.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

use crate::error::Result;
use crate::hal::{CaptureMode, CaptureStatus, DeviceId, StreamFlags};

use super::capture::{Ended, Sequence, StreamKey};
use super::event::HostEvent;
use super::result::{err, Code};

/// A replayable operation: copies, memsets, host functions, event records and waits.
pub(crate) type Op = Arc<dyn Fn() + Send + Sync>;

enum Task {
    Op(Op),
    Once(Box<dyn FnOnce() + Send>),
}

struct State {
    queue: VecDeque<Task>,
    submitted: u64,
    completed: u64,
    shutdown: bool,
    /// The capture this stream takes part in (as its origin or joined); one that has ended since
    /// counts as none.
    capture: Option<Arc<Sequence>>,
}

impl State {
    /// The capture this stream takes part in now.
    fn live_capture(&mut self) -> Option<&Arc<Sequence>> {
        if self.capture.as_ref().is_some_and(|c| c.is_ended()) {
            self.capture = None;
        }
        self.capture.as_ref()
    }
}

pub(crate) struct Worker {
    pub(crate) device: DeviceId,
    pub(crate) flags: StreamFlags,
    pub(crate) priority: i32,
    state: Mutex<State>,
    work: Condvar,
    idle: Condvar,
}

thread_local! {
    /// The worker whose thread this is (0 on other threads).
    static CURRENT_WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Every live worker, for device-wide and legacy-stream synchronisation.
fn registry() -> &'static Mutex<Vec<Weak<Worker>>> {
    static WORKERS: OnceLock<Mutex<Vec<Weak<Worker>>>> = OnceLock::new();
    WORKERS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether `raw` is the handle of a live stream: a worker's `Arc::into_raw` value (as
/// `stream_create` returns it) that is not shut down (its thread may still hold it briefly after
/// `stream_destroy`).
pub(crate) fn is_live(raw: usize) -> bool {
    lock(registry())
        .iter()
        .filter(|w| w.as_ptr() as usize == raw)
        .filter_map(Weak::upgrade)
        .any(|w| !lock(&w.state).shutdown)
}

/// Locks a mutex, ignoring poison: every critical section here leaves the state consistent (no
/// user code runs while a lock is held).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The most streams (worker threads, the per-thread default streams included) the host backend
/// runs at once. Past some thousands of threads, a thread the system did start can still fail
/// to set itself up (its signal stack cannot be mapped), and the standard library aborts the
/// process there; a stream refused here is an error the caller sees instead.
pub(crate) const MAX_LIVE_STREAMS: usize = 1024;

#[cfg(test)]
thread_local! {
    /// Makes starting a worker thread fail on this thread, as the system does when it has no
    /// threads left (the error path's test).
    pub(crate) static FAIL_SPAWN: Cell<bool> = const { Cell::new(false) };
}

/// Starts a worker's thread.
fn start_thread(device: DeviceId, run: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    #[cfg(test)]
    if FAIL_SPAWN.with(Cell::get) {
        return Err(std::io::Error::from(std::io::ErrorKind::OutOfMemory));
    }
    std::thread::Builder::new().name(format!("gpumem-host-stream-{device}")).spawn(run).map(drop)
}

impl Worker {
    /// Starts a worker thread.
    ///
    /// # Errors
    ///
    /// `OutOfResources` when [`MAX_LIVE_STREAMS`] streams are live or the thread cannot be
    /// started.
    pub(crate) fn spawn(device: DeviceId, flags: StreamFlags, priority: i32) -> Result<Arc<Worker>> {
        let worker = Arc::new(Worker {
            device,
            flags,
            priority,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                submitted: 0,
                completed: 0,
                shutdown: false,
                capture: None,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        let runner = Arc::clone(&worker);
        // Counted and started under the registry's lock, so that threads starting at once cannot
        // pass the bound together.
        let mut all = lock(registry());
        all.retain(|w| w.strong_count() > 0);
        if all.len() >= MAX_LIVE_STREAMS {
            return Err(err(
                "cuStreamCreate",
                Code::OutOfResources,
                Some(format!(
                    "{MAX_LIVE_STREAMS} streams are live, the most the host backend runs at once (one thread each)"
                )),
            ));
        }
        start_thread(device, move || runner.run()).map_err(|e| {
            err(
                "cuStreamCreate",
                Code::OutOfResources,
                Some(format!("cannot start the stream's thread: {e}")),
            )
        })?;
        all.push(Arc::downgrade(&worker));
        Ok(worker)
    }

    fn run(self: Arc<Self>) {
        CURRENT_WORKER.with(|c| c.set(Arc::as_ptr(&self) as usize));
        loop {
            let task = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(t) = st.queue.pop_front() {
                        break t;
                    }
                    if st.shutdown {
                        return;
                    }
                    st = self.work.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            // Tasks are gpumem's own closures, and user callbacks inside them already catch
            // their panics; this is the last line that keeps the stream alive regardless.
            let _ = catch_unwind(AssertUnwindSafe(|| match task {
                Task::Op(op) => op(),
                Task::Once(f) => f(),
            }));
            let mut st = lock(&self.state);
            st.completed += 1;
            self.idle.notify_all();
        }
    }

    /// Whether the calling thread is this worker's.
    pub(crate) fn is_current(&self) -> bool {
        CURRENT_WORKER.with(Cell::get) == self as *const Worker as usize
    }

    /// This stream's identity in captures.
    pub(crate) fn key(&self) -> StreamKey {
        self as *const Worker as usize
    }

    /// Queues `op`, or records it when the stream captures.
    pub(crate) fn submit(&self, api: &'static str, op: Op) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some(capture) = st.live_capture() {
            return capture.record(api, self.key(), op);
        }
        self.push(st, Task::Op(op));
        Ok(())
    }

    /// Queues a one-shot task; refused (and the capture invalidated) while capturing, as
    /// `cuStreamAddCallback` is.
    pub(crate) fn submit_once(&self, api: &'static str, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        let mut st = lock(&self.state);
        if let Some(capture) = st.live_capture() {
            capture.invalidate();
            return Err(err(api, Code::StreamCaptureUnsupported, None));
        }
        self.push(st, Task::Once(f));
        Ok(())
    }

    /// Records `event` on this stream while it captures: the event stands for this point of the
    /// capture (`None` when the stream does not capture).
    pub(crate) fn record_in_capture(&self, api: &'static str, event: &HostEvent) -> Option<Result<()>> {
        let mut st = lock(&self.state);
        let capture = st.live_capture()?;
        Some(capture.clock_of(api, self.key()).map(|clock| event.set_captured(Arc::clone(capture), clock)))
    }

    /// Makes this stream wait for `event`: a fork into the event's capture, a join within one, or
    /// (outside captures) a queued wait.
    pub(crate) fn wait_event(&self, api: &'static str, event: &Arc<HostEvent>) -> Result<()> {
        let mut st = lock(&self.state);
        let mine = st.live_capture().cloned();
        match (mine, event.captured()) {
            (_, Some((theirs, _))) if theirs.is_ended() => Err(err(
                api,
                Code::InvalidValue,
                Some("the event was last recorded in a capture that has ended".into()),
            )),
            (None, Some((theirs, point))) => {
                theirs.wait(api, self.key(), &point)?;
                st.capture = Some(theirs);
                Ok(())
            }
            (Some(mine), Some((theirs, point))) if Arc::ptr_eq(&mine, &theirs) => {
                mine.wait(api, self.key(), &point)
            }
            (Some(mine), Some((theirs, _))) => {
                mine.invalidate();
                theirs.invalidate();
                Err(err(api, Code::StreamCaptureMerge, None))
            }
            (Some(mine), None) => {
                if event.current_generation() == 0 {
                    // Never recorded: nothing to wait for, as outside a capture.
                    return Ok(());
                }
                mine.invalidate();
                Err(err(api, Code::StreamCaptureIsolation, None))
            }
            (None, None) => {
                let generation = event.current_generation();
                if generation == 0 {
                    return Ok(());
                }
                let event = Arc::clone(event);
                self.push(st, Task::Op(Arc::new(move || event.wait_for(generation))));
                Ok(())
            }
        }
    }

    fn push(&self, mut st: MutexGuard<'_, State>, task: Task) {
        st.queue.push_back(task);
        st.submitted += 1;
        self.work.notify_one();
    }

    /// Refuses an operation that is illegal while capturing, invalidating the capture (as CUDA
    /// does for queries and synchronisation of a capturing stream).
    fn refuse_if_capturing(&self, st: &mut State, api: &'static str) -> Result<()> {
        if let Some(capture) = st.live_capture() {
            capture.invalidate();
            return Err(err(api, Code::StreamCaptureUnsupported, None));
        }
        Ok(())
    }

    pub(crate) fn query(&self) -> Result<bool> {
        let mut st = lock(&self.state);
        self.refuse_if_capturing(&mut st, "cuStreamQuery")?;
        Ok(st.completed == st.submitted)
    }

    /// Waits for everything queued so far.
    pub(crate) fn synchronize(&self, api: &'static str) -> Result<()> {
        let mut st = lock(&self.state);
        self.refuse_if_capturing(&mut st, api)?;
        if self.is_current() {
            return Err(err(
                api,
                Code::NotPermitted,
                Some("a stream cannot wait for itself from its own callback".into()),
            ));
        }
        let target = st.submitted;
        while st.completed < target {
            st = self.idle.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Ok(())
    }

    /// Waits for everything queued so far, without the capture check; skips the calling thread's
    /// own worker (a device-wide wait from inside a callback must not wait for itself).
    fn drain(&self) {
        if self.is_current() {
            return;
        }
        let mut st = lock(&self.state);
        let target = st.submitted;
        while st.completed < target {
            st = self.idle.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let mut st = lock(&self.state);
        if st.live_capture().is_some() {
            return Err(err(
                "cuStreamBeginCapture",
                Code::IllegalState,
                Some("the stream is already capturing".into()),
            ));
        }
        st.capture = Some(Sequence::begin(self.key(), mode));
        Ok(())
    }

    /// Ends the capture: its operations and their API names, in order.
    pub(crate) fn end_capture(&self) -> Result<(Vec<Op>, Vec<&'static str>)> {
        let api = "cuStreamEndCapture";
        let mut st = lock(&self.state);
        let Some(capture) = st.live_capture().cloned() else {
            return Err(err(api, Code::IllegalState, Some("the stream is not capturing".into())));
        };
        if !capture.is_origin(self.key()) {
            capture.invalidate();
            return Err(err(api, Code::StreamCaptureUnmatched, None));
        }
        st.capture = None;
        match capture.end() {
            Ended::Graph(ops, names) => Ok((ops, names)),
            Ended::Invalidated => Err(err(api, Code::StreamCaptureInvalidated, None)),
            Ended::Unjoined => Err(err(api, Code::StreamCaptureUnjoined, None)),
        }
    }

    pub(crate) fn capture_status(&self) -> CaptureStatus {
        match lock(&self.state).live_capture() {
            None => CaptureStatus::None,
            Some(c) if c.is_invalidated() => CaptureStatus::Invalidated,
            Some(_) => CaptureStatus::Active,
        }
    }

    /// The identity of the capture this stream takes part in.
    pub(crate) fn capture_id(&self) -> Option<u64> {
        lock(&self.state).live_capture().map(|c| c.id())
    }

    /// Invalidates an active capture; returns whether there was one.
    fn invalidate_capture(&self) -> bool {
        match lock(&self.state).live_capture() {
            Some(c) => {
                c.invalidate();
                true
            }
            None => false,
        }
    }

    /// Ends what this stream captures, discarding it (its thread is exiting, as CUDA discards
    /// the capture of a per-thread default stream whose thread exits).
    pub(crate) fn abandon_capture(&self) {
        let mut st = lock(&self.state);
        if let Some(capture) = st.live_capture().cloned() {
            if capture.is_origin(self.key()) {
                drop(capture.end());
            }
            st.capture = None;
        }
    }

    /// Lets the thread finish what is queued and exit.
    pub(crate) fn shut_down(&self) {
        lock(&self.state).shutdown = true;
        self.work.notify_all();
    }
}

fn live_workers(filter: impl Fn(&Worker) -> bool) -> Vec<Arc<Worker>> {
    lock(registry()).iter().filter_map(Weak::upgrade).filter(|w| filter(w)).collect()
}

/// The blocking streams of `dev` must be idle before work on the legacy stream runs. A blocking
/// stream that is capturing cannot be joined: that capture is invalidated and the legacy
/// operation fails, as CUDA's `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
pub(crate) fn join_legacy(dev: DeviceId, api: &'static str) -> Result<()> {
    refuse_implicit_capture(dev, api)?;
    for w in live_workers(|w| w.device == dev && !w.flags.non_blocking) {
        w.drain();
    }
    Ok(())
}

/// Fails (invalidating the capture) when a blocking stream of `dev` captures: the legacy stream
/// cannot depend on it.
pub(crate) fn refuse_implicit_capture(dev: DeviceId, api: &'static str) -> Result<()> {
    let mut implicit = false;
    for w in live_workers(|w| w.device == dev && !w.flags.non_blocking) {
        implicit |= w.invalidate_capture_if_active();
    }
    if implicit {
        return Err(err(api, Code::StreamCaptureImplicit, None));
    }
    Ok(())
}

/// Fails when a blocking stream of `dev` captures, leaving that capture as it is: what CUDA
/// answers to a capture query of the legacy stream.
pub(crate) fn implicit_capture(dev: DeviceId, api: &'static str) -> Result<()> {
    let capturing = live_workers(|w| w.device == dev && !w.flags.non_blocking)
        .iter()
        .any(|w| w.capture_status() == CaptureStatus::Active);
    if capturing {
        return Err(err(api, Code::StreamCaptureImplicit, None));
    }
    Ok(())
}

impl Worker {
    fn invalidate_capture_if_active(&self) -> bool {
        self.capture_status() == CaptureStatus::Active && self.invalidate_capture()
    }
}

/// Fails (invalidating the captures) when any stream of `dev` captures: what CUDA answers to a
/// device-wide synchronisation then.
pub(crate) fn refuse_device_capture(dev: DeviceId, api: &'static str) -> Result<()> {
    let mut capturing = false;
    for w in live_workers(|w| w.device == dev) {
        capturing |= w.invalidate_capture_if_active();
    }
    if capturing {
        return Err(err(api, Code::StreamCaptureUnsupported, None));
    }
    Ok(())
}

/// Waits until every stream of `dev` (all devices for `None`) has drained.
pub(crate) fn drain_device(dev: Option<DeviceId>) {
    for w in live_workers(|w| dev.is_none_or(|d| w.device == d)) {
        w.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hal::StreamOps;
    use crate::host::Host;

    /// A thread the system cannot start is the stream's typed error, not an abort (HS01).
    #[test]
    fn a_thread_that_cannot_start_is_an_error() {
        FAIL_SPAWN.with(|f| f.set(true));
        let refused = Host::stream_create(0, StreamFlags::default(), 0);
        FAIL_SPAWN.with(|f| f.set(false));
        let e = refused.unwrap_err();
        assert_eq!(e.code(), Some(Code::OutOfResources as i64), "{e}");
        assert!(e.to_string().contains("cannot start the stream's thread"), "{e}");
    }
}
