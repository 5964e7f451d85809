//! The planner's state: where it stands (off, watching for the loop's period, recording,
//! planned), what it decides for each allocation, and what it asks the pool to do at each
//! iteration boundary. The pool's side (the plan's blocks, the miss path) is the module above.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::super::ArenaKey;
#[cfg(doc)]
use super::super::Pool;
use super::detect::Detector;
use super::record::{self, Iteration};
use super::serve::{GiveBack, Plan};

/// The tag bit of a chunk lent while its iteration is recorded (see `PooledMemory`'s tag): no
/// arena key plus one reaches it, so it tells a recorded chunk from a borrowed one.
pub(in crate::pool) const RECORDED: u64 = 1 << 62;

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
pub(in crate::pool) struct Planner {
    /// Whether `step` was called: allocations then go through the planner.
    on: AtomicBool,
    /// The most bytes in use at once at a recorded allocation's miss (see `hold_recorded_peak`).
    pub(super) recorded_peak: AtomicUsize,
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
        self.planned < PROVEN_AFTER && self.watch_exactly()
    }

    /// Counts one more watched allocation; returns whether it is served as a recorded one
    /// (within [`WATCHED_EXACTLY`]).
    fn watch_exactly(&mut self) -> bool {
        self.watched = self.watched.saturating_add(1);
        self.watched <= WATCHED_EXACTLY
    }

    /// The period failed (its iterations did not repeat, or departed from their plan early):
    /// watch again for a longer one.
    fn look_again(&mut self) -> Mode {
        // Twice as long: a run of one size (a temporary made and freed again and again) passes for
        // periods of every length up to the run's, and a multiple of the loop's period is a
        // period too, so doubling loses nothing and gets past the run in a few tries.
        let min_period = self.period.saturating_mul(2);
        self.period = 0;
        self.unmatched = 0;
        self.planned = 0;
        Mode::Detecting(Box::new(Detector::new(min_period)))
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
pub(super) const PROVEN_AFTER: u32 = 64;

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
pub(super) enum Action {
    Nothing,
    /// Allocate the plan's blocks.
    Install {
        generation: u64,
        blocks: Vec<(ArenaKey, usize)>,
    },
    /// The plan stays: put back a block `free_all_blocks` released; when `give_back`, give back
    /// the whole free blocks outside the plan ([`Plan::gives_back`]).
    Keep {
        blocks: Vec<(ArenaKey, usize)>,
        give_back: GiveBack,
    },
    /// Make the plan's blocks ordinary blocks of their arenas.
    Unplan(Vec<ArenaKey>),
}

/// How the planner has an allocation served.
pub(super) enum Decision {
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
    pub(in crate::pool) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(super) fn on_malloc(&self, size: usize, key: ArenaKey) -> Decision {
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
                    None => Decision::Watch { tag: RECORDED | WATCHED, exact: auto.watch_exactly() },
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
    pub(super) fn depart(&self) -> bool {
        let mut st = self.state.lock();
        st.stats.served = st.stats.served.saturating_sub(1);
        st.stats.departed += 1;
        if let Mode::Planned(plan) = &mut st.mode {
            plan.depart();
        }
        st.auto.as_mut().is_some_and(Auto::departs_exactly)
    }

    /// A recorded or watched chunk (its tag) of `size` bytes was freed.
    pub(in crate::pool) fn on_free(&self, tag: u64, size: usize) {
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

    pub(super) fn step(&self) -> Action {
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
                    let give_back = plan.gives_back();
                    let blocks = plan.blocks.clone();
                    st.mode = Mode::Planned(plan);
                    Action::Keep { blocks, give_back }
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
    pub(super) fn installed(&self, generation: u64) -> bool {
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
    pub(super) fn install_failed(&self, generation: u64) {
        let mut st = self.state.lock();
        if st.generation == generation && matches!(st.mode, Mode::Installing(_)) {
            st.mode = Mode::Recording { before: None, now: Iteration::default() };
            st.stats.state = PlanState::Recording;
        }
    }

    /// Turns automatic boundaries on (after [`Planner::reset`]): watch for the loop's period.
    pub(super) fn start_auto(&self) {
        let mut st = self.state.lock();
        st.auto = Some(Auto::default());
        st.mode = Mode::Detecting(Box::new(Detector::new(1)));
        st.stats.state = PlanState::Detecting;
        self.on.store(true, Ordering::Relaxed);
    }

    /// Turns automatic boundaries off: the caller marks iterations with [`Pool::step`].
    pub(super) fn stop_auto(&self) {
        let mut st = self.state.lock();
        if st.auto.take().is_some() {
            st.stats.period = 0;
            if matches!(st.mode, Mode::Detecting(_)) {
                st.mode = Mode::Off;
            }
        }
    }

    /// Stops planning; returns the arenas of the plan dropped, if any.
    pub(super) fn reset(&self) -> Vec<ArenaKey> {
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

    pub(super) fn stats(&self) -> PlanStats {
        self.state.lock().stats
    }
}
