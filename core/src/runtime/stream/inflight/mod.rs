//! What queued work and captured graphs keep alive: gpumem's ownership model.
//!
//! Every asynchronous operation the typed layer queues keeps alive what it touches (the memory
//! behind a [`MemoryPointer`](crate::MemoryPointer), a pinned buffer) until its stream has passed
//! it: the operation's [`Keep`]s go into an entry with an event recorded behind the operation, and
//! the entry is released once the event has completed (seen by [`collect`], which runs on every
//! asynchronous operation, every `synchronize`, and before the pool grows). While a stream
//! captures, the operation's keeps go to the capture instead, and then to its
//! [`Graph`](crate::Graph), which holds them until it is dropped (after its queued replays). So
//! dropping the last user-visible handle never frees, or lends again, bytes that queued work or a
//! live graph can still reach.
//!
//! Each entry also records the byte ranges the operation touches. A synchronous operation waits
//! for the queued operations on overlapping bytes first, and an asynchronous one on another
//! stream is ordered after them (the stream waits for their event), so two accesses to the same
//! bytes through gpumem never race: gpumem adds this ordering where CuPy leaves it to the
//! program. The ordering holds across threads because it is decided and made visible under one
//! lock: an asynchronous operation is queued and entered while it holds the entries' lock, and a
//! synchronous access marks its ranges busy for as long as it runs (see [`access`]), so an
//! operation another thread queues meanwhile on the same bytes waits for it to end. Memory reached
//! only through raw addresses (a kernel of the program's own) is kept with
//! [`MemoryPointer::record_stream`](crate::MemoryPointer::record_stream).
//!
//! Work on memory of its own stream is the exception: a pool chunk allocated on the stream the
//! operation is queued on ([`BaseMemory::reuse_stream`]), when that stream lasts (gpumem owns it,
//! or it is the null or legacy stream) and does not capture. Such an operation keeps nothing and
//! records no event; the stream is only noted as having work with no event (`Unrecorded`). That
//! is sound because nothing else can reach the chunk before that work has run:
//! - after its free the pool lends the chunk again only to the same stream's later work (another
//!   stream borrows it only after waiting for this one, see `pools::share`);
//! - a raw block goes back to the device only after [`wait_unrecorded`];
//! - an owned stream waits for its work before it is destroyed or given up ([`forget_stream`]),
//!   since its arena, keyed by its handle, may serve a new stream with the same handle;
//! - whatever else touches the memory (a synchronous access, another stream's operation, a
//!   graph launched elsewhere) first waits for an event recorded then on the chunk's stream,
//!   which covers everything queued there so far; a capture records one before it begins.
//!
//! The noting is done under the same lock as everything else here, so the ordering still holds
//! across threads.
//!
//! Work on a pool chunk of another stream of the same device, queued on a lasting stream that
//! does not capture, goes the same way: it keeps nothing and records no event, and the chunk
//! notes the stream ([`BaseMemory::note_other_stream`]) under the same lock. Whatever else touches
//! the chunk waits for the noted streams as for its own ([`Order`]: a synchronous access, another
//! stream's operation, the chunk's own stream, a graph launch, which asks for the orders of its
//! memory at each launch); the chunk's free puts it behind a fence on the noted streams' work
//! (see [`PooledMemory::note_other_stream`](crate::pool::PooledMemory::note_other_stream)), so it
//! is lent again only once that work has run; and its raw block goes back only after
//! [`wait_unrecorded`], which covers the noted streams of its device.
//!
//! A stream that joined a gpumem capture through an event (a fork) captures into the same graph:
//! what its work touches goes to that graph too, found by the capture's id
//! ([`GraphOps::capture_id`](crate::hal::GraphOps::capture_id)). A capture gpumem did not begin
//! (a foreign library's, or one on a backend that cannot name its captures) cannot hand what it
//! keeps to a graph gpumem knows: those keeps are held until the process ends (safe, at the price
//! of the memory).

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use crate::error::Result;
use crate::hal::{CaptureStatus, DeviceId, EventFlags};
use crate::pool::ArenaKey;
use crate::runtime::memory::BaseMemory;
use crate::runtime::stream::callback::HostFnData;
use crate::runtime::stream::event::Event;
use crate::runtime::stream::StreamRuntime;

mod unrecorded;

use unrecorded::Unrecorded;
pub(crate) use unrecorded::{forget_stream, others_done, wait_unrecorded, Order, Reuse};

/// What the ownership model costs the calling thread, counted for the tests that measure it
/// (`stream::tests`): the acquisitions of its process-wide locks and the events it records.
#[cfg(test)]
pub(crate) mod probe {
    use std::cell::Cell;

