//! [`EventStreamOrder`]: the runtime's [`StreamOrder`], which lets a pool lend one stream's free
//! memory to another stream (see [`crate::pool::Pool::set_share_across_streams`]), and orders a
//! chunk's reuse after the work other streams queued on it with no event (see
//! [`PooledMemory::note_other_stream`](crate::pool::PooledMemory::note_other_stream)).
//!
//! The streams it orders are those it can name from an arena key alone: the streams gpumem owns
//! (created by [`Stream::new`] and its siblings, or taken over with [`Stream::from_raw`]) while they
//! live, and the null and legacy default streams. A per-thread default stream is the calling
//! thread's only, and a foreign stream's handle is live only as long as its owner says (the C
//! ABI's streams, PyTorch's and CuPy's, are foreign), so memory of their arenas is not lent to
//! other streams and they borrow none.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::hal::{DeviceId, EventFlags};
use crate::pool::{ArenaKey, Fence, OtherStreams, StreamOrder};
use crate::runtime::state::record_drop_error;
use crate::runtime::stream::StreamRuntime;
use crate::runtime::stream::{self, Event, Stream, LEGACY_STREAM_PTR, NULL_STREAM_PTR};

/// Orders two streams of device `device` with an event: the borrower's stream waits on the
/// device for an event recorded on the owner's, and a lent chunk comes back behind an event
/// recorded on the borrower's. Nothing waits on the host.
pub struct EventStreamOrder<B: StreamRuntime> {
    device: DeviceId,
    /// The borrowers' streams, each with its number of chunks still lent: a stream is kept alive
    /// until its last borrowed chunk has come back, so that the fence can be recorded on it.
    borrowers: Mutex<HashMap<ArenaKey, (Stream<B>, usize)>>,
    /// The event each order records on the owner's stream and makes the borrower's wait for.
    /// One serves every order: a wait takes the record made before it, so the next record
    /// changes nothing for a wait already queued.
    order_event: Mutex<Option<Event<B>>>,
    /// Events of completed fences, for the next ones (an event made and destroyed per fence
    /// would be two more driver calls for each chunk lent across streams).
    spare: Arc<Mutex<Vec<Event<B>>>>,
}

/// At most this many spare fence events are kept.
const SPARE_EVENTS: usize = 64;

