//! Synchronous copies of pageable host memory through pinned staging buffers, in pipelined chunks.
//!
//! The runtimes copy pageable host memory through staging buffers of their own, one piece after
//! the other: CUDA's `cuMemcpy` of pageable memory reaches a fraction of what the same copy of
//! pinned memory does. For copies of at least a threshold of bytes, gpumem stages them itself:
//! the copy is cut into chunks, each lane (the calling thread and up to `lanes - 1` helper
//! threads scoped to the call) owns two buffers lent by the default
//! [`PinnedMemoryPool`](crate::PinnedMemoryPool), and it copies the next chunk into one buffer
//! while the other is transferred by an asynchronous copy on the legacy default stream; an event
//! recorded behind each transfer tells when its buffer may be refilled (host to device) or read
//! (device to host).
//!
//! What stays as it was:
//!
//! - The copy is done when the call returns, as CuPy's: every lane waits for its last transfer.
//! - Ordering: the synchronous copy first waits for the queued gpumem work on the same device
//!   bytes (the stream-safety rules), and the chunks run on the legacy default stream, as the
//!   direct copy does, so the legacy stream's implicit ordering with blocking streams holds.
//! - The bytes: each chunk is copied exactly, the last one short; device-to-host copies write the
//!   caller's memory from the calling process only (the runtime never writes pageable memory).
//! - Threads: each copy has buffers of its own from the pool, so copies on several threads at
//!   once do not share a buffer.
//! - Failure: when the pool cannot lend the buffers or an event cannot be made, the copy is the
//!   runtime's direct copy. If a transfer fails and the device cannot even be waited for, the
//!   buffers and the device memory are kept for good (a queued transfer may still reach them).
//!
//! How many lanes: every core up to four, beyond that half the cores, at most eight (so 8 on a
//! 16-core machine). Each lane copies at about what one thread's `memcpy` reaches; the cost is
//! up to `2 * lanes` chunks of pinned memory (32 MiB at eight lanes) that the pinned pool keeps
//! after the first staged copy, and `lanes - 1` threads for the duration of each copy.
//! [`PageableStaging::with_lanes`] sets another number, up to [`MAX_STAGING_LANES`]. A helper
//! thread that cannot be started leaves its lane to the calling thread.
//!
//! Which copies are staged: the thread's [`PageableStaging::enter`] scope, else the process's
//! [`set_pageable_staging`], else [`PAGEABLE_STAGING_ENV`], else the backend's default:
//! [`DEFAULT_STAGING_THRESHOLD`] bytes and up where the backend says staging can win
//! ([`MemoryOps::stages_pageable_copies`](crate::MemoryOps::stages_pageable_copies)), never on
//! the host backend (its device memory is host memory). Copies made inside a host function or
//! stream callback are never staged.

use std::cell::Cell;
use std::num::NonZeroUsize;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DevicePtr, EventFlags};
use crate::runtime::allocator::get_default_pinned_memory_pool;
use crate::runtime::pinned::PinnedMemoryPointer;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::statics::Runtime;
use crate::runtime::stream::event::Event;
use crate::runtime::stream::inflight;

/// The environment variable that sets which synchronous copies of pageable memory are staged:
/// `off` (never), `auto` (the backend's default), or the size in bytes from which copies are
/// staged, a byte size (`65536`, `64KiB`, `8MiB`, `1GiB`, `4MB`; [the forms](crate::env)).
/// Read once, at the first copy of pageable memory that asks.
pub const PAGEABLE_STAGING_ENV: &str = "GPUMEM_PAGEABLE_STAGING";

/// What [`PAGEABLE_STAGING_ENV`] accepts, as its error says.
const ENV_FORMS: &str =
    "off, auto, or the byte size from which copies are staged (65536, 64KiB, 8MiB, 1GiB, 4MB)";

/// The size from which copies are staged by default, where the backend says staging can win.
pub const DEFAULT_STAGING_THRESHOLD: usize = 4 << 20;

/// The default chunk: the most bytes one transfer moves. Smaller copies use smaller chunks (a
/// quarter of the copy, rounded down to a power of two, at least 64 KiB), so that they are still
/// cut into a few pipelined pieces.
pub const DEFAULT_STAGING_CHUNK: usize = 2 << 20;

