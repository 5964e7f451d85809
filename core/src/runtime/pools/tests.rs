//! Pool unit tests: CuPy's expectations (spec §1–§2) against the host backend and mock raw
//! allocators, a fault-injecting allocator, and a property test against a model.

#![allow(unsafe_code)] // the mock memory below must implement the unsafe `BaseMemory` trait

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::hal::DeviceOps;
use crate::hooks::{self, HookResult, MemoryHook};
use crate::host::Host;
use crate::runtime::stream::Stream;
use crate::*;

const U: usize = ALLOCATION_UNIT_SIZE;

/// Memory that is never dereferenced: the pool only does arithmetic on its addresses.
#[derive(Debug)]
struct FakeMemory {
    ptr: DevicePtr,
    size: usize,
    live: Arc<Mutex<BTreeMap<DevicePtr, usize>>>,
}

// SAFETY: only used by pool tests that never copy to or from the memory; the promise of valid
// device memory is not relied upon.
unsafe impl BaseMemory<Host> for FakeMemory {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> DeviceId {
        0
    }
}

impl Drop for FakeMemory {
    fn drop(&mut self) {
        self.live.lock().remove(&self.ptr);
    }
}

/// Hands out increasing fake addresses (CuPy's mock allocator), and can fail on purpose: the
/// `fail_calls` listed (1-based), or every call above `fail_above` bytes.
#[derive(Default)]
struct MockAllocator {
    next: AtomicUsize,
    calls: AtomicUsize,
    fail_calls: Mutex<Vec<usize>>,
    fail_above: Option<usize>,
    live: Arc<Mutex<BTreeMap<DevicePtr, usize>>>,
}

impl MockAllocator {
    fn new() -> Arc<Self> {
        Arc::new(MockAllocator { next: AtomicUsize::new(1 << 20), ..Default::default() })
    }
    fn failing_above(limit: usize) -> Arc<Self> {
        Arc::new(MockAllocator {
            next: AtomicUsize::new(1 << 20),
            fail_above: Some(limit),
            ..Default::default()
        })
    }
    fn live_bytes(&self) -> usize {
        self.live.lock().values().sum()
    }
}

impl RawAllocator for MockAllocator {
    type Block = Box<dyn BaseMemory<Host>>;

    fn allocate(&self, _device: DeviceId, size: usize) -> Result<Box<dyn BaseMemory<Host>>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_calls.lock().contains(&call) || self.fail_above.is_some_and(|max| size > max) {
            return Err(Error::OutOfMemory { size, total: None });
        }
        // A gap after each block keeps blocks from looking adjacent.
        let ptr = self.next.fetch_add(size + U, Ordering::SeqCst);
        self.live.lock().insert(ptr, size);
        Ok(Box::new(FakeMemory { ptr, size, live: Arc::clone(&self.live) }))
    }
}

fn mock_pool() -> (SingleDeviceMemoryPool<Host, Arc<MockAllocator>>, Arc<MockAllocator>) {
    let mock = MockAllocator::new();
    let pool = SingleDeviceMemoryPool::with_allocator(0, mock.clone()).unwrap();
    (pool, mock)
}

#[test]
fn round_size_matches_cupy() {
    for (n, r) in [(0, 0), (1, 512), (511, 512), (512, 512), (513, 1024)] {
        assert_eq!(round_size(n), Some(r));
    }
    assert_eq!(round_size(usize::MAX), None, "CuPy wraps to 0 here; gpumem refuses");
    let (pool, _) = mock_pool();
    assert!(matches!(pool.malloc(usize::MAX - 10), Err(Error::InvalidArgument(_))));
}

#[test]
fn statistics_follow_cupy_sequence() {
    let (pool, _) = mock_pool();
    assert_eq!(
        (pool.used_bytes(), pool.free_bytes(), pool.total_bytes(), pool.n_free_blocks()),
        (0, 0, 0, 0)
    );
    pool.free_all_blocks(None); // a no-op on a fresh pool
    let p2 = pool.malloc(2 * U).unwrap();
    assert_eq!((pool.used_bytes(), pool.total_bytes()), (2 * U, 2 * U));
    let p4 = pool.malloc(4 * U).unwrap();
    assert_eq!((pool.used_bytes(), pool.total_bytes()), (6 * U, 6 * U));
    drop(p4);
    assert_eq!((pool.used_bytes(), pool.free_bytes(), pool.total_bytes()), (2 * U, 4 * U, 6 * U));
    drop(p2);
    assert_eq!((pool.used_bytes(), pool.free_bytes(), pool.total_bytes()), (0, 6 * U, 6 * U));
    let p1 = pool.malloc(U).unwrap();
    assert_eq!((pool.free_bytes(), pool.total_bytes()), (5 * U, 6 * U));
    drop(p1);
    pool.free_all_blocks(None);
    assert_eq!((pool.total_bytes(), pool.n_free_blocks()), (0, 0));
}

#[test]
fn best_fit_splits_and_merges_within_one_block() {
    let (pool, mock) = mock_pool();
    let big = pool.malloc(4 * U).unwrap();
    let base = big.ptr();
    drop(big);
    let a = pool.malloc(U).unwrap();
    assert_eq!(a.ptr(), base, "the head of the split is lent");
    assert_eq!((pool.n_free_blocks(), pool.free_bytes()), (1, 3 * U));
    let b = pool.malloc(U).unwrap();
    assert_eq!(b.ptr(), base + U);
    // A split block is not released while a part is in use (CuPy #4171).
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 4 * U);
    drop(a);
    assert_eq!(pool.n_free_blocks(), 2, "a free neighbour that is in use stops the merge");
    drop(b);
    assert_eq!(pool.n_free_blocks(), 1, "both sides merged back into one chunk");
    assert_eq!(pool.free_chunks_of_current_stream(), vec![(base, 4 * U)]);
    pool.free_all_blocks(None);
    assert_eq!((pool.total_bytes(), mock.live_bytes()), (0, 0));
}

