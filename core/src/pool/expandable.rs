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
//! [`ExpandableAllocator::stitching`] pays that price for what it buys: with one allocation per
//! granule, the pages under any free chunk can be lifted out of a block (unmapped, kept) and
//! mapped again at a growing block's end (the pool's `stitch` module), so a request that fits no
//! hole takes memory the pool already holds. Peak memory then follows what is in use, not how
//! it is laid out (GMLake's stitching, done by moving pages rather than mapping them twice).
//!
//! Peer access does not reach memory mapped this way: each mapping names the devices that may
//! access it. [`grant_peer_access`] (which the runtime calls when it enables peer access) adds a
//! device to every allocator of the owner's memory, for its mappings made before and after.

use std::any::TypeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::{Error, Result};
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
    /// Stitching: each growth maps one physical allocation per granule, and pages lifted out of
    /// free chunks ([`RawAllocator::lift_pages`]) wait in `lifted` to be mapped again.
    stitch: bool,
    /// Physical allocations of one granule each, unmapped by a lift, not yet mapped again.
    lifted: Mutex<Vec<PhysicalHandle>>,
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
    /// Every mapping of the allocator's live segments: its address and length.
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
        for (&at, &len) in &a.mapped {
            // SAFETY: `mapped` holds every live mapping, whole, and the lock held here keeps it
            // so (segments map and unmap under it).
            unsafe { set(owner, at, len, &devices) }?;
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
    /// `Unsupported` where the backend has no virtual memory; `Backend` for a granule of 0; the
    /// runtime's error.
    pub fn new(device: DeviceId, reserve: usize) -> Result<Self> {
        let granule = B::vm_granularity(device)?;
        if granule == 0 {
            // Every size here is a multiple of the granule: a runtime's 0 is refused, not divided by.
            return Err(Error::backend(
                B::NAME,
                "vm_granularity",
                0,
                "granularity 0",
                "the runtime answered a granularity of 0",
            ));
        }
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
            stitch: false,
            lifted: Mutex::new(Vec::new()),
            _backend: std::marker::PhantomData,
        })
    }

    /// As [`ExpandableAllocator::new`], with stitching: each granule is its own physical
    /// allocation, so the pool can lift the pages under free chunks and map them where a growth
    /// needs them (see the pool's `stitch` module). A growth of `n` granules costs up to
    /// `2n + 1` driver calls (create and map each, one access for all) in place of 3, and each
    /// page lifted one more (its unmap); pages lifted are mapped again with no create.
    ///
    /// # Errors
    ///
    /// As [`ExpandableAllocator::new`].
    pub fn stitching(device: DeviceId, reserve: usize) -> Result<Self> {
        let mut allocator = Self::new(device, reserve)?;
        allocator.stitch = true;
        Ok(allocator)
    }
}

impl<B: VirtualMemoryOps> Drop for ExpandableAllocator<B> {
    fn drop(&mut self) {
        let device = self.access.lock().owner;
        for handle in self.lifted.get_mut().drain(..) {
            // SAFETY: a lifted handle is unmapped and owned by this list alone; released once.
            // A failure loses the memory to this process, and drop cannot return it.
            let _ = unsafe { B::vm_release(device, handle) };
        }
    }
}

impl<B: VirtualMemoryOps> ExpandableAllocator<B> {
    /// Maps `bytes` (whole granules) at `block`'s end, and makes them accessible. Without
    /// stitching, as one physical allocation: three driver calls (create, map, set access)
    /// whatever the size. With it, one allocation per granule, lifted pages first (no create for
    /// those), and one call giving access to all. Undoes what it did on an error.
    fn map_more(&self, block: &mut Segment<B>, bytes: usize) -> Result<()> {
        let at = block.extent;
        self.map_at(block, at, bytes)?;
        block.extent += bytes;
        Ok(())
    }