/// The smallest chunk gpumem picks by itself (a chunk set explicitly may be smaller).
const MIN_AUTO_CHUNK: usize = 64 << 10;

/// The most lanes by default: each lane's memory copy runs at about a sixth of what a PCIe 5 or
/// NVLink-C2C link carries (6-7 GB/s per thread on the H200 machine, BENCHMARKS.md), so eight
/// lanes are what outrun the driver's own pageable device-to-host copy twice over.
const MAX_DEFAULT_LANES: usize = 8;

/// The most lanes [`PageableStaging::with_lanes`] accepts: far past where more lanes copy faster
/// (eight outrun the link), and few enough threads that starting them cannot exhaust the
/// process's threads (a copy on `usize::MAX` lanes aborted the process, starting one thread per
/// chunk).
pub const MAX_STAGING_LANES: usize = 64;

/// Staging buffers per lane: one is filled (or drained) while the other is transferred.
const DEPTH: usize = 2;

/// Which synchronous copies of pageable host memory go through pinned staging buffers, and how
/// they are cut. See the [module docs](self).
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{alloc, PageableStaging};
///
/// // Stage every copy on this thread, in 1000-byte chunks on 3 lanes (the host backend stages
/// // nothing by default).
/// let _scope = PageableStaging::from_size(0).with_chunk(1000)?.with_lanes(3)?.enter();
/// let p = alloc::<Host>(10_007)?;
/// let data: Vec<u8> = (0..10_007u32).map(|i| (i % 251) as u8).collect();
/// p.copy_from_host(&data, data.len())?;
/// let mut back = vec![0u8; data.len()];
/// p.copy_to_host(&mut back, data.len())?;
/// assert_eq!(back, data);
/// # Ok::<(), gpumem_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageableStaging {
    threshold: Option<usize>,
    chunk: usize,
    lanes: usize,
}

impl PageableStaging {
    /// No copy is staged: every one is the runtime's direct copy.
    #[must_use]
    pub fn off() -> Self {
        PageableStaging { threshold: None, chunk: DEFAULT_STAGING_CHUNK, lanes: default_lanes() }
    }

    /// Copies of at least `threshold` bytes are staged (0: every copy), with the default chunk
    /// and lanes.
    #[must_use]
    pub fn from_size(threshold: usize) -> Self {
        PageableStaging { threshold: Some(threshold), ..Self::off() }
    }

    /// The backend's default: [`DEFAULT_STAGING_THRESHOLD`] where
    /// [`stages_pageable_copies`](crate::MemoryOps::stages_pageable_copies) says staging can
    /// win, else off.
    #[must_use]
    pub fn backend_default<B: Runtime>() -> Self {
        if B::stages_pageable_copies() {
            Self::from_size(DEFAULT_STAGING_THRESHOLD)
        } else {
            Self::off()
        }
    }

    /// The same, with chunks of at most `chunk` bytes.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for 0.
    pub fn with_chunk(self, chunk: usize) -> Result<Self> {
        if chunk == 0 {
            return Err(Error::InvalidArgument("pageable staging: the chunk must be at least 1 byte".into()));
        }
        Ok(PageableStaging { chunk, ..self })
    }

    /// The same, on at most `lanes` threads (the calling one and `lanes - 1` helpers).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for 0 or more than [`MAX_STAGING_LANES`].
    pub fn with_lanes(self, lanes: usize) -> Result<Self> {
        if lanes == 0 {
            return Err(Error::InvalidArgument("pageable staging: at least one lane is needed".into()));
        }
        if lanes > MAX_STAGING_LANES {
            return Err(Error::InvalidArgument(format!(
                "pageable staging: {lanes} lanes asked for, at most {MAX_STAGING_LANES} are allowed"
            )));
        }
        Ok(PageableStaging { lanes, ..self })
    }

    /// The size from which copies are staged; `None`: never.
    #[must_use]
    pub fn threshold(&self) -> Option<usize> {
        self.threshold
    }

