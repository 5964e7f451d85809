//! What the replays allocate from: [`AddressRanges`], address ranges with no memory behind them,
//! and the driver calls a device would make for them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::hal::types::{DeviceId, DevicePtr};
use crate::pool::counting::Counting;
use crate::pool::expandable::shrinkable_tail;
use crate::pool::{RawAllocator, RawBlock};

/// A raw allocator of address ranges that never overlap, with no memory behind them (host
/// memory is not touched: the blocks are numbers), for replays whose figures depend only on the
/// pool's rules. With [`Counting::expandable`], blocks grow and shrink in place, in granules;
/// with [`Counting::stitching`], their free pages also move where a growth needs them.
/// Clones hand out from the same ranges and count into the same [`DriverCalls`].
#[derive(Clone, Debug, Default)]
pub struct AddressRanges {
    next: Arc<AtomicUsize>,
    granule: Option<usize>,
    /// Growable blocks whose free pages move to where a growth needs them
    /// ([`RawAllocator::lift_pages`]).
    stitch: bool,
    calls: Arc<DriverCalls>,
}

/// The driver calls a device would make for what an [`AddressRanges`] was asked, as gpumem's
/// device allocators make them: `cuMemAlloc` for a fixed block; for a growing one a reservation
/// and, per growth, one physical allocation, one map and one access call (with stitching, one
/// allocation and one map per 2 MiB page, none for a page lifted before, and one access call);
/// per page lifted one unmap; per page lifted and not mapped again one release. A shrink gives
/// back whole mappings only, the last ones that fit (as the device allocators' do), and counts an
/// unmap and a release for each. A block dropped counts `cuMemFree`, or an unmap and a release
/// per mapping and the reservation's free.
#[derive(Debug, Default)]
pub struct DriverCalls {
    /// Calls so far.
    pub calls: AtomicUsize,
    /// Pages lifted and not yet mapped again.
    spare: AtomicUsize,
}

impl DriverCalls {
    fn add(&self, n: usize) {
        self.calls.fetch_add(n, Ordering::Relaxed);
    }

    /// The calls to map `pages` new pages, lifted ones first: a create per page not lifted, a
    /// map per page, one access call.
    fn map(&self, pages: usize) {
        let spare = self.spare.load(Ordering::Relaxed);
        let reused = spare.min(pages);
        self.spare.store(spare - reused, Ordering::Relaxed);
        self.add(2 * pages - reused + 1);
    }
}

/// A block of [`AddressRanges`].
#[derive(Debug)]
pub struct AddressRange {
    address: DevicePtr,
    size: usize,
    device: DeviceId,
    /// The bytes lifted out of the range ([`RawAllocator::lift_pages`]).
    lifted: usize,
    /// The mappings a device would hold for a growing block, by offset: their lengths (one per
    /// growth, or one per page with stitching). Empty for a fixed block.
    maps: BTreeMap<usize, usize>,
    calls: Arc<DriverCalls>,
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        self.calls.add(if self.maps.is_empty() { 1 } else { 2 * self.maps.len() + 1 });
    }
}

impl RawBlock for AddressRange {
    fn address(&self) -> DevicePtr {
        self.address
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device(&self) -> DeviceId {
        self.device
    }
    fn held(&self) -> usize {
        self.size - self.lifted
    }
}

impl AddressRanges {
    /// The pages of `bytes` with stitching (each its own mapping), else 1 (one mapping).
    fn mappings(&self, bytes: usize) -> usize {
        match self.granule {
            Some(g) if self.stitch => bytes / g,
            _ => 1,
        }
    }

    /// Maps `offset..offset + len` of `block` as a device would: one mapping, or one per page
    /// with stitching.
    fn map_range(&self, block: &mut AddressRange, offset: usize, len: usize) {
        match self.granule {
            Some(g) if self.stitch => {
                for page in (offset..offset + len).step_by(g.max(1)) {
                    block.maps.insert(page, g);
                }
            }
            _ => {
                block.maps.insert(offset, len);
            }
        }
    }

    /// Whether `offset..offset + len` is whole granules inside `block`, and stitching is on.
    fn pages_of(&self, block: &AddressRange, offset: usize, len: usize) -> bool {
        let granule = self.granule.unwrap_or(usize::MAX);
        let inside = offset.checked_add(len).is_some_and(|end| end <= block.size);
        self.stitch && inside && offset.is_multiple_of(granule) && len.is_multiple_of(granule)
    }
}

impl RawAllocator for AddressRanges {
    type Block = AddressRange;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<AddressRange> {
        // A gap between blocks, so that no two blocks look contiguous; growable blocks get a
        // range of 1 TiB each to grow into.
        let span = if self.granule.is_some() { 1 << 40 } else { size.next_multiple_of(4096) + 4096 };
        let address = (1 << 40) + self.next.fetch_add(span, Ordering::Relaxed);
        let mut block = AddressRange {
            address,
            size,
            device,
            lifted: 0,
            maps: BTreeMap::new(),
            calls: Arc::clone(&self.calls),
        };
        self.calls.add(1);
        if self.granule.is_some() {
            self.calls.map(self.mappings(size));
            self.map_range(&mut block, 0, size);
        }
        Ok(block)
    }

    fn expandable(&self) -> bool {
        self.granule.is_some()
    }

    fn granule(&self) -> usize {
        self.granule.unwrap_or(1)
    }

    fn grow(&self, block: &mut AddressRange, extra: usize) -> Result<bool> {
        if self.granule.is_none() {
            return Ok(false);
        }
        self.calls.map(self.mappings(extra));
        let end = block.size;
        self.map_range(block, end, extra);
        block.size += extra;
        Ok(true)
    }

