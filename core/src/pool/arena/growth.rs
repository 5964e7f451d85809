//! Expandable segments in one arena: the growing block's free tail, growing it in place through
//! the raw allocator (checked as a new block is) and giving back the free tails' whole granules.

use super::super::index::{bin_for, NIL};
use super::super::policy;
use super::super::raw::{self, RawBlock};
use super::{ArenaState, Chunk, State, PLANNED};

/// The end of a growable block, as a miss that would grow it sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrowableTail {
    /// The free bytes at the block's end (0 when its last chunk is lent).
    pub(crate) free: usize,
    /// The bytes the block maps now.
    pub(crate) mapped: usize,
}

impl<K: RawBlock> ArenaState<K> {
    /// The last chunk of block `block`.
    fn last_chunk(&self, block: u32) -> Option<u32> {
        (0..self.chunks.len() as u32).find(|&s| {
            let c = &self.chunks[s as usize];
            c.state != State::Vacant && c.block == block && c.next == NIL
        })
    }

    /// The free bytes at the end of the growable block of a request of `size` bytes (the newest
    /// block of its free index), and what that block maps; `None` when there is no such block.
    pub(crate) fn growable_tail(&self, size: usize) -> Option<GrowableTail> {
        let class = policy::class(size, self.small_up_to);
        let block = self.growable[class]?;
        let last = self.last_chunk(block)?;
        let c = &self.chunks[last as usize];
        if usize::from(c.class) != class {
            return None;
        }
        let mapped = self.blocks[block as usize].as_ref()?.size();
        Some(GrowableTail { free: if c.state == State::Free { c.size } else { 0 }, mapped })
    }

    /// Grows the growable block of a request of `size` bytes by `extra` bytes through `grow`
    /// (the raw allocator's), and adds them to its free tail. Returns whether it grew.
    pub(crate) fn grow_tail(
        &mut self,
        size: usize,
        extra: usize,
        grow: impl FnOnce(&mut K) -> crate::error::Result<bool>,
    ) -> crate::error::Result<bool> {
        let Some(block) = self.growable[policy::class(size, self.small_up_to)] else { return Ok(false) };
        let Some(last) = self.last_chunk(block) else { return Ok(false) };
        let Some(mem) = self.blocks[block as usize].as_mut() else { return Ok(false) };
        let (address, before, device) = (mem.address(), mem.size(), mem.device());
        if !grow(mem)? {
            return Ok(false);
        }
        // The allocator is safe code: a growth it reports is checked as a new block is (VM07).
        // Saturating: no block is `usize::MAX` bytes long, so an overflow fails the check.
        raw::check_resized(&*mem, address, device, before.saturating_add(extra))?;
        self.counters.on_reserve(extra, false);
        self.counters.misses += 1;
        let c = self.chunks[last as usize];
        if c.state == State::Free {
            self.unmark_free(last);
            self.resize(last, c.size + extra);
            self.mark_free(last);
        } else {
            let tail = self.new_slot(Chunk {
                ptr: c.ptr + c.size,
                size: extra,
                block,
                prev: last,
                next: NIL,
                state: State::Free,
                bin: bin_for(extra),
                class: c.class,
                slack: 0,
            });
            self.chunks[last as usize].next = tail;
            self.mark_free(tail);
        }
        Ok(true)
    }

    /// Gives back the whole granules of every block's free tail through `shrink` (the raw
    /// allocator's, which returns the bytes it gave back: whole granules, at most those asked
    /// for); a block that is all free is left to `release_free_blocks`. Returns the bytes given
    /// back.
    pub(crate) fn shrink_tails(
        &mut self,
        granule: usize,
        mut shrink: impl FnMut(&mut K, usize) -> usize,
    ) -> usize {
        let mut bytes = 0;
        for slot in 0..self.chunks.len() as u32 {
            let c = self.chunks[slot as usize];
            // The plan's block keeps its size: its offsets were planned in it.
            if c.state != State::Free || c.next != NIL || c.prev == NIL || c.class == PLANNED {
                continue;
            }
            let Some(mem) = self.blocks[c.block as usize].as_mut() else { continue };
            let (base, before) = (mem.address(), mem.size());
            let end = c.ptr + c.size;
            let keep = (c.ptr - base).next_multiple_of(granule);
            // Whole granules only, as `RawAllocator::shrink` asks: a block that is not whole
            // granules (made before growing blocks were turned on, or at the request's size when
            // growing failed) keeps the odd bytes at its end.
            let asked = (end - base).saturating_sub(keep) / granule * granule;
            if asked == 0 {
                continue;
            }
            shrink(mem, asked);
            // The allocator is safe code, so the block's own size decides what is still lent, not
            // the count it returned (VM07's shrinking twin): a tail it unmapped while reporting
            // less is not lent again, and one it kept while reporting more stays lendable. A block
            // that moved keeps no part of its free tail.
            let cut =
                if mem.address() == base { before.saturating_sub(mem.size()).min(c.size) } else { c.size };
            if cut == 0 {
                continue;
            }
            self.counters.on_unreserve(cut, false);
            self.unmark_free(slot);
            if cut == c.size {
                let prev = c.prev;
                self.chunks[prev as usize].next = NIL;
                self.vacate(slot);
            } else {
                self.resize(slot, c.size - cut);
                self.mark_free(slot);
            }
            bytes += cut;
        }
        bytes
    }
}
