//! Typed device buffers: [`DeviceBuffer<T, B>`], `len` elements of a plain-old-data type `T` in
//! memory from the current allocator (by default the pool), with copies from and to slices and
//! vectors, fills with a `T`, and sub-slice views.
//!
//! A buffer is a [`MemoryPointer`] and an element count: every operation is one of the pointer's
//! byte operations over `len * size_of::<T>()` bytes, so the checks and the stream-safety rules of
//! the byte API hold unchanged (synchronous forms on the legacy default stream and refused while
//! the current stream captures; `_async` forms ordered on the stream given or the current one,
//! with host data staged in pinned memory that gpumem keeps alive until the transfer is done).
//! The pool rounds each allocation up to its unit; a buffer never reaches past its `len`
//! elements, so views and copies are checked against the length asked for, not the chunk.
//!
//! Element types are [`bytemuck::Pod`]: any bit pattern is a valid value and there is no padding,
//! so bytes copied back from a device are a valid `[T]`.
//!
//! ```
//! use gpumem_core::host::Host;
//! use gpumem_core::DeviceBuffer;
//!
//! let a = DeviceBuffer::<f32, Host>::from_slice(&[1.0, 2.0, 3.0, 4.0])?;
//! let tail = a.slice(2..)?;
//! tail.fill(9.5)?;
//! assert_eq!(a.to_vec()?, [1.0, 2.0, 9.5, 9.5]);
//! assert!(a.slice(2..5).is_err()); // past the 4 elements asked for, though the chunk is larger
//! # Ok::<(), gpumem_core::Error>(())
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ops::{Bound, RangeBounds};

use bytemuck::Pod;

use crate::error::{Error, Result};
use crate::hal::{DeviceId, DevicePtr};
use crate::runtime::allocator::{alloc, alloc_pinned_memory};
use crate::runtime::pinned::PinnedMemoryPointer;
use crate::runtime::pointer::MemoryPointer;
use crate::runtime::statics::Runtime;
use crate::runtime::stream::Stream;

/// `len` elements of `T` in device memory of backend `B`: the typed face of a
/// [`MemoryPointer`]. See the [module docs](self).
///
/// Cloning a buffer or taking a [`slice`](DeviceBuffer::slice) of it shares the memory (as CuPy's
/// views do); the memory goes back to its allocator when the last buffer and pointer into it are
/// dropped. Copy the contents with [`try_clone`](DeviceBuffer::try_clone).
pub struct DeviceBuffer<T: Pod, B: Runtime> {
    ptr: MemoryPointer<B>,
    len: usize,
    _elements: PhantomData<fn() -> T>,
}

impl<T: Pod, B: Runtime> Clone for DeviceBuffer<T, B> {
    fn clone(&self) -> Self {
        DeviceBuffer { ptr: self.ptr.clone(), len: self.len, _elements: PhantomData }
    }
}

impl<T: Pod, B: Runtime> fmt::Debug for DeviceBuffer<T, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("element", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("ptr", &format_args!("{:#x}", self.ptr.ptr()))
            .field("device", &self.ptr.device_id())
            .finish()
    }
}

/// Bytes of `len` elements of `T`.
fn byte_len<T>(len: usize, operation: &'static str) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{operation}: {len} elements of {} overflow usize",
            crate::error::Bytes(size_of::<T>())
        ))
    })
}

/// Refuses two lengths that differ, as `<[T]>::copy_from_slice` would panic on them.
fn same_len(buffer: usize, other: usize, operation: &'static str) -> Result<()> {
    if buffer != other {
        return Err(Error::InvalidArgument(format!(
            "{operation}: the buffer has {buffer} elements, the other side {other}"
        )));
    }
    Ok(())
}

impl<T: Pod, B: Runtime> DeviceBuffer<T, B> {
    /// A buffer of `len` zeroed elements on the current device, from the current allocator.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the byte size overflows; the allocator's errors (`OutOfMemory`,
    /// `LimitExceeded`, a hook's); the memset's.
    pub fn zeros(len: usize) -> Result<Self> {
        let buf = Self::alloc(len, "DeviceBuffer::zeros")?;
        buf.ptr.memset(0, buf.size_in_bytes())?;
        Ok(buf)
    }

