//! Pointers into memory: [`MemoryPointer`] (device memory) and the offset arithmetic it shares
//! with [`PinnedMemoryPointer`](crate::PinnedMemoryPointer).
//!
//! A pointer is a memory object and an offset. Arithmetic (`p + n`, `n + p`, `p - n`, `p += n`,
//! `p -= n`) never fails and is exact: the offset is kept as a 128-bit integer, so it neither wraps
//! nor saturates (CuPy's offsets are Python integers). Every operation that touches memory checks
//! the offset and the byte count against the memory's size: out of range is
//! [`Error::OutOfBounds`], and nothing is touched.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DevicePtr};
use crate::pool::{ArenaKey, PooledMemory, RawAllocator};
use crate::runtime::device::Device;
use crate::runtime::device_allocator::DeviceAllocator;
use crate::runtime::memory::BaseMemory;
use crate::runtime::stream::inflight::Order;
use crate::runtime::stream::StreamRuntime;

/// An exact byte offset from the start of a memory object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Offset(i128);

impl Offset {
    pub(crate) const ZERO: Offset = Offset(0);

    pub(crate) fn new(n: isize) -> Self {
        Offset(n as i128)
    }

    /// `self + n`; a 128-bit sum of 64-bit steps cannot overflow in any program's lifetime, and
    /// saturates at the far end of `i128` if it ever did.
    pub(crate) fn add(self, n: isize) -> Self {
        Offset(self.0.saturating_add(n as i128))
    }

    pub(crate) fn sub(self, n: isize) -> Self {
        Offset(self.0.saturating_sub(n as i128))
    }

    pub(crate) fn saturated(self) -> isize {
        isize::try_from(self.0).unwrap_or(if self.0 < 0 { isize::MIN } else { isize::MAX })
    }

    /// The address `self` bytes from `base` (for display and as CuPy's `ptr`; memory is only
    /// touched through [`Offset::check`]).
    pub(crate) fn address(self, base: usize) -> usize {
        base.wrapping_add(self.0 as usize)
    }

    /// Bytes from this offset to the end of a `size`-byte memory; 0 outside it.
    pub(crate) fn remaining(self, size: usize) -> usize {
        usize::try_from(self.0).map_or(0, |off| size.saturating_sub(off))
    }

    /// The address of `len` bytes at this offset of the `size`-byte memory at `base`, if they lie
    /// within it.
    pub(crate) fn check(
        self,
        base: usize,
        size: usize,
        len: usize,
        operation: &'static str,
    ) -> Result<usize> {
        match usize::try_from(self.0) {
            Ok(off) if off.checked_add(len).is_some_and(|end| end <= size) => Ok(base + off),
            _ => Err(Error::OutOfBounds { operation, offset: self.saturated(), len, size }),
        }
    }
}

/// `Add`, `Sub`, `AddAssign`, `SubAssign` with `isize` (and `isize + pointer`) for a pointer type
/// that is `Clone` (sharing its memory) and has a field `offset` ([`Offset`]).
macro_rules! pointer_arithmetic {
    ($ptr:ident) => {
        impl<B: StreamRuntime> std::ops::Add<isize> for &$ptr<B> {
            type Output = $ptr<B>;
            fn add(self, n: isize) -> $ptr<B> {
                let mut p = self.clone();
                p.offset = p.offset.add(n);
                p
            }
        }

        impl<B: StreamRuntime> std::ops::Add<isize> for $ptr<B> {
            type Output = $ptr<B>;
            fn add(mut self, n: isize) -> $ptr<B> {
                self.offset = self.offset.add(n);
                self
            }
        }

        impl<B: StreamRuntime> std::ops::Add<&$ptr<B>> for isize {
            type Output = $ptr<B>;
            fn add(self, p: &$ptr<B>) -> $ptr<B> {
                p + self
            }
        }

        impl<B: StreamRuntime> std::ops::Add<$ptr<B>> for isize {
            type Output = $ptr<B>;
            fn add(self, p: $ptr<B>) -> $ptr<B> {
                p + self
            }
        }

        impl<B: StreamRuntime> std::ops::Sub<isize> for &$ptr<B> {
            type Output = $ptr<B>;
            fn sub(self, n: isize) -> $ptr<B> {
                let mut p = self.clone();
                p.offset = p.offset.sub(n);
                p
            }
        }

        impl<B: StreamRuntime> std::ops::Sub<isize> for $ptr<B> {
            type Output = $ptr<B>;
            fn sub(mut self, n: isize) -> $ptr<B> {
                self.offset = self.offset.sub(n);
                self
            }
        }

        impl<B: StreamRuntime> std::ops::AddAssign<isize> for $ptr<B> {
            fn add_assign(&mut self, n: isize) {
                self.offset = self.offset.add(n);
            }
        }

        impl<B: StreamRuntime> std::ops::SubAssign<isize> for $ptr<B> {
            fn sub_assign(&mut self, n: isize) {
                self.offset = self.offset.sub(n);
            }
        }
    };
}
pub(crate) use pointer_arithmetic;

