//! Copies and memsets through [`MemoryPointer`]: the checks gpumem makes before any byte moves.
//!
//! Which stream, as in CuPy: the synchronous forms run on the legacy default stream and refuse to
//! run while the current stream captures; the `_async` forms run on the stream given or the
//! current one. What gpumem adds: every range is checked against its memory (or host buffer),
//! overlapping device ranges are refused, and asynchronous host transfers take pinned buffers that
//! gpumem keeps alive until the transfer is done. Large synchronous copies of pageable host
//! memory are staged through pinned buffers ([`staging`]).

use crate::error::{Error, Result};
use crate::hal::{CaptureStatus, DeviceId, DevicePtr};
use crate::runtime::pinned::PinnedMemoryPointer;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::staging::{self, Direction};
use crate::runtime::statics::Runtime;
use std::sync::Arc;

use crate::runtime::stream::inflight::{self, Keep, Order, Range, Target};
use crate::runtime::stream::{self, Stream};

const SYNC_WHILE_CAPTURING: &str = "the current stream is capturing, so synchronous API calls are disallowed";
const H2D_WHILE_CAPTURING: &str = "the current stream is capturing, so H2D transfers are disallowed";
const D2H_WHILE_CAPTURING: &str = "the current stream is capturing, so D2H transfers are disallowed";

/// Where [`MemoryPointer::copy_from`] copies from.
#[derive(Debug)]
pub enum CopySource<'a, B: Runtime> {
    /// Device memory.
    Device(&'a MemoryPointer<B>),
    /// Pageable host memory (synchronous copies only).
    Host(&'a [u8]),
    /// Pinned host memory.
    Pinned(&'a PinnedMemoryPointer<B>),
}

impl<'a, B: Runtime> From<&'a MemoryPointer<B>> for CopySource<'a, B> {
    fn from(p: &'a MemoryPointer<B>) -> Self {
        CopySource::Device(p)
    }
}

impl<'a, B: Runtime> From<&'a [u8]> for CopySource<'a, B> {
    fn from(s: &'a [u8]) -> Self {
        CopySource::Host(s)
    }
}

impl<'a, B: Runtime, const N: usize> From<&'a [u8; N]> for CopySource<'a, B> {
    fn from(s: &'a [u8; N]) -> Self {
        CopySource::Host(s)
    }
}

impl<'a, B: Runtime> From<&'a Vec<u8>> for CopySource<'a, B> {
    fn from(s: &'a Vec<u8>) -> Self {
        CopySource::Host(s)
    }
}

impl<'a, B: Runtime> From<&'a PinnedMemoryPointer<B>> for CopySource<'a, B> {
    fn from(p: &'a PinnedMemoryPointer<B>) -> Self {
        CopySource::Pinned(p)
    }
}

/// Refuses a synchronous operation while the current stream captures (CuPy checks before the
/// size, so a zero-byte copy is refused too). A backend without capture skips the check, as CuPy
/// does on HIP.
fn refuse_while_capturing<B: Runtime>(stream: Option<&Stream<B>>, message: &'static str) -> Result<()> {
    if !B::CAPS.capture {
        return Ok(());
    }
    let (handle, dev, _) = stream::resolve::<B>(stream);
    // SAFETY: the handle `resolve` gave is live for this call (the stream given, or the
    // thread's current stream, which its state holds).
    match unsafe { B::capture_status(dev, handle) } {
        Ok(CaptureStatus::None) => Ok(()),
        Ok(CaptureStatus::Active) => Err(Error::NotAllowedWhileCapturing(message)),
        Ok(CaptureStatus::Invalidated) => Err(Error::CaptureInvalidated),
        Err(e) => Err(e),
    }
}

/// The range of `len` bytes at `start`.
fn span(start: usize, len: usize) -> Range {
    (start, start.saturating_add(len))
}

/// What an operation through `p` keeps alive: its memory object.
fn keep_of<B: Runtime>(p: &MemoryPointer<B>) -> Keep<B> {
    Keep::Memory(Arc::clone(p.mem()))
}

