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
//! - this file: the planner's state and the pool's side of it (the plan's blocks, the hook
//!   into the pool's miss path, `step`).
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
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::hooks;

use super::sync::ArenaRef;
use super::{Arena, ArenaCache, ArenaKey, Pool, PooledMemory, RawAllocator};
use detect::Detector;
use record::Iteration;
use serve::Plan;

/// The tag bit of a chunk lent while its iteration is recorded (see `PooledMemory`'s tag): no
/// arena key plus one reaches it, so it tells a recorded chunk from a borrowed one.
pub(super) const RECORDED: u64 = 1 << 62;

/// With [`RECORDED`], the tag of a chunk lent while the detector watches for the loop's period:
/// its free tells the detector the bytes that came back.
const WATCHED: u64 = 1 << 61;

/// Where the planner stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PlanState {
    /// [`Pool::step`] was never called (or planning was reset): no planning.
    #[default]
    Off,
    /// [`Pool::plan_automatically`] was called: watching the allocations for the loop's period.
    Detecting,
    /// Recording iterations until two in a row are the same.
    Recording,
    /// A plan is in force.
    Planned,
}

/// What the planner did so far: [`Pool::plan_stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PlanStats {
    /// Where the planner stands.
    pub state: PlanState,
    /// Plans put in force.
    pub plans: u64,
    /// Allocations served from a plan.
    pub served: u64,
    /// Allocations that departed from a plan and went to the pool.
    pub departed: u64,
    /// The bytes of the plan's blocks (0 without a plan).
    pub plan_bytes: usize,
    /// The most bytes the planned allocations of one iteration have live at once (0 without a
    /// plan): what no placement could go below. `plan_bytes / planned_peak` is the plan's waste.
    pub planned_peak: usize,
    /// The allocations of one iteration, as [`Pool::plan_automatically`] found the loop's period
    /// (0 when none was found, or the steps come from [`Pool::step`]).
    pub period: usize,
    /// Periods found (each proposed to the planner; one that failed is followed by a longer one).
    pub periods_found: u64,
}

/// The planner of one pool. See the module docs.
#[derive(Default)]
pub(super) struct Planner {
    /// Whether `step` was called: allocations then go through the planner.
    on: AtomicBool,
    /// The most bytes in use at once at a recorded allocation's miss (see `hold_recorded_peak`).
    recorded_peak: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    mode: Mode,
    /// Iterations begun: the number in a recorded chunk's tag.
    iteration: u64,
    /// Which plan an installation is for.
    generation: u64,
    stats: PlanStats,
    /// Iteration boundaries found from the allocations ([`Pool::plan_automatically`]).
    auto: Option<Auto>,
}

/// Where the automatic boundaries stand.
#[derive(Debug, Default)]
struct Auto {
    /// The loop's period in allocations, once found (0 while detecting).
    period: usize,
    /// Allocations left in the current iteration.
    left: usize,
    /// The shortest period the detector may propose: twice a period that failed.
    min_period: usize,
    /// Recorded iterations in a row that did not repeat the one before.
    unmatched: u32,
    /// Iterations served from the current plan.
    planned: u32,
    /// Allocations watched so far, over every period looked for.
    watched: usize,
}

impl Auto {
    /// Whether an allocation that departs from the plan of this period is served as a recorded
    /// one (a free chunk or a block of its own size) rather than by the pool's rules: while the
    /// period is not yet proven, it may be a period of the loop's body, and what departs from it
    /// may outlive the loop (an optimizer's state, made in the first iteration); served by the
    /// pool's rules, it would pin a block that the loop's transient tensors then share. Counted
    /// with the watched allocations, under the same bound.
    fn departs_exactly(&mut self) -> bool {
        if self.planned >= PROVEN_AFTER {
            return false;
        }
        self.watched = self.watched.saturating_add(1);
        self.watched <= WATCHED_EXACTLY
    }

    /// The period failed (its iterations did not repeat, or departed from their plan early):
    /// watch again for a longer one.
    fn look_again(&mut self) -> Mode {
        // Twice as long: a run of one size (a temporary made and freed again and again) passes for
        // periods of every length up to the run's, and a multiple of the loop's period is a
        // period too, so doubling loses nothing and gets past the run in a few tries.
        self.min_period = self.period.saturating_mul(2).max(1);
        self.period = 0;
        self.unmatched = 0;
        self.planned = 0;
        Mode::Detecting(Box::new(Detector::new(self.min_period)))
    }
}

