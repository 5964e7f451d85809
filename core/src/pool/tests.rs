//! The pool alone, on a mock raw allocator: no backend, no stream, no memory type.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

/// A block the mock hands out: an address range, recorded as live until dropped.
struct MockBlock {
    address: DevicePtr,
    size: usize,
    device: DeviceId,
    live: Arc<Mutex<BTreeMap<DevicePtr, usize>>>,
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
        self.live.lock().unwrap().remove(&self.address);
    }
}

/// Hands out address ranges that never overlap; can be told to return short, null or
/// wrong-device blocks.
#[derive(Clone, Default)]
struct Mock {
    next: Arc<AtomicUsize>,
    live: Arc<Mutex<BTreeMap<DevicePtr, usize>>>,
    calls: Arc<AtomicUsize>,
    short: Arc<AtomicBool>,
    null: Arc<AtomicBool>,
    wrong_device: Arc<AtomicBool>,
}

impl RawAllocator for Mock {
    type Block = MockBlock;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<MockBlock> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let address = 0x1000_0000 + self.next.fetch_add(size + UNIT, Ordering::Relaxed);
        let size_given = if self.short.load(Ordering::Relaxed) { UNIT } else { size };
        let address = if self.null.load(Ordering::Relaxed) { 0 } else { address };
        let device = if self.wrong_device.load(Ordering::Relaxed) { device + 1 } else { device };
        self.live.lock().unwrap().insert(address, size_given);
        Ok(MockBlock { address, size: size_given, device, live: Arc::clone(&self.live) })
    }
}

fn pool() -> (Pool<Mock>, Mock, ArenaCache) {
    let mock = Mock::default();
    (Pool::new(0, mock.clone()), mock, ArenaCache::new())
}

#[test]
fn a_freed_chunk_is_lent_again_from_the_same_arena_only() {
    let (pool, mock, cache) = pool();
    let a = pool.malloc(1000, ArenaKey::NULL, &cache).unwrap();
    let address = a.ptr();
    assert_eq!((a.size(), pool.used_bytes(), pool.total_bytes()), (1024, 1024, 1024));
    drop(a);
    let other = pool.malloc(1000, ArenaKey::stream(7), &cache).unwrap();
    assert_ne!(other.ptr(), address, "another stream's arena does not reuse it");
    let again = pool.malloc(1000, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(again.ptr(), address);
    assert_eq!(mock.calls.load(Ordering::Relaxed), 2);
}

#[test]
fn best_fit_split_and_merge_within_one_block() {
    let (pool, _mock, cache) = pool();
    let big = pool.malloc(4 * UNIT, ArenaKey::NULL, &cache).unwrap();
    let base = big.ptr();
    drop(big);
    let a = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
    let b = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
    assert_eq!((a.ptr(), b.ptr()), (base, base + UNIT));
    drop(a);
    drop(b);
    assert_eq!(pool.n_free_blocks(), 1, "the three free parts merged back into one");
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn every_raw_block_is_checked_before_any_of_it_is_lent() {
    for (flag, what) in [(0, "short"), (1, "null"), (2, "wrong device")] {
        let (pool, mock, cache) = pool();
        [&mock.short, &mock.null, &mock.wrong_device][flag].store(true, Ordering::Relaxed);
        let err = pool.malloc(64 * 1024, ArenaKey::NULL, &cache).unwrap_err();
        assert!(matches!(err, Error::InvalidRawBlock { .. }), "{what}: {err}");
        assert_eq!((pool.total_bytes(), pool.used_bytes()), (0, 0), "{what}: nothing reserved");
        assert!(mock.live.lock().unwrap().is_empty(), "{what}: the bad block was freed");
    }
}

#[test]
fn a_fenced_chunk_is_not_lent_before_its_fence_completes() {
    struct Flag(Arc<AtomicBool>);
    impl Fence for Flag {
        fn is_complete(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
        fn wait(&self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let (pool, _mock, cache) = pool();
    let a = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
    let address = a.ptr();
    let done = Arc::new(AtomicBool::new(false));
    a.free_after(Box::new(Flag(Arc::clone(&done)))).unwrap();
    assert_eq!(pool.n_fenced(), 1);
    let b = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
    assert_ne!(b.ptr(), address, "lent again while its fence is pending");
    done.store(true, Ordering::Release);
    let c = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(c.ptr(), address, "lent again once the fence completed");
    assert_eq!(pool.n_fenced(), 0);
}

#[test]
fn the_out_of_memory_ladder_waits_for_fences_before_giving_up() {
    struct Later(Arc<AtomicBool>);
    impl Fence for Later {
        fn is_complete(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
        fn wait(&self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let (pool, _mock, cache) = pool();
    pool.set_limit(2 * UNIT);
    let a = pool.malloc(2 * UNIT, ArenaKey::NULL, &cache).unwrap();
    a.free_after(Box::new(Later(Arc::new(AtomicBool::new(false))))).unwrap();
    let b = pool.malloc(2 * UNIT, ArenaKey::stream(3), &cache).unwrap();
    assert_eq!(b.size(), 2 * UNIT);
    assert_eq!(pool.total_bytes(), 2 * UNIT);
}

#[test]
fn overflowing_requests_are_errors_of_the_right_kind() {
    let (pool, _mock, cache) = pool();
    let _a = pool.malloc(2048, ArenaKey::NULL, &cache).unwrap();
    let err = pool.malloc(usize::MAX - 1024, ArenaKey::NULL, &cache).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "unlimited pool: {err:?}");
    pool.set_growth_policy(GrowthPolicy::HoldPeakInUse);
    let err = pool.malloc(usize::MAX - 1024, ArenaKey::NULL, &cache).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
    assert_eq!(pool.total_bytes(), 2048);
}

#[test]
fn a_panicking_alloc_hook_leaves_every_counter_as_it_was() {
    struct Boom;
    impl hooks::MemoryHook for Boom {
        fn name(&self) -> &str {
            "Boom"
        }
        fn alloc_preprocess(&self, _: &AllocEvent) -> hooks::HookResult {
            panic!("hook panics");
        }
    }
    let (pool, _mock, cache) = pool();
    pool.set_limit(8 * UNIT);
    {
        let _hook = hooks::install(Boom).unwrap();
        for _ in 0..2 {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = pool.malloc(4 * UNIT, ArenaKey::NULL, &cache);
            }));
            assert!(caught.is_err());
        }
    }
    assert_eq!(pool.total_bytes(), 0, "the reservations were undone");
    assert!(pool.malloc(UNIT, ArenaKey::NULL, &cache).is_ok());
}

#[test]
fn a_retired_cached_arena_is_replaced_not_reported_as_out_of_memory() {
    let (pool, _mock, cache) = pool();
    pool.set_limit(4 * UNIT);
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    // Another thread retires the arena this thread has cached.
    std::thread::scope(|s| {
        s.spawn(|| pool.free_all_blocks(None));
    });
    for _ in 0..8 {
        drop(pool.malloc(4 * UNIT, ArenaKey::NULL, &cache).unwrap());
    }
}
