//! The free-chunk index of one arena: best fit by size, in O(1) for the common cases.
//!
//! CuPy keeps a sorted set of `(size, object address)` and takes `lower_bound(size)`: the smallest
//! free chunk at least as large as the request. gpumem makes the same choice with segregated bins,
//! each an intrusive doubly linked list through the arena's chunk slots, and a two-level bitmap of
//! the non-empty bins:
//!
//! - below [`SMALL_UNITS`] units (2 MiB) there is one bin per exact size, so a bin's head is a best
//!   fit and "the smallest non-empty bin at or above `n`" is two bit scans;
//! - above, each power of two is cut into 16 classes (a chunk's size is within 6.25 % of its
//!   class's others). A request takes the smallest fitting chunk of its own class (its list is
//!   scanned), else the smallest chunk of the next non-empty class. The scan is over the chunks of
//!   one narrow class, which in practice are few; an exact-size reuse finds its chunk first.
//!
//! Insert and remove are a handful of stores. Within equal sizes the most recently freed chunk goes
//! out first (its memory is the likeliest to be warm); CuPy's tie-break between equal sizes is
//! arbitrary, so this is a choice, not a difference in behaviour.

use super::UNIT;

/// Chunks of fewer units than this live in exact-size bins.
pub(crate) const SMALL_UNITS: usize = 4096;
const SMALL_LOG2: u32 = SMALL_UNITS.trailing_zeros();
/// Size classes per power of two above `SMALL_UNITS`.
const SUB_CLASSES: usize = 16;
const SUB_LOG2: u32 = SUB_CLASSES.trailing_zeros();
const LARGE_CLASSES: usize = (usize::BITS - SMALL_LOG2) as usize * SUB_CLASSES;
const BINS: usize = SMALL_UNITS + LARGE_CLASSES;
const WORDS: usize = BINS.div_ceil(64);
const SUMMARY: usize = WORDS.div_ceil(64);
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
    size: usize,
}

/// Free chunks, by size. Slots are the arena's chunk indices; the arena calls
/// [`FreeIndex::grow_slots`] as its slab grows.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// `heads[b]`: the first free chunk of bin `b`, or `NIL`; grown on demand.
    heads: Vec<u32>,
    /// Each slot's neighbours in its bin, and its size.
    links: Vec<Link>,
    /// Bit `b` is set when bin `b` may hold a chunk: always set while it does, and cleared lazily
    /// (by the search that finds it empty), so emptying a bin on the hot path costs nothing.
    words: [u64; WORDS],
    /// Bit `w` is set when `words[w]` is not 0.
    summary: [u64; SUMMARY],
}

/// The bin of a free chunk of `size` bytes (a multiple of the unit). The arena keeps each chunk's
/// bin beside its size, so returning a chunk does not compute it again.
#[inline]
pub(crate) fn bin_for(size: usize) -> u32 {
    bin_of(size / UNIT) as u32
}

/// The bin of a free chunk of `units` units.
#[inline]
fn bin_of(units: usize) -> usize {
    if units < SMALL_UNITS {
        return units;
    }
    let log2 = usize::BITS - 1 - units.leading_zeros();
    let sub = (units >> (log2 - SUB_LOG2)) & (SUB_CLASSES - 1);
    SMALL_UNITS + (log2 - SMALL_LOG2) as usize * SUB_CLASSES + sub
}

/// Slots an arena's chunk and link buffers have room for from the start. An arena's hot entries
/// (the slots and the bin its allocations reuse) are written on every allocation and free by the
/// threads of its stream; with this much unused room after them, the next heap object (another
/// arena's buffers, when one thread made both arenas) begins at least two cache lines away, so
/// threads on different streams never write one line.
pub(crate) const MIN_SLOTS: usize = 16;
/// Bins past the last one used that `heads` has room for, for the same reason.
const HEADS_SPARE: usize = 64;

impl FreeIndex {
    pub(crate) fn new() -> Self {
        FreeIndex {
            heads: Vec::new(),
            links: Vec::with_capacity(MIN_SLOTS),
            words: [0; WORDS],
            summary: [0; SUMMARY],
        }
    }

