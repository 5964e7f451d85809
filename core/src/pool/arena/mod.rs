//! One arena: the free and lent chunks of one stream, and the raw blocks they were cut from.
//!
//! Chunks live in a slab (`Vec<Chunk>` plus a list of vacant slots) and are linked in address order
//! within their raw block, so splitting and merging are O(1) and never allocate once the slab has
//! grown. Everything here runs under the arena's own lock; nothing here calls the runtime or a
//! hook, so the lock is held for a few dozen instructions.
//!
//! Free chunks are filed in the arena's free index, except, with expandable segments, the free
//! tail of each growing block: that one is lent only by the miss path, when nothing in the index
//! fits (see [`ArenaState::take_with_tail`]).
//!
//! What the arena counts is in `counters`; growing and shrinking the growing blocks' tails
//! (expandable segments) in `growth`; the block of a plan learned from the loop (module
//! `planner` of the pool), whose chunks are lent at planned offsets only, in `planned`.

use crate::hal::types::DevicePtr;

use super::raw::RawBlock;

use super::index::{bin_for, FreeIndex, MIN_SLOTS, NIL};
use super::policy;

mod counters;
mod growth;
mod planned;
mod stitch;

pub(crate) use counters::Counters;
pub(crate) use stitch::Window;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Free,
    Lent,
    /// Freed behind a fence that has not been seen complete: still lent (and active), no longer
    /// allocated.
    Fenced,
    /// Stitching: a range of a block whose pages were lifted out (see `stitch`); no memory.
    Lifted,
    Vacant,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    ptr: DevicePtr,
    size: usize,
    block: u32,
    /// The neighbours in address order within the block (`NIL` at either end).
    prev: u32,
    next: u32,
    state: State,
    /// The free-index bin of `size` (kept with it, so a chunk going back does not recompute it).
    bin: u32,
    /// Which free index the chunk's block belongs to (see `policy::class`; [`PLANNED`] for the
    /// plan's block).
    class: u8,
    /// A lent chunk's size less the bytes asked for (under the allocation unit, so it fits the
    /// struct's padding): the requested-bytes statistic needs it back at the free.
    slack: u16,
}

/// The chunks of one arena. See the module docs.
pub(crate) struct ArenaState<K> {
    chunks: Vec<Chunk>,
    vacant: Vec<u32>,
    blocks: Vec<Option<K>>,
    vacant_blocks: Vec<u32>,
    /// The free chunks: one index, or with small requests apart (`small_up_to`) one for the
    /// blocks of small requests and one for the rest.
    index: FreeIndex,
    /// With small requests apart, the blocks of large requests (boxed: the hot path touches
    /// `index` only, and the arena's hot fields stay as close together as without it).
    large: Box<FreeIndex>,
    /// The free chunks of the plan's block (free index [`PLANNED`]): no request's class names
    /// it, so only [`ArenaState::lend_planned`] lends them.
    planned: Box<FreeIndex>,
    /// The plan's block, if the arena holds one (see `planned`).
    plan: Option<planned::PlanBlock>,
    /// No longer in the pool's map: allocations must go to the arena that replaced it.
    pub(crate) retired: bool,
    /// The pool is gone: chunks that come back release their raw blocks as soon as whole, and
    /// the last one lets the arena go (see `ArenaRef`).
    pub(crate) orphaned: bool,
    /// Lend a free chunk only if it exceeds the request by at most an eighth (`HoldPeakInUse`):
    /// large free chunks are not cut up for small requests.
    pub(crate) bounded_split: bool,
    /// Requests of at most this many bytes are small, served from blocks apart from the others'
    /// (`GrowthPolicy::Segments`); [`policy::ONE_CLASS`]: all requests share the blocks.
    pub(crate) small_up_to: usize,
    /// The block that grows on a miss, with an expandable raw allocator: the newest one of each
    /// free index (the pool keeps small requests apart with expandable segments only when it
    /// stitches; an arena that kept them apart before expandable segments were turned on grows a
    /// block per index).
    /// (Entry [`PLANNED`] stays `None`: the plan's block never grows.)
    growable: [Option<u32>; 3],
    /// With `keep_tail_last`, the free chunk at the end of each growable block, kept out of the
    /// free index (`NIL` when there is none); see [`ArenaState::take_from_tail`].
    tail: [u32; 3],
    /// Lend from a growable block's free tail only when no other free chunk fits (expandable
    /// segments, except under `HoldPeakInUse`); set with [`ArenaState::set_keep_tail_last`].
    keep_tail_last: bool,
    /// Bytes lent out. (Free bytes and free chunks are not counted on the hot path: the pool's
    /// free bytes are its total less its used bytes, and `n_free` counts when asked.)
    pub(crate) used_bytes: usize,
    /// Chunks lent out.
    pub(crate) n_lent: usize,
    /// Lifted chunks (stitching; see `stitch`): while there are none, no block has a hole.
    lifted_chunks: usize,
    /// The statistics (plain integers: the arena's lock guards them).
    pub(crate) counters: Counters,
    /// The whole free blocks outside the plan's at a planned loop's last iteration boundary, as
    /// `(slot, address, size)`: see [`ArenaState::release_blocks_left_free`].
    left_free: Vec<(u32, DevicePtr, usize)>,
}

