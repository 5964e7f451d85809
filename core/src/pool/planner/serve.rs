//! Serving an iteration from the plan: the n-th allocation of the iteration gets its planned
//! offset when it is the allocation the plan expects (its size and arena); anything else goes
//! to the pool and marks the iteration as departing; a loop that keeps departing is planned again.

use super::super::ArenaKey;
use super::placement;
use super::record::Planned;

/// A loop is recorded again after this many iterations in a row departed from its plan.
pub(crate) const REPLAN_AFTER: u32 = 2;

/// What the plan says of one allocation of the iteration.
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: usize,
    key: ArenaKey,
    /// Its offset in the plan block of arena `key`; `None` for an allocation that outlives the
    /// next iteration, which the pool serves by plan.
    offset: Option<usize>,
}

/// A plan in force. See the module docs.
#[derive(Debug)]
pub(crate) struct Plan {
    entries: Vec<Entry>,
    /// Each planned arena and the size of its plan block.
    pub(crate) blocks: Vec<(ArenaKey, usize)>,
    /// The most bytes the planned allocations have live at once, summed over the arenas.
    pub(crate) most_live: usize,
    /// Allocations so far in this iteration.
    next: usize,
    /// Whether this iteration departed from the plan.
    departed: bool,
    /// Iterations in a row that departed.
    departing: u32,
    /// Whether the step that ends the first iteration served from the plan is still to come.
    first_iteration: bool,
    /// Iterations in a row that departed from nothing.
    quiet: u32,
}

impl Plan {
    /// The plan of one iteration's allocations (see `record::lifetimes`): each arena's planned
    /// allocations placed into one block of their own. `None` when nothing can be planned.
    pub(crate) fn new(allocs: &[Planned]) -> Option<Plan> {
        let mut entries: Vec<Entry> =
            allocs.iter().map(|p| Entry { size: p.size, key: p.key, offset: None }).collect();
        let mut keys: Vec<ArenaKey> = allocs.iter().filter(|p| p.live.is_some()).map(|p| p.key).collect();
        keys.sort_unstable_by_key(|k| k.raw());
        keys.dedup();
        let mut blocks = Vec::with_capacity(keys.len());
        let mut most_live = 0usize;
        for key in keys {
            let (numbers, items) = super::record::items_of(allocs, key);
            let (offsets, peak) = placement::place(&items)?;
            for (n, offset) in numbers.into_iter().zip(offsets) {
                entries[n].offset = Some(offset);
            }
            most_live = most_live.saturating_add(placement::most_live(&items));
            blocks.push((key, peak));
        }
        if blocks.is_empty() {
            return None;
        }
        Some(Plan {
            entries,
            blocks,
            most_live,
            next: 0,
            departed: false,
            departing: 0,
            first_iteration: true,
            quiet: 0,
        })
    }

    /// The next allocation of the iteration, of `size` (rounded) bytes in arena `key`: its
    /// planned offset, or `None` for the pool (marking a departure unless the plan leaves that
    /// allocation to the pool).
    pub(crate) fn on_malloc(&mut self, size: usize, key: ArenaKey) -> Option<usize> {
        let entry = self.entries.get(self.next).copied();
        self.next += 1;
        match entry {
            Some(e) if e.size == size && e.key == key => e.offset,
            _ => {
                self.departed = true;
                None
            }
        }
    }

    /// The planned range of the last allocation was not free (a chunk lives longer than it did
    /// when the loop was recorded): the pool served it.
    pub(crate) fn depart(&mut self) {
        self.departed = true;
    }

    /// Ends an iteration; returns whether the loop should be recorded again (it departed from
    /// the plan [`REPLAN_AFTER`] times in a row).
    pub(crate) fn end_iteration(&mut self) -> bool {
        if self.next != self.entries.len() {
            self.departed = true;
        }
        self.departing = if self.departed { self.departing + 1 } else { 0 };
        self.next = 0;
        self.departed = false;
        self.departing >= REPLAN_AFTER
    }

