//! Synchronous copies of pageable host memory staged through pinned buffers: exact bytes at every
//! size, offset and chunk remainder, on several threads at once, ordered after queued work on the
//! same bytes, and chosen only from the threshold up.

/// The `staging` tests, for [`suite!`](crate::suite).
#[macro_export]
#[doc(hidden)]
macro_rules! __staging_tests {
    ($flavor:ident) => {
        mod staging {
            use super::gpumem;
            use $crate::$flavor as conformance;

            use std::time::Duration;

            use gpumem::{DeviceBuffer, Memory, MemoryPointer, PageableStaging, Stream};

            /// Every copy staged, in chunks of 1000 bytes (so sizes fall between chunks), on up to
            /// 3 lanes (so helper threads run even for small copies).
            fn forced() -> PageableStaging {
                PageableStaging::from_size(0).with_chunk(1000).unwrap().with_lanes(3).unwrap()
            }

            fn staged() -> u64 {
                PageableStaging::counts_on_this_thread().staged
            }

            fn pattern(n: usize, seed: u32) -> Vec<u8> {
                (0..n as u32).map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8).collect()
            }

            fn own_memory(n: usize) -> MemoryPointer {
                MemoryPointer::from_memory(Memory::new(n).unwrap())
            }

            /// The whole memory read back without staging.
            fn read_direct(p: &MemoryPointer, n: usize) -> Vec<u8> {
                let _direct = PageableStaging::off().enter();
                $crate::read(p, n)
            }

            /// Queues a host function that keeps `s` busy for `ms` milliseconds.
            fn busy(s: &Stream, ms: u64) {
                s.launch_host_func(move || std::thread::sleep(Duration::from_millis(ms))).unwrap();
            }

            conformance! {
                fn staged_copies_are_exact_at_odd_sizes_chunk_remainders_and_offsets() {
                    let _scope = forced().enter();
                    for size in [1usize, 999, 1000, 1001, 2999, 4093, 10_007] {
                        for offset in [0isize, 1, 513] {
                            let total = size + offset as usize + 17;
                            let base = own_memory(total);
                            {
                                let _direct = PageableStaging::off().enter();
                                base.memset(0xEE, total).unwrap();
                            }
                            let p = &base + offset;
                            let data = pattern(size + 5, size as u32);
                            let before = staged();
                            // Only `size` bytes of the longer slice go.
                            p.copy_from_host(&data, size).unwrap();
                            assert_eq!(staged() - before, 1, "the copy was not staged");
                            let all = read_direct(&base, total);
                            let off = offset as usize;
                            assert!(all[..off].iter().all(|&b| b == 0xEE), "bytes before the copy changed ({size}, {offset})");
                            assert!(all[off..off + size] == data[..size], "wrong bytes ({size}, {offset})");
                            assert!(all[off + size..].iter().all(|&b| b == 0xEE), "bytes past the copy changed ({size}, {offset})");

                            let mut back = vec![0x5Au8; size + 9];
                            p.copy_to_host(&mut back, size).unwrap();
                            assert_eq!(staged() - before, 2, "the copy back was not staged");
                            assert!(back[..size] == data[..size], "wrong bytes back ({size}, {offset})");
                            assert!(back[size..].iter().all(|&b| b == 0x5A), "host bytes past the copy changed");
                        }
                    }
                }

                fn device_buffers_and_their_slices_stage_too() {
                    let _scope = forced().enter();
                    let values: Vec<u32> = (0..3001u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
                    let before = staged();
                    let buf = DeviceBuffer::<u32>::from_slice(&values).unwrap();
                    assert!(buf.to_vec().unwrap() == values, "wrong elements back");
                    let tail = buf.slice(7..2600).unwrap();
                    let fresh: Vec<u32> = (0..2593u32).map(|i| !i).collect();
                    tail.copy_from_slice(&fresh).unwrap();
                    let mut out = vec![0u32; 2593];
                    tail.copy_to_slice(&mut out).unwrap();
                    assert!(out == fresh, "wrong elements of the slice back");
                    let all = buf.to_vec().unwrap();
                    assert!(all[..7] == values[..7], "elements before the slice changed");
                    assert!(all[7..2600] == fresh[..], "wrong elements in the slice");
                    assert!(all[2600..] == values[2600..], "elements after the slice changed");
                    assert_eq!(staged() - before, 5);
                }

                fn staged_copies_on_several_threads_at_once_keep_their_own_bytes() {
                    let threads: Vec<_> = (0..4u32)
                        .map(|t| {
                            std::thread::spawn(move || {
                                let _scope = forced().enter();
                                let n = 7_001 + t as usize * 333;
                                let p = own_memory(n);
                                for round in 0..3 {
                                    let data = pattern(n, t * 10 + round);
                                    p.copy_from_host(&data, n).unwrap();
                                    let mut back = vec![0u8; n];
                                    p.copy_to_host(&mut back, n).unwrap();
                                    assert!(back == data, "thread {t} round {round}: wrong bytes");
                                }
                                assert_eq!(staged(), 6);
                            })
                        })
                        .collect();
                    for t in threads {
                        t.join().unwrap();
                    }
                }

                fn a_staged_read_waits_for_queued_work_on_the_same_bytes() {
                    let _scope = forced().enter();
                    let side = Stream::non_blocking().unwrap();
                    let n = 4093;
                    let p = own_memory(n);
                    p.memset(1, n).unwrap();
                    busy(&side, 100);
                    p.memset_async(2, n, Some(&side)).unwrap();
                    let mut back = vec![0u8; n];
                    // No synchronize: the staged read waits for the memset queued on `side`.
                    p.copy_to_host(&mut back, n).unwrap();
                    assert!(back.iter().all(|&b| b == 2), "the read ran before the queued memset");
                }

                fn a_staged_write_lands_after_queued_work_on_the_same_bytes() {
                    let _scope = forced().enter();
                    let side = Stream::non_blocking().unwrap();
                    let n = 4093;
                    let p = own_memory(n);
                    busy(&side, 100);
                    p.memset_async(2, n, Some(&side)).unwrap();
                    let data = pattern(n, 3);
                    // The queued memset runs first; the staged copy overwrites it.
                    p.copy_from_host(&data, n).unwrap();
                    side.synchronize().unwrap();
                    assert!(read_direct(&p, n) == data, "the queued memset ran over the copy");
                }

                fn copies_are_staged_from_the_threshold_up_and_never_when_off() {
                    let p = own_memory(8192);
                    let data = pattern(8192, 9);
                    let mut back = vec![0u8; 8192];
                    {
                        let _scope = PageableStaging::from_size(4096).with_chunk(1000).unwrap().enter();
                        let before = staged();
                        p.copy_from_host(&data, 4095).unwrap();
                        assert_eq!(staged(), before, "a copy below the threshold was staged");
                        p.copy_from_host(&data, 4096).unwrap();
                        p.copy_from_host(&data, 8192).unwrap();
                        p.copy_to_host(&mut back, 8192).unwrap();
                        assert_eq!(staged() - before, 3);
                        assert!(back == data, "wrong bytes back");
                    }
                    {
                        let _scope = PageableStaging::off().enter();
                        let before = staged();
                        p.copy_from_host(&data, 8192).unwrap();
                        p.copy_to_host(&mut back, 8192).unwrap();
                        assert_eq!(staged(), before, "a copy was staged with staging off");
                    }
                    // Outside every scope: whatever the process, the variable or the backend says.
                    let current = PageableStaging::current::<gpumem::DefaultBackend>().unwrap();
                    if current.threshold().is_none_or(|t| t > 8192) {
                        let before = staged();
                        p.copy_to_host(&mut back, 8192).unwrap();
                        assert_eq!(staged(), before);
                    }
                    // A pinned source is never staged.
                    let pinned = gpumem::PinnedMemoryPointer::alloc(8192).unwrap();
                    pinned.write(&data).unwrap();
                    let _scope = forced().enter();
                    let before = staged();
                    p.copy_from(&pinned, 8192).unwrap();
                    assert_eq!(staged(), before, "a copy from pinned memory was staged");
                    assert!(read_direct(&p, 8192) == data, "wrong bytes from pinned memory");
                }
            }
        }
    };
}
