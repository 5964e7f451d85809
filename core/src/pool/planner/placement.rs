//! The offline plan: where each allocation of one iteration goes in one block, its size and its
//! lifetime known (dynamic storage allocation, solved greedily).
//!
//! The allocations are placed largest first (longer lifetimes first among equal sizes), each at
//! the lowest offset where it overlaps, in both address and time, none placed before it: the
//! greedy-by-size rule of offline tensor placement (Pisarchyk and Lee, 2020), which STAlloc's
//! planner also starts from. Large tensors, placed first, take the bottom of the block; the
//! small ones fill the holes between them. A lifetime may wrap around the iteration's end (a
//! gradient made in one step and freed in the next): it is then two intervals of the period.

/// One allocation to place: its size (a multiple of the pool's unit) and when it is live, as up
/// to two half-open intervals of event positions in the iteration (`(0, 0)` for no second one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub(crate) size: usize,
    pub(crate) live: [(u32, u32); 2],
}

impl Item {
    /// Whether `self` and `other` are live at one moment.
    fn meets(&self, other: &Item) -> bool {
        self.live
            .iter()
            .any(|&(a0, a1)| a0 < a1 && other.live.iter().any(|&(b0, b1)| b0 < b1 && a0 < b1 && b0 < a1))
    }

    /// For how many positions it is live.
    fn span(&self) -> u32 {
        self.live.iter().map(|&(a, b)| b.saturating_sub(a)).sum()
    }
}

/// The orders the items are placed in: each is tried, and the placement with the smallest
/// block kept (the greedy rules each lose on some loops: largest first leaves holes under long
/// small tensors, longest first under short large ones).
#[derive(Clone, Copy, Debug)]
enum Order {
    /// Largest first, longer lifetimes first among equal sizes.
    Size,
    /// Longest lifetime first, larger first among equal lifetimes.
    Span,
    /// By size times lifetime, largest first.
    Area,
    /// By when they are made (an allocator that knows no future, but every hole of the past).
    Start,
}

/// Where an item goes among the ranges taken while it is live.
#[derive(Clone, Copy, Debug)]
enum Gap {
    /// The lowest offset where it fits.
    Lowest,
    /// The smallest hole where it fits (else the top).
    Tightest,
}

/// The offsets of `items` (in their order) and the block size that holds them all: the best of
/// the greedy placements, each then retried with the items that reach its top placed first (a
/// few rounds, while that lowers the top); `None` when a sum overflows.
pub(crate) fn place(items: &[Item]) -> Option<(Vec<usize>, usize)> {
    let mut best: Option<(Vec<usize>, usize)> = None;
    for order in [Order::Size, Order::Span, Order::Area, Order::Start] {
        for gap in [Gap::Lowest, Gap::Tightest] {
            let mut sorted = sorted(items, order);
            for _ in 0..REFINE_ROUNDS {
                let (offsets, peak) = place_in(items, &sorted, gap)?;
                let better = best.as_ref().is_none_or(|b| peak < b.1);
                // The items at the top first, the rest in the order they had.
                sorted.sort_by_key(|&i| offsets[i] + items[i].size != peak);
                if !better {
                    break;
                }
                best = Some((offsets, peak));
            }
        }
    }
    best
}

/// How many times a placement is retried with its top items first.
const REFINE_ROUNDS: usize = 4;

/// The items' numbers in `order`.
fn sorted(items: &[Item], order: Order) -> Vec<usize> {
    let mut sorted: Vec<usize> = (0..items.len()).collect();
    let area = |i: &Item| i.size as u128 * u128::from(i.span());
    sorted.sort_by(|&a, &b| {
        let (x, y) = (&items[a], &items[b]);
        match order {
            Order::Size => y.size.cmp(&x.size).then(y.span().cmp(&x.span())),
            Order::Span => y.span().cmp(&x.span()).then(y.size.cmp(&x.size)),
            Order::Area => area(y).cmp(&area(x)).then(y.size.cmp(&x.size)),
            Order::Start => x.live[0].0.cmp(&y.live[0].0),
        }
        .then(a.cmp(&b))
    });
    sorted
}

