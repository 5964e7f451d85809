//! One arena: the free and lent chunks of one stream, and the raw blocks they were cut from.
//!
//! Chunks live in a slab (`Vec<Chunk>` plus a list of vacant slots) and are linked in address order
//! within their raw block, so splitting and merging are O(1) and never allocate once the slab has
//! grown. Everything here runs under the arena's own lock; nothing here calls the runtime or a
//! hook, so the lock is held for a few dozen instructions.

use crate::backend::{Backend, DevicePtr};
use crate::memory::BaseMemory;

use super::index::{FreeIndex, Position};

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free(Position),
    Lent,
    Vacant,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    ptr: DevicePtr,
    size: usize,
    block: u32,
    prev: u32,
    next: u32,
    state: State,
}

/// The chunks of one arena. See the module docs.
#[derive(Debug)]
pub(crate) struct ArenaState<B: Backend> {
    chunks: Vec<Chunk>,
    vacant: Vec<u32>,
    blocks: Vec<Option<Box<dyn BaseMemory<B>>>>,
    vacant_blocks: Vec<u32>,
    index: FreeIndex,
    /// No longer in the pool's map: allocations must go to the arena that replaced it.
    pub(crate) retired: bool,
    pub(crate) used_bytes: usize,
    pub(crate) free_bytes: usize,
    pub(crate) n_free: usize,
    /// Chunks lent out.
    pub(crate) n_lent: usize,
}

/// A chunk handed out: its slot and address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent {
    pub(crate) slot: u32,
    pub(crate) ptr: DevicePtr,
}

impl<B: Backend> ArenaState<B> {
    pub(crate) fn new() -> Self {
        ArenaState {
            chunks: Vec::new(),
            vacant: Vec::new(),
            blocks: Vec::new(),
            vacant_blocks: Vec::new(),
            index: FreeIndex::new(),
            retired: false,
            used_bytes: 0,
            free_bytes: 0,
            n_free: 0,
            n_lent: 0,
        }
    }

    /// Whether the arena holds no chunk at all (and so no raw memory).
    pub(crate) fn is_empty(&self) -> bool {
        self.n_free == 0 && self.n_lent == 0
    }

    fn new_slot(&mut self, chunk: Chunk) -> u32 {
        match self.vacant.pop() {
            Some(slot) => {
                self.chunks[slot as usize] = chunk;
                slot
            }
            None => {
                self.chunks.push(chunk);
                u32::try_from(self.chunks.len() - 1).expect("fewer than 2^32 chunks in one arena")
            }
        }
    }

    fn vacate(&mut self, slot: u32) {
        self.chunks[slot as usize].state = State::Vacant;
        self.vacant.push(slot);
    }

    fn mark_free(&mut self, slot: u32) {
        let size = self.chunks[slot as usize].size;
        let pos = self.index.insert(slot, size);
        self.chunks[slot as usize].state = State::Free(pos);
        self.n_free += 1;
        self.free_bytes += size;
    }

    fn unmark_free(&mut self, slot: u32) {
        let chunk = self.chunks[slot as usize];
        let State::Free(pos) = chunk.state else { unreachable!("unmark_free on a chunk that is not free") };
        if let Some((moved, new_pos)) = self.index.remove(slot, chunk.size, pos) {
            self.chunks[moved as usize].state = State::Free(new_pos);
        }
        self.n_free -= 1;
        self.free_bytes -= chunk.size;
    }

    /// Lends the best-fitting free chunk for `size` bytes, splitting off and keeping the rest
    /// (CuPy's split: the head is lent, the remainder stays free, unmerged).
    pub(crate) fn take(&mut self, size: usize) -> Option<Lent> {
        let (slot, found) = self.index.take_best(size)?;
        self.n_free -= 1;
        self.free_bytes -= found;
        let chunk = self.chunks[slot as usize];
        debug_assert_eq!(chunk.size, found);
        if found > size {
            let rest = self.new_slot(Chunk {
                ptr: chunk.ptr + size,
                size: found - size,
                block: chunk.block,
                prev: slot,
                next: chunk.next,
                state: State::Vacant,
            });
            if chunk.next != NIL {
                self.chunks[chunk.next as usize].prev = rest;
            }
            let head = &mut self.chunks[slot as usize];
            head.next = rest;
            head.size = size;
            self.mark_free(rest);
        }
        self.chunks[slot as usize].state = State::Lent;
        self.used_bytes += size;
        self.n_lent += 1;
        Some(Lent { slot, ptr: chunk.ptr })
    }