#[test]
fn chunks_of_different_raw_blocks_never_merge() {
    let (pool, _) = mock_pool();
    let a = pool.malloc(U).unwrap();
    let b = pool.malloc(U).unwrap();
    drop(a);
    drop(b);
    assert_eq!(pool.n_free_blocks(), 2);
    let c = pool.malloc(2 * U).unwrap();
    assert_eq!(pool.total_bytes(), 4 * U, "two one-unit blocks cannot serve two units");
    drop(c);
}

#[test]
fn zero_size_allocation_is_plain_memory() {
    let (pool, mock) = mock_pool();
    let p = pool.malloc(0).unwrap();
    assert_eq!((p.ptr(), p.mem().size(), p.mem().identity()), (0, 0, "Memory"));
    assert_eq!(mock.calls.load(Ordering::SeqCst), 0);
    assert_eq!((pool.used_bytes(), pool.total_bytes()), (0, 0));
    assert_eq!(pool.malloc(1).unwrap().mem().identity(), "PooledMemory");
}

#[test]
fn arenas_are_per_stream() {
    let (pool, _) = mock_pool();
    let s1 = Stream::<Host>::non_blocking().unwrap();
    let s2 = Stream::<Host>::non_blocking().unwrap();
    let on_s1 = {
        let _g = s1.enter().unwrap();
        pool.malloc(U).unwrap()
    };
    let ptr = on_s1.ptr();
    {
        // Freed while s2 is current: it still goes back to s1's arena.
        let _g = s2.enter().unwrap();
        drop(on_s1);
        let p = pool.malloc(U).unwrap();
        assert_ne!(p.ptr(), ptr, "a chunk freed in s1's arena is not lent on s2");
    }
    {
        let _g = s1.enter().unwrap();
        assert_eq!(pool.malloc(U).unwrap().ptr(), ptr, "reused on its own stream");
    }
    assert_ne!(pool.malloc(U).unwrap().ptr(), ptr, "nor on the null stream");
    // free_all_blocks(stream) releases only that stream's arena.
    let before = pool.total_bytes();
    pool.free_all_blocks(Some(&s1));
    assert_eq!(pool.total_bytes(), before - U);
}

#[test]
fn threads_share_the_null_stream_arena_but_not_per_thread_arenas() {
    let (pool, _) = mock_pool();
    let pool = Arc::new(pool);
    let p = pool.malloc(U).unwrap();
    let ptr = p.ptr();
    drop(p);
    let pool2 = Arc::clone(&pool);
    let other = std::thread::spawn(move || pool2.malloc(U).unwrap().ptr()).join().unwrap();
    assert_eq!(other, ptr, "two threads on the null stream reuse each other's chunks");

    let ptds = Stream::<Host>::per_thread();
    let mine = {
        let _g = ptds.enter().unwrap();
        let p = pool.malloc(U).unwrap();
        p.ptr()
    };
    let pool3 = Arc::clone(&pool);
    let theirs = std::thread::spawn(move || {
        let _g = Stream::<Host>::per_thread().enter().unwrap();
        pool3.malloc(U).unwrap().ptr()
    })
    .join()
    .unwrap();
    assert_ne!(mine, theirs, "each thread has its own per-thread arena");
}

#[test]
fn limit_sequences() {
    let (pool, _) = mock_pool();
    assert_eq!(pool.get_limit().unwrap(), 0);
    pool.set_limit(Limit::Bytes(2 * U)).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 2 * U);
    let a = pool.malloc(U).unwrap();
    let _b = pool.malloc(U).unwrap();
    let err = pool.malloc(U).unwrap_err();
    assert!(
        matches!(err, Error::LimitExceeded { size, total, limit } if (size, total, limit) == (U, 2 * U, 2 * U))
    );
    assert_eq!(
        err.to_string(),
        "Out of memory allocating 512 bytes (allocated so far: 1,024 bytes, limit set to: 1,024 bytes)."
    );
    drop(a);
    pool.malloc(U).unwrap(); // served from the cache: the limit is not consulted
                             // Larger than the limit: refused at once.
    assert!(matches!(pool.malloc(3 * U).unwrap_err(), Error::LimitExceeded { .. }));
    pool.set_limit(Limit::Bytes(0)).unwrap();
    pool.malloc(3 * U).unwrap();
    pool.set_limit(Limit::Fraction(0.0)).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 0, "fraction 0 means unlimited");
    pool.set_limit(Limit::Fraction(0.5)).unwrap();
    assert_eq!(pool.get_limit().unwrap(), Host::mem_get_info(0).unwrap().total / 2);
    assert!(pool.set_limit(Limit::Fraction(1.5)).is_err());
    assert_eq!(
        pool.get_limit().unwrap(),
        Host::mem_get_info(0).unwrap().total / 2,
        "a refused limit changes nothing"
    );
}

#[test]
fn limit_with_a_fragmented_cache_frees_and_retries() {
    // CuPy #7678: the cache held enough freeable memory, but the limit check failed first.
    let (pool, _) = mock_pool();
    pool.set_limit(Limit::Bytes(4 * U)).unwrap();
    drop(pool.malloc(2 * U).unwrap());
    assert_eq!(pool.total_bytes(), 2 * U);
    let p = pool.malloc(3 * U).unwrap();
    assert_eq!((pool.total_bytes(), pool.used_bytes()), (3 * U, 3 * U));
    drop(p);
}

#[derive(Default)]
struct Counting {
    name: &'static str,
    calls: RefCell<Vec<String>>,
    fail: Option<&'static str>,
}

impl Counting {
    fn log(&self, what: &str, args: String) -> HookResult {
        self.calls.borrow_mut().push(format!("{what} {args}"));
        if self.fail == Some(what) {
            Err(format!("{what} refused").into())
        } else {
            Ok(())
        }
    }
}

