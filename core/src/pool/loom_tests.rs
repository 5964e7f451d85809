//! The arena lock under the loom model checker, which runs every interleaving of a few threads
//! (and every order the memory model allows) and reports a data race on loom's cells.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p gpumem-core --release --lib pool::loom_tests`
//! (`.ci/run`'s miri job does). Under `cfg(loom)` the lock's flag is loom's atomic (`sync.rs`);
//! the values the tests guard are loom cells, so an unlock that did not publish the critical
//! section's writes to the next holder would be reported as a race.
//!
//! - The lock itself: threads that lock, read, write and unlock (through `lock` and
//!   `lock_noting_contention`) never overlap and never lose a write.
//! - The lanes' hand-off of a free block: the block's owner writes it and frees it into its lane
//!   under that lane's lock while another lane's thread takes it out of that lane under the same
//!   lock (if it is there yet), puts it in its own lane under the other lock and uses it. The
//!   block ends in exactly one lane, and the bytes its previous owner wrote are seen by its next
//!   one without a race (only the first lane's lock orders the two). This
//!   is the pattern of `lanes.rs` (`take_over_from_lanes`: a whole free block leaves one arena's
//!   state under its lock and joins another's under that one's) on the real lock, with the
//!   arena states reduced to a list of blocks: the pool's own maps and reference counts are not
//!   loom's, so the pool itself cannot run under the model checker.

// loom's cells are read and written through raw pointers, as `sync.rs` reads the lock's value.
#![allow(unsafe_code)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use super::sync::ArenaLock;

/// Runs `f` under loom with at most three preemptions per interleaving: enough for every bug of
/// two or three threads around one lock that the literature reports, and a bound on the spinning
/// waits (each of which is a branch) that keeps the search finite.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.max_branches = 100_000;
    builder.check(f);
}

#[test]
fn the_lock_excludes_and_publishes_each_critical_section() {
    model(|| {
        let lock = Arc::new(ArenaLock::new(UnsafeCell::new(0u64)));
        let other = Arc::clone(&lock);
        let t = thread::spawn(move || {
            let (g, _contended) = other.lock_noting_contention();
            // SAFETY: the guard gives this thread the value alone.
            g.with_mut(|v| unsafe { *v += 1 });
        });
        {
            let g = lock.lock();
            // SAFETY: as above.
            g.with_mut(|v| unsafe { *v += 1 });
        }
        t.join().unwrap();
        let g = lock.lock();
        // SAFETY: as above; both threads are done.
        assert_eq!(g.with(|v| unsafe { *v }), 2);
    });
}

/// A free block: its bytes, which whoever owns it writes.
type Block = Arc<UnsafeCell<u64>>;

#[test]
fn a_block_handed_between_lanes_goes_to_one_thread_and_its_bytes_with_it() {
    model(|| {
        let lane_a: Arc<ArenaLock<Vec<Block>>> = Arc::new(ArenaLock::new(Vec::new()));
        let lane_b: Arc<ArenaLock<Vec<Block>>> = Arc::new(ArenaLock::new(Vec::new()));

        // The block's owner in lane A writes it and frees it into lane A.
        let a = Arc::clone(&lane_a);
        let owner = thread::spawn(move || {
            let block: Block = Arc::new(UnsafeCell::new(0));
            // SAFETY: the block is this thread's until it is freed into the lane below.
            block.with_mut(|b| unsafe { *b = 7 });
            a.lock().push(block);
        });

        // Lane B's thread misses and takes over lane A's free block, if it is there yet.
        let (a, b) = (Arc::clone(&lane_a), Arc::clone(&lane_b));
        let taker = thread::spawn(move || {
            let taken = a.lock().pop();
            let Some(block) = taken else { return false };
            b.lock().push(Arc::clone(&block));
            // SAFETY: the block left lane A under A's lock; only lane B's thread uses it now.
            block.with_mut(|v| unsafe {
                assert_eq!(*v, 7, "the previous owner's write was not seen");
                *v = 11;
            });
            true
        });

        owner.join().unwrap();
        let taken = taker.join().unwrap();
        let (in_a, in_b) = (lane_a.lock().len(), lane_b.lock().len());
        assert_eq!(
            (in_a, in_b),
            if taken { (0, 1) } else { (1, 0) },
            "the block was lost or is in both lanes"
        );
    });
}