/// What an operation through `p` keeps alive: its pinned buffer.
fn keep_pinned<B: Runtime>(p: &PinnedMemoryPointer<B>) -> Keep<B> {
    Keep::Other(Arc::new(p.buffer()))
}

/// Queues `op` on `stream` (or the current stream), touching `ranges` (of the device memory of
/// `memory`, one for each range; `None` for a pinned host buffer): ordered after queued work of
/// other streams on the same bytes, and keeping what `keeps` gives alive until the stream has
/// passed it, unless all of it is pool memory whose reuse is ordered after it instead (its own
/// stream's order, or a fence at its free on the streams it noted; see
/// [`inflight::Queueing::finish`]). Either way the bytes stay the operation's until the stream
/// has passed it.
fn queue<B: Runtime, const N: usize>(
    stream: Option<&Stream<B>>,
    ranges: [Range; N],
    memory: [Option<&MemoryPointer<B>>; N],
    keeps: impl FnOnce() -> [Keep<B>; N],
    op: impl FnOnce(&Target<B>) -> Result<()>,
) -> Result<()> {
    let target = stream::target::<B>(stream);
    let orders = || memory.map(|m| m.map_or(Order::NONE, MemoryPointer::order));
    // SAFETY: the handle `target` gave is live for this call.
    let (queueing, orders) = unsafe { inflight::begin(target, &ranges, orders) }?;
    op(&target)?;
    let note = |stream| memory.iter().flatten().all(|m| m.note_other_stream(stream));
    queueing.finish(&ranges, &orders, note, keeps)
}

/// Refuses an asynchronous operation on `p`'s memory queued on a stream of another device, as
/// the runtimes do (streams valid on any device run in the current device, and are not checked).
fn check_stream_device<B: Runtime>(p: &MemoryPointer<B>, stream: Option<&Stream<B>>) -> Result<()> {
    let stream_device = match stream {
        Some(s) => s.device_id(),
        None => Stream::<B>::current().device_id(),
    };
    match stream_device {
        Some(d) if d != p.device_id() => {
            Err(Error::WrongDevice { what: "memory", expected: d, found: p.device_id() })
        }
        _ => Ok(()),
    }
}

fn check_host_len(len: usize, size: usize, operation: &'static str) -> Result<()> {
    if size > len {
        return Err(Error::OutOfBounds { operation, offset: 0, len: size, size: len });
    }
    Ok(())
}

fn refuse_overlap(dst: DevicePtr, src: DevicePtr, size: usize) -> Result<()> {
    if size != 0 && dst < src.saturating_add(size) && src < dst.saturating_add(size) {
        return Err(Error::Overlap { src, dst, size });
    }
    Ok(())
}

/// Lets `dst_dev` reach `src_dev`'s memory before a copy between them, as CuPy does before every
/// device-to-device copy (other libraries may have disabled it), the memory of `src_dev`'s
/// expandable segments included (which peer access alone does not cover). Devices that cannot
/// reach each other directly still copy; the runtime stages the copy.
fn enable_peer_access<B: Runtime>(src_dev: DeviceId, dst_dev: DeviceId) -> Result<()> {
    if src_dev == dst_dev || !B::can_access_peer(src_dev, dst_dev)? {
        return Ok(());
    }
    B::enable_peer_access(src_dev, dst_dev)?;
    crate::pool::expandable::grant_peer_access::<B>(src_dev, dst_dev)
}