    thread_local! {
        pub(crate) static LOCKS: Cell<u64> = const { Cell::new(0) };
        pub(crate) static EVENTS: Cell<u64> = const { Cell::new(0) };
        pub(crate) static WAITS: Cell<u64> = const { Cell::new(0) };
    }

    /// Device-side waits for work queued with no event, made by the calling thread so far.
    pub(crate) fn waits() -> u64 {
        WAITS.with(Cell::get)
    }

    /// (process-wide locks taken, events recorded) by the calling thread so far.
    pub(crate) fn counts() -> (u64, u64) {
        (LOCKS.with(Cell::get), EVENTS.with(Cell::get))
    }
}

/// `guard`, a process-wide lock of the registry just taken, counted for the tests.
#[inline]
fn counted<T>(guard: T) -> T {
    #[cfg(test)]
    probe::LOCKS.with(|n| n.set(n.get() + 1));
    guard
}

/// Something queued work keeps alive until it is done: device memory (held as it is, so keeping
/// it costs no allocation, and a capture can find it again), or anything else.
pub(crate) enum Keep<B: StreamRuntime> {
    Memory(Arc<dyn BaseMemory<B>>),
    Other(Arc<dyn Any + Send + Sync>),
}

/// What one operation keeps: two things held inline (a copy keeps its source and destination),
/// any more in a `Vec`, so that the common operation allocates nothing for them.
struct Keeps<B: StreamRuntime> {
    inline: [Option<Keep<B>>; 2],
    more: Vec<Keep<B>>,
}

impl<B: StreamRuntime> Keeps<B> {
    fn new(keeps: impl IntoIterator<Item = Keep<B>>) -> Self {
        let mut kept = Keeps { inline: [None, None], more: Vec::new() };
        for keep in keeps {
            match kept.inline.iter_mut().find(|slot| slot.is_none()) {
                Some(slot) => *slot = Some(keep),
                None => kept.more.push(keep),
            }
        }
        kept
    }

    fn into_iter(self) -> impl Iterator<Item = Keep<B>> {
        self.inline.into_iter().flatten().chain(self.more)
    }
}

/// A byte range `[start, end)` an operation touches.
pub(crate) type Range = (usize, usize);

/// The ranges of one operation: up to two inline (an empty range, `(0, 0)`, overlaps nothing),
/// more (a graph's) in a `Vec`.
enum Ranges {
    Few([Range; 2]),
    Many(Vec<Range>),
}

impl Ranges {
    fn new(ranges: &[Range]) -> Self {
        match *ranges {
            [] => Ranges::Few([(0, 0); 2]),
            [a] => Ranges::Few([a, (0, 0)]),
            [a, b] => Ranges::Few([a, b]),
            _ => Ranges::Many(ranges.to_vec()),
        }
    }

    fn as_slice(&self) -> &[Range] {
        match self {
            Ranges::Few(few) => few,
            Ranges::Many(many) => many,
        }
    }
}

/// The stream an operation is queued on: its handle, the device it runs in, and its identity
/// (its arena key: per-thread default streams differ per thread).
#[derive(Debug)]
pub(crate) struct Target<B: StreamRuntime> {
    pub(crate) handle: B::Stream,
    pub(crate) device: DeviceId,
    pub(crate) identity: ArenaKey,
    /// The stream outlives the work queued on it, as far as gpumem can tell, and any thread can
    /// queue on its handle: a stream gpumem owns (it waits for the stream's work before destroying
    /// it, see [`forget_stream`]) or the null or legacy stream. Work on it may go without an event
    /// (see [`Queueing::finish`]); not on a foreign stream (its owner may destroy it and a new
    /// stream take its handle, and so its arena) nor on a per-thread default stream (other
    /// threads cannot name it).
    pub(crate) lasting: bool,
}

impl<B: StreamRuntime> Target<B> {
    /// The stream as memory names the stream that orders its reuse.
    fn as_reuse(&self) -> Reuse {
        (self.device, self.identity)
    }
}

impl<B: StreamRuntime> Clone for Target<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: StreamRuntime> Copy for Target<B> {}

struct Entry<B: StreamRuntime> {
    event: Event<B>,
    keeps: Keeps<B>,
    ranges: Ranges,
    /// Queued on a lasting stream ([`Target::lasting`]): one whose handle no other stream takes
    /// while its entries wait (an owned stream waits for them before it is destroyed).
    lasting: bool,
}

/// The entries of each stream in queueing order. A stream's events complete in that order, so
/// releasing what finished looks at the front of each queue only, and an operation on one stream
/// scans the other streams' queues only.
struct Queues<B: StreamRuntime> {
    by_stream: HashMap<ArenaKey, VecDeque<Entry<B>>>,
    len: usize,
    /// The ranges of the synchronous accesses running now, by an id of each.
    busy: Vec<(u64, Vec<Range>)>,
    next_access: u64,
    /// Events of released entries, for the next ones (under the same lock, so that queueing an
    /// operation takes one lock).
    spare: Vec<Event<B>>,
    /// The streams with work queued on their own memory with no event (one each: a handful).
    unrecorded: Vec<Unrecorded<B>>,
}

