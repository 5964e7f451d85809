//! The pool alone, on a mock raw allocator: no backend, no stream, no memory type.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::hal::types::DevicePtr;
use crate::hooks::AllocEvent;

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

/// A fence that completes when its flag is set (or when waited for).
pub(super) struct Flag(pub(super) Arc<AtomicBool>);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn wait(&self) {
        self.0.store(true, Ordering::Release);
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
    let (pool, _mock, cache) = pool();
    pool.set_limit(2 * UNIT);
    let a = pool.malloc(2 * UNIT, ArenaKey::NULL, &cache).unwrap();
    a.free_after(Box::new(Flag(Arc::new(AtomicBool::new(false))))).unwrap();
    let b = pool.malloc(2 * UNIT, ArenaKey::stream(3), &cache).unwrap();
    assert_eq!(b.size(), 2 * UNIT);
    assert_eq!(pool.total_bytes(), 2 * UNIT);
}

#[test]
fn overflowing_requests_are_errors_of_the_right_kind() {
    let (pool, _mock, cache) = pool();
    let _a = pool.malloc(2048, ArenaKey::NULL, &cache).unwrap();
    // No allocation can be this large: a bad argument, not an out-of-memory to retry.
    let err = pool.malloc(usize::MAX - 1024, ArenaKey::NULL, &cache).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "unlimited pool: {err:?}");
    pool.set_growth_policy(GrowthPolicy::HoldPeakInUse);
    let err = pool.malloc(usize::MAX - 1024, ArenaKey::NULL, &cache).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
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

/// A hook that logs its events into a shared log and, on its first `malloc_postprocess`, runs
/// `then` (once): what a callback does to the hook list mid-dispatch.
struct Scripted {
    name: &'static str,
    log: Rc<RefCell<Vec<String>>>,
    then: RefCell<Option<Box<dyn FnOnce()>>>,
}

impl Scripted {
    fn new(name: &'static str, log: &Rc<RefCell<Vec<String>>>, then: Option<Box<dyn FnOnce()>>) -> Self {
        Scripted { name, log: Rc::clone(log), then: RefCell::new(then) }
    }
}

impl hooks::MemoryHook for Scripted {
    fn name(&self) -> &str {
        self.name
    }
    fn malloc_postprocess(&self, _: &MallocEvent) -> hooks::HookResult {
        self.log.borrow_mut().push(format!("{} malloc", self.name));
        let then = self.then.borrow_mut().take();
        if let Some(then) = then {
            then();
        }
        Ok(())
    }
    fn free_postprocess(&self, _: &hooks::FreeEvent) -> hooks::HookResult {
        self.log.borrow_mut().push(format!("{} free", self.name));
        Ok(())
    }
}

type Guards = Rc<RefCell<Vec<hooks::HookGuard<Scripted>>>>;

#[test]
fn a_hook_removed_by_a_callback_is_still_called_by_that_dispatch_and_then_dropped() {
    // `first` removes `second` (dropping its guard) from inside the dispatch that is about to
    // call `second`: the dispatch goes on with the list it began with, so `second` is called
    // once more, and its memory must outlive that call (Miri checks it does).
    let (pool, _mock, cache) = pool();
    let log = Rc::new(RefCell::new(Vec::new()));
    let guards: Guards = Rc::default();
    let g = Rc::clone(&guards);
    let first = hooks::install(Scripted::new("first", &log, Some(Box::new(move || g.borrow_mut().clear()))));
    let first = first.unwrap();
    guards.borrow_mut().push(hooks::install(Scripted::new("second", &log, None)).unwrap());
    let weak = Rc::downgrade(&log);
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    assert_eq!(*log.borrow(), ["first malloc", "second malloc", "first free"]);
    assert_eq!(hooks::installed(), ["first"]);
    // `second` and its log handle are gone now that no dispatch runs.
    assert_eq!(Rc::strong_count(&log), 2, "the test's and first's handles only");
    drop(first);
    assert!(hooks::installed().is_empty());
    assert_eq!(weak.strong_count(), 1);
}

#[test]
fn a_hook_installed_by_a_callback_is_called_from_the_next_event_on() {
    let (pool, _mock, cache) = pool();
    let log = Rc::new(RefCell::new(Vec::new()));
    let guards: Guards = Rc::default();
    let (g, l) = (Rc::clone(&guards), Rc::clone(&log));
    let install_late = move || g.borrow_mut().push(hooks::install(Scripted::new("late", &l, None)).unwrap());
    let _first = hooks::install(Scripted::new("first", &log, Some(Box::new(install_late)))).unwrap();
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    assert_eq!(*log.borrow(), ["first malloc", "first free", "late free"]);
    guards.borrow_mut().clear();
    assert_eq!(hooks::installed(), ["first"]);
}

#[test]
fn a_callback_that_allocates_and_removes_hooks_in_the_nested_dispatch() {
    // `outer` allocates from its callback (a dispatch inside a dispatch); the nested
    // malloc_postprocess of `inner` removes every hook. Both dispatches finish on their own
    // lists, and the lists replaced meanwhile are dropped when the outer one ends.
    let (pool, _mock, cache) = pool();
    let pool = Rc::new(pool);
    let cache = Rc::new(cache);
    let log = Rc::new(RefCell::new(Vec::new()));
    let guards: Guards = Rc::default();
    let g = Rc::clone(&guards);
    let inner_then: Box<dyn FnOnce()> = Box::new(move || g.borrow_mut().clear());
    let (p, c) = (Rc::clone(&pool), Rc::clone(&cache));
    let outer_then: Box<dyn FnOnce()> =
        Box::new(move || drop(p.malloc(2 * UNIT, ArenaKey::NULL, &c).unwrap()));
    guards.borrow_mut().push(hooks::install(Scripted::new("outer", &log, Some(outer_then))).unwrap());
    guards.borrow_mut().push(hooks::install(Scripted::new("inner", &log, Some(inner_then))).unwrap());
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    // outer's callback allocates: the nested malloc reaches outer (its `then` already taken) and
    // inner, which removes both; the nested free sees none; the outer dispatch still calls inner.
    assert_eq!(*log.borrow(), ["outer malloc", "outer malloc", "inner malloc", "inner malloc"]);
    assert!(hooks::installed().is_empty());
    assert!(guards.borrow().is_empty());
    assert_eq!(Rc::strong_count(&log), 1, "every hook was dropped");
    // No hook is left, and the pool still works.
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    assert_eq!(log.borrow().len(), 4);
}

#[test]
fn a_hook_that_panics_mid_dispatch_leaves_dispatch_working() {
    struct Panics;
    impl hooks::MemoryHook for Panics {
        fn name(&self) -> &str {
            "Panics"
        }
        fn malloc_postprocess(&self, _: &MallocEvent) -> hooks::HookResult {
            panic!("hook panics");
        }
    }
    let (pool, _mock, cache) = pool();
    let log = Rc::new(RefCell::new(Vec::new()));
    let guards: Guards = Rc::default();
    let g = Rc::clone(&guards);
    // `first` removes `second` and then `Panics` panics, inside one dispatch.
    let _first = hooks::install(Scripted::new("first", &log, Some(Box::new(move || g.borrow_mut().clear()))));
    guards.borrow_mut().push(hooks::install(Scripted::new("second", &log, None)).unwrap());
    let panics = hooks::install(Panics).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = pool.malloc(UNIT, ArenaKey::NULL, &cache);
    }));
    assert!(caught.is_err());
    assert_eq!(Rc::strong_count(&log), 2, "second was dropped once the dispatch unwound");
    drop(panics);
    log.borrow_mut().clear();
    drop(pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap());
    assert_eq!(*log.borrow(), ["first malloc", "first free"]);
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

/// Replays `steps` through `pool` (arena `ArenaKey::stream(n)` for the trace's stream `n`), with
/// what is live in `live`; calls `check` after each allocation.
fn replay_into<R: RawAllocator>(
    pool: &Pool<R>,
    cache: &ArenaCache,
    steps: &[trace::Step],
    live: &mut HashMap<u64, PooledMemory<R>>,
    mut check: impl FnMut(&PooledMemory<R>, &HashMap<u64, PooledMemory<R>>),
) {
    for step in steps {
        match *step {
            trace::Step::Alloc { id, size, stream } => {
                let p = pool.malloc(size, ArenaKey::stream(stream), cache).unwrap();
                check(&p, live);
                live.insert(id, p);
            }
            trace::Step::Free { id } => drop(live.remove(&id)),
        }
    }
}