impl MemoryHook for Counting {
    fn name(&self) -> &str {
        self.name
    }
    fn alloc_preprocess(&self, e: &AllocEvent) -> HookResult {
        self.log("alloc_pre", format!("{} {}", e.device_id, e.mem_size))
    }
    fn alloc_postprocess(&self, e: &AllocEvent) -> HookResult {
        self.log("alloc_post", format!("{} {} {}", e.device_id, e.mem_size, e.mem_ptr != 0))
    }
    fn malloc_preprocess(&self, e: &MallocEvent) -> HookResult {
        self.log("malloc_pre", format!("{} {} {}", e.device_id, e.size, e.mem_size))
    }
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.log(
            "malloc_post",
            format!("{} {} {} {:x} {:x}", e.device_id, e.size, e.mem_size, e.mem_ptr, e.pmem_id),
        )
    }
    fn free_preprocess(&self, e: &FreeEvent) -> HookResult {
        self.log("free_pre", format!("{} {} {:x} {:x}", e.device_id, e.mem_size, e.mem_ptr, e.pmem_id))
    }
    fn free_postprocess(&self, e: &FreeEvent) -> HookResult {
        self.log("free_post", format!("{} {} {:x} {:x}", e.device_id, e.mem_size, e.mem_ptr, e.pmem_id))
    }
}

fn count(calls: &[String], what: &str) -> usize {
    calls.iter().filter(|c| c.split(' ').next() == Some(what)).count()
}

#[test]
fn hook_calls_and_arguments_match_cupy() {
    let (pool, _) = mock_pool();
    let hook = hooks::install(Counting { name: "counting", ..Default::default() }).unwrap();
    let p = pool.malloc_pooled(1).unwrap();
    let (ptr, id) = (p.ptr(), p.pmem_id());
    drop(p);
    drop(pool.malloc_pooled(1).unwrap()); // a cache hit: malloc hooks only
    let calls = hook.calls.borrow().clone();
    drop(hook);
    assert_eq!(
        calls[..6],
        [
            "malloc_pre 0 1 512".to_owned(),
            "alloc_pre 0 512".to_owned(),
            "alloc_post 0 512 true".to_owned(),
            format!("malloc_post 0 1 512 {ptr:x} {id:x}"),
            format!("free_pre 0 512 {ptr:x} {id:x}"),
            format!("free_post 0 512 {ptr:x} {id:x}"),
        ]
    );
    let counts: Vec<usize> =
        ["alloc_pre", "alloc_post", "malloc_pre", "malloc_post", "free_pre", "free_post"]
            .map(|w| count(&calls, w))
            .into();
    assert_eq!(counts, [1, 1, 2, 2, 2, 2]);
}

#[test]
fn hooks_run_in_registration_order_for_pre_and_post() {
    let (pool, _) = mock_pool();
    let order = Rc::new(RefCell::new(Vec::new()));
    struct Named(&'static str, Rc<RefCell<Vec<String>>>);
    impl MemoryHook for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn malloc_preprocess(&self, _: &MallocEvent) -> HookResult {
            self.1.borrow_mut().push(format!("{}.pre", self.0));
            Ok(())
        }
        fn malloc_postprocess(&self, _: &MallocEvent) -> HookResult {
            self.1.borrow_mut().push(format!("{}.post", self.0));
            Ok(())
        }
    }
    let a = hooks::install(Named("A", order.clone())).unwrap();
    let b = hooks::install(Named("B", order.clone())).unwrap();
    assert!(
        matches!(hooks::install(Named("A", order.clone())), Err(Error::HookAlreadyRegistered(n)) if n == "A")
    );
    assert_eq!(hooks::installed(), ["A", "B"]);
    drop(pool.malloc(1).unwrap());
    assert_eq!(*order.borrow(), ["A.pre", "B.pre", "A.post", "B.post"]);
    drop(a); // out of nesting order
    assert_eq!(hooks::installed(), ["B"]);
    drop(b);
    assert!(hooks::installed().is_empty());
    // Hooks are per thread.
    let _c = hooks::install(Named("C", order.clone())).unwrap();
    assert!(std::thread::spawn(hooks::installed).join().unwrap().is_empty());
}

#[test]
fn a_failing_hook_never_leaks_or_skews_counters() {
    for phase in ["malloc_pre", "alloc_pre", "alloc_post", "malloc_post", "free_pre", "free_post"] {
        let (pool, mock) = mock_pool();
        let hook =
            hooks::install(Counting { name: "failing", fail: Some(phase), ..Default::default() }).unwrap();
        let result = pool.malloc_pooled(U);
        match phase {
            "free_pre" | "free_post" => {
                let err = result.unwrap().free().unwrap_err();
                assert!(matches!(err, Error::Hook { .. }), "{phase}");
            }
            _ => assert!(matches!(result, Err(Error::Hook { .. })), "{phase}"),
        }
        assert_eq!(pool.used_bytes(), 0, "{phase}: the chunk went back");
        if phase == "malloc_post" {
            assert_eq!(count(&hook.calls.borrow(), "free_pre"), 1, "the returned chunk fires the free hooks");
        }
        drop(hook);
        pool.free_all_blocks(None);
        assert_eq!((pool.total_bytes(), mock.live_bytes()), (0, 0), "{phase}: nothing leaked");
    }
}

#[test]
fn out_of_memory_ladder_retries_three_times_then_fails_with_cupys_message() {
    let mock = MockAllocator::failing_above(4 * U);
    let pool = SingleDeviceMemoryPool::with_allocator(0, mock.clone()).unwrap();
    let cached = pool.malloc(4 * U).unwrap();
    drop(cached);
    let hook = hooks::install(Counting { name: "ladder", ..Default::default() }).unwrap();
    let err = pool.malloc(8 * U).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { size, total: Some(0) } if size == 8 * U), "{err:?}");
    assert_eq!(err.to_string(), "Out of memory allocating 4,096 bytes (allocated so far: 0 bytes).");
    assert_eq!(mock.live_bytes(), 0, "the ladder released the cached block");
    let calls = hook.calls.borrow().clone();
    assert_eq!((count(&calls, "alloc_pre"), count(&calls, "alloc_post")), (3, 3));
    assert!(
        calls.iter().any(|c| c.starts_with("malloc_post") && c.ends_with(" 0 0")),
        "post hooks see 0 on failure"
    );
    assert_eq!(pool.total_bytes(), 0, "the reservation was rolled back");
}