    /// What a device gives back: the last mappings that fit in `bytes`, whole (a growth is
    /// unmapped whole, never in part).
    fn shrink(&self, block: &mut AddressRange, bytes: usize) -> Result<usize> {
        let done = self.shrinkable(block, bytes);
        if done == 0 {
            return Ok(0);
        }
        let mut gone = 0;
        while gone < done {
            let Some((_, len)) = block.maps.pop_last() else { break };
            gone += len;
            self.calls.add(2);
        }
        block.size -= gone;
        Ok(gone)
    }

    fn shrinkable(&self, block: &AddressRange, bytes: usize) -> usize {
        let maps = block.maps.iter().map(|(&offset, &len)| (offset, len));
        self.granule.map_or(0, |granule| shrinkable_tail(block.size, granule, bytes, maps))
    }

    fn stitches(&self) -> bool {
        self.stitch
    }

    #[allow(unsafe_code)] // the trait's signature; nothing here is unsafe (no memory is behind)
    unsafe fn lift_pages(&self, block: &mut AddressRange, offset: usize, len: usize) -> Result<usize> {
        if !self.pages_of(block, offset, len) {
            return Ok(0);
        }
        let pages = self.mappings(len);
        self.calls.add(pages);
        self.calls.spare.fetch_add(pages, Ordering::Relaxed);
        let lifted: Vec<usize> = block.maps.range(offset..offset + len).map(|(&at, _)| at).collect();
        for at in lifted {
            block.maps.remove(&at);
        }
        block.lifted += len;
        Ok(len)
    }

    fn map_pages(&self, block: &mut AddressRange, offset: usize, len: usize) -> Result<usize> {
        if !self.pages_of(block, offset, len) || len > block.lifted {
            return Ok(0);
        }
        self.calls.map(self.mappings(len));
        self.map_range(block, offset, len);
        block.lifted -= len;
        Ok(len)
    }

    fn drop_lifted_pages(&self) {
        self.calls.add(self.calls.spare.swap(0, Ordering::Relaxed));
    }
}

/// What the replays run on: [`AddressRanges`] with its calls counted. With
/// [`CountingAllocator::expandable`] each growth counts as a raw allocation and each shrink as
/// a raw free (PyTorch counts its expandable segments' maps and unmaps so).
pub type CountingAllocator = Counting<AddressRanges>;

impl Counting<AddressRanges> {
    /// A counting allocator whose blocks grow and shrink in steps of `granule` bytes.
    #[must_use]
    pub fn expandable(granule: usize) -> Self {
        Counting::new(AddressRanges { granule: Some(granule.max(1)), ..AddressRanges::default() })
    }

    /// As [`Counting::expandable`], with stitching: a growth first takes the whole pages under
    /// the arena's free chunks ([`RawAllocator::lift_pages`]), each lift counted as a raw free
    /// and each mapping of lifted pages again as a raw allocation.
    #[must_use]
    pub fn stitching(granule: usize) -> Self {
        Counting::new(AddressRanges {
            granule: Some(granule.max(1)),
            stitch: true,
            ..AddressRanges::default()
        })
    }

    /// The driver calls a device would have made so far (see [`DriverCalls`]).
    #[must_use]
    pub fn driver_calls(&self) -> usize {
        self.inner().calls.calls.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_shrink_gives_back_whole_growths_only_as_a_device_does() {
        let ranges = AddressRanges { granule: Some(2 * MIB), ..AddressRanges::default() };
        let mut block = ranges.allocate(0, 2 * MIB).unwrap();
        assert!(ranges.grow(&mut block, 4 * MIB).unwrap());
        assert!(ranges.grow(&mut block, 2 * MIB).unwrap());
        // The last growth (2 MiB) fits in 4 MiB, the one before (4 MiB) not beside it.
        assert_eq!(ranges.shrinkable(&block, 4 * MIB), 2 * MIB);
        assert_eq!(ranges.shrink(&mut block, 4 * MIB).unwrap(), 2 * MIB);
        assert_eq!(block.size(), 6 * MIB);
        // Part of a growth is not given back; the first mapping never is.
        assert_eq!(ranges.shrinkable(&block, 2 * MIB), 0);
        assert_eq!(ranges.shrink(&mut block, 2 * MIB).unwrap(), 0);
        assert_eq!(ranges.shrink(&mut block, 4 * MIB).unwrap(), 4 * MIB);
        assert_eq!(ranges.shrink(&mut block, 2 * MIB).unwrap(), 0, "a shrink of the whole block");
        assert_eq!(block.size(), 2 * MIB);
    }

    #[test]
    #[allow(unsafe_code)] // the trait's `lift_pages`; no memory is behind the ranges
    fn with_stitching_a_shrink_gives_back_the_last_pages_that_are_mapped_in_a_row() {
        let ranges = AddressRanges { granule: Some(2 * MIB), stitch: true, ..AddressRanges::default() };
        let mut block = ranges.allocate(0, 8 * MIB).unwrap();
        assert_eq!(ranges.shrinkable(&block, 4 * MIB), 4 * MIB);
        // A page lifted from the middle ends the run of mapped pages behind it.
        // SAFETY: no memory is behind the range.
        assert_eq!(unsafe { ranges.lift_pages(&mut block, 4 * MIB, 2 * MIB) }.unwrap(), 2 * MIB);
        assert_eq!(ranges.shrinkable(&block, 6 * MIB), 2 * MIB);
        assert_eq!(ranges.map_pages(&mut block, 4 * MIB, 2 * MIB).unwrap(), 2 * MIB);
        assert_eq!(ranges.shrink(&mut block, 6 * MIB).unwrap(), 6 * MIB);
        assert_eq!(block.held(), 2 * MIB);
    }
}