impl<B: StreamRuntime> Queues<B> {
    /// An event for `device`: a spare one, or a new one.
    fn event_for(&mut self, device: DeviceId) -> Result<Event<B>> {
        #[cfg(test)]
        probe::EVENTS.with(|n| n.set(n.get() + 1));
        match self.spare.iter().position(|e| e.device_id() == device) {
            Some(i) => Ok(self.spare.swap_remove(i)),
            None => {
                Event::with_flags_on(device, EventFlags { disable_timing: true, ..EventFlags::default() })
            }
        }
    }

    fn all(&self) -> impl Iterator<Item = &Entry<B>> {
        self.by_stream.values().flatten()
    }

    /// The events of the queued operations (of the streams `streams` accepts) on bytes of
    /// `ranges`.
    fn overlapping(&self, ranges: &[Range], streams: impl Fn(&ArenaKey) -> bool) -> Vec<Event<B>> {
        self.by_stream
            .iter()
            .filter(|(stream, _)| streams(stream))
            .flat_map(|(_, queue)| queue)
            .filter(|e| any_overlap(e.ranges.as_slice(), ranges))
            .map(|e| e.event.clone())
            .collect()
    }

    fn is_busy(&self, ranges: &[Range]) -> bool {
        self.busy.iter().any(|(_, busy)| any_overlap(busy, ranges))
    }
}

/// How many entries may wait before an operation being queued releases the finished ones
/// (`synchronize`, a pool about to grow and a synchronous access on the same bytes release them
/// at once); more while work runs far behind (see `InFlight::collect_at`). Asking the runtime
/// about events on every operation would cost a query each, and each release asks a few (a
/// binary search of a stream's queue): at 16, eager operations on another stream's memory cost
/// 0.61-0.85 µs over the raw call and an event record on an H100, at 256 0.18-0.32 µs
/// (BENCHMARKS.md, "Stream safety"). What waits is released no later than before where memory
/// is short: the pool releases it before it grows.
const COLLECT_AT: usize = 256;

/// What a capture begun by gpumem collects for its graph.
pub(crate) struct CaptureRecord<B: StreamRuntime> {
    pub(crate) keeps: Vec<Arc<dyn Any + Send + Sync>>,
    /// The device memory the captured work touches, once each, by address of its shared object.
    pub(crate) memory: HashMap<usize, CapturedMemory<B>>,
    pub(crate) host_fns: Vec<Arc<HostFnData>>,
    pub(crate) ranges: Vec<Range>,
    /// Another stream joined the capture: from then on the capture lends nothing again (that
    /// stream's later work is not ordered after the origin's earlier work).
    forked: bool,
}

impl<B: StreamRuntime> Default for CaptureRecord<B> {
    fn default() -> Self {
        CaptureRecord {
            keeps: Vec::new(),
            memory: HashMap::new(),
            host_fns: Vec::new(),
            ranges: Vec::new(),
            forked: false,
        }
    }
}

/// Device memory a capture touches: held for the graph, and whether only the stream that began
/// the capture touched it (then the capture may lend it again, see [`reuse_in_capture`]).
pub(crate) struct CapturedMemory<B: StreamRuntime> {
    mem: Arc<dyn BaseMemory<B>>,
    only_origin: bool,
}

impl<B: StreamRuntime> CaptureRecord<B> {
    /// What orders reusing the captured memory, once each, as it stands now: a launch waits for
    /// the work queued on it with no event, on the streams whose order covers its reuse and on
    /// the other streams noted since (see [`Order`]).
    pub(crate) fn orders(&self) -> Vec<Order> {
        let mut orders: Vec<Order> = Vec::new();
        for m in self.memory.values() {
            let device = m.mem.device_id();
            let reuse = m.mem.reuse_stream().map(|key| (device, key));
            let order = Order { reuse, others: m.mem.other_streams() };
            if reuse.is_some() && !orders.contains(&order) {
                orders.push(order);
            }
        }
        orders
    }

    /// What the record holds for the graph, in all.
    pub(crate) fn n_kept(&self) -> usize {
        self.keeps.len() + self.memory.len()
    }

