//! Stitching on the counting allocator and on the host backend's virtual memory: counted bytes
//! and calls, every lent range checked against every live one, every byte back at the end.

use std::collections::BTreeMap;

use super::super::expandable::ExpandableAllocator;
use super::super::stats::BlockState;
use super::super::trace::CountingAllocator;
use super::super::{ArenaCache, ArenaKey, GrowthPolicy, Pool, PooledMemory, RawAllocator};

const MIB: usize = 1 << 20;

/// A pool with expandable segments on a stitching counting allocator of 2 MiB pages.
fn stitching() -> (Pool<CountingAllocator>, CountingAllocator, ArenaCache) {
    let allocator = CountingAllocator::stitching(2 * MIB);
    let pool = Pool::new(0, allocator.clone());
    pool.set_expandable_segments(true).unwrap();
    (pool, allocator, ArenaCache::new())
}

fn held(allocator: &CountingAllocator) -> usize {
    allocator.counts().snapshot().2
}

/// Checks that no two lent chunks overlap, that none lies in a range with no memory behind it,
/// and that the pool's own count of what it holds is the allocator's.
fn check<R: RawAllocator>(pool: &Pool<R>, held: usize) {
    let snapshot = pool.snapshot();
    let mut lent: BTreeMap<usize, usize> = BTreeMap::new();
    let mut shown = 0;
    for segment in &snapshot.segments {
        for chunk in &segment.blocks {
            shown += chunk.size;
            if chunk.state != BlockState::Free {
                lent.insert(chunk.address, chunk.size);
            }
        }
        assert_eq!(segment.blocks.iter().map(|b| b.size).sum::<usize>(), segment.total_size);
    }
    let mut end = 0;
    for (&at, &size) in &lent {
        assert!(at >= end, "lent chunks overlap at 0x{at:x}");
        end = at + size;
    }
    assert_eq!(pool.total_bytes(), held, "the pool counts what the allocator holds");
    assert_eq!(shown, held, "the snapshot shows what is held, and no lifted range");
}

/// Runs `steps` random steps from `seed` on `pool`: three in five allocate up to `largest` bytes
/// into `live`, the others free one of `live`; every 45th step frees all blocks. `each` checks
/// the pool after every step.
fn run_random<R: RawAllocator>(
    pool: &Pool<R>,
    cache: &ArenaCache,
    live: &mut Vec<PooledMemory<R>>,
    seed: u64,
    steps: usize,
    largest: usize,
    mut each: impl FnMut(&Pool<R>, &[PooledMemory<R>]),
) {
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..steps {
        if live.is_empty() || next() % 5 < 3 {
            let size = 1 + (next() % largest as u64) as usize;
            live.push(pool.malloc(size, ArenaKey::NULL, cache).unwrap());
        } else {
            let i = (next() % live.len() as u64) as usize;
            live.swap_remove(i);
        }
        if step % 45 == 0 {
            pool.free_all_blocks(None);
        }
        each(pool, live);
    }
}

/// Lends 1 MiB, 6 MiB, 1 MiB and a long-lived 4 MiB (12 MiB in one block), frees the 6 MiB, and
/// asks for 10 MiB, which fits nowhere: the hole at 1..7 MiB holds pages 2..6 MiB whole, and the
/// block's end grows with them. Returns what is still lent: the 1 MiB at 0, the 1 MiB at 7 MiB,
/// the 4 MiB at 8 MiB and the 10 MiB.
fn lift_a_hole<R: RawAllocator>(pool: &Pool<R>, cache: &ArenaCache) -> [PooledMemory<R>; 4] {
    let a = pool.malloc(MIB, ArenaKey::NULL, cache).unwrap();
    let b = pool.malloc(6 * MIB, ArenaKey::NULL, cache).unwrap();
    let c = pool.malloc(MIB, ArenaKey::NULL, cache).unwrap();
    let d = pool.malloc(4 * MIB, ArenaKey::NULL, cache).unwrap();
    drop(b);
    let e = pool.malloc(10 * MIB, ArenaKey::NULL, cache).unwrap();
    [a, c, d, e]
}

