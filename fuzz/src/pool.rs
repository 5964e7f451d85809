//! The pool against a reference model.
//!
//! The input is read (with `arbitrary`) as a raw allocator's granule and a sequence of
//! operations: allocations of any size on one of four arenas, frees, limits, growth policies,
//! `free_all_blocks` of one arena or all, expandable segments on and off, and what the raw
//! allocator does next (fail allocations, grow or refuse to grow, shrink all, part or nothing,
//! fail to shrink). The raw allocator is a mock that hands out address ranges (no memory), so
//! sizes up to its capacity cost nothing. After every operation the pool is checked against the
//! model (the chunks lent, the raw blocks live):
//!
//! - no two lent chunks overlap, and each lies inside one live raw block;
//! - every byte is accounted for: each segment of the pool's snapshot is one live raw block of
//!   the same address and size, its chunks tile it exactly, and its allocated chunks are exactly
//!   the lent ones;
//! - the statistics equal the model's: bytes held, bytes lent, bytes requested, allocations,
//!   segments;
//! - a failed allocation lends nothing; an allocation that took new memory stays within the
//!   limit; the pool keeps the raw allocator's contract (grow and shrink by whole granules,
//!   shrink less than the block);
//! - at the end, with everything freed, `free_all_blocks` gives back every block, and dropping
//!   the pool frees every raw block.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use arbitrary::{Arbitrary, Unstructured};
use gpumem::core::pool::{
    ArenaCache, ArenaKey, BlockState, NoQueuedWork, Pool, PooledMemory, RawAllocator, RawBlock,
};
use gpumem::{DeviceId, DevicePtr, Error, GrowthPolicy};

/// The most operations one input runs.
const MAX_OPS: usize = 400;
/// Bytes the mock can have lent at once.
const CAPACITY: usize = 1 << 30;
/// Address space each raw block reserves to grow into (at least its first size).
const RESERVE: usize = 256 << 20;

/// What the mock's `grow` does.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Grow {
    /// Grows while the block's reservation and the capacity allow, else answers `Ok(false)`.
    InPlace,
    /// Answers `Ok(false)`.
    Refuse,
    /// Fails with an out-of-memory error.
    OutOfMemory,
    /// Answers `Ok(true)` without growing (VM07): the pool must refuse the block
    /// (`InvalidRawBlock`) and lend nothing from it.
    Lie,
}

/// What the mock's `shrink` does.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Shrink {
    All,
    /// Half the granules asked for, rounded down.
    Half,
    Nothing,
    Fail,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Size {
    /// Up to 64 KiB, any byte count.
    Bytes(u16),
    /// Up to 32 MiB in 512-byte units.
    Units(u16),
    /// Up to 255 MiB in MiB.
    MiB(u8),
    /// Any value, most too large for the pool or the mock.
    Any(u64),
}