    /// Adds what an operation captured on `stream` keeps; `origin` is the stream that began the
    /// capture.
    fn add(&mut self, keeps: Keeps<B>, ranges: &[Range], stream: ArenaKey, origin: ArenaKey) {
        for keep in keeps.into_iter() {
            let mem = match keep {
                Keep::Memory(mem) => mem,
                Keep::Other(other) => {
                    self.keeps.push(other);
                    continue;
                }
            };
            let address = Arc::as_ptr(&mem).cast::<()>().addr();
            let on_origin = stream == origin;
            self.memory
                .entry(address)
                .and_modify(|m| m.only_origin &= on_origin)
                .or_insert(CapturedMemory { mem, only_origin: on_origin });
        }
        self.ranges.extend(ranges.iter().filter(|r| r.0 < r.1));
    }
}

/// The captures gpumem began: their records by the identity of the stream that began them, and
/// that stream by the capture's id (where the backend names its captures).
pub(crate) struct Captures<B: StreamRuntime> {
    by_stream: HashMap<ArenaKey, Mutex<CaptureRecord<B>>>,
    by_id: HashMap<u64, ArenaKey>,
}

impl<B: StreamRuntime> Default for Captures<B> {
    fn default() -> Self {
        Captures { by_stream: HashMap::new(), by_id: HashMap::new() }
    }
}

impl<B: StreamRuntime> Captures<B> {
    /// The record the work of `target` goes to, when it is capturing into a capture gpumem began:
    /// its own, or (for a stream that joined one) that of the stream that began it. The second
    /// value says whether `target` is capturing at all.
    ///
    /// # Safety
    ///
    /// `target.handle` is live for this call.
    unsafe fn of(&self, target: &Target<B>) -> (Option<ArenaKey>, bool) {
        if self.by_stream.contains_key(&target.identity) {
            return (Some(target.identity), true);
        }
        // SAFETY: the caller keeps the handle live.
        let status = unsafe { B::capture_status(target.device, target.handle) };
        if !matches!(status, Ok(CaptureStatus::Active)) {
            return (None, false);
        }
        // SAFETY: as above.
        let id = unsafe { B::capture_id(target.device, target.handle) }.ok().flatten();
        (id.and_then(|id| self.by_id.get(&id).copied()), true)
    }
}

/// The per-backend state of the ownership model (in the backend's globals).
pub(crate) struct InFlight<B: StreamRuntime> {
    entries: Mutex<Queues<B>>,
    /// Signalled when a synchronous access ends (its ranges are no longer busy).
    access_ended: Condvar,
    n_entries: AtomicUsize,
    /// The number of entries at which the next asynchronous operation releases the finished ones:
    /// [`COLLECT_AT`], or twice what the last release left waiting. Work that runs behind by many
    /// operations then costs a release (a lock and an event query) every so often, not on every
    /// operation, and keeps at most twice what it keeps anyway.
    collect_at: AtomicUsize,
    /// The captures gpumem began. Asynchronous operations take the read lock while they queue
    /// and keep, `begin_capture`/`end_capture` the write lock, so an operation is kept by the
    /// capture it was captured into, never by an event recorded inside it.
    captures: RwLock<Captures<B>>,
    n_captures: AtomicUsize,
    /// Keeps of captures gpumem did not begin: held for good.
    orphans: Mutex<Vec<Keep<B>>>,
}

impl<B: StreamRuntime> InFlight<B> {
    pub(crate) fn new() -> Self {
        InFlight {
            entries: Mutex::new(Queues {
                by_stream: HashMap::new(),
                len: 0,
                busy: Vec::new(),
                next_access: 0,
                spare: Vec::new(),
                unrecorded: Vec::new(),
            }),
            access_ended: Condvar::new(),
            n_entries: AtomicUsize::new(0),
            collect_at: AtomicUsize::new(COLLECT_AT),
            captures: RwLock::new(Captures::default()),
            n_captures: AtomicUsize::new(0),
            orphans: Mutex::new(Vec::new()),
        }
    }
}

fn overlaps(a: Range, b: Range) -> bool {
    a.0 < b.1 && b.0 < a.1 && a.0 < a.1 && b.0 < b.1
}

fn any_overlap(a: &[Range], b: &[Range]) -> bool {
    a.iter().any(|r| b.iter().any(|q| overlaps(*r, *q)))
}

/// Locks the entries once no synchronous access runs on bytes of `ranges`.
///
/// # Errors
///
/// `NotAllowedInCallback` when one runs and this is a host function: the access may be waiting
/// for the very stream that runs it.
fn lock_when_free<B: StreamRuntime>(
    ranges: &[Range],
    operation: &'static str,
) -> Result<MutexGuard<'static, Queues<B>>> {
    let inflight = &B::stream_globals().inflight;
    let mut entries = counted(inflight.entries.lock());
    while entries.is_busy(ranges) {
        if crate::runtime::state::in_callback() {
            return Err(crate::Error::NotAllowedInCallback { operation });
        }
        inflight.access_ended.wait(&mut entries);
    }
    Ok(entries)
}