impl<B: Runtime> MemoryPointer<B> {
    /// Copies `size` bytes from device memory `src` to this pointer, on the legacy default
    /// stream; returns when the copy is done. Peer access is enabled first between two devices.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when either range leaves its memory; `InvalidArgument` when they overlap;
    /// `NotAllowedWhileCapturing` while the current stream captures; the runtime's error.
    pub fn copy_from_device(&self, src: &MemoryPointer<B>, size: usize) -> Result<()> {
        refuse_while_capturing::<B>(None, SYNC_WHILE_CAPTURING)?;
        let (dst_ptr, src_ptr) = self.device_ranges(src, size, "copy_from_device")?;
        if size == 0 {
            return Ok(());
        }
        enable_peer_access::<B>(src.device_id(), self.device_id())?;
        inflight::access::<B, _, _>(
            &[span(dst_ptr, size), span(src_ptr, size)],
            || [self.order(), src.order()],
            || {
                // SAFETY: both ranges were checked against live memory objects of `B` that `self`
                // and `src` keep alive for the duration of this synchronous call; they do not
                // overlap, and no other operation through gpumem touches them until it returns.
                unsafe { B::memcpy(self.device_id(), dst_ptr, src_ptr, size) }
            },
        )
    }

    /// Copies `size` bytes from device memory `src` to this pointer, ordered on `stream` (or the
    /// current stream).
    ///
    /// The copy keeps both memory objects alive until the stream has passed it (a pool's chunk
    /// instead lends its bytes again only after the copy), and is ordered after queued work of
    /// other streams on the same bytes.
    ///
    /// # Errors
    ///
    /// `OutOfBounds`, `InvalidArgument` (overlap); the runtime's error.
    pub fn copy_from_device_async(
        &self,
        src: &MemoryPointer<B>,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        let (dst_ptr, src_ptr) = self.device_ranges(src, size, "copy_from_device_async")?;
        if size == 0 {
            return Ok(());
        }
        enable_peer_access::<B>(src.device_id(), self.device_id())?;
        let ranges = [span(dst_ptr, size), span(src_ptr, size)];
        queue(
            stream,
            ranges,
            [Some(self), Some(src)],
            || [keep_of(self), keep_of(src)],
            |t| {
                // SAFETY: both ranges were checked against live memory of `B`, which the queue keeps
                // for the copy until the stream has passed it (see `queue`).
                unsafe { B::memcpy_async(t.device, dst_ptr, src_ptr, size, t.handle) }
            },
        )
    }

    /// Queues `op`, touching `range` of this pointer's memory alone, keeping the memory for it
    /// until the stream has passed it (see `queue`).
    fn queue_alone(
        &self,
        stream: Option<&Stream<B>>,
        range: Range,
        op: impl FnOnce(&Target<B>) -> Result<()>,
    ) -> Result<()> {
        queue(stream, [range], [Some(self)], || [keep_of(self)], op)
    }

    /// Queues `op`, a transfer between this pointer's memory and `pinned` touching `ranges`
    /// (the device's, then the host's), keeping both for it until the stream has passed it.
    fn queue_with_pinned(
        &self,
        pinned: &PinnedMemoryPointer<B>,
        stream: Option<&Stream<B>>,
        ranges: [Range; 2],
        op: impl FnOnce(&Target<B>) -> Result<()>,
    ) -> Result<()> {
        queue(stream, ranges, [Some(self), None], || [keep_of(self), keep_pinned(pinned)], op)
    }

    fn device_ranges(
        &self,
        src: &MemoryPointer<B>,
        size: usize,
        op: &'static str,
    ) -> Result<(DevicePtr, DevicePtr)> {
        let dst_ptr = self.check(size, op)?;
        let src_ptr = src.check(size, op)?;
        refuse_overlap(dst_ptr, src_ptr, size)?;
        Ok((dst_ptr, src_ptr))
    }

    /// Copies the first `size` bytes of `src` (pageable host memory) to this pointer, on the
    /// legacy default stream; returns when the copy is done. Large copies go through pinned
    /// staging buffers in pipelined chunks (see [`PageableStaging`](crate::PageableStaging)).
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `size` exceeds `src.len()` or the device range leaves its memory;
    /// `NotAllowedWhileCapturing`; `InvalidEnvironment` when `GPUMEM_PAGEABLE_STAGING` is
    /// malformed; the runtime's error.
    pub fn copy_from_host(&self, src: &[u8], size: usize) -> Result<()> {
        check_host_len(src.len(), size, "copy_from_host source")?;
        // SAFETY: `src` is a live slice of at least `size` bytes for this synchronous call.
        unsafe { self.copy_from_host_ptr(src.as_ptr(), size) }
    }

