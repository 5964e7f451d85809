//! [`ArenaKey`]: which arena an allocation goes to.
//!
//! One arena per stream (CuPy's rule), with two refinements: the per-thread default stream, whose
//! raw handle is the same on every thread but which is a different stream on each, gets an arena
//! per thread; and the null stream, which every thread uses by default, has
//! [`ArenaKey::NULL_LANES`] *lanes*, arenas that serve the same stream, to which threads that
//! allocate on it at the same time move (module `lanes`). A key's
//! [`stream_key`](ArenaKey::stream_key) names the stream an arena serves, and is what reports
//! (hook observations, snapshots) show.

/// Which arena a stream's allocations go to: the stream's raw handle, a per-thread number for the
/// per-thread default stream (whose raw value, 2, is the same on every thread), or a lane of the
/// null stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct ArenaKey(u64);

impl ArenaKey {
    /// The null stream's arena (its lane 0).
    pub const NULL: ArenaKey = ArenaKey(0);
    /// Not yet known (a thread's state before its first allocation); never an arena.
    pub const UNSET: ArenaKey = ArenaKey(u64::MAX);
    /// How many arenas the null stream can have. Threads that share one arena contend for its
    /// lock and pass its cache lines between them on every allocation: eight threads on one
    /// arena ran at a tenth of one thread's rate (BENCHMARKS.md). A thread that keeps waiting
    /// for the null stream's lock moves to another lane (module `lanes`), so up to this many
    /// threads allocating at once each have an arena of their own.
    pub const NULL_LANES: u64 = 16;
    const PER_THREAD: u64 = 1 << 63;
    const LANE: u64 = 1 << 62;

    /// The arena of the stream whose raw handle is `raw`. The top two bits of a handle are not
    /// part of its key (no stream handle, a pointer or a small number, has them set).
    #[must_use]
    pub fn stream(raw: usize) -> ArenaKey {
        ArenaKey(raw as u64 & !(Self::PER_THREAD | Self::LANE))
    }

    /// The arena of host thread number `thread`'s per-thread default stream (whose raw value is
    /// the same on every thread).
    #[must_use]
    pub fn per_thread(thread: u64) -> ArenaKey {
        ArenaKey(Self::PER_THREAD | thread)
    }

    /// Lane `lane` (taken modulo [`NULL_LANES`](Self::NULL_LANES)) of the null stream; lane 0 is
    /// [`ArenaKey::NULL`].
    #[must_use]
    pub fn null_lane(lane: u64) -> ArenaKey {
        match lane % Self::NULL_LANES {
            0 => Self::NULL,
            l => ArenaKey(Self::LANE | l),
        }
    }

    /// The lane of the null stream this arena is (`Some(0)` for [`ArenaKey::NULL`]); `None` for
    /// the arena of any other stream.
    #[must_use]
    pub fn null_lane_number(self) -> Option<u64> {
        if self == Self::NULL {
            Some(0)
        } else if self.0 & (Self::PER_THREAD | Self::LANE) == Self::LANE {
            Some(self.0 & !Self::LANE)
        } else {
            None
        }
    }

    /// The key of the stream this arena serves: [`ArenaKey::NULL`] for every lane of the null
    /// stream, the key itself otherwise.
    #[must_use]
    pub fn stream_key(self) -> ArenaKey {
        if self.null_lane_number().is_some() {
            Self::NULL
        } else {
            self
        }
    }

    /// The key as a number: a stream's raw handle, the per-thread flag (the top bit) and a
    /// thread's number, or the lane flag (the next bit) and a lane of the null stream.
    #[must_use]
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The key whose [`raw`](Self::raw) value is `raw`.
    pub(super) fn from_raw(raw: u64) -> ArenaKey {
        ArenaKey(raw)
    }

    /// The thread's number, for the arena of a per-thread default stream.
    #[must_use]
    pub fn per_thread_number(self) -> Option<u64> {
        (self != Self::UNSET && self.0 & Self::PER_THREAD != 0).then_some(self.0 & !Self::PER_THREAD)
    }
}

#[cfg(test)]
mod tests {
    use super::ArenaKey;

    #[test]
    fn lanes_of_the_null_stream_serve_the_null_stream() {
        assert_eq!(ArenaKey::null_lane(0), ArenaKey::NULL);
        assert_eq!(ArenaKey::null_lane(ArenaKey::NULL_LANES), ArenaKey::NULL);
        let lanes: Vec<ArenaKey> = (0..ArenaKey::NULL_LANES).map(ArenaKey::null_lane).collect();
        for (i, k) in lanes.iter().enumerate() {
            assert_eq!(k.null_lane_number(), Some(i as u64));
            assert_eq!(k.stream_key(), ArenaKey::NULL);
            assert_eq!(k.per_thread_number(), None);
            assert!(lanes[..i].iter().all(|o| o != k), "lane {i} repeats");
        }
    }

    #[test]
    fn other_keys_are_their_own_stream() {
        for k in [ArenaKey::stream(1), ArenaKey::stream(0x7f00_dead_b000), ArenaKey::per_thread(3)] {
            assert_eq!(k.null_lane_number(), None);
            assert_eq!(k.stream_key(), k);
        }
        assert_eq!(ArenaKey::UNSET.null_lane_number(), None);
        assert_eq!(ArenaKey::UNSET.per_thread_number(), None);
        // A handle with the lane bit set is not taken for a lane.
        assert_eq!(ArenaKey::stream((1usize << 62) | 5), ArenaKey::stream(5));
    }
}
