//! The rules of CuPy's `PinnedMemoryPool`, on any block type: sizes rounded to 512 bytes and then
//! up to a power of two, one free list per rounded size used last-in first-out, no splitting, no
//! arenas, no limit, no hooks; when the allocator is out of memory, the cache is released and the
//! allocation tried once more.
//!
//! The typed layer's `PinnedMemoryPool` lends what this cache holds; the blocks are whatever it
//! allocates (pinned buffers of a runtime), so this file knows no runtime.

use std::collections::HashMap;

use parking_lot::Mutex;

/// The size the pool allocates for a request of `size` bytes: rounded to 512 bytes, then up to a
/// power of two (CuPy's `clp2`: 1000 and 1024 both take 1024 bytes). `None` when that overflows.
#[must_use]
pub fn pinned_rounded_size(size: usize) -> Option<usize> {
    size.checked_add(511).map(|s| s / 512 * 512).and_then(usize::checked_next_power_of_two)
}

/// Free blocks by rounded size.
#[derive(Debug)]
pub struct PinnedCache<T> {
    free: Mutex<HashMap<usize, Vec<T>>>,
}

impl<T> Default for PinnedCache<T> {
    fn default() -> Self {
        PinnedCache { free: Mutex::new(HashMap::new()) }
    }
}

impl<T> PinnedCache<T> {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A block of `rounded` bytes: the one cached last, or a new one from `allocate`. When
    /// `allocate` fails with an error `is_out_of_memory` accepts, the cache is released (its
    /// blocks dropped, outside the lock) and `allocate` is tried once more.
    ///
    /// # Errors
    ///
    /// What `allocate` returns.
    pub fn lend<E>(
        &self,
        rounded: usize,
        mut allocate: impl FnMut(usize) -> Result<T, E>,
        is_out_of_memory: impl Fn(&E) -> bool,
    ) -> Result<T, E> {
        let cached = self.free.lock().get_mut(&rounded).and_then(Vec::pop);
        if let Some(block) = cached {
            return Ok(block);
        }
        match allocate(rounded) {
            Err(e) if is_out_of_memory(&e) => {
                drop(self.release());
                allocate(rounded)
            }
            other => other,
        }
    }

    /// Takes back a block of `rounded` bytes.
    pub fn give_back(&self, rounded: usize, block: T) {
        self.free.lock().entry(rounded).or_default().push(block);
    }

    /// Every cached block, removed from the cache (the caller drops them, outside the lock).
    #[must_use]
    pub fn release(&self) -> Vec<T> {
        std::mem::take(&mut *self.free.lock()).into_values().flatten().collect()
    }

    /// The number of cached blocks.
    #[must_use]
    pub fn n_free_blocks(&self) -> usize {
        self.free.lock().values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn sizes_round_to_512_then_a_power_of_two() {
        let cases =
            [(1, 512), (512, 512), (513, 1024), (1000, 1024), (1024, 1024), (1536, 2048), (4097, 8192)];
        for (size, rounded) in cases {
            assert_eq!(pinned_rounded_size(size), Some(rounded), "{size}");
        }
        assert_eq!(pinned_rounded_size(usize::MAX), None);
        assert_eq!(pinned_rounded_size(usize::MAX / 2 + 2), None);
    }

    #[test]
    fn free_lists_are_exact_size_and_last_in_first_out() {
        let cache = PinnedCache::new();
        let next = Cell::new(0);
        let allocate = |size: usize| -> Result<(usize, u32), ()> {
            next.set(next.get() + 1);
            Ok((size, next.get()))
        };
        let a = cache.lend(1024, allocate, |_| false).unwrap();
        let b = cache.lend(1024, allocate, |_| false).unwrap();
        cache.give_back(1024, a);
        cache.give_back(1024, b);
        assert_eq!(cache.n_free_blocks(), 2);
        assert_eq!(cache.lend(2048, allocate, |_| false).unwrap(), (2048, 3), "no block of another size");
        assert_eq!(cache.lend(1024, allocate, |_| false).unwrap(), b, "the last one given back first");
        assert_eq!(cache.lend(1024, allocate, |_| false).unwrap(), a);
        assert_eq!(cache.n_free_blocks(), 0);
        assert_eq!(next.get(), 3, "two of the four lends were cache hits");
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries_once() {
        let cache = PinnedCache::new();
        cache.give_back(512, "cached");
        let calls = Cell::new(0);
        // Fails while anything is cached (as a runtime with no room left would), then succeeds.
        let got = cache.lend(
            4096,
            |_| {
                calls.set(calls.get() + 1);
                if calls.get() == 1 {
                    Err("out of memory")
                } else {
                    Ok("new")
                }
            },
            |e| *e == "out of memory",
        );
        assert_eq!(got, Ok("new"));
        assert_eq!(calls.get(), 2);
        assert_eq!(cache.n_free_blocks(), 0, "the cache was released for the retry");

        // Other errors are not retried, and a second out-of-memory is returned.
        cache.give_back(512, "cached");
        let calls = Cell::new(0);
        let got = cache.lend(
            4096,
            |_| {
                calls.set(calls.get() + 1);
                Err::<&str, _>("out of memory")
            },
            |e| *e == "out of memory",
        );
        assert_eq!((got, calls.get()), (Err("out of memory"), 2));
        let calls = Cell::new(0);
        let got = cache.lend(
            4096,
            |_| {
                calls.set(calls.get() + 1);
                Err::<&str, _>("invalid")
            },
            |e| *e == "out of memory",
        );
        assert_eq!((got, calls.get()), (Err("invalid"), 1));
    }
}