#[test]
fn out_of_memory_ladder_succeeds_after_releasing_the_cache() {
    let mock = MockAllocator::new();
    let pool = SingleDeviceMemoryPool::with_allocator(0, mock.clone()).unwrap();
    drop(pool.malloc(U).unwrap());
    // The next raw call fails once; the pool releases its cache and the retry succeeds.
    mock.fail_calls.lock().push(2);
    let p = pool.malloc(2 * U).unwrap();
    assert_eq!((pool.total_bytes(), mock.calls.load(Ordering::SeqCst)), (2 * U, 3));
    drop(p);
    // Other errors are not retried.
    let bad = SingleDeviceMemoryPool::<Host, _>::with_allocator(
        0,
        FnAllocator(|_: DeviceId, _: usize| -> Result<Box<dyn BaseMemory<Host>>> {
            Err(Error::InvalidArgument("refused".into()))
        }),
    )
    .unwrap();
    assert!(matches!(bad.malloc(1), Err(Error::InvalidArgument(_))));
    assert_eq!(bad.total_bytes(), 0);
}

#[test]
fn a_dropped_pool_releases_its_cache_and_every_chunk_that_comes_back() {
    let (pool, mock) = mock_pool();
    let held = pool.malloc(U).unwrap();
    drop(pool.malloc(2 * U).unwrap());
    drop(pool);
    assert_eq!(mock.live_bytes(), U, "cached blocks go with the pool");
    drop(held);
    assert_eq!(mock.live_bytes(), 0, "a chunk returned later releases its block");
}

#[test]
fn multi_device_pool_routes_to_the_current_device() {
    let pool = MemoryPool::<Host>::new();
    let a = pool.malloc(U).unwrap();
    assert_eq!(a.device_id(), 0);
    {
        let _d = crate::Device::<Host>::new(1).enter().unwrap();
        assert_eq!(pool.used_bytes(), 0, "device 1's pool is separate");
        let b = pool.malloc(3 * U).unwrap();
        assert_eq!((b.device_id(), pool.used_bytes()), (1, 3 * U));
        pool.set_limit(Limit::Bytes(100 * U)).unwrap();
        assert_eq!(pool.get_limit().unwrap(), 100 * U);
    }
    assert_eq!((pool.used_bytes(), pool.get_limit().unwrap()), (U, 0), "limits are per device");
    assert!(matches!(pool.device_pool(5), Err(Error::NoSuchDevice { device: 5, .. })));
}