    /// Maps `bytes` (whole granules) at `offset` of `block`, where nothing is mapped and which
    /// lies in its reserved range, as [`ExpandableAllocator::map_more`] says.
    fn map_at(&self, block: &mut Segment<B>, offset: usize, bytes: usize) -> Result<()> {
        let mut access = self.access.lock();
        let start = block.base + offset;
        let piece = if self.stitch { self.granule } else { bytes };
        let mut done = 0;
        let mut failed = None;
        while done < bytes {
            let lifted = if self.stitch { self.lifted.lock().pop() } else { None };
            let handle = match lifted.map_or_else(|| B::vm_create(block.device, piece), Ok) {
                Ok(handle) => handle,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            // SAFETY: `start + done..+piece` lies in the block's reserved range, where nothing
            // is mapped (the callers' checks); `handle` has exactly `piece` bytes (one granule
            // when lifted) and is mapped nowhere.
            if let Err(e) = unsafe { B::vm_map(block.device, start + done, piece, handle) } {
                self.keep_or_release(block.device, handle);
                failed = Some(e);
                break;
            }
            block.maps.insert(offset + done, (piece, handle));
            done += piece;
        }
        let devices = access.devices();
        if failed.is_none() {
            // SAFETY: `start..start + bytes` is the mappings made just above, whole.
            if let Err(e) = unsafe { B::vm_set_access(block.device, start, bytes, &devices) } {
                failed = Some(e);
            }
        }
        let made: Vec<usize> = block.maps.range(offset..offset + done).map(|(&o, _)| o).collect();
        if let Some(e) = failed {
            // Undo: the mappings made above, never handed out, go back.
            for o in made {
                let Some((len, handle)) = block.maps.remove(&o) else { continue };
                // SAFETY: mapped above at `base + o`, whole, never handed out. One that stays
                // mapped is lost with the range (the block keeps no record of it).
                if unsafe { B::vm_unmap(block.device, block.base + o, len) }.is_ok() {
                    self.keep_or_release(block.device, handle);
                }
            }
            return Err(e);
        }
        for o in made {
            access.mapped.insert(block.base + o, block.maps[&o].0);
        }
        block.held += bytes;
        Ok(())
    }

    /// Whether nothing is mapped in `offset..offset + len` of `block`, which lies before its
    /// end.
    fn unmapped(block: &Segment<B>, offset: usize, len: usize) -> bool {
        let Some(end) = offset.checked_add(len).filter(|&end| end <= block.extent) else { return false };
        let before_ends = block.maps.range(..offset).next_back().is_none_or(|(&o, &(l, _))| o + l <= offset);
        before_ends && block.maps.range(offset..end).next().is_none()
    }

    /// A physical allocation that is mapped nowhere: kept for the next growth when it is one
    /// granule and the allocator stitches, released otherwise.
    fn keep_or_release(&self, device: DeviceId, handle: PhysicalHandle) {
        if self.stitch {
            self.lifted.lock().push(handle);
        } else {
            // SAFETY: the handle is mapped nowhere and owned here alone; released once.
            let _ = unsafe { B::vm_release(device, handle) };
        }
    }

    /// Unmaps the pages of `block` at `offset..offset + len` into `lifted`, in address order,
    /// while each lies whole in the range; returns the bytes unmapped.
    ///
    /// # Safety
    ///
    /// As [`RawAllocator::lift_pages`]: no work uses the range, and nothing will until it is
    /// mapped again.
    unsafe fn lift(&self, block: &mut Segment<B>, offset: usize, len: usize) -> Result<usize> {
        let mut access = self.access.lock();
        let end = offset.saturating_add(len).min(block.extent);
        let mut at = offset;
        while at < end {
            let Some(&(piece, handle)) = block.maps.get(&at) else { break };
            if piece != self.granule || at + piece > end {
                break;
            }
            // SAFETY: one whole mapping, inside the range the caller promised nothing uses.
            if let Err(e) = unsafe { B::vm_unmap(block.device, block.base + at, piece) } {
                if at == offset {
                    return Err(e);
                }
                break;
            }
            block.maps.remove(&at);
            access.mapped.remove(&(block.base + at));
            block.held -= piece;
            self.lifted.lock().push(handle);
            at += piece;
        }
        Ok(at - offset)
    }
}

/// A block of an [`ExpandableAllocator`]: a reserved range and the mappings in it, one per
/// growth (or per granule, with stitching, less those lifted); unmapped, released and freed when
/// dropped.
#[derive(Debug)]
pub struct Segment<B: VirtualMemoryOps> {
    device: DeviceId,
    base: DevicePtr,
    reserved: usize,
    /// The end of the last mapping: the block's size as the pool sees it.
    extent: usize,
    /// The bytes mapped: `extent` less what was lifted.
    held: usize,
    /// The mappings by offset: each one physical allocation of that many bytes (whole granules).
    maps: BTreeMap<usize, (usize, PhysicalHandle)>,
    /// Its allocator's: the devices with access, and where this segment's mappings are.
    access: Arc<Mutex<Access>>,
    _backend: std::marker::PhantomData<fn() -> B>,
}

/// What a shrink of `bytes` gives back of a growing block `extent` bytes long whose mappings are
/// `maps` (offset and length, in address order): nothing unless `bytes` is whole granules and
/// less than the block; else the last mappings, as many whole ones as fit, each ending where the
/// one after began. A mapping is never unmapped in part. The device allocator's segments shrink
/// by it, and the replays' address ranges model them with it.
pub(crate) fn shrinkable_tail(
    extent: usize,
    granule: usize,
    bytes: usize,
    maps: impl DoubleEndedIterator<Item = (usize, usize)>,
) -> usize {
    if !bytes.is_multiple_of(granule) || bytes >= extent {
        return 0;
    }
    let (mut end, mut done) = (extent, 0);
    for (offset, len) in maps.rev() {
        if done + len > bytes || offset + len != end {
            break;
        }
        done += len;
        end = offset;
    }
    done
}

impl<B: VirtualMemoryOps> Segment<B> {
    /// Unmaps and releases the last mappings, `want` bytes of them (what [`shrinkable_tail`]
    /// named); returns the bytes given back. A failure after some mappings went is reported as
    /// what went (the block is that much shorter); a failure before any went is the error.
    fn unmap_last(&mut self, want: usize) -> Result<usize> {
        let access = Arc::clone(&self.access);
        let mut access = access.lock();
        let mut done = 0;
        while done < want {
            let Some((&offset, &(len, handle))) = self.maps.last_key_value() else { break };
            let at = self.base + offset;
            // SAFETY: the last mapping, `len` bytes at `at`, unmapped whole; the pool lends none
            // of it (it asked for the shrink, or the block is being dropped) and no work uses it.
            if let Err(e) = unsafe { B::vm_unmap(self.device, at, len) } {
                return if done == 0 { Err(e) } else { Ok(done) };
            }
            self.maps.pop_last();
            access.mapped.remove(&at);
            self.extent -= len;
            self.held -= len;
            done += len;
            // SAFETY: unmapped just above; released once (removed from the map). A failed
            // release loses the physical allocation, not the block's accounting: it is unmapped.
            let _ = unsafe { B::vm_release(self.device, handle) };
        }
        Ok(done)
    }

