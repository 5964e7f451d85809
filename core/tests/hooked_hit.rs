//! The cache hit with hooks installed: which callbacks fire, with which arguments, and that a
//! failing or panicking hook on a hit never leaks a chunk. The hooked hit has a path of its own
//! (the chunk taken between the malloc hooks, the free without a guard when no free pre-hook is
//! installed), so each case here starts from a warm cache.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpumem_core::hooks::{self, Callbacks};
use gpumem_core::host::Host;
use gpumem_core::pool::Fence;
use gpumem_core::{Error, FreeEvent, HookResult, MallocEvent, MemoryHook, SingleDeviceMemoryPool};

const U: usize = 512;

/// Logs the malloc and free callbacks it declares, and fails (or panics in) one of them.
#[derive(Default)]
struct Log {
    declared: Option<Callbacks>,
    fail: Option<&'static str>,
    panic: Option<&'static str>,
    calls: RefCell<Vec<String>>,
}

impl Log {
    fn record(&self, what: &'static str, args: String) -> HookResult {
        self.calls.borrow_mut().push(format!("{what} {args}"));
        if self.panic == Some(what) {
            panic!("{what} panicked");
        }
        match self.fail {
            Some(f) if f == what => Err(format!("{what} refused").into()),
            _ => Ok(()),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }
}

impl MemoryHook for Log {
    fn name(&self) -> &str {
        "log"
    }
    fn callbacks(&self) -> Callbacks {
        self.declared.unwrap_or(Callbacks::ALL)
    }
    fn malloc_preprocess(&self, e: &MallocEvent) -> HookResult {
        self.record("malloc_pre", format!("{} {} {}", e.device_id, e.size, e.mem_size))
    }
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.record(
            "malloc_post",
            format!("{} {} {} {} {:x}", e.device_id, e.size, e.mem_size, e.mem_ptr, e.pmem_id),
        )
    }
    fn free_preprocess(&self, e: &FreeEvent) -> HookResult {
        self.record("free_pre", format!("{} {} {} {:x}", e.device_id, e.mem_size, e.mem_ptr, e.pmem_id))
    }
    fn free_postprocess(&self, e: &FreeEvent) -> HookResult {
        self.record("free_post", format!("{} {} {} {:x}", e.device_id, e.mem_size, e.mem_ptr, e.pmem_id))
    }
}

/// A pool whose cache holds one free chunk of `U` bytes, and that chunk's address.
fn warm_pool() -> (SingleDeviceMemoryPool<Host>, usize) {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let p = pool.malloc_pooled(U).unwrap();
    let ptr = p.ptr();
    drop(p);
    (pool, ptr)
}

#[test]
fn a_hooked_hit_fires_the_malloc_hooks_with_cupys_arguments_and_no_alloc_hook() {
    for declared in [Callbacks::ALL, Callbacks::POSTPROCESS] {
        let (pool, ptr) = warm_pool();
        let total = pool.total_bytes();
        let log = hooks::install(Log { declared: Some(declared), ..Log::default() }).unwrap();
        let p = pool.malloc_pooled(100).unwrap();
        assert_eq!(p.ptr(), ptr, "the cached chunk");
        let id = p.pmem_id();
        drop(p);
        let m = pool.malloc(U).unwrap(); // the MemoryPointer path hits the same chunk
        drop(m);
        let calls = log.calls();
        drop(log);
        let post = [
            format!("malloc_post 0 100 {U} {ptr} {id:x}"),
            format!("free_post 0 {U} {ptr} {id:x}"),
            format!("malloc_post 0 {U} {U} {ptr} {id:x}"),
            format!("free_post 0 {U} {ptr} {id:x}"),
        ];
        if declared == Callbacks::ALL {
            let all = [
                format!("malloc_pre 0 100 {U}"),
                post[0].clone(),
                format!("free_pre 0 {U} {ptr} {id:x}"),
                post[1].clone(),
                format!("malloc_pre 0 {U} {U}"),
                post[2].clone(),
                format!("free_pre 0 {U} {ptr} {id:x}"),
                post[3].clone(),
            ];
            assert_eq!(calls, all);
        } else {
            assert_eq!(calls, post, "a post-only hook gets the post callbacks alone");
        }
        assert_eq!((pool.used_bytes(), pool.total_bytes()), (0, total), "hits only: nothing allocated");
    }
}