/// A multi-thread stress test on the host backend's real memory: threads allocate on shared and
/// private streams, stamp their chunks, and check the stamps before freeing; an overlap would
/// corrupt another thread's stamp.
#[test]
fn multi_thread_stress_has_no_overlap_and_counters_add_up() {
    let pool = Arc::new(SingleDeviceMemoryPool::<Host>::new(0).unwrap());
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let private = Stream::<Host>::non_blocking().unwrap();
                let mut rng = t as u64 * 7919 + 1;
                let mut live: Vec<crate::MemoryPointer<Host>> = Vec::new();
                for i in 0..400 {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let size = 1 + (rng >> 33) as usize % (64 * 1024);
                    let _guard = (t % 2 == 0 && i % 3 == 0).then(|| private.enter().unwrap());
                    if live.len() > 8 || (rng >> 20).is_multiple_of(3) {
                        if !live.is_empty() {
                            let p = live.swap_remove((rng >> 40) as usize % live.len());
                            let mut back = vec![0u8; p.mem().size()];
                            let n = back.len();
                            p.copy_to_host(&mut back, n).unwrap();
                            assert!(back.iter().all(|&b| b == t + 1), "thread {t}: a chunk was overwritten");
                        }
                    } else {
                        let p = pool.malloc(size).unwrap();
                        p.memset(t + 1, p.mem().size()).unwrap();
                        live.push(p);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.free_bytes(), pool.total_bytes());
    pool.free_all_blocks(None);
    assert_eq!((pool.total_bytes(), pool.n_free_blocks()), (0, 0));
}

#[test]
fn growth_policies() {
    // CuPy's rule: the cache stays; a larger request adds to it.
    let (pool, mock) = mock_pool();
    assert_eq!(pool.growth_policy(), GrowthPolicy::CacheUntilOutOfMemory);
    drop(pool.malloc(4 * U).unwrap());
    drop(pool.malloc(8 * U).unwrap());
    assert_eq!(mock.live_bytes(), 12 * U);
    // A larger free chunk is cut for a small request: no new block.
    let cut = pool.malloc(U).unwrap();
    assert_eq!((mock.live_bytes(), pool.n_free_blocks()), (12 * U, 2));
    drop(cut);

    // Release before grow: a miss first releases every cached whole block.
    let (pool, mock) = mock_pool();
    pool.set_growth_policy(GrowthPolicy::ReleaseBeforeGrow);
    drop(pool.malloc(4 * U).unwrap());
    let p = pool.malloc(8 * U).unwrap();
    assert_eq!((mock.live_bytes(), pool.total_bytes()), (8 * U, 8 * U));
    drop(p);
    assert_eq!(pool.malloc(8 * U).unwrap().mem().size(), 8 * U, "hits still come from the cache");

    // Hold peak in use: the cache is kept up to the most ever in use, and large chunks are not cut.
    let (pool, mock) = mock_pool();
    pool.set_growth_policy(GrowthPolicy::HoldPeakInUse);
    let a = pool.malloc(4 * U).unwrap();
    let b = pool.malloc(4 * U).unwrap();
    drop((a, b));
    assert_eq!(mock.live_bytes(), 8 * U, "peak in use was 8 units: both stay cached");
    let c = pool.malloc(8 * U).unwrap();
    assert_eq!(mock.live_bytes(), 8 * U, "an 8-unit miss releases both cached blocks first");
    drop(c);
    let small = pool.malloc(U).unwrap();
    assert_eq!(mock.live_bytes(), U, "the 8-unit block is not cut for 1 unit; released to stay at the peak");
    let fits = pool.malloc(U).unwrap();
    drop(small);
    let again = pool.malloc(U).unwrap();
    assert_eq!(pool.n_free_blocks(), 0);
    drop((fits, again));
    pool.set_growth_policy(GrowthPolicy::CacheUntilOutOfMemory);
    assert_eq!(pool.growth_policy(), GrowthPolicy::CacheUntilOutOfMemory);
}

mod model {
    //! The pool against a simple model: per-arena lists of free chunks, best fit by linear
    //! search, explicit split and merge.
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Step {
        Alloc { stream: usize, size: usize },
        Free { pick: usize },
        FreeAll { stream: Option<usize> },
    }

    fn step() -> impl Strategy<Value = Step> {
        // Sizes from 0 to ~32 MiB, log-uniform so small and large both appear.
        let size = (0u32..26).prop_flat_map(|bits| 0usize..(1usize << bits).max(1));
        prop_oneof![
            5 => (0usize..4, size).prop_map(|(stream, size)| Step::Alloc { stream, size }),
            4 => any::<usize>().prop_map(|pick| Step::Free { pick }),
            1 => proptest::option::of(0usize..4).prop_map(|stream| Step::FreeAll { stream }),
        ]
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Chunk {
        ptr: usize,
        size: usize,
        block: usize,
    }

    #[derive(Default)]
    struct Model {
        /// Free chunks per arena (stream index 0..4; 0 is the null stream).
        free: HashMap<usize, Vec<Chunk>>,
        /// Lent chunks: (chunk, arena).
        lent: Vec<(Chunk, usize)>,
        /// Raw blocks: start -> size.
        blocks: BTreeMap<usize, usize>,
    }

    impl Model {
        fn used(&self) -> usize {
            self.lent.iter().map(|(c, _)| c.size).sum()
        }
        fn total(&self) -> usize {
            self.blocks.values().sum()
        }
        fn n_free(&self) -> usize {
            self.free.values().map(Vec::len).sum()
        }
        fn give_back(&mut self, mut c: Chunk, arena: usize) {
            let free = self.free.entry(arena).or_default();
            if let Some(i) = free.iter().position(|n| n.block == c.block && n.ptr == c.ptr + c.size) {
                c.size += free.swap_remove(i).size;
            }
            if let Some(i) = free.iter().position(|p| p.block == c.block && p.ptr + p.size == c.ptr) {
                let p = free.swap_remove(i);
                c = Chunk { ptr: p.ptr, size: p.size + c.size, block: c.block };
            }
            free.push(c);
        }
        fn release(&mut self, arena: usize) {
            let blocks = &mut self.blocks;
            self.free.entry(arena).or_default().retain(|c| {
                let whole = blocks.get(&c.ptr) == Some(&c.size) && c.block == c.ptr;
                if whole {
                    blocks.remove(&c.ptr);
                }
                !whole
            });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn pool_matches_the_model(steps in proptest::collection::vec(step(), 1..160)) {
            let (pool, mock) = mock_pool();
            let streams: Vec<Stream<Host>> =
                std::iter::once(Stream::null()).chain((0..3).map(|_| Stream::non_blocking().unwrap())).collect();
            let mut model = Model::default();
            let mut lent: Vec<crate::MemoryPointer<Host>> = Vec::new();
            for step in steps {
                match step {
                    Step::Alloc { stream, size } => {
                        let _g = streams[stream].enter().unwrap();
                        let calls = mock.calls.load(Ordering::SeqCst);
                        let p = pool.malloc(size).unwrap();
                        let rounded = round_size(size).unwrap();
                        if rounded == 0 {
                            prop_assert_eq!(p.ptr(), 0);
                            continue;
                        }
                        let free = model.free.entry(stream).or_default();
                        let best = free.iter().filter(|c| c.size >= rounded).map(|c| c.size).min();
                        let chunk = if let Some(best) = best {
                            // A hit: the pool took a free chunk of the best size, at its start.
                            let i = free.iter().position(|c| c.size == best && c.ptr == p.ptr());
                            prop_assert!(i.is_some(), "not a best-fit chunk: {:x} for {}", p.ptr(), rounded);
                            let c = free.swap_remove(i.unwrap());
                            if c.size > rounded {
                                free.push(Chunk { ptr: c.ptr + rounded, size: c.size - rounded, block: c.block });
                            }
                            prop_assert_eq!(mock.calls.load(Ordering::SeqCst), calls);
                            Chunk { ptr: c.ptr, size: rounded, block: c.block }
                        } else {
                            prop_assert_eq!(mock.calls.load(Ordering::SeqCst), calls + 1, "a miss allocates once");
                            model.blocks.insert(p.ptr(), rounded);
                            Chunk { ptr: p.ptr(), size: rounded, block: p.ptr() }
                        };
                        model.lent.push((chunk, stream));
                        lent.push(p);
                    }
                    Step::Free { pick } => {
                        if lent.is_empty() {
                            continue;
                        }
                        let i = pick % lent.len();
                        drop(lent.swap_remove(i));
                        let (c, arena) = model.lent.swap_remove(i);
                        model.give_back(c, arena);
                    }
                    Step::FreeAll { stream } => {
                        pool.free_all_blocks(stream.map(|s| &streams[s]));
                        match stream {
                            Some(s) => model.release(s),
                            None => (0..4).for_each(|s| model.release(s)),
                        }
                    }
                }
                // No two lent chunks overlap.
                let mut spans: Vec<(usize, usize)> = model.lent.iter().map(|(c, _)| (c.ptr, c.ptr + c.size)).collect();
                spans.sort_unstable();
                prop_assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "lent chunks overlap");
                prop_assert_eq!(pool.used_bytes(), model.used());
                prop_assert_eq!(pool.total_bytes(), model.total());
                prop_assert_eq!(pool.total_bytes(), mock.live_bytes());
                prop_assert_eq!(pool.free_bytes(), model.total() - model.used());
                prop_assert_eq!(pool.n_free_blocks(), model.n_free());
            }
            drop(lent);
            for (c, arena) in std::mem::take(&mut model.lent) {
                model.give_back(c, arena);
            }
            pool.free_all_blocks(None);
            prop_assert_eq!((pool.total_bytes(), pool.n_free_blocks(), mock.live_bytes()), (0, 0, 0));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        /// The other growth policies keep every invariant that does not depend on which chunk is
        /// chosen.
        #[test]
        fn every_policy_keeps_the_invariants(
            steps in proptest::collection::vec(step(), 1..160),
            policy in 0..3usize,
        ) {
            let (pool, mock) = mock_pool();
            pool.set_growth_policy([GrowthPolicy::HoldPeakInUse, GrowthPolicy::ReleaseBeforeGrow, GrowthPolicy::Segments][policy]);
            let streams: Vec<Stream<Host>> =
                std::iter::once(Stream::null()).chain((0..3).map(|_| Stream::non_blocking().unwrap())).collect();
            let mut lent: Vec<crate::MemoryPointer<Host>> = Vec::new();
            for step in steps {
                match step {
                    Step::Alloc { stream, size } => {
                        let _g = streams[stream].enter().unwrap();
                        lent.push(pool.malloc(size).unwrap());
                    }
                    Step::Free { pick } if !lent.is_empty() => drop(lent.swap_remove(pick % lent.len())),
                    Step::Free { .. } => {}
                    Step::FreeAll { stream } => pool.free_all_blocks(stream.map(|s| &streams[s])),
                }
                let mut spans: Vec<(usize, usize)> = lent.iter().filter(|p| p.ptr() != 0).map(|p| (p.ptr(), p.ptr() + p.mem().size())).collect();
                spans.sort_unstable();
                prop_assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "lent chunks overlap");
                prop_assert_eq!(pool.used_bytes(), lent.iter().map(|p| p.mem().size()).sum::<usize>());
                prop_assert_eq!(pool.total_bytes(), mock.live_bytes());
                prop_assert_eq!(pool.free_bytes(), pool.total_bytes() - pool.used_bytes());
            }
            drop(lent);
            pool.free_all_blocks(None);
            prop_assert_eq!((pool.total_bytes(), pool.n_free_blocks(), mock.live_bytes()), (0, 0, 0));
        }
    }
}

#[test]
fn statistics_are_kept_per_stream_through_the_typed_pool() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let s = Stream::<Host>::non_blocking().unwrap();
    let on_null = pool.malloc(3 * U).unwrap();
    let on_s = {
        let _g = s.enter().unwrap();
        pool.malloc(U + 1).unwrap()
    };
    // Freed on the null stream, counted in the arena it came from.
    drop(on_s);
    let stats = pool.stats();
    assert_eq!(stats.arenas.len(), 2);
    let of = |k: ArenaKey| stats.arenas.iter().find(|a| a.arena == k).unwrap().stats;
    let st = of(s.arena_key());
    assert_eq!(
        (st.requested_bytes.peak, st.allocated_bytes.peak, st.allocated_bytes.current),
        (U as u64 + 1, 2 * U as u64, 0)
    );
    assert_eq!((st.allocations.allocated, st.allocations.freed), (1, 1));
    assert_eq!(of(ArenaKey::NULL).allocated_bytes.current, 3 * U as u64);
    assert_eq!(stats.all.reserved_bytes.current, pool.total_bytes() as u64);
    let snap = pool.snapshot();
    assert_eq!(snap.segments.iter().filter(|g| g.arena == s.arena_key()).count(), 1);
    assert!(pool.memory_summary().contains(&format!("stream 0x{:x}", s.arena_key().raw())));
    drop(on_null);
    pool.reset_peak();
    assert_eq!(pool.stats().all.allocated_bytes.peak, 0);
}

#[test]
fn the_typed_pools_out_of_memory_observer_runs_before_the_error_returns() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    pool.set_limit(Limit::Bytes(4 * U)).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = Arc::clone(&calls);
    pool.add_oom_observer(move |e, snap| {
        assert!(matches!(e, Error::LimitExceeded { .. }));
        assert_eq!(snap.segments.iter().map(|s| s.total_size).sum::<usize>(), 2 * U);
        c2.fetch_add(1, Ordering::Relaxed);
    });
    let _a = pool.malloc(2 * U).unwrap();
    assert!(pool.malloc(3 * U).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(pool.stats().all.oom_errors, 1);
}

// A pointer from a pool on the runtime's allocator holds its chunk inline until the memory is
// shared; these tests pin down when the chunk goes back in each case.

#[test]
fn an_inline_pointer_gives_its_chunk_back_when_dropped() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc(1000).unwrap();
    assert!(p.is_inline(), "a cache miss or hit of the runtime's allocator is held inline");
    assert_eq!((p.size(), pool.used_bytes()), (1024, 1024));
    p.memset(7, 1024).unwrap();
    let q = p + 24; // by value: still the one owner
    assert!(q.is_inline());
    assert_eq!(q.size(), 1000);
    drop(q);
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.n_free_blocks(), 1);
}