impl<B: StreamRuntime> EventStreamOrder<B> {
    /// The order for a pool of device `device`.
    #[must_use]
    pub fn new(device: DeviceId) -> Self {
        EventStreamOrder {
            device,
            borrowers: Mutex::new(HashMap::new()),
            order_event: Mutex::new(None),
            spare: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

/// An event without timing on `device`: the cheapest kind to record and wait for.
fn event_on<B: StreamRuntime>(device: DeviceId) -> crate::Result<Event<B>> {
    Event::with_flags_on(device, EventFlags { disable_timing: true, ..EventFlags::default() })
}

/// The stream behind arena `key`, when this order can name it (see the module docs).
fn stream_of<B: StreamRuntime>(key: ArenaKey) -> Option<Stream<B>> {
    // Every lane of the null stream is the null stream.
    let key = key.stream_key();
    if key.per_thread_number().is_some() {
        return None;
    }
    match usize::try_from(key.raw()) {
        Ok(NULL_STREAM_PTR) => Some(Stream::null()),
        Ok(LEGACY_STREAM_PTR) => Some(Stream::legacy()),
        Ok(_) => stream::owned_stream::<B>(key),
        Err(_) => None,
    }
}

impl<B: StreamRuntime> StreamOrder for EventStreamOrder<B> {
    fn can_order(&self, owner: ArenaKey, borrower: ArenaKey) -> bool {
        // No event is recorded inside a host function, and none while gpumem captures (a record on
        // a capturing stream would become part of the graph).
        owner.stream_key() != borrower.stream_key()
            && !crate::runtime::state::in_callback()
            && !stream::inflight::any_capture::<B>()
            && stream_of::<B>(owner).is_some()
            && stream_of::<B>(borrower).is_some()
    }

    fn order_after(&self, owner: ArenaKey, borrower: ArenaKey) -> bool {
        let (Some(from), Some(to)) = (stream_of::<B>(owner), stream_of::<B>(borrower)) else {
            return false;
        };
        // A capture gpumem did not begin is found here (a driver call each, on a miss only). A
        // backend that cannot capture (HIP's, here) has no stream that captures.
        let capturing = |s: &Stream<B>| B::CAPS.capture && s.is_capturing().unwrap_or(true);
        if capturing(&from) || capturing(&to) {
            return false;
        }
        {
            let mut event = self.order_event.lock();
            if event.is_none() {
                match event_on::<B>(self.device) {
                    Ok(e) => *event = Some(e),
                    Err(err) => {
                        record_drop_error::<B>(err);
                        return false;
                    }
                }
            }
            let Some(e) = event.as_ref() else { return false };
            if let Err(err) = e.record(Some(&from)).and_then(|()| to.wait_event(e)) {
                // The miss goes on without the lend; the error is kept for the next synchronize.
                record_drop_error::<B>(err);
                return false;
            }
        }
        self.borrowers.lock().entry(borrower).or_insert_with(|| (to, 0)).1 += 1;
        true
    }

    fn fence_after(&self, borrower: ArenaKey) -> Box<dyn Fence> {
        let stream = {
            let mut borrowers = self.borrowers.lock();
            match borrowers.get_mut(&borrower) {
                Some((stream, n)) => {
                    *n -= 1;
                    let stream = stream.clone();
                    if *n == 0 {
                        borrowers.remove(&borrower);
                    }
                    Some(stream)
                }
                None => None,
            }
        };
        let Some(stream) = stream else {
            // Not reached: a chunk this order lent keeps its borrower's stream above. A fence that
            // never completes keeps the chunk out of use, which is safe.
            return Box::new(BorrowerFence::<B> {
                device: self.device,
                state: Mutex::new(Recorded::Done),
                spare: Arc::clone(&self.spare),
                never: true,
            });
        };
        let fence = BorrowerFence::<B> {
            device: self.device,
            state: Mutex::new(Recorded::Pending(stream)),
            spare: Arc::clone(&self.spare),
            never: false,
        };
        fence.record(&mut fence.state.lock());
        Box::new(fence)
    }

    fn order_after_uses(&self, owner: ArenaKey, others: OtherStreams) -> Option<Box<dyn Fence>> {
        // A fence, not a wait of the owner's stream on the device: that would hold the owner's
        // later work, which need not touch this chunk, behind the other streams' work. The events
        // are recorded now (later, for a chunk that comes back inside a host function); the
        // chunk is lent again once they have completed, looked at when an arena misses.
        let fence = UsesFence::<B> { device: self.device, owner, others, events: Mutex::new(Uses::Pending) };
        let _ = fence.events();
        Some(Box::new(fence))
    }
}

/// What a [`UsesFence`] waits for.
enum Uses<B: StreamRuntime> {
    /// Not asked yet: the chunk came back inside a host function, where no event is recorded.
    Pending,
    /// The events recorded behind the other streams' work.
    Events(Vec<Event<B>>),
    /// No event could be recorded: never complete (the chunk stays out of use, which is safe).
    Failed,
}

/// A chunk's fence on the work other streams queued on it with no event.
struct UsesFence<B: StreamRuntime> {
    device: DeviceId,
    owner: ArenaKey,
    others: OtherStreams,
    events: Mutex<Uses<B>>,
}

impl<B: StreamRuntime> UsesFence<B> {
    /// The events to wait for, recorded the first time this is asked outside a host function.
    fn events(&self) -> Option<Vec<Event<B>>> {
        if crate::runtime::state::in_callback() {
            return None;
        }
        let mut events = self.events.lock();
        if matches!(*events, Uses::Pending) {
            *events = match stream::inflight::others_done::<B>(self.device, self.owner, self.others) {
                Ok(recorded) => Uses::Events(recorded),
                Err(e) => {
                    record_drop_error::<B>(e);
                    Uses::Failed
                }
            };
        }
        match &*events {
            Uses::Events(recorded) => Some(recorded.clone()),
            Uses::Pending | Uses::Failed => None,
        }
    }
}

impl<B: StreamRuntime> Fence for UsesFence<B> {
    fn is_complete(&self) -> bool {
        // An error here is the device's sticky one: no more work runs.
        self.events().is_some_and(|events| events.iter().all(|e| e.query().unwrap_or(true)))
    }

    fn wait(&self) {
        for event in self.events().unwrap_or_default() {
            if let Err(e) = event.synchronize() {
                record_drop_error::<B>(e);
            }
        }
    }
}

/// What a borrowed chunk's fence waits for.
enum Recorded<B: StreamRuntime> {
    /// The borrower's stream, on which no event could be recorded yet: the chunk came back
    /// inside a host function (no runtime call is allowed there) or while the stream captured
    /// (a record would go into the graph, not mark the work queued before the capture).
    Pending(Stream<B>),
    /// The event recorded on the borrower's stream after the chunk came back.
    Event(Event<B>),
    /// Nothing to wait for any more.
    Done,
}

struct BorrowerFence<B: StreamRuntime> {
    device: DeviceId,
    state: Mutex<Recorded<B>>,
    /// Where its event goes once complete.
    spare: Arc<Mutex<Vec<Event<B>>>>,
    /// Never complete (see `fence_after`).
    never: bool,
}

impl<B: StreamRuntime> BorrowerFence<B> {
    /// Records the event on the borrower's stream, if it is still to be recorded and can be now;
    /// else leaves the state pending, for the next look.
    fn record(&self, state: &mut Recorded<B>) {
        let Recorded::Pending(stream) = &*state else { return };
        if crate::runtime::state::in_callback() || (B::CAPS.capture && stream.is_capturing().unwrap_or(true))
        {
            return;
        }
        let event = self.spare.lock().pop().map_or_else(|| event_on::<B>(self.device), Ok);
        *state = match event.and_then(|e| e.record(Some(stream)).map(|()| e)) {
            Ok(event) => Recorded::Event(event),
            Err(e) => {
                // No event: wait for the stream itself, so the chunk is free to reuse.
                record_drop_error::<B>(e);
                if let Err(e) = stream.synchronize() {
                    record_drop_error::<B>(e);
                }
                Recorded::Done
            }
        };
    }
}

impl<B: StreamRuntime> Drop for BorrowerFence<B> {
    fn drop(&mut self) {
        if crate::runtime::state::in_callback() {
            return;
        }
        let recorded = std::mem::replace(&mut *self.state.lock(), Recorded::Done);
        if let Recorded::Event(e) = recorded {
            // Kept only once its record has completed, so a later record starts from nothing.
            let mut spare = self.spare.lock();
            if spare.len() < SPARE_EVENTS && e.query().unwrap_or(false) {
                spare.push(e);
            }
        }
    }
}

impl<B: StreamRuntime> Fence for BorrowerFence<B> {
    fn is_complete(&self) -> bool {
        // Inside a host function no runtime call is allowed: not yet, as far as the pool knows.
        if self.never || crate::runtime::state::in_callback() {
            return false;
        }
        let mut state = self.state.lock();
        self.record(&mut state);
        match &*state {
            Recorded::Pending(_) => false,
            // An error here is the device's sticky one: no more work runs.
            Recorded::Event(e) => e.query().unwrap_or(true),
            Recorded::Done => true,
        }
    }

    fn wait(&self) {
        let event = {
            let mut state = self.state.lock();
            self.record(&mut state);
            match &*state {
                Recorded::Event(e) => e.clone(),
                // Still pending (inside a host function, or the stream still captures), or never:
                // the pool looks at `is_complete` again and keeps the chunk fenced.
                Recorded::Pending(_) | Recorded::Done => return,
            }
        };
        if let Err(e) = event.synchronize() {
            record_drop_error::<B>(e);
        }
    }
}