/// One chunk as a snapshot shows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkView {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
    pub(crate) requested: usize,
    pub(crate) state: State,
}

/// A chunk handed out: its slot and address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent {
    pub(crate) slot: u32,
    pub(crate) ptr: DevicePtr,
}

/// The free index of the plan's block (see `planned`).
pub(crate) const PLANNED: u8 = 2;

/// A lent chunk's rounding slack: `size - requested`, under the allocation unit.
#[inline(always)]
fn slack(size: usize, requested: usize) -> u16 {
    debug_assert!(requested <= size && size - requested < super::UNIT);
    (size - requested) as u16
}

impl<K: RawBlock> ArenaState<K> {
    pub(crate) fn new() -> Self {
        ArenaState {
            // Room for a few chunks up front, so that the entries written on every allocation lie
            // at the start of a buffer larger than they are, never beside another arena's (see
            // `MIN_SLOTS`); the vacant slots are `u32`s, so as many bytes as the index's links.
            chunks: Vec::with_capacity(MIN_SLOTS),
            vacant: Vec::with_capacity(4 * MIN_SLOTS),
            blocks: Vec::new(),
            vacant_blocks: Vec::new(),
            index: FreeIndex::new(),
            large: Box::new(FreeIndex::new()),
            planned: Box::new(FreeIndex::new()),
            plan: None,
            retired: false,
            orphaned: false,
            bounded_split: false,
            small_up_to: policy::ONE_CLASS,
            growable: [None; 3],
            tail: [NIL; 3],
            keep_tail_last: false,
            used_bytes: 0,
            n_lent: 0,
            lifted_chunks: 0,
            counters: Counters::default(),
            left_free: Vec::new(),
        }
    }

    /// The room of the chunk buffer and the vacant-slot buffer (see `MIN_SLOTS`).
    #[cfg(test)]
    pub(crate) fn spare_room(&self) -> (usize, usize) {
        (self.chunks.capacity(), self.vacant.capacity())
    }

    /// Whether the arena holds no chunk at all (and so no raw memory).
    pub(crate) fn is_empty(&self) -> bool {
        self.vacant.len() == self.chunks.len()
    }

    /// The number of free chunks (counted: this is a statistic, not on the hot path).
    pub(crate) fn n_free(&self) -> usize {
        self.chunks.iter().filter(|c| c.state == State::Free).count()
    }

    fn new_slot(&mut self, chunk: Chunk) -> u32 {
        if let Some(slot) = self.vacant.pop() {
            self.chunks[slot as usize] = chunk;
            return slot;
        }
        self.chunks.push(chunk);
        self.index.grow_slots(self.chunks.len());
        self.large.grow_slots(self.chunks.len());
        self.planned.grow_slots(self.chunks.len());
        u32::try_from(self.chunks.len() - 1).expect("fewer than 2^32 chunks in one arena")
    }

