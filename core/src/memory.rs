//! Device memory: raw allocations ([`Memory`]), foreign memory ([`UnownedMemory`]) and pointers
//! into either ([`MemoryPointer`]).
//!
//! Every memory object knows its size, so every [`MemoryPointer`] operation is checked against
//! it: an out-of-range offset, copy or memset is an [`Error::OutOfBounds`] and touches nothing.
//! CuPy does no such check (its copies write past the end of an allocation); that is gpumem's
//! main deliberate difference from it.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::sync::Arc;

use crate::backend::{Backend, DeviceId, DevicePtr};
use crate::device::{current_device, Device};
use crate::error::{Error, Result};
use crate::pool::PooledMemory;

/// A block of device memory of backend `B`: CuPy's `BaseMemory`.
///
/// # Safety
///
/// Implementors promise that `ptr()..ptr() + size()` is device memory of backend `B` on
/// `device_id()` (or, for `size() == 0`, that nothing is promised and `ptr()` may be 0), valid
/// for reads and writes by the runtime for as long as the object lives, and that the three
/// values never change. gpumem's safe copies rely on it.
pub unsafe trait BaseMemory<B: Backend>: Send + Sync + fmt::Debug + 'static {
    /// The start address.
    fn ptr(&self) -> DevicePtr;
    /// The size in bytes.
    fn size(&self) -> usize;
    /// The device the memory is on.
    fn device_id(&self) -> DeviceId;
    /// The name of the memory's kind (CuPy's `PooledMemory.identity`).
    fn identity(&self) -> &'static str {
        "<unknown>"
    }
}

/// One raw device allocation, freed when dropped: CuPy's `Memory`.
pub struct Memory<B: Backend> {
    ptr: DevicePtr,
    size: usize,
    device_id: DeviceId,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Memory<B> {
    /// Allocates `size` bytes on the current device. A size of 0 allocates nothing and gives a
    /// null pointer, as CuPy's `Memory(0)`.
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the device has not enough memory; the runtime's error.
    pub fn new(size: usize) -> Result<Self> {
        Self::new_on(current_device::<B>(), size)
    }

    /// Allocates `size` bytes on `device`.
    ///
    /// # Errors
    ///
    /// As [`Memory::new`].
    pub fn new_on(device: DeviceId, size: usize) -> Result<Self> {
        let ptr = if size == 0 { 0 } else { B::malloc(device, size)? };
        Ok(Memory { ptr, size, device_id: device, _backend: PhantomData })
    }
}

impl<B: Backend> Drop for Memory<B> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: `ptr` came from `B::malloc(device_id, _)` and is freed only here, once.
            // An error cannot be reported from `drop`; the memory is gone either way.
            let _ = unsafe { B::free(self.device_id, self.ptr) };
        }
    }
}

impl<B: Backend> fmt::Debug for Memory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<Memory 0x{:x} size={} device={}>", self.ptr, self.size, self.device_id)
    }
}

// SAFETY: the range is one live allocation of `B` on `device_id` until `drop` frees it.
unsafe impl<B: Backend> BaseMemory<B> for Memory<B> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> DeviceId {
        self.device_id
    }
    fn identity(&self) -> &'static str {
        "Memory"
    }
}

