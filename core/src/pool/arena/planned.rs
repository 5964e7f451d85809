//! The plan's block in one arena: a raw block whose chunks are lent at the offsets a plan learned
//! from the loop gives (module `planner` of the pool), and never by a request's best fit.
//!
//! Its free chunks are filed in a free index of their own ([`PLANNED`]), which no request's class
//! names, so the pool's ordinary lending never cuts into it; a chunk lent from it goes back the
//! way every chunk does (merging with its free neighbours, behind a fence if freed behind one),
//! so a planned range is lent again only once everything that overlapped it is back in the arena,
//! in the arena's stream order.

use crate::hal::types::DevicePtr;

use super::super::index::{bin_for, NIL};
use super::super::policy;
use super::super::raw::RawBlock;
use super::{ArenaState, Chunk, Lent, State, PLANNED};

/// Where the plan's block is: its block number and the slot of its first chunk. The first chunk
/// keeps its slot while the block lives (a merge keeps the slot of the chunk before, and it has
/// none before it), so the walk to an offset starts there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanBlock {
    pub(super) block: u32,
    head: u32,
    base: DevicePtr,
    size: usize,
}

impl<K: RawBlock> ArenaState<K> {
    /// Adds `mem`, of which the pool counts `whole` bytes, as the arena's plan block: one free
    /// chunk, lent only by [`ArenaState::lend_planned`]. A plan block the arena had before becomes
    /// an ordinary one first (see [`ArenaState::unplan`]); if that one was all free, it is
    /// returned to be freed outside the lock.
    pub(crate) fn add_plan_block(&mut self, mem: K, whole: usize) -> Option<(K, usize)> {
        let old = self.unplan();
        let base = mem.address();
        debug_assert!(whole.is_multiple_of(super::super::UNIT) && whole > 0);
        let block = self.store_block(mem);
        let head = self.new_slot(Chunk {
            ptr: base,
            size: whole,
            block,
            prev: NIL,
            next: NIL,
            state: State::Free,
            bin: bin_for(whole),
            class: PLANNED,
            slack: 0,
        });
        self.mark_free(head);
        self.counters.on_reserve(whole, true);
        self.plan = Some(PlanBlock { block, head, base, size: whole });
        old
    }

    /// Releases into `out` the free chunks outside the plan's block that are whole raw blocks and
    /// were so at the last call too, with the same address and size (none at the first call):
    /// blocks left free from one iteration boundary of a planned loop to the next. Returns the
    /// bytes released. A block free at one boundary only may be one the loop lends again every
    /// iteration (a result that outlives its iteration, made before the last one is freed):
    /// giving it back would have it asked for again in the next. What a block did between the two
    /// calls is not seen: one lent and freed again in between counts as left free.
    pub(crate) fn release_blocks_left_free(&mut self, out: &mut Vec<K>) -> usize {
        let before = std::mem::take(&mut self.left_free);
        let mut bytes = 0;
        for slot in 0..self.chunks.len() as u32 {
            let c = self.chunks[slot as usize];
            if c.state != State::Free || c.prev != NIL || c.next != NIL || c.class == PLANNED {
                continue;
            }
            if before.contains(&(slot, c.ptr, c.size)) {
                self.unmark_free(slot);
                let (mem, size) = self.release(slot);
                out.push(mem);
                bytes += size;
            } else {
                self.left_free.push((slot, c.ptr, c.size));
            }
        }
        bytes
    }

    /// Forgets the blocks [`ArenaState::release_blocks_left_free`] saw free: its next call
    /// releases none.
    pub(crate) fn forget_blocks_left_free(&mut self) {
        self.left_free.clear();
    }

    /// The address and size of the plan's block, if the arena holds one.
    pub(crate) fn plan_block(&self) -> Option<(DevicePtr, usize)> {
        self.plan.map(|p| (p.base, p.size))
    }

    /// Lends `size` bytes (a request of `requested`) at `offset` of the plan's block, if that
    /// range is free now: `None` when the arena holds no plan block, the range passes its end, or
    /// any part of it is still lent or behind a fence. The walk to the offset passes the block's
    /// chunks before it, no others.
    pub(crate) fn lend_planned(&mut self, offset: usize, size: usize, requested: usize) -> Option<Lent> {
        let plan = self.plan?;
        let end = offset.checked_add(size)?;
        if size == 0 || end > plan.size {
            return None;
        }
        let target = plan.base + offset;
        let mut at = plan.head;
        loop {
            let c = &self.chunks[at as usize];
            if c.ptr + c.size > target {
                break;
            }
            at = c.next;
            if at == NIL {
                return None;
            }
        }
        let c = self.chunks[at as usize];
        if c.state != State::Free || c.ptr > target || target + size > c.ptr + c.size {
            return None;
        }
        self.unmark_free(at);
        let mut slot = at;
        if target > c.ptr {
            let rest = self.cut(slot, target - c.ptr);
            self.mark_free(slot);
            slot = rest;
        }
        if self.chunks[slot as usize].size > size {
            let rest = self.cut(slot, size);
            self.mark_free(rest);
        }
        self.n_lent += 1;
        self.used_bytes += size;
        self.counters.on_lend(size, requested, self.used_bytes, self.n_lent);
        let chunk = &mut self.chunks[slot as usize];
        chunk.state = State::Lent;
        chunk.slack = super::slack(size, requested);
        Some(Lent { slot, ptr: target })
    }

    /// The best-fitting free chunk of `size` to `max` bytes for a request of `size` bytes (of
    /// `requested`), if the arena has one: how the pool lends while the planner records (`max`
    /// is `size`, or with expandable segments `size` in whole granules), so that an allocation
    /// that outlives the loop pins no block it shares with the loop's transient ones.
    pub(crate) fn take_within(&mut self, size: usize, max: usize, requested: usize) -> Option<Lent> {
        let (slot, found) = self.index_of(policy::class(size, self.small_up_to)).take_best(size, max)?;
        Some(self.lend_slot(slot, found, size, requested))
    }

    /// Makes the plan's block an ordinary block of the arena (the plan is dropped): its free
    /// chunks go into the request class's free index, and its lent chunks go there when they come
    /// back. A plan block that is all free is released instead and returned, to be freed outside
    /// the lock.
    pub(crate) fn unplan(&mut self) -> Option<(K, usize)> {
        let plan = self.plan.take()?;
        let head = self.chunks[plan.head as usize];
        if head.state == State::Free && head.next == NIL {
            self.unmark_free(plan.head);
            return Some(self.release(plan.head));
        }
        let class = policy::class(plan.size, self.small_up_to) as u8;
        let mut at = plan.head;
        while at != NIL {
            let c = self.chunks[at as usize];
            if c.state == State::Free {
                self.unmark_free(at);
                self.chunks[at as usize].class = class;
                self.mark_free(at);
            } else {
                self.chunks[at as usize].class = class;
            }
            at = c.next;
        }
        None
    }
}
