//! Recording the loop: the allocations and frees of each iteration (between two `step()` calls),
//! in order, until two iterations in a row are the same; then what one iteration needs, as the
//! placement's items.

use super::super::ArenaKey;
use super::placement::Item;

/// The most events one iteration records; an iteration with more is not planned (its record is
/// dropped, so memory stays bounded when `step()` is called once and never again).
pub(crate) const MAX_EVENTS: usize = 1 << 20;

/// One event of an iteration, as two iterations are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// An allocation of `size` (rounded) bytes in arena `key`.
    Alloc { size: usize, key: ArenaKey },
    /// The free of the iteration's allocation number `index` (`earlier`: of the iteration before).
    Free { earlier: bool, index: u32 },
}

/// The events of one iteration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Iteration {
    pub(crate) events: Vec<Event>,
    /// Allocations so far.
    pub(crate) allocs: u32,
    /// More than [`MAX_EVENTS`] happened: the events were dropped.
    pub(crate) overflowed: bool,
}

impl Iteration {
    fn push(&mut self, event: Event) {
        if self.overflowed {
            return;
        }
        if self.events.len() == MAX_EVENTS {
            self.overflowed = true;
            self.events = Vec::new();
            return;
        }
        self.events.push(event);
    }

    /// Records an allocation; returns its number in the iteration.
    pub(crate) fn alloc(&mut self, size: usize, key: ArenaKey) -> u32 {
        let index = self.allocs;
        self.allocs = self.allocs.saturating_add(1);
        self.push(Event::Alloc { size, key });
        index
    }

    /// Records the free of allocation `index` of this iteration or (`earlier`) the one before.
    pub(crate) fn free(&mut self, earlier: bool, index: u32) {
        self.push(Event::Free { earlier, index });
    }

    /// Whether `next` repeats this iteration: the same allocations and frees in the same order.
    pub(crate) fn repeated_by(&self, next: &Iteration) -> bool {
        !self.overflowed && !next.overflowed && self.allocs > 0 && self.events == next.events
    }
}

/// One allocation of the iteration as the plan sees it: its size and arena, and its lifetime if
/// it is planned (`None`: it lives longer than the iteration after it, and the pool serves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) size: usize,
    pub(crate) key: ArenaKey,
    pub(crate) live: Option<[(u32, u32); 2]>,
}

/// What iteration `first` allocates, with lifetimes from its own frees and those of `then`, the
/// iteration after it (which repeats it): an allocation freed in `then` lives from its allocation
/// to the period's end and from the period's start to its free, if that free comes before its
/// allocation point (else it would meet itself, and it is not planned).
pub(crate) fn lifetimes(first: &Iteration, then: &Iteration) -> Vec<Planned> {
    let period = u32::try_from(first.events.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(first.allocs as usize);
    let mut born = Vec::with_capacity(first.allocs as usize);
    for (at, event) in first.events.iter().enumerate() {
        let at = at as u32;
        match *event {
            Event::Alloc { size, key } => {
                born.push(at);
                out.push(Planned { size, key, live: None });
            }
            Event::Free { earlier: false, index } => {
                if let (Some(p), Some(&from)) = (out.get_mut(index as usize), born.get(index as usize)) {
                    p.live = Some([(from, at), (0, 0)]);
                }
            }
            Event::Free { earlier: true, .. } => {}
        }
    }
    for (at, event) in then.events.iter().enumerate() {
        let at = at as u32;
        if let Event::Free { earlier: true, index } = *event {
            if let (Some(p), Some(&from)) = (out.get_mut(index as usize), born.get(index as usize)) {
                if p.live.is_none() && at <= from {
                    p.live = Some([(from, period), (0, at)]);
                }
            }
        }
    }
    out
}

/// The placement's items for the planned allocations of arena `key`, with their numbers in the
/// iteration.
pub(crate) fn items_of(allocs: &[Planned], key: ArenaKey) -> (Vec<usize>, Vec<Item>) {
    allocs
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let live = p.live?;
            (p.key == key).then_some((i, Item { size: p.size, live }))
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: ArenaKey = ArenaKey::NULL;

    #[test]
    fn frees_in_the_next_iteration_wrap_around_the_period() {
        let mut first = Iteration::default();
        let a = first.alloc(512, K);
        let b = first.alloc(1024, K);
        first.free(false, a);
        let mut then = Iteration::default();
        then.free(true, b);
        let c = then.alloc(512, K);
        let _ = then.alloc(1024, K);
        then.free(false, c);
        let allocs = lifetimes(&first, &then);
        assert_eq!(allocs[0].live, Some([(0, 2), (0, 0)]));
        assert_eq!(allocs[1].live, Some([(1, 3), (0, 0)]));
        assert!(!first.repeated_by(&then), "the frees differ");
    }

    #[test]
    fn an_allocation_that_outlives_the_next_iteration_is_not_planned() {
        let mut first = Iteration::default();
        first.alloc(512, K);
        let then = Iteration::default();
        assert_eq!(lifetimes(&first, &then)[0].live, None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "a million events: too slow under Miri")]
    fn an_iteration_past_the_event_bound_is_never_repeated() {
        let mut it = Iteration::default();
        for _ in 0..=MAX_EVENTS {
            it.free(false, 0);
        }
        assert!(it.overflowed && it.events.is_empty());
        assert!(!it.repeated_by(&it.clone()));
    }
}