    /// The most bytes one transfer moves.
    #[must_use]
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The most threads one copy uses.
    #[must_use]
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Parses a value of [`PAGEABLE_STAGING_ENV`]: `Ok(None)` for `auto` (or nothing), which
    /// leaves the backend's default.
    ///
    /// # Errors
    ///
    /// `InvalidEnvironment` naming the variable, the value and the accepted forms.
    pub fn parse(value: &str) -> Result<Option<Self>> {
        let bad = || Error::InvalidEnvironment {
            variable: PAGEABLE_STAGING_ENV,
            value: value.to_owned(),
            expected: ENV_FORMS,
        };
        let text = value.trim();
        if text.is_empty() || text.eq_ignore_ascii_case("auto") {
            return Ok(None);
        }
        if text.eq_ignore_ascii_case("off") {
            return Ok(Some(Self::off()));
        }
        let bytes = crate::env::parse_byte_size(text).ok_or_else(bad)?;
        Ok(Some(Self::from_size(bytes)))
    }

    /// Reads [`PAGEABLE_STAGING_ENV`] now; `Ok(None)` when it is not set or says `auto`.
    ///
    /// # Errors
    ///
    /// As [`PageableStaging::parse`]; a value that is not Unicode is refused the same way.
    pub fn from_env() -> Result<Option<Self>> {
        match crate::env::read(PAGEABLE_STAGING_ENV, ENV_FORMS)? {
            Some(v) => Self::parse(&v),
            None => Ok(None),
        }
    }

    /// What a copy on this thread uses for backend `B`: the thread's scope, else the process's
    /// setting, else the variable (read once per process), else the backend's default.
    ///
    /// # Errors
    ///
    /// `InvalidEnvironment` when it comes to the variable and the variable is malformed.
    pub fn current<B: Runtime>() -> Result<Self> {
        if let Some(c) = SCOPE.with(Cell::get) {
            return Ok(c);
        }
        if let Some(c) = *PROCESS.read() {
            return Ok(c);
        }
        static ENV: OnceLock<Result<Option<PageableStaging>>> = OnceLock::new();
        match ENV.get_or_init(Self::from_env) {
            Ok(Some(c)) => Ok(*c),
            Ok(None) => Ok(Self::backend_default::<B>()),
            Err(e) => Err(e.clone()),
        }
    }

    /// How many synchronous copies of pageable memory the calling thread has staged, and how
    /// many it meant to stage but copied directly (the staging buffers could not be had): for
    /// tests and diagnostics.
    #[must_use]
    pub fn counts_on_this_thread() -> StagingCounts {
        COUNTS.try_with(Cell::get).unwrap_or_default()
    }

    /// Makes this the setting of the calling thread until the guard is dropped (scopes nest;
    /// dropping restores what was before).
    #[must_use = "the setting ends when the guard is dropped"]
    pub fn enter(self) -> PageableStagingGuard {
        let previous = SCOPE.with(|s| s.replace(Some(self)));
        PageableStagingGuard { previous, _thread: std::marker::PhantomData }
    }
}

/// What [`PageableStaging::counts_on_this_thread`] tells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagingCounts {
    /// Copies that went through staging buffers.
    pub staged: u64,
    /// Copies planned for staging that were copied directly, as no buffers could be had.
    pub direct: u64,
}

/// The scope of [`PageableStaging::enter`]: restores the thread's previous setting when dropped.
/// Bound to the thread that made it.
#[derive(Debug)]
pub struct PageableStagingGuard {
    previous: Option<PageableStaging>,
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for PageableStagingGuard {
    fn drop(&mut self) {
        // `try_with`: a guard dropped while the thread's locals are torn down has nothing left
        // to restore.
        let _ = SCOPE.try_with(|s| s.set(self.previous));
    }
}

/// Sets which copies are staged for the whole process and every backend (`None`: back to the
/// variable and the backends' defaults). A thread's [`PageableStaging::enter`] scope still
/// comes first on that thread.
pub fn set_pageable_staging(setting: Option<PageableStaging>) {
    *PROCESS.write() = setting;
}

thread_local! {
    static SCOPE: Cell<Option<PageableStaging>> = const { Cell::new(None) };
    static COUNTS: Cell<StagingCounts> = const { Cell::new(StagingCounts { staged: 0, direct: 0 }) };
}

#[cfg(test)]
thread_local! {
    /// Makes `acquire` find no buffers on this thread (the fallback's test).
    static REFUSE_BUFFERS: Cell<bool> = const { Cell::new(false) };
    /// Makes the transfer of this chunk of a lane on this thread fail (the failure's test).
    static FAIL_CHUNK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The injected failure of chunk `j`, in tests.
#[cfg(test)]
fn injected(j: usize) -> Result<()> {
    if FAIL_CHUNK.with(Cell::get) == Some(j) {
        return Err(Error::InvalidArgument("injected transfer failure".into()));
    }
    Ok(())
}

#[cfg(not(test))]
#[inline(always)]
fn injected(_: usize) -> Result<()> {
    Ok(())
}

fn count(f: impl FnOnce(&mut StagingCounts)) {
    let _ = COUNTS.try_with(|c| {
        let mut counts = c.get();
        f(&mut counts);
        c.set(counts);
    });
}

static PROCESS: RwLock<Option<PageableStaging>> = RwLock::new(None);

fn default_lanes() -> usize {
    static LANES: OnceLock<usize> = OnceLock::new();
    *LANES.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        // Every core up to four; beyond, half of them (leaving the others to the program), up
        // to the most.
        cores.min(4).max((cores / 2).min(MAX_DEFAULT_LANES))
    })
}

