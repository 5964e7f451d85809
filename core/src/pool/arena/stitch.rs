//! Stitching in one arena: the whole pages under free chunks are lifted out of their blocks (the
//! raw allocator unmaps them and maps them again where a growth needs them), and a block whose
//! chunks are all free or lifted is released as a whole one is.
//!
//! A lifted range stays in its block's chain of chunks as a [`State::Lifted`] chunk: its
//! addresses are the block's, no memory is behind them, and it is never lent, merged with a
//! free neighbour or counted as held. Blocks keep their addresses, so nothing lent moves; the
//! address space a lift leaves behind is not reused (a growing block reserves far more than it
//! maps).

use crate::hal::types::DevicePtr;

use super::super::index::NIL;
use super::super::policy;
use super::super::raw::RawBlock;
use super::{ArenaState, Lent, State, PLANNED};

impl<K: RawBlock> ArenaState<K> {
    /// Lifts up to `want` bytes (whole granules) of the pages under free chunks through `lift`
    /// (the raw allocator's [`lift_pages`](super::super::RawAllocator::lift_pages), called with
    /// the block, an offset and a length), smallest chunks first: a small hole is the least
    /// likely to hold a later request. The growing blocks' free tails are left, as are the plan's
    /// block, and the chunks of `spare` (a window about to be lent, see
    /// [`ArenaState::lifted_window`]). Returns the bytes lifted.
    ///
    /// `lift` returns the bytes it lifted (0 on an error, which the caller keeps).
    pub(crate) fn lift_pages(
        &mut self,
        want: usize,
        granule: usize,
        spare: Option<&Window>,
        mut lift: impl FnMut(&mut K, usize, usize) -> usize,
    ) -> usize {
        let mut holes: Vec<(usize, u32)> = (0..self.chunks.len() as u32)
            .filter(|&slot| {
                let c = &self.chunks[slot as usize];
                let tail = c.next == NIL && self.growable[usize::from(c.class)] == Some(c.block);
                let spared = spare.is_some_and(|w| c.ptr < w.end && c.ptr + c.size > w.start);
                c.state == State::Free && c.class != PLANNED && !tail && !spared
            })
            .map(|slot| (self.chunks[slot as usize].size, slot))
            .collect();
        holes.sort_unstable();
        let mut lifted = 0;
        for (_, slot) in holes {
            if lifted >= want {
                break;
            }
            let c = self.chunks[slot as usize];
            let Some(mem) = self.blocks[c.block as usize].as_mut() else { continue };
            let (base, size, held) = (mem.address(), mem.size(), mem.held());
            let start = (c.ptr - base).next_multiple_of(granule);
            let end = (c.ptr - base + c.size) / granule * granule;
            if end <= start {
                continue;
            }
            let left = (want - lifted).checked_next_multiple_of(granule).unwrap_or(usize::MAX);
            let asked = (end - start).min(left);
            let got = lift(mem, start, asked);
            // The allocator is safe code: the block's own account decides, as it does for a
            // shrink. A block that moved or changed size, or that holds other than `got` less, has
            // nothing lifted from it, and the chunk stays free, as it was.
            let fits = mem.address() == base
                && mem.size() == size
                && got <= asked
                && got.is_multiple_of(granule)
                && held.checked_sub(mem.held()) == Some(got);
            if got == 0 || !fits {
                continue;
            }
            self.set_lifted(slot, c.ptr, base + start, got);
            lifted += got;
        }
        lifted
    }

    /// Marks `len` bytes at `at` of free chunk `slot` (which starts at `ptr`) lifted: the chunk is
    /// cut around them, its free parts stay free.
    fn set_lifted(&mut self, slot: u32, ptr: usize, at: usize, len: usize) {
        self.unmark_free(slot);
        let mut hole = slot;
        if at > ptr {
            hole = self.cut(slot, at - ptr);
            self.mark_free(slot);
        }
        if self.chunks[hole as usize].size > len {
            let rest = self.cut(hole, len);
            self.mark_free(rest);
        }
        self.chunks[hole as usize].state = State::Lifted;
        self.lifted_chunks += 1;
        self.counters.on_unreserve(len, false);
    }