    /// After [`Plan::end_iteration`] kept the plan: what the pool gives back of the whole free
    /// blocks outside the plan now. All of them at the end of the first iteration served from the
    /// plan (the recorded iterations' blocks, with free tails and pages); and at the end of every iteration that completes a
    /// run of at least [`GIVE_BACK_AFTER`] iterations in a row with no departure, those left free
    /// since the last iteration's end: such a loop lends from the pool only what the plan leaves
    /// to it (a result made before the last one is freed, say), and a block it did not lend
    /// again in a whole iteration, one that the program's own long-lived tensors or an earlier
    /// departure left free, is not needed. A loop that departs now and then keeps its blocks
    /// while it does, so they are not given back and asked for again every iteration; looking
    /// costs a pass over the plan's arenas' chunks once an iteration.
    pub(crate) fn gives_back(&mut self) -> GiveBack {
        let first = std::mem::replace(&mut self.first_iteration, false);
        self.quiet = if self.departing == 0 { self.quiet.saturating_add(1) } else { 0 };
        if first {
            GiveBack::All
        } else if self.quiet >= GIVE_BACK_AFTER {
            GiveBack::LeftFree
        } else {
            GiveBack::Nothing
        }
    }
}

/// What a planned pool gives back at an iteration's end ([`Plan::gives_back`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// Nothing: the loop departed from its plan lately, and may lend its blocks again.
    Nothing,
    /// Every whole free block outside the plan (the recorded iterations' blocks), and the free
    /// tails and pages of growing blocks.
    All,
    /// The whole free blocks outside the plan that were free at the last iteration's end too:
    /// those the loop did not lend again meanwhile (the pool does not watch a block between
    /// iteration ends: one lent and freed again in between counts as left free).
    LeftFree,
}

/// Iterations in a row with no departure after which a planned pool gives back the whole free
/// blocks outside its plan ([`Plan::gives_back`]).
pub(crate) const GIVE_BACK_AFTER: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    const K: ArenaKey = ArenaKey::NULL;

    fn planned(size: usize, from: u32, to: u32) -> Planned {
        Planned { size, key: K, live: Some([(from, to), (0, 0)]) }
    }

    #[test]
    fn blocks_are_given_back_after_the_first_iteration_and_once_the_loop_stops_departing() {
        let mut plan = Plan::new(&[planned(1024, 0, 1)]).unwrap();
        let mut iteration = |departs: bool| {
            assert_eq!(plan.on_malloc(1024, K), Some(0));
            if departs {
                assert_eq!(plan.on_malloc(4096, K), None);
            }
            assert!(!plan.end_iteration());
            plan.gives_back()
        };
        assert_eq!(iteration(true), GiveBack::All, "the first iteration's end, departures or not");
        assert_eq!(iteration(false), GiveBack::Nothing, "one quiet iteration");
        assert_eq!(iteration(false), GiveBack::LeftFree, "two in a row");
        assert_eq!(iteration(false), GiveBack::LeftFree, "and every one after");
        assert_eq!(
            iteration(true),
            GiveBack::Nothing,
            "not while the loop departs: its blocks would come back"
        );
        assert_eq!(iteration(false), GiveBack::Nothing);
        assert_eq!(iteration(false), GiveBack::LeftFree, "two quiet ones in a row again");
    }

    #[test]
    fn the_nth_allocation_of_its_size_gets_its_offset_and_others_depart() {
        let mut plan = Plan::new(&[planned(1024, 0, 3), planned(512, 1, 2)]).unwrap();
        assert_eq!(plan.blocks, vec![(K, 1536)]);
        assert_eq!(plan.on_malloc(1024, K), Some(0));
        assert_eq!(plan.on_malloc(512, K), Some(1024));
        assert!(!plan.end_iteration());
        assert_eq!(plan.on_malloc(2048, K), None, "a new size");
        assert!(!plan.end_iteration(), "one departing iteration is tolerated");
        assert_eq!(plan.on_malloc(1024, K), Some(0));
        assert!(plan.end_iteration(), "too few allocations: the second departure in a row");
    }

    #[test]
    fn allocations_left_to_the_pool_are_no_departure() {
        let long = Planned { size: 512, key: K, live: None };
        let mut plan = Plan::new(&[long, planned(512, 1, 2)]).unwrap();
        assert_eq!(plan.on_malloc(512, K), None);
        assert_eq!(plan.on_malloc(512, K), Some(0));
        assert!(!plan.end_iteration());
        assert!(Plan::new(&[long]).is_none(), "nothing to plan");
    }
}