/// Device memory allocated by someone else, kept alive through an owner: CuPy's
/// `UnownedMemory`. gpumem never frees it.
pub struct UnownedMemory<B: Backend> {
    ptr: DevicePtr,
    size: usize,
    device_id: DeviceId,
    _owner: Option<Arc<dyn Any + Send + Sync>>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> UnownedMemory<B> {
    /// Wraps `size` bytes at `ptr`, keeping `owner` alive as long as this object. With `None`
    /// for the device, the device is asked of the runtime from the pointer; host memory and
    /// memory the runtime does not know are taken as the current device's, as CuPy does.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` is device memory of backend `B` (or host memory the runtime can
    /// access), valid for reads and writes while `owner` lives.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a null pointer without a device ("UnownedMemory requires explicit
    /// device ID for a null pointer.", CuPy's message); the runtime's error from the pointer query.
    pub unsafe fn new(
        ptr: DevicePtr,
        size: usize,
        owner: Option<Arc<dyn Any + Send + Sync>>,
        device_id: Option<DeviceId>,
    ) -> Result<Self> {
        let device_id = match device_id {
            Some(d) => d,
            None if ptr == 0 => {
                return Err(Error::InvalidArgument(
                    "UnownedMemory requires explicit device ID for a null pointer.".into(),
                ));
            }
            None => B::pointer_device(ptr)?.unwrap_or_else(current_device::<B>),
        };
        Ok(UnownedMemory { ptr, size, device_id, _owner: owner, _backend: PhantomData })
    }
}

impl<B: Backend> fmt::Debug for UnownedMemory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<UnownedMemory 0x{:x} size={} device={}>", self.ptr, self.size, self.device_id)
    }
}

// SAFETY: the caller of `new` promised the range is valid while the owner, which we hold, lives.
unsafe impl<B: Backend> BaseMemory<B> for UnownedMemory<B> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> DeviceId {
        self.device_id
    }
    fn identity(&self) -> &'static str {
        "UnownedMemory"
    }
}

// SAFETY: a lent chunk is a range of a raw block that its arena keeps alive while the chunk is
// lent (a block is freed only once all of it is free again), and `PooledMemory` keeps the arena
// alive; the address, size and device are fixed at construction.
unsafe impl<B: Backend> BaseMemory<B> for PooledMemory<B> {
    fn ptr(&self) -> DevicePtr {
        PooledMemory::ptr(self)
    }
    fn size(&self) -> usize {
        PooledMemory::size(self)
    }
    fn device_id(&self) -> DeviceId {
        PooledMemory::device_id(self)
    }
    fn identity(&self) -> &'static str {
        "PooledMemory"
    }
}

/// A pointer into device memory: CuPy's `MemoryPointer`. It keeps its memory alive; clones share
/// the memory.
///
/// Offset arithmetic (`p + n`, `n + p`, `p - n`, `p += n`, `p -= n`) is free to step outside the
/// memory, as in CuPy, but every operation that touches memory checks the pointer's offset and
/// the byte count against the memory's size and refuses out-of-range work with
/// [`Error::OutOfBounds`]. Unlike CuPy's cdef class, `p += n` changes only `p`, not other clones
/// (Rust values are not shared references).
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
pub struct MemoryPointer<B: Backend> {
    mem: Arc<dyn BaseMemory<B>>,
    offset: isize,
}

impl<B: Backend> Clone for MemoryPointer<B> {
    fn clone(&self) -> Self {
        MemoryPointer { mem: Arc::clone(&self.mem), offset: self.offset }
    }
}

impl<B: Backend> fmt::Debug for MemoryPointer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // CuPy's repr: <MemoryPointer 0x... device=0 mem=...>
        write!(f, "<MemoryPointer 0x{:x} device={} mem={:?}>", self.ptr(), self.device_id(), self.mem)
    }
}

impl<B: Backend> MemoryPointer<B> {
    /// A pointer `offset` bytes into `mem`.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` unless `0 <= offset <= mem.size()` (CuPy only asserts against null
    /// memory).
    pub fn new(mem: Arc<dyn BaseMemory<B>>, offset: isize) -> Result<Self> {
        let p = MemoryPointer { mem, offset };
        p.check(0, "MemoryPointer offset")?;
        Ok(p)
    }

    /// A pointer to the start of `mem`.
    pub fn from_memory(mem: impl BaseMemory<B>) -> Self {
        MemoryPointer { mem: Arc::new(mem), offset: 0 }
    }

