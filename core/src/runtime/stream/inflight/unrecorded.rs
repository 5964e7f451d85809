//! Work queued with no event: what work on memory of its own stream leaves behind (see the
//! [parent module](super)), and how everything else that reaches that memory waits for it.

#[cfg(test)]
use super::probe;
use super::{counted, Queues, Target};
use crate::error::Result;
use crate::hal::DeviceId;
use crate::pool::{ArenaKey, OtherStreams};
use crate::runtime::stream::event::Event;
use crate::runtime::stream::StreamRuntime;

/// The stream whose order makes reusing some memory safe: the memory's device and the stream's
/// arena key (see [`BaseMemory::reuse_stream`](crate::runtime::memory::BaseMemory::reuse_stream)).
pub(crate) type Reuse = (DeviceId, ArenaKey);

/// What orders reusing one piece of memory an operation touches: the stream whose order covers
/// it (`None`: no stream's, and queued work keeps the memory alive), and the other streams of its
/// device whose work with no event used it
/// ([`BaseMemory::other_streams`](crate::runtime::memory::BaseMemory::other_streams)). Whatever
/// else touches the memory waits for the work queued with no event on all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Order {
    pub(crate) reuse: Option<Reuse>,
    pub(crate) others: OtherStreams,
}

impl Order {
    /// Memory no stream's order covers.
    pub(crate) const NONE: Order = Order { reuse: None, others: OtherStreams::None };
}

/// Work queued with no event on a stream, on memory whose reuse that stream orders: what an
/// operation of another stream, or a synchronous access, on such memory must wait for. It waits
/// for everything queued on the stream up to then (an event recorded at that moment): more than
/// the accesses to its bytes, which no one counted, never less.
pub(super) struct Unrecorded<B: StreamRuntime> {
    stream: Reuse,
    handle: B::Stream,
    /// Work was queued on the stream with no event since `last` was recorded.
    pending: bool,
    /// Recorded behind the stream's work when an order was last asked for.
    last: Option<Event<B>>,
    /// The lasting streams that have waited for `last` since it was recorded: their later work
    /// is ordered after it already, and waits for it no more.
    waited: Vec<Reuse>,
}

impl<B: StreamRuntime> Queues<B> {
    /// Notes work queued with no event on `target`, on memory whose reuse it orders.
    pub(super) fn note_unrecorded(&mut self, target: &Target<B>) {
        let stream = target.as_reuse();
        match self.unrecorded.iter_mut().find(|u| u.stream == stream) {
            Some(u) => u.pending = true,
            None => self.unrecorded.push(Unrecorded {
                stream,
                handle: target.handle,
                pending: true,
                last: None,
                waited: Vec::new(),
            }),
        }
    }

    /// An event that completes once the work queued with no event on `stream` so far has run
    /// (recorded now when work came since the last one); `None` when there is none.
    pub(super) fn unrecorded_done(&mut self, stream: Reuse) -> Result<Option<Event<B>>> {
        let Some(at) = self.unrecorded.iter().position(|u| u.stream == stream) else {
            return Ok(None);
        };
        if self.unrecorded[at].pending {
            let event = self.event_for(stream.0)?;
            let u = &mut self.unrecorded[at];
            // SAFETY: the stream outlives its entry here: an owned stream's entry is taken out
            // (`forget_stream`) before the stream is destroyed, and the default streams live for
            // good.
            unsafe { B::event_record(stream.0, event.raw(), u.handle) }?;
            u.last = Some(event);
            u.pending = false;
            u.waited.clear();
        }
        Ok(self.unrecorded[at].last.clone())
    }

    /// Applies `f` to each stream `order`'s other streams name, with this state: the one it
    /// names, or for [`OtherStreams::Many`] every stream of the memory's device with work noted
    /// here.
    fn for_each_other(
        &mut self,
        order: &Order,
        mut f: impl FnMut(&mut Self, Reuse) -> Result<()>,
    ) -> Result<()> {
        let Some((device, _)) = order.reuse else { return Ok(()) };
        match order.others {
            OtherStreams::None => Ok(()),
            OtherStreams::One(key) => f(self, (device, key)),
            OtherStreams::Many => {
                let streams: Vec<Reuse> =
                    self.unrecorded.iter().map(|u| u.stream).filter(|s| s.0 == device).collect();
                streams.into_iter().try_for_each(|stream| f(self, stream))
            }
        }
    }

    /// Whether a stream `order` names has queued work with no event tracked here.
    pub(super) fn has_unrecorded_of(&self, order: &Order) -> bool {
        let Some((device, _)) = order.reuse else { return false };
        let named = |stream: Reuse| match order.others {
            _ if Some(stream) == order.reuse => true,
            OtherStreams::None => false,
            OtherStreams::One(key) => stream == (device, key),
            OtherStreams::Many => stream.0 == device,
        };
        self.unrecorded.iter().any(|u| named(u.stream))
    }

    /// Adds to `out` the events that complete once the work queued with no event on the streams
    /// `order` names has run (recorded now where work came since the last one).
    pub(super) fn order_done(&mut self, order: &Order, out: &mut Vec<Event<B>>) -> Result<()> {
        let Some(reuse) = order.reuse else { return Ok(()) };
        out.extend(self.unrecorded_done(reuse)?);
        self.for_each_other(order, |queues, stream| {
            out.extend(queues.unrecorded_done(stream)?);
            Ok(())
        })
    }