    fn vacate(&mut self, slot: u32) {
        self.chunks[slot as usize].state = State::Vacant;
        self.vacant.push(slot);
    }

    /// Free index `class` (0: `index`, 1: `large`, [`PLANNED`]: `planned`).
    #[inline(always)]
    fn index_of(&mut self, class: usize) -> &mut FreeIndex {
        match class {
            0 => &mut self.index,
            1 => &mut self.large,
            _ => &mut self.planned,
        }
    }

    #[inline(always)]
    fn mark_free(&mut self, slot: u32) {
        let c = &mut self.chunks[slot as usize];
        c.state = State::Free;
        let (size, bin, class, next, block) = (c.size, c.bin, c.class, c.next, c.block);
        let class = usize::from(class);
        if self.keep_tail_last && next == NIL && self.growable[class] == Some(block) {
            self.tail[class] = slot;
            return;
        }
        self.index_of(class).insert(slot, size, bin);
    }

    #[inline]
    fn unmark_free(&mut self, slot: u32) {
        let c = &self.chunks[slot as usize];
        let (class, bin) = (usize::from(c.class), c.bin);
        if self.tail[class] == slot {
            self.tail[class] = NIL;
            return;
        }
        self.index_of(class).remove(slot, bin);
    }

    /// Sets a chunk's size, and so its bin.
    fn resize(&mut self, slot: u32, size: usize) {
        let c = &mut self.chunks[slot as usize];
        c.size = size;
        c.bin = bin_for(size);
    }

    fn is_free(&self, slot: u32) -> bool {
        slot != NIL && self.chunks[slot as usize].state == State::Free
    }

    /// Lends the best-fitting free chunk for `size` bytes, splitting off and keeping the rest
    /// (CuPy's split: the head is lent, the remainder stays free, unmerged). The cache hit: it
    /// looks in the free index only, so a growable block's free tail kept aside
    /// ([`ArenaState::take_with_tail`]) is not lent here.
    #[inline(always)]
    pub(crate) fn take(&mut self, size: usize, requested: usize) -> Option<Lent> {
        let max = self.split_bound(size);
        let (slot, found) = self.index_of(policy::class(size, self.small_up_to)).take_best(size, max)?;
        Some(self.lend_slot(slot, found, size, requested))
    }

    /// [`ArenaState::take`], else the growable block's free tail: what the miss path lends from
    /// before it grows a block.
    #[cold]
    pub(crate) fn take_with_tail(&mut self, size: usize, requested: usize) -> Option<Lent> {
        if let Some(lent) = self.take(size, requested) {
            return Some(lent);
        }
        let (slot, found) = self.take_from_tail(size)?;
        Some(self.lend_slot(slot, found, size, requested))
    }

    /// Lends free chunk `slot` of `found` bytes, just taken out of the free index or the tail,
    /// for `size` bytes, splitting off the rest.
    #[inline(always)]
    fn lend_slot(&mut self, slot: u32, found: usize, size: usize, requested: usize) -> Lent {
        self.n_lent += 1;
        self.used_bytes += size;
        self.counters.on_lend(size, requested, self.used_bytes, self.n_lent);
        if found > size {
            self.split(slot, size, found);
        }
        let chunk = &mut self.chunks[slot as usize];
        debug_assert!(chunk.state == State::Free && chunk.size == size);
        chunk.state = State::Lent;
        chunk.slack = slack(size, requested);
        Lent { slot, ptr: chunk.ptr }
    }