impl Size {
    fn bytes(self) -> usize {
        match self {
            Size::Bytes(n) => usize::from(n),
            Size::Units(n) => usize::from(n) * 512,
            Size::MiB(n) => usize::from(n) << 20,
            Size::Any(n) => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Policy {
    CacheUntilOutOfMemory,
    ReleaseBeforeGrow,
    HoldPeakInUse,
    Segments,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Malloc {
        size: Size,
        arena: u8,
    },
    /// Drops a lent chunk (the index modulo the chunks lent).
    Drop {
        which: u8,
    },
    /// Frees a lent chunk with `PooledMemory::free`.
    Free {
        which: u8,
    },
    SetLimit {
        limit: Size,
    },
    FreeAllBlocks {
        arena: Option<u8>,
    },
    SetPolicy(Policy),
    SetExpandable(bool),
    /// The next `n % 4` raw allocations fail with out of memory.
    FailAllocations(u8),
    SetGrow(Grow),
    SetShrink(Shrink),
    /// Lending across streams (only with [`crate::open_findings_on`]).
    SetShare(bool),
    ResetPeak,
}

/// The mock's state, shared by the allocator and its blocks.
struct MockState {
    /// The next reservation's address.
    next: DevicePtr,
    /// Live blocks: address -> current size.
    live: BTreeMap<DevicePtr, usize>,
    granule: usize,
    /// Whether blocks are made whole granules (rounded up, so larger than asked), as allocators
    /// that map granules make them: while expandable segments are on, with
    /// [`crate::open_findings_on`] (the pool then counts such a block at the size it asked for).
    whole_granules: bool,
    fail_allocations: u8,
    grow: Grow,
    shrink: Shrink,
}

impl MockState {
    fn held(&self) -> usize {
        self.live.values().sum()
    }
}

/// A raw allocator of address ranges that never overlap, recording which are live.
#[derive(Clone)]
struct Mock(Arc<Mutex<MockState>>);

impl Mock {
    fn new(granule: usize) -> Self {
        Mock(Arc::new(Mutex::new(MockState {
            next: 1 << 32,
            live: BTreeMap::new(),
            granule,
            whole_granules: false,
            fail_allocations: 0,
            grow: Grow::InPlace,
            shrink: Shrink::All,
        })))
    }

    fn state(&self) -> MutexGuard<'_, MockState> {
        lock(&self.0)
    }
}

fn lock(m: &Mutex<MockState>) -> MutexGuard<'_, MockState> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct MockBlock {
    address: DevicePtr,
    size: usize,
    reserved: usize,
    device: DeviceId,
    mock: Arc<Mutex<MockState>>,
}

impl RawBlock for MockBlock {
    fn address(&self) -> DevicePtr {
        self.address
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device(&self) -> DeviceId {
        self.device
    }
}

impl Drop for MockBlock {
    fn drop(&mut self) {
        let removed = lock(&self.mock).live.remove(&self.address);
        assert_eq!(removed, Some(self.size), "a block freed twice, or its size changed behind the mock");
    }
}

fn out_of_memory(size: usize) -> Error {
    Error::OutOfMemory { size, total: None }
}

impl RawAllocator for Mock {
    type Block = MockBlock;

    fn allocate(&self, device: DeviceId, size: usize) -> gpumem::Result<MockBlock> {
        assert!(size > 0, "the pool asked for a block of 0 bytes");
        let mut st = self.state();
        if st.fail_allocations > 0 {
            st.fail_allocations -= 1;
            return Err(out_of_memory(size));
        }
        let size = if st.whole_granules { size.next_multiple_of(st.granule) } else { size };
        if size > CAPACITY - st.held() {
            return Err(out_of_memory(size));
        }
        let address = st.next;
        let reserved = size.max(RESERVE).next_multiple_of(st.granule);
        // A gap between reservations, so that blocks never touch.
        st.next += reserved + (1 << 20);
        st.live.insert(address, size);
        Ok(MockBlock { address, size, reserved, device, mock: Arc::clone(&self.0) })
    }

    fn expandable(&self) -> bool {
        true
    }

    fn granule(&self) -> usize {
        self.state().granule
    }

    fn grow(&self, block: &mut MockBlock, extra: usize) -> gpumem::Result<bool> {
        let mut st = self.state();
        assert!(extra > 0 && extra.is_multiple_of(st.granule), "grow by {extra}: not whole granules");
        match st.grow {
            Grow::Refuse => Ok(false),
            Grow::OutOfMemory => Err(out_of_memory(extra)),
            Grow::Lie => Ok(true),
            Grow::InPlace => {
                if block.size + extra > block.reserved || extra > CAPACITY - st.held() {
                    return Ok(false);
                }
                block.size += extra;
                st.live.insert(block.address, block.size);
                Ok(true)
            }
        }
    }