#[test]
fn a_shared_inline_chunk_goes_back_with_the_last_pointer() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc(512).unwrap();
    let base = p.ptr();
    let q = &p + 100; // shares: the chunk moves into its shared object
    assert!(!p.is_inline());
    assert!(Arc::ptr_eq(p.mem(), q.mem()), "both hold the one shared object");
    assert_eq!(p.mem().identity(), "PooledMemory");
    assert_eq!((q.ptr(), q.size()), (base + 100, 412));
    drop(p);
    assert_eq!(pool.used_bytes(), 512, "the offset pointer keeps the chunk");
    let r = q.clone();
    drop(q);
    assert_eq!(pool.used_bytes(), 512);
    drop(r);
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn asking_for_the_memory_object_keeps_the_chunk_until_it_is_dropped() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc(512).unwrap();
    let mem = Arc::clone(p.mem());
    assert_eq!(format!("{p:?}"), format!("<MemoryPointer 0x{:x} device=0 mem={mem:?}>", p.ptr()));
    drop(p);
    assert_eq!(pool.used_bytes(), 512);
    drop(mem);
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn queued_work_keeps_an_inline_chunk_alive() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let s = Stream::<Host>::non_blocking().unwrap();
    let p = pool.malloc(4096).unwrap();
    let gate = Arc::new(std::sync::Barrier::new(2));
    let g = Arc::clone(&gate);
    // The stream is held at a host function, so the memset behind it stays queued.
    s.launch_host_func(move || {
        g.wait();
    })
    .unwrap();
    p.memset_async(3, 4096, Some(&s)).unwrap();
    drop(p);
    assert_eq!(pool.used_bytes(), 4096, "the queued memset keeps the chunk lent");
    gate.wait();
    s.synchronize().unwrap();
    assert_eq!(pool.used_bytes(), 0, "released once the stream has passed the memset");
}