    /// Unmaps and releases every mapping, for the drop; false when one failed (the range is then
    /// not freed: something is still mapped in it).
    fn unmap_all(&mut self) -> bool {
        let access = Arc::clone(&self.access);
        let mut access = access.lock();
        let mut all = true;
        for (offset, (len, handle)) in std::mem::take(&mut self.maps) {
            let at = self.base + offset;
            access.mapped.remove(&at);
            // SAFETY: a whole mapping of the block, which is being dropped: the pool lends none
            // of it and no work uses it.
            if unsafe { B::vm_unmap(self.device, at, len) }.is_err() {
                all = false;
                continue;
            }
            // SAFETY: unmapped just above; released once (taken out of the map).
            let _ = unsafe { B::vm_release(self.device, handle) };
        }
        all
    }

    /// The number of physical allocations mapped in the block (one per growth, or per granule
    /// with stitching).
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
        self.extent
    }
    fn device(&self) -> DeviceId {
        self.device
    }
    fn held(&self) -> usize {
        self.held
    }
}

impl<B: VirtualMemoryOps> Drop for Segment<B> {
    fn drop(&mut self) {
        // A failure here cannot be returned, and the memory is lost to this process either way;
        // no panic in drop.
        if self.unmap_all() {
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
            extent: 0,
            held: 0,
            maps: BTreeMap::new(),
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
        if !extra.is_multiple_of(self.granule) || block.extent.saturating_add(extra) > block.reserved {
            return Ok(false);
        }
        self.map_more(block, extra)?;
        Ok(true)
    }

    fn shrink(&self, block: &mut Segment<B>, bytes: usize) -> Result<usize> {
        match self.shrinkable(block, bytes) {
            0 => Ok(0),
            want => block.unmap_last(want),
        }
    }

    fn shrinkable(&self, block: &Segment<B>, bytes: usize) -> usize {
        let maps = block.maps.iter().map(|(&offset, &(len, _))| (offset, len));
        shrinkable_tail(block.extent, self.granule, bytes, maps)
    }

    fn stitches(&self) -> bool {
        self.stitch
    }

    unsafe fn lift_pages(&self, block: &mut Segment<B>, offset: usize, len: usize) -> Result<usize> {
        if !self.stitch || !offset.is_multiple_of(self.granule) {
            return Ok(0);
        }
        // SAFETY: the caller's promise: nothing uses the range, now or until it is mapped again.
        unsafe { self.lift(block, offset, len) }
    }

    fn map_pages(&self, block: &mut Segment<B>, offset: usize, len: usize) -> Result<usize> {
        let whole = offset.is_multiple_of(self.granule) && len.is_multiple_of(self.granule);
        if !self.stitch || len == 0 || !whole || !Self::unmapped(block, offset, len) {
            return Ok(0);
        }
        self.map_at(block, offset, len)?;
        Ok(len)
    }

    fn drop_lifted_pages(&self) {
        let device = self.access.lock().owner;
        let lifted = std::mem::take(&mut *self.lifted.lock());
        for handle in lifted {
            // SAFETY: a lifted handle is unmapped and owned by the list alone, taken out of it
            // here; released once. A failure loses the memory to this process.
            let _ = unsafe { B::vm_release(device, handle) };
        }
    }
}