/// An asynchronous operation being queued: holds the capture registry's read lock from before
/// the operation is queued until what it touches is kept.
pub(crate) struct Queueing<'a, B: StreamRuntime> {
    target: Target<B>,
    captures: Option<RwLockReadGuard<'a, Captures<B>>>,
    /// The entries, locked from the ordering decision until the operation's entry is in them
    /// (when the operation touches bytes and runs), so no access of another thread comes between.
    entries: Option<MutexGuard<'a, Queues<B>>>,
    /// The stream is capturing (gpumem's capture or a foreign one).
    capturing: bool,
    /// The record of gpumem's capture the operation goes to (by the identity of the stream that
    /// began it); `None` for a foreign capture.
    record: Option<ArenaKey>,
}

/// Prepares an asynchronous operation on `target` touching `ranges` of memory whose reuse
/// `orders` gives (one [`Order`] for each piece of memory): takes the capture lock, and orders the
/// stream after queued operations of other streams on overlapping bytes, and after the work
/// other streams queued with no event on that memory. Returns the orders too, asked under the
/// entries' lock (another thread's operation on the same memory notes its stream under it), for
/// [`Queueing::finish`].
///
/// # Safety
///
/// `target.handle` is live for as long as the returned value.
pub(crate) unsafe fn begin<B: StreamRuntime, O: AsRef<[Order]>>(
    target: Target<B>,
    ranges: &[Range],
    orders: impl FnOnce() -> O,
) -> Result<(Queueing<'static, B>, O)> {
    let inflight = &B::stream_globals().inflight;
    if inflight.n_entries.load(Ordering::Relaxed) >= inflight.collect_at.load(Ordering::Relaxed) {
        collect::<B>();
    } else if !crate::runtime::state::in_callback() {
        crate::runtime::state::run_deferred::<B>();
    }
    let captures = (B::CAPS.capture && inflight.n_captures.load(Ordering::Acquire) > 0)
        .then(|| counted(inflight.captures.read_recursive()));
    let (record, capturing) = match &captures {
        // SAFETY: the caller keeps the handle live.
        Some(map) => unsafe { map.of(&target) },
        None => (None, false),
    };
    let mut entries = None;
    let orders = if !capturing && !ranges.is_empty() {
        let mut locked = lock_when_free::<B>(ranges, "queueing work on bytes a synchronous access is using")?;
        for event in locked.overlapping(ranges, |stream| *stream != target.identity) {
            // SAFETY: the caller keeps the handle live.
            unsafe { B::stream_wait_event(target.device, target.handle, event.raw()) }?;
        }
        let orders = orders();
        for order in orders.as_ref() {
            // SAFETY: as above.
            unsafe { locked.wait_for_order(order, &target) }?;
        }
        entries = Some(locked);
        orders
    } else {
        orders()
    };
    Ok((Queueing { target, captures, capturing, entries, record }, orders))
}