/// The allocations watched for a period that are served as recorded ones (a free chunk or a
/// block of their own size, so that what outlives the loop pins no block the plan frees); later
/// ones, of a program whose period is long in coming or never comes (shapes that vary), are
/// served by the pool, so the watching then costs a lock and a hash per allocation, not driver
/// calls.
const WATCHED_EXACTLY: usize = 1 << 15;

/// Recorded iterations in a row that may differ before an automatic period is given up.
const UNMATCHED_AFTER: u32 = 2;

/// Iterations a plan of an automatic period serves before its period counts as the loop's: a
/// later departure then means the loop changed, and any period may be found next. A period of
/// the loop's body (the layers of a network, a run of one size) serves as many iterations as the
/// body repeats inside one iteration and then departs; this many is past the layers of the
/// networks people train, so such a period is not found again at each iteration.
const PROVEN_AFTER: u32 = 64;

#[derive(Default)]
enum Mode {
    #[default]
    Off,
    /// Watching for the loop's period ([`Pool::plan_automatically`]).
    Detecting(Box<Detector>),
    Recording {
        before: Option<Iteration>,
        now: Iteration,
    },
    /// The plan's blocks are being allocated (without the planner's lock); allocations go to the
    /// pool meanwhile.
    Installing(Plan),
    Planned(Plan),
}

/// What the pool does for the planner at a step, outside its lock.
enum Action {
    Nothing,
    /// Allocate the plan's blocks.
    Install {
        generation: u64,
        blocks: Vec<(ArenaKey, usize)>,
    },
    /// The plan stays: put back a block `free_all_blocks` released; after the plan's first
    /// iteration (`settle`), give back the whole free blocks the recorded iterations left.
    Keep {
        blocks: Vec<(ArenaKey, usize)>,
        settle: bool,
    },
    /// Make the plan's blocks ordinary blocks of their arenas.
    Unplan(Vec<ArenaKey>),
}

/// How the planner has an allocation served.
enum Decision {
    Serve(usize),
    Record(u64),
    /// Watched by the detector (the chunk's tag): served as a recorded allocation is (`exact`),
    /// or by the pool.
    Watch {
        tag: u64,
        exact: bool,
    },
    /// An automatic iteration boundary comes before this allocation: step, then ask again.
    Boundary,
    /// The allocation departs from the plan: served by the pool, or as a recorded one (`exact`).
    Depart {
        exact: bool,
    },
    Pool,
}

impl Planner {
    /// Whether allocations go through the planner. One relaxed load: the cache hit's cost.
    #[inline(always)]
    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn on_malloc(&self, size: usize, key: ArenaKey) -> Decision {
        let mut st = self.state.lock();
        let iteration = st.iteration;
        let State { mode, auto, stats, .. } = &mut *st;
        if let Some(auto) = auto {
            if let Mode::Detecting(detector) = mode {
                return match detector.on_alloc(size, key) {
                    Some(period) => {
                        auto.period = period;
                        auto.left = period;
                        stats.period = period;
                        stats.periods_found += 1;
                        Decision::Boundary
                    }
                    None => {
                        auto.watched = auto.watched.saturating_add(1);
                        Decision::Watch { tag: RECORDED | WATCHED, exact: auto.watched <= WATCHED_EXACTLY }
                    }
                };
            }
            if auto.period > 0 {
                if auto.left == 0 {
                    auto.left = auto.period;
                    return Decision::Boundary;
                }
                auto.left -= 1;
            }
        }
        match mode {
            Mode::Recording { now, .. } => {
                let index = now.alloc(size, key);
                Decision::Record(RECORDED | (iteration & 0xFF_FFFF) << 32 | u64::from(index))
            }
            Mode::Planned(plan) => match plan.on_malloc(size, key) {
                Some(offset) => {
                    // Counted served now (one lock per allocation); `depart` takes it back.
                    stats.served += 1;
                    Decision::Serve(offset)
                }
                None => {
                    stats.departed += 1;
                    Decision::Depart { exact: auto.as_mut().is_some_and(Auto::departs_exactly) }
                }
            },
            Mode::Off | Mode::Installing(_) | Mode::Detecting(_) => Decision::Pool,
        }
    }

