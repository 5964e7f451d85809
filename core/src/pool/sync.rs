//! The two pieces of the pool's hot path that need `unsafe`, kept apart from the pool's logic.
//!
//! - [`ArenaLock`]: the arena's lock. A lock and an unlock of a futex mutex are two atomic
//!   read-modify-writes; this lock takes one to lock and a plain release store to unlock, which
//!   on the machines gpumem targets saves about a fifth of a cache hit. Arena critical sections are
//!   a few dozen instructions, so waiting threads spin briefly and then yield.
//! - [`ArenaRef`]: what a lent chunk holds to find its arena again. An `Arc` would cost an atomic
//!   increment per allocation and a decrement per free; instead the arena counts its lent chunks
//!   under its lock and is kept alive while that count is not zero (see [`ArenaRef`]'s
//!   invariant).

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A spin-then-yield lock around `T`.
pub(crate) struct ArenaLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives `&mut T` to one thread at a time (acquire on lock, release on unlock
// order every access), so `T: Send` suffices, as for `std::sync::Mutex`.
unsafe impl<T: Send> Send for ArenaLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for ArenaLock<T> {}

impl<T> ArenaLock<T> {
    pub(crate) fn new(value: T) -> Self {
        ArenaLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub(crate) fn lock(&self) -> ArenaGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        ArenaGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 64 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    // The holder may have been preempted: let it run.
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

/// Exclusive access to an [`ArenaLock`]'s value until dropped.
pub(crate) struct ArenaGuard<'a, T> {
    lock: &'a ArenaLock<T>,
}

impl<T> Deref for ArenaGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for ArenaGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while this thread holds the lock, and `&mut self` makes
        // this the only reference derived from it.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ArenaGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A lent chunk's pointer to its arena, without a reference count.
///
/// Invariant (upheld by the pool): an arena that has chunks lent out is always owned by at least
/// one `Arc` that nobody drops while the count of lent chunks, kept under the arena's lock, is
/// non-zero: the pool's map while the pool lives (an arena leaves the map only when it holds no
/// chunk at all), and after the pool is dropped, one `Arc` deliberately leaked by
/// [`ArenaRef::keep_alive`] and given back by [`ArenaRef::release_kept`] when the last chunk
/// returns.
pub(crate) struct ArenaRef<T>(NonNull<T>);

// SAFETY: `ArenaRef` is a shared reference in all but lifetime; the arena it points to is `Sync`.
unsafe impl<T: Sync> Send for ArenaRef<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for ArenaRef<T> {}

impl<T> ArenaRef<T> {
    /// A pointer to the arena `arc` owns; valid as long as the invariant above holds.
    pub(crate) fn new(arc: &Arc<T>) -> Self {
        ArenaRef(NonNull::from(&**arc))
    }

    /// The arena.
    #[inline]
    pub(crate) fn get(&self) -> &T {
        // SAFETY: this `ArenaRef` belongs to a lent chunk, and by the invariant the arena outlives
        // every lent chunk.
        unsafe { self.0.as_ref() }
    }

    /// Leaks one strong reference to `arc`, keeping the arena alive once its pool is gone.
    pub(crate) fn keep_alive(arc: &Arc<T>) {
        std::mem::forget(Arc::clone(arc));
    }

    /// Gives back the reference leaked by [`ArenaRef::keep_alive`]; the arena may be freed here.
    ///
    /// # Safety
    ///
    /// `keep_alive` was called for this arena and this is the one matching call (the last lent
    /// chunk just came back), and `self` is not used afterwards.
    pub(crate) unsafe fn release_kept(self) {
        // SAFETY: the pointer came from an `Arc<T>` whose count `keep_alive` raised by one; the
        // caller guarantees this is the matching decrement.
        unsafe { Arc::decrement_strong_count(self.0.as_ptr()) }
    }
}
