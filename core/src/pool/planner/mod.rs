//! A plan learned from the loop (STAlloc's idea, in a general pool): a training or serving loop
//! repeats its allocations, so once two iterations in a row have made the same allocations and
//! frees in the same order, the pool places every allocation of an iteration into one block
//! offline (lifetimes and sizes known) and serves the next iterations from it: the n-th
//! allocation gets its planned offset, with no raw call and no search.
//!
//! Iteration boundaries come from [`Pool::step`], or, after [`Pool::plan_automatically`], from
//! the allocations themselves (module `detect`); planning is off until one of them is called, and
//! a pool whose user calls neither works as before (one relaxed load on the cache hit).
//!
//! - `detect`: finding the loop's period when nobody calls `step`;
//! - `record`: the allocations and frees of each iteration, and the lifetimes of one iteration;
//! - `placement`: the offline placement of those lifetimes into one block;
//! - `serve`: which allocation of an iteration gets which offset, and when the loop departs;
//! - `state`: where the planner stands, what it decides for each allocation, and what it asks of
//!   the pool at each boundary;
//! - this file: the pool's side (the plan's blocks, the hook into the pool's miss path, `step`).
//!
//! Anything that departs from the plan (a new size, another order, an allocation past the plan,
//! a planned range still lent or behind a fence when it is needed again) is served by the pool as
//! if there were no plan: no error, nothing lost. The plan's block sits in the arena it was
//! planned for, as a raw block the pool counts, and its chunks go back to that arena as every
//! chunk does, so a planned range is lent again only in that arena's stream order, after any
//! fence it was freed behind. A loop that departs [`serve::REPLAN_AFTER`] times in a row is
//! recorded and planned again; its old plan block becomes an ordinary block of the pool.

mod detect;
mod placement;
mod record;
mod serve;
mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::hooks;

use super::sync::ArenaRef;
use super::{Arena, ArenaCache, ArenaKey, Pool, PooledMemory, RawAllocator};
use serve::GiveBack;
use state::{Action, Decision};
pub use state::{PlanState, PlanStats};
pub(super) use state::{Planner, RECORDED};

/// Whether `e` is a want of memory (the device's or the limit's), which a plan waits out.
fn is_out_of_memory(e: &Error) -> bool {
    e.is_out_of_memory() || matches!(e, Error::LimitExceeded { .. })
}

impl<R: RawAllocator> Pool<R> {
    /// Marks an iteration boundary of the loop that uses this pool (the end of a training step,
    /// of a batch served). The first call turns planning on: the pool records the allocations and
    /// frees of each iteration, and once two iterations in a row are the same, it places every
    /// allocation of an iteration into one raw block per arena and serves the next iterations
    /// from it, with no raw call and no search (see [`PlanStats`] for what it did). Anything that
    /// departs from the plan is served by the pool as without one; a loop that changes is
    /// planned again. [`Pool::reset_planning`] turns it off.
    ///
    /// # Errors
    ///
    /// The raw allocator's errors other than running out of memory while allocating a plan's
    /// block (then the plan is not put in force, and the loop is recorded again).
    pub fn step(&self) -> Result<()> {
        // Marked boundaries replace found ones.
        self.shared.planner.stop_auto();
        self.end_iteration()
    }