    /// The growable block's free tail for a request of `size` bytes, when it holds them: taken
    /// out of its place as the free index's `take_best` takes a chunk.
    ///
    /// The tail is the memory that expandable segments extend. Lent only when no other free
    /// chunk fits (dlmalloc's rule for its top chunk), a long-lived tensor made while a large
    /// transient one is free goes into a hole left by others, not the front of the tail, where
    /// it would cut the next large request off from the memory mapped after it.
    #[cold]
    fn take_from_tail(&mut self, size: usize) -> Option<(u32, usize)> {
        let class = policy::class(size, self.small_up_to);
        let slot = self.tail[class];
        if slot == NIL || self.chunks[slot as usize].size < size {
            return None;
        }
        self.tail[class] = NIL;
        Some((slot, self.chunks[slot as usize].size))
    }

    /// The largest free chunk a request of `size` bytes may be cut from (see `bounded_split`).
    #[inline(always)]
    fn split_bound(&self, size: usize) -> usize {
        if self.bounded_split {
            size.saturating_add(size / 8)
        } else {
            usize::MAX
        }
    }

    /// The size of the free chunk [`ArenaState::take_with_tail`] would lend for `size` bytes,
    /// without lending it: how another arena's miss compares the arenas it could borrow from.
    pub(crate) fn best_fit_with_tail(&mut self, size: usize) -> Option<usize> {
        let class = policy::class(size, self.small_up_to);
        let max = self.split_bound(size);
        if let Some(found) = self.index_of(class).best_size(size).filter(|&f| f <= max) {
            return Some(found);
        }
        let slot = self.tail[class];
        (slot != NIL && self.chunks[slot as usize].size >= size).then(|| self.chunks[slot as usize].size)
    }

    #[cold]
    fn split(&mut self, slot: u32, size: usize, found: usize) {
        debug_assert_eq!(self.chunks[slot as usize].size, found);
        let rest = self.cut(slot, size);
        self.mark_free(rest);
    }

    /// Cuts chunk `slot` after its first `keep` bytes; the rest is a new free chunk, in no free
    /// index yet, whose slot is returned.
    fn cut(&mut self, slot: u32, keep: usize) -> u32 {
        let head = self.chunks[slot as usize];
        debug_assert!(keep > 0 && keep < head.size);
        let rest = self.new_slot(Chunk {
            ptr: head.ptr + keep,
            size: head.size - keep,
            block: head.block,
            prev: slot,
            next: head.next,
            state: State::Free,
            bin: bin_for(head.size - keep),
            class: head.class,
            slack: 0,
        });
        if head.next != NIL {
            self.chunks[head.next as usize].prev = rest;
        }
        self.chunks[slot as usize].next = rest;
        self.resize(slot, keep);
        rest
    }

    /// Adds a new raw block, of which the pool asked for (and counts) `whole` bytes, and lends its
    /// first `size` bytes; the rest stays free.
    pub(crate) fn lend_new_block(&mut self, mem: K, whole: usize, size: usize, requested: usize) -> Lent {
        self.lend_block(mem, whole, size, requested, true)
    }

    /// Adds a raw block of `whole` bytes taken over from another arena of the same stream
    /// ([`ArenaState::hand_over`]; no raw allocation, so none is counted) and lends its first
    /// `size` bytes; the rest stays free.
    pub(crate) fn adopt_block(&mut self, mem: K, whole: usize, size: usize, requested: usize) -> Lent {
        self.lend_block(mem, whole, size, requested, false)
    }

    /// Keeps raw block `mem` in a vacant block number, or a new one; returns the number.
    fn store_block(&mut self, mem: K) -> u32 {
        match self.vacant_blocks.pop() {
            Some(b) => {
                self.blocks[b as usize] = Some(mem);
                b
            }
            None => {
                self.blocks.push(Some(mem));
                u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks in one arena")
            }
        }
    }