    /// A pointer to the start of shared memory.
    pub fn from_arc(mem: Arc<dyn BaseMemory<B>>) -> Self {
        MemoryPointer { mem, offset: 0 }
    }

    /// The address this pointer points to (CuPy's `ptr`).
    #[must_use]
    pub fn ptr(&self) -> DevicePtr {
        self.mem.ptr().wrapping_add_signed(self.offset)
    }

    /// The offset from the start of the memory.
    #[must_use]
    pub fn offset(&self) -> isize {
        self.offset
    }

    /// The memory this pointer points into (CuPy's `mem`).
    #[must_use]
    pub fn mem(&self) -> &Arc<dyn BaseMemory<B>> {
        &self.mem
    }

    /// The device of the memory.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.mem.device_id()
    }

    /// The device of the memory, as a [`Device`].
    #[must_use]
    pub fn device(&self) -> Device<B> {
        Device::new(self.device_id())
    }

    /// Bytes from this pointer to the end of its memory; 0 when the pointer is outside it.
    #[must_use]
    pub fn size(&self) -> usize {
        usize::try_from(self.offset).map_or(0, |off| self.mem.size().saturating_sub(off))
    }

    /// `self + n`, or an error when the result would be outside the memory.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` unless the new offset is within `0..=size` of the memory.
    pub fn checked_add(&self, n: isize) -> Result<Self> {
        let p = MemoryPointer { mem: Arc::clone(&self.mem), offset: self.offset.saturating_add(n) };
        p.check(0, "MemoryPointer offset")?;
        Ok(p)
    }

    /// The address of `len` bytes from this pointer, if they lie within the memory.
    pub(crate) fn check(&self, len: usize, operation: &'static str) -> Result<DevicePtr> {
        let size = self.mem.size();
        let fits =
            usize::try_from(self.offset).is_ok_and(|off| off.checked_add(len).is_some_and(|end| end <= size));
        if fits {
            Ok(self.ptr())
        } else {
            Err(Error::OutOfBounds { operation, offset: self.offset, len, size })
        }
    }
}

impl<B: Backend> Add<isize> for &MemoryPointer<B> {
    type Output = MemoryPointer<B>;
    fn add(self, n: isize) -> MemoryPointer<B> {
        MemoryPointer { mem: Arc::clone(&self.mem), offset: self.offset.saturating_add(n) }
    }
}

impl<B: Backend> Add<isize> for MemoryPointer<B> {
    type Output = MemoryPointer<B>;
    fn add(mut self, n: isize) -> MemoryPointer<B> {
        self += n;
        self
    }
}

impl<B: Backend> Add<&MemoryPointer<B>> for isize {
    type Output = MemoryPointer<B>;
    fn add(self, p: &MemoryPointer<B>) -> MemoryPointer<B> {
        p + self
    }
}

impl<B: Backend> Add<MemoryPointer<B>> for isize {
    type Output = MemoryPointer<B>;
    fn add(self, p: MemoryPointer<B>) -> MemoryPointer<B> {
        p + self
    }
}

impl<B: Backend> Sub<isize> for &MemoryPointer<B> {
    type Output = MemoryPointer<B>;
    fn sub(self, n: isize) -> MemoryPointer<B> {
        MemoryPointer { mem: Arc::clone(&self.mem), offset: self.offset.saturating_sub(n) }
    }
}

impl<B: Backend> Sub<isize> for MemoryPointer<B> {
    type Output = MemoryPointer<B>;
    fn sub(mut self, n: isize) -> MemoryPointer<B> {
        self -= n;
        self
    }
}

impl<B: Backend> AddAssign<isize> for MemoryPointer<B> {
    fn add_assign(&mut self, n: isize) {
        self.offset = self.offset.saturating_add(n);
    }
}

impl<B: Backend> SubAssign<isize> for MemoryPointer<B> {
    fn sub_assign(&mut self, n: isize) {
        self.offset = self.offset.saturating_sub(n);
    }
}
