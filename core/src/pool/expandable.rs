//! Expandable segments: a raw allocator on the backend's virtual-memory operations whose blocks
//! grow and shrink in place (PyTorch's `expandable_segments:True`).
//!
//! Each block is one reserved address range with granules of physical memory mapped at its start.
//! A pool with expandable segments on meets a miss by mapping more granules at the end of the
//! arena's newest block, so its free tail and the new granules make one contiguous chunk, instead
//! of a new block beside it; `free_all_blocks` unmaps the free tails again.
//!
//! Each growth is one physical allocation of the whole growth, mapped with one call: a growth costs
//! three driver calls (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`) whatever its size. A mapping
//! is unmapped whole (the driver's rule), so a free tail gives back the growths that lie entirely
//! in it, newest first; one allocation per granule would give back any number of granules, at two
//! calls per granule on every growth (a 786 MiB growth: 786 calls, against 3).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::hal::{DeviceId, DevicePtr, PhysicalHandle, VirtualMemoryOps};

use super::raw::{RawAllocator, RawBlock};

/// The address space each block reserves unless a request needs more: 64 GiB. Address space is
/// cheap (nothing is mapped until used), and a larger range grows longer before a new block is
/// needed.
pub const DEFAULT_RESERVE: usize = 64 << 30;

/// A raw allocator of growable blocks on backend `B`'s virtual memory. See the [module
/// docs](self).
#[derive(Debug)]
pub struct ExpandableAllocator<B: VirtualMemoryOps> {
    granule: usize,
    reserve: usize,
    /// The devices besides the owner that get access to every new mapping.
    peers: Arc<Mutex<Vec<DeviceId>>>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: VirtualMemoryOps> ExpandableAllocator<B> {
    /// An allocator for device `device`'s memory, each block reserving `reserve` bytes of
    /// address space (rounded up to the granule; [`DEFAULT_RESERVE`] is a good choice).
    ///
    /// # Errors
    ///
    /// `Unsupported` where the backend has no virtual memory; the runtime's error.
    pub fn new(device: DeviceId, reserve: usize) -> Result<Self> {
        let granule = B::vm_granularity(device)?;
        Ok(ExpandableAllocator {
            granule,
            reserve: reserve.max(granule).next_multiple_of(granule),
            peers: Arc::new(Mutex::new(Vec::new())),
            _backend: std::marker::PhantomData,
        })
    }

    /// Gives `peers` (other devices, with peer access enabled) access to the memory of the
    /// mappings made from now on, as the owner has. Call it when peer access is enabled.
    pub fn set_peers(&self, peers: &[DeviceId]) {
        *self.peers.lock() = peers.to_vec();
    }

    /// Maps `bytes` (whole granules) at `block`'s end as one physical allocation, and makes them
    /// accessible: three driver calls (create, map, set access) whatever the size, where one
    /// allocation per granule would cost two calls per granule. Undoes what it did on an error.
    fn map_more(&self, block: &mut Segment<B>, bytes: usize) -> Result<()> {
        let start = block.base + block.mapped;
        let handle = B::vm_create(block.device, bytes)?;
        // SAFETY: `start..start + bytes` lies in the block's reserved range (the caller checked
        // `mapped + bytes <= reserved`), past everything mapped so far; `handle` was just made
        // with exactly `bytes` bytes and is mapped nowhere.
        if let Err(e) = unsafe { B::vm_map(block.device, start, bytes, handle) } {
            // SAFETY: the handle was just made and is not mapped; released once, here.
            let _ = unsafe { B::vm_release(block.device, handle) };
            return Err(e);
        }
        let mut devices = vec![block.device];
        devices.extend(self.peers.lock().iter().copied().filter(|&d| d != block.device));
        // SAFETY: `start..start + bytes` is the one mapping made just above.
        if let Err(e) = unsafe { B::vm_set_access(block.device, start, bytes, &devices) } {
            // SAFETY: mapped above at `start`, never handed out; released once, here.
            unsafe {
                let _ = B::vm_unmap(block.device, start, bytes);
                let _ = B::vm_release(block.device, handle);
            }
            return Err(e);
        }
        block.maps.push((bytes, handle));
        block.mapped += bytes;
        Ok(())
    }
}

/// A block of an [`ExpandableAllocator`]: a reserved range and the mappings at its start, one per
/// growth; unmapped, released and freed when dropped.
#[derive(Debug)]
pub struct Segment<B: VirtualMemoryOps> {
    device: DeviceId,
    base: DevicePtr,
    reserved: usize,
    mapped: usize,
    /// The mappings, in address order: each one physical allocation of that many bytes (whole
    /// granules), mapped right after the one before.
    maps: Vec<(usize, PhysicalHandle)>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: VirtualMemoryOps> Segment<B> {
    /// Unmaps and releases the last mappings, as many whole ones as fit in `bytes`; returns the
    /// bytes given back. A failure after some mappings went is reported as what went (the block
    /// is that much shorter); a failure before any went is the error.
    fn unmap_last(&mut self, bytes: usize) -> Result<usize> {
        let mut done = 0;
        while let Some(&(len, handle)) = self.maps.last() {
            if done + len > bytes {
                break;
            }
            let at = self.base + self.mapped - len;
            // SAFETY: the last mapping, `len` bytes at `at`, unmapped whole; the pool lends none
            // of it (it asked for the shrink, or the block is being dropped) and no work uses it.
            if let Err(e) = unsafe { B::vm_unmap(self.device, at, len) } {
                return if done == 0 { Err(e) } else { Ok(done) };
            }
            self.maps.pop();
            self.mapped -= len;
            done += len;
            // SAFETY: unmapped just above; released once (popped from the list). A failed
            // release loses the physical allocation, not the block's accounting: it is unmapped.
            let _ = unsafe { B::vm_release(self.device, handle) };
        }
        Ok(done)
    }

    /// The number of physical allocations mapped in the block (one per growth).
    #[must_use]
    pub fn mappings(&self) -> usize {
        self.maps.len()
    }
}

impl<B: VirtualMemoryOps> RawBlock for Segment<B> {
    fn address(&self) -> DevicePtr {
        self.base
    }
    fn size(&self) -> usize {
        self.mapped
    }
    fn device(&self) -> DeviceId {
        self.device
    }
}

impl<B: VirtualMemoryOps> Drop for Segment<B> {
    fn drop(&mut self) {
        // A failure here cannot be returned, and the memory is lost to this process either way;
        // no panic in drop.
        let _ = self.unmap_last(usize::MAX);
        if self.maps.is_empty() {
            // SAFETY: the range was reserved by `vm_reserve` with this size and nothing is mapped
            // in it any more; freed once, here.
            let _ = unsafe { B::vm_free_range(self.device, self.base, self.reserved) };
        }
    }
}

impl<B: VirtualMemoryOps> RawAllocator for ExpandableAllocator<B> {
    type Block = Segment<B>;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<Segment<B>> {
        let first = size.max(1).next_multiple_of(self.granule);
        let reserved = self.reserve.max(first);
        let base = B::vm_reserve(device, reserved)?;
        let mut block = Segment {
            device,
            base,
            reserved,
            mapped: 0,
            maps: Vec::new(),
            _backend: std::marker::PhantomData,
        };
        // On an error the empty block is dropped, which frees the range.
        self.map_more(&mut block, first)?;
        Ok(block)
    }

    fn expandable(&self) -> bool {
        true
    }

    fn granule(&self) -> usize {
        self.granule
    }

    fn grow(&self, block: &mut Segment<B>, extra: usize) -> Result<bool> {
        if !extra.is_multiple_of(self.granule) || block.mapped + extra > block.reserved {
            return Ok(false);
        }
        self.map_more(block, extra)?;
        Ok(true)
    }

    fn shrink(&self, block: &mut Segment<B>, bytes: usize) -> Result<usize> {
        if !bytes.is_multiple_of(self.granule) || bytes >= block.mapped {
            return Ok(0);
        }
        block.unmap_last(bytes)
    }
}
