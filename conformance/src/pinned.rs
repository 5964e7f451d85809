//! Pinned host memory and asynchronous host transfers.

/// The `pinned` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __pinned_tests {
    ($flavor:ident) => {
        mod pinned {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use gpumem::{Error, PinnedMemoryPointer, PinnedMemoryPool, Stream};


            conformance! {
                fn async_host_transfers_through_pinned_memory() {
                    let s = Stream::non_blocking().unwrap();
                    let src = PinnedMemoryPointer::alloc(1 << 20).unwrap();
                    src.write(&vec![7u8; 1 << 20]).unwrap();
                    let dev = gpumem::alloc(1 << 20).unwrap();
                    dev.copy_from_host_async(&src, 1 << 20, Some(&s)).unwrap();
                    // Dropping the buffer right away is safe: gpumem holds it until the copy is done.
                    drop(src);
                    let dst = PinnedMemoryPointer::alloc(1 << 20).unwrap();
                    dev.copy_to_host_async(&dst, 1 << 20, Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    let mut out = vec![0u8; 1 << 20];
                    dst.read(&mut out).unwrap();
                    assert!(out.iter().all(|&b| b == 7));
                    assert!(matches!(dev.copy_to_host_async(&(&dst + 8), 1 << 20, Some(&s)), Err(Error::OutOfBounds { .. })));
                }

                fn pinned_pool_follows_cupy() {
                    assert_eq!(PinnedMemoryPool::rounded_size(1000), Some(1024));
                    assert_eq!(PinnedMemoryPool::rounded_size(1025), Some(2048));
                    assert_eq!(PinnedMemoryPool::rounded_size(10 << 30), Some(16 << 30));
                    let pool = PinnedMemoryPool::new();
                    assert_eq!(pool.n_free_blocks(), 0);
                    let a = pool.malloc(1000).unwrap();
                    let b = pool.malloc(1000).unwrap();
                    let c = pool.malloc(2000).unwrap();
                    assert!(a.ptr() != b.ptr() && b.ptr() != c.ptr());
                    let a_ptr = a.ptr();
                    drop(a);
                    assert_eq!(pool.n_free_blocks(), 1);
                    assert_ne!(pool.malloc(2000).unwrap().ptr(), a_ptr, "free lists are exact-size");
                    assert_eq!(pool.malloc(1000).unwrap().ptr(), a_ptr, "reused, LIFO");
                    pool.free_all_blocks();
                    assert_eq!(pool.n_free_blocks(), 0);
                    let zero = pool.malloc(0).unwrap();
                    assert_eq!(zero.size(), 0);
                    drop((b, c));
                }
            }
        }
    };
}