    fn shrink(&self, block: &mut MockBlock, bytes: usize) -> gpumem::Result<usize> {
        let mut st = self.state();
        let granule = st.granule;
        // `RawAllocator::shrink`'s contract: whole granules, also for a block that is not whole
        // granules (one made before expandable segments were turned on, or when growing failed).
        assert!(bytes.is_multiple_of(granule), "shrink by {bytes}: not whole granules");
        assert!(bytes < block.size, "shrink by {bytes} of a block of {}: the whole block", block.size);
        let whole = bytes / granule * granule;
        let given = match st.shrink {
            Shrink::All => whole,
            Shrink::Half => whole / granule / 2 * granule,
            Shrink::Nothing => 0,
            Shrink::Fail => return Err(Error::InvalidArgument("the mock refuses to shrink".into())),
        };
        block.size -= given;
        st.live.insert(block.address, block.size);
        Ok(given)
    }
}

/// A chunk the pool lent, as the model knows it.
struct Lent {
    mem: PooledMemory<Mock>,
    ptr: DevicePtr,
    size: usize,
    requested: usize,
}

fn arena_key(n: u8) -> ArenaKey {
    match n % 4 {
        0 => ArenaKey::NULL,
        k => ArenaKey::stream(0x1000 * usize::from(k)),
    }
}

fn policy(p: Policy) -> GrowthPolicy {
    match p {
        Policy::CacheUntilOutOfMemory => GrowthPolicy::CacheUntilOutOfMemory,
        Policy::ReleaseBeforeGrow => GrowthPolicy::ReleaseBeforeGrow,
        Policy::HoldPeakInUse => GrowthPolicy::HoldPeakInUse,
        Policy::Segments => GrowthPolicy::Segments,
    }
}

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let granule = 512usize << (u.arbitrary::<u8>().unwrap_or(0) % 13);
    if crate::print_ops() {
        eprintln!("granule {granule}");
    }
    let mock = Mock::new(granule);
    let pool = Pool::new(0, mock.clone());
    pool.set_stream_order(Box::new(NoQueuedWork));
    let cache = ArenaCache::new();
    let mut lent: Vec<Lent> = Vec::new();
    let mut sharing = false;

    for _ in 0..MAX_OPS {
        let Ok(op) = u.arbitrary::<Op>() else { break };
        if crate::print_ops() {
            eprintln!("{op:?}");
        }
        match op {
            Op::Malloc { size, arena } => {
                let size = size.bytes();
                let held_before = pool.total_bytes();
                let used_before = pool.used_bytes();
                match pool.malloc(size, arena_key(arena), &cache) {
                    Ok(mem) if size == 0 => assert_eq!(mem.ptr(), 0, "size 0 lent an address"),
                    Ok(mem) => {
                        let (ptr, got) = (mem.ptr(), mem.size());
                        assert!(got >= size && got.is_multiple_of(512), "{size} bytes lent as {got}");
                        let limit = pool.get_limit();
                        let held = pool.total_bytes();
                        assert!(
                            limit == 0 || held <= held_before || held <= limit,
                            "an allocation of {size} took the pool to {held} bytes, past its limit {limit}"
                        );
                        lent.push(Lent { mem, ptr, size: got, requested: size });
                    }
                    Err(e) => {
                        // Only a block the mock lied about is refused.
                        assert!(
                            !matches!(e, Error::InvalidRawBlock { .. })
                                || matches!(mock.state().grow, Grow::Lie)
                                || crate::open_findings_on(),
                            "{e}"
                        );
                        assert_eq!(pool.used_bytes(), used_before, "a failed allocation lent bytes: {e}");
                    }
                }
            }
            Op::Drop { which } if !lent.is_empty() => {
                drop(lent.swap_remove(usize::from(which) % lent.len()));
            }
            Op::Free { which } if !lent.is_empty() => {
                let chunk = lent.swap_remove(usize::from(which) % lent.len());
                chunk.mem.free().expect("no hook is installed, so a free cannot fail");
            }
            Op::Drop { .. } | Op::Free { .. } => {}
            Op::SetLimit { limit } => pool.set_limit(limit.bytes()),
            Op::FreeAllBlocks { arena } => pool.free_all_blocks(arena.map(arena_key)),
            Op::SetPolicy(p) => pool.set_growth_policy(policy(p)),
            Op::SetExpandable(on) => {
                pool.set_expandable_segments(on).expect("the mock grows blocks");
                mock.state().whole_granules = on && crate::open_findings_on();
            }
            Op::FailAllocations(n) => mock.state().fail_allocations = n % 4,
            Op::SetGrow(g) => mock.state().grow = g,
            Op::SetShrink(s) => mock.state().shrink = s,
            Op::SetShare(on) if crate::open_findings_on() => {
                pool.set_share_across_streams(on).expect("a stream order is installed");
                sharing |= on;
            }
            Op::SetShare(_) => {}
            Op::ResetPeak => pool.reset_peak(),
        }
        check(&pool, &mock, &lent, sharing);
    }

