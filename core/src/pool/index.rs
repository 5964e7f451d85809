//! The free-chunk index of one arena: best fit by size in O(1) for small chunks.
//!
//! CuPy keeps a sorted set of `(size, object address)` and takes `lower_bound(size)`: the smallest
//! free chunk at least as large as the request. gpumem makes the same choice faster: chunks below
//! [`SMALL_UNITS`] units (2 MiB) sit in one exact-size bin per unit, with a two-level bitmap of the
//! non-empty bins, so "smallest bin at or above `n` that holds a chunk" is two bit scans; larger
//! chunks sit in a `BTreeSet` ordered by `(size, slot)`. Within a bin the most recently freed chunk
//! goes out first (its memory is the likeliest to be warm); CuPy's tie-break between equal sizes is
//! arbitrary, so this is a choice, not a difference in behaviour.

use std::collections::BTreeSet;

use super::UNIT;

/// Chunks of fewer units than this live in exact-size bins.
pub(crate) const SMALL_UNITS: usize = 4096;
const WORDS: usize = SMALL_UNITS / 64;

/// Free chunks, by size. Slots are the arena's chunk indices.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// `bins[u]`: free chunks of exactly `u` units; grown on demand.
    bins: Vec<Vec<u32>>,
    /// Bit `u` is set when `bins[u]` is not empty.
    words: [u64; WORDS],
    /// Bit `w` is set when `words[w]` is not 0.
    summary: u64,
    /// Free chunks of `SMALL_UNITS` units or more.
    large: BTreeSet<(usize, u32)>,
}

/// Where a chunk sits in the index, so it can be removed in O(1) when a neighbour merges with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position(u32);

impl Position {
    pub(crate) const NONE: Position = Position(u32::MAX);
}

impl FreeIndex {
    pub(crate) fn new() -> Self {
        FreeIndex { bins: Vec::new(), words: [0; WORDS], summary: 0, large: BTreeSet::new() }
    }

    /// Adds a free chunk of `size` bytes (a multiple of the unit) and returns its position.
    pub(crate) fn insert(&mut self, slot: u32, size: usize) -> Position {
        let units = size / UNIT;
        if units < SMALL_UNITS {
            if self.bins.len() <= units {
                self.bins.resize_with(units + 1, Vec::new);
            }
            let bin = &mut self.bins[units];
            bin.push(slot);
            self.words[units / 64] |= 1 << (units % 64);
            self.summary |= 1 << (units / 64);
            Position((bin.len() - 1) as u32)
        } else {
            self.large.insert((size, slot));
            Position::NONE
        }
    }

    /// Removes a chunk inserted with `size` at `pos`. When another chunk moved into its place,
    /// returns that chunk's slot and new position, which the caller records.
    pub(crate) fn remove(&mut self, slot: u32, size: usize, pos: Position) -> Option<(u32, Position)> {
        let units = size / UNIT;
        if units < SMALL_UNITS {
            let bin = &mut self.bins[units];
            let i = pos.0 as usize;
            debug_assert_eq!(bin[i], slot, "free index out of step with the arena");
            bin.swap_remove(i);
            let moved = bin.get(i).map(|&moved| (moved, pos));
            if bin.is_empty() {
                self.clear_bit(units);
            }
            moved
        } else {
            let removed = self.large.remove(&(size, slot));
            debug_assert!(removed, "free index out of step with the arena");
            None
        }
    }

    /// Removes and returns the best-fitting free chunk for `size` bytes: the smallest at least as
    /// large. The chunk's size is the bin's (small) or comes back from the set (large).
    pub(crate) fn take_best(&mut self, size: usize) -> Option<(u32, usize)> {
        let units = size / UNIT;
        if units < SMALL_UNITS {
            if let Some(found) = self.first_bin_at_or_above(units) {
                let bin = &mut self.bins[found];
                let slot = bin.pop().expect("a set bit marks a non-empty bin");
                if bin.is_empty() {
                    self.clear_bit(found);
                }
                return Some((slot, found * UNIT));
            }
        }
        let &(found_size, slot) = self.large.range((size, 0)..).next()?;
        self.large.remove(&(found_size, slot));
        Some((slot, found_size))
    }

    fn first_bin_at_or_above(&self, units: usize) -> Option<usize> {
        let w = units / 64;
        let here = self.words[w] & (u64::MAX << (units % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= WORDS { 0 } else { self.summary & (u64::MAX << (w + 1)) };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    fn clear_bit(&mut self, units: usize) {
        let w = units / 64;
        self.words[w] &= !(1 << (units % 64));
        if self.words[w] == 0 {
            self.summary &= !(1 << w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_large_enough_chunk() {
        let mut idx = FreeIndex::new();
        idx.insert(1, 4 * UNIT);
        idx.insert(2, 2 * UNIT);
        idx.insert(3, 64 * UNIT);
        idx.insert(4, SMALL_UNITS * UNIT);
        idx.insert(5, (SMALL_UNITS + 7) * UNIT);
        assert_eq!(idx.take_best(UNIT), Some((2, 2 * UNIT)));
        assert_eq!(idx.take_best(3 * UNIT), Some((1, 4 * UNIT)));
        assert_eq!(idx.take_best(5 * UNIT), Some((3, 64 * UNIT)));
        assert_eq!(idx.take_best(UNIT), Some((4, SMALL_UNITS * UNIT)));
        assert_eq!(idx.take_best((SMALL_UNITS + 1) * UNIT), Some((5, (SMALL_UNITS + 7) * UNIT)));
        assert_eq!(idx.take_best(UNIT), None);
    }

    #[test]
    fn edge_sizes_land_in_the_right_place() {
        // unit-1 and unit never reach the index (sizes are rounded first); these are the rounded
        // edges: one unit, the last small bin, the first large size, the largest.
        let mut idx = FreeIndex::new();
        let last_small = (SMALL_UNITS - 1) * UNIT;
        let first_large = SMALL_UNITS * UNIT;
        let largest = usize::MAX / UNIT * UNIT;
        for (slot, size) in [(0, UNIT), (1, last_small), (2, first_large), (3, largest)] {
            idx.insert(slot, size);
        }
        assert_eq!(idx.take_best(last_small), Some((1, last_small)));
        assert_eq!(idx.take_best(last_small), Some((2, first_large)));
        assert_eq!(idx.take_best(UNIT), Some((0, UNIT)));
        assert_eq!(idx.take_best(UNIT), Some((3, largest)));
    }

    #[test]
    fn remove_reports_the_chunk_that_moved() {
        let mut idx = FreeIndex::new();
        let a = idx.insert(10, UNIT);
        let b = idx.insert(11, UNIT);
        let c = idx.insert(12, UNIT);
        assert_eq!((a, b, c), (Position(0), Position(1), Position(2)));
        assert_eq!(idx.remove(10, UNIT, a), Some((12, Position(0))));
        assert_eq!(idx.remove(11, UNIT, b), None);
        assert_eq!(idx.remove(12, UNIT, Position(0)), None);
        assert_eq!(idx.take_best(UNIT), None);
    }

    #[test]
    fn last_word_has_no_summary_overflow() {
        let mut idx = FreeIndex::new();
        idx.insert(7, (SMALL_UNITS - 1) * UNIT);
        assert_eq!(idx.take_best((SMALL_UNITS - 2) * UNIT), Some((7, (SMALL_UNITS - 1) * UNIT)));
        assert_eq!(idx.take_best((SMALL_UNITS - 2) * UNIT), None);
    }
}
