//! Expandable segments: a raw allocator on the backend's virtual-memory operations whose blocks
//! grow and shrink in place (PyTorch's `expandable_segments:True`).
//!
//! Each block is one reserved address range with granules of physical memory mapped at its start.
//! A pool with expandable segments on meets a miss by mapping more granules at the end of the
//! arena's newest block, so its free tail and the new granules make one contiguous chunk, instead
//! of a new block beside it; `free_all_blocks` unmaps the free tails again. Every granule is its
//! own physical allocation, so any number of granules can be unmapped from the end.

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

    /// Maps `bytes` (whole granules) at `block`'s end, one physical allocation per granule, and
    /// makes them accessible; undoes what it did on an error.
    fn map_more(&self, block: &mut Segment<B>, bytes: usize) -> Result<()> {
        let start = block.base + block.mapped;
        let mut made: Vec<PhysicalHandle> = Vec::new();
        let result = (|| {
            for i in 0..bytes / self.granule {
                let handle = B::vm_create(block.device, self.granule)?;
                let at = start + i * self.granule;
                // SAFETY: `at` lies in the block's reserved range (the caller checked
                // `mapped + bytes <= reserved`), past everything mapped so far.
                let mapped = unsafe { B::vm_map(block.device, at, self.granule, handle) };
                if let Err(e) = mapped {
                    // SAFETY: the handle was just made and is not mapped.
                    let _ = unsafe { B::vm_release(block.device, handle) };
                    return Err(e);
                }
                made.push(handle);
            }
            let mut devices = vec![block.device];
            devices.extend(self.peers.lock().iter().copied().filter(|&d| d != block.device));
            // SAFETY: `start..start + bytes` was mapped just above, in whole mappings.
            unsafe { B::vm_set_access(block.device, start, bytes, &devices) }
        })();
        match result {
            Ok(()) => {
                block.handles.extend(made);
                block.mapped += bytes;
                Ok(())
            }
            Err(e) => {
                for (i, handle) in made.into_iter().enumerate() {
                    // SAFETY: mapped above at this address, unused (never handed out).
                    unsafe {
                        let _ = B::vm_unmap(block.device, start + i * self.granule, self.granule);
                        let _ = B::vm_release(block.device, handle);
                    }
                }
                Err(e)
            }
        }
    }
}

/// A block of an [`ExpandableAllocator`]: a reserved range and the granules mapped at its start;
/// unmapped, released and freed when dropped.
#[derive(Debug)]
pub struct Segment<B: VirtualMemoryOps> {
    device: DeviceId,
    base: DevicePtr,
    reserved: usize,
    mapped: usize,
    granule: usize,
    /// One physical allocation per mapped granule, in address order.
    handles: Vec<PhysicalHandle>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: VirtualMemoryOps> Segment<B> {
    /// Unmaps and releases the last `n` granules.
    fn unmap_last(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            let Some(&handle) = self.handles.last() else { break };
            let at = self.base + self.mapped - self.granule;
            // SAFETY: the last mapped granule, at `at`; the pool lends none of it (it asked for
            // the shrink, or the block is being dropped) and no work uses it.
            unsafe { B::vm_unmap(self.device, at, self.granule)? };
            self.handles.pop();
            self.mapped -= self.granule;
            // SAFETY: unmapped just above; released once (popped from the list).
            unsafe { B::vm_release(self.device, handle)? };
        }
        Ok(())
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
        let _ = self.unmap_last(self.handles.len());
        if self.handles.is_empty() {
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
            granule: self.granule,
            handles: Vec::new(),
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

    fn shrink(&self, block: &mut Segment<B>, bytes: usize) -> Result<bool> {
        if !bytes.is_multiple_of(self.granule) || bytes >= block.mapped {
            return Ok(false);
        }
        block.unmap_last(bytes / self.granule)?;
        Ok(true)
    }
}