/// A stream held at a host function until the returned gate is opened (`open`).
fn held_stream() -> (Stream<Host>, Arc<std::sync::Barrier>) {
    let s = Stream::<Host>::non_blocking().unwrap();
    let gate = Arc::new(std::sync::Barrier::new(2));
    let g = Arc::clone(&gate);
    s.launch_host_func(move || {
        g.wait();
    })
    .unwrap();
    (s, gate)
}

#[test]
fn a_chunk_notes_one_other_stream_then_more_than_one_and_keeps_its_own_streams_order() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc(512).unwrap();
    let mem = p.mem();
    let own = mem.reuse_stream().expect("a chunk of the pool on the runtime's allocator");
    assert_eq!(mem.other_streams(), crate::pool::OtherStreams::None);
    let (a, b) = (ArenaKey::stream(0x1000), ArenaKey::stream(0x2000));
    assert!(mem.note_other_stream(own), "its own stream needs no note");
    assert_eq!(mem.other_streams(), crate::pool::OtherStreams::None);
    assert!(mem.note_other_stream(a));
    assert!(mem.note_other_stream(a));
    assert_eq!(mem.other_streams(), crate::pool::OtherStreams::One(a));
    assert_eq!(mem.reuse_stream(), Some(own), "a noted chunk is not taken for a borrowed one");
    assert!(mem.note_other_stream(b));
    assert_eq!(mem.other_streams(), crate::pool::OtherStreams::Many);
    assert!(mem.note_other_stream(a));
    assert_eq!(mem.other_streams(), crate::pool::OtherStreams::Many);
    drop(p);
    // Nothing was queued on those streams: the fence is complete at once and the chunk is back.
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn a_chunk_another_stream_used_is_lent_again_only_once_that_work_has_run() {
    // The memset on `s` keeps nothing alive: the chunk (of the current stream's arena) notes `s`,
    // and its free goes behind a fence on `s`'s work.
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let (s, gate) = held_stream();
    let p = pool.malloc(4096).unwrap();
    let at = p.ptr();
    p.memset_async(3, 4096, Some(&s)).unwrap();
    drop(p);
    let q = pool.malloc(4096).unwrap();
    let used = pool.used_bytes();
    // Opened before the checks, so that a failed one does not leave the stream held.
    gate.wait();
    assert_ne!(q.ptr(), at, "not lent while the memset is queued");
    assert_eq!(used, 8192, "the fenced chunk counts as used");
    s.synchronize().unwrap();
    assert_eq!(pool.used_bytes(), 4096, "back once the stream has passed the memset");
    let r = pool.malloc(4096).unwrap();
    assert_eq!(r.ptr(), at, "and lent again");
    drop((q, r));
}

#[test]
fn work_on_memory_another_stream_used_waits_for_that_work() {
    // `s` writes 1 behind its host function; `t` writes 2 after it, with no event between them
    // but the one gpumem records: `t` must wait for `s`, or the late 1 would win.
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let (s, gate) = held_stream();
    let t = Stream::<Host>::non_blocking().unwrap();
    let p = pool.malloc(4096).unwrap();
    p.memset_async(1, 4096, Some(&s)).unwrap();
    p.memset_async(2, 4096, Some(&t)).unwrap();
    gate.wait();
    s.synchronize().unwrap();
    t.synchronize().unwrap();
    let mut back = [0u8; 4096];
    p.copy_to_host(&mut back, 4096).unwrap();
    assert!(back.iter().all(|&b| b == 2), "the second memset ran last");
    // The chunk's own stream waits too (an owned stream: on the host backend a wait of the
    // legacy stream blocks the calling thread, which would wait for the gate itself).
    let own = Stream::<Host>::non_blocking().unwrap();
    let q = {
        let _current = own.enter().unwrap();
        pool.malloc(4096).unwrap()
    };
    let (s, gate) = held_stream();
    q.memset_async(4, 4096, Some(&s)).unwrap();
    q.memset_async(5, 4096, Some(&own)).unwrap();
    gate.wait();
    s.synchronize().unwrap();
    own.synchronize().unwrap();
    q.copy_to_host(&mut back, 4096).unwrap();
    assert!(back.iter().all(|&b| b == 5), "the own stream's memset ran last");
}