/// Places the items one by one in the order `sorted` gives, each where `gap` says.
fn place_in(items: &[Item], sorted: &[usize], gap: Gap) -> Option<(Vec<usize>, usize)> {
    let mut offsets = vec![0usize; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    let mut peak = 0usize;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for &i in sorted {
        let item = &items[i];
        taken.clear();
        for &j in &placed {
            if item.meets(&items[j]) {
                taken.push((offsets[j], offsets[j].checked_add(items[j].size)?));
            }
        }
        taken.sort_unstable();
        // The holes between the ranges taken while the item is live, lowest first; the top
        // (above them all) fits always.
        let mut at = 0usize;
        let mut tightest: Option<(usize, usize)> = None;
        for &(start, end) in &taken {
            if start >= at.checked_add(item.size)? {
                let hole = start - at;
                if matches!(gap, Gap::Lowest) {
                    break;
                }
                if tightest.is_none_or(|t| hole < t.1) {
                    tightest = Some((at, hole));
                }
            }
            at = at.max(end);
        }
        let offset = match (gap, tightest) {
            (Gap::Tightest, Some((hole_at, _))) => hole_at,
            _ => at,
        };
        // `Lowest` broke out at its hole; `Tightest` without a hole goes on top.
        offsets[i] = offset;
        peak = peak.max(offset.checked_add(item.size)?);
        placed.push(i);
    }
    Some((offsets, peak))
}

/// The most bytes live at one moment: what no placement can go below.
pub(crate) fn most_live(items: &[Item]) -> usize {
    let mut ends: Vec<u32> = items.iter().flat_map(|i| i.live.iter().map(|l| l.0)).collect();
    ends.sort_unstable();
    ends.dedup();
    ends.iter()
        .map(|&t| {
            items
                .iter()
                .filter(|i| i.live.iter().any(|&(a, b)| a <= t && t < b))
                .map(|i| i.size)
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(size: usize, from: u32, to: u32) -> Item {
        Item { size, live: [(from, to), (0, 0)] }
    }

    /// No two items live at one moment share a byte.
    fn assert_disjoint(items: &[Item], offsets: &[usize]) {
        for a in 0..items.len() {
            for b in a + 1..items.len() {
                if items[a].meets(&items[b]) {
                    let (x, y) =
                        (offsets[a]..offsets[a] + items[a].size, offsets[b]..offsets[b] + items[b].size);
                    assert!(x.end <= y.start || y.end <= x.start, "items {a} and {b} overlap: {x:?} {y:?}");
                }
            }
        }
    }

    #[test]
    fn items_live_apart_share_memory_and_items_live_together_do_not() {
        let items = [item(1024, 0, 2), item(1024, 2, 4), item(512, 1, 3)];
        let (offsets, peak) = place(&items).unwrap();
        assert_disjoint(&items, &offsets);
        assert_eq!(offsets[0], offsets[1], "one after the other: the same place");
        assert_eq!(peak, 1536);
        assert_eq!(most_live(&items), 1536);
    }

    #[test]
    fn a_lifetime_that_wraps_the_iteration_meets_both_ends() {
        let wrapped = Item { size: 512, live: [(6, 8), (0, 1)] };
        let items = [wrapped, item(512, 0, 2), item(512, 2, 6)];
        let (offsets, peak) = place(&items).unwrap();
        assert_disjoint(&items, &offsets);
        assert_ne!(offsets[0], offsets[1]);
        assert_eq!(peak, 1024);
    }

    #[test]
    fn small_items_fill_the_holes_between_large_ones() {
        // Two large tensors live at once, then one large and two small in the hole of the other.
        let items = [item(4096, 0, 10), item(4096, 0, 4), item(2048, 5, 10), item(2048, 5, 10)];
        let (offsets, peak) = place(&items).unwrap();
        assert_disjoint(&items, &offsets);
        assert_eq!(peak, 8192);
    }

    #[test]
    fn sizes_that_overflow_make_no_plan() {
        assert!(place(&[item(usize::MAX, 0, 2), item(usize::MAX, 1, 3)]).is_none());
    }
}