/// How one staged copy is cut.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    chunk: usize,
    lanes: usize,
}

/// The plan for a synchronous copy of `size > 0` bytes of pageable memory, or `None` for the
/// direct copy.
///
/// # Errors
///
/// `InvalidEnvironment` when the setting comes from a malformed variable.
pub(crate) fn plan<B: Runtime>(size: usize) -> Result<Option<Plan>> {
    let config = PageableStaging::current::<B>()?;
    match config.threshold {
        Some(t) if size >= t && !crate::runtime::state::in_callback() => {}
        _ => return Ok(None),
    }
    // A quarter of the copy, rounded down to a power of two (the pool's sizes), so that a copy
    // just above the threshold is still a few pieces that overlap.
    let quarter = (size / 4).max(1);
    let auto = (1usize << (usize::BITS - 1 - quarter.leading_zeros())).max(MIN_AUTO_CHUNK);
    let chunk = config.chunk.min(auto);
    let chunks = size.div_ceil(chunk);
    let lanes = config.lanes.min((chunks / DEPTH).max(1));
    Ok(Some(Plan { chunk, lanes }))
}

/// Which way a staged copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Pageable host memory to device memory.
    ToDevice,
    /// Device memory to pageable host memory.
    ToHost,
}

/// One staging buffer and the event recorded behind its last transfer.
struct Slot<B: Runtime> {
    buffer: PinnedMemoryPointer<B>,
    event: Event<B>,
}

/// What one thread of a staged copy owns: [`DEPTH`] slots.
struct Lane<B: Runtime> {
    slots: Vec<Slot<B>>,
}

/// The host side of a staged copy, shared with the helper threads. The caller of [`copy`]
/// promises the range for the call, and each lane touches its own part of it.
#[derive(Clone, Copy)]
struct HostRange(*mut u8);