pointer_arithmetic!(MemoryPointer);

/// A chunk of a pool on the runtime's own allocator: what `malloc` of the default pools lends.
type Chunk<B> = PooledMemory<DeviceAllocator<B>>;

/// What a [`MemoryPointer`] holds of its memory, with the memory's address, size and device
/// copied beside it (they never change: [`BaseMemory`]'s contract), so that the checks before a
/// copy or memset make no virtual call.
struct Held<B: StreamRuntime> {
    base: DevicePtr,
    size: usize,
    device: DeviceId,
    owner: Owner<B>,
}

/// Who owns the memory.
///
/// A pool chunk starts inline: a cache hit makes no heap allocation for its pointer, and
/// dropping the pointer gives the chunk back directly. The first time the memory is shared (a
/// clone, `&p + n`, [`MemoryPointer::mem`], work queued on it that must keep it alive), the chunk
/// moves into an `Arc`, once: from then on the pointer and everything that shares the memory hold
/// that `Arc`, and the chunk goes back when the last of them is dropped.
enum Owner<B: StreamRuntime> {
    Shared(Arc<dyn BaseMemory<B>>),
    Inline {
        /// The chunk, until it is shared (then `None`). The lock is taken only to share it;
        /// dropping the pointer reaches the chunk through `&mut` with no atomic operation.
        chunk: Mutex<Option<Chunk<B>>>,
        /// The `Arc` the chunk moved into, once shared.
        shared: OnceLock<Arc<dyn BaseMemory<B>>>,
    },
}

impl<B: StreamRuntime> Held<B> {
    fn shared(mem: Arc<dyn BaseMemory<B>>) -> Self {
        Held { base: mem.ptr(), size: mem.size(), device: mem.device_id(), owner: Owner::Shared(mem) }
    }

    #[inline]
    fn inline(chunk: Chunk<B>) -> Self {
        Held {
            base: chunk.ptr(),
            size: chunk.size(),
            device: chunk.device_id(),
            owner: Owner::Inline { chunk: Mutex::new(Some(chunk)), shared: OnceLock::new() },
        }
    }

    /// `f` of the memory object, without sharing an inline chunk; `None` only while another
    /// thread is sharing it (moving the chunk into its `Arc`).
    fn with_memory<T>(&self, f: impl Fn(&dyn BaseMemory<B>) -> T) -> Option<T> {
        match &self.owner {
            Owner::Shared(mem) => Some(f(&**mem)),
            Owner::Inline { chunk, shared } => match shared.get() {
                Some(mem) => Some(f(&**mem)),
                // Still inline, unless shared since the check above (then the `Arc` has it).
                None => {
                    let inline = chunk.lock();
                    match inline.as_ref() {
                        Some(chunk) => Some(f(chunk)),
                        None => shared.get().map(|mem| f(&**mem)),
                    }
                }
            },
        }
    }

    /// The pool chunk's identifier, without sharing an inline chunk.
    fn pmem_id(&self) -> Option<u64> {
        self.with_memory(BaseMemory::pmem_id).flatten()
    }

    /// The memory as a shared object, moving an inline chunk into its `Arc` the first time.
    fn arc(&self) -> &Arc<dyn BaseMemory<B>> {
        match &self.owner {
            Owner::Shared(mem) => mem,
            Owner::Inline { chunk, shared } => shared.get_or_init(|| {
                // `get_or_init` runs this once, and the chunk leaves its slot only here, so it
                // is still there.
                match chunk.lock().take() {
                    Some(c) => Arc::new(c),
                    None => unreachable!("an inline chunk is shared once"),
                }
            }),
        }
    }
}