    /// The planned range `on_malloc` gave was not free: the pool serves the allocation, as a
    /// recorded one when this returns `true` (see [`Auto::departs_exactly`]).
    fn depart(&self) -> bool {
        let mut st = self.state.lock();
        st.stats.served = st.stats.served.saturating_sub(1);
        st.stats.departed += 1;
        if let Mode::Planned(plan) = &mut st.mode {
            plan.depart();
        }
        st.auto.as_mut().is_some_and(Auto::departs_exactly)
    }

    /// A recorded or watched chunk (its tag) of `size` bytes was freed.
    pub(super) fn on_free(&self, tag: u64, size: usize) {
        let mut st = self.state.lock();
        if tag & WATCHED != 0 {
            if let Mode::Detecting(detector) = &mut st.mode {
                detector.on_free(size);
            }
            return;
        }
        let now_iteration = st.iteration & 0xFF_FFFF;
        let (iteration, index) = ((tag >> 32) & 0xFF_FFFF, tag as u32);
        if let Mode::Recording { now, .. } = &mut st.mode {
            if iteration == now_iteration {
                now.free(false, index);
            } else if (iteration + 1) & 0xFF_FFFF == now_iteration {
                now.free(true, index);
            }
        }
    }

    fn step(&self) -> Action {
        let mut st = self.state.lock();
        st.iteration += 1;
        self.on.store(true, Ordering::Relaxed);
        let action = match std::mem::take(&mut st.mode) {
            Mode::Off | Mode::Detecting(_) => {
                st.mode = Mode::Recording { before: None, now: Iteration::default() };
                Action::Nothing
            }
            Mode::Recording { before, now } => {
                let compared = before.is_some();
                let plan = before
                    .filter(|b| b.repeated_by(&now))
                    .and_then(|b| Plan::new(&record::lifetimes(&b, &now)));
                match plan {
                    Some(plan) => {
                        st.generation += 1;
                        let blocks = plan.blocks.clone();
                        st.mode = Mode::Installing(plan);
                        Action::Install { generation: st.generation, blocks }
                    }
                    None => {
                        st.mode = Mode::Recording { before: Some(now), now: Iteration::default() };
                        if let Some(auto) = st.auto.as_mut().filter(|_| compared) {
                            auto.unmatched += 1;
                            if auto.unmatched >= UNMATCHED_AFTER {
                                st.mode = auto.look_again();
                            }
                        }
                        Action::Nothing
                    }
                }
            }
            Mode::Installing(plan) => {
                st.mode = Mode::Installing(plan);
                Action::Nothing
            }
            Mode::Planned(mut plan) => {
                if plan.end_iteration() {
                    let keys = plan.blocks.iter().map(|b| b.0).collect();
                    st.mode = match st.auto.as_mut() {
                        // A proven period: the loop changed, and its new period may be any.
                        Some(auto) if auto.planned >= PROVEN_AFTER => {
                            auto.period = 0;
                            auto.look_again()
                        }
                        Some(auto) => auto.look_again(),
                        None => Mode::Recording { before: None, now: Iteration::default() },
                    };
                    if matches!(st.mode, Mode::Detecting(_)) {
                        st.stats.period = 0;
                    }
                    Action::Unplan(keys)
                } else {
                    if let Some(auto) = st.auto.as_mut() {
                        auto.planned = auto.planned.saturating_add(1);
                    }
                    let settle = std::mem::replace(&mut plan.first_iteration, false);
                    let blocks = plan.blocks.clone();
                    st.mode = Mode::Planned(plan);
                    Action::Keep { blocks, settle }
                }
            }
        };
        st.stats.state = self.state_of(&st.mode);
        action
    }

    fn state_of(&self, mode: &Mode) -> PlanState {
        match mode {
            Mode::Off => PlanState::Off,
            Mode::Detecting(_) => PlanState::Detecting,
            Mode::Recording { .. } | Mode::Installing(_) => PlanState::Recording,
            Mode::Planned(_) => PlanState::Planned,
        }
    }

    /// The plan of `generation` has its blocks: it is in force, unless planning was reset or
    /// restarted meanwhile (then `false`: the caller unplans the blocks).
    fn installed(&self, generation: u64) -> bool {
        let mut st = self.state.lock();
        if st.generation != generation || !matches!(st.mode, Mode::Installing(_)) {
            return false;
        }
        let Mode::Installing(plan) = std::mem::take(&mut st.mode) else { unreachable!("matched above") };
        st.stats.plans += 1;
        st.stats.plan_bytes = plan.blocks.iter().map(|b| b.1).sum();
        st.stats.planned_peak = plan.most_live;
        st.mode = Mode::Planned(plan);
        st.stats.state = PlanState::Planned;
        true
    }