    fn lend_block(&mut self, mem: K, whole: usize, size: usize, requested: usize, raw: bool) -> Lent {
        let ptr = mem.address();
        debug_assert!(whole >= size && whole.is_multiple_of(super::UNIT));
        let block = self.store_block(mem);
        // A block larger than the request (a policy's rounding) is cut as a cache hit would cut it.
        let class = policy::class(size, self.small_up_to) as u8;
        let slot = self.new_slot(Chunk {
            ptr,
            size: whole,
            block,
            prev: NIL,
            next: NIL,
            state: State::Lent,
            bin: bin_for(whole),
            class,
            slack: slack(size, requested),
        });
        self.set_growable(usize::from(class), block);
        if whole > size {
            self.split(slot, size, whole);
        }
        self.used_bytes += size;
        self.n_lent += 1;
        if raw {
            self.counters.on_reserve(whole, true);
        } else {
            self.counters.on_adopt(whole);
        }
        self.counters.misses += 1;
        self.counters.on_lend(size, requested, self.used_bytes, self.n_lent);
        Lent { slot, ptr }
    }

    /// Whether the arena holds no raw block.
    pub(crate) fn holds_no_block(&self) -> bool {
        self.blocks.iter().all(Option::is_none)
    }

    /// Turns the tail rule of [`ArenaState::take_from_tail`] on or off; turned off, the tails
    /// kept aside go into the free index.
    pub(crate) fn set_keep_tail_last(&mut self, on: bool) {
        self.keep_tail_last = on;
        if !on {
            self.file_tail(0);
            self.file_tail(1);
        }
    }

    /// Makes `block` the growable block of free index `class`; the free tail of the one before
    /// goes into the free index like any other free chunk.
    fn set_growable(&mut self, class: usize, block: u32) {
        self.file_tail(class);
        self.growable[class] = Some(block);
    }

    /// Files the free tail kept aside for free index `class`, if any, in that index.
    fn file_tail(&mut self, class: usize) {
        let slot = std::mem::replace(&mut self.tail[class], NIL);
        if slot != NIL {
            let c = self.chunks[slot as usize];
            self.index_of(class).insert(slot, c.size, c.bin);
        }
    }

    /// Takes back a lent chunk, merging it with free neighbours of the same raw block. When the
    /// arena is orphaned (its pool is gone) and the merged chunk is a whole block, the block is
    /// released and returned for the caller to free outside the lock.
    #[inline(always)]
    pub(crate) fn give_back(&mut self, slot: u32) -> Option<(K, usize)> {
        let Chunk { size, prev, next, state, slack, bin, class, .. } = self.chunks[slot as usize];
        debug_assert!(matches!(state, State::Lent | State::Fenced), "a chunk went back twice");
        self.used_bytes -= size;
        self.n_lent -= 1;
        // A fenced chunk's free was counted at its fence.
        if state == State::Lent {
            self.counters.on_give_back(size, size - usize::from(slack));
        }
        // With the tail rule on, a block's last chunk may be a growing block's tail, which is not
        // filed in the index (`mark_free` decides), so it takes the slow way too. Written so,
        // the test of `next` costs the hit two instructions (a plain `||` of the rule cost five).
        let next_cold =
            if next == NIL { self.keep_tail_last } else { self.chunks[next as usize].state == State::Free };
        if next_cold || self.is_free(prev) || self.orphaned {
            return self.give_back_merging(slot);
        }
        // The common case: no free neighbour, so the chunk goes into its bin as it is, with the
        // size and bin read above.
        self.chunks[slot as usize].state = State::Free;
        self.index_of(usize::from(class)).insert(slot, size, bin);
        None
    }

    /// The rest of [`ArenaState::give_back`]: a chunk with a free neighbour, a block's last
    /// chunk, or a chunk of an orphaned arena.
    #[cold]
    fn give_back_merging(&mut self, slot: u32) -> Option<(K, usize)> {
        let c = self.chunks[slot as usize];
        let slot = if self.is_free(c.next) || self.is_free(c.prev) { self.merge(slot) } else { slot };
        if self.orphaned {
            return self.release_if_whole(slot);
        }
        self.mark_free(slot);
        None
    }