fn raw_calls(counts: &trace::Counts) -> (usize, usize) {
    (counts.allocs.load(Ordering::Relaxed), counts.frees.load(Ordering::Relaxed))
}

/// One step of the synthetic training loop, its parameters and optimizer state already made:
/// every allocation of the step is freed by its end.
fn one_training_step() -> Vec<trace::Step> {
    let two = trace::training(12, 768, 4096, 2);
    let first = trace::training(12, 768, 4096, 1).len();
    two[first..].to_vec()
}

fn counted_pool(
    policy: GrowthPolicy,
) -> (Pool<trace::CountingAllocator>, trace::CountingAllocator, ArenaCache) {
    let allocator = trace::CountingAllocator::default();
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(policy);
    (pool, allocator, ArenaCache::new())
}

/// A `Segments` pool with expandable segments on a counting allocator of 2 MiB granules.
fn expandable_segments_pool() -> (Pool<trace::CountingAllocator>, trace::CountingAllocator, ArenaCache) {
    let allocator = trace::CountingAllocator::expandable(2 << 20);
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    (pool, allocator, ArenaCache::new())
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn segments_make_no_raw_call_after_the_first_of_ten_repeated_steps() {
    let step = one_training_step();
    for streams in [1, 4] {
        // The same step spread over `streams` streams (allocation i on stream i % streams).
        let step: Vec<trace::Step> = step
            .iter()
            .map(|s| match *s {
                trace::Step::Alloc { id, size, .. } => {
                    trace::Step::Alloc { id, size, stream: (id % streams as u64) as usize }
                }
                free => free,
            })
            .collect();
        let (pool, allocator, cache) = counted_pool(GrowthPolicy::Segments);
        let mut live = HashMap::new();
        replay_into(&pool, &cache, &step, &mut live, |_, _| {});
        assert!(live.is_empty(), "the step frees all it allocates");
        let after_first = raw_calls(allocator.counts());
        assert!(after_first.0 > 0);
        for rep in 1..10 {
            replay_into(&pool, &cache, &step, &mut live, |_, _| {});
            assert_eq!(raw_calls(allocator.counts()), after_first, "{streams} stream(s), repetition {rep}");
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn hold_peak_in_use_keeps_calling_the_raw_allocator_every_step() {
    // The policy Segments replaces for loops: every repetition frees and allocates raw blocks.
    let step = one_training_step();
    let (pool, allocator, cache) = counted_pool(GrowthPolicy::HoldPeakInUse);
    let mut live = HashMap::new();
    let mut calls = vec![raw_calls(allocator.counts())];
    for _ in 0..3 {
        replay_into(&pool, &cache, &step, &mut live, |_, _| {});
        calls.push(raw_calls(allocator.counts()));
    }
    assert!(calls.windows(2).skip(1).all(|w| w[1].0 > w[0].0 && w[1].1 > w[0].1), "{calls:?}");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn an_adam_loop_settles_once_its_optimizer_state_exists() {
    // Step 1 makes the optimizer's state, so step 2 uses more than step 1 did: its growth is
    // forced. From step 3 on, nothing.
    let lens: Vec<usize> = (0..=10).map(|n| trace::training(12, 768, 4096, n).len()).collect();
    let steps = trace::training(12, 768, 4096, 10);
    let (pool, allocator, cache) = counted_pool(GrowthPolicy::Segments);
    let mut live = HashMap::new();
    let mut calls = Vec::new();
    for w in lens.windows(2) {
        replay_into(&pool, &cache, &steps[w[0]..w[1]], &mut live, |_, _| {});
        calls.push(raw_calls(allocator.counts()));
    }
    assert!(calls[2..].iter().all(|c| *c == calls[1]), "raw calls after each step: {calls:?}");
    let held = allocator.counts().peak.load(Ordering::Relaxed);
    let ratio = held as f64 / trace::peak_in_use(&steps) as f64;
    assert!(ratio < 1.05, "held / in use {ratio}");
    let (cupy, _, _) = {
        let (pool, allocator, cache) = counted_pool(GrowthPolicy::CacheUntilOutOfMemory);
        replay_into(&pool, &cache, &steps, &mut HashMap::new(), |_, _| {});
        (raw_calls(allocator.counts()), 0, 0)
    };
    assert!(calls[9].0 < cupy.0, "fewer raw allocations than CuPy's rule: {} vs {}", calls[9].0, cupy.0);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn segments_lend_disjoint_chunks_inside_live_blocks_and_every_byte_comes_back() {
    let (pool, mock, cache) = pool();
    pool.set_growth_policy(GrowthPolicy::Segments);
    let steps = trace::random(11, 6000, 0.52, 256.0 * 1024.0, 2.0, 64 << 20, 4);
    let mut live = HashMap::new();
    let mut lent = 0usize;
    replay_into(&pool, &cache, &steps, &mut live, |p, live| {
        let (start, end) = (p.ptr(), p.ptr() + p.size());
        let blocks = mock.live.lock().unwrap();
        let (&base, &len) = blocks.range(..=start).next_back().expect("inside a raw block");
        assert!(end <= base + len, "chunk {start:#x}..{end:#x} outside its block {base:#x}+{len}");
        for other in live.values() {
            assert!(end <= other.ptr() || other.ptr() + other.size() <= start, "overlapping chunks");
        }
        lent += 1;
    });
    assert!(lent > 3000);
    let in_use: usize = live.values().map(PooledMemory::size).sum();
    assert_eq!(pool.used_bytes(), in_use);
    drop(live);
    assert_eq!(pool.used_bytes(), 0);
    let free: usize =
        [0, 1, 2, 3].iter().flat_map(|&s| pool.free_chunks(ArenaKey::stream(s))).map(|c| c.1).sum();
    assert_eq!(free, pool.total_bytes(), "every byte held is free again");
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert!(mock.live.lock().unwrap().is_empty(), "every raw block went back");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn segments_round_blocks_by_class_and_keep_small_requests_off_large_blocks() {
    let (pool, mock, cache) = pool();
    pool.set_growth_policy(GrowthPolicy::Segments);
    let small = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 2 << 20, "a small miss takes a 2 MiB block");
    let second = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(second.ptr(), small.ptr() + 4096, "and the next small request its next chunk");
    let mid = pool.malloc(3 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 22 << 20, "a mid-sized miss takes a 20 MiB block");
    let large = pool.malloc((30 << 20) + 1, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 54 << 20, "a large one is rounded up to 2 MiB");
    drop(large);
    // 2 MiB less two chunks is free in the small block: a third small request fits there, and
    // one that does not fit takes a new small block, never the free 32 MiB one.
    let big_small = pool.malloc(1 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 54 << 20);
    let another = pool.malloc(1 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 56 << 20, "the free large block is not cut for a small request");
    assert_eq!(mock.calls.load(Ordering::Relaxed), 4);
    drop((small, second, mid, big_small, another));
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn a_large_miss_fuses_the_arenas_whole_free_large_blocks() {
    let (pool, mock, cache) = pool();
    pool.set_growth_policy(GrowthPolicy::Segments);
    let a = pool.malloc(12 << 20, ArenaKey::NULL, &cache).unwrap();
    let b = pool.malloc(12 << 20, ArenaKey::NULL, &cache).unwrap();
    let other = pool.malloc(12 << 20, ArenaKey::stream(5), &cache).unwrap();
    drop((a, b, other));
    assert_eq!(pool.total_bytes(), 36 << 20);
    // 20 MiB fits in neither free 12 MiB block of the null stream's arena: both go back and one
    // block of 24 MiB (as large as both) comes instead; the other arena's block stays.
    let c = pool.malloc(20 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 36 << 20, "held memory did not grow");
    assert_eq!(mock.live.lock().unwrap().len(), 2);
    assert_eq!(mock.calls.load(Ordering::Relaxed), 4);
    // Its free tail serves the next request without a raw call.
    let d = pool.malloc(4 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(d.ptr(), c.ptr() + (20 << 20));
    assert_eq!(mock.calls.load(Ordering::Relaxed), 4);
}

#[test]
fn a_rounded_block_over_the_limit_falls_back_to_the_request() {
    let (pool, _mock, cache) = pool();
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_limit((11 << 20) + (1 << 19));
    let a = pool.malloc(11 << 20, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 11 << 20, "the 12 MiB rounding did not fit beside the limit");
    drop(a);
    let err = pool.malloc(12 << 20, ArenaKey::NULL, &cache).unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err:?}");
}

#[test]
#[allow(unsafe_code)] // reads and writes the grown memory through the host backend
fn expandable_segments_grow_the_newest_block_in_place_and_unmap_free_tails() {
    use crate::hal::MemoryOps;
    use crate::host::Host;
    const MIB: usize = 1 << 20;
    let allocator = expandable::ExpandableAllocator::<Host>::new(0, 64 * MIB).unwrap();
    assert_eq!(allocator.granule(), 2 * MIB);
    let pool = Pool::new(0, allocator);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let a = pool.malloc(3 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 4 * MIB, "whole granules");
    let b = pool.malloc(3 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(b.ptr(), a.ptr() + 3 * MIB, "the free tail and the new granule are one chunk");
    assert_eq!(pool.total_bytes(), 6 * MIB, "grown by what the tail lacked");
    let c = pool.malloc(10 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(c.ptr(), b.ptr() + 3 * MIB);
    assert_eq!(pool.total_bytes(), 16 * MIB);
    // The grown memory is mapped and usable from one end to the other.
    // SAFETY: `a.ptr()..c.ptr() + 10 MiB` is mapped (16 MiB from `a.ptr()`), and nothing else
    // uses it.
    unsafe { Host::memset(0, a.ptr(), 5, 16 * MIB).unwrap() };
    let mut last = [0u8; 4];
    // SAFETY: as above; `last` is 4 writable bytes.
    unsafe { Host::memcpy(0, last.as_mut_ptr() as usize, c.ptr() + 10 * MIB - 4, 4).unwrap() };
    assert_eq!(last, [5; 4]);
    drop(c);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 6 * MIB, "the free tail's whole granules were unmapped");
    let d = pool.malloc(MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(d.ptr(), b.ptr() + 3 * MIB, "the kept part of the tail is lent again");
    drop((a, b, d));
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(crate::host::vmm_physical_bytes_made_here(0), 0, "every granule was released");
}

#[test]
fn a_growth_costs_three_driver_calls_whatever_its_size_and_a_tail_gives_back_whole_growths() {
    use crate::host::{vmm_calls_on_this_thread as calls, Host};
    const MIB: usize = 1 << 20;
    let since = |before: [usize; 4]| {
        let now = calls();
        [now[0] - before[0], now[1] - before[1], now[2] - before[2], now[3] - before[3]]
    };
    let allocator = expandable::ExpandableAllocator::<Host>::new(0, 1 << 30).unwrap();
    let pool = Pool::new(0, allocator);
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let start = calls();
    // A large request's first block: the mid-sized class's 20 MiB, one mapping.
    let a = pool.malloc(2 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(since(start), [1, 1, 1, 0], "create, map, set access");
    assert_eq!(pool.total_bytes(), 20 * MIB);
    // 19 MiB lack 1 MiB of the free tail: the block grows by 20 MiB, one mapping again.
    let before = calls();
    let b = pool.malloc(19 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(b.ptr(), a.ptr() + 2 * MIB, "grown in place");
    assert_eq!(since(before), [1, 1, 1, 0]);
    assert_eq!(pool.total_bytes(), 40 * MIB);
    // 300 MiB more (150 granules) in one growth: still three calls, not two per granule.
    let before = calls();
    let c = pool.malloc(319 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(c.ptr(), b.ptr() + 19 * MIB);
    assert_eq!(since(before), [1, 1, 1, 0]);
    assert_eq!(pool.total_bytes(), 340 * MIB);
    // The free tail after `b` (21..340 MiB) covers the last growth only: it goes, in one unmap;
    // the growth of 20..40 MiB is partly lent and stays.
    drop(c);
    let before = calls();
    pool.free_all_blocks(None);
    assert_eq!(since(before), [0, 0, 0, 1]);
    assert_eq!(pool.total_bytes(), 40 * MIB, "whole growths only");
    drop(b);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 20 * MIB, "the tail now covers the second growth");
    drop(a);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(since(start), [3, 3, 3, 3], "every mapping made was unmapped once");
    assert_eq!(crate::host::vmm_physical_bytes_made_here(0), 0, "every physical allocation was released");
}

/// An expandable allocator that counts the shrinks it is asked for: on a device each one first
/// waits for the work queued there (the C ABI's and the typed layer's raw allocators do).
#[derive(Clone)]
struct ShrinksCounted(Arc<expandable::ExpandableAllocator<crate::host::Host>>, Arc<AtomicUsize>);

impl RawAllocator for ShrinksCounted {
    type Block = expandable::Segment<crate::host::Host>;
    fn allocate(&self, device: DeviceId, size: usize) -> Result<Self::Block> {
        self.0.allocate(device, size)
    }
    fn expandable(&self) -> bool {
        true
    }
    fn granule(&self) -> usize {
        self.0.granule()
    }
    fn grow(&self, block: &mut Self::Block, extra: usize) -> Result<bool> {
        self.0.grow(block, extra)
    }
    fn shrink(&self, block: &mut Self::Block, bytes: usize) -> Result<usize> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.shrink(block, bytes)
    }
    fn shrinkable(&self, block: &Self::Block, bytes: usize) -> usize {
        self.0.shrinkable(block, bytes)
    }
}

#[test]
fn a_free_tail_inside_one_growth_is_not_asked_of_the_allocator() {
    const MIB: usize = 1 << 20;
    let shrinks = Arc::new(AtomicUsize::new(0));
    let allocator = expandable::ExpandableAllocator::<crate::host::Host>::new(0, 1 << 30).unwrap();
    let pool = Pool::new(0, ShrinksCounted(Arc::new(allocator), Arc::clone(&shrinks)));
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    // One block of two growths (20 MiB each, one mapping each).
    let a = pool.malloc(2 * MIB, ArenaKey::NULL, &cache).unwrap();
    let b = pool.malloc(19 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(pool.total_bytes(), 40 * MIB);
    drop(b);
    // The free tail (2..40 MiB) covers the second growth whole: one shrink, which gives it back.
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 20 * MIB);
    assert_eq!(shrinks.load(Ordering::Relaxed), 1);
    // What is left of the tail (2..20 MiB) lies inside the first growth: no shrink could give
    // any of it back, so none is asked for, however often the pool looks.
    for _ in 0..3 {
        pool.free_all_blocks(None);
    }
    assert_eq!(shrinks.load(Ordering::Relaxed), 1, "no shrink that would give back nothing");
    assert_eq!(pool.total_bytes(), 20 * MIB);
    drop(a);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn with_expandable_segments_small_and_large_requests_share_one_growing_block() {
    const MIB: usize = 1 << 20;
    let allocator = trace::CountingAllocator::expandable(2 * MIB);
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let first = pool.malloc(12 * MIB, ArenaKey::NULL, &cache).unwrap();
    let small = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(small.ptr(), first.ptr() + 12 * MIB, "the block grew by a granule");
    let second = pool.malloc(12 * MIB, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(second.ptr(), small.ptr() + 4096, "and then by at least 20 MiB");
    let small_again = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(small_again.ptr(), second.ptr() + 12 * MIB, "from the free tail, nothing else fits");
    // The first block, two growths.
    assert_eq!(raw_calls(allocator.counts()), (3, 0));
    assert_eq!(pool.total_bytes(), (12 + 2 + 20) * MIB);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn segments_with_expandable_segments_make_no_raw_call_after_the_first_of_ten_repeated_steps() {
    let step = one_training_step();
    let (pool, allocator, cache) = expandable_segments_pool();
    let mut live = HashMap::new();
    let mut after = Vec::new();
    for _ in 0..10 {
        replay_into(&pool, &cache, &step, &mut live, |p, live| {
            let (start, end) = (p.ptr(), p.ptr() + p.size());
            for other in live.values() {
                assert!(end <= other.ptr() || other.ptr() + other.size() <= start, "overlapping chunks");
            }
        });
        assert!(live.is_empty(), "a step frees what it allocates");
        after.push(raw_calls(allocator.counts()));
    }
    assert!(after[0].0 > 0);
    assert!(after.iter().all(|c| *c == after[0]), "raw calls after each step: {after:?}");
    assert_eq!(pool.used_bytes(), 0);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte went back");
}

#[test]
fn expandable_segments_need_an_allocator_that_grows() {
    let (pool, _mock, _cache) = pool();
    let err = pool.set_expandable_segments(true).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(!pool.expandable_segments());
    pool.set_expandable_segments(false).unwrap();
}

#[test]
fn the_expandable_segments_and_stitching_variables_are_read_strictly() {
    // The only test that sets these variables.
    for (value, expected) in
        [("1", Some(true)), ("true", Some(true)), ("0", Some(false)), ("false", Some(false))]
    {
        std::env::set_var(EXPANDABLE_SEGMENTS_ENV, value);
        assert_eq!(expandable_segments_from_env().unwrap(), expected, "{value}");
    }
    std::env::set_var(EXPANDABLE_SEGMENTS_ENV, "maybe");
    let err = expandable_segments_from_env().unwrap_err();
    assert!(matches!(err, Error::InvalidEnvironment { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "GPUMEM_EXPANDABLE_SEGMENTS=\"maybe\" is not valid: 1, true, yes or on; 0, false, no or off (in any case)"
    );
    std::env::remove_var(EXPANDABLE_SEGMENTS_ENV);
    assert_eq!(expandable_segments_from_env().unwrap(), None);
    // Stitching, read here too (the two are read together): on with growing blocks left to
    // their default, and an error beside fixed blocks, which have no pages to move.
    std::env::set_var(STITCH_ENV, "1");
    assert_eq!(stitch_from_env().unwrap(), Some(true));
    std::env::set_var(EXPANDABLE_SEGMENTS_ENV, "0");
    let err = stitch_from_env().unwrap_err();
    assert!(
        err.to_string().starts_with("GPUMEM_STITCH=\"1 with GPUMEM_EXPANDABLE_SEGMENTS=0\" is not valid"),
        "{err}"
    );
    std::env::remove_var(EXPANDABLE_SEGMENTS_ENV);
    std::env::set_var(STITCH_ENV, "sometimes");
    assert!(matches!(stitch_from_env().unwrap_err(), Error::InvalidEnvironment { .. }));
    std::env::remove_var(STITCH_ENV);
    assert_eq!(stitch_from_env().unwrap(), None);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn expandable_segments_settle_on_a_training_loop_and_hold_less() {
    let lens: Vec<usize> =
        std::iter::once(0).chain((0..=10).map(|n| trace::training(12, 768, 4096, n).len())).collect();
    let steps = trace::training(12, 768, 4096, 10);
    for policy in [GrowthPolicy::CacheUntilOutOfMemory, GrowthPolicy::Segments] {
        let allocator = trace::CountingAllocator::expandable(2 << 20);
        let pool = Pool::new(0, allocator.clone());
        pool.set_growth_policy(policy);
        pool.set_expandable_segments(true).unwrap();
        let cache = ArenaCache::new();
        let mut live = HashMap::new();
        let mut calls = Vec::new();
        for w in lens.windows(2) {
            replay_into(&pool, &cache, &steps[w[0]..w[1]], &mut live, |_, _| {});
            calls.push(raw_calls(allocator.counts()));
        }
        // Setup, step 1, step 2 (the optimizer state's first full step), then nothing.
        assert!(calls[3..].iter().all(|c| *c == calls[2]), "{policy:?}: {calls:?}");
        let with = allocator.counts().peak.load(Ordering::Relaxed);
        let without = trace::replay(&steps, policy).unwrap().peak_held;
        assert!(with < without, "{policy:?}: held {with} with expandable segments, {without} without");
    }
}

/// Three steps of training loops recorded on the GPU (`bench/record_training_trace.py`), with the
/// index where the third step begins.
fn recorded_training_traces() -> [(&'static str, Vec<trace::Step>, usize); 2] {
    let read = |name, text: &str| (name, trace::parse(text).unwrap(), trace::step_marks(text)[2]);
    [
        read("GPT-2", include_str!("../../tests/fixtures/gpt2-training.trace")),
        read("BERT", include_str!("../../tests/fixtures/bert-finetuning.trace")),
    ]
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn recorded_training_steps_hold_within_three_percent_and_settle_with_expandable_segments() {
    for (name, steps, third) in recorded_training_traces() {
        let r = trace::replay_from(&steps, GrowthPolicy::Segments, true, third).unwrap();
        assert!(r.ratio() <= 1.03, "{name}: held / in use {:.4}", r.ratio());
        assert_eq!(r.raw_calls_from(0), Some(0), "{name}: raw calls from the third step on");
        assert_eq!(r.raw_frees, 0, "{name}");
        // Without expandable segments the same rules hold more: the growing tail is what the
        // rule keeps whole.
        let plain = trace::replay(&steps, GrowthPolicy::Segments).unwrap();
        assert!(r.peak_held < plain.peak_held, "{name}: {} against {}", r.peak_held, plain.peak_held);
    }
}

#[test]
fn arenas_made_one_after_the_other_share_no_cache_line() {
    // Threads on different streams write their arenas on every allocation and free; arenas made
    // on one thread (streams made up front) must not lie in one line or one prefetched pair.
    let (pool, _, cache) = pool();
    let arenas: Vec<Arc<Arena<Mock>>> = (1..=8).map(|n| pool.arena(ArenaKey::stream(n), &cache)).collect();
    for a in &arenas {
        let start = Arc::as_ptr(a) as usize;
        assert_eq!(start % 128, 0, "an arena starts a pair of lines");
        assert_eq!(std::mem::size_of::<Arena<Mock>>() % 128, 0, "and ends one");
        let st = a.state.lock();
        let (chunks, vacant) = st.spare_room();
        assert!(chunks >= index::MIN_SLOTS && vacant >= 4 * index::MIN_SLOTS, "its buffers have room");
    }
}

#[test]
#[cfg_attr(miri, ignore = "2,000 misses through the policy: minutes under Miri, and no unsafe code")]
fn a_growing_block_grows_in_steps_that_keep_pace_with_it() {
    // 2,000 tensors of 30 MiB, none freed (a large model's weights and optimizer state, say):
    // 59 GiB, on the counting allocator (nothing is really mapped).
    const N: usize = 2000;
    const SIZE: usize = 30 << 20;
    let steps: Vec<trace::Step> =
        (0..N as u64).map(|id| trace::Step::Alloc { id, size: SIZE, stream: 0 }).collect();
    let r = trace::replay_expandable(&steps, GrowthPolicy::Segments).unwrap();
    // Growth by 20 MiB steps alone would grow once per tensor; by 1/256 of the block, the growths
    // past 7.5 GiB are geometric (776 growths).
    assert!(r.raw_allocs < N / 2, "{} growths for {N} tensors", r.raw_allocs);
    // What is held beyond the tensors is at most the last growth's excess: under one step.
    let last_step = (r.peak_held / policy::GROWTH_FRACTION).max(policy::MID_BLOCK);
    assert!(r.peak_held - r.peak_in_use < last_step, "held {} for {} in use", r.peak_held, r.peak_in_use);
    assert_eq!(r.raw_frees, 0);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn the_random_trace_on_one_stream_holds_within_six_percent_with_expandable_segments() {
    let steps = trace::on_one_stream(&trace::standard_random());
    let r = trace::replay_expandable(&steps, GrowthPolicy::Segments).unwrap();
    assert!(r.ratio() < 1.06, "held / in use {:.4}", r.ratio());
    assert_eq!(r.raw_frees, 0);
    let cupy = trace::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory).unwrap();
    assert!(r.peak_held < cupy.peak_held, "less than CuPy's rule holds");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn over_the_other_seeds_expandable_segments_hold_less_than_cupys_rule_and_free_nothing() {
    // The standard seed's 1.055 is one draw: on the other seeds the same policy holds 1.12-1.23,
    // and on one of them (seed 7) CuPy's rule, a block per request size, happens to hold less.
    // What holds over the seeds is the comparison in sum, and that a growing block is never
    // given back mid-trace.
    assert_eq!(trace::random_seeded(trace::STANDARD_SEED), trace::standard_random());
    let (mut ours, mut cupys, mut worst) = (0, 0, 0.0f64);
    for seed in trace::OTHER_SEEDS {
        let steps = trace::on_one_stream(&trace::random_seeded(seed));
        let r = trace::replay_expandable(&steps, GrowthPolicy::Segments).unwrap();
        let cupy = trace::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory).unwrap();
        assert_eq!(r.raw_frees, 0, "seed {seed}");
        ours += r.peak_held;
        cupys += cupy.peak_held;
        worst = worst.max(r.ratio());
    }
    assert!(ours < cupys, "held {ours} over the seeds against CuPy's rule's {cupys}");
    assert!(worst < 1.25, "the worst seed held {worst:.4}");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn on_several_streams_the_pool_holds_at_least_the_sum_of_each_streams_own_peak() {
    // Why the random trace on its four streams cannot get near its peak in use while the streams'
    // arenas share no memory (CuPy's rule, the default).
    let steps = trace::standard_random();
    let stream_of: HashMap<u64, usize> = steps
        .iter()
        .filter_map(|s| match *s {
            trace::Step::Alloc { id, stream, .. } => Some((id, stream)),
            trace::Step::Free { .. } => None,
        })
        .collect();
    let own_peaks: usize = (0..4)
        .map(|n| {
            let mine: Vec<trace::Step> = steps
                .iter()
                .copied()
                .filter(|s| match *s {
                    trace::Step::Alloc { stream, .. } => stream == n,
                    trace::Step::Free { id } => stream_of[&id] == n,
                })
                .collect();
            trace::peak_in_use(&mine)
        })
        .sum();
    let r = trace::replay_expandable(&steps, GrowthPolicy::Segments).unwrap();
    assert!(r.peak_held >= own_peaks, "{} held, the streams' own peaks add to {own_peaks}", r.peak_held);
    let bound = own_peaks as f64 / r.peak_in_use as f64;
    assert!(bound > 1.4, "the streams' own peaks over the pool's: {bound:.3}");
}

#[test]
fn the_growing_tail_is_lent_only_when_no_hole_fits() {
    const MIB: usize = 1 << 20;
    let (pool, allocator, cache) = expandable_segments_pool();
    let key = ArenaKey::NULL;
    // One growing block: a 60 MiB chunk, a 20 MiB one, then 40 MiB; the first and the last
    // freed, so the block has a 60 MiB hole and a 40 MiB free tail.
    let hole = pool.malloc(60 * MIB, key, &cache).unwrap();
    let pin = pool.malloc(20 * MIB, key, &cache).unwrap();
    let tail = pool.malloc(40 * MIB, key, &cache).unwrap();
    let (hole_at, tail_at) = (hole.ptr(), tail.ptr());
    assert_eq!(pin.ptr(), hole_at + 60 * MIB, "one block, grown in place");
    drop((hole, tail));
    let calls = raw_calls(allocator.counts());
    // 30 MiB fit both; best fit alone would cut the 40 MiB tail. The hole takes it.
    let long_lived = pool.malloc(30 * MIB, key, &cache).unwrap();
    assert_eq!(long_lived.ptr(), hole_at, "the hole, not the tail");
    // The cache hit does not lend the tail; the miss path does, without a raw call.
    assert!(pool.try_hit(40 * MIB, key, &cache).is_none());
    let large = pool.malloc(40 * MIB, key, &cache).unwrap();
    assert_eq!(large.ptr(), tail_at);
    assert_eq!(raw_calls(allocator.counts()), calls, "no raw call: both fit");
    drop(large);
    // With expandable segments off, the tail is a free chunk like any other: a cache hit.
    pool.set_expandable_segments(false).unwrap();
    let hit = pool.try_hit(40 * MIB, key, &cache).expect("a hit on the former tail");
    assert_eq!(hit.ptr(), tail_at);
    assert_eq!(raw_calls(allocator.counts()), calls);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn expandable_segments_lend_disjoint_chunks_and_every_byte_comes_back() {
    let steps = trace::random(11, 6000, 0.52, 256.0 * 1024.0, 2.0, 64 << 20, 4);
    let (pool, allocator, cache) = expandable_segments_pool();
    let mut live = HashMap::new();
    replay_into(&pool, &cache, &steps, &mut live, |p, live| {
        let (start, end) = (p.ptr(), p.ptr() + p.size());
        for other in live.values() {
            assert!(end <= other.ptr() || other.ptr() + other.size() <= start, "overlapping chunks");
        }
    });
    assert_eq!(pool.total_bytes(), allocator.counts().held.load(Ordering::Relaxed));
    drop(live);
    assert_eq!(pool.used_bytes(), 0);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte went back");
}

// Statistics, snapshots and out-of-memory observers.

#[test]
fn statistics_count_each_allocation_free_and_raw_call() {
    let (pool, mock, cache) = pool();
    let a = pool.malloc(1000, ArenaKey::NULL, &cache).unwrap();
    let b = pool.malloc(3000, ArenaKey::NULL, &cache).unwrap();
    drop(a);
    let s = pool.stats().all;
    assert_eq!((s.requested_bytes.current, s.requested_bytes.peak), (3000, 4000));
    assert_eq!((s.allocated_bytes.current, s.allocated_bytes.peak), (3072, 4096));
    assert_eq!((s.allocated_bytes.allocated, s.allocated_bytes.freed), (4096, 1024));
    assert_eq!((s.active_bytes.current, s.active_bytes.peak), (3072, 4096));
    assert_eq!((s.reserved_bytes.current, s.reserved_bytes.peak), (4096, 4096));
    assert_eq!((s.allocations.allocated, s.allocations.freed, s.allocations.peak), (2, 1, 2));
    assert_eq!((s.segments.allocated, s.segments.freed, s.segments.current), (2, 0, 2));
    assert_eq!((s.cache_hits, s.cache_misses, s.oom_errors, s.retries), (0, 2, 0, 0));
    // A hit: the freed chunk again, for a smaller request.
    let c = pool.malloc(600, ArenaKey::NULL, &cache).unwrap();
    let s = pool.stats().all;
    assert_eq!((s.cache_hits, s.cache_misses), (1, 2));
    assert_eq!(s.requested_bytes.current, 3600);
    assert_eq!(s.requested_bytes.peak, 4000, "the peak stays");
    pool.reset_peak();
    let s = pool.stats().all;
    assert_eq!(s.requested_bytes.peak, 3600);
    assert_eq!(s.allocated_bytes.peak, 4096, "both chunks are allocated again");
    drop((b, c));
    pool.free_all_blocks(None);
    let stats = pool.stats();
    let s = stats.all;
    assert_eq!((s.segments.freed, s.reserved_bytes.current, s.reserved_bytes.peak), (2, 0, 4096));
    assert_eq!((s.allocations.allocated, s.allocations.freed), (3, 3));
    assert_eq!(s.requested_bytes.current, 0);
    assert!(stats.arenas.is_empty(), "the emptied arena left the pool, its counts did not");
    assert_eq!(s.segments.allocated, mock.calls.load(Ordering::Relaxed) as u64);
}

#[test]
fn a_fenced_free_leaves_the_chunk_active_until_its_fence_completes() {
    let (pool, _mock, cache) = pool();
    let a = pool.malloc(700, ArenaKey::NULL, &cache).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    a.free_after(Box::new(Flag(Arc::clone(&done)))).unwrap();
    let s = pool.stats().all;
    assert_eq!((s.allocated_bytes.current, s.active_bytes.current), (0, 1024));
    assert_eq!((s.allocations.current, s.active_allocations.current), (0, 1));
    assert_eq!(s.requested_bytes.current, 0);
    let snap = pool.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].state, BlockState::PendingFree);
    done.store(true, Ordering::Release);
    // A miss collects completed fences.
    let _b = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    let s = pool.stats().all;
    assert_eq!((s.active_bytes.current, s.active_allocations.current), (4096, 1));
    assert_eq!((s.allocations.allocated, s.allocations.freed), (2, 1), "the fenced free counted once");
}

#[test]
fn several_arenas_are_counted_apart_and_bound_the_pools_peaks() {
    let (pool, _mock, cache) = pool();
    let a = pool.malloc(2048, ArenaKey::NULL, &cache).unwrap();
    drop(a);
    let _b = pool.malloc(4096, ArenaKey::stream(7), &cache).unwrap();
    let stats = pool.stats();
    assert!(!stats.peaks_exact);
    assert_eq!(stats.arenas.len(), 2);
    let of = |k: ArenaKey| stats.arenas.iter().find(|a| a.arena == k).unwrap().stats;
    assert_eq!(of(ArenaKey::NULL).allocated_bytes.peak, 2048);
    assert_eq!(of(ArenaKey::NULL).allocated_bytes.current, 0);
    assert_eq!(of(ArenaKey::stream(7)).allocated_bytes.current, 4096);
    // The true pool peak was 4096; the bound is the sum of the arenas' peaks.
    assert_eq!(stats.all.allocated_bytes.current, 4096);
    assert_eq!(stats.all.allocated_bytes.peak, 6144);
    // Reserved bytes are counted for the whole pool: exact.
    assert_eq!(stats.all.reserved_bytes.peak, 6144);
    pool.free_all_blocks(Some(ArenaKey::NULL));
    pool.reset_peak();
    let stats = pool.stats();
    assert!(stats.peaks_exact, "one arena since the reset");
    assert_eq!(stats.all.allocated_bytes.peak, 4096);
    assert_eq!(stats.all.reserved_bytes.peak, 4096);
}

#[test]
fn out_of_memory_observers_see_the_snapshot_before_the_error_returns() {
    let (pool, _mock, cache) = pool();
    pool.set_limit(4 * UNIT);
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    pool.add_oom_observer(move |e, snap| {
        let held: usize = snap.segments.iter().map(|s| s.total_size).sum();
        s2.lock().unwrap().push((e.to_string(), held));
    });
    let _a = pool.malloc(3 * UNIT, ArenaKey::NULL, &cache).unwrap();
    let cached = pool.malloc(UNIT, ArenaKey::stream(2), &cache).unwrap();
    drop(cached);
    let err = pool.malloc(2 * UNIT, ArenaKey::NULL, &cache).unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, err.to_string());
    // The ladder released the other arena's cached block before giving up.
    assert_eq!(seen[0].1, 3 * UNIT);
    let s = pool.stats().all;
    assert_eq!((s.oom_errors, s.retries), (1, 1));
    assert_eq!(s.segments.freed, 1);
    pool.clear_oom_observers();
    assert!(pool.malloc(2 * UNIT, ArenaKey::NULL, &cache).is_err());
    assert_eq!(pool.stats().all.oom_errors, 2);
}

#[test]
fn the_snapshot_shows_every_segment_cut_into_its_chunks() {
    let (pool, _mock, cache) = pool();
    let big = pool.malloc(8 * UNIT, ArenaKey::NULL, &cache).unwrap();
    drop(big);
    let head = pool.malloc(2 * UNIT - 100, ArenaKey::NULL, &cache).unwrap();
    let other = pool.malloc(UNIT, ArenaKey::stream(5), &cache).unwrap();
    let snap = pool.snapshot();
    assert_eq!(snap.segments.len(), 2);
    let seg = snap.segments.iter().find(|s| s.arena == ArenaKey::NULL).unwrap();
    assert_eq!(seg.total_size, 8 * UNIT);
    let got: Vec<(usize, usize, BlockState)> =
        seg.blocks.iter().map(|b| (b.size, b.requested_size, b.state)).collect();
    assert_eq!(got, [(2 * UNIT, 2 * UNIT - 100, BlockState::Allocated), (6 * UNIT, 0, BlockState::Free)]);
    assert_eq!(seg.blocks[0].address, head.ptr());
    assert_eq!(seg.blocks[1].address, head.ptr() + 2 * UNIT);
    let seg = snap.segments.iter().find(|s| s.arena == ArenaKey::stream(5)).unwrap();
    assert_eq!(seg.blocks[0].address, other.ptr());
}

#[test]
fn the_summary_is_a_table_of_the_statistics() {
    let (pool, _mock, cache) = pool();
    let _a = pool.malloc(3 << 20, ArenaKey::NULL, &cache).unwrap();
    let _b = pool.malloc(100, ArenaKey::per_thread(4), &cache).unwrap();
    let text = pool.memory_summary();
    assert!(text.contains("gpumem memory summary, device 0"), "{text}");
    let line = |start: &str| {
        text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}\n{text}"))
    };
    // 3 MiB + 512 B allocated: in KiB, as PyTorch switches units only past 768 of the next.
    assert_eq!(
        line("| Allocated memory"),
        "| Allocated memory        |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |"
    );
    assert!(line("|   null stream").contains("3072 KiB"), "{text}");
    assert!(text.contains("|   per-thread, thread 4  |"), "{text}");
    assert!(line("| Allocations").contains("      2"), "{text}");
    assert!(text.contains("cache hits 0, misses 2, raw allocs 2, raw frees 0"), "{text}");
    assert!(text.lines().all(|l| l.chars().count() == 79), "{text}");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn statistics_match_what_the_counting_allocator_saw_over_a_training_trace() {
    for policy in [GrowthPolicy::CacheUntilOutOfMemory, GrowthPolicy::HoldPeakInUse, GrowthPolicy::Segments] {
        let steps = trace::training(4, 256, 1024, 3);
        let (pool, allocator, cache) = counted_pool(policy);
        let mut live = HashMap::new();
        let (mut requested, mut peak_requested) = (0u64, 0u64);
        let mut sizes = HashMap::new();
        for step in &steps {
            match *step {
                trace::Step::Alloc { id, size, stream } => {
                    live.insert(id, pool.malloc(size, ArenaKey::stream(stream), &cache).unwrap());
                    sizes.insert(id, size as u64);
                    requested += size as u64;
                    peak_requested = peak_requested.max(requested);
                }
                trace::Step::Free { id } => {
                    drop(live.remove(&id));
                    requested -= sizes[&id];
                }
            }
        }
        let s = pool.stats();
        let c = allocator.counts();
        assert!(s.peaks_exact);
        assert_eq!(s.all.requested_bytes.peak, peak_requested, "{policy:?}");
        assert_eq!(s.all.requested_bytes.peak as usize, trace::peak_in_use(&steps));
        assert_eq!(s.all.reserved_bytes.peak as usize, c.peak.load(Ordering::Relaxed), "{policy:?}");
        assert_eq!(s.all.reserved_bytes.current as usize, c.held.load(Ordering::Relaxed));
        assert_eq!(s.all.segments.allocated as usize, c.allocs.load(Ordering::Relaxed), "{policy:?}");
        assert_eq!(s.all.segments.freed as usize, c.frees.load(Ordering::Relaxed), "{policy:?}");
        let mallocs = steps.iter().filter(|s| matches!(s, trace::Step::Alloc { .. })).count() as u64;
        assert_eq!(s.all.allocations.allocated, mallocs);
        assert_eq!(s.all.cache_hits + s.all.cache_misses, mallocs);
    }
}

#[cfg(feature = "serde")]
#[test]
fn statistics_and_snapshots_are_serde_values() {
    let (pool, _mock, cache) = pool();
    let _a = pool.malloc(1000, ArenaKey::stream(9), &cache).unwrap();
    let json = serde_json::to_value(pool.snapshot()).unwrap();
    assert_eq!(json["segments"][0]["arena"], 9);
    assert_eq!(json["segments"][0]["blocks"][0]["state"], "allocated");
    assert_eq!(json["segments"][0]["blocks"][0]["requested_size"], 1000);
    let stats: PoolStats = serde_json::from_value(serde_json::to_value(pool.stats()).unwrap()).unwrap();
    assert_eq!(stats, pool.stats());
}

/// The peaks are kept by counting down how far each current value is below its peak, and
/// compared only when that room runs out: against a model that takes every maximum, over random
/// allocations, frees, fenced frees (allocated falls at once, active when the fence completes)
/// and peak resets, each peak is exact after every step.
#[test]
fn peaks_match_a_model_that_compares_on_every_step() {
    #[derive(Default)]
    struct Model {
        requested: u64,
        allocated: u64,
        active: u64,
        allocations: u64,
        active_allocations: u64,
        peaks: [u64; 5],
    }
    impl Model {
        fn now(&self) -> [u64; 5] {
            [self.requested, self.allocated, self.active, self.allocations, self.active_allocations]
        }
        fn raise(&mut self) {
            let now = self.now();
            for (p, c) in self.peaks.iter_mut().zip(now) {
                *p = (*p).max(c);
            }
        }
    }
    let steps = if cfg!(miri) { 150 } else { 4000 };
    let (pool, _mock, cache) = pool();
    let mut model = Model::default();
    let mut live: Vec<(PooledMemory<Mock>, u64, u64)> = Vec::new();
    let mut fenced: Vec<(Arc<AtomicBool>, u64)> = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..steps {
        match next() % 16 {
            0..=6 => {
                let requested = 1 + next() % (8 * UNIT as u64);
                let p = pool.malloc(requested as usize, ArenaKey::NULL, &cache).unwrap();
                let size = p.size() as u64;
                model.requested += requested;
                model.allocated += size;
                model.active += size;
                model.allocations += 1;
                model.active_allocations += 1;
                model.raise();
                live.push((p, requested, size));
            }
            7..=11 if !live.is_empty() => {
                let (p, requested, size) = live.swap_remove((next() % live.len() as u64) as usize);
                drop(p);
                model.requested -= requested;
                model.allocated -= size;
                model.active -= size;
                model.allocations -= 1;
                model.active_allocations -= 1;
            }
            12 | 13 if !live.is_empty() => {
                let (p, requested, size) = live.swap_remove((next() % live.len() as u64) as usize);
                let done = Arc::new(AtomicBool::new(false));
                p.free_after(Box::new(Flag(Arc::clone(&done)))).unwrap();
                model.requested -= requested;
                model.allocated -= size;
                model.allocations -= 1;
                fenced.push((done, size));
            }
            14 if !fenced.is_empty() => {
                // Complete every pending fence and collect them, as a miss does.
                for (done, _) in &fenced {
                    done.store(true, Ordering::Release);
                }
                pool.collect_fenced(false);
                for (_, size) in fenced.drain(..) {
                    model.active -= size;
                    model.active_allocations -= 1;
                }
            }
            15 => {
                pool.reset_peak();
                model.peaks = model.now();
            }
            _ => {}
        }
        let s = pool.stats().all;
        let current = [
            s.requested_bytes.current,
            s.allocated_bytes.current,
            s.active_bytes.current,
            s.allocations.current,
            s.active_allocations.current,
        ];
        let peaks = [
            s.requested_bytes.peak,
            s.allocated_bytes.peak,
            s.active_bytes.peak,
            s.allocations.peak,
            s.active_allocations.peak,
        ];
        assert_eq!(current, model.now(), "current values after step {step}");
        assert_eq!(peaks, model.peaks, "peaks after step {step}");
    }
}

// Lending across streams.

/// A stream order that records what the pool asked of it; `can` and `ok` say how it answers.
#[derive(Default)]
struct Orders {
    refuse: AtomicBool,
    fail: AtomicBool,
    ordered: Mutex<Vec<(ArenaKey, ArenaKey)>>,
    fences: Mutex<Vec<(ArenaKey, Arc<AtomicBool>)>>,
}

impl StreamOrder for Arc<Orders> {
    fn can_order(&self, _owner: ArenaKey, _borrower: ArenaKey) -> bool {
        !self.refuse.load(Ordering::Relaxed)
    }
    fn order_after(&self, owner: ArenaKey, borrower: ArenaKey) -> bool {
        if self.fail.load(Ordering::Relaxed) {
            return false;
        }
        self.ordered.lock().unwrap().push((owner, borrower));
        true
    }
    fn fence_after(&self, borrower: ArenaKey) -> Box<dyn Fence> {
        let flag = Arc::new(AtomicBool::new(false));
        self.fences.lock().unwrap().push((borrower, Arc::clone(&flag)));
        Box::new(Flag(flag))
    }
}

fn sharing_pool() -> (Pool<Mock>, Mock, ArenaCache, Arc<Orders>) {
    let (pool, mock, cache) = pool();
    let orders = Arc::new(Orders::default());
    pool.set_stream_order(Box::new(Arc::clone(&orders)));
    pool.set_share_across_streams(true).unwrap();
    (pool, mock, cache, orders)
}

#[test]
fn sharing_across_streams_is_off_by_default_and_needs_a_stream_order() {
    let (pool, _, _) = pool();
    assert!(!pool.shares_across_streams());
    assert!(matches!(pool.set_share_across_streams(true), Err(Error::InvalidArgument(_))));
    pool.set_stream_order(Box::new(NoQueuedWork));
    pool.set_share_across_streams(true).unwrap();
    assert!(pool.shares_across_streams());
}

#[test]
fn a_miss_takes_another_streams_free_chunk_and_it_returns_behind_the_borrowers_fence() {
    let (pool, mock, cache, orders) = sharing_pool();
    let (a, b) = (ArenaKey::stream(10), ArenaKey::stream(20));
    let p = pool.malloc(1000, a, &cache).unwrap();
    let address = p.ptr();
    drop(p);
    // Stream b's arena is empty: it borrows a's chunk, with b ordered after a.
    let q = pool.malloc(1000, b, &cache).unwrap();
    assert_eq!(q.ptr(), address);
    assert_eq!(*orders.ordered.lock().unwrap(), vec![(a, b)]);
    assert_eq!(mock.calls.load(Ordering::Relaxed), 1, "no raw allocation");
    assert_eq!(pool.stats().all.lent_across_streams, 1);
    drop(q);
    // Back to a's arena behind a fence on b: a does not reuse it until the fence completes.
    let fence = {
        let fences = orders.fences.lock().unwrap();
        assert_eq!(fences.len(), 1);
        assert_eq!(fences[0].0, b);
        Arc::clone(&fences[0].1)
    };
    assert_eq!(pool.used_bytes(), 1024, "still active behind its fence");
    let r = pool.malloc(1000, a, &cache).unwrap();
    assert_ne!(r.ptr(), address, "lent while the borrower's work may still use it");
    assert_eq!(mock.calls.load(Ordering::Relaxed), 2);
    fence.store(true, Ordering::Release);
    let s = pool.malloc(1000, a, &cache).unwrap();
    assert_eq!(s.ptr(), address, "back in its owner's arena once the fence completed");
    assert_eq!(mock.calls.load(Ordering::Relaxed), 2);
    assert_eq!(orders.ordered.lock().unwrap().len(), 1, "a's own chunks need no order");
}

#[test]
fn no_chunk_is_lent_across_streams_the_order_cannot_order() {
    let (pool, mock, cache, orders) = sharing_pool();
    let (a, b) = (ArenaKey::stream(10), ArenaKey::stream(20));
    let address = pool.malloc(1000, a, &cache).unwrap().ptr();
    orders.refuse.store(true, Ordering::Relaxed);
    let q = pool.malloc(1000, b, &cache).unwrap();
    assert_ne!(q.ptr(), address);
    orders.refuse.store(false, Ordering::Relaxed);
    orders.fail.store(true, Ordering::Relaxed);
    let r = pool.malloc(1000, b, &cache).unwrap();
    assert_ne!(r.ptr(), address, "the order failed: the chunk stays a's");
    assert_eq!(mock.calls.load(Ordering::Relaxed), 3);
    assert_eq!(pool.stats().all.lent_across_streams, 0);
    // The chunk taken and given back is a's, as before, and a plain free of b's goes back at once.
    let own = pool.try_hit(1000, a, &cache).expect("a's chunk, still free in a's arena");
    assert_eq!(own.ptr(), address);
    drop((q, r, own));
    assert!(orders.fences.lock().unwrap().is_empty());
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn with_expandable_segments_a_miss_grows_the_home_arenas_block() {
    const MIB: usize = 1 << 20;
    let (pool, allocator, cache) = expandable_segments_pool();
    pool.set_stream_order(Box::new(NoQueuedWork));
    pool.set_share_across_streams(true).unwrap();
    let (a, b) = (ArenaKey::stream(10), ArenaKey::stream(20));
    let first = pool.malloc(30 * MIB, a, &cache).unwrap();
    // Nothing free anywhere: b's miss grows a's block rather than making a block of its own.
    let second = pool.malloc(30 * MIB, b, &cache).unwrap();
    assert_eq!(second.ptr(), first.ptr() + 30 * MIB, "one block, grown in place");
    assert_eq!(pool.stats().all.segments.allocated, 1);
    assert_eq!(pool.stats().all.lent_across_streams, 1);
    drop((first, second));
    assert_eq!(pool.used_bytes(), 0);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte went back");
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn shared_across_streams_the_random_trace_holds_as_on_one_stream() {
    let steps = trace::standard_random();
    let shared = trace::ReplayOptions {
        expandable: true,
        share_across_streams: true,
        ..trace::ReplayOptions::default()
    };
    let r = trace::replay_with(&steps, GrowthPolicy::Segments, shared).unwrap();
    let one = trace::replay_expandable(&trace::on_one_stream(&steps), GrowthPolicy::Segments).unwrap();
    let apart = trace::replay_expandable(&steps, GrowthPolicy::Segments).unwrap();
    assert!(r.ratio() < 1.06, "held / in use {:.4}", r.ratio());
    assert!(r.peak_held <= one.peak_held, "{} held, {} on one stream", r.peak_held, one.peak_held);
    assert!(r.raw_allocs < apart.raw_allocs && r.peak_held < apart.peak_held);
    assert_eq!(r.raw_frees, 0);
    assert!(r.lent_across_streams > 0);
}

#[test]
#[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
fn shared_across_streams_chunks_stay_disjoint_and_every_byte_comes_back() {
    let steps = trace::random(11, 6000, 0.52, 256.0 * 1024.0, 2.0, 64 << 20, 4);
    for expandable in [false, true] {
        let allocator = if expandable {
            trace::CountingAllocator::expandable(2 << 20)
        } else {
            trace::CountingAllocator::default()
        };
        let pool = Pool::new(0, allocator.clone());
        pool.set_growth_policy(GrowthPolicy::Segments);
        pool.set_expandable_segments(expandable).unwrap();
        pool.set_stream_order(Box::new(NoQueuedWork));
        pool.set_share_across_streams(true).unwrap();
        let cache = ArenaCache::new();
        let mut live = HashMap::new();
        replay_into(&pool, &cache, &steps, &mut live, |p, live| {
            let (start, end) = (p.ptr(), p.ptr() + p.size());
            for other in live.values() {
                assert!(end <= other.ptr() || other.ptr() + other.size() <= start, "overlapping chunks");
            }
        });
        assert!(pool.stats().all.lent_across_streams > 0, "expandable {expandable}");
        drop(live);
        assert_eq!(pool.used_bytes(), 0);
        pool.free_all_blocks(None);
        assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte went back");
    }
}

#[test]
fn completed_fences_are_settled_by_used_bytes_stats_and_free_all_blocks() {
    // SH04: a chunk lent across streams comes back behind a fence; once the fence completes,
    // nothing freed may stay counted, and `free_all_blocks` gives its block back at once.
    let (pool, mock, cache, orders) = sharing_pool();
    let (a, b) = (ArenaKey::stream(10), ArenaKey::stream(20));
    drop(pool.malloc(1000, a, &cache).unwrap());
    drop(pool.malloc(1000, b, &cache).unwrap());
    assert_eq!(pool.stats().all.lent_across_streams, 1);
    assert_eq!(pool.used_bytes(), 1024, "its fence has not completed");
    for (_, fence) in orders.fences.lock().unwrap().iter() {
        fence.store(true, Ordering::Release);
    }
    assert_eq!(pool.stats().all.active_bytes.current, 0, "stats settle completed fences");
    assert_eq!((pool.used_bytes(), pool.n_fenced()), (0, 0));
    // The same once more, settled by `free_all_blocks` alone.
    drop(pool.malloc(1000, b, &cache).unwrap());
    orders.fences.lock().unwrap().last().unwrap().1.store(true, Ordering::Release);
    pool.free_all_blocks(None);
    assert_eq!((pool.total_bytes(), pool.n_fenced()), (0, 0));
    assert!(mock.live.lock().unwrap().is_empty(), "every block went back without another miss");
}

/// How [`Liar`] misreports a growth or a shrink.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lie {
    /// `grow` answers `Ok(true)` and leaves the block as it was.
    GrowsNothing,
    /// `grow` grows the block by half what was asked.
    GrowsHalf,
    /// `grow` grows it, at another address.
    Moves,
    /// `shrink` unmaps what was asked and reports 0.
    ShrinksSilently,
    /// `shrink` reports what was asked and unmaps nothing.
    ShrinksNothing,
}

/// A safe raw allocator whose growth and shrink misreport (VM07): blocks from [`Mock`].
#[derive(Clone)]
struct Liar {
    mock: Mock,
    lie: Lie,
}

impl RawAllocator for Liar {
    type Block = MockBlock;

    fn allocate(&self, device: DeviceId, size: usize) -> Result<MockBlock> {
        self.mock.allocate(device, size)
    }
    fn expandable(&self) -> bool {
        true
    }
    fn granule(&self) -> usize {
        UNIT
    }
    fn grow(&self, block: &mut MockBlock, extra: usize) -> Result<bool> {
        let mut live = self.mock.live.lock().unwrap();
        live.remove(&block.address);
        match self.lie {
            Lie::GrowsNothing => {}
            Lie::GrowsHalf => block.size += extra / 2,
            Lie::Moves => {
                block.size += extra;
                block.address += UNIT;
            }
            Lie::ShrinksSilently | Lie::ShrinksNothing => block.size += extra,
        }
        live.insert(block.address, block.size);
        Ok(true)
    }
    fn shrink(&self, block: &mut MockBlock, bytes: usize) -> Result<usize> {
        if self.lie == Lie::ShrinksNothing {
            return Ok(bytes);
        }
        block.size -= bytes;
        self.mock.live.lock().unwrap().insert(block.address, block.size);
        Ok(if self.lie == Lie::ShrinksSilently { 0 } else { bytes })
    }
}

fn lying_pool(lie: Lie) -> (Pool<Liar>, Mock, ArenaCache) {
    let mock = Mock::default();
    let pool = Pool::new(0, Liar { mock: mock.clone(), lie });
    pool.set_expandable_segments(true).unwrap();
    (pool, mock, ArenaCache::new())
}

/// Every chunk in `lent` lies inside a live block of `mock`.
fn inside_live_blocks(mock: &Mock, lent: &[&PooledMemory<Liar>]) -> bool {
    let live = mock.live.lock().unwrap();
    lent.iter().all(|p| {
        live.range(..=p.ptr()).next_back().is_some_and(|(&start, &size)| p.ptr() + p.size() <= start + size)
    })
}

#[test]
fn a_growth_the_block_does_not_show_is_an_invalid_raw_block_and_nothing_is_lent_from_it() {
    // VM07: `grow` answered `Ok(true)`; the pool lent 64 KiB past the block's end.
    for lie in [Lie::GrowsNothing, Lie::GrowsHalf, Lie::Moves] {
        let (pool, mock, cache) = lying_pool(lie);
        let first = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
        let held = pool.total_bytes();
        let err = pool.malloc(1 << 16, ArenaKey::NULL, &cache).unwrap_err();
        assert!(matches!(err, Error::InvalidRawBlock { .. }), "{err}");
        assert_eq!((pool.total_bytes(), pool.used_bytes()), (held, first.size()), "nothing reserved or lent");
        // The block's own memory is still lent rightly and comes back.
        let second = pool.malloc(UNIT, ArenaKey::NULL, &cache);
        if let Ok(second) = &second {
            assert!(lie == Lie::Moves || inside_live_blocks(&mock, &[&first, second]));
        }
        drop((first, second));
        pool.free_all_blocks(None);
        assert_eq!(pool.total_bytes(), 0);
        assert!(mock.live.lock().unwrap().is_empty(), "every block went back");
    }
}

#[test]
fn a_shrink_is_taken_from_the_block_not_from_the_count_it_reports() {
    for lie in [Lie::ShrinksSilently, Lie::ShrinksNothing] {
        let (pool, mock, cache) = lying_pool(lie);
        let first = pool.malloc(UNIT, ArenaKey::NULL, &cache).unwrap();
        drop(pool.malloc(8 * UNIT, ArenaKey::NULL, &cache).unwrap());
        let held = pool.total_bytes();
        pool.free_all_blocks(None);
        let block = *mock.live.lock().unwrap().values().next().unwrap();
        let kept = mock.live.lock().unwrap().len();
        assert_eq!(kept, 1);
        if lie == Lie::ShrinksSilently {
            assert!(pool.total_bytes() < held, "the unmapped tail is no longer held");
        } else {
            assert_eq!(pool.total_bytes(), held, "a tail still mapped is still held");
        }
        // Whatever is lent now lies inside what the block maps.
        let again = pool.malloc(4 * UNIT, ArenaKey::NULL, &cache).unwrap();
        let more = pool.malloc(2 * UNIT, ArenaKey::NULL, &cache).unwrap();
        assert!(inside_live_blocks(&mock, &[&first, &again, &more]), "{block}");
        drop((first, again, more));
        pool.free_all_blocks(None);
        assert!(mock.live.lock().unwrap().is_empty(), "every block went back");
    }
}