    /// Adds a new raw block of `size` bytes and lends all of it.
    pub(crate) fn lend_new_block(&mut self, mem: Box<dyn BaseMemory<B>>, size: usize) -> Lent {
        let ptr = mem.ptr();
        let block = match self.vacant_blocks.pop() {
            Some(b) => {
                self.blocks[b as usize] = Some(mem);
                b
            }
            None => {
                self.blocks.push(Some(mem));
                u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks in one arena")
            }
        };
        let slot = self.new_slot(Chunk { ptr, size, block, prev: NIL, next: NIL, state: State::Lent });
        self.used_bytes += size;
        self.n_lent += 1;
        Lent { slot, ptr }
    }

    /// Takes back a lent chunk, merging it with free neighbours of the same raw block. When
    /// `release_whole` is set (the pool is gone) and the merged chunk is a whole block, the block
    /// is released and returned for the caller to free outside the lock.
    pub(crate) fn give_back(
        &mut self,
        slot: u32,
        release_whole: bool,
    ) -> Option<(Box<dyn BaseMemory<B>>, usize)> {
        let mut chunk = self.chunks[slot as usize];
        debug_assert_eq!(chunk.state, State::Lent, "a chunk went back twice");
        self.used_bytes -= chunk.size;
        self.n_lent -= 1;
        let mut slot = slot;
        // Neighbours are never both free and adjacent, so one merge on each side suffices.
        if chunk.next != NIL && matches!(self.chunks[chunk.next as usize].state, State::Free(_)) {
            let next = chunk.next;
            self.unmark_free(next);
            let absorbed = self.chunks[next as usize];
            chunk.size += absorbed.size;
            chunk.next = absorbed.next;
            if absorbed.next != NIL {
                self.chunks[absorbed.next as usize].prev = slot;
            }
            self.vacate(next);
        }
        if chunk.prev != NIL && matches!(self.chunks[chunk.prev as usize].state, State::Free(_)) {
            let prev = chunk.prev;
            self.unmark_free(prev);
            let mut merged = self.chunks[prev as usize];
            merged.size += chunk.size;
            merged.next = chunk.next;
            if chunk.next != NIL {
                self.chunks[chunk.next as usize].prev = prev;
            }
            self.vacate(slot);
            slot = prev;
            chunk = merged;
        }
        chunk.state = State::Vacant;
        self.chunks[slot as usize] = chunk;
        if release_whole && chunk.prev == NIL && chunk.next == NIL {
            return Some(self.release(slot));
        }
        self.mark_free(slot);
        None
    }

    fn release(&mut self, slot: u32) -> (Box<dyn BaseMemory<B>>, usize) {
        let chunk = self.chunks[slot as usize];
        self.vacate(slot);
        let mem = self.blocks[chunk.block as usize].take().expect("a live chunk's block is present");
        self.vacant_blocks.push(chunk.block);
        (mem, chunk.size)
    }

    /// Releases every free chunk that is a whole raw block (CuPy's `free_all_blocks`: a split
    /// block stays until its parts are merged back). The blocks go to `out`, to be freed outside
    /// the lock; returns the bytes released.
    pub(crate) fn release_free_blocks(&mut self, out: &mut Vec<Box<dyn BaseMemory<B>>>) -> usize {
        let mut bytes = 0;
        for slot in 0..self.chunks.len() as u32 {
            let c = self.chunks[slot as usize];
            if matches!(c.state, State::Free(_)) && c.prev == NIL && c.next == NIL {
                self.unmark_free(slot);
                let (mem, size) = self.release(slot);
                out.push(mem);
                bytes += size;
            }
        }
        bytes
    }

    /// Every free chunk as `(ptr, size)`, for tests and debug dumps.
    pub(crate) fn free_chunks(&self) -> Vec<(DevicePtr, usize)> {
        self.chunks.iter().filter(|c| matches!(c.state, State::Free(_))).map(|c| (c.ptr, c.size)).collect()
    }
}