    /// Plans the loop with no [`Pool::step`] calls: the pool watches its allocations for the
    /// loop's period (the sizes and arenas of the last `2P` allocations are two equal halves, and
    /// the bytes they hold are back where they were a period before), then marks an iteration
    /// boundary every `P` allocations, and plans as `step()` would. A period that does not hold
    /// (its iterations differ, or depart from their plan at once) is given up for a longer one;
    /// a loop that changes after its plan served a few iterations is watched again. Drops a
    /// plan in force first. [`Pool::step`] turns the watching off (the caller's boundaries
    /// replace it); [`Pool::reset_planning`] turns planning off.
    ///
    /// While the pool watches, every allocation takes the miss path, and the first 32,768 are
    /// served as while it records (a free chunk or a block of its own size, so that what
    /// outlives the loop pins no block the plan would free): for those, the watching costs what
    /// recording costs, in driver calls and time. Later ones, of a loop whose period is long in
    /// coming or never comes (shapes that vary from one iteration to the next), are served by the
    /// pool as usual, at the cost of a lock and a hash each. [`PlanStats::period`] gives the
    /// period found.
    pub fn plan_automatically(&self) {
        let keys = self.shared.planner.reset();
        self.unplan(&keys);
        self.shared.planner.start_auto();
    }

    /// Ends an iteration: at [`Pool::step`], or at a boundary found from the allocations.
    fn end_iteration(&self) -> Result<()> {
        hooks::observe(hooks::Observed::Step { device_id: self.shared.device }, 0);
        match self.shared.planner.step() {
            Action::Nothing => Ok(()),
            Action::Install { generation, blocks } => self.install_plan(generation, &blocks),
            Action::Keep { blocks, give_back } => {
                for &(key, size) in &blocks {
                    self.give_back_ordinary_blocks(key, give_back);
                    if self.arena_in_map(key).state.lock().plan_block().is_none() {
                        // `free_all_blocks` released it while it was all free. Without memory
                        // for it now, the iterations depart until a step finds memory.
                        match self.add_plan_block(key, size) {
                            Err(e) if !is_out_of_memory(&e) => return Err(e),
                            _ => {}
                        }
                    }
                }
                Ok(())
            }
            Action::Unplan(keys) => {
                self.unplan(&keys);
                Ok(())
            }
        }
    }

    /// Stops planning and drops the plan: its blocks become ordinary blocks of the pool (released
    /// at once if all free, else cached as any block and released by `free_all_blocks` once
    /// their chunks are back). [`Pool::step`] starts planning again.
    pub fn reset_planning(&self) {
        let keys = self.shared.planner.reset();
        self.unplan(&keys);
    }

    /// What the planner did so far.
    #[must_use]
    pub fn plan_stats(&self) -> PlanStats {
        self.shared.planner.stats()
    }

    fn install_plan(&self, generation: u64, blocks: &[(ArenaKey, usize)]) -> Result<()> {
        let mut done = Vec::with_capacity(blocks.len());
        for &(key, size) in blocks {
            // The recorded iterations' cached blocks give way to the plan's.
            self.give_back_ordinary_blocks(key, GiveBack::All);
            match self.add_plan_block(key, size) {
                Ok(()) => done.push(key),
                Err(e) => {
                    self.shared.planner.install_failed(generation);
                    self.unplan(&done);
                    return if is_out_of_memory(&e) { Ok(()) } else { Err(e) };
                }
            }
        }
        if !self.shared.planner.installed(generation) {
            self.unplan(&done);
        }
        Ok(())
    }

    /// Allocates a plan block of `size` bytes for arena `key` (through the limit and the retry
    /// ladder, as a miss does).
    fn add_plan_block(&self, key: ArenaKey, size: usize) -> Result<()> {
        let mut block = Some(self.reserve_and_allocate(size, key, hooks::active())?);
        loop {
            let arena = self.arena_in_map(key);
            let mut st = arena.state.lock();
            if st.retired {
                continue;
            }
            let Some(block) = block.take() else { unreachable!("the block is added once") };
            let old = st.add_plan_block(block, size);
            drop(st);
            self.free_released(key, old);
            return Ok(());
        }
    }

    /// Makes the plan blocks of arenas `keys` ordinary blocks (freeing those all free).
    fn unplan(&self, keys: &[ArenaKey]) {
        for &key in keys {
            let arena = self.arena_in_map(key);
            let released = arena.state.lock().unplan();
            self.free_released(key, released);
        }
    }