impl<B: StreamRuntime> fmt::Debug for Held<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Owner::Shared(mem) => fmt::Debug::fmt(mem, f),
            Owner::Inline { shared, .. } => match shared.get() {
                Some(mem) => fmt::Debug::fmt(mem, f),
                // The chunk's own format, from the copies beside it (the slot's lock is not
                // taken: a `Debug` of a pointer being shared on another thread must not wait).
                None => {
                    write!(f, "<PooledMemory 0x{:x} size={} device={}>", self.base, self.size, self.device)
                }
            },
        }
    }
}

/// A pointer into device memory: CuPy's `MemoryPointer`. It keeps its memory alive; clones share
/// the memory.
///
/// Offset arithmetic (`p + n`, `n + p`, `p - n`, `p += n`, `p -= n`) is free to step outside the
/// memory, as in CuPy, but every operation that touches memory checks the pointer's offset and
/// the byte count against the memory's size and refuses out-of-range work with
/// [`Error::OutOfBounds`]. Unlike CuPy's cdef class, `p += n` changes only `p`, not other clones
/// (Rust values are not shared references). Offsets are exact, as Python's integers: `(p + isize::MAX
/// + 10) - isize::MAX` is `p + 10`.
///
/// A pointer from a pool on the runtime's allocator (the default pools, `alloc`) holds its chunk
/// inline: allocating and dropping it costs what the pool's own path does, with no reference
/// count. Its memory becomes a shared, reference-counted object the first time it is shared (a
/// clone, `&p + n`, [`mem`](Self::mem), asynchronous work that keeps it alive); `p + n` and
/// `p += n` on an owned pointer share nothing.
///
/// ```
/// use gpumem_core::host::Host;
/// use gpumem_core::{Error, Memory, MemoryPointer};
///
/// let p = MemoryPointer::<Host>::from_memory(Memory::new(64)?);
/// p.memset(0, 64)?;
/// (&p + 60).copy_from_host(&[1, 2, 3, 4], 4)?;
/// let mut back = [0u8; 8];
/// (&p + 56).copy_to_host(&mut back, 8)?;
/// assert_eq!(back, [0, 0, 0, 0, 1, 2, 3, 4]);
/// // Four bytes from offset 62 would end past the allocation: refused, nothing written.
/// assert!(matches!((&p + 62).memset(9, 4), Err(Error::OutOfBounds { .. })));
/// # Ok::<(), Error>(())
/// ```
pub struct MemoryPointer<B: StreamRuntime> {
    mem: Held<B>,
    offset: Offset,
}

impl<B: StreamRuntime> Clone for MemoryPointer<B> {
    fn clone(&self) -> Self {
        let m = &self.mem;
        let owner = Owner::Shared(Arc::clone(m.arc()));
        MemoryPointer {
            mem: Held { base: m.base, size: m.size, device: m.device, owner },
            offset: self.offset,
        }
    }
}

impl<B: StreamRuntime> fmt::Debug for MemoryPointer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // CuPy's repr: <MemoryPointer 0x... device=0 mem=...>
        write!(f, "<MemoryPointer 0x{:x} device={} mem={:?}>", self.ptr(), self.device_id(), self.mem)
    }
}

impl<B: StreamRuntime> MemoryPointer<B> {
    /// A pointer `offset` bytes into `mem`.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` unless `0 <= offset <= mem.size()` (CuPy only asserts against null
    /// memory).
    pub fn new(mem: Arc<dyn BaseMemory<B>>, offset: isize) -> Result<Self> {
        let p = MemoryPointer { mem: Held::shared(mem), offset: Offset::new(offset) };
        p.check(0, "MemoryPointer offset")?;
        Ok(p)
    }

    /// A pointer to the start of `mem`, which it moves into a shared, reference-counted object.
    pub fn from_memory(mem: impl BaseMemory<B>) -> Self {
        Self::from_arc(Arc::new(mem))
    }

    /// A pointer to the start of shared memory.
    pub fn from_arc(mem: Arc<dyn BaseMemory<B>>) -> Self {
        MemoryPointer { mem: Held::shared(mem), offset: Offset::ZERO }
    }

    /// A pointer to the start of a pool's chunk. A chunk of a pool on the runtime's own allocator
    /// is held inline (no allocation); others as [`from_memory`](Self::from_memory).
    #[inline]
    pub fn from_pooled<A: RawAllocator>(chunk: PooledMemory<A>) -> Self
    where
        A::Block: BaseMemory<B>,
    {
        // The type test is decided when `A` is known, at compile time: no cost at run time.
        let mut slot = Some(chunk);
        if let Some(own) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Chunk<B>>>() {
            if let Some(chunk) = own.take() {
                return MemoryPointer { mem: Held::inline(chunk), offset: Offset::ZERO };
            }
        }
        match slot {
            Some(chunk) => Self::from_memory(chunk),
            None => unreachable!("the chunk is taken only when it is held inline"),
        }
    }