    /// For an orphaned arena: releases the chunk's block if the chunk is all of it, else keeps it
    /// free.
    #[cold]
    fn release_if_whole(&mut self, slot: u32) -> Option<(K, usize)> {
        let c = self.chunks[slot as usize];
        if c.prev == NIL && c.next == NIL {
            return Some(self.release(slot));
        }
        self.mark_free(slot);
        self.release_if_idle(slot)
    }

    /// Merges a returning chunk with its free neighbours. Free neighbours are never adjacent to
    /// each other, so one merge on each side suffices. Returns the merged chunk's slot.
    #[cold]
    fn merge(&mut self, slot: u32) -> u32 {
        let mut slot = slot;
        let next = self.chunks[slot as usize].next;
        if self.is_free(next) {
            let absorbed = self.chunks[next as usize];
            self.unmark_free(next);
            let merged = self.chunks[slot as usize].size + absorbed.size;
            self.resize(slot, merged);
            self.chunks[slot as usize].next = absorbed.next;
            if absorbed.next != NIL {
                self.chunks[absorbed.next as usize].prev = slot;
            }
            self.vacate(next);
        }
        let prev = self.chunks[slot as usize].prev;
        if self.is_free(prev) {
            let absorbed = self.chunks[slot as usize];
            self.unmark_free(prev);
            let merged = self.chunks[prev as usize].size + absorbed.size;
            self.resize(prev, merged);
            self.chunks[prev as usize].next = absorbed.next;
            if absorbed.next != NIL {
                self.chunks[absorbed.next as usize].prev = prev;
            }
            self.vacate(slot);
            slot = prev;
        }
        slot
    }

    fn release(&mut self, slot: u32) -> (K, usize) {
        self.release_counted(slot, true)
    }

    /// [`ArenaState::release`], counting a raw free or (`raw` false, a block handed over) not.
    fn release_counted(&mut self, slot: u32, raw: bool) -> (K, usize) {
        let chunk = self.chunks[slot as usize];
        if raw {
            self.counters.on_unreserve(chunk.size, true);
        } else {
            self.counters.on_hand_over(chunk.size);
        }
        self.vacate(slot);
        (self.take_block(chunk.block), chunk.size)
    }

    /// Takes raw block `block`, whose chunks are all vacated, out of the arena.
    fn take_block(&mut self, block: u32) -> K {
        if self.plan.is_some_and(|p| p.block == block) {
            self.plan = None;
        }
        let mem = self.blocks[block as usize].take().expect("a live chunk's block is present");
        for g in &mut self.growable {
            if *g == Some(block) {
                *g = None;
            }
        }
        self.vacant_blocks.push(block);
        mem
    }

    /// Releases every free chunk that is a whole raw block (CuPy's `free_all_blocks`: a split
    /// block stays until its parts are merged back). The blocks go to `out`, to be freed outside
    /// the lock; returns the bytes released.
    pub(crate) fn release_free_blocks(&mut self, out: &mut Vec<K>) -> usize {
        let mut bytes = self.release_idle_blocks(out);
        for slot in 0..self.chunks.len() as u32 {
            let c = self.chunks[slot as usize];
            if c.state == State::Free && c.prev == NIL && c.next == NIL {
                self.unmark_free(slot);
                let (mem, size) = self.release(slot);
                out.push(mem);
                bytes += size;
            }
        }
        bytes
    }

    /// The free chunks that are whole raw blocks, as `(slot, size)`.
    pub(crate) fn whole_free_blocks(&self) -> Vec<(u32, usize)> {
        (0..self.chunks.len() as u32)
            .filter(|&slot| {
                let c = &self.chunks[slot as usize];
                c.state == State::Free && c.prev == NIL && c.next == NIL
            })
            .map(|slot| (slot, self.chunks[slot as usize].size))
            .collect()
    }

    /// Releases every free chunk of free-index `class` that is a whole raw block, into `out`;
    /// returns the bytes released.
    pub(crate) fn release_free_blocks_of(&mut self, class: usize, out: &mut Vec<K>) -> usize {
        let mut bytes = 0;
        for slot in 0..self.chunks.len() as u32 {
            let c = self.chunks[slot as usize];
            if c.state == State::Free && c.prev == NIL && c.next == NIL && usize::from(c.class) == class {
                self.unmark_free(slot);
                let (mem, size) = self.release(slot);
                out.push(mem);
                bytes += size;
            }
        }
        bytes
    }