    /// A buffer of `len` copies of `value` on the current device.
    ///
    /// # Errors
    ///
    /// As [`zeros`](DeviceBuffer::zeros), and the fill's.
    pub fn from_elem(value: T, len: usize) -> Result<Self> {
        let buf = Self::alloc(len, "DeviceBuffer::from_elem")?;
        buf.fill(value)?;
        Ok(buf)
    }

    /// A buffer holding a copy of `data` on the current device.
    ///
    /// # Errors
    ///
    /// As [`zeros`](DeviceBuffer::zeros), and the copy's.
    pub fn from_slice(data: &[T]) -> Result<Self> {
        let buf = Self::alloc(data.len(), "DeviceBuffer::from_slice")?;
        buf.copy_from_slice(data)?;
        Ok(buf)
    }

    /// A buffer holding a copy of `data`, the copy ordered on `stream` (or the current stream):
    /// `data` is staged in pinned memory first, so the borrow ends when this returns.
    ///
    /// # Errors
    ///
    /// As [`from_slice`](DeviceBuffer::from_slice); `NotAllowedWhileCapturing` while the stream
    /// captures (host transfers cannot be captured).
    pub fn from_slice_async(data: &[T], stream: Option<&Stream<B>>) -> Result<Self> {
        let buf = Self::alloc(data.len(), "DeviceBuffer::from_slice_async")?;
        buf.copy_from_slice_async(data, stream)?;
        Ok(buf)
    }