impl<B: StreamRuntime> Queueing<'_, B> {
    /// Ends the operation just queued, which touched `ranges` of memory whose reuse `orders`
    /// gives (as [`begin`] returned them). When all of it is memory whose reuse a stream of the
    /// operation's device orders (a pool's chunk), and the operation's stream lasts and does not
    /// capture, it keeps nothing and records no event:
    /// - memory of the operation's own stream is lent again only to that stream's later work, and
    ///   freed only after the device's work;
    /// - memory of another stream is told of this one (`note`, given the stream's arena key, which
    ///   notes it on every such piece of memory and returns `false` when one cannot be), and its
    ///   free then goes behind a fence on this one's work (see
    ///   [`PooledMemory::note_other_stream`](crate::pool::PooledMemory::note_other_stream)).
    ///
    /// Either way the stream is only noted, for the operations of other streams and the
    /// synchronous accesses that must wait for it. Otherwise the operation keeps what `keeps`
    /// gives (see [`Queueing::keep`]).
    ///
    /// # Errors
    ///
    /// As [`Queueing::keep`].
    pub(crate) fn finish<K: IntoIterator<Item = Keep<B>>>(
        mut self,
        ranges: &[Range],
        orders: &[Order],
        note: impl FnOnce(ArenaKey) -> bool,
        keeps: impl FnOnce() -> K,
    ) -> Result<()> {
        let own = self.target.as_reuse();
        let of_device = |o: &Order| o.reuse.is_some_and(|r| r.0 == own.0);
        if self.target.lasting && !self.capturing && !orders.is_empty() && orders.iter().all(of_device) {
            self.captures = None;
            let inflight = &B::stream_globals().inflight;
            let mut entries = self.entries.take().unwrap_or_else(|| counted(inflight.entries.lock()));
            // Noted under the entries' lock: an operation another thread queues on the same
            // memory asks for its orders under it, after this one's.
            if orders.iter().all(|o| o.reuse == Some(own)) || note(own.1) {
                entries.note_unrecorded(&self.target);
                return Ok(());
            }
            self.entries = Some(entries);
        }
        self.keep(keeps(), ranges)
    }

    /// Keeps `keeps` until the stream has passed the operation just queued (or, while the stream
    /// captures, until the graph is dropped).
    ///
    /// # Errors
    ///
    /// The runtime's error recording the event. The keeps are then held for good (the operation
    /// was queued, and nothing tells when it is done).
    pub(crate) fn keep(self, keeps: impl IntoIterator<Item = Keep<B>>, ranges: &[Range]) -> Result<()> {
        let inflight = &B::stream_globals().inflight;
        let keeps = Keeps::new(keeps);
        if self.capturing {
            let record =
                self.record.and_then(|r| self.captures.as_ref().and_then(|map| map.by_stream.get(&r)));
            match record {
                Some(record) => {
                    let origin = self.record.unwrap_or(self.target.identity);
                    record.lock().add(keeps, ranges, self.target.identity, origin);
                }
                None => counted(inflight.orphans.lock()).extend(keeps.into_iter()),
            }
            return Ok(());
        }
        drop(self.captures);
        // One lock from the ordering decision (or from here, for an operation on no bytes) until
        // the entry is in: the spare event is taken and recorded under it.
        let mut entries = self.entries.unwrap_or_else(|| counted(inflight.entries.lock()));
        let device = self.target.device;
        let event = entries.event_for(device);
        let recorded = event.and_then(|event| {
            // SAFETY: the caller of `begin` keeps the handle live while `self` exists.
            unsafe { B::event_record(device, event.raw(), self.target.handle) }.map(|()| event)
        });
        let event = match recorded {
            Ok(event) => event,
            Err(e) => {
                drop(entries);
                // The operation was queued, and nothing tells when it is done: held for good.
                counted(inflight.orphans.lock()).extend(keeps.into_iter());
                return Err(e);
            }
        };
        let ranges = Ranges::new(ranges);
        entries.by_stream.entry(self.target.identity).or_default().push_back(Entry {
            event,
            keeps,
            ranges,
            lasting: self.target.lasting,
        });
        entries.len += 1;
        inflight.n_entries.store(entries.len, Ordering::Release);
        Ok(())
    }
}

/// Releases what completed work kept, and runs drops deferred from callbacks. Never called from
/// a callback (it may free memory, which the runtimes refuse there).
pub(crate) fn collect<B: StreamRuntime>() {
    if crate::runtime::state::in_callback() {
        return;
    }
    let inflight = &B::stream_globals().inflight;
    if inflight.n_entries.load(Ordering::Acquire) > 0 {
        // What finished work kept, and the events beyond the spare ones kept: dropped outside
        // the lock (a drop may free memory or destroy an event).
        let mut surplus: Vec<Event<B>> = Vec::new();
        let released = {
            let mut entries = counted(inflight.entries.lock());
            let mut released: Vec<Keeps<B>> = Vec::with_capacity(entries.len);
            let queues = &mut *entries;
            // A stream's events complete in order, so the finished entries are a prefix of its
            // queue: found with a binary search, a few queries however many entries wait (the
            // work usually runs a little behind, so the newest has not finished). That holds when
            // every entry is of one stream, which only lasting streams guarantee: a foreign
            // stream's handle may have passed to a new stream since. Otherwise a pass asks once
            // per finished entry and once more.
            queues.by_stream.retain(|_, queue| {
                // (The null and legacy streams of two devices share a key: the device tells.)
                let device = queue.back().map(|e| e.event.device_id());
                let one_stream = queue.iter().all(|e| e.lasting && Some(e.event.device_id()) == device);
                let done = |e: &Entry<B>| e.event.query().unwrap_or(false);
                let mut finished = if one_stream { finished_prefix(queue, done) } else { 0 };
                while finished > 0 || (!one_stream && queue.front().is_some_and(done)) {
                    finished = finished.saturating_sub(1);
                    if let Some(entry) = queue.pop_front() {
                        released.push(entry.keeps);
                        if queues.spare.len() < SPARE_EVENTS {
                            queues.spare.push(entry.event);
                        } else {
                            surplus.push(entry.event);
                        }
                    }
                }
                !queue.is_empty()
            });
            queues.len -= released.len();
            inflight.n_entries.store(queues.len, Ordering::Release);
            inflight.collect_at.store(COLLECT_AT.max(queues.len.saturating_mul(2)), Ordering::Relaxed);
            released
        };
        drop(released);
        drop(surplus);
    }
    crate::runtime::state::run_deferred::<B>();
}