#[test]
fn a_synchronous_read_waits_for_another_streams_work_on_the_memory() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let (s, gate) = held_stream();
    let p = pool.malloc(4096).unwrap();
    p.memset_async(7, 4096, Some(&s)).unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        gate.wait();
    });
    let mut back = [0u8; 4096];
    let read = p.copy_to_host(&mut back, 4096);
    opener.join().unwrap();
    read.unwrap();
    assert!(back.iter().all(|&b| b == 7), "read after the memset");
}

#[test]
fn pointers_shared_from_many_threads_at_once_share_one_object() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc(512).unwrap();
    let clones: Vec<MemoryPointer<Host>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                scope.spawn({
                    let p = &p;
                    move || (p + i).clone()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for c in &clones {
        assert!(Arc::ptr_eq(c.mem(), p.mem()));
    }
    drop(p);
    assert_eq!(pool.used_bytes(), 512);
    drop(clones);
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn a_pool_on_another_allocator_gives_shared_pointers() {
    let (pool, _raw) = mock_pool();
    let p = pool.malloc(512).unwrap();
    assert!(!p.is_inline());
    drop(p);
    assert_eq!(pool.used_bytes(), 0);
}

/// The tests that map the host's device 1 virtual memory, one at a time (one counts it all).
fn device_1_vmm() -> parking_lot::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
}

#[test]
#[cfg_attr(miri, ignore = "maps host memory through the host backend's virtual memory")]
fn expandable_segments_lend_memory_that_works_across_growths_and_give_it_all_back() {
    // Device 1, so that no other test's physical allocations on the host's device 0 count here.
    let _one_at_a_time = device_1_vmm();
    let pool = SingleDeviceMemoryPool::<Host>::with_expandable_segments(1).unwrap();
    assert!(pool.pool().expandable_segments());
    crate::Device::<Host>::new(1).use_device().unwrap();
    let a = pool.malloc(3 << 20).unwrap();
    let b = pool.malloc(5 << 20).unwrap();
    assert_eq!(b.ptr(), a.ptr() + (3 << 20), "the block grew in place");
    assert_eq!(pool.stats().all.segments.allocated, 1);
    // `b` spans the end of the first mapping and the growth after it: every byte reads back.
    let data: Vec<u8> = (0..5usize << 20).map(|i| (i % 251) as u8).collect();
    b.copy_from_host(&data, data.len()).unwrap();
    let mut back = vec![0u8; data.len()];
    b.copy_to_host(&mut back, data.len()).unwrap();
    assert!(back == data, "the bytes came back");
    assert!(crate::host::vmm_physical_bytes_made_here(1) >= 8 << 20);
    drop((a, b));
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(crate::host::vmm_physical_bytes_made_here(1), 0, "every physical allocation went back");
}

#[test]
#[cfg_attr(miri, ignore = "maps host memory through the host backend's virtual memory")]
fn a_peer_copy_gives_the_peer_access_to_expandable_segments_mapped_before_and_after() {
    // Device 1's memory, copied to device 0: device 0 must reach device 1's mappings.
    let _one_at_a_time = device_1_vmm();
    let pool = SingleDeviceMemoryPool::<Host>::with_expandable_segments(1).unwrap();
    crate::Device::<Host>::new(1).use_device().unwrap();
    let before = pool.malloc(3 << 20).unwrap();
    assert_eq!(crate::host::vmm_access_of(before.ptr()), Some(vec![1]), "the owner only");
    crate::Device::<Host>::new(0).use_device().unwrap();
    let dst = MemoryPointer::from_memory(Memory::<Host>::new_on(0, 4096).unwrap());
    dst.copy_from_device(&before, 4096).unwrap();
    assert_eq!(
        crate::host::vmm_access_of(before.ptr()),
        Some(vec![1, 0]),
        "granted to the mapping made before"
    );
    crate::Device::<Host>::new(1).use_device().unwrap();
    let after = pool.malloc(8 << 20).unwrap();
    assert!(after.ptr() > before.ptr(), "a growth of the same block");
    assert_eq!(
        crate::host::vmm_access_of(after.ptr() + (6 << 20)),
        Some(vec![1, 0]),
        "and to the growth after"
    );
    // A second copy grants nothing new.
    dst.copy_from_device(&before, 4096).unwrap();
    // A pool made later for device 1 starts with the access granted.
    let later = SingleDeviceMemoryPool::<Host>::with_expandable_segments(1).unwrap();
    let chunk = later.malloc(1 << 20).unwrap();
    assert_eq!(crate::host::vmm_access_of(chunk.ptr()), Some(vec![1, 0]), "a later pool's mapping");
    drop(chunk);
    later.free_all_blocks(None);
    crate::Device::<Host>::new(0).use_device().unwrap();
}

/// `step()` on the device pool plans the loop as the pool's own does: after the first iterations
/// the loop is served from the plan, with no new raw block, and every byte comes back.
#[test]
fn a_device_pools_step_plans_its_loop() {
    let (pool, mock) = mock_pool();
    let iteration = || {
        let a = pool.malloc(4 * U).unwrap();
        let b = pool.malloc(8 * U).unwrap();
        drop(a);
        let c = pool.malloc(2 * U).unwrap();
        drop((b, c));
        pool.step().unwrap();
    };
    for _ in 0..5 {
        iteration();
    }
    assert_eq!(pool.pool().plan_stats().state, crate::pool::PlanState::Planned);
    let held = mock.live_bytes();
    let served = pool.pool().plan_stats().served;
    for _ in 0..10 {
        iteration();
    }
    assert_eq!(mock.live_bytes(), held, "no raw block after the plan");
    assert_eq!(pool.pool().plan_stats().served, served + 30, "every allocation from the plan");
    pool.reset_planning();
    pool.free_all_blocks(None);
    assert_eq!(mock.live_bytes(), 0, "every byte came back");
}
