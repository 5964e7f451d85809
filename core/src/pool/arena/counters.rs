//! What an arena counts: PyTorch's statistics (requested, allocated, active, reserved bytes and
//! their counts, current and peak) and the room measures, kept under the arena's lock.

/// An arena's statistics, as PyTorch's allocator counts them (`DeviceStats`), kept under the
/// arena's lock. Totals only grow; a current value is a total less what went back, so the hot
/// path adds and compares, and never reads another arena's or the pool's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Chunks lent (cache hits and misses) and freed by their owner (a fenced chunk at its
    /// fence, not when it comes back).
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    /// Rounded bytes lent and freed, likewise.
    pub(crate) bytes_lent: u64,
    pub(crate) bytes_freed: u64,
    /// Requested bytes lent and freed.
    pub(crate) requested_lent: u64,
    pub(crate) requested_freed: u64,
    /// Lends served by a new or grown block.
    pub(crate) misses: u64,
    /// Raw blocks kept by the arena and released by it, and their bytes (grown and shrunk
    /// tails included in the bytes).
    pub(crate) raw_allocs: u64,
    pub(crate) raw_frees: u64,
    /// Blocks taken over from another arena of the same stream and handed over to one (a
    /// stream's lanes): held or no longer held with no raw call.
    pub(crate) blocks_in: u64,
    pub(crate) blocks_out: u64,
    pub(crate) reserved_in: u64,
    pub(crate) reserved_out: u64,
    /// Peaks since the arena was made or its peaks were reset.
    pub(crate) peak_allocated: u64,
    pub(crate) peak_active: u64,
    pub(crate) peak_requested: u64,
    pub(crate) peak_allocations: u64,
    pub(crate) peak_active_allocations: u64,
    pub(crate) peak_reserved: u64,
    pub(crate) peak_segments: u64,
    /// How far, at least, the current values are below their peaks: rounded bytes (allocated
    /// and active), requested bytes, and chunks (allocations and active allocations). A lend
    /// counts them down and a free up, and only a lend that takes one below zero compares the
    /// current values with the peaks: the peaks stay exact, and a cache hit below its peak pays
    /// three subtractions and one branch instead of five comparisons.
    room_bytes: i64,
    room_requested: i64,
    room_chunks: i64,
}

impl Counters {
    /// A lend of `size` rounded bytes for a request of `requested`, with `used` bytes and `lent`
    /// chunks active after it.
    #[inline(always)]
    pub(super) fn on_lend(&mut self, size: usize, requested: usize, used: usize, lent: usize) {
        self.allocs += 1;
        self.bytes_lent += size as u64;
        self.requested_lent += requested as u64;
        self.room_bytes -= size as i64;
        self.room_requested -= requested as i64;
        self.room_chunks -= 1;
        if (self.room_bytes | self.room_requested | self.room_chunks) < 0 {
            self.raise_peaks(used, lent);
        }
    }

    /// Raises the peaks to the current values where these passed them, and measures the rooms
    /// again.
    #[cold]
    pub(super) fn raise_peaks(&mut self, used: usize, lent: usize) {
        let allocated = self.bytes_lent - self.bytes_freed;
        let requested = self.requested_lent - self.requested_freed;
        let allocations = self.allocs - self.frees;
        let (used, lent) = (used as u64, lent as u64);
        self.peak_allocated = self.peak_allocated.max(allocated);
        self.peak_requested = self.peak_requested.max(requested);
        self.peak_allocations = self.peak_allocations.max(allocations);
        self.peak_active = self.peak_active.max(used);
        self.peak_active_allocations = self.peak_active_allocations.max(lent);
        self.measure_rooms(used, lent);
    }

    pub(super) fn measure_rooms(&mut self, used: u64, lent: u64) {
        let room = |peak: u64, current: u64| i64::try_from(peak - current).unwrap_or(i64::MAX);
        self.room_bytes =
            room(self.peak_allocated, self.bytes_lent - self.bytes_freed).min(room(self.peak_active, used));
        self.room_requested = room(self.peak_requested, self.requested_lent - self.requested_freed);
        self.room_chunks = room(self.peak_allocations, self.allocs - self.frees)
            .min(room(self.peak_active_allocations, lent));
    }

