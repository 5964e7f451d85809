//! Host events: a generation counter per event. `record` asks for the next generation; the
//! stream completes it when it reaches the record. An event is done when the last generation
//! asked for has completed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::Result;
use crate::hal::{DeviceId, EventFlags, EventOps};

use super::capture::{Clock, Sequence};
use super::memory;
use super::result::{err, Code};
use super::worker::join_legacy;
use super::{target, Host, HostStream, Target};

#[derive(Debug)]
struct Marks {
    recorded: u64,
    completed: u64,
    /// When the latest completed generation completed.
    at: Option<Instant>,
    /// The capture the event was last recorded in, and the point of it the event stands for
    /// (`None` once it is recorded outside a capture).
    captured: Option<(Arc<Sequence>, Clock)>,
}

/// A host event (the host backend's `Backend::Event`).
#[derive(Debug)]
pub struct HostEvent {
    pub(crate) flags: EventFlags,
    marks: Mutex<Marks>,
    done: Condvar,
}

fn lock(m: &Mutex<Marks>) -> MutexGuard<'_, Marks> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl HostEvent {
    pub(crate) fn new(flags: EventFlags) -> Arc<HostEvent> {
        Arc::new(HostEvent {
            flags,
            marks: Mutex::new(Marks { recorded: 0, completed: 0, at: None, captured: None }),
            done: Condvar::new(),
        })
    }

    /// Asks for the next generation; the returned number is completed by [`HostEvent::complete`].
    pub(crate) fn next_generation(&self) -> u64 {
        let mut m = lock(&self.marks);
        m.captured = None;
        m.recorded += 1;
        m.recorded
    }

    /// Marks the event as recorded at `point` of `capture`.
    pub(crate) fn set_captured(&self, capture: Arc<Sequence>, point: Clock) {
        lock(&self.marks).captured = Some((capture, point));
    }

    /// The capture the event was last recorded in, and where.
    pub(crate) fn captured(&self) -> Option<(Arc<Sequence>, Clock)> {
        lock(&self.marks).captured.clone()
    }

    /// Refuses to treat an event last recorded in a capture as a point in time: while the
    /// capture runs the refusal invalidates it (`CAPTURED_EVENT` for `captured_code`), after it
    /// the event is invalid until recorded again.
    fn refuse_captured(&self, api: &'static str, captured_code: Code) -> Result<()> {
        match self.captured() {
            None => Ok(()),
            Some((capture, _)) if !capture.is_ended() => {
                capture.invalidate();
                Err(err(api, captured_code, None))
            }
            Some(_) => Err(err(
                api,
                Code::InvalidValue,
                Some("the event was last recorded in a capture that has ended".into()),
            )),
        }
    }

    /// Completes generation `g` (and every earlier one).
    pub(crate) fn complete(&self, g: u64) {
        let mut m = lock(&self.marks);
        if g > m.completed {
            m.completed = g;
            m.at = Some(Instant::now());
        }
        self.done.notify_all();
    }

    /// A record on the legacy stream (which runs its work at once): asks for and completes a
    /// generation.
    pub(crate) fn record_now(&self) {
        let g = self.next_generation();
        self.complete(g);
    }

    /// The generation a wait issued now must wait for.
    pub(crate) fn current_generation(&self) -> u64 {
        lock(&self.marks).recorded
    }

    pub(crate) fn query(&self) -> bool {
        let m = lock(&self.marks);
        m.completed >= m.recorded
    }

    /// Blocks until generation `g` has completed.
    pub(crate) fn wait_for(&self, g: u64) {
        let mut m = lock(&self.marks);
        while m.completed < g {
            m = self.done.wait(m).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    pub(crate) fn synchronize(&self) {
        let g = self.current_generation();
        self.wait_for(g);
    }

    pub(crate) fn elapsed_ms(start: &HostEvent, end: &HostEvent) -> Result<f32> {
        let api = "cuEventElapsedTime";
        let (s, e) = (lock(&start.marks), lock(&end.marks));
        if s.recorded == 0 || e.recorded == 0 {
            return Err(err(api, Code::InvalidHandle, Some("event was never recorded".into())));
        }
        if s.completed < s.recorded || e.completed < e.recorded {
            return Err(err(api, Code::NotReady, None));
        }
        match (s.at, e.at) {
            (Some(a), Some(b)) => {
                let ms = if b >= a {
                    b.duration_since(a).as_secs_f64()
                } else {
                    -a.duration_since(b).as_secs_f64()
                } * 1e3;
                Ok(ms as f32)
            }
            _ => Err(err(api, Code::InvalidHandle, None)),
        }
    }
}

impl EventOps for Host {
    fn event_create(dev: DeviceId, flags: EventFlags) -> Result<Arc<HostEvent>> {
        memory::check_device("cuEventCreate", dev)?;
        Ok(HostEvent::new(flags))
    }
    fn event_destroy(_dev: DeviceId, event: Arc<HostEvent>) -> Result<()> {
        drop(event);
        Ok(())
    }
    unsafe fn event_record(dev: DeviceId, event: &Arc<HostEvent>, stream: HostStream) -> Result<()> {
        match target("cuEventRecord", dev, stream)? {
            Target::Legacy => {
                join_legacy(dev, "cuEventRecord")?;
                event.record_now();
                Ok(())
            }
            Target::Worker(w) => {
                if let Some(recorded) = w.record_in_capture("cuEventRecord", event) {
                    return recorded;
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
        event.refuse_captured("cuEventQuery", Code::CapturedEvent)?;
        Ok(event.query())
    }
    fn event_synchronize(_dev: DeviceId, event: &Arc<HostEvent>) -> Result<()> {
        event.refuse_captured("cuEventSynchronize", Code::InvalidValue)?;
        event.synchronize();
        Ok(())
    }
    fn event_elapsed_ms(_dev: DeviceId, start: &Arc<HostEvent>, end: &Arc<HostEvent>) -> Result<f32> {
        if start.flags.disable_timing || end.flags.disable_timing {
            return Err(err("cuEventElapsedTime", Code::InvalidHandle, Some("timing is disabled".into())));
        }
        start.refuse_captured("cuEventElapsedTime", Code::InvalidValue)?;
        end.refuse_captured("cuEventElapsedTime", Code::InvalidValue)?;
        HostEvent::elapsed_ms(start, end)
    }
}