// SAFETY: the address is only used by the lanes of one call of `copy`, on disjoint parts, while
// the caller's promise holds (the call joins every lane before it returns).
unsafe impl Send for HostRange {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostRange {}

impl HostRange {
    /// The address `offset` bytes in (a method, so closures capture the whole `HostRange`).
    ///
    /// # Safety
    ///
    /// `offset` lies within the caller's range.
    unsafe fn at(self, offset: usize) -> *mut u8 {
        // SAFETY: within the caller's range, by this function's contract.
        unsafe { self.0.add(offset) }
    }
}

/// A lane's failure: the error, and whether every transfer it queued is known to be done.
struct Failure {
    error: Error,
    settled: bool,
}

/// Lends the buffers and makes the events; fewer lanes than planned when the pool runs short,
/// none (the direct copy) when not even one lane's worth can be had.
fn acquire<B: Runtime>(dev: DeviceId, plan: Plan) -> Vec<Lane<B>> {
    #[cfg(test)]
    if REFUSE_BUFFERS.with(Cell::get) {
        return Vec::new();
    }
    let pool = get_default_pinned_memory_pool::<B>();
    let flags = EventFlags { disable_timing: true, ..EventFlags::default() };
    let mut lanes = Vec::with_capacity(plan.lanes);
    for _ in 0..plan.lanes {
        let mut slots = Vec::with_capacity(DEPTH);
        for _ in 0..DEPTH {
            let Ok(buffer) = pool.malloc(plan.chunk) else { return lanes };
            let Ok(event) = Event::with_flags_on(dev, flags) else { return lanes };
            slots.push(Slot { buffer, event });
        }
        lanes.push(Lane { slots });
    }
    lanes
}

/// Copies `size > 0` bytes between `device` (in `mem`'s memory) and `host`, staged as `plan`
/// says, on the legacy default stream; returns when the copy is done. Falls back to the direct
/// copy when the staging buffers cannot be had.
///
/// # Safety
///
/// `device..device + size` lies in `mem`'s memory, and no queued work touches it; `host..host +
/// size` is readable host memory ([`Direction::ToDevice`]), or writable host memory not
/// otherwise accessed ([`Direction::ToHost`]), for the duration of the call.
///
/// # Errors
///
/// The runtime's error of the first transfer, event or wait that failed.
pub(crate) unsafe fn copy<B: Runtime>(
    mem: &MemoryPointer<B>,
    plan: Plan,
    direction: Direction,
    device: DevicePtr,
    host: *mut u8,
    size: usize,
) -> Result<()> {
    let dev = mem.device_id();
    let lanes = acquire::<B>(dev, plan);
    if lanes.is_empty() {
        count(|c| c.direct += 1);
        // SAFETY: the caller's promises are the direct copy's.
        return unsafe {
            match direction {
                Direction::ToDevice => B::memcpy(dev, device, host as DevicePtr, size),
                Direction::ToHost => B::memcpy(dev, host as DevicePtr, device, size),
            }
        };
    }
    count(|c| c.staged += 1);
    // Each lane takes a contiguous run of whole chunks (the last lane's last chunk short).
    let chunks = size.div_ceil(plan.chunk);
    let per_lane = chunks.div_ceil(lanes.len()).saturating_mul(plan.chunk);
    let parts: Vec<(usize, usize)> = (0..lanes.len())
        .map(|i| {
            let start = i.saturating_mul(per_lane).min(size);
            (start, per_lane.min(size - start))
        })
        .filter(|&(_, len)| len > 0)
        .collect();
    let host = HostRange(host);
    let chunk = plan.chunk;
    let work = |lane: &Lane<B>, (offset, len): (usize, usize)| -> std::result::Result<(), Failure> {
        // SAFETY: `offset..offset + len` lies within both ranges (the parts cut `0..size`), and
        // no other lane touches it; the caller's promises cover the rest.
        let result = unsafe {
            match direction {
                Direction::ToDevice => to_device(lane, dev, device + offset, host.at(offset), len, chunk),
                Direction::ToHost => to_host(lane, dev, device + offset, host.at(offset), len, chunk),
            }
        };
        result.map_err(|error| Failure {
            error,
            // The legacy stream holds every transfer a lane queued: once it is idle, they are
            // done. SAFETY: the legacy stream handle is always valid.
            settled: unsafe { B::stream_synchronize(dev, B::legacy_stream()) }.is_ok(),
        })
    };
    let failures = run_lanes(&lanes, &parts, &work);
    let unsettled = failures.iter().any(|f| !f.settled);
    let Some(first) = failures.into_iter().next() else { return Ok(()) };
    if unsettled {
        // A transfer may still reach these after the call: neither the buffers nor the device
        // memory may be lent again.
        for slot in lanes.iter().flat_map(|l| &l.slots) {
            inflight::keep_forever::<B>(inflight::Keep::Other(Arc::new(slot.buffer.clone())));
        }
        inflight::keep_forever::<B>(inflight::Keep::Memory(Arc::clone(mem.mem())));
    }
    Err(first.error)
}

/// What a lane does with its part (offset and length) of the copy.
type LaneWork<'a, B> = dyn Fn(&Lane<B>, (usize, usize)) -> std::result::Result<(), Failure> + Sync + 'a;

/// Runs `work` for each part, the first on the calling thread and the others on scoped helper
/// threads (on the calling thread too, after its own, where a thread cannot be started). Returns
/// the failures, the calling thread's first.
fn run_lanes<B: Runtime>(
    lanes: &[Lane<B>],
    parts: &[(usize, usize)],
    work: &LaneWork<'_, B>,
) -> Vec<Failure> {
    std::thread::scope(|scope| {
        let mut helpers = Vec::new();
        let mut here = Vec::new();
        for (lane, &part) in lanes.iter().zip(parts).skip(1) {
            let spawned = std::thread::Builder::new()
                .name("gpumem-staging".into())
                .spawn_scoped(scope, move || work(lane, part));
            match spawned {
                Ok(h) => helpers.push(h),
                Err(_) => here.push((lane, part)),
            }
        }
        let mut failures = Vec::new();
        for (lane, part) in lanes.iter().zip(parts).take(1).map(|(l, &p)| (l, p)).chain(here) {
            if let Err(f) = work(lane, part) {
                failures.push(f);
            }
        }
        for h in helpers {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(f)) => failures.push(f),
                // The lanes do not panic; if one did, the panic is the caller's.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        failures
    })
}

/// One lane of a host-to-device copy: `len` bytes from `host` to `device`, `chunk` bytes at a
/// time through the lane's buffers; returns when its last transfer is done.
///
/// # Safety
///
/// As [`copy`], for these ranges.
unsafe fn to_device<B: Runtime>(
    lane: &Lane<B>,
    dev: DeviceId,
    device: DevicePtr,
    host: *const u8,
    len: usize,
    chunk: usize,
) -> Result<()> {
    let legacy = B::legacy_stream();
    let mut last = None;
    for (j, offset) in (0..len).step_by(chunk).enumerate() {
        let n = chunk.min(len - offset);
        let slot = &lane.slots[j % lane.slots.len()];
        if j >= lane.slots.len() {
            // The transfer that read this buffer last must be done before it is refilled.
            slot.event.synchronize()?;
        }
        let staging = slot.buffer.ptr();
        // SAFETY: the host range is readable (the caller's promise); the buffer holds at least
        // `chunk` bytes, was lent to this lane alone, and no transfer reads it now (its event has
        // passed, or it was never used); a buffer the pool lent cannot be the caller's memory.
        unsafe { std::ptr::copy_nonoverlapping(host.add(offset), staging, n) };
        injected(j)?;
        // SAFETY: both ranges are valid (the caller's device range, the lane's buffer, which
        // the lane keeps until this transfer is done); the legacy stream handle is always valid.
        unsafe { B::memcpy_async(dev, device + offset, staging as DevicePtr, n, legacy) }?;
        // SAFETY: the event is live (the slot owns it); the legacy stream handle is valid.
        unsafe { B::event_record(dev, slot.event.raw(), legacy) }?;
        last = Some(slot);
    }
    match last {
        // The legacy stream runs in order: the last event passed means every transfer is done.
        Some(slot) => slot.event.synchronize(),
        None => Ok(()),
    }
}

/// One lane of a device-to-host copy: `len` bytes from `device` to `host`, `chunk` bytes at a
/// time through the lane's buffers, each read once its transfer's event has passed.
///
/// # Safety
///
/// As [`copy`], for these ranges.
unsafe fn to_host<B: Runtime>(
    lane: &Lane<B>,
    dev: DeviceId,
    device: DevicePtr,
    host: *mut u8,
    len: usize,
    chunk: usize,
) -> Result<()> {
    let legacy = B::legacy_stream();
    let depth = lane.slots.len();
    let chunks = len.div_ceil(chunk);
    let piece = |j: usize| (j * chunk, chunk.min(len - j * chunk));
    let fetch = |j: usize| -> Result<()> {
        let (offset, n) = piece(j);
        let slot = &lane.slots[j % depth];
        injected(j)?;
        // SAFETY: the device range is valid (the caller's promise) and the buffer holds at least
        // `chunk` bytes, lent to this lane alone and read by nothing now (its last chunk was
        // copied out); the legacy stream handle is always valid.
        unsafe { B::memcpy_async(dev, slot.buffer.ptr() as DevicePtr, device + offset, n, legacy) }?;
        // SAFETY: the event is live (the slot owns it); the legacy stream handle is valid.
        unsafe { B::event_record(dev, slot.event.raw(), legacy) }
    };
    for j in 0..depth.min(chunks) {
        fetch(j)?;
    }
    for j in 0..chunks {
        let slot = &lane.slots[j % depth];
        slot.event.synchronize()?;
        let (offset, n) = piece(j);
        // SAFETY: the transfer into the buffer is done (its event passed) and nothing else
        // writes it; the host range is writable and not otherwise accessed (the caller's
        // promise), and is not a buffer the pool lent to this lane.
        unsafe { std::ptr::copy_nonoverlapping(slot.buffer.ptr(), host.add(offset), n) };
        if j + depth < chunks {
            fetch(j + depth)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