    /// Makes `target` wait for the work queued with no event on the streams `order` names, but
    /// its own.
    ///
    /// # Safety
    ///
    /// `target.handle` is live for this call.
    pub(super) unsafe fn wait_for_order(&mut self, order: &Order, target: &Target<B>) -> Result<()> {
        let own = target.as_reuse();
        let Some(reuse) = order.reuse else { return Ok(()) };
        if reuse != own {
            // SAFETY: the caller keeps the handle live.
            unsafe { self.wait_for_unrecorded(reuse, target) }?;
        }
        self.for_each_other(order, |queues, stream| {
            if stream == own {
                return Ok(());
            }
            // SAFETY: as above.
            unsafe { queues.wait_for_unrecorded(stream, target) }
        })
    }

    /// Makes `target` wait for the work queued with no event on `stream` so far, unless it did
    /// since that work was last recorded (then its own order covers it).
    ///
    /// # Safety
    ///
    /// `target.handle` is live for this call.
    pub(super) unsafe fn wait_for_unrecorded(&mut self, stream: Reuse, target: &Target<B>) -> Result<()> {
        let Some(event) = self.unrecorded_done(stream)? else {
            return Ok(());
        };
        let waiter = target.as_reuse();
        let Some(u) = self.unrecorded.iter_mut().find(|u| u.stream == stream) else {
            return Ok(());
        };
        if u.waited.contains(&waiter) {
            return Ok(());
        }
        #[cfg(test)]
        probe::WAITS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller keeps the handle live.
        unsafe { B::stream_wait_event(target.device, target.handle, event.raw()) }?;
        // Only a lasting stream is remembered: another's handle may name a new stream later.
        if target.lasting {
            u.waited.push(waiter);
        }
        Ok(())
    }
}

/// Waits for the work queued with no event on the streams of `device`: before memory that work
/// may use goes back to the device (a raw block of a pool, see
/// [`RawAllocator::WAITS_FOR_QUEUED_WORK`](crate::pool::RawAllocator::WAITS_FOR_QUEUED_WORK)).
/// Other work on the memory is kept alive by what it keeps, so a block it uses is not free. Waits
/// on events, not on the device: another stream may be capturing, which a device-wide wait would
/// break. Never called from a host function (the caller defers).
///
/// # Errors
///
/// The runtime's error recording or waiting for an event.
pub(crate) fn wait_unrecorded<B: StreamRuntime>(device: DeviceId) -> Result<()> {
    // Not an operation's cost: a release may run on any thread (deferred from a host function, it
    // runs on the next thread that queues work), so the cost tests do not count its events.
    #[cfg(test)]
    let counted_before = probe::EVENTS.with(std::cell::Cell::get);
    let events = {
        let mut entries = counted(B::stream_globals().inflight.entries.lock());
        let streams: Vec<Reuse> =
            entries.unrecorded.iter().map(|u| u.stream).filter(|s| s.0 == device).collect();
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            events.extend(entries.unrecorded_done(stream)?);
        }
        events
    };
    #[cfg(test)]
    probe::EVENTS.with(|n| n.set(counted_before));
    for event in events {
        event.synchronize()?;
    }
    Ok(())
}

/// The events that complete once the work queued with no event on the streams of `device` that
/// `others` names has run (recorded now where work came since the last one): what a chunk those
/// streams used goes back behind when its own stream cannot wait for them. Never called from a
/// host function.
///
/// # Errors
///
/// The runtime's error recording an event.
pub(crate) fn others_done<B: StreamRuntime>(
    device: DeviceId,
    owner: ArenaKey,
    others: OtherStreams,
) -> Result<Vec<Event<B>>> {
    let mut entries = counted(B::stream_globals().inflight.entries.lock());
    let mut events = Vec::new();
    // The owner's own work needs no waiting for: the pool orders the chunk's reuse on it.
    let order = Order { reuse: Some((device, owner)), others };
    entries.for_each_other(&order, |queues, stream| {
        if stream != (device, owner) {
            events.extend(queues.unrecorded_done(stream)?);
        }
        Ok(())
    })?;
    Ok(events)
}

/// Forgets the work queued with no event on stream `stream`, which is about to be destroyed (or
/// given up); `true` when there was such work, or entries of the stream wait, which the caller
/// then waits for first: the stream's arena (keyed by its handle) may serve a new stream with the
/// same handle, whose work the pool does not order after the old stream's, and the entries of a
/// lasting stream are released as one stream's (see [`collect`](super::collect)).
pub(crate) fn forget_stream<B: StreamRuntime>(stream: Reuse) -> bool {
    let (removed, queued) = {
        let mut entries = counted(B::stream_globals().inflight.entries.lock());
        let queued = entries.by_stream.get(&stream.1).is_some_and(|q| !q.is_empty());
        let at = entries.unrecorded.iter().position(|u| u.stream == stream);
        // A new stream may get the handle: it has waited for nothing.
        entries.unrecorded.iter_mut().for_each(|u| u.waited.retain(|w| *w != stream));
        (at.map(|i| entries.unrecorded.swap_remove(i)), queued)
    };
    removed.is_some() || queued
}
