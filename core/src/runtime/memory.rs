//! Device memory objects: raw allocations ([`Memory`]), foreign memory ([`UnownedMemory`]) and
//! the pool's chunks, all [`BaseMemory`].
//!
//! Every memory object knows its size, so every [`MemoryPointer`](crate::MemoryPointer) operation
//! is checked against it: an out-of-range offset, copy or memset is an
//! [`Error::OutOfBounds`] and touches nothing. CuPy does no such check (its copies write past the
//! end of an allocation); that is gpumem's main deliberate difference from it.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DevicePtr};
use crate::pool::counting::Counted;
use crate::pool::{ArenaKey, OtherStreams, PooledMemory, RawAllocator, RawBlock};
use crate::runtime::state::{current_device, record_drop_error, StateRuntime};

/// A block of device memory of backend `B`: CuPy's `BaseMemory`.
///
/// # Safety
///
/// Implementors promise that `ptr()..ptr() + size()` is device memory of backend `B` on
/// `device_id()` (or, for `size() == 0`, that nothing is promised and `ptr()` may be 0), valid
/// for reads and writes by the runtime for as long as the object lives, and that the three
/// values never change. gpumem's safe copies rely on it. An implementor that returns `Some` from
/// [`reuse_stream`](Self::reuse_stream) promises more: the range stays valid for the work queued
/// on that stream until the stream has passed it, even after the object is dropped, and is used
/// meanwhile only by that stream's later work (a pool's stream-ordered reuse, on blocks freed
/// only after the device's queued work). One that returns `true` from
/// [`note_other_stream`](Self::note_other_stream) promises the same for the work queued so far
/// on the stream it noted: when dropped, its memory is lent again only behind that work (a pool's
/// chunk goes back behind a fence on it, see [`PooledMemory::note_other_stream`]).
pub unsafe trait BaseMemory<B: StateRuntime>: Send + Sync + fmt::Debug + 'static {
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
    /// The pool chunk's identifier, for memory a pool lent (CuPy's `PooledMemory` id, the
    /// `pmem_id` of its hook events); `None` for other memory.
    fn pmem_id(&self) -> Option<u64> {
        None
    }
    /// The [`Pool::uid`](crate::pool::Pool::uid) of the pool that lent this memory; `None` for
    /// memory no pool lent.
    fn pool_uid(&self) -> Option<usize> {
        None
    }
    /// For a pool's chunk whose reuse the pool orders on a stream: that stream's arena key (see
    /// [`PooledMemory::reuse_stream`]). Work gpumem queues on that stream then keeps nothing
    /// alive for this memory. `None` (the default) for other memory, which queued work keeps
    /// alive until it is done.
    fn reuse_stream(&self) -> Option<ArenaKey> {
        None
    }
    /// For memory with a [`reuse_stream`](Self::reuse_stream): notes that work was queued on it
    /// on another stream of its device (by arena key) with nothing to keep it alive, and returns
    /// `true`; the memory's reuse is then ordered after that work too. `false` (the default)
    /// when it cannot: that work then keeps the memory alive until it is done.
    fn note_other_stream(&self, stream: ArenaKey) -> bool {
        let _ = stream;
        false
    }
    /// The other streams noted by [`note_other_stream`](Self::note_other_stream).
    fn other_streams(&self) -> OtherStreams {
        OtherStreams::None
    }
}

/// One raw device allocation, freed when dropped: CuPy's `Memory`.
pub struct Memory<B: StateRuntime> {
    ptr: DevicePtr,
    size: usize,
    device_id: DeviceId,
    _backend: PhantomData<fn() -> B>,
}

impl<B: StateRuntime> Memory<B> {
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

impl<B: StateRuntime> Drop for Memory<B> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let (device, ptr) = (self.device_id, self.ptr);
            crate::runtime::state::drop_outside_callbacks::<B>(move || {
                // SAFETY: `ptr` came from `B::malloc(device, _)` and is freed only here, once,
                // after every queued operation that used it (queued work keeps its memory
                // alive). The memory is gone either way; an error is kept for the next
                // synchronize.
                if let Err(e) = unsafe { B::free(device, ptr) } {
                    record_drop_error::<B>(e);
                }
            });
        }
    }
}