    /// The address this pointer points to (CuPy's `ptr`).
    #[must_use]
    #[inline]
    pub fn ptr(&self) -> DevicePtr {
        self.offset.address(self.mem.base)
    }

    /// The offset from the start of the memory (saturated to `isize`'s range when pointer
    /// arithmetic took it further; the pointer itself keeps the exact value).
    #[must_use]
    pub fn offset(&self) -> isize {
        self.offset.saturated()
    }

    /// The memory this pointer points into (CuPy's `mem`). A chunk held inline becomes a shared
    /// object here, once (see the type's docs).
    #[must_use]
    pub fn mem(&self) -> &Arc<dyn BaseMemory<B>> {
        self.mem.arc()
    }

    /// The identifier of the pool chunk this pointer points into (CuPy's `ptr.mem`, a
    /// `PooledMemory`, whose id the memory hooks report as `pmem_id`); `None` when the memory is
    /// not a pool's chunk (a size-0 allocation, [`Memory`](crate::Memory), foreign memory).
    #[must_use]
    pub fn pmem_id(&self) -> Option<u64> {
        self.mem.pmem_id()
    }

    /// The device of the memory.
    #[must_use]
    #[inline]
    pub fn device_id(&self) -> DeviceId {
        self.mem.device
    }

    /// The device of the memory, as a [`Device`].
    #[must_use]
    pub fn device(&self) -> Device<B> {
        Device::new(self.device_id())
    }

    /// Bytes from this pointer to the end of its memory; 0 when the pointer is outside it.
    #[must_use]
    #[inline]
    pub fn size(&self) -> usize {
        self.offset.remaining(self.mem.size)
    }

    /// `self + n`, or an error when the result would be outside the memory.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` unless the new offset is within `0..=size` of the memory.
    pub fn checked_add(&self, n: isize) -> Result<Self> {
        let target = self.offset.add(n);
        target.check(self.mem.base, self.mem.size, 0, "MemoryPointer offset")?;
        let mut p = self.clone();
        p.offset = target;
        Ok(p)
    }

    /// The address of `len` bytes from this pointer, if they lie within the memory.
    #[inline]
    pub(crate) fn check(&self, len: usize, operation: &'static str) -> Result<DevicePtr> {
        self.offset.check(self.mem.base, self.mem.size, len, operation)
    }

    /// What orders reusing this memory (see [`BaseMemory::reuse_stream`] and
    /// [`BaseMemory::other_streams`]). Asked by asynchronous operations and synchronous accesses
    /// only: the cache hit, which makes the pointer, pays nothing for it.
    #[inline]
    pub(crate) fn order(&self) -> Order {
        let device = self.mem.device;
        self.mem
            .with_memory(|m| Order {
                reuse: m.reuse_stream().map(|key| (device, key)),
                others: m.other_streams(),
            })
            .unwrap_or(Order::NONE)
    }

    /// [`BaseMemory::note_other_stream`], without sharing an inline chunk.
    pub(crate) fn note_other_stream(&self, stream: ArenaKey) -> bool {
        self.mem.with_memory(|m| m.note_other_stream(stream)).unwrap_or(false)
    }

    /// The start address and size of the whole memory.
    pub(crate) fn memory_span(&self) -> (DevicePtr, usize) {
        (self.mem.base, self.mem.size)
    }

    /// Whether the memory is still held inline (never shared): for tests of the ownership model.
    #[cfg(test)]
    pub(crate) fn is_inline(&self) -> bool {
        matches!(&self.mem.owner, Owner::Inline { shared, .. } if shared.get().is_none())
    }
}

/// Something that hands out device memory: a pool, the plain runtime allocator, or the user's
/// own. Closures `Fn(usize) -> Result<MemoryPointer<B>>` are allocators.
pub trait Allocator<B: StreamRuntime>: Send + Sync {
    /// Allocates `size` bytes on the current device.
    ///
    /// # Errors
    ///
    /// The allocator's.
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>>;
}

impl<B: StreamRuntime, F> Allocator<B> for F
where
    F: Fn(usize) -> Result<MemoryPointer<B>> + Send + Sync,
{
    fn malloc(&self, size: usize) -> Result<MemoryPointer<B>> {
        self(size)
    }
}
