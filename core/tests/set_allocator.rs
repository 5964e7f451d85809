//! `set_allocator` against the per-thread copies `alloc` keeps of the process-wide allocator. In a
//! test binary of its own: it changes process-wide state that other tests' `alloc` would see.

use gpumem_core::host::Host;
use gpumem_core::{alloc, get_default_memory_pool, set_allocator, using_allocator, Allocator};
use std::sync::Arc;

#[test]
fn alloc_follows_set_allocator_on_every_thread() {
    let pool = get_default_memory_pool::<Host>();
    assert_eq!(alloc::<Host>(100).unwrap().mem().identity(), "PooledMemory");
    let seen = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                assert_eq!(alloc::<Host>(100).unwrap().mem().identity(), "PooledMemory");
                set_allocator::<Host>(None).unwrap();
                alloc::<Host>(100).unwrap().mem().identity()
            })
            .join()
            .unwrap()
    });
    assert_eq!(seen, "Memory");
    // This thread's copy of the pool is stale now.
    assert_eq!(alloc::<Host>(100).unwrap().mem().identity(), "Memory");
    // An allocator that calls `alloc` again (inside a scope of its own) while the outer `alloc`
    // borrows this thread's copy of it.
    let inner = pool.clone();
    set_allocator::<Host>(Some(Arc::new(move |size: usize| {
        let _scope = using_allocator::<Host>(Some(inner.clone()));
        alloc::<Host>(size)
    })))
    .unwrap();
    assert_eq!(alloc::<Host>(100).unwrap().mem().identity(), "PooledMemory");
    let as_allocator: Arc<dyn Allocator<Host>> = pool.clone();
    set_allocator::<Host>(Some(as_allocator)).unwrap();
    assert_eq!(alloc::<Host>(100).unwrap().mem().identity(), "PooledMemory");
    drop(alloc::<Host>(4096).unwrap());
    assert_eq!(pool.used_bytes(), 0, "the pool set again is the one alloc uses");
}