    /// Frees a block an arena released (outside its lock), counting it off the pool's bytes.
    fn free_released(&self, key: ArenaKey, released: Option<(R::Block, usize)>) {
        if let Some((block, size)) = released {
            self.shared.total_bytes.fetch_sub(size, Ordering::Relaxed);
            self.observe_raw_frees(key, std::slice::from_ref(&block));
            drop(block);
        }
    }

    /// Gives back what `what` says of arena `key`'s whole free blocks other than its plan block
    /// ([`GiveBack`]); with `All`, also the free tails of its growing blocks (expandable
    /// segments) and the pages under their other free chunks (stitching), as `free_all_blocks`
    /// does. A loop's later iterations give back whole blocks only: a tail or a page free at an
    /// iteration's end may be one the loop uses again before the next, and unmapping it would
    /// have it mapped again, each a wait for the device and driver calls.
    fn give_back_ordinary_blocks(&self, key: ArenaKey, what: GiveBack) {
        let arena = self.arena_in_map(key);
        let mut released = Vec::new();
        let bytes = {
            let mut st = arena.state.lock();
            match what {
                GiveBack::Nothing => {
                    // Departures may lend any block: the next look starts afresh.
                    st.forget_blocks_left_free();
                    return;
                }
                GiveBack::All => {
                    st.forget_blocks_left_free();
                    let bytes = self.shrink_free_tails(&mut st)
                        + st.release_free_blocks_of(0, &mut released)
                        + st.release_free_blocks_of(1, &mut released);
                    // Stitching: the pages under the free chunks left go too (counted off the
                    // total as they are lifted); the plan's block keeps its pages.
                    self.lift_all(&mut st);
                    bytes
                }
                GiveBack::LeftFree => st.release_blocks_left_free(&mut released),
            }
        };
        self.shared.allocator.drop_lifted_pages();
        self.shared.total_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.observe_raw_frees(key, &released);
        drop(released);
    }

    /// `mem_size` bytes (a request of `size`) at `offset` of arena `key`'s plan block, if that
    /// range is free: through the thread's arena cache as the cache hit goes, else the pool's map.
    fn lend_at(
        &self,
        offset: usize,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
    ) -> Option<PooledMemory<R>> {
        let lend = |arena: &ArenaRef<Arena<R>>| {
            let mut st = arena.get().state.lock();
            if st.retired {
                return None;
            }
            let lent = st.lend_planned(offset, mem_size, size)?;
            drop(st);
            Some(PooledMemory::lent(arena, lent, mem_size))
        };
        match cache.with::<Arena<R>, _>(self.shared.uid, key, lend) {
            Some(Some(p)) => Some(p),
            _ => lend(&ArenaRef::new(&self.arena(key, cache))),
        }
    }

    /// An allocation of an iteration being recorded: a free chunk of its exact size, else a raw
    /// block of its exact size. What outlives the loop (an optimizer's state, made in its first
    /// step) then pins no block that the loop's transient tensors shared, and once the plan is
    /// in force, the recorded iterations' blocks come back whole and are released: the pool then
    /// holds the plan's block and the long-lived tensors' own. (A miss that fails goes to the
    /// pool's own ladder; with expandable segments the pool's rules apply, since their blocks
    /// grow in granules.)
    fn lend_recorded(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
        hooked: bool,
    ) -> Result<PooledMemory<R>> {
        let mut block_len = mem_size;
        if self.expandable_segments() {
            // Blocks map whole granules: small requests share the growing block as the pool's
            // rules have it; large ones get blocks of their own, in whole granules.
            let granule = self.shared.allocator.granule().max(1);
            if mem_size <= super::policy::SMALL_REQUEST {
                return self.lend_pooled(size, mem_size, key, cache, hooked);
            }
            block_len = match mem_size.checked_next_multiple_of(granule) {
                Some(len) => len,
                None => return self.lend_pooled(size, mem_size, key, cache, hooked),
            };
        }
        self.collect_fenced(false);
        let arena = self.arena(key, cache);
        let lent = arena.state.lock().take_within(mem_size, block_len, size);
        if let Some(lent) = lent {
            return Ok(PooledMemory::lent(&ArenaRef::new(&arena), lent, mem_size));
        }
        drop(arena);
        self.hold_recorded_peak(block_len);
        let block = match self.reserve_and_allocate(block_len, key, hooked) {
            Ok(block) => block,
            Err(e) if is_out_of_memory(&e) => return self.lend_pooled(size, mem_size, key, cache, hooked),
            Err(e) => return Err(e),
        };
        Ok(self.lend_from_new_block(block, block_len, size, mem_size, key, cache))
    }