    /// Copies `size` bytes from a raw host address (CuPy's `copy_from_host(int, size)`).
    ///
    /// # Safety
    ///
    /// `src..src + size` is readable host memory for the duration of the call.
    ///
    /// # Errors
    ///
    /// As [`MemoryPointer::copy_from_host`].
    pub unsafe fn copy_from_host_ptr(&self, src: *const u8, size: usize) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.copy_from_host_raw(src, size, true) }
    }

    /// The synchronous host-to-device copy; `pageable` lets it be staged. Pinned memory
    /// (`!pageable`) is gpumem's, which queued transfers may touch: its bytes are ordered with
    /// them as the device's are.
    ///
    /// # Safety
    ///
    /// As [`MemoryPointer::copy_from_host_ptr`].
    unsafe fn copy_from_host_raw(&self, src: *const u8, size: usize, pageable: bool) -> Result<()> {
        refuse_while_capturing::<B>(None, SYNC_WHILE_CAPTURING)?;
        let dst = self.check(size, "copy_from_host")?;
        if size == 0 {
            return Ok(());
        }
        let plan = if pageable { staging::plan::<B>(size)? } else { None };
        let ranges = [span(dst, size), if pageable { span(0, 0) } else { span(src as usize, size) }];
        inflight::access::<B, _, _>(
            &ranges,
            || [self.order()],
            || match plan {
                // SAFETY: the device range was checked against `self`'s memory and no other
                // operation through gpumem touches it until this returns; the host range is only
                // read (the caller's promise).
                Some(plan) => unsafe {
                    staging::copy(self, plan, Direction::ToDevice, dst, src.cast_mut(), size)
                },
                // SAFETY: as above.
                None => unsafe { B::memcpy(self.device_id(), dst, src as DevicePtr, size) },
            },
        )
    }

    /// Copies `size` bytes from pinned host memory to this pointer, ordered on `stream` (or the
    /// current stream). gpumem keeps `src`'s memory alive until the copy is done, even if the
    /// caller drops it.
    ///
    /// # Errors
    ///
    /// `OutOfBounds`; `NotAllowedWhileCapturing` while that stream captures (CuPy's message);
    /// the runtime's error.
    pub fn copy_from_host_async(
        &self,
        src: &PinnedMemoryPointer<B>,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        refuse_while_capturing::<B>(stream, H2D_WHILE_CAPTURING)?;
        let dst = self.check(size, "copy_from_host_async")?;
        let host = src.check(size, "copy_from_host_async source")?;
        if size == 0 {
            return Ok(());
        }
        let ranges = [span(dst, size), span(host, size)];
        self.queue_with_pinned(src, stream, ranges, |t| {
            // SAFETY: both ranges were checked against live memory, which the queue keeps for
            // the copy until the stream has passed it (see `queue`).
            unsafe { B::memcpy_async(t.device, dst, host as DevicePtr, size, t.handle) }
        })
    }

    /// Copies `size` bytes from a raw host address, ordered on `stream` (or the current stream).
    ///
    /// # Safety
    ///
    /// `src..src + size` is pinned host memory of this backend, readable until the stream
    /// reaches the copy.
    ///
    /// # Errors
    ///
    /// As [`MemoryPointer::copy_from_host_async`].
    pub unsafe fn copy_from_host_ptr_async(
        &self,
        src: *const u8,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        refuse_while_capturing::<B>(stream, H2D_WHILE_CAPTURING)?;
        let dst = self.check(size, "copy_from_host_async")?;
        if size == 0 {
            return Ok(());
        }
        self.queue_alone(stream, span(dst, size), |t| {
            // SAFETY: the device range was checked and is kept for the copy by the queue (see
            // `queue`); the host range is the caller's promise.
            unsafe { B::memcpy_async(t.device, dst, src as DevicePtr, size, t.handle) }
        })
    }

    /// Copies `size` bytes from this pointer into `dst` (pageable host memory), on the legacy
    /// default stream; returns when the copy is done. Large copies go through pinned staging
    /// buffers in pipelined chunks (see [`PageableStaging`](crate::PageableStaging)).
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `size` exceeds `dst.len()` or the device range leaves its memory;
    /// `NotAllowedWhileCapturing`; `InvalidEnvironment` when `GPUMEM_PAGEABLE_STAGING` is
    /// malformed; the runtime's error.
    pub fn copy_to_host(&self, dst: &mut [u8], size: usize) -> Result<()> {
        check_host_len(dst.len(), size, "copy_to_host destination")?;
        // SAFETY: `dst` is a live, exclusive slice of at least `size` bytes for this call.
        unsafe { self.copy_to_host_ptr(dst.as_mut_ptr(), size) }
    }

    /// Copies `size` bytes from this pointer to a raw host address.
    ///
    /// # Safety
    ///
    /// `dst..dst + size` is writable host memory, not otherwise accessed during the call.
    ///
    /// # Errors
    ///
    /// As [`MemoryPointer::copy_to_host`].
    pub unsafe fn copy_to_host_ptr(&self, dst: *mut u8, size: usize) -> Result<()> {
        refuse_while_capturing::<B>(None, SYNC_WHILE_CAPTURING)?;
        let src = self.check(size, "copy_to_host")?;
        if size == 0 {
            return Ok(());
        }
        let plan = staging::plan::<B>(size)?;
        inflight::access::<B, _, _>(
            &[span(src, size)],
            || [self.order()],
            || match plan {
                // SAFETY: the device range was checked against `self`'s memory and no other
                // operation through gpumem touches it until this returns; the host range is the
                // caller's promise.
                Some(plan) => unsafe { staging::copy(self, plan, Direction::ToHost, src, dst, size) },
                // SAFETY: as above.
                None => unsafe { B::memcpy(self.device_id(), dst as DevicePtr, src, size) },
            },
        )
    }

    /// Copies `size` bytes from this pointer into pinned host memory, ordered on `stream` (or
    /// the current stream). gpumem keeps `dst`'s memory alive until the copy is done; its
    /// contents are defined once the stream has passed the copy.
    ///
    /// # Errors
    ///
    /// `OutOfBounds`; `NotAllowedWhileCapturing` (CuPy's message); the runtime's error.
    pub fn copy_to_host_async(
        &self,
        dst: &PinnedMemoryPointer<B>,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        refuse_while_capturing::<B>(stream, D2H_WHILE_CAPTURING)?;
        let src = self.check(size, "copy_to_host_async")?;
        let host = dst.check(size, "copy_to_host_async destination")?;
        if size == 0 {
            return Ok(());
        }
        let ranges = [span(src, size), span(host, size)];
        self.queue_with_pinned(dst, stream, ranges, |t| {
            // SAFETY: both ranges were checked against live memory, which the queue keeps for
            // the copy until the stream has passed it (see `queue`).
            unsafe { B::memcpy_async(t.device, host as DevicePtr, src, size, t.handle) }
        })
    }

    /// Copies `size` bytes from this pointer to a raw host address, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `dst..dst + size` is pinned host memory of this backend, writable and not otherwise
    /// accessed until the stream reaches the copy.
    ///
    /// # Errors
    ///
    /// As [`MemoryPointer::copy_to_host_async`].
    pub unsafe fn copy_to_host_ptr_async(
        &self,
        dst: *mut u8,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        refuse_while_capturing::<B>(stream, D2H_WHILE_CAPTURING)?;
        let src = self.check(size, "copy_to_host_async")?;
        if size == 0 {
            return Ok(());
        }
        self.queue_alone(stream, span(src, size), |t| {
            // SAFETY: the device range was checked and is kept for the copy by the queue (see
            // `queue`); the host range is the caller's promise.
            unsafe { B::memcpy_async(t.device, dst as DevicePtr, src, size, t.handle) }
        })
    }

    /// Copies `size` bytes from device or host memory, choosing [`copy_from_device`] or
    /// [`copy_from_host`] by the source (CuPy's `copy_from`). Runs on the legacy default stream.
    ///
    /// [`copy_from_device`]: MemoryPointer::copy_from_device
    /// [`copy_from_host`]: MemoryPointer::copy_from_host
    ///
    /// # Errors
    ///
    /// As the method it chooses.
    pub fn copy_from<'a>(&self, src: impl Into<CopySource<'a, B>>, size: usize) -> Result<()> {
        match src.into() {
            CopySource::Device(p) => self.copy_from_device(p, size),
            CopySource::Host(s) => self.copy_from_host(s, size),
            CopySource::Pinned(p) => {
                let host = p.check(size, "copy_from_host source")?;
                // SAFETY: the pinned range was checked against memory `p` keeps alive. Pinned
                // memory needs no staging.
                unsafe { self.copy_from_host_raw(host as *const u8, size, false) }
            }
        }
    }

    /// Copies `size` bytes from device or pinned host memory, ordered on `stream` (CuPy's
    /// `copy_from_async`).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for pageable host memory (an asynchronous copy from it could outlive
    /// the borrow; use pinned memory or the synchronous form); otherwise as the method chosen.
    pub fn copy_from_async<'a>(
        &self,
        src: impl Into<CopySource<'a, B>>,
        size: usize,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        match src.into() {
            CopySource::Device(p) => self.copy_from_device_async(p, size, stream),
            CopySource::Pinned(p) => self.copy_from_host_async(p, size, stream),
            CopySource::Host(_) => Err(Error::InvalidArgument(
                "copy_from_async from pageable host memory: use pinned memory or copy_from".into(),
            )),
        }
    }

    /// Sets `size` bytes from this pointer to `value`, on the legacy default stream.
    ///
    /// # Errors
    ///
    /// `OutOfBounds`; `NotAllowedWhileCapturing`; the runtime's error.
    pub fn memset(&self, value: u8, size: usize) -> Result<()> {
        refuse_while_capturing::<B>(None, SYNC_WHILE_CAPTURING)?;
        let dst = self.check(size, "memset")?;
        if size == 0 {
            return Ok(());
        }
        inflight::access::<B, _, _>(
            &[span(dst, size)],
            || [self.order()],
            || {
                // SAFETY: the range was checked against live memory of `B`, and no other operation
                // through gpumem touches it until this returns.
                unsafe { B::memset(self.device_id(), dst, value, size) }
            },
        )
    }

    /// Sets `size` bytes from this pointer to `value`, ordered on `stream` (or the current
    /// stream). Capturable. The memset keeps the memory for itself until the stream has passed it
    /// (a pool's chunk is lent again only after it).
    ///
    /// # Errors
    ///
    /// `OutOfBounds`; `WrongDevice` for a stream of another device; the runtime's error.
    pub fn memset_async(&self, value: u8, size: usize, stream: Option<&Stream<B>>) -> Result<()> {
        let dst = self.check(size, "memset_async")?;
        if size == 0 {
            return Ok(());
        }
        check_stream_device(self, stream)?;
        self.queue_alone(stream, span(dst, size), |t| {
            // SAFETY: the range was checked and the queue keeps the memory for the memset until
            // the stream has passed it (see `queue`).
            unsafe { B::memset_async(t.device, dst, value, size, t.handle) }
        })
    }

    /// Keeps this pointer's memory alive until `stream` has passed the work queued on it so far:
    /// for work gpumem cannot see, such as a kernel of the program's own that was given
    /// [`ptr`](Self::ptr). Call it after queueing that work (PyTorch's `record_stream` notes the
    /// stream instead and waits at the free; the effect is the same).
    ///
    /// # Errors
    ///
    /// The runtime's error recording the event.
    pub fn record_stream(&self, stream: &Stream<B>) -> Result<()> {
        let (start, len) = self.memory_span();
        let range = span(start, len);
        self.queue_alone(Some(stream), range, |_| Ok(()))
    }
}
