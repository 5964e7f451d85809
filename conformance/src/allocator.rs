//! The current allocator: alloc, set_allocator, using_allocator.

/// The `allocator` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __allocator_tests {
    ($flavor:ident) => {
        mod allocator {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::sync::atomic::{AtomicUsize, Ordering};
            use std::sync::Arc;

            use gpumem::{Error, MemoryPointer, MemoryPool, PlainAllocator};


            conformance! {
                fn alloc_uses_the_default_pool_unless_told_otherwise() {
                    // Other tests may run alongside, so this checks only what `using_allocator` scopes, which
                    // are per thread.
                    assert_eq!(gpumem::alloc(100).unwrap().mem().identity(), "PooledMemory");
                    {
                        let _plain = gpumem::using_allocator(None);
                        assert_eq!(gpumem::alloc(100).unwrap().mem().identity(), "Memory");
                        let calls = Arc::new(AtomicUsize::new(0));
                        let c = calls.clone();
                        let pool = Arc::new(MemoryPool::new());
                        let counting = move |size: usize| -> gpumem::Result<MemoryPointer> {
                            c.fetch_add(1, Ordering::SeqCst);
                            pool.malloc(size)
                        };
                        {
                            let _inner = gpumem::using_allocator(Some(Arc::new(counting)));
                            gpumem::alloc(10).unwrap();
                            assert!(matches!(gpumem::set_allocator(None), Err(Error::AllocatorInUse)));
                        }
                        assert_eq!(calls.load(Ordering::SeqCst), 1);
                        assert_eq!(gpumem::alloc(100).unwrap().mem().identity(), "Memory", "the outer scope is back");
                    }
                    assert_eq!(gpumem::alloc(100).unwrap().mem().identity(), "PooledMemory");
                    let _ = PlainAllocator;
                }
            }
        }
    };
}