    /// Releases every block with a lifted chunk whose other chunks are all free, into `out`;
    /// returns the bytes it held. (A block with no lifted chunk is released, when whole, by
    /// `release_free_blocks`.)
    pub(crate) fn release_idle_blocks(&mut self, out: &mut Vec<K>) -> usize {
        if self.lifted_chunks == 0 {
            return 0;
        }
        let mut bytes = 0;
        for first in 0..self.chunks.len() as u32 {
            let c = self.chunks[first as usize];
            if c.state == State::Vacant || c.prev != NIL || c.class == PLANNED {
                continue;
            }
            if self.is_idle_with_lifted(first) {
                let (mem, held) = self.release_idle(first);
                out.push(mem);
                bytes += held;
            }
        }
        bytes
    }

    /// Whether the block whose first chunk is `first` has a lifted chunk and all its other
    /// chunks free.
    fn is_idle_with_lifted(&self, first: u32) -> bool {
        let (mut at, mut lifted) = (first, false);
        while at != NIL {
            let c = &self.chunks[at as usize];
            match c.state {
                State::Free => {}
                State::Lifted => lifted = true,
                State::Lent | State::Fenced | State::Vacant => return false,
            }
            at = c.next;
        }
        lifted
    }

    /// For an orphaned arena: releases the block of free chunk `slot` if its other chunks are all
    /// free or lifted, and it has a lifted one.
    pub(super) fn release_if_idle(&mut self, slot: u32) -> Option<(K, usize)> {
        if self.lifted_chunks == 0 {
            return None;
        }
        let mut first = slot;
        while self.chunks[first as usize].prev != NIL {
            first = self.chunks[first as usize].prev;
        }
        self.is_idle_with_lifted(first).then(|| self.release_idle(first))
    }

    /// Releases the block whose first chunk is `first`, all of whose chunks are free or lifted;
    /// returns it and the bytes it held.
    fn release_idle(&mut self, first: u32) -> (K, usize) {
        let block = self.chunks[first as usize].block;
        let mut held = 0;
        let mut at = first;
        while at != NIL {
            let c = self.chunks[at as usize];
            if c.state == State::Free {
                self.unmark_free(at);
                held += c.size;
            } else {
                self.lifted_chunks -= 1;
            }
            self.vacate(at);
            at = c.next;
        }
        self.counters.on_unreserve(held, true);
        let mem = self.take_block(block);
        (mem, held)
    }
}

/// Where a request can go in a block's lifted range and the free chunks beside it: the chunks
/// from `first` to `last`, of which `last` (when lifted) is used for `last_len` bytes only.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    first: u32,
    last: u32,
    last_len: usize,
    /// The bytes to map: the lifted bytes of the window.
    pub(crate) cost: usize,
    /// The window's addresses, which lifting for it must leave alone.
    start: DevicePtr,
    end: DevicePtr,
}

impl<K: RawBlock> ArenaState<K> {
    /// The place for a request of `size` bytes that maps the fewest pages again: a run of
    /// adjacent free and lifted chunks of a block (the request's free index, not a growing
    /// block's tail), as much of it as the request needs. The free chunks in it lend their
    /// memory, which no other request could use (each is too small alone), and only the lifted
    /// bytes are mapped. `None` when no run is long enough.
    pub(crate) fn lifted_window(&self, size: usize, granule: usize) -> Option<Window> {
        if self.lifted_chunks == 0 {
            return None;
        }
        let class = policy::class(size, self.small_up_to) as u8;
        let mut best: Option<Window> = None;
        for head in 0..self.chunks.len() as u32 {
            let c = &self.chunks[head as usize];
            if c.state == State::Vacant || c.prev != NIL || c.class != class {
                continue;
            }
            let mut run: Vec<u32> = Vec::new();
            let mut at = head;
            while at != NIL {
                let c = self.chunks[at as usize];
                let tail = c.next == NIL && self.growable[usize::from(c.class)] == Some(c.block);
                if matches!(c.state, State::Free | State::Lifted) && !tail {
                    run.push(at);
                } else {
                    self.best_window_in(&run, size, granule, &mut best);
                    run.clear();
                }
                at = c.next;
            }
            self.best_window_in(&run, size, granule, &mut best);
        }
        best
    }