impl<B: StateRuntime> fmt::Debug for Memory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<Memory 0x{:x} size={} device={}>", self.ptr, self.size, self.device_id)
    }
}

// SAFETY: the range is one live allocation of `B` on `device_id` until `drop` frees it.
unsafe impl<B: StateRuntime> BaseMemory<B> for Memory<B> {
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
pub struct UnownedMemory<B: StateRuntime> {
    ptr: DevicePtr,
    size: usize,
    device_id: DeviceId,
    _owner: Option<Arc<dyn Any + Send + Sync>>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: StateRuntime> UnownedMemory<B> {
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

impl<B: StateRuntime> fmt::Debug for UnownedMemory<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<UnownedMemory 0x{:x} size={} device={}>", self.ptr, self.size, self.device_id)
    }
}

// SAFETY: the caller of `new` promised the range is valid while the owner, which we hold, lives.
unsafe impl<B: StateRuntime> BaseMemory<B> for UnownedMemory<B> {
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
// lent (a block is freed only once all of it is free again); the pool checked that the block
// holds the whole chunk, and the block is device memory of `B` (`A::Block: BaseMemory<B>`); the
// address, size and device are fixed at construction.
unsafe impl<B: StateRuntime, A: RawAllocator> BaseMemory<B> for PooledMemory<A>
where
    A::Block: BaseMemory<B>,
{
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
    fn pmem_id(&self) -> Option<u64> {
        Some(PooledMemory::pmem_id(self))
    }
    fn pool_uid(&self) -> Option<usize> {
        PooledMemory::pool_uid(self)
    }
    fn reuse_stream(&self) -> Option<ArenaKey> {
        PooledMemory::reuse_stream(self)
    }
    fn note_other_stream(&self, stream: ArenaKey) -> bool {
        PooledMemory::note_other_stream(self, stream)
    }
    fn other_streams(&self) -> OtherStreams {
        PooledMemory::other_streams(self)
    }
}

// SAFETY: every method forwards to the inner block, a memory object of `B` that the counted
// block owns and changes only as the inner allocator would change it alone, so the inner block's
// promise is this one's.
unsafe impl<B: StateRuntime, K: RawBlock + BaseMemory<B>> BaseMemory<B> for Counted<K> {
    fn ptr(&self) -> DevicePtr {
        self.block().ptr()
    }
    fn size(&self) -> usize {
        BaseMemory::size(self.block())
    }
    fn device_id(&self) -> DeviceId {
        self.block().device_id()
    }
    fn identity(&self) -> &'static str {
        self.block().identity()
    }
}

/// The pool sees a memory object as a raw block.
macro_rules! raw_block {
    ($($ty:ty),*) => {$(
        impl<B: StateRuntime> RawBlock for $ty {
            fn address(&self) -> DevicePtr {
                BaseMemory::<B>::ptr(self)
            }
            fn size(&self) -> usize {
                BaseMemory::<B>::size(self)
            }
            fn device(&self) -> DeviceId {
                BaseMemory::<B>::device_id(self)
            }
        }
    )*};
}
raw_block!(Memory<B>, UnownedMemory<B>, Box<dyn BaseMemory<B>>);

// SAFETY: forwards to the boxed object, which promises the same.
unsafe impl<B: StateRuntime> BaseMemory<B> for Box<dyn BaseMemory<B>> {
    fn ptr(&self) -> DevicePtr {
        (**self).ptr()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn device_id(&self) -> DeviceId {
        (**self).device_id()
    }
    fn identity(&self) -> &'static str {
        (**self).identity()
    }
    fn pmem_id(&self) -> Option<u64> {
        (**self).pmem_id()
    }
    fn pool_uid(&self) -> Option<usize> {
        (**self).pool_uid()
    }
    fn reuse_stream(&self) -> Option<ArenaKey> {
        (**self).reuse_stream()
    }
    fn note_other_stream(&self, stream: ArenaKey) -> bool {
        (**self).note_other_stream(stream)
    }
    fn other_streams(&self) -> OtherStreams {
        (**self).other_streams()
    }
}