#[test]
fn a_failing_malloc_post_hook_on_a_hit_returns_the_chunk_through_the_free_hooks() {
    for declared in [Callbacks::ALL, Callbacks::POSTPROCESS] {
        let (pool, ptr) = warm_pool();
        let log =
            hooks::install(Log { declared: Some(declared), fail: Some("malloc_post"), ..Log::default() })
                .unwrap();
        let err = pool.malloc_pooled(U).unwrap_err();
        assert!(
            matches!(&err, Error::Hook { hook, phase: "malloc_postprocess", .. } if hook == "log"),
            "{err:?}"
        );
        assert_eq!(pool.used_bytes(), 0, "the chunk went back");
        let calls = log.calls();
        let frees: Vec<&String> = calls.iter().filter(|c| c.starts_with("free_post")).collect();
        assert_eq!(frees.len(), 1, "{calls:?}");
        assert!(frees[0].contains(&format!(" {ptr} ")), "the returned chunk is the cached one: {calls:?}");
        drop(log);
        // The chunk serves the next allocation.
        assert_eq!(pool.malloc_pooled(U).unwrap().ptr(), ptr);
    }
}

#[test]
fn a_failing_free_hook_on_a_hit_reports_the_error_and_still_returns_the_chunk() {
    for (declared, phase) in
        [(Callbacks::ALL, "free_pre"), (Callbacks::ALL, "free_post"), (Callbacks::POSTPROCESS, "free_post")]
    {
        let (pool, ptr) = warm_pool();
        let log =
            hooks::install(Log { declared: Some(declared), fail: Some(phase), ..Log::default() }).unwrap();
        let err = pool.malloc_pooled(U).unwrap().free().unwrap_err();
        assert!(matches!(err, Error::Hook { .. }), "{phase}: {err:?}");
        assert_eq!(pool.used_bytes(), 0, "{phase}: the chunk went back");
        // Dropped instead of freed: the error is kept for `take_drop_error`.
        drop(pool.malloc_pooled(U).unwrap());
        assert!(matches!(hooks::take_drop_error(), Some(Error::Hook { .. })), "{phase}");
        assert_eq!(pool.used_bytes(), 0, "{phase}");
        if phase == "free_pre" {
            assert_eq!(
                log.calls().iter().filter(|c| c.starts_with("free_post")).count(),
                2,
                "post still runs"
            );
        }
        drop(log);
        assert_eq!(pool.malloc_pooled(U).unwrap().ptr(), ptr, "{phase}: the chunk serves again");
    }
}

#[test]
fn a_panicking_free_pre_hook_on_a_hit_still_returns_the_chunk() {
    let (pool, ptr) = warm_pool();
    let p = pool.malloc_pooled(U).unwrap();
    let log = hooks::install(Log { panic: Some("free_pre"), ..Log::default() }).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(|| p.free())).is_err());
    drop(log);
    assert_eq!(pool.used_bytes(), 0, "the guard gave the chunk back");
    assert_eq!(pool.malloc_pooled(U).unwrap().ptr(), ptr);
}

/// A fence that completes when told to.
struct Flag(Arc<AtomicBool>);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn wait(&self) {
        while !self.is_complete() {
            std::thread::yield_now();
        }
    }
}

#[test]
fn a_hooked_free_behind_a_fence_fires_the_free_hooks_now_and_lends_the_chunk_after_the_fence() {
    for declared in [Callbacks::ALL, Callbacks::POSTPROCESS] {
        let (pool, ptr) = warm_pool();
        let log = hooks::install(Log { declared: Some(declared), ..Log::default() }).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        pool.malloc_pooled(U).unwrap().free_after(Box::new(Flag(Arc::clone(&done)))).unwrap();
        assert!(log.calls().last().unwrap().starts_with("free_post"), "{:?}", log.calls());
        let other = pool.malloc_pooled(U).unwrap();
        assert_ne!(other.ptr(), ptr, "the fenced chunk is not lent before its fence completes");
        drop(other);
        done.store(true, Ordering::Release);
        drop(log);
        // Once the fence completed, a miss looks at fenced chunks before it grows.
        let held: Vec<_> = (0..2).map(|_| pool.malloc_pooled(U).unwrap()).collect();
        assert!(
            held.iter().any(|p| p.ptr() == ptr),
            "the fenced chunk serves again once the fence completed"
        );
    }
}

#[test]
fn a_hooked_zero_size_malloc_fires_the_malloc_hooks_only() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    let log = hooks::install(Log::default()).unwrap();
    let p = pool.malloc_pooled(0).unwrap();
    let id = p.pmem_id();
    assert!(id != 0 && !p.is_chunk());
    drop(p);
    assert_eq!(log.calls(), ["malloc_pre 0 0 0".to_owned(), format!("malloc_post 0 0 0 0 {id:x}")]);
}
