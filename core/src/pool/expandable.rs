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
//!
//! Peer access does not reach memory mapped this way: each mapping names the devices that may
//! access it. [`grant_peer_access`] (which the runtime calls when it enables peer access) adds a
//! device to every allocator of the owner's memory, for its mappings made before and after.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

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
    access: Arc<Mutex<Access>>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

/// Who reaches an allocator's memory, and what of it is mapped: shared by the allocator, its
/// segments and the process's table of allocators ([`grant_peer_access`]). Its lock is held
/// across the driver calls that map, unmap or give access, so a peer granted access while a
/// segment grows or shrinks misses no mapping and touches no unmapped one.
#[derive(Debug)]
struct Access {
    owner: DeviceId,
    /// The devices besides the owner with access to every mapping.
    peers: Vec<DeviceId>,
    /// Each live segment's base address and the bytes mapped at its start.
    mapped: HashMap<DevicePtr, usize>,
}

impl Access {
    fn devices(&self) -> Vec<DeviceId> {
        let mut devices = vec![self.owner];
        devices.extend(self.peers.iter().copied().filter(|&d| d != self.owner));
        devices
    }
}

/// Gives `devices` access to `size` mapped bytes at `ptr` on backend `B`, for the table of
/// allocators, which cannot be generic.
///
/// # Safety
///
/// `ptr..ptr + size` is mapped memory of `owner` (whole mappings) for the whole call.
unsafe fn set_access<B: VirtualMemoryOps>(
    owner: DeviceId,
    ptr: DevicePtr,
    size: usize,
    devices: &[DeviceId],
) -> Result<()> {
    // SAFETY: the caller's promise.
    unsafe { B::vm_set_access(owner, ptr, size, devices) }
}

type SetAccess = unsafe fn(DeviceId, DevicePtr, usize, &[DeviceId]) -> Result<()>;

/// One entry of the table of allocators: the allocator's backend, what it shares, and how to
/// give access on that backend.
type Registered = (TypeId, Weak<Mutex<Access>>, SetAccess);

/// Every live expandable allocator of the process.
fn allocators() -> &'static Mutex<Vec<Registered>> {
    static ALLOCATORS: Mutex<Vec<Registered>> = Mutex::new(Vec::new());
    &ALLOCATORS
}

/// Every `(backend, owner, peer)` granted so far, for the allocators made later.
fn granted() -> &'static Mutex<Vec<(TypeId, DeviceId, DeviceId)>> {
    static GRANTED: Mutex<Vec<(TypeId, DeviceId, DeviceId)>> = Mutex::new(Vec::new());
    &GRANTED
}

/// Gives device `peer` access to every expandable segment of device `owner` on backend `B`:
/// the memory mapped now and every mapping made later, by these allocators and those made
/// after. The runtime calls it once it has enabled
/// peer access from `peer` to `owner`: peer access covers `cuMemAlloc`'s memory, but memory
/// mapped through the virtual-memory API is reachable only from the devices its access names.
/// A peer that already has access costs a look at each allocator.
///
/// # Errors
///
/// The driver's error giving access; the peer keeps what it was given before the failure.
pub fn grant_peer_access<B: VirtualMemoryOps + 'static>(owner: DeviceId, peer: DeviceId) -> Result<()> {
    if owner == peer {
        return Ok(());
    }
    {
        let mut granted = granted().lock();
        let pair = (TypeId::of::<B>(), owner, peer);
        if !granted.contains(&pair) {
            granted.push(pair);
        }
    }
    let live: Vec<(Arc<Mutex<Access>>, SetAccess)> = {
        let mut table = allocators().lock();
        table.retain(|(_, access, _)| access.strong_count() > 0);
        table
            .iter()
            .filter(|(backend, _, _)| *backend == TypeId::of::<B>())
            .filter_map(|(_, access, set)| Some((access.upgrade()?, *set)))
            .collect()
    };
    for (access, set) in live {
        let mut a = access.lock();
        if a.owner != owner || a.peers.contains(&peer) {
            continue;
        }
        a.peers.push(peer);
        let devices = a.devices();
        for (&base, &len) in &a.mapped {
            if len > 0 {
                // SAFETY: `mapped` holds what is mapped at each live segment's start, and the
                // lock held here keeps it so (segments map and unmap under it).
                unsafe { set(owner, base, len, &devices) }?;
            }
        }
    }
    Ok(())
}

impl<B: VirtualMemoryOps + 'static> ExpandableAllocator<B> {
    /// An allocator for device `device`'s memory, each block reserving `reserve` bytes of
    /// address space (rounded up to the granule; [`DEFAULT_RESERVE`] is a good choice). Its
    /// mappings are accessible from `device` and from every device [`grant_peer_access`] names.
    ///
    /// # Errors
    ///
    /// `Unsupported` where the backend has no virtual memory; the runtime's error.
    pub fn new(device: DeviceId, reserve: usize) -> Result<Self> {
        let granule = B::vm_granularity(device)?;
        let peers = granted()
            .lock()
            .iter()
            .filter(|(backend, owner, _)| *backend == TypeId::of::<B>() && *owner == device)
            .map(|&(_, _, peer)| peer)
            .collect();
        let access = Arc::new(Mutex::new(Access { owner: device, peers, mapped: HashMap::new() }));
        allocators().lock().push((TypeId::of::<B>(), Arc::downgrade(&access), set_access::<B>));
        Ok(ExpandableAllocator {
            granule,
            reserve: reserve.max(granule).next_multiple_of(granule),
            access,
            _backend: std::marker::PhantomData,
        })
    }
}

impl<B: VirtualMemoryOps> ExpandableAllocator<B> {
    /// Maps `bytes` (whole granules) at `block`'s end as one physical allocation, and makes them
    /// accessible: three driver calls (create, map, set access) whatever the size, where one
    /// allocation per granule would cost two calls per granule. Undoes what it did on an error.
    fn map_more(&self, block: &mut Segment<B>, bytes: usize) -> Result<()> {
        let mut access = self.access.lock();
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
        let devices = access.devices();
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
        access.mapped.insert(block.base, block.mapped);
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
    /// Its allocator's: the devices with access, and where this segment's mappings are.
    access: Arc<Mutex<Access>>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: VirtualMemoryOps> Segment<B> {
    /// Unmaps and releases the last mappings, as many whole ones as fit in `bytes`; returns the
    /// bytes given back. A failure after some mappings went is reported as what went (the block
    /// is that much shorter); a failure before any went is the error.
    fn unmap_last(&mut self, bytes: usize) -> Result<usize> {
        let access = Arc::clone(&self.access);
        let mut access = access.lock();
        let done = self.unmap_last_locked(bytes);
        if self.mapped == 0 {
            access.mapped.remove(&self.base);
        } else {
            access.mapped.insert(self.base, self.mapped);
        }
        done
    }

    /// [`Segment::unmap_last`] under the access lock.
    fn unmap_last_locked(&mut self, bytes: usize) -> Result<usize> {
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
            access: Arc::clone(&self.access),
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