    /// The owner's free of a chunk of `size` rounded bytes whose request was `requested`, while
    /// the chunk stays active (a fenced chunk at its fence).
    #[inline(always)]
    pub(super) fn on_free(&mut self, size: usize, requested: usize) {
        self.frees += 1;
        self.bytes_freed += size as u64;
        self.requested_freed += requested as u64;
        // Only the requested bytes' room grows: the chunk is still active.
        self.room_requested += requested as i64;
    }

    /// The owner's free of a chunk that goes back at once: allocated and active both fall.
    #[inline(always)]
    pub(super) fn on_give_back(&mut self, size: usize, requested: usize) {
        self.on_free(size, requested);
        self.room_bytes += size as i64;
        self.room_chunks += 1;
    }

    pub(super) fn on_reserve(&mut self, bytes: usize, new_block: bool) {
        self.reserved_in += bytes as u64;
        self.raw_allocs += u64::from(new_block);
        self.raise_reserve_peaks();
    }

    pub(super) fn on_unreserve(&mut self, bytes: usize, whole_block: bool) {
        self.reserved_out += bytes as u64;
        self.raw_frees += u64::from(whole_block);
    }

    /// A block of `bytes` taken over from another arena of the stream.
    pub(super) fn on_adopt(&mut self, bytes: usize) {
        self.reserved_in += bytes as u64;
        self.blocks_in += 1;
        self.raise_reserve_peaks();
    }

    /// A block of `bytes` handed over to another arena of the stream.
    pub(super) fn on_hand_over(&mut self, bytes: usize) {
        self.reserved_out += bytes as u64;
        self.blocks_out += 1;
    }

    pub(super) fn raise_reserve_peaks(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.reserved_in - self.reserved_out);
        self.peak_segments = self.peak_segments.max(self.segments_held());
    }

    /// The raw blocks held now.
    pub(crate) fn segments_held(&self) -> u64 {
        self.raw_allocs + self.blocks_in - self.raw_frees - self.blocks_out
    }

    /// Adds `other`'s totals to these, and its peaks (so that a sum of peaks stays a bound of
    /// the pool's).
    pub(crate) fn absorb(&mut self, other: &Counters) {
        self.allocs += other.allocs;
        self.frees += other.frees;
        self.bytes_lent += other.bytes_lent;
        self.bytes_freed += other.bytes_freed;
        self.requested_lent += other.requested_lent;
        self.requested_freed += other.requested_freed;
        self.misses += other.misses;
        self.raw_allocs += other.raw_allocs;
        self.raw_frees += other.raw_frees;
        self.blocks_in += other.blocks_in;
        self.blocks_out += other.blocks_out;
        self.reserved_in += other.reserved_in;
        self.reserved_out += other.reserved_out;
        self.peak_allocated += other.peak_allocated;
        self.peak_active += other.peak_active;
        self.peak_requested += other.peak_requested;
        self.peak_allocations += other.peak_allocations;
        self.peak_active_allocations += other.peak_active_allocations;
        self.peak_reserved += other.peak_reserved;
        self.peak_segments += other.peak_segments;
    }

    /// Sets every peak to its current value.
    pub(crate) fn reset_peaks(&mut self, used: usize, lent: usize) {
        self.peak_allocated = self.bytes_lent - self.bytes_freed;
        self.peak_requested = self.requested_lent - self.requested_freed;
        self.peak_allocations = self.allocs - self.frees;
        self.peak_active = used as u64;
        self.peak_active_allocations = lent as u64;
        self.peak_reserved = self.reserved_in - self.reserved_out;
        self.peak_segments = self.segments_held();
        self.measure_rooms(used as u64, lent as u64);
    }
}