    /// `len` elements at `ptr`: the typed view of memory allocated elsewhere.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `len` elements do not fit in the memory from `ptr`; `InvalidArgument`
    /// when the address is not aligned for `T` or the byte size overflows.
    pub fn from_pointer(ptr: MemoryPointer<B>, len: usize) -> Result<Self> {
        let bytes = byte_len::<T>(len, "DeviceBuffer::from_pointer")?;
        ptr.check(bytes, "DeviceBuffer::from_pointer")?;
        if len != 0 && !ptr.ptr().is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::InvalidArgument(format!(
                "DeviceBuffer::from_pointer: address {:#x} is not aligned to {} bytes for {}",
                ptr.ptr(),
                std::mem::align_of::<T>(),
                std::any::type_name::<T>()
            )));
        }
        Ok(DeviceBuffer { ptr, len, _elements: PhantomData })
    }

    fn alloc(len: usize, operation: &'static str) -> Result<Self> {
        let bytes = byte_len::<T>(len, operation)?;
        let ptr = alloc::<B>(bytes)?;
        // Pool chunks are aligned to the pool's unit (512 bytes), raw allocations to the
        // runtime's (256 or more); `from_pointer` checks it all the same.
        Self::from_pointer(ptr, len)
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size of the elements in bytes, `len * size_of::<T>()` (never the rounded chunk).
    #[must_use]
    pub fn size_in_bytes(&self) -> usize {
        // Checked when the buffer was made.
        self.len * size_of::<T>()
    }

    /// The device address of the first element.
    #[must_use]
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr.ptr()
    }

    /// The device the memory is on.
    #[must_use]
    pub fn device_id(&self) -> DeviceId {
        self.ptr.device_id()
    }

    /// The byte pointer the buffer starts at (which keeps the memory alive).
    #[must_use]
    pub fn as_pointer(&self) -> &MemoryPointer<B> {
        &self.ptr
    }

    /// The byte pointer, giving up the element type.
    #[must_use]
    pub fn into_pointer(self) -> MemoryPointer<B> {
        self.ptr
    }

    /// Elements `range` of this buffer, sharing its memory.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when the range is decreasing or ends past [`len`](DeviceBuffer::len).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<Self> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(self.len),
        };
        let (start, end) = match (start, end) {
            (Some(s), Some(e)) if s <= e && e <= self.len => (s, e),
            _ => {
                let elements = |n: Option<usize>| n.unwrap_or(usize::MAX).saturating_mul(size_of::<T>());
                return Err(Error::OutOfBounds {
                    operation: "DeviceBuffer::slice",
                    offset: isize::try_from(elements(start)).unwrap_or(isize::MAX),
                    len: elements(end).saturating_sub(elements(start)),
                    size: self.size_in_bytes(),
                });
            }
        };
        // `start <= len`, so the byte offset fits: the buffer's bytes fit in `isize` (allocations
        // do).
        let offset = isize::try_from(start * size_of::<T>())
            .map_err(|_| Error::InvalidArgument("DeviceBuffer::slice: offset overflows isize".into()))?;
        let ptr = self.ptr.checked_add(offset)?;
        Ok(DeviceBuffer { ptr, len: end - start, _elements: PhantomData })
    }

    /// Copies `data` into the buffer, on the legacy default stream; returns when the copy is done.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when `data.len() != self.len()`; `NotAllowedWhileCapturing`; the
    /// runtime's error.
    pub fn copy_from_slice(&self, data: &[T]) -> Result<()> {
        same_len(self.len, data.len(), "DeviceBuffer::copy_from_slice")?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.ptr.copy_from_host(bytes, bytes.len())
    }

    /// Copies the buffer into `out`, on the legacy default stream; returns when the copy is done.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when `out.len() != self.len()`; `NotAllowedWhileCapturing`; the
    /// runtime's error.
    pub fn copy_to_slice(&self, out: &mut [T]) -> Result<()> {
        same_len(self.len, out.len(), "DeviceBuffer::copy_to_slice")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let n = bytes.len();
        self.ptr.copy_to_host(bytes, n)
    }

    /// The buffer's contents, copied to a new vector (on the legacy default stream).
    ///
    /// # Errors
    ///
    /// As [`copy_to_slice`](DeviceBuffer::copy_to_slice).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_slice(&mut out)?;
        Ok(out)
    }

    /// Copies another buffer's elements into this one, on the legacy default stream; returns when
    /// the copy is done. The two may be on different devices.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the lengths differ; `Overlap` when the two share bytes;
    /// `NotAllowedWhileCapturing`; the runtime's error.
    pub fn copy_from_buffer(&self, src: &DeviceBuffer<T, B>) -> Result<()> {
        same_len(self.len, src.len, "DeviceBuffer::copy_from_buffer")?;
        self.ptr.copy_from_device(&src.ptr, self.size_in_bytes())
    }

    /// A new buffer on the current device with a copy of this one's elements.
    ///
    /// # Errors
    ///
    /// The allocation's and the copy's.
    pub fn try_clone(&self) -> Result<Self> {
        let copy = Self::alloc(self.len, "DeviceBuffer::try_clone")?;
        copy.copy_from_buffer(self)?;
        Ok(copy)
    }

    /// Sets every element to `value`, on the legacy default stream; returns when done.
    ///
    /// A value whose bytes are all equal (zero, say) is one memset; any other is written once
    /// and then doubled by device-to-device copies, `log2(len)` of them, with no host buffer
    /// of the buffer's size.
    ///
    /// # Errors
    ///
    /// `NotAllowedWhileCapturing`; the runtime's error.
    pub fn fill(&self, value: T) -> Result<()> {
        if let Some(byte) = uniform_byte(&value) {
            return self.ptr.memset(byte, self.size_in_bytes());
        }
        if self.len == 0 {
            return Ok(());
        }
        self.slice(..1)?.copy_from_slice(std::slice::from_ref(&value))?;
        self.double(|dst, src, bytes| dst.copy_from_device(src, bytes))
    }

    /// Copies the first element over the rest, doubling the filled prefix each step.
    fn double(
        &self,
        mut copy: impl FnMut(&MemoryPointer<B>, &MemoryPointer<B>, usize) -> Result<()>,
    ) -> Result<()> {
        let mut filled = 1;
        while filled < self.len {
            let n = filled.min(self.len - filled);
            let dst = self.slice(filled..filled + n)?;
            copy(&dst.ptr, &self.ptr, n * size_of::<T>())?;
            filled += n;
        }
        Ok(())
    }

    /// Copies `data` into the buffer, ordered on `stream` (or the current stream). `data` is
    /// staged in memory from the default pinned memory pool, which gpumem keeps alive until the
    /// copy is done, so the borrow ends when this returns.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the lengths differ; `NotAllowedWhileCapturing` while the stream
    /// captures; the pinned allocation's and the runtime's errors.
    pub fn copy_from_slice_async(&self, data: &[T], stream: Option<&Stream<B>>) -> Result<()> {
        same_len(self.len, data.len(), "DeviceBuffer::copy_from_slice_async")?;
        if data.is_empty() {
            return Ok(());
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let staging = alloc_pinned_memory::<B>(bytes.len())?;
        staging.write(bytes)?;
        self.ptr.copy_from_host_async(&staging, bytes.len(), stream)
    }

    /// Copies `size_in_bytes()` bytes from pinned host memory into the buffer, ordered on
    /// `stream` (or the current stream); gpumem keeps `src`'s memory alive until then.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `src` holds fewer bytes; `NotAllowedWhileCapturing`; the runtime's
    /// error.
    pub fn copy_from_pinned_async(
        &self,
        src: &PinnedMemoryPointer<B>,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        self.ptr.copy_from_host_async(src, self.size_in_bytes(), stream)
    }

    /// Copies the buffer into pinned host memory, ordered on `stream` (or the current stream);
    /// the bytes are there once the stream has passed the copy (read them with
    /// [`PinnedMemoryPointer::read`], or [`read_pinned`](DeviceBuffer::read_pinned)).
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `dst` holds fewer bytes; `NotAllowedWhileCapturing`; the runtime's
    /// error.
    pub fn copy_to_pinned_async(
        &self,
        dst: &PinnedMemoryPointer<B>,
        stream: Option<&Stream<B>>,
    ) -> Result<()> {
        self.ptr.copy_to_host_async(dst, self.size_in_bytes(), stream)
    }

    /// Reads `out.len()` elements from pinned host memory, as written by
    /// [`copy_to_pinned_async`](DeviceBuffer::copy_to_pinned_async) once its stream has passed
    /// the copy.
    ///
    /// # Errors
    ///
    /// `OutOfBounds` when `src` holds fewer bytes.
    pub fn read_pinned(src: &PinnedMemoryPointer<B>, out: &mut [T]) -> Result<()> {
        src.read(bytemuck::cast_slice_mut(out))
    }

    /// Copies another buffer's elements into this one, ordered on `stream` (or the current
    /// stream).
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the lengths differ; `Overlap`; the runtime's error.
    pub fn copy_from_buffer_async(&self, src: &DeviceBuffer<T, B>, stream: Option<&Stream<B>>) -> Result<()> {
        same_len(self.len, src.len, "DeviceBuffer::copy_from_buffer_async")?;
        self.ptr.copy_from_device_async(&src.ptr, self.size_in_bytes(), stream)
    }

    /// Sets every element to `value`, ordered on `stream` (or the current stream). Capturable
    /// when the value's bytes are all equal (one memset); any other value is staged in pinned
    /// memory, which cannot be captured, and then doubled by device-to-device copies on the
    /// stream.
    ///
    /// # Errors
    ///
    /// `NotAllowedWhileCapturing` for a staged value while the stream captures; the pinned
    /// allocation's and the runtime's errors.
    pub fn fill_async(&self, value: T, stream: Option<&Stream<B>>) -> Result<()> {
        if let Some(byte) = uniform_byte(&value) {
            return self.ptr.memset_async(byte, self.size_in_bytes(), stream);
        }
        if self.len == 0 {
            return Ok(());
        }
        self.slice(..1)?.copy_from_slice_async(std::slice::from_ref(&value), stream)?;
        self.double(|dst, src, bytes| dst.copy_from_device_async(src, bytes, stream))
    }
}

/// The byte every byte of `value` is, if they are all the same (a memset can then write it).
fn uniform_byte<T: Pod>(value: &T) -> Option<u8> {
    let bytes = bytemuck::bytes_of(value);
    match bytes.split_first() {
        Some((&first, rest)) if rest.iter().all(|&b| b == first) => Some(first),
        // A zero-sized `T`: nothing to write.
        None => Some(0),
        Some(_) => None,
    }
}