    /// The plan of `generation` could not get its blocks: record again.
    fn install_failed(&self, generation: u64) {
        let mut st = self.state.lock();
        if st.generation == generation && matches!(st.mode, Mode::Installing(_)) {
            st.mode = Mode::Recording { before: None, now: Iteration::default() };
            st.stats.state = PlanState::Recording;
        }
    }

    /// Turns automatic boundaries on (after [`Planner::reset`]): watch for the loop's period.
    fn start_auto(&self) {
        let mut st = self.state.lock();
        st.auto = Some(Auto { min_period: 1, ..Auto::default() });
        st.mode = Mode::Detecting(Box::new(Detector::new(1)));
        st.stats.state = PlanState::Detecting;
        self.on.store(true, Ordering::Relaxed);
    }

    /// Turns automatic boundaries off: the caller marks iterations with [`Pool::step`]. Returns
    /// whether they were on.
    fn stop_auto(&self) -> bool {
        let mut st = self.state.lock();
        let was = st.auto.take().is_some();
        if was {
            st.stats.period = 0;
            if matches!(st.mode, Mode::Detecting(_)) {
                st.mode = Mode::Off;
            }
        }
        was
    }

    /// Stops planning; returns the arenas of the plan dropped, if any.
    fn reset(&self) -> Vec<ArenaKey> {
        let mut st = self.state.lock();
        self.on.store(false, Ordering::Relaxed);
        st.generation += 1;
        st.stats.state = PlanState::Off;
        st.stats.plan_bytes = 0;
        st.stats.planned_peak = 0;
        st.stats.period = 0;
        st.auto = None;
        match std::mem::take(&mut st.mode) {
            Mode::Planned(plan) | Mode::Installing(plan) => plan.blocks.iter().map(|b| b.0).collect(),
            Mode::Off | Mode::Detecting(_) | Mode::Recording { .. } => Vec::new(),
        }
    }

    fn stats(&self) -> PlanStats {
        self.state.lock().stats
    }
}

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
            Action::Keep { blocks, settle } => {
                for &(key, size) in &blocks {
                    if settle {
                        self.release_whole_ordinary_blocks(key);
                    }
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
            self.release_whole_ordinary_blocks(key);
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

    /// Releases the whole free blocks of arena `key` other than its plan block, and with
    /// expandable segments the free tails of its growing blocks (as `free_all_blocks` does).
    fn release_whole_ordinary_blocks(&self, key: ArenaKey) {
        let arena = self.arena_in_map(key);
        let mut released = Vec::new();
        let bytes = {
            let mut st = arena.state.lock();
            let mut cut = 0;
            if self.expandable_segments() {
                let (allocator, granule) = (&self.shared.allocator, self.shared.allocator.granule().max(1));
                // A failed unmap keeps the tail: it stays cached and lendable.
                cut = st.shrink_tails(granule, |block, bytes| allocator.shrink(block, bytes).unwrap_or(0));
            }
            cut + st.release_free_blocks_of(0, &mut released) + st.release_free_blocks_of(1, &mut released)
        };
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
                if planner.depart() {
                    return self.lend_recorded(size, mem_size, key, cache, hooked);
                }
                self.lend_pooled(size, mem_size, key, cache, hooked)
            }
            Decision::Record(tag) => {
                let mut p = self.lend_recorded(size, mem_size, key, cache, hooked)?;
                p.mark_recorded(tag);
                Ok(p)
            }
            Decision::Watch { tag, exact } => {
                let mut p = if exact {
                    self.lend_recorded(size, mem_size, key, cache, hooked)?
                } else {
                    self.lend_pooled(size, mem_size, key, cache, hooked)?
                };
                p.mark_recorded(tag);
                Ok(p)
            }
            Decision::Boundary => {
                self.end_iteration()?;
                // The planner has counted the boundary: asked again, it decides the allocation.
                self.lend_planned(size, mem_size, key, cache, hooked)
            }
            Decision::Depart { exact: true } => self.lend_recorded(size, mem_size, key, cache, hooked),
            Decision::Depart { exact: false } | Decision::Pool => {
                self.lend_pooled(size, mem_size, key, cache, hooked)
            }
        }
    }
}