#[test]
fn a_request_no_hole_fits_takes_the_pages_under_the_holes() {
    let (pool, allocator, cache) = stitching();
    let mut chunks: Vec<Option<PooledMemory<CountingAllocator>>> =
        (0..8).map(|_| Some(pool.malloc(4 * MIB, ArenaKey::NULL, &cache).unwrap())).collect();
    assert_eq!(held(&allocator), 32 * MIB);
    for i in [1, 3, 5] {
        chunks[i] = None;
    }
    // Three holes of 4 MiB, apart: no 12 MiB request fits, and without stitching the block would
    // grow by 12 MiB.
    let big = pool.malloc(12 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(held(&allocator), 32 * MIB, "the holes' six pages were moved, none made");
    assert_eq!(allocator.counts().lifted.load(std::sync::atomic::Ordering::Relaxed), 12 * MIB);
    assert_eq!(big.ptr(), chunks[7].as_ref().unwrap().ptr() + 4 * MIB, "mapped at the block's end");
    check(&pool, 32 * MIB);
    drop(big);
    drop(chunks);
    pool.free_all_blocks(None);
    assert_eq!(held(&allocator), 0, "every byte comes back");
    assert_eq!(pool.total_bytes(), 0);
    let (allocs, frees, _, _) = allocator.counts().snapshot();
    assert!(allocs > 0 && frees > 0);
}

#[test]
fn a_stitching_block_grows_by_what_its_tail_lacks_where_expandable_segments_take_a_step() {
    // A 24 MiB chunk fills its block; a request of 3 MiB finds no free byte. The tail lacks two
    // pages: the stitching pool maps those two, where expandable segments alone grow a
    // large request's block by at least 20 MiB (the excess is held at the peak).
    for (stitch, grown) in [(true, 4 * MIB), (false, 20 * MIB)] {
        let allocator = if stitch {
            CountingAllocator::stitching(2 * MIB)
        } else {
            CountingAllocator::expandable(2 * MIB)
        };
        let pool = Pool::new(0, allocator.clone());
        pool.set_growth_policy(GrowthPolicy::Segments);
        pool.set_expandable_segments(true).unwrap();
        let cache = ArenaCache::new();
        let full = pool.malloc(24 * MIB, ArenaKey::NULL, &cache).unwrap();
        let before = held(&allocator);
        let third = pool.malloc(3 * MIB, ArenaKey::NULL, &cache).unwrap();
        assert_eq!(held(&allocator) - before, grown, "stitching: {stitch}");
        drop((full, third));
        pool.free_all_blocks(None);
    }
}

#[test]
fn with_segments_a_stitching_pool_keeps_small_requests_off_the_pages_of_large_ones() {
    // Four long-lived 256 KiB requests between four 10 MiB ones that are freed. In one block the
    // small chunks would sit between the large ones, and a 24 MiB request would fit none of the
    // four 10 MiB holes: pages would move. Kept apart, the small requests share one small block
    // and the large ones' 40 MiB is one free run that takes the request whole.
    let allocator = CountingAllocator::stitching(2 * MIB);
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let mut small = Vec::new();
    let mut large = Vec::new();
    for _ in 0..4 {
        small.push(pool.malloc(MIB / 4, ArenaKey::NULL, &cache).unwrap());
        large.push(pool.malloc(10 * MIB, ArenaKey::NULL, &cache).unwrap());
    }
    let (small_start, small_end) = (small[0].ptr(), small[3].ptr() + MIB / 4);
    assert!(large.iter().all(|l| l.ptr() + 10 * MIB <= small_start || l.ptr() >= small_end));
    assert_eq!(held(&allocator), 42 * MIB, "a small block of one page, a large one of twenty");
    drop(large);
    let lifted = || allocator.counts().lifted.load(std::sync::atomic::Ordering::Relaxed);
    let (allocs, lifted_before) = (allocator.counts().snapshot().0, lifted());
    let big = pool.malloc(24 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(allocator.counts().snapshot().0, allocs, "no raw call");
    assert_eq!(lifted(), lifted_before, "no page moved");
    assert_eq!(held(&allocator), 42 * MIB);
    check(&pool, 42 * MIB);
    drop((big, small));
    pool.free_all_blocks(None);
    assert_eq!(held(&allocator), 0, "every byte comes back");
}

#[test]
fn with_segments_a_stitching_pool_serves_requests_over_256_kib_from_the_large_requests_block() {
    // A 512 KiB request is not small for a stitching pool: it is cut from the large requests'
    // growing block, right after a 10 MiB chunk, where a pool of fixed blocks under the same
    // policy keeps it in a small block apart.
    for (stitch, shares) in [(true, true), (false, false)] {
        let allocator =
            if stitch { CountingAllocator::stitching(2 * MIB) } else { CountingAllocator::default() };
        let pool = Pool::new(0, allocator.clone());
        pool.set_growth_policy(GrowthPolicy::Segments);
        pool.set_expandable_segments(stitch).unwrap();
        let cache = ArenaCache::new();
        let large = pool.malloc(10 * MIB, ArenaKey::NULL, &cache).unwrap();
        let mid = pool.malloc(MIB / 2, ArenaKey::NULL, &cache).unwrap();
        assert_eq!(mid.ptr() == large.ptr() + 10 * MIB, shares, "stitching: {stitch}");
        drop((large, mid));
        pool.free_all_blocks(None);
        assert_eq!(held(&allocator), 0, "every byte comes back");
    }
}

#[test]
fn a_lifted_range_and_the_free_chunks_beside_it_take_a_request_for_the_pages_it_lacks() {
    let (pool, allocator, cache) = stitching();
    let [a, c, d, e] = lift_a_hole(&pool, &cache);
    assert_eq!(held(&allocator), 12 * MIB + 6 * MIB, "10 MiB grown, 4 of them moved");
    check(&pool, 18 * MIB);
    // Freeing `a` and `c` leaves 0..2 free, 2..6 lifted and 6..8 free: 8 MiB of addresses, of
    // which 4 are mapped. A 7 MiB request goes there for two pages, not the block's end for 4.
    drop((a, c));
    let before = held(&allocator);
    let f = pool.malloc(7 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(f.ptr(), d.ptr() - 8 * MIB, "lent where the lifted range was");
    assert_eq!(held(&allocator), before + 4 * MIB, "two pages mapped again");
    check(&pool, before + 4 * MIB);
    drop((d, e, f));
    pool.free_all_blocks(None);
    assert_eq!(held(&allocator), 0);
}

#[test]
fn free_all_blocks_gives_back_the_pages_under_every_free_hole() {
    let (pool, allocator, cache) = stitching();
    let chunks: Vec<_> = (0..16).map(|_| pool.malloc(5 * MIB, ArenaKey::NULL, &cache).unwrap()).collect();
    assert_eq!(held(&allocator), 80 * MIB);
    // Every other chunk freed: half the memory is free, in holes no block gives back whole.
    let kept: Vec<_> = chunks.into_iter().step_by(2).collect();
    pool.free_all_blocks(None);
    // Each 5 MiB hole holds one or two whole pages: 8 holes at odd multiples of 5 MiB.
    let after = held(&allocator);
    assert!(after <= 40 * MIB + 8 * 4 * MIB, "{after}");
    assert!(after < 80 * MIB - 8 * MIB, "{after}: the pages under the holes went back");
    check(&pool, after);
    drop(kept);
    pool.free_all_blocks(None);
    assert_eq!(held(&allocator), 0, "a block with lifted ranges goes when its chunks are free");
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn random_requests_never_overlap_and_every_byte_comes_back() {
    // Fewer under Miri, which runs the pool's tests and is a thousand times slower.
    let (seeds, steps) = if cfg!(miri) { (2, 120) } else { (20, 600) };
    for seed in 1..=seeds {
        let (pool, allocator, cache) = stitching();
        pool.set_growth_policy(if seed % 2 == 0 { GrowthPolicy::Segments } else { GrowthPolicy::default() });
        let mut live: Vec<PooledMemory<CountingAllocator>> = Vec::new();
        run_random(&pool, &cache, &mut live, seed, steps, 12 * MIB, |pool, _| check(pool, held(&allocator)));
        assert!(
            allocator.counts().lifted.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "seed {seed} lifted"
        );
        drop(live);
        pool.free_all_blocks(None);
        assert_eq!(held(&allocator), 0, "seed {seed}");
    }
}

#[test]
#[allow(unsafe_code)] // writes and reads the memory through the host backend
fn on_the_host_backend_pages_move_with_the_calls_the_driver_takes_and_all_are_released() {
    use crate::hal::MemoryOps;
    use crate::host::{vmm_calls_on_this_thread as calls, vmm_physical_bytes_made_here, Host};
    let allocator = ExpandableAllocator::<Host>::stitching(0, 256 * MIB).unwrap();
    let pool = Pool::new(0, allocator);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let start = calls();
    let a = pool.malloc(4 * MIB, ArenaKey::NULL, &cache).unwrap();
    // [create, map, set access, unmap]: one allocation and one map per page, one access call.
    assert_eq!(calls(), [start[0] + 2, start[1] + 2, start[2] + 1, start[3]]);
    let b = pool.malloc(4 * MIB, ArenaKey::NULL, &cache).unwrap();
    let c = pool.malloc(4 * MIB, ArenaKey::NULL, &cache).unwrap();
    drop(b);
    let before = calls();
    let d = pool.malloc(6 * MIB, ArenaKey::NULL, &cache).unwrap();
    let now = calls();
    // Two pages lifted from the hole (two unmaps) and mapped at the end with one new page.
    assert_eq!(
        [now[0] - before[0], now[1] - before[1], now[2] - before[2], now[3] - before[3]],
        [1, 3, 1, 2]
    );
    assert_eq!(pool.total_bytes(), 14 * MIB);
    // The moved pages are usable end to end.
    // SAFETY: `d` is 6 MiB lent to this test alone, mapped (the host checks its calls).
    unsafe { Host::memset(0, d.ptr(), 7, 6 * MIB).unwrap() };
    let mut last = [0u8; 4];
    // SAFETY: as above; `last` is 4 writable bytes.
    unsafe { Host::memcpy(0, last.as_mut_ptr() as usize, d.ptr() + 6 * MIB - 4, 4).unwrap() };
    assert_eq!(last, [7; 4]);
    drop((a, c, d));
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    drop(pool);
    assert_eq!(vmm_physical_bytes_made_here(0), 0, "every page was released");
}

#[test]
fn on_the_host_backend_every_lent_byte_is_mapped_while_pages_move() {
    use crate::host::{vmm_access_of, vmm_calls_on_this_thread as calls, vmm_physical_bytes_made_here, Host};
    let unmaps = calls()[3];
    let (seeds, steps, moved) = if cfg!(miri) { (1, 80, 10) } else { (6, 300, 100) };
    for seed in 1..=seeds {
        let allocator = ExpandableAllocator::<Host>::stitching(0, 512 * MIB).unwrap();
        let pool = Pool::new(0, allocator);
        pool.set_growth_policy(GrowthPolicy::Segments);
        pool.set_expandable_segments(true).unwrap();
        let cache = ArenaCache::new();
        let mut live = Vec::new();
        run_random(&pool, &cache, &mut live, seed, steps, 9 * MIB, |_, live| {
            for p in live {
                let (first, last) = (p.ptr(), p.ptr() + p.size() - 1);
                assert!(vmm_access_of(first).is_some() && vmm_access_of(last).is_some(), "seed {seed}");
            }
        });
        drop(live);
        pool.free_all_blocks(None);
        assert_eq!(pool.total_bytes(), 0);
        drop(pool);
        assert_eq!(vmm_physical_bytes_made_here(0), 0, "seed {seed}: every page was released");
    }
    assert!(calls()[3] > unmaps + moved, "pages were lifted");
}

#[test]
#[allow(unsafe_code)] // writes and reads the memory through the host backend
fn on_the_host_backend_a_lifted_range_is_mapped_again_where_a_request_goes() {
    use crate::hal::MemoryOps;
    use crate::host::{vmm_access_of, Host};
    let pool = Pool::new(0, ExpandableAllocator::<Host>::stitching(0, 256 * MIB).unwrap());
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let [a, c, d, e] = lift_a_hole(&pool, &cache);
    assert_eq!(pool.total_bytes(), 18 * MIB);
    assert!(vmm_access_of(a.ptr() + 3 * MIB).is_none(), "the hole's whole pages were lifted");
    drop((a, c));
    let f = pool.malloc(7 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(f.ptr(), d.ptr() - 8 * MIB, "lent where the lifted range was");
    assert_eq!(pool.total_bytes(), 22 * MIB);
    // SAFETY: `f` is 7 MiB lent to this test alone, mapped again (the host checks its calls).
    unsafe { Host::memset(0, f.ptr(), 9, 7 * MIB).unwrap() };
    for at in (0..7 * MIB).step_by(MIB) {
        assert!(vmm_access_of(f.ptr() + at).is_some(), "{at}");
    }
    drop((d, e, f));
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
}