    drop(lent);
    mock.state().shrink = Shrink::All;
    pool.free_all_blocks(None);
    if !sharing {
        assert_eq!(pool.used_bytes(), 0, "bytes counted in use with nothing lent");
        assert_eq!(pool.total_bytes(), 0, "free_all_blocks kept blocks with nothing lent");
        assert!(mock.state().live.is_empty(), "free_all_blocks kept blocks with nothing lent");
    }
    drop(pool);
    let left = mock.state().live.clone();
    assert!(left.is_empty(), "dropping the pool left raw blocks: {left:x?}");
}

/// Checks the pool against the model; panics naming the first difference.
fn check(pool: &Pool<Mock>, mock: &Mock, lent: &[Lent], sharing: bool) {
    let blocks = mock.state().live.clone();

    // No two lent chunks overlap; each lies in one live block.
    let mut chunks: Vec<(DevicePtr, usize)> = lent.iter().map(|l| (l.ptr, l.size)).collect();
    chunks.sort_unstable();
    for pair in chunks.windows(2) {
        let ((a, a_size), (b, _)) = (pair[0], pair[1]);
        assert!(a + a_size <= b, "chunks 0x{a:x}+{a_size} and 0x{b:x} overlap");
    }
    for &(ptr, size) in &chunks {
        let inside = blocks.range(..=ptr).next_back().is_some_and(|(&at, &len)| ptr + size <= at + len);
        assert!(inside, "chunk 0x{ptr:x}+{size} lies outside every live raw block: {blocks:x?}");
    }

    // The statistics equal the model's.
    let held: usize = blocks.values().sum();
    let used: usize = lent.iter().map(|l| l.size).sum();
    let requested: usize = lent.iter().map(|l| l.requested).sum();
    assert_eq!(pool.total_bytes(), held, "total_bytes against the live raw blocks");
    let stats = pool.stats().all;
    assert_eq!(stats.reserved_bytes.current, held as u64, "reserved_bytes");
    assert_eq!(stats.segments.current, blocks.len() as u64, "segments");
    if !sharing {
        assert_eq!(pool.used_bytes(), used, "used_bytes against the chunks lent");
        assert_eq!(stats.allocated_bytes.current, used as u64, "allocated_bytes");
        assert_eq!(stats.requested_bytes.current, requested as u64, "requested_bytes");
        assert_eq!(stats.allocations.current, lent.len() as u64, "allocations");
    }

    // Every byte accounted for: each segment is a live block, tiled by its chunks, and its
    // allocated chunks are the lent ones.
    let snapshot = pool.snapshot();
    assert_eq!(snapshot.segments.len(), blocks.len(), "segments in the snapshot against the live raw blocks");
    let mut allocated = Vec::new();
    for seg in &snapshot.segments {
        assert_eq!(blocks.get(&seg.address), Some(&seg.total_size), "segment 0x{:x}", seg.address);
        let mut at = seg.address;
        for b in &seg.blocks {
            assert_eq!(b.address, at, "segment 0x{:x}: a gap or an overlap at 0x{at:x}", seg.address);
            at += b.size;
            match b.state {
                BlockState::Allocated => allocated.push((b.address, b.size)),
                BlockState::PendingFree => assert!(sharing, "a chunk pending a free with nothing fenced"),
                BlockState::Free => {}
            }
        }
        assert_eq!(
            at,
            seg.address + seg.total_size,
            "segment 0x{:x}: its chunks do not reach its end",
            seg.address
        );
    }
    allocated.sort_unstable();
    if !sharing {
        assert_eq!(allocated, chunks, "the snapshot's allocated chunks against the chunks lent");
    }
}