    /// The cheapest window of `run` (adjacent free and lifted chunks) for `size` bytes, if
    /// cheaper than `best`, into `best`.
    fn best_window_in(&self, run: &[u32], size: usize, granule: usize, best: &mut Option<Window>) {
        for i in 0..run.len() {
            let (mut total, mut cost) = (0usize, 0usize);
            for &slot in &run[i..] {
                let c = &self.chunks[slot as usize];
                let need = size - total;
                let lifted = c.state == State::Lifted;
                let (used, paid) = match (lifted, c.size >= need) {
                    (true, true) => {
                        let n = need.next_multiple_of(granule).min(c.size);
                        (n, n)
                    }
                    (true, false) => (c.size, c.size),
                    (false, _) => (c.size, 0),
                };
                total += used;
                cost += paid;
                if best.is_some_and(|b| b.cost <= cost) {
                    break;
                }
                if total >= size {
                    if cost > 0 {
                        let first = &self.chunks[run[i] as usize];
                        *best = Some(Window {
                            first: run[i],
                            last: slot,
                            last_len: used,
                            cost,
                            start: first.ptr,
                            end: c.ptr + used,
                        });
                    }
                    break;
                }
            }
        }
    }

    /// Maps `window`'s lifted bytes again through `map` (the raw allocator's
    /// [`map_pages`](super::super::RawAllocator::map_pages), with the block, an offset and a
    /// length; it returns the bytes mapped) and lends the free chunk the window became for a
    /// request of `size` bytes (`requested` asked for). Returns the bytes mapped, and the chunk
    /// when all of the window was mapped; what was mapped before a failure stays free.
    pub(crate) fn lend_from_window(
        &mut self,
        window: Window,
        size: usize,
        requested: usize,
        mut map: impl FnMut(&mut K, usize, usize) -> usize,
    ) -> (usize, Option<Lent>) {
        let mut lifted = Vec::new();
        let mut at = window.first;
        loop {
            if self.chunks[at as usize].state == State::Lifted {
                lifted.push(at);
            }
            if at == window.last {
                break;
            }
            at = self.chunks[at as usize].next;
        }
        // Lifted chunks are never merged away while the free ones around them are (a lifted
        // chunk made free absorbs its free neighbours, or is absorbed by the one before it), so
        // each slot gathered above is still its chunk when its turn comes.
        let mut mapped = 0;
        let mut whole = true;
        for at in lifted {
            let c = self.chunks[at as usize];
            let len = if at == window.last { window.last_len } else { c.size };
            let Some(mem) = self.blocks[c.block as usize].as_mut() else { return (mapped, None) };
            let (base, before, held) = (mem.address(), mem.size(), mem.held());
            let got = map(mem, c.ptr - base, len);
            // The allocator is safe code: the block's own account decides, as for a lift.
            let fits =
                mem.address() == base && mem.size() == before && got == len && mem.held() == held + len;
            if !fits {
                whole = false;
                break;
            }
            if len < c.size {
                let rest = self.cut(at, len);
                self.chunks[rest as usize].state = State::Lifted;
                self.lifted_chunks += 1;
            }
            self.counters.on_reserve(len, false);
            mapped += len;
            self.chunks[at as usize].state = State::Free;
            self.lifted_chunks -= 1;
            let merged = self.merge(at);
            self.mark_free(merged);
        }
        if !whole {
            return (mapped, None);
        }
        let slot = self.free_chunk_at(window.start, window.end);
        let Some(slot) = slot else { return (mapped, None) };
        let found = self.chunks[slot as usize].size;
        self.unmark_free(slot);
        self.counters.misses += 1;
        (mapped, Some(self.lend_slot(slot, found, size, requested)))
    }

    /// The free chunk that covers `start..end`, if one does.
    fn free_chunk_at(&self, start: DevicePtr, end: DevicePtr) -> Option<u32> {
        (0..self.chunks.len() as u32).find(|&s| {
            let c = &self.chunks[s as usize];
            c.state == State::Free && c.ptr <= start && c.ptr + c.size >= end
        })
    }
}