/// How many entries at the front of `queue` are done, by a binary search with `done` (which holds
/// for a prefix of the queue).
pub(super) fn finished_prefix<T>(queue: &VecDeque<T>, done: impl Fn(&T) -> bool) -> usize {
    // Invariant: the first `low` entries are done, those from `high` on are not.
    let (mut low, mut high) = (0, queue.len());
    while low < high {
        let mid = low + (high - low) / 2;
        if done(&queue[mid]) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    low
}

/// At most this many events of released entries are kept for the next entries.
const SPARE_EVENTS: usize = 256;

/// After a successful `synchronize` of a stream: what its finished work kept goes. Each entry's
/// own event decides (not the stream's identity: a destroyed stream's handle value may be a new
/// stream's, and the old stream's work is not covered by the new one's synchronize).
pub(crate) fn stream_done<B: StreamRuntime>() {
    collect::<B>();
}

/// Runs `f`, a synchronous access to the bytes of `ranges` (of memory whose reuse `orders`
/// gives, asked under the entries' lock), after the queued operations (of every stream) that
/// touch them and the work queued with no event on the streams the orders name, and with the
/// ranges busy while it runs: an operation another thread queues on them, or another
/// synchronous access, waits until `f` has returned.
///
/// # Errors
///
/// The runtime's error waiting for an event; `NotAllowedInCallback` when this is a host function
/// and the bytes are in use; `f`'s error.
pub(crate) fn access<B: StreamRuntime, T, O: AsRef<[Order]>>(
    ranges: &[Range],
    orders: impl FnOnce() -> O,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let operation = "waiting for queued work on the same bytes";
    let (busy, waits) = {
        let mut entries = lock_when_free::<B>(ranges, operation)?;
        let mut waits = entries.overlapping(ranges, |_| true);
        let in_callback = crate::runtime::state::in_callback();
        for order in orders().as_ref() {
            // A host function records no event: work queued with no event there is refused as
            // queued work is.
            if in_callback && entries.has_unrecorded_of(order) {
                return Err(crate::Error::NotAllowedInCallback { operation });
            }
            entries.order_done(order, &mut waits)?;
        }
        if !waits.is_empty() && in_callback {
            return Err(crate::Error::NotAllowedInCallback { operation });
        }
        let id = entries.next_access;
        entries.next_access += 1;
        entries.busy.push((id, ranges.to_vec()));
        (Busy::<B> { id, _backend: std::marker::PhantomData }, waits)
    };
    for event in waits {
        event.synchronize()?;
    }
    collect::<B>();
    let result = f();
    drop(busy);
    result
}

/// A synchronous access's ranges, busy until dropped.
struct Busy<B: StreamRuntime> {
    id: u64,
    _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: StreamRuntime> Drop for Busy<B> {
    fn drop(&mut self) {
        let inflight = &B::stream_globals().inflight;
        counted(inflight.entries.lock()).busy.retain(|(id, _)| *id != self.id);
        inflight.access_ended.notify_all();
    }
}

/// Waits for every queued operation gpumem keeps memory for, then releases it: the pool's last
/// resort before it reports out of memory. Does nothing inside a callback.
pub(crate) fn wait_all<B: StreamRuntime>() {
    if crate::runtime::state::in_callback() {
        return;
    }
    let events: Vec<Event<B>> =
        counted(B::stream_globals().inflight.entries.lock()).all().map(|e| e.event.clone()).collect();
    for e in events {
        // A failed wait (a lost device) leaves the entry for `collect` to judge.
        let _ = e.synchronize();
    }
    collect::<B>();
}

/// Registers a capture begun by gpumem on stream `identity`; `start` begins it in the runtime,
/// under the registry's write lock, and gives the capture's id where the backend names captures.
///
/// The work the stream queued with no event before the capture gets its event first: nothing
/// can be recorded on the stream while it captures, and graphs launched elsewhere may need it.
pub(crate) fn begin_capture<B: StreamRuntime>(
    device: DeviceId,
    identity: ArenaKey,
    start: impl FnOnce() -> Result<Option<u64>>,
) -> Result<()> {
    if crate::runtime::state::in_callback() {
        return Err(crate::Error::NotAllowedInCallback { operation: "begin_capture" });
    }
    let inflight = &B::stream_globals().inflight;
    let mut map = counted(inflight.captures.write());
    counted(inflight.entries.lock()).unrecorded_done((device, identity))?;
    let id = start()?;
    map.by_stream.insert(identity, Mutex::new(CaptureRecord::default()));
    if let Some(id) = id {
        map.by_id.insert(id, identity);
    }
    inflight.n_captures.store(map.by_stream.len(), Ordering::Release);
    Ok(())
}

/// Ends the capture on stream `identity`: `end` ends it in the runtime; its record goes to the
/// graph. The record is removed even when `end` fails (the capture is over either way), unless
/// `identity` did not begin it (the runtime refused the end, and the capture goes on).
pub(crate) fn end_capture<B: StreamRuntime, G>(
    identity: ArenaKey,
    end: impl FnOnce() -> Result<G>,
) -> Result<(G, CaptureRecord<B>)> {
    if crate::runtime::state::in_callback() {
        return Err(crate::Error::NotAllowedInCallback { operation: "end_capture" });
    }
    let inflight = &B::stream_globals().inflight;
    let mut map = counted(inflight.captures.write());
    let result = end();
    let record = map.by_stream.remove(&identity).map(Mutex::into_inner).unwrap_or_default();
    map.by_id.retain(|_, origin| *origin != identity);
    inflight.n_captures.store(map.by_stream.len(), Ordering::Release);
    drop(map);
    match result {
        Ok(graph) => Ok((graph, record)),
        Err(e) => {
            // What was captured never runs; release it outside the lock.
            drop(record);
            Err(e)
        }
    }
}

/// How a host function is queued on `target`: into gpumem's capture record (`Some`), into a
/// foreign capture (`None`, `true`), or to run once (`None`, `false`). Decided and acted on under
/// the capture lock, so a concurrent `begin_capture` cannot come between.
pub(crate) fn with_capture_of<B: StreamRuntime, T>(
    target: Target<B>,
    f: impl FnOnce(Option<&mut CaptureRecord<B>>, bool) -> Result<T>,
) -> Result<T> {
    let inflight = &B::stream_globals().inflight;
    if !B::CAPS.capture {
        return f(None, false);
    }
    let map = counted(inflight.captures.read_recursive());
    // SAFETY: `with_capture_of`'s callers pass a handle live for this call.
    let (record, capturing) = unsafe { map.of(&target) };
    match record.and_then(|r| map.by_stream.get(&r)) {
        Some(record) => f(Some(&mut record.lock()), true),
        None => f(None, capturing),
    }
}

/// Whether any capture begun by gpumem is under way (one relaxed load: the allocation path asks).
#[inline]
pub(crate) fn any_capture<B: StreamRuntime>() -> bool {
    B::CAPS.capture && B::stream_globals().inflight.n_captures.load(Ordering::Relaxed) > 0
}

/// A capture's own reuse of memory, as PyTorch's private graph pools: while `target` captures
/// (a capture gpumem began on that stream), memory of `size` bytes from pool `pool_uid` that the
/// capture touched on `target` alone and that nothing but the capture holds any more (its
/// pointers were dropped during the capture) is lent again, to the capture's later work. Every
/// replay runs the stream's work in the order it was captured, so the earlier uses are done
/// before the later ones start; the graph holds the memory either way until it is dropped, and
/// no work outside the capture is lent it.
pub(crate) fn reuse_in_capture<B: StreamRuntime>(
    target: &Target<B>,
    device: DeviceId,
    pool_uid: usize,
    size: usize,
) -> Option<Arc<dyn BaseMemory<B>>> {
    let map = counted(B::stream_globals().inflight.captures.read_recursive());
    let record = map.by_stream.get(&target.identity)?.lock();
    if record.forked {
        return None;
    }
    record.memory.values().filter(|m| m.only_origin).find_map(|m| {
        let mem = &m.mem;
        // Only the record holds it (under the record's lock nothing else can take a reference).
        let free = Arc::strong_count(mem) == 1;
        (free && mem.size() == size && mem.device_id() == device && mem.pool_uid() == Some(pool_uid))
            .then(|| Arc::clone(mem))
    })
}

/// After `target` waited for an event: if that made it join a capture gpumem began on another
/// stream (a fork), the capture stops lending memory again (see [`reuse_in_capture`]).
///
/// # Safety
///
/// `target.handle` is live for this call.
pub(crate) unsafe fn after_wait<B: StreamRuntime>(target: &Target<B>) {
    if !any_capture::<B>() {
        return;
    }
    let map = counted(B::stream_globals().inflight.captures.read_recursive());
    // SAFETY: the caller keeps the handle live.
    let (record, capturing) = unsafe { map.of(target) };
    match record {
        Some(origin) if origin != target.identity => {
            if let Some(record) = map.by_stream.get(&origin) {
                record.lock().forked = true;
            }
        }
        // Capturing into a capture gpumem cannot name: stop every capture's reuse, since this
        // stream may belong to any of them.
        None if capturing => map.by_stream.values().for_each(|r| r.lock().forked = true),
        _ => {}
    }
}

/// Holds `keep` for good: for what a foreign capture may reach.
pub(crate) fn keep_forever<B: StreamRuntime>(keep: Keep<B>) {
    counted(B::stream_globals().inflight.orphans.lock()).push(keep);
}
