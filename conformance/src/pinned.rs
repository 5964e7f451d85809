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

                fn the_pinned_allocator_is_process_wide_and_resettable() {
                    use std::sync::atomic::{AtomicUsize, Ordering};
                    use std::sync::Arc;
                    type B = gpumem::DefaultBackend;
                    let _serial = $crate::pinned_allocator_lock();
                    let calls = Arc::new(AtomicUsize::new(0));
                    let c = calls.clone();
                    gpumem::core::set_pinned_memory_allocator::<B>(Some(Arc::new(move |size| {
                        c.fetch_add(1, Ordering::SeqCst);
                        PinnedMemoryPointer::alloc(size)
                    })));
                    let p = gpumem::core::alloc_pinned_memory::<B>(100).unwrap();
                    assert_eq!((p.size(), calls.load(Ordering::SeqCst)), (100, 1));
                    // gpumem's own staging goes through it: an asynchronous typed upload.
                    let s = Stream::non_blocking().unwrap();
                    let buf = gpumem::DeviceBuffer::<u32>::zeros(4).unwrap();
                    buf.copy_from_slice_async(&[1, 2, 3, 4], Some(&s)).unwrap();
                    s.synchronize().unwrap();
                    assert_eq!(calls.load(Ordering::SeqCst), 2);
                    assert_eq!(buf.to_vec().unwrap(), vec![1, 2, 3, 4]);

                    // None: unpooled pinned memory (CuPy's `_malloc`), 100 bytes exactly.
                    gpumem::core::set_pinned_memory_allocator::<B>(None);
                    assert_eq!(gpumem::core::alloc_pinned_memory::<B>(100).unwrap().size(), 100);
                    assert_eq!(calls.load(Ordering::SeqCst), 2);

                    // Reset: the default pinned pool again, which rounds to a power of two.
                    gpumem::core::reset_pinned_memory_allocator::<B>();
                    let pooled = gpumem::core::alloc_pinned_memory::<B>(1000).unwrap();
                    assert_eq!(pooled.size(), 1024);
                    assert_eq!(calls.load(Ordering::SeqCst), 2);
                }
            }
        }
    };
}