    /// Makes room for slots `0..n`.
    pub(crate) fn grow_slots(&mut self, n: usize) {
        if self.links.len() < n {
            self.links.resize(n, Link { prev: NIL, next: NIL, size: 0 });
        }
    }

    /// Adds a free chunk of `size` bytes (a multiple of the unit) to its bin, `bin_for(size)`.
    #[inline(always)]
    pub(crate) fn insert(&mut self, slot: u32, size: usize, bin: u32) {
        let bin = bin as usize;
        debug_assert_eq!(bin, bin_of(size / UNIT));
        if self.heads.len() <= bin {
            self.grow_heads(bin);
        }
        let head = self.heads[bin];
        self.links[slot as usize] = Link { prev: NIL, next: head, size };
        if head != NIL {
            self.links[head as usize].prev = slot;
        }
        self.set_bit(bin);
        self.heads[bin] = slot;
    }

    /// Makes room for bin `bin` and [`HEADS_SPARE`] more, so the bin just used is not the
    /// buffer's last entry.
    #[cold]
    fn grow_heads(&mut self, bin: usize) {
        self.heads.resize(bin + 1 + HEADS_SPARE, NIL);
    }

    /// Removes a free chunk inserted into `bin`.
    #[inline]
    pub(crate) fn remove(&mut self, slot: u32, bin: u32) {
        self.unlink(bin as usize, slot);
    }

    #[inline(always)]
    fn unlink(&mut self, bin: usize, slot: u32) {
        let Link { prev, next, .. } = self.links[slot as usize];
        if prev == NIL {
            debug_assert_eq!(self.heads[bin], slot, "free index out of step with the arena");
            // An emptied bin keeps its bit until a search finds it empty.
            self.heads[bin] = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next != NIL {
            self.links[next as usize].prev = prev;
        }
    }

    /// Removes and returns the best-fitting free chunk for `size` bytes, the smallest at least as
    /// large, with its size; `None` when there is none, or when the best is larger than `max`.
    #[inline(always)]
    pub(crate) fn take_best(&mut self, size: usize, max: usize) -> Option<(u32, usize)> {
        let bin = bin_of(size / UNIT);
        // The common case first: the bin's first chunk has exactly the size asked for (always so
        // in a small bin; in a large class, when a size is reused).
        if let Some(&slot) = self.heads.get(bin) {
            if slot != NIL && (bin < SMALL_UNITS || self.links[slot as usize].size == size) {
                self.unlink(bin, slot);
                return Some((slot, size));
            }
        }
        if bin < SMALL_UNITS {
            // An empty exact-size bin: look above.
        } else if let Some(slot) = self.best_in(bin, size) {
            let found = self.links[slot as usize].size;
            if found > max {
                return None;
            }
            self.unlink(bin, slot);
            return Some((slot, found));
        }
        self.take_from_above(bin, size, max)
    }

    #[cold]
    fn take_from_above(&mut self, bin: usize, size: usize, max: usize) -> Option<(u32, usize)> {
        let (found, slot) = self.find_above(bin, size)?;
        let found_size = self.links[slot as usize].size;
        if found_size > max {
            return None;
        }
        self.unlink(found, slot);
        Some((slot, found_size))
    }

    /// The size of the chunk [`FreeIndex::take_best`] would take for `size` bytes (with no bound),
    /// without taking it. Takes `&mut self` only to clear the bits of empty bins it meets.
    pub(crate) fn best_size(&mut self, size: usize) -> Option<usize> {
        let bin = bin_of(size / UNIT);
        if let Some(&slot) = self.heads.get(bin) {
            if slot != NIL && (bin < SMALL_UNITS || self.links[slot as usize].size == size) {
                return Some(size);
            }
        }
        if bin >= SMALL_UNITS {
            if let Some(slot) = self.best_in(bin, size) {
                return Some(self.links[slot as usize].size);
            }
        }
        let (_, slot) = self.find_above(bin, size)?;
        Some(self.links[slot as usize].size)
    }

    /// The bin and slot of the best-fitting chunk for `size` bytes in the bins after `bin`.
    fn find_above(&mut self, bin: usize, size: usize) -> Option<(usize, u32)> {
        let found = self.first_bin_above(bin)?;
        let slot = if found < SMALL_UNITS { self.heads[found] } else { self.best_in(found, size)? };
        Some((found, slot))
    }

    /// The smallest chunk of at least `size` bytes in a large class.
    fn best_in(&self, bin: usize, size: usize) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        let mut slot = *self.heads.get(bin)?;
        while slot != NIL {
            let link = self.links[slot as usize];
            if link.size == size {
                return Some(slot);
            }
            if link.size > size && best.is_none_or(|(s, _)| link.size < s) {
                best = Some((link.size, slot));
            }
            slot = link.next;
        }
        best.map(|(_, slot)| slot)
    }