    /// The smallest free chunk that is a whole raw block and that this arena's own request of
    /// `size` bytes could be cut from (of its free index, within the policy's split bound), as
    /// `(slot, size)`: what another arena of the same stream may take over on a miss.
    pub(crate) fn whole_block_for(&self, size: usize) -> Option<(u32, usize)> {
        let (class, max) = (policy::class(size, self.small_up_to) as u8, self.split_bound(size));
        (0..self.chunks.len() as u32)
            .filter_map(|slot| {
                let c = &self.chunks[slot as usize];
                let whole = c.state == State::Free && c.prev == NIL && c.next == NIL;
                (whole && c.class == class && (size..=max).contains(&c.size)).then_some((slot, c.size))
            })
            .min_by_key(|&(slot, found)| (found, slot))
    }

    /// Gives up one free chunk that is a whole raw block, if it still is one, to another arena
    /// of the same stream ([`ArenaState::adopt_block`]): its bytes leave this arena's reserve,
    /// with no raw free counted.
    pub(crate) fn hand_over(&mut self, slot: u32, size: usize) -> Option<K> {
        let c = *self.chunks.get(slot as usize)?;
        if c.state != State::Free || c.prev != NIL || c.next != NIL || c.size != size {
            return None;
        }
        self.unmark_free(slot);
        let (mem, _) = self.release_counted(slot, false);
        Some(mem)
    }

    /// Releases one free chunk that is a whole raw block, if it still is one.
    pub(crate) fn release_whole(&mut self, slot: u32, size: usize) -> Option<K> {
        let c = *self.chunks.get(slot as usize)?;
        if c.state != State::Free || c.prev != NIL || c.next != NIL || c.size != size {
            return None;
        }
        self.unmark_free(slot);
        Some(self.release(slot).0)
    }

    /// Marks a lent chunk freed behind a fence (it stays lent until the fence completes) and
    /// counts its free.
    pub(crate) fn mark_fenced(&mut self, slot: u32) {
        let c = &mut self.chunks[slot as usize];
        debug_assert_eq!(c.state, State::Lent, "a chunk was freed twice");
        c.state = State::Fenced;
        let (size, slack) = (c.size, c.slack);
        self.counters.on_free(size, size - usize::from(slack));
    }

    /// Every raw block's chunks in address order, as `(address, size, chunks)`; with stitching,
    /// lifted ranges are left out, and the size is what the block holds.
    pub(crate) fn segments(&self) -> Vec<(DevicePtr, usize, Vec<ChunkView>)> {
        let mut out = Vec::new();
        for slot in 0..self.chunks.len() as u32 {
            let c = &self.chunks[slot as usize];
            if c.state == State::Vacant || c.prev != NIL {
                continue;
            }
            let mut views = Vec::new();
            let mut at = slot;
            while at != NIL {
                let c = &self.chunks[at as usize];
                if c.state == State::Lifted {
                    // No memory is behind it: the snapshot shows what the block holds.
                    at = c.next;
                    continue;
                }
                let requested = if c.state == State::Free { 0 } else { c.size - usize::from(c.slack) };
                views.push(ChunkView { ptr: c.ptr, size: c.size, requested, state: c.state });
                at = c.next;
            }
            let size = views.iter().map(|v| v.size).sum();
            out.push((c.ptr, size, views));
        }
        out.sort_unstable_by_key(|s| s.0);
        out
    }

    /// Every free chunk as `(ptr, size)`, for tests and debug dumps.
    pub(crate) fn free_chunks(&self) -> Vec<(DevicePtr, usize)> {
        self.chunks.iter().filter(|c| c.state == State::Free).map(|c| (c.ptr, c.size)).collect()
    }
}