    /// Before a new block of `block_len` bytes while recording: the pool holds no more than the
    /// most bytes in use at once so far (`HoldPeakInUse`'s rule), releasing cached whole blocks,
    /// largest first, for that. Exact blocks shared by no two sizes would otherwise pile up over
    /// the recorded iterations (a block per size at its most live), and the pool's peak would be
    /// theirs, not the loop's.
    fn hold_recorded_peak(&self, block_len: usize) {
        let in_use = self.used_bytes().saturating_add(block_len);
        let peak = self.shared.planner.recorded_peak.fetch_max(in_use, Ordering::Relaxed).max(in_use);
        let excess = self.total_bytes().saturating_add(block_len).saturating_sub(peak);
        if excess > 0 {
            self.release_cached(excess);
        }
    }

    /// A miss while planning is on (see [`Planner::is_on`]): served from the plan, or by the pool
    /// (`lend_pooled`), recorded if the iteration is being recorded.
    #[cold]
    pub(super) fn lend_planned(
        &self,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
        hooked: bool,
    ) -> Result<PooledMemory<R>> {
        let planner = &self.shared.planner;
        match planner.on_malloc(mem_size, key) {
            Decision::Serve(offset) => {
                if let Some(p) = self.lend_at(offset, size, mem_size, key, cache) {
                    return Ok(p);
                }
                // The range may be behind a fence that has completed.
                if self.shared.any_fenced.load(Ordering::Acquire) {
                    self.collect_fenced(false);
                    if let Some(p) = self.lend_at(offset, size, mem_size, key, cache) {
                        return Ok(p);
                    }
                }
                let exact = planner.depart();
                self.lend_exactly_or_pooled(exact, size, mem_size, key, cache, hooked)
            }
            Decision::Record(tag) => {
                let mut p = self.lend_recorded(size, mem_size, key, cache, hooked)?;
                p.mark_recorded(tag);
                Ok(p)
            }
            Decision::Watch { tag, exact } => {
                let mut p = self.lend_exactly_or_pooled(exact, size, mem_size, key, cache, hooked)?;
                p.mark_recorded(tag);
                Ok(p)
            }
            Decision::Boundary => {
                self.end_iteration()?;
                // The planner has counted the boundary: asked again, it decides the allocation.
                self.lend_planned(size, mem_size, key, cache, hooked)
            }
            Decision::Depart { exact } => {
                self.lend_exactly_or_pooled(exact, size, mem_size, key, cache, hooked)
            }
            Decision::Pool => self.lend_pooled(size, mem_size, key, cache, hooked),
        }
    }

    /// Serves an allocation as a recorded one (`exact`: a free chunk or a block of its own size)
    /// or by the pool's rules.
    fn lend_exactly_or_pooled(
        &self,
        exact: bool,
        size: usize,
        mem_size: usize,
        key: ArenaKey,
        cache: &ArenaCache,
        hooked: bool,
    ) -> Result<PooledMemory<R>> {
        if exact {
            self.lend_recorded(size, mem_size, key, cache, hooked)
        } else {
            self.lend_pooled(size, mem_size, key, cache, hooked)
        }
    }
}