    /// The first non-empty bin after `bin`, clearing the bits of the empty bins it meets.
    fn first_bin_above(&mut self, bin: usize) -> Option<usize> {
        let mut from = bin + 1;
        loop {
            let candidate = self.first_bit_from(from)?;
            if self.heads.get(candidate).is_some_and(|&h| h != NIL) {
                return Some(candidate);
            }
            self.clear_bit(candidate);
            from = candidate + 1;
        }
    }

    /// The first set bit at or after `from`.
    fn first_bit_from(&self, from: usize) -> Option<usize> {
        if from >= BINS {
            return None;
        }
        let w = from / 64;
        let here = self.words[w] & (u64::MAX << (from % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        // Words after `w`, through the summary.
        let first_word = w + 1;
        for s in first_word / 64..SUMMARY {
            let mask = if s == first_word / 64 {
                u64::MAX.checked_shl((first_word % 64) as u32).unwrap_or(0)
            } else {
                u64::MAX
            };
            let bits = self.summary[s] & mask;
            if bits != 0 {
                let w = s * 64 + bits.trailing_zeros() as usize;
                return Some(w * 64 + self.words[w].trailing_zeros() as usize);
            }
        }
        None
    }

    fn set_bit(&mut self, bin: usize) {
        let w = bin / 64;
        self.words[w] |= 1 << (bin % 64);
        self.summary[w / 64] |= 1 << (w % 64);
    }

    fn clear_bit(&mut self, bin: usize) {
        let w = bin / 64;
        self.words[w] &= !(1 << (bin % 64));
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl FreeIndex {
        fn take_best_any(&mut self, size: usize) -> Option<(u32, usize)> {
            self.take_best(size, usize::MAX)
        }
    }

    #[test]
    fn a_bound_on_the_size_refuses_larger_chunks_and_keeps_them() {
        let mut idx = index(4);
        idx.insert(0, 64 * UNIT, bin_for(64 * UNIT));
        idx.insert(1, (SMALL_UNITS + 100) * UNIT, bin_for((SMALL_UNITS + 100) * UNIT));
        assert_eq!(idx.take_best(8 * UNIT, 9 * UNIT), None);
        assert_eq!(idx.take_best(SMALL_UNITS * UNIT, SMALL_UNITS * UNIT + 50 * UNIT), None);
        assert_eq!(idx.take_best(60 * UNIT, 64 * UNIT), Some((0, 64 * UNIT)));
        assert_eq!(idx.take_best(SMALL_UNITS * UNIT, usize::MAX), Some((1, (SMALL_UNITS + 100) * UNIT)));
    }

    fn index(slots: usize) -> FreeIndex {
        let mut idx = FreeIndex::new();
        idx.grow_slots(slots);
        idx
    }

    #[test]
    fn best_fit_takes_the_smallest_large_enough_chunk() {
        let mut idx = index(8);
        idx.insert(1, 4 * UNIT, bin_for(4 * UNIT));
        idx.insert(2, 2 * UNIT, bin_for(2 * UNIT));
        idx.insert(3, 64 * UNIT, bin_for(64 * UNIT));
        idx.insert(4, SMALL_UNITS * UNIT, bin_for(SMALL_UNITS * UNIT));
        idx.insert(5, (SMALL_UNITS + 7) * UNIT, bin_for((SMALL_UNITS + 7) * UNIT));
        assert_eq!(idx.take_best_any(UNIT), Some((2, 2 * UNIT)));
        assert_eq!(idx.take_best_any(3 * UNIT), Some((1, 4 * UNIT)));
        assert_eq!(idx.take_best_any(5 * UNIT), Some((3, 64 * UNIT)));
        assert_eq!(idx.take_best_any(UNIT), Some((4, SMALL_UNITS * UNIT)));
        assert_eq!(idx.take_best_any((SMALL_UNITS + 1) * UNIT), Some((5, (SMALL_UNITS + 7) * UNIT)));
        assert_eq!(idx.take_best_any(UNIT), None);
    }

    #[test]
    fn edge_sizes_land_in_the_right_place() {
        // Sizes reach the index rounded; these are the rounded edges: one unit, the last small
        // bin, the first large size, the largest.
        let mut idx = index(4);
        let last_small = (SMALL_UNITS - 1) * UNIT;
        let first_large = SMALL_UNITS * UNIT;
        let largest = usize::MAX / UNIT * UNIT;
        for (slot, size) in [(0, UNIT), (1, last_small), (2, first_large), (3, largest)] {
            idx.insert(slot, size, bin_for(size));
        }
        assert_eq!(idx.take_best_any(last_small), Some((1, last_small)));
        assert_eq!(idx.take_best_any(last_small), Some((2, first_large)));
        assert_eq!(idx.take_best_any(UNIT), Some((0, UNIT)));
        assert_eq!(idx.take_best_any(UNIT), Some((3, largest)));
        assert_eq!(idx.take_best_any(UNIT), None);
    }

    #[test]
    fn removal_from_anywhere_in_a_bin_keeps_the_others() {
        let mut idx = index(4);
        for slot in 0..4 {
            idx.insert(slot, UNIT, bin_for(UNIT));
        }
        idx.remove(2, bin_for(UNIT)); // middle
        idx.remove(3, bin_for(UNIT)); // head (last inserted)
        idx.remove(0, bin_for(UNIT)); // tail
        assert_eq!(idx.take_best_any(UNIT), Some((1, UNIT)));
        assert_eq!(idx.take_best_any(UNIT), None);
        idx.insert(3, UNIT, bin_for(UNIT));
        assert_eq!(idx.take_best_any(UNIT), Some((3, UNIT)), "an emptied bin works again");
    }

    #[test]
    fn searches_cross_bitmap_words_and_summary_words() {
        let mut idx = index(8);
        idx.insert(7, (SMALL_UNITS - 1) * UNIT, bin_for((SMALL_UNITS - 1) * UNIT));
        assert_eq!(idx.take_best_any((SMALL_UNITS - 2) * UNIT), Some((7, (SMALL_UNITS - 1) * UNIT)));
        assert_eq!(idx.take_best_any((SMALL_UNITS - 2) * UNIT), None);
        let huge = (1usize << 60) / UNIT * UNIT;
        idx.insert(6, huge, bin_for(huge));
        assert_eq!(idx.take_best_any(UNIT), Some((6, huge)), "found through the second summary word");
    }

    #[test]
    fn large_classes_keep_best_fit() {
        let mut idx = index(16);
        let mib = 1 << 20;
        // Same class (64 MiB .. 68 MiB), inserted out of order.
        idx.insert(1, 67 * mib, bin_for(67 * mib));
        idx.insert(2, 65 * mib, bin_for(65 * mib));
        idx.insert(3, 66 * mib, bin_for(66 * mib));
        idx.insert(4, 100 * mib, bin_for(100 * mib));
        assert_eq!(idx.take_best_any(64 * mib + UNIT), Some((2, 65 * mib)));
        assert_eq!(idx.take_best_any(66 * mib), Some((3, 66 * mib)), "an exact size is taken first");
        assert_eq!(idx.take_best_any(68 * mib), Some((4, 100 * mib)), "none fits in the class: the next one");
        assert_eq!(idx.take_best_any(3 * mib), Some((1, 67 * mib)));
        assert_eq!(idx.take_best_any(UNIT), None);
    }

    #[test]
    fn bins_are_monotonic_in_size() {
        let mut last = 0;
        for units in (1..SMALL_UNITS * 8).chain([1 << 30, (1 << 30) + 1, usize::MAX / UNIT]) {
            let b = bin_of(units);
            assert!(b >= last && b < BINS, "{units}");
            last = b;
        }
    }
}
